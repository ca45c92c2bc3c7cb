// The parsers beneath the field writers (issue 31, "Untrusted data stays data"): .npy
// (datasets/fields/npy.h), JSON values (json_value.h) and manifests (manifest_table.h). Each is
// checked against the writers users have: numpy's np.save and format.write_array, Python's csv
// and json modules (tests/field_parsers_write.py, run once with the venv's Python; its seed is
// $FIELD_PARSERS_SEED, default 1), and against hostile bytes built here.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fields/json_value.h"
#include "fields/manifest_table.h"
#include "fields/npy.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using detail::check_json;
using detail::ManifestTable;
using detail::NpyArray;
using detail::parse_npy;
using detail::read_manifest;
using testing::TempDir;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// What the fixtures' writer wrote, once per run.
struct Fixtures {
  TempDir dir;
  int status = -1;     // the writer's exit status
  std::string errors;  // what it wrote to stderr
  std::string seed;
  Fixtures() {
    const char* env = std::getenv("FIELD_PARSERS_SEED");
    seed = env != nullptr ? env : "1";
    const std::string command = std::string(CONVEYOR_VENV_PYTHON) + " " + FIELD_PARSERS_WRITE +
                                " " + dir.path().string() + " " + seed + " 2>" +
                                (dir / "errors").string();
    const int raw = std::system(command.c_str());
    status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    errors = slurp(dir / "errors");
  }
  nlohmann::json listing(const std::string& name) const {
    return nlohmann::json::parse(slurp(dir / name));
  }
};

const Fixtures& fixtures() {
  static const Fixtures f;
  return f;
}

#define ASSERT_FIXTURES()                                                                \
  ASSERT_EQ(fixtures().status, 0) << "tests/field_parsers_write.py failed (numpy in "    \
                                  << CONVEYOR_VENV_PYTHON << "): " << fixtures().errors; \
  SCOPED_TRACE("FIELD_PARSERS_SEED=" + fixtures().seed)

c10::ScalarType torch_dtype(const std::string& numpy) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"bool", c10::kBool},
      {"int8", c10::kChar},
      {"int16", c10::kShort},
      {"int32", c10::kInt},
      {"int64", c10::kLong},
      {"uint8", c10::kByte},
      {"uint16", c10::kUInt16},
      {"uint32", c10::kUInt32},
      {"uint64", c10::kUInt64},
      {"float16", c10::kHalf},
      {"float32", c10::kFloat},
      {"float64", c10::kDouble},
      {"complex64", c10::kComplexFloat},
      {"complex128", c10::kComplexDouble}};
  return kTypes.at(numpy);
}

// --- .npy

TEST(Npy, ReadsEveryDtypeShapeAndVersionThatNumpyWrites) {
  ASSERT_FIXTURES();
  const nlohmann::json listing = fixtures().listing("npy.json");
  ASSERT_GE(listing.size(), 14u * 7u + 3u + 40u);
  for (const auto& entry : listing) {
    const std::string name = entry["name"];
    SCOPED_TRACE(name);
    const std::string file = slurp(fixtures().dir / "npy" / (name + ".npy"));
    const std::string expected = slurp(fixtures().dir / "npy" / (name + ".bin"));
    NpyArray array;
    ASSERT_NO_THROW(array = parse_npy(reinterpret_cast<const uint8_t*>(file.data()), file.size()));
    EXPECT_EQ(array.dtype, torch_dtype(entry["dtype"]));
    EXPECT_EQ(array.shape, entry["shape"].get<std::vector<int64_t>>());
    ASSERT_EQ(array.bytes, expected.size());
    EXPECT_EQ(std::memcmp(array.data, expected.data(), expected.size()), 0);
    EXPECT_EQ(array.data + array.bytes,
              reinterpret_cast<const uint8_t*>(file.data()) + file.size());
  }
}

TEST(Npy, RefusesWhatTorchCannotHoldAndNeverUnpickles) {
  ASSERT_FIXTURES();
  for (const auto& entry : fixtures().listing("refused.json")) {
    const std::string name = entry["name"];
    const std::string says = entry["says"];
    SCOPED_TRACE(name);
    const std::string file = slurp(fixtures().dir / "refused" / (name + ".npy"));
    try {
      parse_npy(reinterpret_cast<const uint8_t*>(file.data()), file.size());
      ADD_FAILURE() << "accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("npy: ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// A .npy of version `major`.0 with `header` as its dict literal (padded as numpy pads it) and
// `data` after it.
std::string make_npy(const std::string& header, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string text = header;
  while ((prefix + text.size() + 1) % 64 != 0) text += ' ';
  text += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  return out + text + data;
}

std::string npy_error(const std::string& file) {
  try {
    parse_npy(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(accepted)";
}

#define EXPECT_NPY_REFUSED(file, says)                           \
  do {                                                           \
    const std::string message = npy_error(file);                 \
    EXPECT_EQ(message.rfind("npy: ", 0), 0u) << message;         \
    EXPECT_NE(message.find(says), std::string::npos) << message; \
  } while (0)

TEST(Npy, ReadsTheHeaderAsALiteralInAnyKeyOrderAndQuoting) {
  const std::string data(24, '\x01');
  for (const std::string header :
       {"{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
        "{\"shape\":(2,3),\"fortran_order\":False,\"descr\":\"<i4\"}",
        "{ 'fortran_order' : False , 'descr' : '<i4' , 'shape' : ( 2 , 3 , ) }"}) {
    SCOPED_TRACE(header);
    const std::string file = make_npy(header, data);
    const NpyArray a = parse_npy(reinterpret_cast<const uint8_t*>(file.data()), file.size());
    EXPECT_EQ(a.dtype, c10::kInt);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.bytes, 24u);
  }
}

TEST(Npy, RefusesHostileHeadersAndSizes) {
  const auto h = [](const std::string& descr, const std::string& shape,
                    const std::string& order = "False") {
    return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
  };
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "(3,)"), std::string(11, 'x')), "truncated");
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "(3,)"), std::string(13, 'x')), "bytes after the array");
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "(-1, 3)"), ""), "negative");
  EXPECT_NPY_REFUSED(make_npy(h("<f8", "(4294967296, 4294967296)"), ""), "more bytes than");
  EXPECT_NPY_REFUSED(make_npy(h("<f8", "(99999999999999999999,)"), ""), "64 bits");
  EXPECT_NPY_REFUSED(make_npy(h("|O", "(3,)"), std::string(24, 'x')), "pickle");
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "(3,)", "True"), std::string(12, 'x')), "fortran_order");
  EXPECT_NPY_REFUSED(make_npy(h(">i8", "(1,)"), std::string(8, 'x')), "big-endian");
  EXPECT_NPY_REFUSED(make_npy(h("|f4", "(1,)"), std::string(4, 'x')), "'|'");
  EXPECT_NPY_REFUSED(make_npy(h("<V8", "(1,)"), std::string(8, 'x')), "no torch dtype");
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "(3)"), std::string(12, 'x')), "not a tuple");
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "(3*4,)"), std::string(48, 'x')), "',' or ')'");
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "__import__('os').system('false')"), ""), "not a tuple");
  EXPECT_NPY_REFUSED(make_npy(h("<f4", "(1,)") + "; import os", "xxxx"), "text after");
  EXPECT_NPY_REFUSED(
      make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", "xxxx"),
      "'extra'");
  EXPECT_NPY_REFUSED(make_npy("{'descr': '<f4', 'shape': (1,)}", "xxxx"), "lacks 'fortran_order'");
  EXPECT_NPY_REFUSED(
      make_npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", "xxxx"),
      "twice");
  EXPECT_NPY_REFUSED(
      make_npy("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", "xxxx"), "escape");
  std::string dims = "(";
  for (int i = 0; i < 65; ++i) dims += "1,";
  EXPECT_NPY_REFUSED(make_npy(h("<f4", dims + ")"), "xxxx"), "more than 64 dimensions");
  // The frame around the header.
  EXPECT_NPY_REFUSED(std::string("\x93NUMPX\x01\x00", 8), "magic");
  EXPECT_NPY_REFUSED(std::string("\x93NUMPY", 6), "magic");
  std::string v4 = make_npy(h("<f4", "(1,)"), "xxxx");
  v4[6] = 4;
  EXPECT_NPY_REFUSED(v4, "version 4.0");
  std::string long_header = make_npy(h("<f4", "(1,)"), "xxxx");
  long_header[8] = '\xFF';
  long_header[9] = '\xFF';
  EXPECT_NPY_REFUSED(long_header, "the header claims 65535 bytes");
  EXPECT_NPY_REFUSED(std::string("\x93NUMPY\x02\x00\x01", 9), "inside the header's length");
  // Empty and 0-d arrays built by hand, and version 2's and 3's four-byte length.
  const std::string empty = make_npy(h("<f4", "(0, 1000000000000)"), "");
  EXPECT_EQ(parse_npy(reinterpret_cast<const uint8_t*>(empty.data()), empty.size()).bytes, 0u);
  for (int major : {2, 3}) {
    const std::string scalar = make_npy(h("<u2", "()"), "ab", major);
    const NpyArray a = parse_npy(reinterpret_cast<const uint8_t*>(scalar.data()), scalar.size());
    EXPECT_TRUE(a.shape.empty());
    EXPECT_EQ(a.dtype, c10::kUInt16);
    EXPECT_EQ(a.bytes, 2u);
  }
}

// --- JSON values

std::string json_error(const std::string& text, size_t depth) {
  try {
    check_json(text, depth);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(accepted)";
}

// nlohmann's verdict on `text` with arrays and objects nested at most `depth`, for comparison.
bool nlohmann_accepts(const std::string& text, size_t depth) {
  struct Depth : nlohmann::json::json_sax_t {
    size_t now = 0, most = 0;
    bool open() {
      most = std::max(most, ++now);
      return true;
    }
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return open(); }
    bool key(string_t&) override { return true; }
    bool end_object() override { return --now, true; }
    bool start_array(std::size_t) override { return open(); }
    bool end_array() override { return --now, true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } sax;
  // nlohmann skips a byte order mark; check_json does not (it is not JSON's whitespace).
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) return false;
  return nlohmann::json::sax_parse(text, &sax) && sax.most <= depth;
}

TEST(JsonValue, AcceptsWhatNlohmannAcceptsWithinTheDepth) {
  const std::vector<std::string> cases = {"0",
                                          "-0",
                                          "1.5e-3",
                                          "-12E+4",
                                          " \t\r\n{}\n",
                                          "[]",
                                          "[1, [2, [3]]]",
                                          "{\"a\": {\"b\": []}}",
                                          "\"\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
                                          "\"é猫😀\"",
                                          "true",
                                          "null",
                                          "[1,]",
                                          "{\"a\":1,}",
                                          "01",
                                          "1.",
                                          ".5",
                                          "-",
                                          "+1",
                                          "1e",
                                          "tru",
                                          "nul",
                                          "[1 2]",
                                          "{\"a\" 1}",
                                          "{1: 2}",
                                          "\"\\x41\"",
                                          "\"\\ud800\"",
                                          "\"\\udc00\"",
                                          "\"\\ud800\\u0041\"",
                                          "\"\xC3\"",
                                          "\"\xED\xA0\x80\"",
                                          "\"\xC0\xAF\"",
                                          "\"\xF4\x90\x80\x80\"",
                                          "\"a\x01\"",
                                          "\"a\x7F\"",
                                          "[] []",
                                          "",
                                          " ",
                                          "\xEF\xBB\xBF{}",
                                          "NaN",
                                          "Infinity",
                                          "[1e999]",
                                          "\"abc",
                                          "[\"a\",",
                                          "{\"a\":",
                                          std::string("[0\0]", 4),
                                          "1 x",
                                          "{\"a\":1}}"};
  for (const std::string& text : cases) {
    SCOPED_TRACE(text);
    const std::string message = json_error(text, 64);
    EXPECT_EQ(message == "(accepted)", nlohmann_accepts(text, 64)) << message;
    if (message != "(accepted)") {
      EXPECT_EQ(message.rfind("json: ", 0), 0u) << message;
    }
  }
}

TEST(JsonValue, RefusesNestingAsItOpens) {
  const std::string at_limit = std::string(64, '[') + std::string(64, ']');
  EXPECT_NO_THROW(check_json(at_limit, 64));
  const std::string over = std::string(65, '[') + std::string(65, ']');
  EXPECT_NE(json_error(over, 64).find("nested more than 64 deep, at byte 64"), std::string::npos)
      << json_error(over, 64);
  // 10 million opening brackets and nothing else: refused at the 65th, no recursion past it.
  const std::string hostile(10'000'000, '[');
  EXPECT_NE(json_error(hostile, 64).find("nested more than 64"), std::string::npos);
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 65; ++i) s += "{\"k\":";
    return s + "1" + std::string(65, '}');
  }();
  EXPECT_NE(json_error(objects, 64).find("nested more than 64"), std::string::npos);
  EXPECT_NO_THROW(check_json(objects, 65));
  EXPECT_THROW(check_json("1", detail::kMaxJsonCheckDepth + 1), std::invalid_argument);
}

TEST(JsonValue, ReadsStringsIntegersNumbersAndLists) {
  std::string s;
  EXPECT_TRUE(detail::json_string(" \"a\\\"b\\u00e9\\ud83d\\ude00\\n\" ", s));
  EXPECT_EQ(s, "a\"b\xC3\xA9\xF0\x9F\x98\x80\n");
  EXPECT_TRUE(detail::json_string("\"\"", s));
  EXPECT_EQ(s, "");
  EXPECT_FALSE(detail::json_string("\"abc", s));
  EXPECT_FALSE(detail::json_string("\"a\" \"b\"", s));
  EXPECT_FALSE(detail::json_string("12", s));
  EXPECT_FALSE(detail::json_string("\"\\ud800\"", s));

  int64_t i = 0;
  EXPECT_TRUE(detail::json_integer("-9223372036854775808", i));
  EXPECT_EQ(i, INT64_MIN);
  EXPECT_TRUE(detail::json_integer(" 42\n", i));
  EXPECT_EQ(i, 42);
  EXPECT_FALSE(detail::json_integer("9223372036854775808", i));
  EXPECT_FALSE(detail::json_integer("1.0", i));
  EXPECT_FALSE(detail::json_integer("1e2", i));
  EXPECT_FALSE(detail::json_integer("042", i));
  EXPECT_FALSE(detail::json_integer("\"42\"", i));
  EXPECT_FALSE(detail::json_integer("", i));

  double d = 0;
  EXPECT_TRUE(detail::json_number("-1.25e2", d));
  EXPECT_EQ(d, -125.0);
  EXPECT_TRUE(detail::json_number("0.1", d));
  EXPECT_EQ(d, 0.1);
  EXPECT_FALSE(detail::json_number("1e999", d));
  EXPECT_FALSE(detail::json_number("NaN", d));
  EXPECT_FALSE(detail::json_number("1.", d));
  EXPECT_FALSE(detail::json_number("[1]", d));

  std::vector<double> list;
  EXPECT_TRUE(detail::json_number_list(" [1, -2.5 ,3e1] ", list, 3));
  EXPECT_EQ(list, (std::vector<double>{1, -2.5, 30}));
  EXPECT_TRUE(detail::json_number_list("[]", list, 0));
  EXPECT_TRUE(list.empty());
  EXPECT_FALSE(detail::json_number_list("[1, \"2\"]", list, 8));
  EXPECT_FALSE(detail::json_number_list("[1, [2]]", list, 8));
  EXPECT_FALSE(detail::json_number_list("[1,]", list, 8));
  EXPECT_FALSE(detail::json_number_list("[1] 2", list, 8));
  EXPECT_FALSE(detail::json_number_list("1", list, 8));
  // Over the bound: refused before the list grows past it.
  std::vector<double> bounded;
  bounded.reserve(4);
  std::string many = "[0";
  for (int k = 0; k < 100000; ++k) many += ",1";
  many += "]";
  try {
    detail::json_number_list(many, bounded, 4);
    ADD_FAILURE() << "accepted";
  } catch (const std::length_error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 4 numbers"), std::string::npos) << e.what();
  }
  EXPECT_LE(bounded.size(), 4u);

  // Lists of lists of one length (boxes, points).
  size_t columns = 9;
  EXPECT_TRUE(detail::json_number_rows(" [ [1, 2] ,[3,4.5] ] ", list, columns, 4));
  EXPECT_EQ(list, (std::vector<double>{1, 2, 3, 4.5}));
  EXPECT_EQ(columns, 2u);
  EXPECT_TRUE(detail::json_number_rows("[]", list, columns, 4));
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(columns, 0u);
  EXPECT_FALSE(detail::json_number_rows("[[1, 2], [3]]", list, columns, 8));
  EXPECT_FALSE(detail::json_number_rows("[1, 2]", list, columns, 8));
  EXPECT_FALSE(detail::json_number_rows("[[1, [2]]]", list, columns, 8));
  EXPECT_FALSE(detail::json_number_rows("[[1, 2],]", list, columns, 8));
  EXPECT_FALSE(detail::json_number_rows("[[1, 2]] x", list, columns, 8));
  EXPECT_THROW(detail::json_number_rows("[[1, 2], [3, 4], [5, 6]]", list, columns, 5),
               std::length_error);
  EXPECT_LE(list.size(), 5u);
  EXPECT_EQ(bounded.capacity(), 4u);
}

// --- Manifests

std::string manifest_error(std::string text, ManifestTable::Format format) {
  try {
    read_manifest(std::move(text), format, "m.csv");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(accepted)";
}

#define EXPECT_MANIFEST_REFUSED(text, format, says)               \
  do {                                                            \
    const std::string message = manifest_error(text, format);     \
    EXPECT_EQ(message.rfind("manifest m.csv", 0), 0u) << message; \
    EXPECT_NE(message.find(says), std::string::npos) << message;  \
  } while (0)

std::vector<std::vector<std::optional<std::string>>> cells_of(const ManifestTable& t) {
  std::vector<std::vector<std::optional<std::string>>> rows;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    rows.emplace_back();
    for (size_t c = 0; c < t.columns.size(); ++c) {
      const auto cell = t.cell(r, c);
      rows.back().push_back(cell ? std::optional<std::string>(std::string(*cell)) : std::nullopt);
    }
  }
  return rows;
}

using Cells = std::vector<std::vector<std::optional<std::string>>>;
constexpr auto kCsv = ManifestTable::Format::kCsv;
constexpr auto kTsv = ManifestTable::Format::kTsv;
constexpr auto kJsonLines = ManifestTable::Format::kJsonLines;

TEST(Manifest, CsvQuotedCellsSpanLinesAndRowsKeepTheirLines) {
  const std::string text =
      "\xEF\xBB\xBFpath,caption,label\r\n"
      "a.jpg,\"two\r\nlines, and \"\"quotes\"\"\",1\r\n"
      "\r\n"
      "b.jpg,,2\n"
      "\n"
      "\"c,1.jpg\",\"\",3";
  const ManifestTable t = read_manifest(text, kCsv, "m.csv");
  EXPECT_EQ(t.encoding, detail::MemberEncoding::kFile);
  EXPECT_EQ(t.columns, (std::vector<std::string>{"path", "caption", "label"}));
  EXPECT_EQ(cells_of(t), (Cells{{"a.jpg", "two\r\nlines, and \"quotes\"", "1"},
                                {"b.jpg", "", "2"},
                                {"c,1.jpg", "", "3"}}));
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0].line, 2u);
  EXPECT_EQ(t.rows[1].line, 5u);
  EXPECT_EQ(t.rows[2].line, 7u);
  EXPECT_EQ(t.column("label"), 2u);
  EXPECT_EQ(t.column("nope"), ManifestTable::npos);
  EXPECT_TRUE(read_manifest("a,b\n", kCsv, "m.csv").rows.empty());
}

TEST(Manifest, CsvRefusalsNameTheManifestAndTheLine) {
  EXPECT_MANIFEST_REFUSED("a,b\n1,2\n3\n", kCsv, "line 3: 1 cell, but the header has 2 columns");
  EXPECT_MANIFEST_REFUSED("a,b\n1,2,3\n", kCsv, "line 2: 3 cells");
  EXPECT_MANIFEST_REFUSED("a,b\n1,\"2\n\n3\n", kCsv,
                          "line 2: a quoted cell without its closing quote");
  EXPECT_MANIFEST_REFUSED("a,b\n\"x\ny\",2\n5 \"inch\",2\n", kCsv, "line 4: a '\"' inside");
  EXPECT_MANIFEST_REFUSED("a,b\n\"x\"y,2\n", kCsv, "line 2: text after a quoted cell");
  EXPECT_MANIFEST_REFUSED("a,b\r1,2\r", kCsv, "line 1: a carriage return");
  EXPECT_MANIFEST_REFUSED("a,a\n1,2\n", kCsv, "line 1: the column 'a' is named twice");
  EXPECT_MANIFEST_REFUSED("", kCsv, "m.csv: no header row");
  EXPECT_MANIFEST_REFUSED("\n\r\n", kTsv, "no header row");
  std::string wide;
  for (int i = 0; i < 257; ++i) wide += (i ? "," : "") + std::to_string(i);
  EXPECT_MANIFEST_REFUSED(wide + "\n", kCsv, "line 1: more than 256 cells");
  wide.resize(wide.rfind(','));
  EXPECT_EQ(read_manifest(wide + "\n", kCsv, "m.csv").columns.size(), 256u);
  const std::string big_cell = "a\n\"" + std::string((16 << 20) + 1, 'x') + "\"\n";
  EXPECT_MANIFEST_REFUSED(big_cell, kCsv, "line 2: a cell of 16777217 bytes, more than 16 MiB");
  EXPECT_MANIFEST_REFUSED(std::string(detail::kMaxManifestBytes + 1, '\n'), kCsv,
                          "m.csv: 1073741825 bytes, more than the 1024 MiB");
}

TEST(Manifest, TsvHasNoQuoting) {
  const ManifestTable t = read_manifest("p\tq\r\n\"a\tb\"\"\r\n\t\n", kTsv, "m.tsv");
  EXPECT_EQ(cells_of(t), (Cells{{"\"a", "b\"\""}, {"", ""}}));
  EXPECT_MANIFEST_REFUSED("p\tq\n1\t2\t3\n", kTsv, "line 2: 3 cells");
}

TEST(Manifest, JsonLinesColumnsAreTheUnionInFirstSeenOrder) {
  const std::string text =
      "\xEF\xBB\xBF{\"path\": \"a.jpg\", \"labels\": [1, 2]}\r\n"
      "   \n"
      "{\"labels\":[],\"caption\":\"x\\ty\",\"p\\u0061th\":\"b.jpg\"}\n"
      "\n"
      "{}\n"
      "{\"meta\": {\"k\": [null, true]}, \"path\": \"c.jpg\"}";
  const ManifestTable t = read_manifest(text, kJsonLines, "m.jsonl");
  EXPECT_EQ(t.encoding, detail::MemberEncoding::kJson);
  EXPECT_EQ(t.columns, (std::vector<std::string>{"path", "labels", "caption", "meta"}));
  EXPECT_EQ(cells_of(t),
            (Cells{{"\"a.jpg\"", "[1, 2]", std::nullopt, std::nullopt},
                   {"\"b.jpg\"", "[]", "\"x\\ty\"", std::nullopt},
                   {std::nullopt, std::nullopt, std::nullopt, std::nullopt},
                   {"\"c.jpg\"", std::nullopt, std::nullopt, "{\"k\": [null, true]}"}}));
  ASSERT_EQ(t.rows.size(), 4u);
  EXPECT_EQ(t.rows[0].line, 1u);
  EXPECT_EQ(t.rows[1].line, 3u);
  EXPECT_EQ(t.rows[2].line, 5u);
  EXPECT_EQ(t.rows[3].line, 6u);
}

TEST(Manifest, JsonLinesRefusalsNameTheManifestAndTheLine) {
  EXPECT_MANIFEST_REFUSED("{}\n[1]\n", kJsonLines, "line 2: the row is not a JSON object");
  EXPECT_MANIFEST_REFUSED("{}\n\n{\"a\":1,\"a\":2}\n", kJsonLines,
                          "line 3: the key 'a' is given twice");
  EXPECT_MANIFEST_REFUSED("{\"a\":1,\"\\u0061\":2}\n", kJsonLines,
                          "line 1: the key 'a' is given twice");
  EXPECT_MANIFEST_REFUSED("{\"a\":1} {\"b\":2}\n", kJsonLines,
                          "line 1: text after the row's object");
  EXPECT_MANIFEST_REFUSED("{\"a\":\n1}\n", kJsonLines, "line 1: json: the text ends");
  EXPECT_MANIFEST_REFUSED("{\"a\":tru}\n", kJsonLines, "line 1: json:");
  EXPECT_MANIFEST_REFUSED("{\"a\":1,}\n", kJsonLines, "line 1: a key is not a string");
  EXPECT_MANIFEST_REFUSED("{\"a\":1\n", kJsonLines, "line 1: ',' or '}' expected");
  EXPECT_MANIFEST_REFUSED("{\"a\":\"\xC3\"}\n", kJsonLines, "not valid UTF-8");
  const std::string deep = "{\"a\":" + std::string(65, '[') + std::string(65, ']') + "}";
  EXPECT_MANIFEST_REFUSED("{}\n" + deep, kJsonLines,
                          "line 2: json: arrays and objects nested more than 64");
  const std::string at_limit = "{\"a\":" + std::string(64, '[') + std::string(64, ']') + "}";
  EXPECT_EQ(read_manifest(at_limit, kJsonLines, "m").rows.size(), 1u);
  std::string wide = "{";
  for (int i = 0; i < 257; ++i) wide += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
  EXPECT_MANIFEST_REFUSED(wide + "}", kJsonLines, "line 1: a key '256' beyond the 256 columns");
  const std::string big = "{\"a\":\"" + std::string(16 << 20, 'x') + "\"}";
  EXPECT_MANIFEST_REFUSED(big, kJsonLines, "line 1: the value of 'a' is 16777218 bytes");
}

TEST(Manifest, RandomTablesMatchPythonsCsvAndJson) {
  ASSERT_FIXTURES();
  const nlohmann::json tables = fixtures().listing("tables.json");
  ASSERT_EQ(tables.size(), 12u);
  for (const auto& table : tables) {
    const std::string name = table["name"];
    SCOPED_TRACE(name);
    const std::string format = table["format"];
    const ManifestTable t = read_manifest(slurp(fixtures().dir / name),
                                          format == "csv"   ? kCsv
                                          : format == "tsv" ? kTsv
                                                            : kJsonLines,
                                          name);
    EXPECT_EQ(t.columns, table["columns"].get<std::vector<std::string>>());
    Cells expected;
    for (const auto& row : table["rows"]) {
      expected.emplace_back();
      for (const auto& cell : row) {
        expected.back().push_back(
            cell.is_null() ? std::nullopt : std::optional<std::string>(cell.get<std::string>()));
      }
    }
    EXPECT_EQ(cells_of(t), expected);
    if (format == "jsonl") {
      for (size_t r = 0; r < t.rows.size(); ++r) {
        for (size_t c = 0; c < t.columns.size(); ++c) {
          if (const auto cell = t.cell(r, c)) {
            EXPECT_NO_THROW(check_json(*cell, 64));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace conveyor
