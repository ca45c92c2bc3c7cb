// The field kinds (conveyor/fields.h): each writer makes its field of a member exactly, refuses
// what does not fit with a message naming the field (and the option, for a bound), and never
// writes past its row.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "conveyor/fields.h"
#include "fields/field_writer.h"
#include "sources/sample_kind.h"

namespace conveyor {
namespace {

using detail::Member;
using detail::MemberEncoding;

Member file_member(const std::string& name, const std::string& bytes) {
  return {name, MemberEncoding::kFile, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
          0};
}

Member json_member(const std::string& name, const std::string& text) {
  Member m = file_member(name, text);
  m.encoding = MemberEncoding::kJson;
  return m;
}

// A row with guard bytes after it, to prove nothing is written past it.
struct GuardedRow {
  explicit GuardedRow(size_t bytes) : storage(bytes + 64, std::byte{0xAB}), size(bytes) {}
  std::byte* data() { return storage.data(); }
  bool guard_intact() const {
    for (size_t i = size; i < storage.size(); ++i) {
      if (storage[i] != std::byte{0xAB}) return false;
    }
    return true;
  }
  std::vector<std::byte> storage;
  size_t size;
};

struct Written {
  FieldSpec spec;
  GuardedRow row;
};

Written write(const std::string& name, const Field& field, const Member& member) {
  const FieldSpec spec = field.spec(name);
  Written w{spec, GuardedRow(spec.sample_bytes())};
  auto writer = detail::make_field_writer(name, field, spec);
  writer->write(member, SampleContext{}, w.row.data());
  EXPECT_TRUE(w.row.guard_intact()) << name;
  return w;
}

std::string error_of(const std::string& name, const Field& field, const Member& member) {
  const FieldSpec spec = field.spec(name);
  GuardedRow row(spec.sample_bytes());
  auto writer = detail::make_field_writer(name, field, spec);
  try {
    writer->write(member, SampleContext{}, row.data());
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(row.guard_intact()) << name;
    return e.what();
  }
  return "";
}

std::string ragged_text(const Written& w) {
  RaggedRow r(const_cast<std::byte*>(w.row.storage.data()));
  return std::string(reinterpret_cast<const char*>(r.items()), static_cast<size_t>(r.count()));
}

TEST(FieldSpecs, LayoutsOfEachKind) {
  EXPECT_EQ(Field::integer("cls").spec("label").dtype, c10::ScalarType::Long);
  EXPECT_EQ(Field::floating("score").spec("s").dtype, c10::ScalarType::Float);
  const FieldSpec image = Field::image("jpg;png", ImageTransform::train(32)).spec("image");
  EXPECT_EQ(image.sample_shape, (std::vector<int64_t>{3, 32, 32}));
  EXPECT_FALSE(image.ragged());
  const FieldSpec text = Field::text("txt", 100).spec("caption");
  EXPECT_TRUE(text.ragged());
  EXPECT_TRUE(text.host_only);
  EXPECT_EQ(text.max_items, 100u);
  EXPECT_EQ(text.sample_bytes(), 108u);
  EXPECT_EQ(Field::json("json").spec("meta").max_items, Field::kDefaultMaxBytes);
  const FieldSpec boxes = Field::array("boxes.npy", c10::kFloat, {-1, 4}, 1600).spec("boxes");
  EXPECT_TRUE(boxes.ragged());
  EXPECT_FALSE(boxes.host_only);
  EXPECT_EQ(boxes.sample_shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(boxes.max_items, 100u);  // 1600 bytes of 16-byte boxes
  EXPECT_EQ(Field::array("npy", c10::kHalf, {1000}).spec("soft").sample_bytes(), 2000u);
}

TEST(FieldSpecs, RefusesWhatCannotBeLaidOut) {
  EXPECT_THROW(Field::text("").spec("caption"), std::invalid_argument);
  EXPECT_THROW(Field::array("npy", c10::kFloat, {3, -1}).spec("a"), std::invalid_argument);
  EXPECT_THROW(Field::array("npy", c10::kFloat, {0}).spec("a"), std::invalid_argument);
  EXPECT_THROW(Field::array("npy", c10::kFloat, {-1, 4}, 8).spec("a"), std::invalid_argument);
  Field bad = Field::multi_hot_array("labels", 10);
  bad.shape = {2, 5};
  try {
    bad.spec("labels");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("field \"labels\""), std::string::npos) << e.what();
  }
  EXPECT_EQ(Field::image("jpg; PNG;;webp", {}).key_list(),
            (std::vector<std::string>{"jpg", " png", "webp"}));
}

TEST(ScalarFields, DecimalTextJsonAndKnownIntegers) {
  int64_t v = 0;
  Written w = write("label", Field::integer("cls"), file_member("cls", " 42\n"));
  std::memcpy(&v, w.row.data(), 8);
  EXPECT_EQ(v, 42);
  w = write("label", Field::integer("cls"), json_member("cls", "-7"));
  std::memcpy(&v, w.row.data(), 8);
  EXPECT_EQ(v, -7);
  Member known{"cls", MemberEncoding::kInteger, nullptr, 0, 9};
  w = write("label", Field::integer("cls"), known);
  std::memcpy(&v, w.row.data(), 8);
  EXPECT_EQ(v, 9);
  float f = 0;
  w = write("score", Field::floating("s"), file_member("s", "0.25"));
  std::memcpy(&f, w.row.data(), 4);
  EXPECT_EQ(f, 0.25f);
  for (const char* bad : {"", "abc", "1.5", "12abc", "99999999999999999999"}) {
    const std::string e = error_of("label", Field::integer("cls"), file_member("cls", bad));
    EXPECT_NE(e.find("field \"label\""), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("not an integer"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_NE(error_of("label", Field::integer("cls"), file_member("cls", std::string(100, '1')))
                .find("100 bytes"),
            std::string::npos);
}

TEST(TextFields, CaptionsAreCheckedUtf8AndBounded) {
  const std::string caption = "a photo of a caf\xc3\xa9, \xe2\x98\x95";
  EXPECT_EQ(ragged_text(write("caption", Field::text("txt"), file_member("txt", caption))),
            caption);
  EXPECT_EQ(ragged_text(write("caption", Field::text("txt"), file_member("txt", ""))), "");
  EXPECT_EQ(ragged_text(write("caption", Field::text("caption"),
                              json_member("caption", "\"a \\\"quoted\\\" \\u00e9\""))),
            "a \"quoted\" \xc3\xa9");
  for (const std::string& bad : {std::string("\xff"), std::string("ab\xc3"),
                                 std::string("\xed\xa0\x80"), std::string("\xc0\xaf")}) {
    const std::string e = error_of("caption", Field::text("txt"), file_member("txt", bad));
    EXPECT_NE(e.find("not UTF-8"), std::string::npos) << e;
  }
  // Exactly at the bound fits; one more byte is the field's error, naming the option.
  EXPECT_EQ(ragged_text(
                write("caption", Field::text("txt", 16), file_member("txt", std::string(16, 'x')))),
            std::string(16, 'x'));
  const std::string e =
      error_of("caption", Field::text("txt", 16), file_member("txt", std::string(17, 'x')));
  EXPECT_NE(e.find("field \"caption\""), std::string::npos) << e;
  EXPECT_NE(e.find("17 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("max_bytes"), std::string::npos) << e;
}

// Random byte strings: the text field accepts exactly those a plain UTF-8 decoder accepts.
TEST(TextFields, AcceptsWhatAPlainDecoderAccepts) {
  std::mt19937 rng(5);
  // A plain reference: decode code points one by one with the RFC 3629 table.
  const auto plain_valid = [](const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
      const auto c = static_cast<unsigned char>(s[i]);
      size_t n = c < 0x80                 ? 1
                 : c >= 0xC2 && c <= 0xDF ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
      if (n == 0 || i + n > s.size()) return false;
      uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
      for (size_t k = 1; k < n; ++k) {
        const auto d = static_cast<unsigned char>(s[i + k]);
        if ((d & 0xC0) != 0x80) return false;
        cp = (cp << 6) | (d & 0x3F);
      }
      if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
          (cp >= 0xD800 && cp <= 0xDFFF)) {
        return false;
      }
      i += n;
    }
    return true;
  };
  size_t valid = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s(rng() % 6, '\0');
    for (char& c : s) {
      const uint32_t r = rng() % 4;
      c = static_cast<char>(r == 0   ? rng() % 0x80
                            : r == 1 ? 0x80 + rng() % 0x40
                                     : 0xC0 + rng() % 0x40);
    }
    const bool accepted = error_of("t", Field::text("txt"), file_member("txt", s)).empty();
    ASSERT_EQ(accepted, plain_valid(s)) << testing::PrintToString(s);
    valid += accepted;
  }
  EXPECT_GT(valid, 1000u);
}

TEST(JsonFields, WellFormedAndShallow) {
  const std::string meta = R"({"url": "http://x/1.jpg", "width": 640, "tags": [1, 2]})";
  EXPECT_EQ(ragged_text(write("meta", Field::json("json"), file_member("json", meta))), meta);
  EXPECT_NE(error_of("meta", Field::json("json"), file_member("json", "{\"a\": ")).find("not JSON"),
            std::string::npos);
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_NE(error_of("meta", Field::json("json"), file_member("json", deep)).find("not JSON"),
            std::string::npos);
  const std::string deeper = std::string(1000000, '[');
  EXPECT_NE(
      error_of("meta", Field::json("json", 2000000), file_member("json", deeper)).find("not JSON"),
      std::string::npos);
  EXPECT_NE(error_of("meta", Field::json("json", 10), file_member("json", meta)).find("max_bytes"),
            std::string::npos);
}

// A .npy's bytes: numpy's format 1.0 with `descr` and `shape` (the header as numpy writes it).
std::string npy(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(ArrayFields, NpyOfTheDeclaredDtypeAndShape) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.25f};
  Written w = write("soft", Field::array("npy", c10::kFloat, {3}),
                    file_member("npy", npy("<f4", "(3,)", raw(logits))));
  EXPECT_EQ(std::memcmp(w.row.data(), logits.data(), 12), 0);
  const std::string e1 = error_of("soft", Field::array("npy", c10::kHalf, {3}),
                                  file_member("npy", npy("<f4", "(3,)", raw(logits))));
  EXPECT_NE(e1.find("not the declared"), std::string::npos) << e1;
  const std::string e2 = error_of("soft", Field::array("npy", c10::kFloat, {4}),
                                  file_member("npy", npy("<f4", "(3,)", raw(logits))));
  EXPECT_NE(e2.find("shape [3]"), std::string::npos) << e2;
  const std::string pickle = error_of("soft", Field::array("npy", c10::kFloat, {3}),
                                      file_member("npy", npy("|O", "(3,)", raw(logits))));
  EXPECT_NE(pickle.find("pickle"), std::string::npos) << pickle;
}

TEST(ArrayFields, RaggedBoxesAndTheirBound) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = rng() % 11;  // 0 .. 10 boxes; the bound is 10
    std::vector<float> boxes(n * 4);
    for (float& b : boxes) b = static_cast<float>(rng() % 1000) / 8.0f;
    const Field field = Field::array("boxes.npy", c10::kFloat, {-1, 4}, 160);
    Written w =
        write("boxes", field,
              file_member("boxes.npy", npy("<f4", "(" + std::to_string(n) + ", 4)", raw(boxes))));
    RaggedRow r(w.row.data());
    ASSERT_EQ(r.count(), static_cast<int64_t>(n));
    EXPECT_EQ(std::memcmp(r.items(), boxes.data(), boxes.size() * 4), 0);
  }
  std::vector<float> eleven(44, 1.0f);
  const std::string e = error_of("boxes", Field::array("boxes.npy", c10::kFloat, {-1, 4}, 160),
                                 file_member("boxes.npy", npy("<f4", "(11, 4)", raw(eleven))));
  EXPECT_NE(e.find("11 items"), std::string::npos) << e;
  EXPECT_NE(e.find("max_bytes"), std::string::npos) << e;
  // A JSON list of boxes (a manifest cell) is the same field.
  Written w = write("boxes", Field::array("boxes", c10::kFloat, {-1, 4}),
                    json_member("boxes", "[1, 2, 3, 4, 5.5, 6, 7, 8]"));
  RaggedRow r(w.row.data());
  ASSERT_EQ(r.count(), 2);
  float fifth = 0;
  std::memcpy(&fifth, r.items() + 16, 4);
  EXPECT_EQ(fifth, 5.5f);
  EXPECT_NE(error_of("boxes", Field::array("boxes", c10::kFloat, {-1, 4}),
                     json_member("boxes", "[1, 2, 3]"))
                .find("whole number of items"),
            std::string::npos);
}

TEST(ArrayFields, MultiHotFromIndicesAndDenseLists) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> classes;
    std::vector<float> expected(20, 0.0f);
    std::string list = "[";
    for (size_t k = rng() % 6; k > 0; --k) {
      const int c = static_cast<int>(rng() % 20);
      list += (list.size() > 1 ? ", " : "") + std::to_string(c);
      expected[static_cast<size_t>(c)] = 1.0f;
    }
    list += "]";
    Written w = write("labels", Field::multi_hot_array("labels", 20), json_member("labels", list));
    EXPECT_EQ(std::memcmp(w.row.data(), expected.data(), 80), 0) << list;
  }
  EXPECT_NE(error_of("labels", Field::multi_hot_array("labels", 20), json_member("labels", "[20]"))
                .find("not a class index"),
            std::string::npos);
  // Without multi_hot, a dense list of the shape's length is the array itself.
  Written w =
      write("labels", Field::array("labels", c10::kFloat, {3}), json_member("labels", "[0, 1, 1]"));
  const std::vector<float> dense = {0, 1, 1};
  EXPECT_EQ(std::memcmp(w.row.data(), dense.data(), 12), 0);
  EXPECT_NE(error_of("labels", Field::array("labels", c10::kByte, {3}),
                     json_member("labels", "[0, 1, 300]"))
                .find("not a"),
            std::string::npos);
}

}  // namespace
}  // namespace conveyor
