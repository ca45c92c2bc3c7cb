// conveyor-manifest-fuzz: libFuzzer over the readers of manifests and JSON values from the data
// (datasets/fields/manifest_table.h and json_value.h, issue 31). The first byte of an input,
// modulo 4, chooses what the rest is:
//   0, 1, 2: a CSV, TSV or JSON Lines manifest for read_manifest. On success: at most 256
//      columns; every row of a CSV or TSV has a cell per column; every cell lies inside the
//      table's text and is at most 16 MiB; rows' lines increase; every JSON Lines cell is one
//      JSON value that check_json accepts at depth 64.
//   3: one JSON value: check_json at depth 8 must agree with nlohmann/json's parser (with the
//      nesting it reports), and json_string, json_integer, json_number and json_number_list
//      with the values nlohmann reads (except where nlohmann departs from RFC 8259: it skips a
//      byte order mark and stops at a NUL byte).
// std::runtime_error (and json_number_list's std::length_error) is an expected outcome; a
// crash, a sanitizer report, a leak, a hang, an out-of-memory or a disagreement (abort) is a
// finding.
//
// `conveyor-manifest-fuzz --write-seeds DIR` writes the seed corpus and exits. tests/fuzz_test.sh
// also passes conveyor-manifest-fuzz.dict.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fields/json_value.h"
#include "fields/manifest_table.h"

namespace {

namespace fs = std::filesystem;
using conveyor::detail::ManifestTable;

constexpr size_t kDepth = 8;  // the JSON value's bound in mode 3

void check(bool ok) {
  if (!ok) std::abort();
}

void fuzz_manifest(const std::string& text, ManifestTable::Format format) {
  ManifestTable t;
  try {
    t = conveyor::detail::read_manifest(text, format, "fuzz");
  } catch (const std::runtime_error& e) {
    check(std::strncmp(e.what(), "manifest fuzz", 13) == 0);
    return;
  }
  check(t.columns.size() <= conveyor::detail::kMaxManifestColumns);
  const bool json = format == ManifestTable::Format::kJsonLines;
  check(t.encoding ==
        (json ? conveyor::detail::MemberEncoding::kJson : conveyor::detail::MemberEncoding::kFile));
  uint64_t line = 0;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    check(t.rows[r].line > line);
    line = t.rows[r].line;
    for (size_t c = 0; c < t.columns.size(); ++c) {
      const auto cell = t.cell(r, c);
      check(json || cell.has_value());
      if (!cell) continue;
      check(cell->data() >= t.text.data() &&
            cell->data() + cell->size() <= t.text.data() + t.text.size());
      check(cell->size() <= conveyor::detail::kMaxManifestCellBytes);
      if (json) {
        try {
          conveyor::detail::check_json(*cell, 64);
        } catch (const std::runtime_error&) {
          check(false);
        }
      }
    }
  }
}

// nlohmann's reading of `text`: whether it is one value nested at most kDepth deep.
bool nlohmann_value(const std::string& text, nlohmann::json& value) {
  size_t deepest = 0;
  const nlohmann::json::parser_callback_t callback =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
        if (event == nlohmann::json::parse_event_t::array_start ||
            event == nlohmann::json::parse_event_t::object_start) {
          deepest = std::max(deepest, static_cast<size_t>(depth) + 1);
          if (deepest > kDepth) return false;  // not kept: the verdict is already known
        }
        return true;
      };
  value = nlohmann::json::parse(text, callback, false);
  return !value.is_discarded() && deepest <= kDepth;
}

void fuzz_json(const std::string& text) {
  namespace d = conveyor::detail;
  // nlohmann skips a UTF-8 byte order mark, which is not JSON's whitespace, and takes a NUL
  // byte for the end of the input (so it accepts "1\0x"): neither is compared.
  if (text.rfind("\xEF\xBB\xBF", 0) == 0 || text.find('\0') != std::string::npos) {
    try {
      d::check_json(text, kDepth);
    } catch (const std::runtime_error&) {
    }
    return;
  }
  nlohmann::json value;
  const bool theirs = nlohmann_value(text, value);
  bool ours = true;
  try {
    d::check_json(text, kDepth);
  } catch (const std::runtime_error& e) {
    check(std::strncmp(e.what(), "json: ", 6) == 0);
    ours = false;
  }
  check(ours == theirs);

  std::string s;
  const bool is_string = d::json_string(text, s);
  check(is_string == (theirs && value.is_string()));
  if (is_string) check(s == value.get<std::string>());

  int64_t i = 0;
  const bool is_integer = d::json_integer(text, i);
  const bool their_integer =
      theirs && (value.is_number_integer() &&
                 (!value.is_number_unsigned() || value.get<uint64_t>() <= uint64_t{INT64_MAX}));
  check(is_integer == their_integer);
  if (is_integer) check(i == value.get<int64_t>());

  double x = 0;
  if (d::json_number(text, x)) {
    check(theirs && value.is_number() && std::isfinite(x));
    if (value.is_number_float()) check(x == value.get<double>());
  } else if (theirs && value.is_number_float()) {
    // Refused only out of double's range: nlohmann (strtod) gives an infinity or underflows.
    const double v = value.get<double>();
    check(!std::isfinite(v) || std::fabs(v) < 1e-300);
  }

  std::vector<double> list;
  try {
    if (d::json_number_list(text, list, 16)) {
      check(theirs && value.is_array() && value.size() == list.size());
      for (size_t k = 0; k < list.size(); ++k) check(value[k].is_number());
    }
  } catch (const std::length_error&) {
    check(list.size() <= 16);
  }
}

void write(const fs::path& path, char mode, const std::string& text) {
  const std::string bytes = std::string(1, mode) + text;
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      fuzz_manifest(text, ManifestTable::Format::kCsv);
      break;
    case 1:
      fuzz_manifest(text, ManifestTable::Format::kTsv);
      break;
    case 2:
      fuzz_manifest(text, ManifestTable::Format::kJsonLines);
      break;
    default:
      fuzz_json(text);
  }
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i + 1 < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--write-seeds") != 0) continue;
    const fs::path out = (*argv)[i + 1];
    fs::create_directories(out);
    write(out / "csv", 0,
          "\xEF\xBB\xBFpath,caption,labels\r\na.jpg,\"two\r\nlines, \"\"quoted\"\"\",\"[1, 2]\"\r\n"
          "\r\nb.jpg,,[]\n");
    write(out / "csv-ragged", 0, "a,b\n1,2\n3\n\"4\n");
    write(out / "tsv", 1, "path\tlabel\n\"a.jpg\t3\r\n\nb.jpg\t4\n");
    write(out / "jsonl", 2,
          "{\"path\": \"a.jpg\", \"labels\": [1, 2], \"meta\": {\"k\": [null, true, 1.5e3]}}\n\n"
          "{\"p\\u0061th\": \"b\\ud83d\\ude00.jpg\", \"caption\": \"x\\ty\"}\r\n  \n{}\n");
    write(out / "jsonl-bad", 2, "{\"a\":1,\"a\":2}\n[1]\n{\"a\":1} {}\n");
    write(out / "json", 3, "{\"a\": [1, -2.5e-3, \"\\u00e9\", true, null, {\"b\": []}]}");
    write(out / "json-list", 3, "[0, 1, -2, 3.25, 1e2]");
    write(out / "json-deep", 3, std::string(9, '[') + std::string(9, ']'));
    write(out / "json-number", 3, "-9223372036854775808");
    std::exit(0);
  }
  return 0;
}
