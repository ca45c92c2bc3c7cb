// The manifest kind of FieldSource (sample_kind.h): a CSV, TSV or JSON Lines table read once
// (fields/manifest_table.h), one sample a row. Each field reads its column's cell; an image
// field's cell names a file (relative to the manifest's folder, or absolute), which each worker
// reads through its own StorageReader.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/fields.h"
#include "conveyor/internal/printable.h"
#include "fields/field_writer.h"
#include "fields/json_value.h"
#include "fields/manifest_table.h"
#include "sources/sample_kind.h"

namespace conveyor {

namespace {

using detail::ManifestTable;

class ManifestKind final : public FieldSource::Kind {
 public:
  ManifestKind(ManifestTable table, std::string where, std::filesystem::path base,
               std::shared_ptr<const Storage> storage)
      : Kind({}, {}),
        table_(std::move(table)),
        where_(std::move(where)),
        base_(std::move(base)),
        storage_(std::move(storage)) {}

  size_t size() const override { return table_.rows.size(); }

  void want(const Fields& fields) override {
    for (const auto& [name, field] : fields) {
      for (const std::string& key : field.key_list()) {
        // Columns keep their case: a field's keys are lower-cased, so match without case.
        const size_t c = column_of(key);
        if (c == ManifestTable::npos) {
          throw std::invalid_argument("manifest " + where_ + ": " + detail::field_label(name) +
                                      " reads column \"" + detail::printable(key) +
                                      "\", which it does not have (columns: " + columns_text() +
                                      ")");
        }
        if (std::find_if(wanted_.begin(), wanted_.end(),
                         [&](const Column& w) { return w.index == c; }) != wanted_.end()) {
          continue;
        }
        wanted_.push_back(
            {c, key, field.kind == Field::Kind::kImage || field.kind == Field::Kind::kMask, 0});
      }
    }
    size_t files = 0;
    for (Column& w : wanted_) {
      if (w.file) w.buffer = files++;
    }
    files_per_worker_ = files;
  }

  void prepare(size_t workers) override {
    while (workers_.size() < workers) {
      workers_.push_back({storage_->reader(RemoteOptions{}),
                          std::vector<std::vector<uint8_t>>(files_per_worker_)});
    }
  }

  void read(const SampleContext& ctx, detail::SampleMembers& out) override {
    Worker& worker = workers_.at(ctx.worker);
    out.members.clear();
    for (const Column& w : wanted_) {
      const std::optional<std::string_view> cell = table_.cell(ctx.index, w.index);
      if (!cell) continue;  // the field names its missing member
      detail::Member m{w.name, table_.encoding, reinterpret_cast<const uint8_t*>(cell->data()),
                       cell->size(), 0};
      if (w.file) {
        std::string path(*cell);
        if (table_.encoding == detail::MemberEncoding::kJson && !detail::json_string(*cell, path)) {
          throw std::runtime_error(row_name(ctx.index) + ": column \"" + detail::printable(w.name) +
                                   "\" is not a file name (" + detail::printable(*cell) + ")");
        }
        std::filesystem::path file(path);
        if (file.is_relative()) file = base_ / file;
        std::vector<uint8_t>& bytes = worker.files[w.buffer];
        read_file(*storage_, *worker.reader, file.string(), bytes);
        m = {w.name, detail::MemberEncoding::kFile, bytes.data(), bytes.size(), 0};
      }
      out.members.push_back(m);
    }
  }

  std::string describe(size_t index) const override {
    return index < table_.rows.size() ? row_name(index) : "sample " + std::to_string(index);
  }

 private:
  struct Column {
    size_t index = 0;   // in the table
    std::string name;   // the field's key (lower case)
    bool file = false;  // an image field's: the cell names a file
    size_t buffer = 0;  // the worker's buffer for that file
  };
  struct Worker {
    std::unique_ptr<StorageReader> reader;
    std::vector<std::vector<uint8_t>> files;  // one per file column, reused
  };

  std::string row_name(size_t index) const {
    return where_ + " line " + std::to_string(table_.rows[index].line);
  }

  size_t column_of(const std::string& key) const {
    for (size_t c = 0; c < table_.columns.size(); ++c) {
      const std::string& name = table_.columns[c];
      if (name.size() == key.size() &&
          std::equal(name.begin(), name.end(), key.begin(), [](char a, char b) {
            return std::tolower(static_cast<unsigned char>(a)) ==
                   std::tolower(static_cast<unsigned char>(b));
          })) {
        return c;
      }
    }
    return ManifestTable::npos;
  }

  std::string columns_text() const {
    std::string s;
    for (size_t c = 0; c < table_.columns.size() && c < 20; ++c) {
      s += (c ? ", " : "") + detail::printable(table_.columns[c], 40);
    }
    if (table_.columns.size() > 20) s += ", ...";
    return s;
  }

  ManifestTable table_;
  std::string where_;
  std::filesystem::path base_;
  std::shared_ptr<const Storage> storage_;
  std::vector<Column> wanted_;
  size_t files_per_worker_ = 0;
  std::vector<Worker> workers_;
};

ManifestTable::Format format_of(const std::filesystem::path& path, ManifestOptions::Format format) {
  switch (format) {
    case ManifestOptions::Format::kCsv:
      return ManifestTable::Format::kCsv;
    case ManifestOptions::Format::kTsv:
      return ManifestTable::Format::kTsv;
    case ManifestOptions::Format::kJsonLines:
      return ManifestTable::Format::kJsonLines;
    case ManifestOptions::Format::kAuto:
      break;
  }
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".csv") return ManifestTable::Format::kCsv;
  if (ext == ".tsv") return ManifestTable::Format::kTsv;
  if (ext == ".jsonl" || ext == ".ndjson") return ManifestTable::Format::kJsonLines;
  throw std::invalid_argument("manifest " + path.string() +
                              ": the format is not known from its extension (.csv, .tsv, .jsonl "
                              "or .ndjson): give ManifestOptions::format");
}

}  // namespace

std::unique_ptr<FieldSource> FieldSource::manifest(const std::filesystem::path& path, Fields fields,
                                                   const ManifestOptions& options) {
  const ManifestTable::Format format = format_of(path, options.format);
  const std::shared_ptr<const Storage> storage =
      options.storage ? options.storage : system_storage();
  std::vector<uint8_t> bytes;
  try {
    if (!storage->reader(RemoteOptions{})
             ->read_whole({StorageLocation::Kind::kLocal, path.string()}, detail::kMaxManifestBytes,
                          bytes)) {
      throw std::runtime_error("no such file");
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("manifest: cannot read " + path.string() + " (" + e.what() + ")");
  }
  ManifestTable table =
      detail::read_manifest(std::string(bytes.begin(), bytes.end()), format, path.string());
  if (table.rows.empty()) throw std::runtime_error("manifest " + path.string() + " has no rows");
  auto kind =
      std::make_unique<ManifestKind>(std::move(table), path.string(), path.parent_path(), storage);
  return std::unique_ptr<FieldSource>(new FieldSource(std::move(kind), std::move(fields)));
}

}  // namespace conveyor
