// conveyor-bench: Conveyor's throughput on an image dataset, with reference runs in the same
// process on the same files and threads, so every figure is a ratio against something real.
//
//   conveyor-bench [--data SOURCE | --dataset photos|mixed | --generate N] [--batch-size 256]
//                  [--workers W] [--epochs 2] [--rounds 3] [--crop 224] [--device cpu|cuda[:i]]
//                  [--compare ceiling,...] [--reference-data NAME=SOURCE ...]
//                  [--on-error raise|skip] [--json FILE] [--plot FILE.svg|FILE.png]
//                  [--generate-only]
//
// SOURCE is an ImageFolder or WebDataset tar shards (ImageSource::tar_shards: local paths,
// file:// or http(s):// URLs, pipe:COMMAND, brace patterns, comma-separated). Without --data it
// generates (once, cached) the photo-like default dataset, or with --dataset mixed the same photos
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
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_runs.h"
#include "cache_dir.h"
#include "conveyor/conveyor.h"
#include "plot.h"

namespace conveyor::bench {
namespace {

[[noreturn]] void usage(const std::string& error) {
  if (!error.empty()) std::cerr << "conveyor-bench: " << error << "\n\n";
  std::cerr <<
      R"(usage: conveyor-bench [options]
  --data SOURCE       what Conveyor reads (default: the generated photo-like dataset): an
                      ImageFolder, or WebDataset tar shards (what conveyor-prepare --format wds
                      writes) when SOURCE ends in .tar, holds {..} braces and .tar, or starts with
                      http://, https://, file:// or pipe: (a command whose output is the shard);
                      several shard patterns comma-separated (outside braces and quotes), e.g.
                      http://host:8080/train-{000000..000009}.tar or
                      "pipe:aws s3 cp s3://bucket/train-{000000..000009}.tar -" (pipe: shards,
                      and shards without an index, are always streamed; a server that ignores
                      Range needs --streaming)
  --generate N        generate (once, cached) a photo-like dataset of about N images and use it
  --dataset KIND      the generated dataset: photos (default: all baseline 4:2:0 YCbCr) or mixed
                      (ImageNet-like: a few percent each of gray, CMYK, YCCK, progressive, 4:4:4)
  --batch-size B      images per batch (default 256)
  --workers W         decoding threads (default: all cores)
  --epochs E          epochs to time (default 2)
  --rounds R          run Conveyor and each reference R times, interleaved; report the median
                      of the per-round ratios (default 3)
  --crop S            RandomResizedCrop output size (default 224)
  --device D          cpu or cuda[:index] (default: cuda if a GPU is usable, else cpu)
  --compare LIST      reference runs, comma-separated: ceiling, torch, torch-fused, naive, all;
                      they read image files from a folder: the first --reference-data whose
                      SOURCE is a folder, else --data (which must then be a folder)
  --reference-data NAME=SOURCE
                      (repeatable) one more reference run, "conveyor:NAME": Conveyor itself with
                      the same options on SOURCE (a folder or shards, as for --data), in the same
                      rounds as the other references
  --on-error P        raise (default) or skip
  --streaming         read tar shards in streaming mode (whole shards in order through a shuffle
                      buffer of 1000) instead of at random through their index
  --json FILE         also write the figures as JSON
  --plot FILE         also draw them: FILE.svg (or FILE.png, through rsvg-convert) shows
                      images/s over time for every run, the per-batch latency distribution, and
                      where Conveyor's time goes (read, decode, resize, copy, consumer wait)
  --generate-only     generate the dataset if needed (--generate, --dataset), print its folder on
                      stdout and exit
)";
  std::exit(error.empty() ? 0 : 2);
}

BenchConfig parse(int argc, char** argv) {
  BenchConfig c;
  c.workers = std::max(1u, std::thread::hardware_concurrency());
  c.device = cuda_available() ? "cuda" : "cpu";
  size_t generate = 1500;
  bool mixed = false;
  bool generate_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + a);
      return argv[++i];
    };
    auto number = [&](const std::string& v) -> size_t {
      char* end = nullptr;
      unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n == 0) usage(a + " needs a positive integer");
      return static_cast<size_t>(n);
    };
    if (a == "--help" || a == "-h")
      usage("");
    else if (a == "--data")
      c.data = value();
    else if (a == "--generate-only")
      generate_only = true;
    else if (a == "--reference-data") {
      const std::string v = value();
      const size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == v.size()) {
        usage("--reference-data takes NAME=SOURCE, got '" + v + "'");
      }
      ReferenceData ref{v.substr(0, eq), v.substr(eq + 1)};
      for (char ch : ref.name) {
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-') {
          usage("--reference-data NAME '" + ref.name + "': letters, digits, _ and - only");
        }
      }
      for (const auto& other : c.reference_data) {
        if (other.name == ref.name) usage("--reference-data " + ref.name + " given twice");
      }
      c.reference_data.push_back(ref);
    } else if (a == "--generate")
      generate = number(value());
    else if (a == "--dataset") {
      std::string kind = value();
      if (kind != "photos" && kind != "mixed") usage("--dataset takes photos or mixed");
      mixed = kind == "mixed";
    } else if (a == "--batch-size")
      c.batch_size = number(value());
    else if (a == "--workers")
      c.workers = number(value());
    else if (a == "--epochs")
      c.epochs = number(value());
    else if (a == "--rounds")
      c.rounds = std::max<size_t>(1, number(value()));
    else if (a == "--crop")
      c.crop = static_cast<int>(number(value()));
    else if (a == "--device")
      c.device = value();
    else if (a == "--json")
      c.json = value();
    else if (a == "--plot") {
      c.plot = value();
      const auto dot = c.plot.rfind('.');
      const std::string ext = dot == std::string::npos ? "" : c.plot.substr(dot);
      if (ext != ".svg" && ext != ".png") usage("--plot takes FILE.svg or FILE.png");
    } else if (a == "--streaming")
      c.streaming = true;
    else if (a == "--on-error") {
      std::string p = value();
      if (p != "raise" && p != "skip") usage("--on-error takes raise or skip");
      c.skip = p == "skip";
    } else if (a == "--compare") {
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) {
        if (item == "all") {
          c.compare = {"ceiling", "torch", "torch-fused", "naive"};
        } else if (item == "ceiling" || item == "torch" || item == "torch-fused" ||
                   item == "naive") {
          c.compare.push_back(item);
        } else {
          usage("unknown --compare run '" + item + "'");
        }
      }
    } else {
      usage("unknown option " + a);
    }
  }
  if (generate_only && !c.data.empty()) usage("--generate-only generates; drop --data");
  if (c.data.empty()) {
    GeneratorOptions g;
    g.classes = 10;
    g.images_per_class = std::max<size_t>(1, (generate + 9) / 10);
    g.mixed = mixed;
    c.data =
        mixed ? mixed_dataset_dir(g.images_per_class) : default_dataset_dir(g.images_per_class);
    std::cerr << "conveyor-bench: dataset " << c.data << "\n";
    auto t0 = std::chrono::steady_clock::now();
    GeneratedDataset d = generate_image_folder(c.data, g);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << "conveyor-bench: " << (d.reused ? "reusing" : "generated") << " " << d.images
              << (mixed ? " mixed" : "") << " photo-like JPEGs, "
              << d.bytes / std::max<size_t>(1, d.images) / 1000 << " kB average"
              << (d.reused ? "" : " in " + std::to_string(s) + " s") << "\n";
    if (generate_only) {
      std::cout << c.data << "\n";
      std::exit(0);
    }
  }
  // The references (ceiling, torch, ...) read the first folder among --reference-data, so that
  // one run can compare Conveyor on prepared files with the ceiling on the originals; without
  // one, they read --data when it is a folder.
  for (const auto& ref : c.reference_data) {
    if (source_kind(ref.data) == SourceKind::kImageFolder) {
      c.reference_folder = ref.data;
      break;
    }
  }
  if (c.reference_folder.empty() && source_kind(c.data) == SourceKind::kImageFolder) {
    c.reference_folder = c.data;
  }
  if (c.reference_folder.empty() && !c.compare.empty()) {
    usage("--compare " + c.compare.front() +
          " reads image files from a folder, but --data is tar shards (" +
          source_kind_name(source_kind(c.data)) +
          "): add --reference-data NAME=DIR with an ImageFolder of the same images (e.g. the "
          "folder conveyor-prepare made the shards from), or drop --compare");
  }
  return c;
}

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
  for (const ShardLocation& shard : expand_shard_locations(shard_patterns(data))) {
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
  std::printf("\nconveyor-bench  %s  batch %zu  workers %zu  crop %d  epochs %zu  rounds %zu\n",
              c.data.c_str(), c.batch_size, c.workers, c.crop, c.epochs, c.rounds);
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
  for (const auto& [k, v] : main.extra) std::printf("%s %.3f\n", k.c_str(), v);
  if (!main.scale_shares.empty()) {
    std::printf("DCT scale share:");
    for (const auto& [m, share] : main.scale_shares) std::printf("  %d/8 %.0f%%", m, 100 * share);
    std::printf("\n");
  }
}

void write_json(const BenchConfig& c, const std::vector<RunResult>& runs, const RunResult& main) {
  std::ofstream out(c.json);
  if (!out) throw std::runtime_error("cannot write " + c.json);
  out << "{\n";
  auto field = [&](const std::string& k, const std::string& v, bool last = false) {
    out << "  \"" << k << "\": " << v << (last ? "\n" : ",\n");
  };
  auto str = [](const std::string& s) {
    std::string o = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') o += '\\';
      o += ch;
    }
    return o + "\"";
  };
  auto list = [](const std::vector<double>& v) {
    std::string o = "[";
    for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
    return o + "]";
  };
  field("data", str(c.data));
  field("source", str(source_kind_name(source_kind(c.data))));
  field("streaming", c.streaming ? "true" : "false");
  field("device", str(main.device));
  field("mode", str(main.mode));
  field("batch_size", std::to_string(c.batch_size));
  field("workers", std::to_string(c.workers));
  field("epochs", std::to_string(c.epochs));
  field("rounds", std::to_string(c.rounds));
  field("crop", std::to_string(c.crop));
  field("images", std::to_string(main.images));
  field("seconds", std::to_string(main.seconds));
  field("images_per_s", std::to_string(main.images_per_s));
  field("images_per_s_rounds", list(main.round_images_per_s));
  field("errors", std::to_string(main.errors));
  field("skipped", std::to_string(main.skipped));
  field("pinned_bytes", std::to_string(main.pinned_bytes));
  field("p50_batch_ms", std::to_string(main.p50_ms));
  field("p99_batch_ms", std::to_string(main.p99_ms));
  field("consumer_wait_fraction", std::to_string(main.wait_fraction));
  for (const auto& [k, v] : main.extra) field(k, std::to_string(v));
  for (const auto& [m, share] : main.scale_shares) {
    field("scale_" + std::to_string(m) + "_share", std::to_string(share));
  }
  for (const auto& [stage, seconds] : main.time_split) {
    field("time_" + stage + "_seconds", std::to_string(seconds));
  }
  for (const auto& r : runs) {
    if (r.name == "conveyor") continue;
    std::string key = r.name;
    std::replace(key.begin(), key.end(), '-', '_');
    std::replace(key.begin(), key.end(), ':', '_');
    field(key + "_data", str(r.data));
    field(key + "_source", str(source_kind_name(source_kind(r.data))));
    field(key + "_images", std::to_string(r.images));
    field(key + "_images_per_s", std::to_string(r.images_per_s));
    field(key + "_images_per_s_rounds", list(r.round_images_per_s));
    field(key + "_ratio", std::to_string(median(r.ratios)));
    const auto [lo, hi] = std::minmax_element(r.ratios.begin(), r.ratios.end());
    field(key + "_ratio_min", std::to_string(*lo));
    field(key + "_ratio_max", std::to_string(*hi));
    field(key + "_errors", std::to_string(r.errors));
    field(key + "_skipped", std::to_string(r.skipped));
  }
  field("cuda_available", cuda_available() ? "true" : "false", true);
  out << "}\n";
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
                "batch %zu, %zu workers, crop %d, %zu epochs x %zu rounds, device %s, %s",
                c.batch_size, c.workers, c.crop, c.epochs, c.rounds, main.device.c_str(),
                main.mode.c_str());
  return {command, std::string(config),
          std::string(host) + ", " + std::to_string(std::thread::hardware_concurrency()) +
              " hardware threads, " + date + "; data " + c.data};
}

}  // namespace
}  // namespace conveyor::bench

int main(int argc, char** argv) {
  using namespace conveyor::bench;
  try {
    BenchConfig config = parse(argc, argv);
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
    // The references, in table order: Conveyor on each --reference-data, then --compare's runs on
    // the reference folder.
    std::vector<std::function<RunResult()>> references;
    for (const auto& ref : config.reference_data) {
      BenchConfig c = config;
      c.data = ref.data;
      const std::string name = "conveyor:" + ref.name;
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
      runs.push_back(r);
    }
    print_table(config, runs, main_run);
    if (!config.json.empty()) write_json(config, runs, main_run);
    if (!config.plot.empty()) {
      write_plot(config.plot, runs, plot_caption(argc, argv, config, main_run));
      std::cerr << "conveyor-bench: wrote " << config.plot << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "conveyor-bench: error: " << e.what() << "\n";
    return 1;
  }
}
