// Google Benchmark suite for the engine itself, with its references in the same run:
//   BM_EngineOverhead     batches of 256 samples whose only field is an 8-byte label: the time per
//                         batch is the engine's own cost (claiming, slot states, queues, ordering,
//                         the batch's tensors), not the work.
//   BM_PipelineMemcpy     3x224x224 uint8 samples memcpy'd by the workers into ring slots and
//                         delivered as batches...
//   BM_PlainMemcpy        ...against a plain memcpy of the same bytes on the same number of
//                         threads into a buffer of the same size.
//   BM_FirstBatch/0       a fresh loader: construction to its first batch (3x224x224 samples,
//                         batch 64, 2 workers, a random sampler over 64 x 100 samples)...
//   BM_FirstBatch/1       ...against the same loader resumed from a checkpoint saved after batch
//                         50 of 100 (load() included): a resume costs what a fresh start does.
//   BM_FirstBatch/2       the checkpoint's parse alone (torch::serialize::InputArchive).
// Run: build/bench/engine-bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <sstream>

#include <torch/serialize.h>

#include "conveyor/conveyor.h"
#include "synthetic.h"

namespace conveyor {
namespace {

constexpr size_t kImageBytes = 3 * 224 * 224;

void drain(DataLoader& loader, benchmark::State& state, size_t batch_size) {
  uint64_t samples = 0;
  auto it = loader.begin();
  for (auto _ : state) {
    if (it == loader.end()) {
      state.PauseTiming();
      it = loader.begin();
      state.ResumeTiming();
    }
    samples += it->size();
    benchmark::DoNotOptimize(it->fields[0].data_ptr());
    ++it;
  }
  state.SetItemsProcessed(static_cast<int64_t>(samples));  // the Time column is per batch
  (void)batch_size;
}

void BM_EngineOverhead(benchmark::State& state) {
  const size_t workers = static_cast<size_t>(state.range(0));
  LoaderOptions o;
  o.batch_size = 256;
  o.workers = workers;
  DataLoader loader(std::make_shared<PatternSource>(256 * 200, 0), o);
  drain(loader, state, o.batch_size);
}
BENCHMARK(BM_EngineOverhead)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0);

void BM_PipelineMemcpy(benchmark::State& state) {
  const size_t workers = static_cast<size_t>(state.range(0));
  LoaderOptions o;
  o.batch_size = 64;
  o.workers = workers;
  o.slots = static_cast<size_t>(state.range(1));  // 0: the default
  DataLoader loader(std::make_shared<PatternSource>(64 * 40, kImageBytes), o);
  uint64_t bytes = 0;
  auto it = loader.begin();
  const LoaderStats before = loader.stats();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (it == loader.end()) it = loader.begin();
    bytes += it->size() * kImageBytes;
    benchmark::DoNotOptimize(it->fields[0].data_ptr());
    ++it;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const LoaderStats after = loader.stats();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  // The share of the workers' time spent writing samples: 1.0 means they never waited for a job.
  state.counters["worker_busy"] =
      (after.fill_seconds - before.fill_seconds) / (wall * static_cast<double>(workers));
  state.counters["consumer_wait"] = (after.wait_seconds - before.wait_seconds) / wall;
}
BENCHMARK(BM_PipelineMemcpy)
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({2, 12})
    ->UseRealTime()
    ->MinTime(1.0);

// The reference: the same bytes on the same number of persistent threads, one batch per
// iteration, each thread copying its share of the batch's samples into one of several buffers.
// range(1) chooses how the threads share the work: 0 = every thread takes an interleaved share of
// each batch; 1 = each thread copies whole batches into its own buffer, as the loader's workers do.
void BM_PlainMemcpy(benchmark::State& state) {
  const size_t threads = static_cast<size_t>(state.range(0));
  const bool whole_batches = state.range(1) == 1;
  const size_t batch = 64;
  std::vector<uint8_t> pattern(kImageBytes + 251);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i % 251);
  const size_t slots = threads + 4;
  std::vector<std::vector<uint8_t>> ring(slots, std::vector<uint8_t>(batch * kImageBytes));
  std::barrier sync(static_cast<std::ptrdiff_t>(threads + 1));
  std::atomic<bool> stop{false};
  uint8_t* dst = nullptr;
  size_t iteration_seen = 0;
  std::vector<std::jthread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (;;) {
        sync.arrive_and_wait();
        if (stop.load()) return;
        if (whole_batches) {
          uint8_t* own = ring[(iteration_seen + t) % slots].data();
          for (size_t s = 0; s < batch; ++s) {
            std::memcpy(own + s * kImageBytes, pattern.data() + s % 251, kImageBytes);
          }
        } else {
          for (size_t s = t; s < batch; s += threads) {
            std::memcpy(dst + s * kImageBytes, pattern.data() + s % 251, kImageBytes);
          }
        }
        sync.arrive_and_wait();
      }
    });
  }
  uint64_t bytes = 0, iteration = 0;
  for (auto _ : state) {
    dst = ring[iteration % slots].data();
    iteration_seen = iteration;
    iteration += whole_batches ? threads : 1;
    sync.arrive_and_wait();  // go
    sync.arrive_and_wait();  // done
    bytes += (whole_batches ? threads : 1) * batch * kImageBytes;
  }
  stop.store(true);
  sync.arrive_and_wait();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_PlainMemcpy)->Args({1, 0})->Args({2, 0})->Args({2, 1})->UseRealTime()->MinTime(1.0);

void BM_FirstBatch(benchmark::State& state) {
  const bool resumed = state.range(0) != 0;
  LoaderOptions o;
  o.batch_size = 64;
  o.workers = 2;
  auto source = std::make_shared<PatternSource>(64 * 100, kImageBytes);
  std::string checkpoint;
  {
    DataLoader loader(source, o, RandomSampler::make(1));
    auto it = loader.begin();
    for (int i = 0; i < 49; ++i) ++it;  // 50 batches received
    torch::serialize::OutputArchive archive;
    loader.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    checkpoint = out.str();
  }
  if (state.range(0) == 2) {  // the checkpoint's parse alone (torch::serialize::InputArchive)
    for (auto _ : state) {
      torch::serialize::InputArchive archive;
      std::istringstream in(checkpoint);
      archive.load_from(in);
      benchmark::DoNotOptimize(&archive);
    }
    return;
  }
  for (auto _ : state) {
    DataLoader loader(source, o, RandomSampler::make(1));
    if (resumed) {
      torch::serialize::InputArchive archive;
      std::istringstream in(checkpoint);
      archive.load_from(in);
      loader.load(archive);
    }
    std::optional<Batch> batch = loader.next();
    benchmark::DoNotOptimize(batch->fields[0].data_ptr());
    if (batch->sequence != (resumed ? 50u : 0u)) state.SkipWithError("wrong first batch");
  }
}
BENCHMARK(BM_FirstBatch)->Arg(0)->Arg(1)->Arg(2)->UseRealTime()->MinTime(2.0);

}  // namespace
}  // namespace conveyor

BENCHMARK_MAIN();
