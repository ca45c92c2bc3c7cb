// The user's own storage (conveyor/fields.h, issue 36): a MemberReader gives each sample's
// members and FieldSource::from_reader makes the fields of them. Every value comes back as the
// reader gave it, an image equals the same file read by ImageSource, the batches are the same
// for any number of workers and after a resume, a member a field cannot read is the sample's
// error naming the field and what the member is, and LoadingInterrupted stops the loader even
// under skip. MemberList's members are checked against a plain copy on many random samples.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "conveyor/fields.h"
#include "conveyor/loader.h"
#include "expect_sample_error.h"
#include "sources/sample_kind.h"
#include "test_support.h"

namespace conveyor {
namespace {

using testing::expect_sample_error;

// What sample i holds: a deterministic function of i.
struct Truth {
  std::vector<uint8_t> jpeg;
  int64_t cls = 0;
  double score = 0;
  std::string caption;
  std::vector<float> boxes;        // N x 4
  std::vector<int16_t> embedding;  // 6
};

std::vector<Truth> make_truth(size_t n) {
  std::vector<Truth> out(n);
  std::mt19937 rng(11);
  for (size_t i = 0; i < n; ++i) {
    Truth& t = out[i];
    t.jpeg = make_photo_jpeg(24 + static_cast<int>(i % 9), 20 + static_cast<int>(i % 5), i + 1);
    t.cls = static_cast<int64_t>(rng() % 1000) - 500;
    t.score = static_cast<double>(rng() % 10000) / 64.0;
    t.caption = "sample " + std::to_string(i) + std::string(rng() % 30, 'z');
    for (size_t b = rng() % 4; b > 0; --b) {
      for (int k = 0; k < 4; ++k) t.boxes.push_back(static_cast<float>(rng() % 4096) / 8.0f);
    }
    for (int k = 0; k < 6; ++k) t.embedding.push_back(static_cast<int16_t>(rng() % 60000 - 30000));
  }
  return out;
}

// A reader of `truth`, as user code would write one. `fail_at` throws a runtime_error there;
// `interrupt_at` throws LoadingInterrupted.
class TruthReader final : public MemberReader {
 public:
  explicit TruthReader(const std::vector<Truth>& truth) : truth_(truth) {}
  size_t size() const override { return truth_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    if (ctx.index == fail_at)
      throw std::runtime_error("the store has no row " + std::to_string(ctx.index));
    if (ctx.index == interrupt_at) throw LoadingInterrupted("KeyboardInterrupt in the reader");
    const Truth& t = truth_.at(ctx.index);
    out.add_bytes("JPG", t.jpeg.data(), t.jpeg.size());  // names match keys without case
    out.add_integer("cls", t.cls);
    out.add_floating("score", t.score);
    out.add_bytes("txt", t.caption.data(), t.caption.size());
    const int64_t n = static_cast<int64_t>(t.boxes.size() / 4);
    std::byte* boxes = out.add_array("boxes", c10::kFloat, {n, 4});
    if (!t.boxes.empty()) std::memcpy(boxes, t.boxes.data(), t.boxes.size() * sizeof(float));
    std::byte* emb = out.add_array("emb", c10::kShort, {6});
    std::memcpy(emb, t.embedding.data(), t.embedding.size() * sizeof(int16_t));
    if (wrong) out.add_floating("wrong", 0.5);
  }
  std::string describe(size_t index) const override { return "row " + std::to_string(index); }

  size_t fail_at = SIZE_MAX;
  size_t interrupt_at = SIZE_MAX;
  bool wrong = false;

 private:
  const std::vector<Truth>& truth_;
};

Fields reader_fields() {
  return {{"image", Field::image("jpg", ImageTransform::train(16))},
          {"label", Field::integer("cls")},
          {"score", Field::floating("score")},
          {"caption", Field::text("txt", 256)},
          {"boxes", Field::array("boxes", c10::kFloat, {-1, 4}, 16 * 4 * 4)},
          {"emb", Field::array("emb", c10::kShort, {6})}};
}

LoaderOptions options_for(size_t workers) {
  LoaderOptions o;
  o.batch_size = 5;
  o.workers = workers;
  o.seed = 7;
  return o;
}

std::string text_of(const Batch& batch, const std::string& name, size_t row) {
  const at::Tensor offsets = batch.field_offsets(name);
  const int64_t b = offsets[static_cast<int64_t>(row)].item<int64_t>();
  const int64_t e = offsets[static_cast<int64_t>(row) + 1].item<int64_t>();
  const at::Tensor bytes = batch.field(name).slice(0, b, e).contiguous();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(e - b));
}

void expect_rows_match(const Batch& batch, const std::vector<Truth>& truth) {
  for (size_t r = 0; r < batch.size(); ++r) {
    const size_t i = batch.indices[r];
    const Truth& t = truth.at(i);
    const auto row = static_cast<int64_t>(r);
    EXPECT_EQ(batch.field("label")[row].item<int64_t>(), t.cls) << i;
    EXPECT_EQ(batch.field("score")[row].item<float>(), static_cast<float>(t.score)) << i;
    EXPECT_EQ(text_of(batch, "caption", r), t.caption) << i;
    const at::Tensor offsets = batch.field_offsets("boxes");
    const int64_t b = offsets[row].item<int64_t>();
    const int64_t e = offsets[row + 1].item<int64_t>();
    ASSERT_EQ(static_cast<size_t>(e - b) * 4, t.boxes.size()) << i;
    const at::Tensor boxes = batch.field("boxes").slice(0, b, e).contiguous();
    EXPECT_EQ(std::memcmp(boxes.data_ptr<float>(), t.boxes.data(), t.boxes.size() * 4), 0) << i;
    const at::Tensor emb = batch.field("emb")[row].contiguous();
    EXPECT_EQ(std::memcmp(emb.data_ptr<int16_t>(), t.embedding.data(), 12), 0) << i;
  }
}

using Read = std::vector<std::pair<std::vector<size_t>, std::vector<at::Tensor>>>;

Read read_all(DataLoader& loader, const std::vector<Truth>& truth) {
  Read out;
  for (Batch& batch : loader) {
    expect_rows_match(batch, truth);
    std::vector<at::Tensor> tensors;
    for (size_t f = 0; f < batch.fields.size(); ++f) {
      tensors.push_back(batch.fields[f].clone());
      if (batch.offsets[f].defined()) tensors.push_back(batch.offsets[f].clone());
    }
    out.emplace_back(batch.indices, std::move(tensors));
  }
  return out;
}

void expect_same(const Read& a, const Read& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first) << "batch " << i;
    ASSERT_EQ(a[i].second.size(), b[i].second.size());
    for (size_t t = 0; t < a[i].second.size(); ++t) {
      EXPECT_TRUE(at::equal(a[i].second[t], b[i].second[t])) << "batch " << i << " tensor " << t;
    }
  }
}

std::unique_ptr<FieldSource> source_of(const std::vector<Truth>& truth,
                                       std::shared_ptr<TruthReader>* reader = nullptr) {
  auto made = std::make_shared<TruthReader>(truth);
  if (reader) *reader = made;
  return FieldSource::from_reader(made, reader_fields());
}

TEST(ReaderFields, EveryValueAsTheReaderGaveItOnceEachSameForAnyWorkers) {
  const std::vector<Truth> truth = make_truth(37);
  Read one, four;
  {
    DataLoader loader(source_of(truth), options_for(1), RandomSampler::make(5));
    one = read_all(loader, truth);
  }
  {
    DataLoader loader(source_of(truth), options_for(4), RandomSampler::make(5));
    four = read_all(loader, truth);
  }
  std::multiset<size_t> seen;
  for (const auto& b : one) seen.insert(b.first.begin(), b.first.end());
  EXPECT_EQ(seen.size(), truth.size());
  EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), truth.size());
  expect_same(one, four);
}

TEST(ReaderFields, AnImageIsTheSamePixelsAsTheSameFileFromImageSource) {
  const std::vector<Truth> truth = make_truth(23);
  std::vector<std::vector<uint8_t>> jpegs;
  std::vector<int64_t> labels;
  for (const Truth& t : truth) {
    jpegs.push_back(t.jpeg);
    labels.push_back(t.cls);
  }
  DataLoader mine(source_of(truth), options_for(2));
  DataLoader reference(ImageSource::in_memory(jpegs, labels, ImageTransform::train(16)),
                       options_for(3));
  auto a = mine.begin();
  auto b = reference.begin();
  size_t batches = 0;
  for (; a != mine.end() && b != reference.end(); ++a, ++b, ++batches) {
    ASSERT_EQ(a->indices, b->indices);
    EXPECT_TRUE(at::equal(a->field("image"), b->field("image"))) << "batch " << batches;
    EXPECT_TRUE(at::equal(a->field("label"), b->field("label"))) << "batch " << batches;
  }
  EXPECT_EQ(batches, (truth.size() + 4) / 5);
}

TEST(ReaderFields, ResumesBitExactly) {
  const std::vector<Truth> truth = make_truth(31);
  Read whole;
  {
    DataLoader loader(source_of(truth), options_for(2), RandomSampler::make(8));
    whole = read_all(loader, truth);
  }
  LoaderState state;
  {
    DataLoader loader(source_of(truth), options_for(2), RandomSampler::make(8));
    auto it = loader.begin();
    ++it;
    ++it;  // 3 batches received
    state = LoaderState::parse(loader.state().serialize());
  }
  DataLoader resumed(source_of(truth), options_for(3), RandomSampler::make(8));
  resumed.load_state(state);
  const Read rest = read_all(resumed, truth);
  expect_same(Read(whole.begin() + 3, whole.end()), rest);
}

std::string first_error(Fields fields, const std::vector<Truth>& truth, bool wrong = false) {
  auto reader = std::make_shared<TruthReader>(truth);
  reader->wrong = wrong;
  DataLoader loader(FieldSource::from_reader(reader, std::move(fields)), options_for(2));
  try {
    for (Batch& batch : loader) (void)batch;
  } catch (const SampleError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ReaderFields, AMemberTheFieldCannotReadIsTheSamplesErrorSayingWhatItIs) {
  const std::vector<Truth> truth = make_truth(4);
  // An integer field given a float: refused, not rounded.
  std::string what = first_error({{"w", Field::integer("wrong")}}, truth, true);
  EXPECT_NE(what.find("field \"w\": member \"wrong\" is the number 0.5, not an integer"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("row 0"), std::string::npos) << what;
  // An image field given an array (decoded pixels belong to an array field).
  what = first_error({{"image", Field::image("boxes", ImageTransform::train(16))}}, truth);
  EXPECT_NE(what.find(", not an image file (decoded pixels are an array field's)"),
            std::string::npos)
      << what;
  // An array of another dtype or shape.
  what = first_error({{"emb", Field::array("emb", c10::kFloat, {6})}}, truth);
  EXPECT_NE(what.find("holds Short, not the declared Float"), std::string::npos) << what;
  what = first_error({{"emb", Field::array("emb", c10::kShort, {3, 2})}}, truth);
  EXPECT_NE(what.find("has shape [6], not the declared [3, 2]"), std::string::npos) << what;
  // A text field given an array; a field whose member the reader never gave.
  what = first_error({{"t", Field::text("emb")}}, truth);
  EXPECT_NE(what.find("is an array of Short [6], not text"), std::string::npos) << what;
  what = first_error({{"t", Field::text("missing")}}, truth);
  EXPECT_NE(what.find("the sample has no \"missing\" member"), std::string::npos) << what;
  // A floating field takes an integer; a text field a number's shortest text.
  auto reader = std::make_shared<TruthReader>(truth);
  reader->wrong = true;
  DataLoader loader(FieldSource::from_reader(
                        reader, {{"f", Field::floating("cls")}, {"t", Field::text("wrong")}}),
                    options_for(1));
  for (Batch& batch : loader) {
    for (size_t r = 0; r < batch.size(); ++r) {
      EXPECT_EQ(batch.field("f")[static_cast<int64_t>(r)].item<float>(),
                static_cast<float>(truth[batch.indices[r]].cls));
      EXPECT_EQ(text_of(batch, "t", r), "0.5");
    }
  }
}

TEST(ReaderFields, AReaderErrorIsRaisedNamingTheRowOrSkippedButAnInterruptIsNeverSkipped) {
  const std::vector<Truth> truth = make_truth(12);
  {
    std::shared_ptr<TruthReader> reader;
    DataLoader loader(source_of(truth, &reader), options_for(2));
    reader->fail_at = 6;
    expect_sample_error(loader, 6, {"row 6", "the store has no row 6"});
  }
  LoaderOptions skip = options_for(2);
  skip.on_error = ErrorPolicy::kSkip;
  {
    std::shared_ptr<TruthReader> reader;
    DataLoader loader(source_of(truth, &reader), skip);
    reader->fail_at = 6;
    size_t rows = 0;
    for (Batch& batch : loader) {
      for (size_t i : batch.indices) EXPECT_NE(i, 6u);
      rows += batch.size();
    }
    EXPECT_EQ(rows, truth.size());
    EXPECT_EQ(loader.stats().skipped, 1u);
  }
  std::shared_ptr<TruthReader> reader;
  DataLoader loader(source_of(truth, &reader), skip);
  reader->interrupt_at = 8;
  try {
    for (Batch& batch : loader) (void)batch;
    FAIL() << "the interrupt was skipped";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), 8u);
    EXPECT_THROW(e.rethrow_original(), LoadingInterrupted);
  }
  EXPECT_EQ(loader.stats().skipped, 0u);
}

TEST(ReaderFields, MemberListRefusesNamesAndShapesOutOfBounds) {
  detail::SampleMembers members;
  MemberList list;
  list.contents().begin(members);
  EXPECT_THROW(list.add_integer("", 1), std::invalid_argument);
  EXPECT_THROW(list.add_integer(std::string(256, 'n'), 1), std::invalid_argument);
  EXPECT_THROW(list.add_array("a", c10::kFloat, {3, -1}), std::invalid_argument);
  EXPECT_THROW(list.add_array("a", c10::kFloat, std::vector<int64_t>(65, 1)),
               std::invalid_argument);
  EXPECT_THROW(list.add_array("a", c10::kDouble, {int64_t{1} << 40, int64_t{1} << 40}),
               std::invalid_argument);
  EXPECT_EQ(list.size(), 0u);
}

// MemberList keeps offsets while its buffers grow and makes Members of them at the end: on many
// random samples, every member reads back as a plain copy of what was added.
TEST(ReaderFields, MemberListMembersEqualAPlainCopyOnRandomSamples) {
  struct Plain {
    std::string name;
    detail::MemberEncoding encoding;
    std::vector<uint8_t> bytes;
    int64_t integer = 0;
    double floating = 0;
    std::vector<int64_t> shape;
  };
  std::mt19937 rng(3);
  detail::SampleMembers members;  // reused, as a worker's
  MemberList list;
  for (int sample = 0; sample < 2000; ++sample) {
    list.contents().begin(members);
    std::vector<Plain> plain;
    for (size_t m = rng() % 9; m > 0; --m) {
      Plain p;
      p.name = "M" + std::to_string(rng() % 1000);
      switch (rng() % 4) {
        case 0: {
          p.encoding = detail::MemberEncoding::kFile;
          p.bytes.resize(rng() % 3000);
          for (uint8_t& b : p.bytes) b = static_cast<uint8_t>(rng());
          list.add_bytes(p.name, p.bytes.data(), p.bytes.size());
          break;
        }
        case 1:
          p.encoding = detail::MemberEncoding::kInteger;
          p.integer = static_cast<int64_t>(rng()) * 7919 - 12345;
          list.add_integer(p.name, p.integer);
          break;
        case 2:
          p.encoding = detail::MemberEncoding::kFloating;
          p.floating = static_cast<double>(rng()) / 3.0;
          list.add_floating(p.name, p.floating);
          break;
        default: {
          p.encoding = detail::MemberEncoding::kArray;
          for (size_t d = rng() % 4; d > 0; --d) p.shape.push_back(rng() % 7);
          size_t n = sizeof(int32_t);
          for (int64_t d : p.shape) n *= static_cast<size_t>(d);
          p.bytes.resize(n);
          for (uint8_t& b : p.bytes) b = static_cast<uint8_t>(rng());
          std::byte* to = list.add_array(p.name, c10::kInt, p.shape);
          if (n > 0) std::memcpy(to, p.bytes.data(), n);
        }
      }
      plain.push_back(std::move(p));
    }
    list.contents().finish();
    ASSERT_EQ(members.members.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      const detail::Member& got = members.members[i];
      const Plain& want = plain[i];
      std::string lower = want.name;
      lower[0] = 'm';
      ASSERT_EQ(got.name, lower);
      ASSERT_EQ(got.encoding, want.encoding);
      switch (want.encoding) {
        case detail::MemberEncoding::kInteger:
          ASSERT_EQ(got.integer, want.integer);
          break;
        case detail::MemberEncoding::kFloating:
          ASSERT_EQ(got.floating, want.floating);
          break;
        default:
          ASSERT_EQ(got.size, want.bytes.size());
          if (!want.bytes.empty()) {
            ASSERT_EQ(std::memcmp(got.data, want.bytes.data(), got.size), 0) << sample;
          }
          if (want.encoding == detail::MemberEncoding::kArray) {
            ASSERT_EQ(std::vector<int64_t>(got.shape, got.shape + got.ndim), want.shape);
            ASSERT_EQ(got.dtype, c10::kInt);
            ASSERT_EQ(reinterpret_cast<uintptr_t>(got.data) % 16, 0u);
          }
      }
    }
  }
}

}  // namespace
}  // namespace conveyor
