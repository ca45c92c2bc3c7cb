// The reader kind of FieldSource (sample_kind.h): a MemberReader's samples (the user's own
// storage: a C++ store, a Python dataset's __getitem__), and the MemberList it fills. Each worker
// has its own MemberList; the fields read its members as they read a shard's.
#include <cctype>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/fields.h"
#include "conveyor/internal/printable.h"
#include "sources/sample_kind.h"

namespace conveyor {

namespace {

constexpr size_t kMaxNameBytes = 255;
constexpr size_t kArrayAlignment = 16;  // an array's bytes start aligned for any dtype

}  // namespace

// ---------------------------------------------------------------------------------------------
// MemberList

void MemberList::Contents::begin(detail::SampleMembers& members) {
  out = &members;
  members.buffer.clear();
  members.names.clear();
  members.members.clear();
  added.clear();
  shapes.clear();
}

void MemberList::Contents::finish() {
  detail::SampleMembers& m = *out;
  m.members.clear();
  for (const Added& a : added) {
    detail::Member member;
    member.name = std::string_view(m.names).substr(a.name_begin, a.name_size);
    member.encoding = a.encoding;
    member.data = a.size > 0 ? m.buffer.data() + a.data_begin : nullptr;
    member.size = a.size;
    member.integer = a.integer;
    member.floating = a.floating;
    member.dtype = a.dtype;
    member.shape = a.ndim > 0 ? shapes.data() + a.shape_begin : nullptr;
    member.ndim = a.ndim;
    m.members.push_back(member);
  }
}

MemberList::MemberList() : contents_(std::make_unique<Contents>()) {}
MemberList::~MemberList() = default;

namespace {

// Adds `name`, lower-cased (a field's keys are), to the names; returns the Added for it.
MemberList::Contents::Added& add_member(MemberList::Contents& c, std::string_view name,
                                        detail::MemberEncoding encoding) {
  if (c.out == nullptr) throw std::logic_error("conveyor: a MemberList used outside read()");
  if (name.empty() || name.size() > kMaxNameBytes) {
    throw std::invalid_argument("member \"" + detail::printable(name) +
                                "\": a member's name is 1 to " + std::to_string(kMaxNameBytes) +
                                " bytes, not " + std::to_string(name.size()));
  }
  MemberList::Contents::Added a;
  a.name_begin = c.out->names.size();
  a.name_size = name.size();
  a.encoding = encoding;
  for (char ch : name) {
    c.out->names.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  }
  c.added.push_back(a);
  return c.added.back();
}

}  // namespace

void MemberList::add_bytes(std::string_view name, const void* data, size_t size) {
  Contents& c = *contents_;
  Contents::Added& a = add_member(c, name, detail::MemberEncoding::kFile);
  a.data_begin = c.out->buffer.size();
  a.size = size;
  if (size > 0) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    c.out->buffer.insert(c.out->buffer.end(), bytes, bytes + size);
  }
}

void MemberList::add_integer(std::string_view name, int64_t value) {
  add_member(*contents_, name, detail::MemberEncoding::kInteger).integer = value;
}

void MemberList::add_floating(std::string_view name, double value) {
  add_member(*contents_, name, detail::MemberEncoding::kFloating).floating = value;
}

std::byte* MemberList::add_array(std::string_view name, c10::ScalarType dtype,
                                 c10::IntArrayRef shape) {
  Contents& c = *contents_;
  const auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("member \"" + detail::printable(name) + "\": " + why);
  };
  if (shape.size() > kMaxArrayDims) {
    refuse("an array of " + std::to_string(shape.size()) + " dimensions (at most " +
           std::to_string(kMaxArrayDims) + ")");
  }
  size_t bytes = c10::elementSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) refuse("an array with the negative dimension " + std::to_string(d));
    const auto n = static_cast<size_t>(d);
    if (n != 0 && bytes > std::numeric_limits<size_t>::max() / n) {
      refuse("an array whose size overflows");
    }
    bytes *= n;
  }
  Contents::Added& a = add_member(c, name, detail::MemberEncoding::kArray);
  a.dtype = dtype;
  a.shape_begin = c.shapes.size();
  a.ndim = shape.size();
  c.shapes.insert(c.shapes.end(), shape.begin(), shape.end());
  std::vector<uint8_t>& buffer = c.out->buffer;
  const size_t begin = (buffer.size() + kArrayAlignment - 1) / kArrayAlignment * kArrayAlignment;
  buffer.resize(begin + bytes);
  a.data_begin = begin;
  a.size = bytes;
  return reinterpret_cast<std::byte*>(buffer.data() + begin);
}

void MemberList::clear() {
  if (contents_->out != nullptr) contents_->begin(*contents_->out);
}

size_t MemberList::size() const { return contents_->added.size(); }

std::string MemberReader::describe(size_t index) const { return "sample " + std::to_string(index); }

// ---------------------------------------------------------------------------------------------
// The kind

namespace {

class ReaderKind final : public FieldSource::Kind {
 public:
  explicit ReaderKind(std::shared_ptr<MemberReader> reader)
      : Kind({}, {}), reader_(std::move(reader)) {}

  size_t size() const override { return reader_->size(); }

  void prepare(size_t workers) override {
    while (lists_.size() < workers) lists_.push_back(std::make_unique<MemberList>());
    reader_->prepare(workers);
  }

  void read(const SampleContext& ctx, detail::SampleMembers& out) override {
    MemberList& list = *lists_.at(ctx.worker);
    MemberList::Contents& contents = list.contents();
    contents.begin(out);
    reader_->read(ctx, list);
    contents.finish();
  }

  std::string describe(size_t index) const override { return reader_->describe(index); }

 private:
  std::shared_ptr<MemberReader> reader_;
  std::vector<std::unique_ptr<MemberList>> lists_;  // per worker
};

}  // namespace

std::unique_ptr<FieldSource> FieldSource::from_reader(std::shared_ptr<MemberReader> reader,
                                                      Fields fields) {
  if (!reader) throw std::invalid_argument("FieldSource::from_reader: the reader is null");
  return std::unique_ptr<FieldSource>(
      new FieldSource(std::make_unique<ReaderKind>(std::move(reader)), std::move(fields)));
}

}  // namespace conveyor
