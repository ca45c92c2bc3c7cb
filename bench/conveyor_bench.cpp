// conveyor-bench: Conveyor's throughput on an image dataset, with reference runs in the same
// process on the same files and threads, so every figure is a ratio against something real.
//
//   conveyor-bench [--data SOURCE | --dataset photos|mixed | --generate N] [--batch-size 256]
//                  [--workers W|auto] [--max-workers M] [--epochs 2] [--rounds 3] [--crop 224]
//                  [--device cpu|cuda[:i]]
//                  [--compare ceiling,...] [--reference-data NAME=SOURCE ...]
//                  [--on-error raise|skip] [--json FILE] [--plot FILE.svg|FILE.png]
//                  [--generate-only]
//
// SOURCE is an ImageFolder or WebDataset tar shards (ImageSource::tar_shards: local paths,
// file:// or http(s):// URLs, pipe:COMMAND, brace patterns, comma-separated; an existing file or
// folder is that path, literally). Without --data it generates (once, cached) the photo-like
// default dataset, or with --dataset mixed the same photos
// with a few percent gray, CMYK, YCCK, progressive and 4:4:4 files. Each --reference-data adds a
// run "conveyor:NAME", Conveyor with the same options on another source (the same images as shards,
// over HTTP, or as a folder), in the same rounds as the other references. The references that
// read files (ceiling, torch, torch-fused, naive) read the first --reference-data that is a
// folder, else --data: so one run compares Conveyor on files prepared with conveyor-prepare
// --restart against the ceiling on the originals.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_cli.h"
#include "bench_runs.h"
#include "conveyor/conveyor.h"
#include "plot.h"

namespace conveyor::bench {
namespace {

// Reads every image (every local shard) once so that every run, Conveyor's (timed first) and the
// references', finds the files in the page cache: otherwise the first run after a build pays the
// disk alone. HTTP shards are left to the server (whose files, on loopback, are local anyway).
void warm_page_cache(const std::string& data) {
  std::vector<uint8_t> bytes;
  uint64_t total = 0;
  size_t files = 0;
  if (source_kind(data) == SourceKind::kImageFolder) {
    auto source = ImageSource::image_folder(data, ImageTransform::train());
    for (const auto& item : source->items()) {
      try {
        read_file(item.path, bytes);
        total += bytes.size();
        ++files;
      } catch (const std::exception&) {
        // unreadable files are the runs' business, reported there
      }
    }
    std::cerr << "conveyor-bench: read " << files << " files (" << total / 1000000
              << " MB) once to warm the page cache\n";
    return;
  }
  size_t remote = 0;
  bytes.resize(1 << 20);
  for (const ShardLocation& shard : shard_locations(data)) {
    if (shard.kind != ShardLocation::Kind::kLocal) {
      ++remote;
      continue;
    }
    std::ifstream in(shard.location, std::ios::binary);  // unreadable: the runs report it
    while (in.read(reinterpret_cast<char*>(bytes.data()),
                   static_cast<std::streamsize>(bytes.size())) ||
           in.gcount() > 0) {
      total += static_cast<uint64_t>(in.gcount());
    }
    files += in.eof() ? 1 : 0;
  }
  std::cerr << "conveyor-bench: read " << files << " local shards (" << total / 1000000
            << " MB) once to warm the page cache";
  if (remote > 0) std::cerr << "; " << remote << " HTTP or pipe: shards left to their source";
  std::cerr << "\n";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void print_table(const BenchConfig& c, const std::vector<RunResult>& runs, const RunResult& main) {
  std::printf("\nconveyor-bench  %s  batch %zu  workers %s%zu  crop %d  epochs %zu  rounds %zu\n",
              c.data.c_str(), c.batch_size, c.auto_workers ? "auto, at most " : "", c.workers,
              c.crop, c.epochs, c.rounds);
  std::printf("source: %s%s\n", source_kind_name(source_kind(c.data)).c_str(),
              c.streaming ? ", shards streamed" : "");
  for (const auto& r : runs) {
    if (r.name == "conveyor") continue;
    std::printf("  %-16s reads %s: %s\n", r.name.c_str(),
                source_kind_name(source_kind(r.data)).c_str(), r.data.c_str());
  }
  std::printf("mode: %s\n", main.mode.c_str());
  std::printf("%-18s %12s %10s %8s %8s %16s %18s\n", "run", "images/s", "images", "errors",
              "skipped", "conveyor / run", "(rounds min..max)");
  for (const auto& r : runs) {
    std::printf("%-18s %12.1f %10llu %8llu %8llu", r.name.c_str(), r.images_per_s,
                static_cast<unsigned long long>(r.images),
                static_cast<unsigned long long>(r.errors),
                static_cast<unsigned long long>(r.skipped));
    if (r.name == "conveyor") {
      std::printf(" %15.2fx\n", 1.0);
      continue;
    }
    const auto [lo, hi] = std::minmax_element(r.ratios.begin(), r.ratios.end());
    std::printf(" %15.2fx %11.2f..%.2f\n", median(r.ratios), *lo, *hi);
  }
  std::printf("(images/s: median over rounds; a ratio: the median of each round's ratio)\n");
  std::printf("errors %llu  skipped %llu  consumer waited %.1f%%  p50 %.1f ms  p99 %.1f ms\n",
              static_cast<unsigned long long>(main.errors),
              static_cast<unsigned long long>(main.skipped), 100.0 * main.wait_fraction,
              main.p50_ms, main.p99_ms);
  std::printf("CPU %.1f s over %.1f s (%.2f cores)  active workers %zu of %zu%s\n",
              main.cpu_seconds, main.seconds, main.cpu_seconds / std::max(1e-9, main.seconds),
              main.active_workers, c.workers, c.auto_workers ? " (auto)" : "");
  const GpuDecodeStats& g = main.gpu_decode;
  if (g.active) {
    std::printf(
        "GPU decode: %s; %.1f%% of the images on the GPU (%llu), %llu on the CPU (%llu refused "
        "there), %llu failed batches; decode thread busy %.1f s, idle %.1f s; workers idle %.1f "
        "s\n",
        g.status.c_str(), 100.0 * g.gpu_share(), static_cast<unsigned long long>(g.gpu_images),
        static_cast<unsigned long long>(g.cpu_images), static_cast<unsigned long long>(g.refused),
        static_cast<unsigned long long>(g.failed_batches), g.gpu_busy_seconds, g.gpu_idle_seconds,
        g.cpu_idle_seconds);
  } else if (g.status != "off") {
    std::printf("%s\n", g.status.c_str());  // why it did not run
  }
  for (const auto& [k, v] : main.extra) std::printf("%s %.3f\n", k.c_str(), v);
  if (!main.scale_shares.empty()) {
    std::printf("DCT scale share:");
    for (const auto& [m, share] : main.scale_shares) std::printf("  %d/8 %.0f%%", m, 100 * share);
    std::printf("\n");
  }
}

// A run's active workers over time: [{"batch", "seconds", "workers"}, ...] (RunResult).
nlohmann::ordered_json history_json(const RunResult& r) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ActiveWorkers& a : r.active_workers_history) {
    out.push_back({{"batch", a.batch}, {"seconds", a.seconds}, {"workers", a.workers}});
  }
  return out;
}

// A run's split between the decoders (RunResult::gpu_decode).
nlohmann::ordered_json gpu_decode_json(const GpuDecodeStats& g) {
  return {{"active", g.active},
          {"status", g.status},
          {"gpu_images", g.gpu_images},
          {"cpu_images", g.cpu_images},
          {"gpu_share", g.gpu_share()},
          {"refused", g.refused},
          {"failed_batches", g.failed_batches},
          {"gpu_busy_seconds", g.gpu_busy_seconds},
          {"gpu_idle_seconds", g.gpu_idle_seconds},
          {"cpu_idle_seconds", g.cpu_idle_seconds},
          {"cpu_ns_per_image", g.cpu_ns_per_image},
          {"gpu_ns_per_image", g.gpu_ns_per_image}};
}

// The figures as JSON: flat keys for the table's figures (Conveyor's, then each reference's
// under its name), and "runs", every run's details, which --plot draws (bench/plot.py).
nlohmann::ordered_json figures(const BenchConfig& c, const std::vector<RunResult>& runs,
                               const RunResult& main, const std::vector<std::string>& caption) {
  nlohmann::ordered_json j;
  j["data"] = c.data;
  j["source"] = source_kind_name(source_kind(c.data));
  j["streaming"] = c.streaming;
  j["device"] = main.device;
  j["mode"] = main.mode;
  j["batch_size"] = c.batch_size;
  j["workers"] = c.workers;
  j["auto_workers"] = c.auto_workers;
  j["active_workers"] = main.active_workers;
  j["active_workers_history"] = history_json(main);
  j["gpu_decode_mode"] = c.gpu_decode;
  j["gpu_decode"] = gpu_decode_json(main.gpu_decode);
  j["epochs"] = c.epochs;
  j["rounds"] = c.rounds;
  j["crop"] = c.crop;
  j["images"] = main.images;
  j["seconds"] = main.seconds;
  j["images_per_s"] = main.images_per_s;
  j["images_per_s_rounds"] = main.round_images_per_s;
  j["cpu_seconds"] = main.cpu_seconds;
  j["errors"] = main.errors;
  j["skipped"] = main.skipped;
  j["pinned_bytes"] = main.pinned_bytes;
  j["p50_batch_ms"] = main.p50_ms;
  j["p99_batch_ms"] = main.p99_ms;
  j["consumer_wait_fraction"] = main.wait_fraction;
  for (const auto& [k, v] : main.extra) j[k] = v;
  for (const auto& [m, share] : main.scale_shares) {
    j["scale_" + std::to_string(m) + "_share"] = share;
  }
  for (const auto& [stage, seconds] : main.time_split) j["time_" + stage + "_seconds"] = seconds;
  nlohmann::ordered_json details = nlohmann::ordered_json::array();
  for (const auto& r : runs) {
    const double ratio = r.name == "conveyor" ? 1.0 : median(r.ratios);
    details.push_back({{"name", r.name},
                       {"data", r.data},
                       {"images", r.images},
                       {"seconds", r.seconds},
                       {"images_per_s", r.images_per_s},
                       {"ratio", ratio},
                       {"p50_batch_ms", r.p50_ms},
                       {"p99_batch_ms", r.p99_ms},
                       {"workers", r.workers},
                       {"cpu_seconds", r.cpu_seconds},
                       {"active_workers", r.active_workers},
                       {"active_workers_history", history_json(r)},
                       {"gpu_decode", gpu_decode_json(r.gpu_decode)},
                       {"timeline", r.timeline},
                       {"batch_ms", r.batch_ms},
                       {"time_split", r.time_split}});
    if (r.name == "conveyor") continue;
    std::string key = r.name;
    std::replace(key.begin(), key.end(), '-', '_');
    std::replace(key.begin(), key.end(), ':', '_');
    j[key + "_data"] = r.data;
    j[key + "_source"] = source_kind_name(source_kind(r.data));
    j[key + "_images"] = r.images;
    j[key + "_images_per_s"] = r.images_per_s;
    j[key + "_images_per_s_rounds"] = r.round_images_per_s;
    j[key + "_cpu_seconds"] = r.cpu_seconds;
    j[key + "_ratio"] = ratio;
    const auto [lo, hi] = std::minmax_element(r.ratios.begin(), r.ratios.end());
    j[key + "_ratio_min"] = *lo;
    j[key + "_ratio_max"] = *hi;
    j[key + "_errors"] = r.errors;
    j[key + "_skipped"] = r.skipped;
  }
  j["cuda_available"] = cuda_available();
  j["caption"] = caption;
  j["runs"] = std::move(details);
  return j;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
}

// The plot's caption: the command, the configuration, the machine and the date (UTC).
std::vector<std::string> plot_caption(int argc, char** argv, const BenchConfig& c,
                                      const RunResult& main) {
  std::string command = "conveyor-bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  char config[256];
  std::snprintf(config, sizeof config,
                "batch %zu, %s%zu workers, crop %d, %zu epochs x %zu rounds, device %s, %s",
                c.batch_size, c.auto_workers ? "auto, at most " : "", c.workers, c.crop, c.epochs,
                c.rounds, main.device.c_str(), main.mode.c_str());
  return {command, std::string(config),
          std::string(host) + ", " + std::to_string(std::thread::hardware_concurrency()) +
              " hardware threads, " + date + "; data " + c.data};
}

}  // namespace
}  // namespace conveyor::bench

int main(int argc, char** argv) {
  using namespace conveyor::bench;
  try {
    BenchConfig config = parse_command_line(argc, argv);
    config.progress = ::isatty(STDERR_FILENO) != 0;
    std::vector<std::pair<std::string, std::string>> sources{{"--data", config.data}};
    for (const auto& ref : config.reference_data) {
      sources.emplace_back("--reference-data " + ref.name, ref.data);
    }
    std::set<std::string> warmed;
    for (const auto& [option, data] : sources) {
      try {
        if (warmed.insert(data).second) warm_page_cache(data);
      } catch (const std::exception& e) {
        throw std::runtime_error(option + " " + data + ": " + e.what());
      }
    }
    // A run's errors say which run and which source failed.
    auto named = [](const std::string& name, const std::string& data, auto run) {
      try {
        return run();
      } catch (const std::exception& e) {
        throw std::runtime_error(name + " on " + data + ": " + e.what());
      }
    };
    // The references, in table order: Conveyor on each --reference-data, Conveyor without GPU
    // decode (--compare cpu-decode), Conveyor without the discard hook (--compare no-discard),
    // Conveyor without the own entropy decoder (--compare stock-entropy), then --compare's runs on
    // the reference folder.
    std::vector<std::function<RunResult()>> references;
    for (const auto& ref : config.reference_data) {
      BenchConfig c = config;
      c.data = ref.data;
      const std::string name = "conveyor:" + ref.name;
      references.push_back(
          [=] { return named(name, c.data, [&] { return run_conveyor(c, name); }); });
    }
    if (config.cpu_decode_reference) {
      BenchConfig c = config;
      c.gpu_decode = "off";
      const std::string name = "conveyor:cpu-decode";
      references.push_back(
          [=] { return named(name, c.data, [&] { return run_conveyor(c, name); }); });
    }
    if (config.no_discard_reference) {
      BenchConfig c = config;
      c.discard_outside_crop = false;
      const std::string name = "conveyor:no-discard";
      references.push_back(
          [=] { return named(name, c.data, [&] { return run_conveyor(c, name); }); });
    }
    if (config.stock_entropy_reference) {
      BenchConfig c = config;
      c.own_entropy_decoder = false;
      const std::string name = "conveyor:stock-entropy";
      references.push_back(
          [=] { return named(name, c.data, [&] { return run_conveyor(c, name); }); });
    }
    for (const auto& name : config.compare) {
      BenchConfig c = config;
      c.data = config.reference_folder;
      references.push_back(
          [=] { return named(name, c.data, [&] { return run_reference(name, c); }); });
    }
    // Rounds interleave Conveyor and the references so that a slow spell of the machine (shared
    // VMs drift by 15%) hits both sides of a ratio alike.
    std::vector<RunResult> mains;
    std::vector<std::vector<RunResult>> refs(references.size());
    for (size_t round = 0; round < config.rounds; ++round) {
      if (config.rounds > 1) std::cerr << "conveyor-bench: round " << round + 1 << "\n";
      mains.push_back(named("conveyor", config.data, [&] { return run_conveyor(config); }));
      if (round == 0) {
        // The GPU figures (copy stage, overlap) read a folder: --data's, or the reference folder.
        BenchConfig c = config;
        c.data = config.reference_folder;
        if (!c.data.empty()) {
          add_gpu_figures(c, mains.back());
        } else if (config.device.rfind("cuda", 0) == 0) {
          std::cerr << "conveyor-bench: no GPU figures (h2d, overlap): they read a folder; give "
                       "one with --reference-data NAME=DIR\n";
        }
      }
      for (size_t i = 0; i < references.size(); ++i) refs[i].push_back(references[i]());
    }
    auto median_run = [](std::vector<RunResult> all) {
      std::vector<double> rounds;
      for (const auto& x : all) rounds.push_back(x.images_per_s);
      std::sort(all.begin(), all.end(), [](const RunResult& a, const RunResult& b) {
        return a.images_per_s < b.images_per_s;
      });
      RunResult r = all[all.size() / 2];
      std::vector<double> rates;
      for (const auto& x : all) rates.push_back(x.images_per_s);
      r.images_per_s = median(rates);
      r.round_images_per_s = rounds;
      return r;
    };
    RunResult main_run = median_run(mains);
    main_run.extra.insert(mains.front().extra.begin(), mains.front().extra.end());
    std::vector<RunResult> runs{main_run};
    for (size_t i = 0; i < references.size(); ++i) {
      RunResult r = median_run(refs[i]);
      for (size_t k = 0; k < config.rounds; ++k) {
        r.ratios.push_back(
            refs[i][k].images_per_s > 0 ? mains[k].images_per_s / refs[i][k].images_per_s : 0);
      }
      // Epoch 1 and the later epochs apart against the ceiling, per round (the entropy index
      // of the own decoder fills during epoch 1; every epoch of the ceiling decodes alike).
      if (refs[i].front().name == "ceiling" && config.epochs > 1) {
        for (const char* key : {"epoch1_images_per_s", "later_epochs_images_per_s"}) {
          std::vector<double> ratios;
          for (size_t k = 0; k < config.rounds; ++k) {
            const auto it = mains[k].extra.find(key);
            if (it != mains[k].extra.end() && refs[i][k].images_per_s > 0) {
              ratios.push_back(it->second / refs[i][k].images_per_s);
            }
          }
          if (!ratios.empty()) {
            const std::string name = std::string(key).substr(0, std::string(key).find("_images"));
            runs.front().extra[name + "_over_ceiling"] = median(ratios);
          }
        }
      }
      runs.push_back(r);
    }
    main_run.extra = runs.front().extra;
    print_table(config, runs, main_run);
    const std::string json =
        figures(config, runs, main_run, plot_caption(argc, argv, config, main_run)).dump(2) + "\n";
    if (!config.json.empty()) write_text(config.json, json);
    if (!config.plot.empty()) {
      // The plot is drawn from the JSON: --json's file, or one beside the plot, removed after.
      const std::string from = config.json.empty() ? config.plot + ".json" : config.json;
      if (config.json.empty()) write_text(from, json);
      try {
        write_plot(config.plot, from);
      } catch (...) {
        if (config.json.empty()) std::filesystem::remove(from);
        throw;
      }
      if (config.json.empty()) std::filesystem::remove(from);
      std::cerr << "conveyor-bench: wrote " << config.plot << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "conveyor-bench: error: " << e.what() << "\n";
    return 1;
  }
}
