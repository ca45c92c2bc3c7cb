#include "options.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "conveyor/prefetch.h"

namespace conveyor::detail {

ResolvedOptions resolve_options(const LoaderOptions& options, bool check_device) {
  ResolvedOptions o;
  static_cast<LoaderOptions&>(o) = options;
  if (o.batch_size == 0) throw std::invalid_argument("conveyor: batch_size must be at least 1");
  const size_t hardware_threads = std::max(1u, std::thread::hardware_concurrency());
  if (o.workers == kAutoWorkers) {
    o.auto_workers = true;
    o.workers = o.max_workers == 0 ? hardware_threads : o.max_workers;
  }
  if (o.workers == 0) o.workers = hardware_threads;
  if (o.max_workers == 0 || !o.auto_workers) o.max_workers = o.workers;
  o.prefetch_factor = std::max<size_t>(1, o.prefetch_factor);
  if (o.timeout) {  // deadlines are now() + timeout: keep them far from overflowing
    if (o.timeout->count() < 0)
      throw std::invalid_argument("conveyor: timeout must not be negative");
    o.timeout = std::min<std::chrono::milliseconds>(*o.timeout, std::chrono::hours(24 * 365));
  }
  if (o.slots == 0) o.slots = o.workers + o.prefetch_factor + 2;
  o.slots = std::max<size_t>(o.slots, 2);
  if (o.chunk_size == 0) {
    o.chunk_size =
        o.workers == 1 ? o.batch_size : std::max<size_t>(8, o.batch_size / (4 * o.workers));
  }
  o.chunk_size = std::min(o.chunk_size, o.batch_size);
  o.chunks_per_batch = (o.batch_size + o.chunk_size - 1) / o.chunk_size;
  // Jobs are 32-bit (slot, chunk) numbers, and the job queue holds every chunk of every slot.
  if (o.slots * o.chunks_per_batch > (size_t{1} << 24)) {
    throw std::invalid_argument("conveyor: " + std::to_string(o.slots) + " slots x " +
                                std::to_string(o.chunks_per_batch) +
                                " chunks per batch is too many jobs; raise chunk_size");
  }
  o.gpu_decode.threads = std::max<size_t>(1, o.gpu_decode.threads);
  o.gpu_decode.max_batch = std::max(o.gpu_decode.max_batch, o.chunk_size);
  if (!(o.gpu_decode.share >= 0.0 && o.gpu_decode.share <= 1.0)) {  // NaN too
    throw std::invalid_argument("conveyor: gpu_decode.share must be in [0, 1], got " +
                                std::to_string(o.gpu_decode.share));
  }
  if (check_device) o.device = resolve_device(o.device);
  return o;
}

}  // namespace conveyor::detail

namespace conveyor {

GpuDecode GpuDecode::parse(const std::string& text) {
  if (text == "off") return off();
  if (text == "auto") return automatic();
  if (text == "hw-only") return hardware_only();
  size_t used = 0;
  double share = -1;
  try {
    share = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(share >= 0.0 && share <= 1.0)) {
    throw std::invalid_argument(
        "conveyor: GPU decode takes off, auto, hw-only or a share in [0, 1], "
        "got '" +
        text + "'");
  }
  return fixed_share(share);
}

}  // namespace conveyor
