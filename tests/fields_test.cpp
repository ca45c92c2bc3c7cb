// Named fields through the loader (conveyor/fields.h, issue 31): manifests and WebDataset shards
// with captions, JSON, multi-hot targets, stored arrays and boxes. Every value comes back as it was
// written, every sample once, the same batches for 1 and 4 workers and after a resume; a missing
// field and a field over its bound are raised or skipped as stated.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "conveyor/fields.h"
#include "conveyor/loader.h"
#include "expect_sample_error.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::expect_sample_error;
using testing::TempDir;
using testing::write_bytes;

// What one sample of a generated dataset holds.
struct Truth {
  std::string caption;
  std::string meta;          // JSON text
  std::vector<int> labels;   // multi-label classes
  std::vector<float> boxes;  // N x 4
  int64_t cls = 0;
};

constexpr int kClasses = 12;

std::vector<Truth> make_truth(size_t n, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<Truth> out(n);
  for (size_t i = 0; i < n; ++i) {
    Truth& t = out[i];
    t.caption = "caption " + std::to_string(i) + std::string(rng() % 40, 'x') + " \xc3\xa9";
    t.meta = "{\"i\": " + std::to_string(i) +
             ", \"tags\": [\"a\", \"b\"], \"w\": " + std::to_string(rng() % 1000) + "}";
    for (int c = 0; c < kClasses; ++c) {
      if (rng() % 4 == 0) t.labels.push_back(c);
    }
    for (size_t b = rng() % 5; b > 0; --b) {
      for (int k = 0; k < 4; ++k) t.boxes.push_back(static_cast<float>(rng() % 512) / 4.0f);
    }
    t.cls = static_cast<int64_t>(rng() % 100);
  }
  return out;
}

std::string json_list(const std::vector<float>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v[i]));
    s += (i ? ", " : "") + std::string(buf);
  }
  return s + "]";
}

std::string json_ints(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// A JSON string literal of UTF-8 `text` (quotes and backslashes escaped).
std::string quoted(const std::string& text) {
  std::string s = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') s += '\\';
    s += c;
  }
  return s + "\"";
}

// A JSON Lines manifest of `truth` beside images img/N.jpg.
fs::path write_jsonl(const fs::path& dir, const std::vector<Truth>& truth,
                     std::optional<size_t> without_caption = std::nullopt) {
  fs::create_directories(dir / "img");
  std::ofstream out(dir / "train.jsonl");
  for (size_t i = 0; i < truth.size(); ++i) {
    write_bytes(dir / "img" / (std::to_string(i) + ".jpg"),
                make_photo_jpeg(40 + static_cast<int>(i % 7), 32, i + 1));
    out << "{\"path\": \"img/" << i << ".jpg\"";
    if (without_caption != i) out << ", \"caption\": " << quoted(truth[i].caption);
    out << ", \"meta\": " << truth[i].meta << ", \"labels\": " << json_ints(truth[i].labels)
        << ", \"boxes\": " << json_list(truth[i].boxes) << ", \"cls\": " << truth[i].cls << "}\n";
  }
  return dir / "train.jsonl";
}

Fields manifest_fields() {
  return {{"image", Field::image("path", ImageTransform::train(16))},
          {"caption", Field::text("caption", 256)},
          {"meta", Field::json("meta", 1024)},
          {"labels", Field::multi_hot_array("labels", kClasses)},
          {"boxes", Field::array("boxes", c10::kFloat, {-1, 4}, 16 * 8)},
          {"cls", Field::integer("cls")}};
}

std::string text_of(const Batch& batch, const std::string& name, size_t row) {
  const at::Tensor& values = batch.field(name);
  const at::Tensor offsets = batch.field_offsets(name).to(at::kCPU);
  const int64_t begin = offsets[static_cast<int64_t>(row)].item<int64_t>();
  const int64_t end = offsets[static_cast<int64_t>(row) + 1].item<int64_t>();
  const at::Tensor bytes = values.slice(0, begin, end).contiguous().to(at::kCPU);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(end - begin));
}

// Checks every row of `batch` against `truth`; returns the indices seen.
void expect_rows_match(const Batch& batch, const std::vector<Truth>& truth) {
  const at::Tensor boxes = batch.field("boxes");
  const at::Tensor box_offsets = batch.field_offsets("boxes");
  for (size_t r = 0; r < batch.size(); ++r) {
    const Truth& t = truth.at(batch.indices[r]);
    EXPECT_EQ(text_of(batch, "caption", r), t.caption) << batch.indices[r];
    EXPECT_EQ(text_of(batch, "meta", r), t.meta) << batch.indices[r];
    EXPECT_EQ(batch.field("cls")[static_cast<int64_t>(r)].item<int64_t>(), t.cls);
    const at::Tensor hot = batch.field("labels")[static_cast<int64_t>(r)];
    for (int c = 0; c < kClasses; ++c) {
      const bool on = std::find(t.labels.begin(), t.labels.end(), c) != t.labels.end();
      EXPECT_EQ(hot[c].item<float>(), on ? 1.0f : 0.0f) << batch.indices[r] << " class " << c;
    }
    const int64_t b0 = box_offsets[static_cast<int64_t>(r)].item<int64_t>();
    const int64_t b1 = box_offsets[static_cast<int64_t>(r) + 1].item<int64_t>();
    ASSERT_EQ(static_cast<size_t>(b1 - b0) * 4, t.boxes.size()) << batch.indices[r];
    const at::Tensor mine = boxes.slice(0, b0, b1).contiguous();
    EXPECT_EQ(std::memcmp(mine.data_ptr<float>(), t.boxes.data(), t.boxes.size() * 4), 0);
  }
}

struct Read {
  std::vector<std::vector<size_t>> indices;
  std::vector<std::map<std::string, at::Tensor>> tensors;  // clones, offsets as "NAME.offsets"
};

Read read_all(DataLoader& loader, const std::vector<Truth>& truth) {
  Read out;
  for (Batch& batch : loader) {
    expect_rows_match(batch, truth);
    out.indices.push_back(batch.indices);
    std::map<std::string, at::Tensor> t;
    for (size_t f = 0; f < batch.names.size(); ++f) {
      t[batch.names[f]] = batch.fields[f].clone();
      if (batch.offsets.size() > f && batch.offsets[f].defined()) {
        t[batch.names[f] + ".offsets"] = batch.offsets[f].clone();
      }
    }
    out.tensors.push_back(std::move(t));
  }
  return out;
}

void expect_same(const Read& a, const Read& b) {
  ASSERT_EQ(a.indices, b.indices);
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    ASSERT_EQ(a.tensors[i].size(), b.tensors[i].size());
    for (const auto& [name, tensor] : a.tensors[i]) {
      EXPECT_TRUE(at::equal(tensor, b.tensors[i].at(name))) << "batch " << i << " " << name;
    }
  }
}

LoaderOptions options_for(size_t workers) {
  LoaderOptions o;
  o.batch_size = 6;
  o.workers = workers;
  o.seed = 3;
  return o;
}

TEST(ManifestFields, JsonLinesReadAsWrittenOnceEachSameForAnyWorkers) {
  TempDir dir;
  const std::vector<Truth> truth = make_truth(40, 1);
  const fs::path manifest = write_jsonl(dir.path(), truth);
  Read one, four;
  {
    DataLoader loader(FieldSource::manifest(manifest, manifest_fields()), options_for(1),
                      RandomSampler::make(9));
    one = read_all(loader, truth);
  }
  {
    DataLoader loader(FieldSource::manifest(manifest, manifest_fields()), options_for(4),
                      RandomSampler::make(9));
    four = read_all(loader, truth);
  }
  std::multiset<size_t> seen;
  for (const auto& b : one.indices) seen.insert(b.begin(), b.end());
  EXPECT_EQ(seen.size(), truth.size());
  EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), truth.size());
  expect_same(one, four);
}

TEST(ManifestFields, ResumesBitExactly) {
  TempDir dir;
  const std::vector<Truth> truth = make_truth(30, 2);
  const fs::path manifest = write_jsonl(dir.path(), truth);
  Read whole;
  {
    DataLoader loader(FieldSource::manifest(manifest, manifest_fields()), options_for(2),
                      RandomSampler::make(4));
    whole = read_all(loader, truth);
  }
  LoaderState state;
  {
    DataLoader loader(FieldSource::manifest(manifest, manifest_fields()), options_for(2),
                      RandomSampler::make(4));
    auto it = loader.begin();
    ++it;  // 2 batches received
    state = LoaderState::parse(loader.state().serialize());
  }
  DataLoader resumed(FieldSource::manifest(manifest, manifest_fields()), options_for(3),
                     RandomSampler::make(4));
  resumed.load_state(state);
  Read rest = read_all(resumed, truth);
  Read expected;
  expected.indices.assign(whole.indices.begin() + 2, whole.indices.end());
  expected.tensors.assign(whole.tensors.begin() + 2, whole.tensors.end());
  expect_same(expected, rest);
}

TEST(ManifestFields, CsvWithAMultiHotColumn) {
  TempDir dir;
  fs::create_directories(dir.path() / "img");
  std::ofstream out(dir.path() / "train.csv");
  out << "file,labels,caption\r\n";
  for (int i = 0; i < 9; ++i) {
    write_bytes(dir.path() / "img" / (std::to_string(i) + ".jpg"), make_photo_jpeg(30, 30, 7));
    out << "img/" << i << ".jpg,\"[" << i % kClasses << ", " << (i + 3) % kClasses
        << "]\",\"a, \"\"quoted\"\" caption " << i << "\"\r\n";
  }
  out.close();
  Fields fields = {{"image", Field::image("file", ImageTransform::eval(16, 18))},
                   {"labels", Field::multi_hot_array("labels", kClasses)},
                   {"caption", Field::text("caption")}};
  DataLoader loader(FieldSource::manifest(dir.path() / "train.csv", fields), options_for(2));
  size_t rows = 0;
  for (Batch& batch : loader) {
    for (size_t r = 0; r < batch.size(); ++r) {
      const int i = static_cast<int>(batch.indices[r]);
      EXPECT_EQ(text_of(batch, "caption", r), "a, \"quoted\" caption " + std::to_string(i));
      const at::Tensor hot = batch.field("labels")[static_cast<int64_t>(r)];
      EXPECT_EQ(hot.sum().item<float>(), 2.0f);
      EXPECT_EQ(hot[i % kClasses].item<float>(), 1.0f);
      ++rows;
    }
  }
  EXPECT_EQ(rows, 9u);
}

TEST(ManifestFields, AMissingFieldIsRaisedNamingTheRowAndFieldOrSkipped) {
  TempDir dir;
  const std::vector<Truth> truth = make_truth(12, 3);
  const fs::path manifest = write_jsonl(dir.path(), truth, /*without_caption=*/7);
  {
    DataLoader loader(FieldSource::manifest(manifest, manifest_fields()), options_for(2));
    expect_sample_error(loader, 7, {"line 8", "field \"caption\""});
  }
  LoaderOptions skip = options_for(2);
  skip.on_error = ErrorPolicy::kSkip;
  DataLoader loader(FieldSource::manifest(manifest, manifest_fields()), skip);
  size_t rows = 0;
  for (Batch& batch : loader) {
    for (size_t index : batch.indices) EXPECT_NE(index, 7u);
    rows += batch.size();
  }
  EXPECT_EQ(rows, 12u);  // a substitute in its place
  EXPECT_EQ(loader.stats().skipped, 1u);
}

TEST(ManifestFields, ARaggedFieldOverItsBoundIsTheSamplesError) {
  TempDir dir;
  std::vector<Truth> truth = make_truth(8, 4);
  truth[5].caption = std::string(300, 'y');  // the caption field holds 256 bytes
  const fs::path manifest = write_jsonl(dir.path(), truth);
  DataLoader loader(FieldSource::manifest(manifest, manifest_fields()), options_for(2));
  expect_sample_error(loader, 5, {"line 6", "field \"caption\"", "300 bytes", "max_bytes"});
}

TEST(ManifestFields, AFieldOfAColumnTheManifestLacksIsRefusedAtOnce) {
  TempDir dir;
  const fs::path manifest = write_jsonl(dir.path(), make_truth(3, 5));
  Fields fields = manifest_fields();
  fields.push_back({"depth", Field::array("depth", c10::kFloat, {4})});
  try {
    FieldSource::manifest(manifest, fields);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("field \"depth\""), std::string::npos) << e.what();
  }
}

// --- WebDataset shards written by webdataset.ShardWriter (tests/webdataset_members_write.py):
// seven CLIP-style samples (jpg, txt, json, cls, npy, boxes.npy), sample 3 without a cls and
// sample 5 without an npy.

Fields clip_fields() {
  return {{"image", Field::image("jpg;png;jpeg;webp", ImageTransform::train(16))},
          {"caption", Field::text("txt")},
          {"meta", Field::json("json")},
          {"label", Field::integer("cls")},
          {"soft", Field::array("npy", c10::kHalf, {10})},
          {"boxes", Field::array("boxes.npy", c10::kFloat, {-1, 4})}};
}

// The sample number in a meta's JSON text ({"i": N, ...}).
int sample_of(const std::string& meta) {
  const size_t at = meta.find("\"i\": ");
  return at == std::string::npos ? -1 : std::stoi(meta.substr(at + 5));
}

// Checks a batch of clip_fields() against what the writer wrote; returns the samples seen.
std::vector<int> expect_clip_rows(const Batch& batch) {
  std::vector<int> seen;
  const at::Tensor box_offsets = batch.field_offsets("boxes");
  for (size_t r = 0; r < batch.size(); ++r) {
    const int i = sample_of(text_of(batch, "meta", r));
    seen.push_back(i);
    EXPECT_EQ(text_of(batch, "caption", r), i == 2 ? ""
                                                   : "a caption for sample " + std::to_string(i) +
                                                         ", \xc3\xbc"
                                                         "n\xc3\xaf"
                                                         "code");
    EXPECT_EQ(batch.field("label")[static_cast<int64_t>(r)].item<int64_t>(), i % 3);
    const at::Tensor soft = batch.field("soft")[static_cast<int64_t>(r)].to(at::kFloat);
    EXPECT_TRUE(at::equal(soft, at::arange(10, at::kFloat) * i)) << i;
    const int64_t b0 = box_offsets[static_cast<int64_t>(r)].item<int64_t>();
    const int64_t b1 = box_offsets[static_cast<int64_t>(r) + 1].item<int64_t>();
    EXPECT_EQ(b1 - b0, i % 4) << i;
    const at::Tensor boxes = batch.field("boxes").slice(0, b0, b1);
    EXPECT_TRUE(at::equal(boxes, at::full({i % 4, 4}, static_cast<float>(i)))) << i;
  }
  return seen;
}

class ClipShards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    const std::string write = std::string(CONVEYOR_VENV_PYTHON) + " " + WEBDATASET_MEMBERS_WRITE +
                              " " + dir_->path().string();
    ASSERT_EQ(std::system(write.c_str()), 0) << write;
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::string pattern() { return (dir_->path() / "clip-{000000..000001}.tar").string(); }
  static void index() {
    const std::string command = std::string(CONVEYOR_PREPARE) + " --index-only " +
                                (dir_->path() / "clip-000000.tar").string() + " " +
                                (dir_->path() / "clip-000001.tar").string() +
                                " --force >/dev/null 2>&1";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static std::unique_ptr<TempDir> dir_;
};
std::unique_ptr<TempDir> ClipShards::dir_;

LoaderOptions skipping(size_t workers) {
  LoaderOptions o = options_for(workers);
  o.batch_size = 2;
  o.on_error = ErrorPolicy::kSkip;
  return o;
}

TEST_F(ClipShards, StreamedEveryFieldAsWrittenAndTheIncompleteSamplesSkipped) {
  ShardOptions streamed;
  streamed.streaming = true;
  streamed.shuffle_buffer = 3;
  DataLoader loader(FieldSource::tar_shards({pattern()}, clip_fields(), streamed), skipping(2));
  std::multiset<int> seen;
  for (Batch& batch : loader) {
    for (int i : expect_clip_rows(batch)) seen.insert(i);
  }
  EXPECT_EQ(loader.stats().skipped, 2u);  // 3 has no cls, 5 no npy: substitutes in their place
  EXPECT_EQ(seen.count(3) + seen.count(5), 0u);
  for (int i : {0, 1, 2, 4, 6}) EXPECT_GE(seen.count(i), 1u) << i;
}

TEST_F(ClipShards, IndexedAtRandomTheSameForAnyWorkersAndAMissingFieldRaised) {
  index();
  std::vector<std::vector<size_t>> orders;
  for (size_t workers : {1, 4}) {
    DataLoader loader(FieldSource::tar_shards({pattern()}, clip_fields()), skipping(workers),
                      RandomSampler::make(2));
    std::vector<size_t> order;
    std::set<int> seen;
    for (Batch& batch : loader) {
      for (int i : expect_clip_rows(batch)) seen.insert(i);
      order.insert(order.end(), batch.indices.begin(), batch.indices.end());
    }
    EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 4, 6}));
    EXPECT_EQ(loader.stats().skipped, 2u);
    orders.push_back(order);
  }
  EXPECT_EQ(orders[0], orders[1]);
  LoaderOptions raise = options_for(2);
  raise.batch_size = 7;
  DataLoader loader(FieldSource::tar_shards({pattern()}, clip_fields()), raise);
  expect_sample_error(loader, 3,
                      {"clip-000000.tar (sample sample003)", "field \"label\"", "\"cls\""});
}

}  // namespace
}  // namespace conveyor
