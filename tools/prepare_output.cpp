// conveyor-prepare's outputs (prepare_output.h).
#include "prepare_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "shards/names.h"

namespace conveyor::tools {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

std::string numbered(int64_t label) {
  char name[32];
  std::snprintf(name, sizeof name, "%06lld", static_cast<long long>(label));
  return name;
}

}  // namespace

AtomicFile::AtomicFile(std::string final_path)
    : final_(std::move(final_path)), temp_(final_ + ".tmp") {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_error(temp_, "cannot create");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error(temp_, "write failed");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) io_error(temp_, "close failed");
  if (::rename(temp_.c_str(), final_.c_str()) != 0) io_error(final_, "cannot rename into place");
  committed_ = true;
}

ShardWriter::ShardWriter(std::string dst, uint64_t shard_size, std::vector<std::string> classes,
                         std::function<void(const std::string&, size_t, uint64_t)> on_shard)
    : dst_(std::move(dst)), shard_size_(shard_size), on_shard_(std::move(on_shard)) {
  index_.classes = std::move(classes);
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::add(const std::string& key, const std::vector<uint8_t>& jpeg, int64_t label) {
  const std::string cls = std::to_string(label);
  add(key,
      {{"jpg", jpeg.data(), jpeg.size()},
       {"cls", reinterpret_cast<const uint8_t*>(cls.data()), cls.size()}},
      label, true);
}

void ShardWriter::add(const std::string& key, const std::vector<Member>& members, int64_t label,
                      bool has_label) {
  uint64_t entry = 0;
  for (const Member& m : members) entry += detail::TarWriter::member_bytes(m.size);
  if (tar_ && !index_.shards.back().samples.empty() &&
      tar_->written() + entry + detail::TarWriter::kEndBytes > shard_size_) {
    close_shard();
  }
  if (!tar_) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "-%06zu.tar", index_.shards.size());
    file_ = std::make_unique<AtomicFile>(dst_ + suffix);
    tar_ = std::make_unique<detail::TarWriter>(
        [file = file_.get()](const void* data, size_t size) { file->write(data, size); });
    index_.shards.push_back({fs::path(dst_ + suffix).filename().string(), 0, {}, {}});
  }
  for (const Member& m : members) {  // member names: each a path segment, before any is written
    detail::check_path_segment(key + "." + std::string(m.extension), "--format wds: sample key");
  }
  indexed_.clear();
  for (const Member& m : members) {
    const uint64_t offset = tar_->add(key + "." + std::string(m.extension), m.data, m.size);
    indexed_.push_back({index_.name_member(m.extension), offset, m.size});
  }
  detail::IndexedSample sample;
  sample.key = key;
  sample.label = has_label ? label : 0;
  sample.has_label = has_label;
  index_.add_sample(index_.shards.back(), std::move(sample), indexed_);
}

void ShardWriter::close_shard() {
  detail::IndexedShard& shard = index_.shards.back();
  shard.bytes = tar_->finish();
  tar_.reset();
  file_->commit();
  on_shard_(file_->path(), shard.samples.size(), shard.bytes);
  bytes_ += shard.bytes;
  file_.reset();
}

uint64_t ShardWriter::finish() {
  if (tar_) close_shard();
  AtomicFile file(dst_ + ".index.json");
  const std::string text = detail::write_index(index_);
  file.write(text.data(), text.size());
  file.commit();
  return bytes_;
}

FolderWriter::FolderWriter(const std::string& dst, std::vector<std::string> classes)
    : dst_(dst), classes_(std::move(classes)) {
  std::error_code ec;
  if (fs::exists(dst_, ec) && !fs::is_empty(dst_, ec)) {
    throw std::runtime_error(dst +
                             ": exists and is not empty (--format folder writes a new "
                             "ImageFolder)");
  }
  // Class names come from data (a shard index, perhaps downloaded): each one path segment under
  // DST, all checked before anything is created.
  for (const auto& c : classes_) (void)detail::path_under(dst_, c, "--format folder: class name");
  for (const auto& c : classes_) fs::create_directories(dst_ / c);
  fs::create_directories(dst_);
}

void FolderWriter::add(const std::string& key, const std::vector<uint8_t>& jpeg, int64_t label) {
  fs::path folder;
  if (classes_.empty()) {
    if (label < 0 || label >= 1'000'000) {
      throw std::runtime_error("--format folder: label " + std::to_string(label) +
                               " (without class names, labels 0..999999)");
    }
    folder = dst_ / numbered(label);
    if (label > max_label_) {
      fs::create_directories(folder);
      max_label_ = label;
    }
  } else {
    if (label < 0 || static_cast<size_t>(label) >= classes_.size()) {
      throw std::runtime_error("label " + std::to_string(label) + " outside the index's " +
                               std::to_string(classes_.size()) + " classes");
    }
    folder = detail::path_under(dst_, classes_[static_cast<size_t>(label)],
                                "--format folder: class name");
  }
  AtomicFile file(detail::path_under(folder, key + ".jpg", "--format folder: sample key").string());
  file.write(jpeg.data(), jpeg.size());
  file.commit();
  bytes_ += jpeg.size();
}

void FolderWriter::finish() const {
  for (int64_t l = 0; classes_.empty() && l < max_label_; ++l) {
    fs::create_directories(dst_ / numbered(l));
  }
}

std::vector<std::string> label_folders(const std::vector<ImageItem>& items) {
  int64_t max_label = 0;
  for (const auto& item : items) max_label = std::max(max_label, item.label);
  if (max_label >= 1'000'000) {
    throw std::runtime_error("--format folder: labels up to " + std::to_string(max_label) +
                             " would need that many class folders");
  }
  const size_t width = std::to_string(max_label).size();
  std::vector<std::string> names;
  for (int64_t l = 0; l <= max_label; ++l) {
    std::string s = std::to_string(l);
    names.push_back(std::string(width - s.size(), '0') + s);
  }
  return names;
}

}  // namespace conveyor::tools
