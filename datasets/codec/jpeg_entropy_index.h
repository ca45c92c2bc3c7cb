// datasets/codec/jpeg_entropy_index.h (build-only): the per-file index of the own entropy
// decoder's states (issue 35, step 3), behind JpegEntropyIndex (jpeg.h).
//
// What it is for: a later decode of the same file starts each of the crop's MCU rows at the
// saved state nearest at or before the crop's first MCU column, and parses nothing above the crop,
// instead of parsing the scan from its start. The own decoder records a state at the start of
// every MCU row and every kIndexColumnStep MCUs within it, wherever its decode passes; an index
// fills up over epochs (ColumnDiscard::install_own uses it, jpeg_column_discard.h).
//
// Guarantees: an entry is found only for the same bytes (a 64-bit hash of the whole data decoded
// and its size) and the same scan layout, and only while its checksum holds; an entry whose
// checksum fails is dropped, and the file is decoded as if it had none. A state that does not fit
// the scan is refused by HuffmanScanDecoder::restore, and the image is then decoded by libjpeg
// alone: an index never changes pixels. Thread-safe: one lock around find and merge, never held
// while decoding. Bounded by a byte budget; the least recently used files leave first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "conveyor/jpeg.h"

namespace conveyor::detail {

// A state is saved at the start of each MCU row and every this many MCUs within it. 8 keeps the
// MCUs parsed to reach a crop's first column at 3.5 on average, for about 1% of a photo's size.
constexpr uint32_t kIndexColumnStep = 8;

// One saved state (EntropyState, compact): the bit position in the de-stuffed scan and the DC
// predictors. A state whose position or predictors do not fit is not saved.
struct IndexPoint {
  static constexpr uint32_t kAbsent = 0xFFFFFFFFu;
  uint32_t bit_position = kAbsent;
  std::array<int16_t, 4> dc_predictor{};
};

// The index of one file: its points in raster order, point (row r, slot s) before MCU
// r * mcus_per_row + s * kIndexColumnStep.
struct FileIndex {
  uint64_t data_hash = 0;  // hash_bytes of the data decoded
  uint64_t data_size = 0;
  uint32_t mcus_per_row = 0, mcu_rows = 0, restart_interval = 0, components = 0;
  uint32_t points_per_row = 0;  // ceil(mcus_per_row / kIndexColumnStep)
  std::vector<IndexPoint> points;

  // Readies an empty index (every point absent) for the key and layout; keeps the capacity.
  void reset(uint64_t hash, uint64_t size, uint32_t per_row, uint32_t rows, uint32_t interval,
             uint32_t scan_components);
  bool same_file(const FileIndex& other) const {
    return data_hash == other.data_hash && data_size == other.data_size &&
           mcus_per_row == other.mcus_per_row && mcu_rows == other.mcu_rows &&
           restart_interval == other.restart_interval && components == other.components &&
           points.size() == other.points.size();
  }
  // The point's MCU.
  uint64_t mcu_of(size_t point) const {
    return static_cast<uint64_t>(point / points_per_row) * mcus_per_row +
           static_cast<uint64_t>(point % points_per_row) * kIndexColumnStep;
  }
  // The bytes it holds, as the budget counts them.
  size_t bytes() const { return sizeof(FileIndex) + points.size() * sizeof(IndexPoint); }
};

// A 64-bit hash of `size` bytes (not cryptographic; several GB/s).
uint64_t hash_bytes(const uint8_t* data, size_t size);

class EntropyIndexStore;

// Reads the index file at `path` into `store` (EntropyIndexStore::load); a missing file loads
// nothing, and one that cannot be read is refused whole. Never throws for the file.
JpegEntropyIndexLoad load_index_file(const std::filesystem::path& path, EntropyIndexStore& store);
// Writes `store`'s entries to `path` atomically (a new file in the same directory, flushed, then
// renamed over `path`). Throws std::runtime_error naming the path and strerror's text.
void save_index_file(const std::filesystem::path& path, const EntropyIndexStore& store);

// The index store, shared by every decoder given the same JpegEntropyIndex.
class EntropyIndexStore {
 public:
  explicit EntropyIndexStore(size_t budget_bytes) : budget_(budget_bytes) {}

  size_t budget_bytes() const { return budget_; }
  // Copies into `out` the entry with out's key (data_hash, data_size) and layout, when there is
  // one whose checksum holds (an entry whose checksum fails is dropped). `out` keeps its key and
  // layout either way; false: its points are unchanged.
  bool find(FileIndex& out);
  // Adds the points of `index` that its entry lacks (or makes the entry), marks it most recently
  // used, and leaves the least recently used entries out while over the budget.
  void merge(const FileIndex& index);
  size_t bytes() const;
  size_t files() const;
  // How many merges changed the store so far (JpegEntropyIndex saves only after a change).
  uint64_t changes() const;

  // The index file's bytes (the format is in jpeg_entropy_index.cpp): every entry held, the most
  // recently used first, copied under the lock.
  std::vector<uint8_t> serialize() const;
  // Adds the entries of an index file's bytes, in their order and behind those held, while they
  // fit the budget. Trusts nothing in `data`: a header that is not this format's refuses it
  // whole; an entry whose checksum fails or whose key is held already is skipped; an entry whose
  // layout is inconsistent, or that the data's end cuts short, ends the load. Allocates at most
  // what the accepted entries hold. Does not count as a change.
  JpegEntropyIndexLoad load(const uint8_t* data, size_t size);

  // For tests: applies `change` to every entry without updating its checksum, as memory
  // corruption would.
  void tamper(const std::function<void(FileIndex&)>& change);

 private:
  struct Key {
    uint64_t hash, size;
    bool operator==(const Key& o) const { return hash == o.hash && size == o.size; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.hash ^ k.size); }
  };
  struct Entry {
    FileIndex index;
    uint64_t checksum = 0;
    std::list<Key>::iterator lru;
  };
  static uint64_t checksum_of(const FileIndex& index);
  void erase(std::unordered_map<Key, Entry, KeyHash>::iterator it);

  const size_t budget_;
  mutable std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> entries_;
  std::list<Key> lru_;  // most recently used first
  size_t bytes_ = 0;
  uint64_t changes_ = 0;
};

}  // namespace conveyor::detail
