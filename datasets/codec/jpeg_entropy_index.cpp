// The per-file index of the own entropy decoder's states (jpeg_entropy_index.h).
#include "codec/jpeg_entropy_index.h"

#include <cstring>

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
  } else {
    std::vector<IndexPoint>& points = it->second.index.points;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].bit_position == IndexPoint::kAbsent) points[i] = index.points[i];
    }
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

void EntropyIndexStore::tamper(const std::function<void(FileIndex&)>& change) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, entry] : entries_) change(entry.index);
}

}  // namespace conveyor::detail
