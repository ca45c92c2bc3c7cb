// datasets/fields/manifest_table.h (build-only): a manifest's text (CSV, TSV or JSON Lines, one
// sample a row) read into a table of cells, for FieldSource::manifest (conveyor/fields.h). The
// text comes from the data, so it is read as data: bounded, strict, every error naming the
// manifest and the line.
//
// The formats:
//   CSV         RFC 4180: a header row of column names, then one row per record; cells separated
//               by ','; a cell that starts with '"' is quoted: it ends at the next lone '"', holds
//               "" as one '"', and may hold ',', CR and LF (so a row may span lines); a '"'
//               inside an unquoted cell, or text after a closing quote, is an error. Records end
//               with LF or CRLF (a CR not followed by LF outside quotes is an error).
//   TSV         a header row, cells separated by tabs, no quoting ('"' is a character like any
//               other); records end with LF or CRLF.
//   JSON Lines  one JSON object per line; its keys are the columns: the union over all rows, in
//               the order first seen. A row lacking a column has no cell there (not an error
//               here: the field that reads the column decides). A line that is not one object
//               (arrays, scalars, two objects, an object over two lines), a key given twice in a
//               row, or malformed JSON is an error.
// In every format a UTF-8 byte order mark at the start is dropped, and empty lines are skipped
// (whitespace-only lines too, in JSON Lines); each row keeps the number of the line it starts on.
// CSV and TSV rows must have as many cells as the header (a ragged row is an error); column
// names must be unique.
//
// Cells: a CSV or TSV cell's text, unquoted (MemberEncoding::kFile), or the text of a JSON Lines
// row's value as it is in the line (MemberEncoding::kJson: a string keeps its quotes and escapes;
// json_value.h reads it). Each is a view into the table's own text, in which the cells are laid
// side by side (the unquoted text is written over the original in place, so the table holds the
// manifest once and no cell is allocated on its own).
//
// Bounds (kMax... below): the text at most 1 GiB, at most 256 columns, a cell at most 16 MiB,
// JSON values nested at most Field::kMaxJsonDepth (64) inside a row's object. Besides the text,
// the table holds 24 bytes per row and 4 per cell.
//
// Errors: std::runtime_error "manifest WHERE line N: what is wrong" (or "manifest WHERE: ..."
// for the whole text), WHERE being the caller's name for it, data quoted through printable().
// Pure: no state, safe from any thread; the table is immutable once read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sources/sample_kind.h"

namespace conveyor::detail {

constexpr size_t kMaxManifestBytes = size_t{1} << 30;
constexpr size_t kMaxManifestColumns = 256;
constexpr size_t kMaxManifestCellBytes = size_t{16} << 20;

struct ManifestTable {
  enum class Format { kCsv, kTsv, kJsonLines };

  struct Row {
    uint64_t line = 0;        // the line it starts on, from 1
    uint64_t start = 0;       // its first cell's offset in `text`
    uint64_t first_cell = 0;  // its first cell in `cell_ends`
  };

  // kFile for CSV and TSV, kJson for JSON Lines.
  MemberEncoding encoding = MemberEncoding::kFile;
  std::vector<std::string> columns;
  std::vector<Row> rows;

  // The index of the column `name`, or `npos`.
  static constexpr size_t npos = static_cast<size_t>(-1);
  size_t column(std::string_view name) const;
  // The cell of `row` in `column` (both in range), or nullopt when the row lacks it (JSON Lines).
  std::optional<std::string_view> cell(size_t row, size_t column) const;

  // The layout behind cell(): the text, whose cells lie side by side from each row's start, and
  // per row (rows[r].first_cell up to the next row's) the end of each of its cells, relative to
  // the row's start, for the columns known when it was read (a JSON Lines row read before a
  // column first appeared lacks it; so does a cell of size 0 in JSON Lines, as no JSON value is
  // empty).
  std::string text;
  std::vector<uint32_t> cell_ends;
};

// Reads `text` (taken: the table keeps it) in `format`. `where` names the manifest in errors.
ManifestTable read_manifest(std::string text, ManifestTable::Format format,
                            const std::string& where);

}  // namespace conveyor::detail
