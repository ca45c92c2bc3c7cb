// The runs conveyor-bench times: Conveyor itself and the references it is compared against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/loader.h"

namespace conveyor::bench {

// What --data and --reference-data name: an ImageFolder, or WebDataset tar shards (local paths,
// file:// or http(s):// URLs, pipe:COMMAND, brace patterns) read through ImageSource::tar_shards.
// The library's reading of a command-line argument (conveyor::names_tar_shards,
// shard_argument_locations) decides, as it does for conveyor-prepare: an existing file or folder
// is that path, literally; anything else is the user's patterns.
enum class SourceKind { kImageFolder, kLocalShards, kHttpShards, kPipeShards, kMixedShards };

// True when `data` names tar shards (conveyor::names_tar_shards). Anything else is an ImageFolder.
bool is_shard_source(const std::string& data);
// The shards a shard source names (conveyor::shard_argument_locations: an existing file is that
// file; else comma-separated patterns, split outside braces and quotes, "{train,val}.tar" one
// pattern, then expanded). Throws when none.
std::vector<ShardLocation> shard_locations(const std::string& data);
SourceKind source_kind(const std::string& data);
// "image_folder", "tar_shards (local)", "tar_shards (http)", "tar_shards (pipe)" or
// "tar_shards (mixed)".
std::string source_kind_name(SourceKind kind);
// ImageSource::image_folder or ImageSource::tar_shards, as `data` says.
std::unique_ptr<ImageSource> open_source(const std::string& data, ImageTransform transform,
                                         bool streaming = false);

// --reference-data NAME=SOURCE: Conveyor itself, same options, on another source.
struct ReferenceData {
  std::string name;  // the run is "conveyor:NAME"
  std::string data;
};

struct BenchConfig {
  std::string data;  // what Conveyor reads: a folder or tar shards
  std::vector<ReferenceData> reference_data;
  // The ImageFolder that ceiling, torch, torch-fused and naive read: the first folder among
  // reference_data, else `data` when it is a folder (empty if neither).
  std::string reference_folder;
  size_t batch_size = 256;
  // The threads: Conveyor's workers, and the references' threads (every reference, under
  // auto_workers too, runs this many).
  size_t workers = 1;
  // --workers auto: Conveyor runs with LoaderOptions::workers = kAutoWorkers and `workers` as its
  // budget (max_workers), choosing while it runs how many of them work.
  bool auto_workers = false;
  size_t epochs = 2;
  size_t rounds = 3;  // each run this many times, interleaved; ratios are per-round medians
  int crop = 224;
  std::string device;  // "cpu", "cuda", "cuda:1"
  std::vector<std::string> compare;
  bool skip = false;
  // Tar shards in streaming mode (whole shards in order, a shuffle buffer of 1000) instead of
  // random access through the index.
  bool streaming = false;
  // --gpu-decode: Conveyor's LoaderOptions::gpu_decode (GpuDecode::parse's text), off by default.
  std::string gpu_decode = "off";
  // --compare cpu-decode: one more reference run, "conveyor:cpu-decode": Conveyor on `data` with
  // gpu_decode off, in the same rounds (the hybrid's ratio against the CPU path).
  bool cpu_decode_reference = false;
  // ImageTransform::discard_outside_crop of Conveyor's runs (the JPEG discard hook).
  bool discard_outside_crop = true;
  // --compare no-discard: one more reference run, "conveyor:no-discard": Conveyor on `data` with
  // the discard hook off, in the same rounds (the hook's ratio).
  bool no_discard_reference = false;
  // ImageTransform::own_entropy_decoder of Conveyor's runs (the own baseline JPEG entropy
  // decoder; --stock-entropy: off).
  bool own_entropy_decoder = true;
  // --entropy-index-mib: with the own decoder, the budget of the JpegEntropyIndex that Conveyor's
  // run shares across its workers (a fresh one each round); 0: none.
  size_t entropy_index_mib = 64;
  // --entropy-index-file: the file that index is loaded from at the start of each of Conveyor's
  // runs (when it exists) and saved to at its end; empty: none (in memory only).
  std::string entropy_index_file;
  // --compare stock-entropy: one more reference run, "conveyor:stock-entropy": Conveyor on `data`
  // with the own entropy decoder off, in the same rounds (the own decoder's ratio).
  bool stock_entropy_reference = false;
  std::string json;
  // --plot FILE.svg or FILE.png: the figures as pictures (bench/plot.h).
  std::string plot;
  bool progress = false;
};

struct RunResult {
  std::string name;
  std::string device;
  std::string mode;
  uint64_t images = 0;
  double seconds = 0;
  // The process's CPU time (user + system, every thread: getrusage RUSAGE_SELF) over the timed
  // span that `seconds` measures.
  double cpu_seconds = 0;
  double images_per_s = 0;
  uint64_t errors = 0;
  uint64_t skipped = 0;
  uint64_t pinned_bytes = 0;
  double p50_ms = 0, p99_ms = 0;
  double wait_fraction = 0;
  std::vector<std::pair<int, double>> scale_shares;  // DCT numerator -> share of samples
  std::map<std::string, double> extra;               // GPU figures and the like
  // Conveyor's images/s over this run's, one per round (same round, same process); the table
  // and the JSON give their median.
  std::vector<double> ratios;
  // This run's images/s in each round, in round order (the table's figure is their median).
  std::vector<double> round_images_per_s;
  std::string data;  // what it read (BenchConfig::data, a reference's data or reference_folder)
  // For --plot: (seconds since the run's start, images done), sampled about every 50 ms and at
  // the end; the time between consecutive batches the consumer received, in ms (none for the
  // ceiling, which has no batches); and, for Conveyor on an ImageSource, where the time went:
  // worker seconds reading, decoding, transforming and in the engine's other fill work, consumer
  // seconds issuing copies and waiting (keys "read", "decode", "transform", "fill_other",
  // "copy_issue", "wait").
  std::vector<std::pair<double, uint64_t>> timeline;
  std::vector<double> batch_ms;
  std::map<std::string, double> time_split;
  // The configuration it ran with: BenchConfig::workers.
  size_t workers = 0;
  // Conveyor's active workers at the end (stats().active_workers; `workers` for the references),
  // and under --workers auto its choice over time (stats().active_workers_history): the loader's
  // batches handed out, the seconds since the loader started, and the active workers, at the
  // start and at every change.
  size_t active_workers = 0;
  std::vector<ActiveWorkers> active_workers_history;
  // Conveyor's split between the CPU and the GPU decoder (stats().gpu_decode); status "off" for
  // the references.
  GpuDecodeStats gpu_decode;
};

// Conveyor on config.data (a folder or tar shards), named `name`.
RunResult run_conveyor(const BenchConfig& config, const std::string& name = "conveyor");
// "ceiling", "torch", "torch-fused" or "naive", reading the files of config.data (a folder).
RunResult run_reference(const std::string& name, const BenchConfig& config);

// Progress on a terminal: images done, images/s, ETA.
class Progress {
 public:
  Progress(const std::string& name, uint64_t total, bool enabled);
  // Records (time since construction, done) at most every 50 ms, and prints when enabled.
  void update(uint64_t done);
  // Records the last point and clears the terminal line.
  void finish(uint64_t done);
  std::vector<std::pair<double, uint64_t>> take_timeline() { return std::move(timeline_); }

 private:
  std::string name_;
  uint64_t total_;
  bool enabled_;
  double start_;
  double last_ = 0;
  double last_point_ = -1;
  std::vector<std::pair<double, uint64_t>> timeline_;
};

double now_seconds();
// The CPU time (user + system) of the whole process so far, every thread included.
double process_cpu_seconds();
// The p-quantile (0..1) of `v`: the element at the rounded index p * (n - 1); 0 when empty.
double percentile(std::vector<double> v, double p);

// A full-size TurboJPEG decode to interleaved RGB, written the way a user's code handles every
// JPEG a dataset holds: gray, YCbCr and progressive files decode straight to TJPF_RGB; CMYK and
// YCCK files (which TurboJPEG cannot convert to RGB) decode to TJPF_CMYK and are converted here,
// R = C * K / 255 on inverted values: files with an Adobe APP14 marker store inverted CMYK,
// others plain CMYK, inverted first (the convention of conveyor::rgb_to_cmyk). One per thread.
class UserJpegDecoder {
 public:
  UserJpegDecoder();
  ~UserJpegDecoder();
  UserJpegDecoder(const UserJpegDecoder&) = delete;
  UserJpegDecoder& operator=(const UserJpegDecoder&) = delete;
  // Fills `rgb` with height x width x 3 bytes. Throws std::runtime_error with TurboJPEG's message.
  void decode(const std::vector<uint8_t>& file, std::vector<uint8_t>& rgb, int& width, int& height);

 private:
  void* handle_;
  std::vector<uint8_t> cmyk_;
};

// A reference's error about one file: "<name> reference: <path>: <what>".
std::string reference_error(const std::string& name, const std::string& path,
                            const std::string& what);
// Under BenchConfig::skip a reference replaces a file it cannot decode by the next one that
// decodes, as Conveyor's ErrorPolicy::kSkip does, trying at most this many.
constexpr size_t kMaxSubstitutes = 16;

// With a CUDA device: h2d_gb_per_s, h2d_peak_gb_per_s and overlap_step_ratio into result.extra.
void add_gpu_figures(const BenchConfig& config, RunResult& result);

}  // namespace conveyor::bench
