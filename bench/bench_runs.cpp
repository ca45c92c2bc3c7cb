#include "bench_runs.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include <sys/resource.h>
#include <turbojpeg.h>

#include <ATen/ATen.h>

#include "conveyor/conveyor.h"
#include "jpeg_markers.h"

namespace conveyor::bench {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const timeval& u = usage.ru_utime;
  const timeval& k = usage.ru_stime;
  return static_cast<double>(u.tv_sec + k.tv_sec) +
         1e-6 * static_cast<double>(u.tv_usec + k.tv_usec);
}

Progress::Progress(const std::string& name, uint64_t total, bool enabled)
    : name_(name), total_(total), enabled_(enabled), start_(now_seconds()) {}

void Progress::update(uint64_t done) {
  double t = now_seconds();
  if (t - start_ - last_point_ >= 0.05) {
    last_point_ = t - start_;
    timeline_.emplace_back(last_point_, done);
  }
  if (!enabled_) return;
  if (t - last_ < 0.25 && done < total_) return;
  last_ = t;
  double rate = done / std::max(1e-9, t - start_);
  double eta = rate > 0 ? (total_ - std::min(done, total_)) / rate : 0;
  std::fprintf(stderr, "\r%-12s %8llu/%llu images  %8.1f images/s  ETA %5.1f s ", name_.c_str(),
               static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_), rate,
               eta);
}

void Progress::finish(uint64_t done) {
  timeline_.emplace_back(now_seconds() - start_, done);
  if (enabled_) std::fprintf(stderr, "\r%100s\r", "");
}

namespace {

c10::Device parse_device(const std::string& d) { return c10::Device(d); }

}  // namespace

bool is_shard_source(const std::string& data) { return names_tar_shards(data); }

std::vector<ShardLocation> shard_locations(const std::string& data) {
  std::vector<ShardLocation> out = shard_argument_locations(data);
  if (out.empty()) throw std::invalid_argument("no shard pattern in '" + data + "'");
  return out;
}

SourceKind source_kind(const std::string& data) {
  if (!is_shard_source(data)) return SourceKind::kImageFolder;
  std::set<ShardLocation::Kind> kinds;
  for (const ShardLocation& shard : shard_locations(data)) kinds.insert(shard.kind);
  if (kinds.size() > 1) return SourceKind::kMixedShards;
  switch (*kinds.begin()) {
    case ShardLocation::Kind::kLocal:
      return SourceKind::kLocalShards;
    case ShardLocation::Kind::kHttp:
      return SourceKind::kHttpShards;
    case ShardLocation::Kind::kPipe:
      return SourceKind::kPipeShards;
  }
  return SourceKind::kMixedShards;
}

std::string source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kImageFolder:
      return "image_folder";
    case SourceKind::kLocalShards:
      return "tar_shards (local)";
    case SourceKind::kHttpShards:
      return "tar_shards (http)";
    case SourceKind::kPipeShards:
      return "tar_shards (pipe)";
    case SourceKind::kMixedShards:
      return "tar_shards (mixed)";
  }
  return "unknown";
}

std::unique_ptr<ImageSource> open_source(const std::string& data, ImageTransform transform,
                                         bool streaming) {
  if (source_kind(data) == SourceKind::kImageFolder) {
    return ImageSource::image_folder(data, transform);
  }
  ShardOptions options;
  options.streaming = streaming;
  return ImageSource::tar_shards(shard_locations(data), transform, options);
}

RunResult run_conveyor(const BenchConfig& config, const std::string& name) {
  ImageTransform transform = ImageTransform::train(config.crop);
  transform.discard_outside_crop = config.discard_outside_crop;
  transform.own_entropy_decoder = config.own_entropy_decoder;
  // Always one of the run's own, so that each round starts unindexed (0: none), unless
  // --entropy-index-file gives it a file to start from.
  transform.entropy_index = std::make_shared<JpegEntropyIndex>(
      config.own_entropy_decoder ? config.entropy_index_mib << 20 : 0,
      std::filesystem::path(config.entropy_index_file));
  std::shared_ptr<ImageSource> source = open_source(config.data, transform, config.streaming);
  LoaderOptions o;
  o.batch_size = config.batch_size;
  o.workers = config.auto_workers ? kAutoWorkers : config.workers;
  o.max_workers = config.auto_workers ? config.workers : 0;
  o.device = parse_device(config.device);
  o.on_error = config.skip ? ErrorPolicy::kSkip : ErrorPolicy::kRaise;
  o.gpu_decode = GpuDecode::parse(config.gpu_decode);
  // A streamed source brings its own order (the shard shuffle and the shuffle buffer): it is read
  // in sequence. tar_shards streams without being asked, too (pipe: shards, shards without an
  // index); a streamed source lists no items.
  const bool streamed = source_kind(config.data) != SourceKind::kImageFolder &&
                        (config.streaming || source->items().empty());
  DataLoader loader(source, o, streamed ? SequentialSampler::make() : RandomSampler::make(0));
  RunResult r;
  r.name = name;
  r.data = config.data;
  r.device = o.device.str();
  r.mode = loader.mode();
  r.pinned_bytes = loader.pinned_bytes();
  Progress progress(name, source->size() * config.epochs, config.progress);
  std::vector<double>& intervals = r.batch_ms;
  intervals.reserve(source->size() * config.epochs / config.batch_size + 1);
  const double t0 = now_seconds();
  const double cpu0 = process_cpu_seconds();
  double last = t0;
  double epoch1_end = t0;
  uint64_t epoch1_images = 0;
  for (size_t e = 0; e < config.epochs; ++e) {
    for (Batch& b : loader) {
      r.images += b.size();
      double t = now_seconds();
      intervals.push_back((t - last) * 1000.0);
      last = t;
      progress.update(r.images);
    }
    if (e == 0) {
      epoch1_end = last;
      epoch1_images = r.images;
    }
  }
  if (o.device.is_cuda()) {
    // Include the last copies in the time: wait until the device has every batch.
    at::Tensor probe = at::zeros({1}, at::TensorOptions().device(o.device));
    (void)probe.cpu();
  }
  r.seconds = now_seconds() - t0;
  r.cpu_seconds = process_cpu_seconds() - cpu0;
  progress.finish(r.images);
  r.timeline = progress.take_timeline();
  r.workers = config.workers;
  r.images_per_s = r.images / r.seconds;
  LoaderStats s = loader.stats();
  r.active_workers = s.active_workers;
  r.active_workers_history = std::move(s.active_workers_history);
  r.gpu_decode = s.gpu_decode;
  r.errors = s.errors;
  r.skipped = s.skipped;
  r.wait_fraction = s.wait_seconds / r.seconds;
  r.p50_ms = percentile(intervals, 0.5);
  r.p99_ms = percentile(intervals, 0.99);
  std::vector<uint64_t> h = source->scale_histogram();
  uint64_t total = 0;
  for (uint64_t v : h) total += v;
  for (int m = 1; m <= 8; ++m) {
    if (h[static_cast<size_t>(m)] > 0) {
      r.scale_shares.emplace_back(m, static_cast<double>(h[static_cast<size_t>(m)]) / total);
    }
  }
  r.extra["fill_seconds"] = s.fill_seconds;
  if (config.epochs > 1 && epoch1_end > t0 && last > epoch1_end) {
    // Epoch 1 and the later epochs apart (the entropy index fills during epoch 1).
    r.extra["epoch1_images_per_s"] = static_cast<double>(epoch1_images) / (epoch1_end - t0);
    r.extra["later_epochs_images_per_s"] =
        static_cast<double>(r.images - epoch1_images) / (last - epoch1_end);
  }
  if (transform.entropy_index->budget_bytes() > 0) {
    r.extra["entropy_index_bytes_per_file"] =
        static_cast<double>(transform.entropy_index->bytes()) /
        static_cast<double>(std::max<size_t>(1, transform.entropy_index->files()));
    if (!config.entropy_index_file.empty()) {
      const JpegEntropyIndexLoad& loaded = transform.entropy_index->loaded();
      if (loaded.file_refused) std::fprintf(stderr, "conveyor-bench: %s\n", loaded.refusal.c_str());
      r.extra["entropy_index_files_loaded"] = static_cast<double>(loaded.entries_loaded);
      r.extra["entropy_index_entries_refused"] = static_cast<double>(loaded.entries_refused);
      transform.entropy_index->save();  // throws naming the file when it cannot be written
    }
  }
  const ImageSource::WorkTime work = source->work_time();
  r.time_split["read"] = work.read_seconds;
  r.time_split["decode"] = work.decode_seconds;
  r.time_split["transform"] = work.transform_seconds;
  r.time_split["fill_other"] = std::max(
      0.0, s.fill_seconds - work.read_seconds - work.decode_seconds - work.transform_seconds);
  r.time_split["copy_issue"] = s.copy_issue_seconds;
  r.time_split["wait"] = s.wait_seconds;
  return r;
}

namespace {

// The decode ceiling: plain full-size libjpeg-turbo decodes of the same files on the same number
// of threads, with no loader, no crop, no resize. A file that fails applies --on-error: under
// raise the run stops and throws naming the file; under skip the next file is decoded instead,
// and both are counted.
RunResult run_ceiling(const BenchConfig& config) {
  auto source = ImageSource::image_folder(config.data, ImageTransform::train(config.crop));
  const auto& items = source->items();
  const uint64_t total = items.size() * config.epochs;
  std::atomic<uint64_t> next{0}, done{0}, errors{0}, skipped{0};
  std::atomic<bool> failed{false};
  std::mutex failure_mutex;
  std::string failure;
  Progress progress("ceiling", total, config.progress);
  const double t0 = now_seconds();
  const double cpu0 = process_cpu_seconds();
  {
    std::vector<std::jthread> threads;
    for (size_t w = 0; w < config.workers; ++w) {
      threads.emplace_back([&] {
        UserJpegDecoder decoder;
        std::vector<uint8_t> file, pixels;
        for (uint64_t i = next++; i < total && !failed; i = next++) {
          for (size_t attempt = 0;; ++attempt) {
            const ImageItem& item = items[(i + attempt) % items.size()];
            try {
              read_file(item.path, file);
              int width = 0, height = 0;
              decoder.decode(file, pixels, width, height);
              break;
            } catch (const std::exception& e) {
              errors++;
              const bool give_up = !config.skip || attempt + 1 > kMaxSubstitutes;
              if (!give_up) {
                skipped++;
                continue;
              }
              std::lock_guard<std::mutex> lock(failure_mutex);
              if (!failed.exchange(true)) failure = reference_error("ceiling", item.path, e.what());
              break;
            }
          }
          done++;
        }
      });
    }
    while (done.load() < total && !failed) {
      progress.update(done.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  progress.finish(done.load());
  if (failed) throw std::runtime_error(failure);
  RunResult r;
  r.name = "ceiling";
  r.data = config.data;
  r.timeline = progress.take_timeline();
  r.workers = config.workers;
  r.images = total;
  r.seconds = now_seconds() - t0;
  r.cpu_seconds = process_cpu_seconds() - cpu0;
  r.active_workers = config.workers;
  r.images_per_s = total / r.seconds;
  r.errors = errors;
  r.skipped = skipped;
  return r;
}

}  // namespace

UserJpegDecoder::UserJpegDecoder() : handle_(tjInitDecompress()) {
  if (handle_ == nullptr) throw std::runtime_error("tjInitDecompress failed");
}

UserJpegDecoder::~UserJpegDecoder() { tjDestroy(handle_); }

void UserJpegDecoder::decode(const std::vector<uint8_t>& file, std::vector<uint8_t>& rgb,
                             int& width, int& height) {
  int sub = 0, colorspace = 0;
  if (tjDecompressHeader3(handle_, file.data(), file.size(), &width, &height, &sub, &colorspace) !=
      0) {
    throw std::runtime_error(tjGetErrorStr2(handle_));
  }
  const size_t pixels = static_cast<size_t>(width) * static_cast<size_t>(height);
  rgb.resize(pixels * 3);
  if (colorspace != TJCS_CMYK && colorspace != TJCS_YCCK) {
    if (tjDecompress2(handle_, file.data(), file.size(), rgb.data(), width, 0, height, TJPF_RGB,
                      0) != 0) {
      throw std::runtime_error(tjGetErrorStr2(handle_));
    }
    return;
  }
  cmyk_.resize(pixels * 4);
  if (tjDecompress2(handle_, file.data(), file.size(), cmyk_.data(), width, 0, height, TJPF_CMYK,
                    0) != 0) {
    throw std::runtime_error(tjGetErrorStr2(handle_));
  }
  const unsigned flip = has_adobe_marker(file) ? 0 : 255;  // plain CMYK: invert first
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* p = &cmyk_[4 * i];
    const unsigned k = p[3] ^ flip;
    rgb[3 * i] = static_cast<uint8_t>((p[0] ^ flip) * k / 255);
    rgb[3 * i + 1] = static_cast<uint8_t>((p[1] ^ flip) * k / 255);
    rgb[3 * i + 2] = static_cast<uint8_t>((p[2] ^ flip) * k / 255);
  }
}

std::string reference_error(const std::string& name, const std::string& path,
                            const std::string& what) {
  return name + " reference: " + path + ": " + what;
}

RunResult run_torch_loader(const std::string& name, const BenchConfig& config);

RunResult run_reference(const std::string& name, const BenchConfig& config) {
  if (name == "ceiling") return run_ceiling(config);
  RunResult r = run_torch_loader(name, config);
  r.data = config.data;
  return r;
}

}  // namespace conveyor::bench
