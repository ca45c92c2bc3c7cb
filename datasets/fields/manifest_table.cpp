// A manifest's text into a table of cells (manifest_table.h).
#include "fields/manifest_table.h"

#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <utility>

#include "conveyor/fields.h"
#include "conveyor/internal/printable.h"
#include "fields/json_value.h"

namespace conveyor::detail {

size_t ManifestTable::column(std::string_view name) const {
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] == name) return i;
  }
  return npos;
}

std::optional<std::string_view> ManifestTable::cell(size_t row, size_t column) const {
  const uint64_t first = rows[row].first_cell;
  const uint64_t next = row + 1 < rows.size() ? rows[row + 1].first_cell : cell_ends.size();
  if (column >= next - first) return std::nullopt;
  const uint32_t begin = column == 0 ? 0 : cell_ends[first + column - 1];
  const uint32_t end = cell_ends[first + column];
  if (encoding == MemberEncoding::kJson && begin == end) return std::nullopt;
  return std::string_view(text).substr(rows[row].start + begin, end - begin);
}

namespace {

constexpr std::string_view kByteOrderMark("\xEF\xBB\xBF");

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The reading of one manifest: the text rewritten in place (`write` never passes `read`).
class ManifestReader {
 public:
  ManifestReader(std::string text, ManifestTable::Format format, const std::string& where)
      : where_(where), format_(format) {
    if (text.size() > kMaxManifestBytes) {
      throw std::runtime_error("manifest " + where_ + ": " + std::to_string(text.size()) +
                               " bytes, more than the " + mib(kMaxManifestBytes) +
                               " a manifest may have");
    }
    table_.text = std::move(text);
    table_.encoding =
        format == ManifestTable::Format::kJsonLines ? MemberEncoding::kJson : MemberEncoding::kFile;
    if (std::string_view(table_.text).substr(0, kByteOrderMark.size()) == kByteOrderMark) {
      read_ = kByteOrderMark.size();
    }
  }

  ManifestTable read() {
    if (format_ == ManifestTable::Format::kJsonLines) {
      while (json_row()) {
      }
    } else {
      if (!delimited_row()) fail_all("no header row (the manifest is empty)");
      header();
      while (delimited_row()) {
        const size_t cells = table_.cell_ends.size() - table_.rows.back().first_cell;
        if (cells != table_.columns.size()) {
          fail(table_.rows.back().line, std::to_string(cells) + " cell" + (cells == 1 ? "" : "s") +
                                            ", but the header has " +
                                            std::to_string(table_.columns.size()) + " columns");
        }
      }
    }
    table_.text.resize(write_);
    return std::move(table_);
  }

 private:
  [[noreturn]] void fail(uint64_t line, const std::string& what) const {
    throw std::runtime_error("manifest " + where_ + " line " + std::to_string(line) + ": " + what);
  }
  [[noreturn]] void fail_all(const std::string& what) const {
    throw std::runtime_error("manifest " + where_ + ": " + what);
  }

  std::string& text() { return table_.text; }
  char at(size_t i) const { return table_.text[i]; }
  size_t size() const { return table_.text.size(); }

  // Skips empty lines; false at the end of the text.
  bool skip_empty_lines() {
    while (read_ < size()) {
      if (at(read_) == '\n') {
        ++read_;
      } else if (at(read_) == '\r' && read_ + 1 < size() && at(read_ + 1) == '\n') {
        read_ += 2;
      } else {
        return true;
      }
      ++line_;
    }
    return false;
  }

  // The header row, the first one read: its cells become the columns, and it is no row.
  void header() {
    const ManifestTable::Row row = table_.rows.back();
    const size_t cells = table_.cell_ends.size() - row.first_cell;
    uint32_t begin = 0;
    for (size_t i = 0; i < cells; ++i) {
      const uint32_t end = table_.cell_ends[row.first_cell + i];
      std::string name = text().substr(row.start + begin, end - begin);
      if (table_.column(name) != ManifestTable::npos) {
        fail(row.line, "the column '" + printable(name) + "' is named twice in the header");
      }
      table_.columns.push_back(std::move(name));
      begin = end;
    }
    table_.rows.clear();
    table_.cell_ends.clear();
  }

  // A CSV or TSV record into a new row; false at the end of the text.
  bool delimited_row() {
    if (!skip_empty_lines()) return false;
    const bool csv = format_ == ManifestTable::Format::kCsv;
    const char delimiter = csv ? ',' : '\t';
    ManifestTable::Row row;
    row.line = line_;
    row.start = write_;
    row.first_cell = table_.cell_ends.size();
    table_.rows.push_back(row);
    while (true) {
      const size_t cell_start = write_;
      if (csv && read_ < size() && at(read_) == '"') {
        quoted_cell();
      } else {
        while (read_ < size() && at(read_) != delimiter && at(read_) != '\n' && at(read_) != '\r') {
          if (csv && at(read_) == '"') {
            fail(line_,
                 "a '\"' inside an unquoted cell (RFC 4180: quote the whole cell, doubling its "
                 "quotes)");
          }
          text()[write_++] = at(read_++);
        }
      }
      if (write_ - cell_start > kMaxManifestCellBytes) {
        fail(line_, "a cell of " + std::to_string(write_ - cell_start) + " bytes, more than " +
                        mib(kMaxManifestCellBytes));
      }
      if (table_.cell_ends.size() - row.first_cell == kMaxManifestColumns) {
        fail(row.line, "more than " + std::to_string(kMaxManifestColumns) +
                           " cells (the most "
                           "columns a manifest may have)");
      }
      table_.cell_ends.push_back(static_cast<uint32_t>(write_ - row.start));
      if (read_ >= size()) return true;
      const char c = at(read_);
      if (c == delimiter) {
        ++read_;
        continue;
      }
      if (c == '\r') {
        if (read_ + 1 >= size() || at(read_ + 1) != '\n') {
          fail(line_, "a carriage return not followed by a line feed");
        }
        ++read_;
      }
      if (at(read_) != '\n') {
        fail(line_, "text after a quoted cell's closing quote: '" +
                        printable(std::string_view(text()).substr(read_, 16)) + "'");
      }
      ++read_;
      ++line_;
      return true;
    }
  }

  // A quoted CSV cell from its opening quote to just after its closing one.
  void quoted_cell() {
    const uint64_t opened = line_;
    ++read_;
    while (true) {
      if (read_ >= size()) fail(opened, "a quoted cell without its closing quote");
      const char c = at(read_);
      if (c == '"') {
        if (read_ + 1 < size() && at(read_ + 1) == '"') {
          text()[write_++] = '"';
          read_ += 2;
          continue;
        }
        ++read_;
        return;
      }
      if (c == '\n') ++line_;
      text()[write_++] = c;
      ++read_;
    }
  }

  // A JSON Lines row into a new row; false at the end of the text.
  bool json_row() {
    while (read_ < size()) {
      size_t end = text().find('\n', read_);
      if (end == std::string::npos) end = size();
      const size_t line_start = read_;
      const uint64_t line = line_;
      read_ = end < size() ? end + 1 : end;
      ++line_;
      const std::string_view line_text =
          std::string_view(text()).substr(line_start, end - line_start);
      size_t i = 0;
      while (i < line_text.size() && is_space(line_text[i])) ++i;
      if (i == line_text.size()) continue;  // an empty line
      json_object(line_text, i, line);
      // The row's values, in column order, side by side at write_ (never past the line's start).
      ManifestTable::Row row;
      row.line = line;
      row.start = write_;
      row.first_cell = table_.cell_ends.size();
      table_.rows.push_back(row);
      scratch_.clear();
      for (size_t column = 0; column < table_.columns.size(); ++column) {
        if (seen_[column] == table_.rows.size()) {
          const auto [begin, size] = values_[column];
          scratch_.append(line_text.substr(begin, size));
        }
        table_.cell_ends.push_back(static_cast<uint32_t>(scratch_.size()));
      }
      std::memcpy(&text()[write_], scratch_.data(), scratch_.size());
      write_ += scratch_.size();
      return true;
    }
    return false;
  }

  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

  // The object that starts at line[i]: each key's column (added when new) and its value's
  // extent in values_; marks seen_ with the row's number (rows.size() + 1, before it is added).
  void json_object(std::string_view line, size_t i, uint64_t line_number) {
    const size_t stamp = table_.rows.size() + 1;
    const auto skip = [&](size_t at) {
      while (at < line.size() && is_space(line[at])) ++at;
      return at;
    };
    if (line[i] != '{') fail(line_number, "the row is not a JSON object");
    try {
      i = skip(i + 1);
      if (i < line.size() && line[i] == '}') {
        i = skip(i + 1);
      } else {
        while (true) {
          if (i >= line.size() || line[i] != '"') fail(line_number, "a key is not a string");
          const size_t key_end = skip_json_value(line, i, 0);
          const std::string_view raw = line.substr(i + 1, key_end - i - 2);
          std::string_view name = raw;
          if (raw.find('\\') != std::string_view::npos) {
            json_string(line.substr(i, key_end - i), key_);
            name = key_;
          }
          const size_t column = column_of(name, line_number);
          i = skip(key_end);
          if (i >= line.size() || line[i] != ':') fail(line_number, "':' expected after a key");
          i = skip(i + 1);
          const size_t value_end = skip_json_value(line, i, Field::kMaxJsonDepth);
          if (value_end - i > kMaxManifestCellBytes) {
            fail(line_number, "the value of '" + printable(name) + "' is " +
                                  std::to_string(value_end - i) + " bytes, more than " +
                                  mib(kMaxManifestCellBytes));
          }
          if (seen_[column] == stamp) {
            fail(line_number, "the key '" + printable(name) + "' is given twice");
          }
          seen_[column] = stamp;
          values_[column] = {i, value_end - i};
          i = skip(value_end);
          if (i < line.size() && line[i] == ',') {
            i = skip(i + 1);
            continue;
          }
          if (i < line.size() && line[i] == '}') {
            i = skip(i + 1);
            break;
          }
          fail(line_number, "',' or '}' expected in the row's object");
        }
      }
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      if (what.rfind("manifest ", 0) == 0) throw;
      fail(line_number, what);
    }
    if (i != line.size()) {
      fail(line_number, "text after the row's object (one object per line): '" +
                            printable(line.substr(i, 16)) + "'");
    }
  }

  size_t column_of(std::string_view name, uint64_t line_number) {
    const auto it = column_index_.find(name);
    if (it != column_index_.end()) return it->second;
    if (table_.columns.size() == kMaxManifestColumns) {
      fail(line_number, "a key '" + printable(name) + "' beyond the " +
                            std::to_string(kMaxManifestColumns) + " columns a manifest may have");
    }
    table_.columns.emplace_back(name);
    column_index_.emplace(table_.columns.back(), table_.columns.size() - 1);
    seen_.push_back(0);
    values_.emplace_back();
    return table_.columns.size() - 1;
  }

  const std::string& where_;
  ManifestTable::Format format_;
  ManifestTable table_;
  size_t read_ = 0;   // the next byte to read
  size_t write_ = 0;  // where the next cell byte goes (<= read_)
  uint64_t line_ = 1;
  // JSON Lines: per column, the row (rows.size() + 1 when read) that last gave it, and where
  // that row's value lies in its line; the names; a reused key and row buffer.
  std::map<std::string, size_t, std::less<>> column_index_;
  std::vector<size_t> seen_;
  std::vector<std::pair<size_t, size_t>> values_;
  std::string key_;
  std::string scratch_;
};

}  // namespace

ManifestTable read_manifest(std::string text, ManifestTable::Format format,
                            const std::string& where) {
  return ManifestReader(std::move(text), format, where).read();
}

}  // namespace conveyor::detail
