// The per-file index of the own entropy decoder's states (jpeg_entropy_index.h).
#include "codec/jpeg_entropy_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace conveyor::detail {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;

// What an entry costs beyond its FileIndex: the hash map's and the LRU list's nodes.
constexpr size_t kEntryOverhead = 96;

inline uint64_t load_64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint64_t rotate_left(uint64_t x, int r) { return x << r | x >> (64 - r); }

// xxHash64's round: four independent lanes keep the multiplier busy.
inline uint64_t lane_round(uint64_t lane, uint64_t input) {
  return rotate_left(lane + input * kPrime2, 31) * kPrime1;
}

inline uint64_t avalanche(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t hash_bytes(const uint8_t* data, size_t size) {
  uint64_t a = kPrime1 + kPrime2, b = kPrime2, c = 0, d = 0 - kPrime1;
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    a = lane_round(a, load_64(data + i));
    b = lane_round(b, load_64(data + i + 8));
    c = lane_round(c, load_64(data + i + 16));
    d = lane_round(d, load_64(data + i + 24));
  }
  uint64_t h = rotate_left(a, 1) + rotate_left(b, 7) + rotate_left(c, 12) + rotate_left(d, 18);
  h ^= static_cast<uint64_t>(size) * kPrime1;
  for (; i + 8 <= size; i += 8) h = lane_round(h, load_64(data + i));
  for (; i < size; ++i) h = lane_round(h, data[i]);
  return avalanche(h);
}

void FileIndex::reset(uint64_t hash, uint64_t size, uint32_t per_row, uint32_t rows,
                      uint32_t interval, uint32_t scan_components) {
  data_hash = hash;
  data_size = size;
  mcus_per_row = per_row;
  mcu_rows = rows;
  restart_interval = interval;
  components = scan_components;
  points_per_row = (per_row + kIndexColumnStep - 1) / kIndexColumnStep;
  points.assign(static_cast<size_t>(points_per_row) * rows, IndexPoint{});
}

uint64_t EntropyIndexStore::checksum_of(const FileIndex& index) {
  // IndexPoint has no padding (4 + 4 x 2 bytes), so its bytes are its value.
  static_assert(sizeof(IndexPoint) == 12, "IndexPoint must have no padding");
  const uint64_t layout[] = {index.data_hash,     index.data_size,        index.mcus_per_row,
                             index.mcu_rows,      index.restart_interval, index.components,
                             index.points_per_row};
  const uint64_t h = hash_bytes(reinterpret_cast<const uint8_t*>(layout), sizeof layout);
  return h ^ hash_bytes(reinterpret_cast<const uint8_t*>(index.points.data()),
                        index.points.size() * sizeof(IndexPoint));
}

void EntropyIndexStore::erase(std::unordered_map<Key, Entry, KeyHash>::iterator it) {
  bytes_ -= it->second.index.bytes() + kEntryOverhead;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

bool EntropyIndexStore::find(FileIndex& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = entries_.find(Key{out.data_hash, out.data_size});
  if (it == entries_.end()) return false;
  Entry& entry = it->second;
  if (checksum_of(entry.index) != entry.checksum) {
    erase(it);  // corrupt: the file is decoded as if it had no entry
    return false;
  }
  if (!entry.index.same_file(out)) return false;
  out.points = entry.index.points;  // the same size: no allocation
  lru_.splice(lru_.begin(), lru_, entry.lru);
  return true;
}

void EntropyIndexStore::merge(const FileIndex& index) {
  if (index.bytes() + kEntryOverhead > budget_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const Key key{index.data_hash, index.data_size};
  auto it = entries_.find(key);
  if (it != entries_.end() && (checksum_of(it->second.index) != it->second.checksum ||
                               !it->second.index.same_file(index))) {
    erase(it);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    lru_.push_front(key);
    it = entries_.emplace(key, Entry{index, 0, lru_.begin()}).first;
    bytes_ += index.bytes() + kEntryOverhead;
    ++changes_;
  } else {
    std::vector<IndexPoint>& points = it->second.index.points;
    bool added = false;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].bit_position == IndexPoint::kAbsent &&
          index.points[i].bit_position != IndexPoint::kAbsent) {
        points[i] = index.points[i];
        added = true;
      }
    }
    changes_ += added ? 1 : 0;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  it->second.checksum = checksum_of(it->second.index);
  while (bytes_ > budget_ && !lru_.empty()) erase(entries_.find(lru_.back()));
}

size_t EntropyIndexStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

size_t EntropyIndexStore::files() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

uint64_t EntropyIndexStore::changes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return changes_;
}

// The index file, little-endian throughout:
//   header (24 bytes): the magic "CVYJIDX1" (8), the version (u32, 1), the byte order check
//     (u32 0x01020304, so a writer that wrote its native big-endian order is refused), the point
//     spacing kIndexColumnStep (u32), the bytes of a point (u32, 12);
//   then entries, until the file's end, each: data_hash (u64), data_size (u64), mcus_per_row,
//     mcu_rows, restart_interval, components, points_per_row, point count (u32 each); the points
//     (bit_position u32, then the four DC predictors, i16 each: 12 bytes); and a checksum (u64):
//     hash_bytes of the entry's bytes before it.
// An entry's layout must be consistent (1 to kMaxMcus MCUs a row and rows, 1 to 4 components,
// points_per_row == ceil(mcus_per_row / kIndexColumnStep), point count == points_per_row *
// mcu_rows, data_size > 0) and its length must fit the bytes left, or the framing is lost and the
// rest of the file is dropped; an entry whose checksum fails, or whose key came before, is skipped.
// A 500x375 4:2:0 photo's entry: 40 + 96 x 12 + 8 = 1,200 bytes.
namespace {

constexpr char kFileMagic[8] = {'C', 'V', 'Y', 'J', 'I', 'D', 'X', '1'};
constexpr uint32_t kFileVersion = 1;
constexpr uint32_t kByteOrderCheck = 0x01020304u;
constexpr size_t kFileHeaderBytes = 24;
constexpr size_t kEntryHeadBytes = 40;
constexpr size_t kPointBytes = 12;
constexpr size_t kChecksumBytes = 8;
// JPEG's dimensions are at most 65535 pixels and an MCU at least 8: at most 8192 MCUs a side.
constexpr uint32_t kMaxMcus = 8192;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

std::vector<uint8_t> EntropyIndexStore::serialize() const {
  std::vector<uint8_t> out;
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = kFileHeaderBytes;
  for (const auto& [key, entry] : entries_) {
    total += kEntryHeadBytes + entry.index.points.size() * kPointBytes + kChecksumBytes;
  }
  out.reserve(total);
  out.insert(out.end(), kFileMagic, kFileMagic + sizeof kFileMagic);
  put_u32(out, kFileVersion);
  put_u32(out, kByteOrderCheck);
  put_u32(out, kIndexColumnStep);
  put_u32(out, static_cast<uint32_t>(kPointBytes));
  for (const Key& key : lru_) {
    const FileIndex& index = entries_.at(key).index;
    const size_t start = out.size();
    put_u64(out, index.data_hash);
    put_u64(out, index.data_size);
    for (const uint32_t v :
         {index.mcus_per_row, index.mcu_rows, index.restart_interval, index.components,
          index.points_per_row, static_cast<uint32_t>(index.points.size())}) {
      put_u32(out, v);
    }
    for (const IndexPoint& p : index.points) {
      put_u32(out, p.bit_position);
      for (const int16_t dc : p.dc_predictor) {
        out.push_back(static_cast<uint8_t>(static_cast<uint16_t>(dc)));
        out.push_back(static_cast<uint8_t>(static_cast<uint16_t>(dc) >> 8));
      }
    }
    put_u64(out, hash_bytes(out.data() + start, out.size() - start));
  }
  return out;
}

JpegEntropyIndexLoad EntropyIndexStore::load(const uint8_t* data, size_t size) {
  JpegEntropyIndexLoad result;
  result.file_found = true;
  if (size < kFileHeaderBytes || std::memcmp(data, kFileMagic, sizeof kFileMagic) != 0 ||
      get_u32(data + 8) != kFileVersion || get_u32(data + 12) != kByteOrderCheck ||
      get_u32(data + 16) != kIndexColumnStep || get_u32(data + 20) != kPointBytes) {
    result.file_refused = true;
    result.refusal = "not an entropy index file of this version (magic " +
                     std::string(kFileMagic, sizeof kFileMagic) + ", version " +
                     std::to_string(kFileVersion) + ", little-endian)";
    return result;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  size_t at = kFileHeaderBytes;
  while (at < size) {
    const size_t left = size - at;
    const uint8_t* p = data + at;
    if (left < kEntryHeadBytes) {
      result.rest_dropped = true;
      ++result.entries_refused;
      break;
    }
    FileIndex index;
    index.data_hash = get_u64(p);
    index.data_size = get_u64(p + 8);
    index.mcus_per_row = get_u32(p + 16);
    index.mcu_rows = get_u32(p + 20);
    index.restart_interval = get_u32(p + 24);
    index.components = get_u32(p + 28);
    index.points_per_row = get_u32(p + 32);
    const uint32_t point_count = get_u32(p + 36);
    const bool layout_holds =
        index.data_size > 0 && index.mcus_per_row >= 1 && index.mcus_per_row <= kMaxMcus &&
        index.mcu_rows >= 1 && index.mcu_rows <= kMaxMcus && index.components >= 1 &&
        index.components <= 4 &&
        index.points_per_row == (index.mcus_per_row + kIndexColumnStep - 1) / kIndexColumnStep &&
        uint64_t{point_count} == uint64_t{index.points_per_row} * index.mcu_rows;
    // The entry's length follows from its layout: one that is inconsistent, or longer than the
    // bytes left, loses the framing, and the rest is dropped. Nothing is allocated before this.
    if (!layout_holds || (left - kEntryHeadBytes) / kPointBytes < point_count ||
        left - kEntryHeadBytes - point_count * size_t{kPointBytes} < kChecksumBytes) {
      result.rest_dropped = true;
      ++result.entries_refused;
      break;
    }
    const size_t body = kEntryHeadBytes + point_count * size_t{kPointBytes};
    at += body + kChecksumBytes;
    if (get_u64(p + body) != hash_bytes(p, body) ||
        entries_.count(Key{index.data_hash, index.data_size}) != 0) {
      ++result.entries_refused;
      continue;
    }
    const size_t cost = sizeof(FileIndex) + point_count * sizeof(IndexPoint) + kEntryOverhead;
    if (bytes_ + cost > budget_) {
      ++result.entries_over_budget;
      continue;
    }
    index.points.resize(point_count);
    for (uint32_t i = 0; i < point_count; ++i) {
      const uint8_t* q = p + kEntryHeadBytes + i * size_t{kPointBytes};
      IndexPoint& point = index.points[i];
      point.bit_position = get_u32(q);
      for (size_t c = 0; c < 4; ++c) {
        point.dc_predictor[c] =
            static_cast<int16_t>(static_cast<uint16_t>(q[4 + 2 * c] | q[5 + 2 * c] << 8));
      }
    }
    const Key key{index.data_hash, index.data_size};
    lru_.push_back(key);
    const uint64_t checksum = checksum_of(index);
    entries_.emplace(key, Entry{std::move(index), checksum, std::prev(lru_.end())});
    bytes_ += cost;
    ++result.entries_loaded;
  }
  return result;
}

namespace {

std::runtime_error file_error(const char* what, const std::filesystem::path& path, int error) {
  return std::runtime_error(std::string("entropy index file ") + path.string() + ": " + what +
                            ": " + std::strerror(error));
}

// A file descriptor closed on every path out.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

JpegEntropyIndexLoad load_index_file(const std::filesystem::path& path, EntropyIndexStore& store) {
  JpegEntropyIndexLoad result;
  Descriptor file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0 && errno == ENOENT) return result;
  result.file_found = true;
  const auto refuse = [&](int error) {
    result.file_refused = true;
    result.refusal = file_error("cannot be read", path, error).what();
    return result;
  };
  struct stat info {};
  if (file.fd < 0 || ::fstat(file.fd, &info) != 0) return refuse(errno);
  if (S_ISDIR(info.st_mode)) return refuse(EISDIR);
  if (!S_ISREG(info.st_mode)) return refuse(EINVAL);
  std::vector<uint8_t> bytes;
  bytes.resize(static_cast<size_t>(info.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(file.fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return refuse(errno);
    if (n == 0) break;  // shorter than it was: what was read is loaded
    got += static_cast<size_t>(n);
  }
  result = store.load(bytes.data(), got);
  if (result.file_refused) {
    result.refusal = "entropy index file " + path.string() + ": " + result.refusal;
  }
  return result;
}

void save_index_file(const std::filesystem::path& path, const EntropyIndexStore& store) {
  const std::vector<uint8_t> bytes = store.serialize();
  // A new file beside `path`, named uniquely (mkstemp), so that concurrent saves never share it.
  std::string temp = path.string() + ".tmp-XXXXXX";
  Descriptor file;
  file.fd = ::mkstemp(temp.data());
  if (file.fd < 0) throw file_error("cannot create a file beside it", path, errno);
  const auto fail = [&](const char* what) {
    const int error = errno;
    ::unlink(temp.c_str());
    return file_error(what, path, error);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(file.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw fail("cannot write");
    done += static_cast<size_t>(n);
  }
  if (::fchmod(file.fd, 0644) != 0 || ::fsync(file.fd) != 0) throw fail("cannot write");
  const int fd = file.fd;
  file.fd = -1;
  if (::close(fd) != 0) throw fail("cannot write");
  if (::rename(temp.c_str(), path.c_str()) != 0) throw fail("cannot replace");
}

void EntropyIndexStore::tamper(const std::function<void(FileIndex&)>& change) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, entry] : entries_) change(entry.index);
}

}  // namespace conveyor::detail
