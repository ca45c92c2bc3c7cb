// conveyor-bench's command line (bench_cli.h).
#include "bench_cli.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "cache_dir.h"
#include "conveyor/conveyor.h"
#include "plot.h"
#include "synthetic.h"

namespace conveyor::bench {
namespace {

[[noreturn]] void usage_error(const CLI::App& app, const std::string& error) {
  std::cerr << "conveyor-bench: " << error << "\n\n" << app.help();
  std::exit(2);
}

// --reference-data NAME=SOURCE, with NAME of letters, digits, _ and -: what is wrong with
// `text`, or nothing.
std::string reference_problem(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    return "--reference-data takes NAME=SOURCE, got '" + text + "'";
  }
  for (char ch : text.substr(0, eq)) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-') {
      return "--reference-data NAME '" + text.substr(0, eq) + "': letters, digits, _ and - only";
    }
  }
  return {};
}

// Generates (once, cached) the photo-like dataset of about `images` images; returns its folder.
std::string generated_dataset(size_t images, bool mixed) {
  GeneratorOptions g;
  g.classes = 10;
  g.images_per_class = std::max<size_t>(1, (images + 9) / 10);
  g.mixed = mixed;
  const std::string root =
      mixed ? mixed_dataset_dir(g.images_per_class) : default_dataset_dir(g.images_per_class);
  std::cerr << "conveyor-bench: dataset " << root << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  const GeneratedDataset d = generate_image_folder(root, g);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << "conveyor-bench: " << (d.reused ? "reusing" : "generated") << " " << d.images
            << (mixed ? " mixed" : "") << " photo-like JPEGs, "
            << d.bytes / std::max<size_t>(1, d.images) / 1000 << " kB average"
            << (d.reused ? "" : " in " + std::to_string(s) + " s") << "\n";
  return root;
}

}  // namespace

BenchConfig parse_command_line(int argc, char** argv) {
  BenchConfig c;
  c.workers = std::max(1u, std::thread::hardware_concurrency());
  c.device = cuda_available() ? "cuda" : "cpu";
  size_t generate = 1500;
  std::string dataset = "photos";
  std::string on_error = "raise";
  std::vector<std::string> compare, references;
  bool generate_only = false;
  std::optional<size_t> max_workers;

  CLI::App app(
      "conveyor-bench: Conveyor's throughput on an image dataset, with reference runs in\n"
      "the same process on the same files and threads, so every figure is a ratio\n"
      "against something real.",
      "conveyor-bench");
  app.get_formatter()->column_width(24);
  // A scalar option given twice takes its last value, as before CLI11 and as with most Unix
  // tools; the lists (--compare, --reference-data) keep every value.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option(
         "--data", c.data,
         "what Conveyor reads (default: the generated photo-like dataset): an ImageFolder, or\n"
         "WebDataset tar shards (what conveyor-prepare --format wds writes) when SOURCE ends in\n"
         ".tar, holds {..} braces and .tar, or starts with http://, https://, file:// or pipe: (a\n"
         "command whose output is the shard); several shard patterns comma-separated (outside\n"
         "braces and quotes), e.g. http://host:8080/train-{000000..000009}.tar or\n"
         "\"pipe:aws s3 cp s3://bucket/train-{000000..000009}.tar -\" (pipe: shards, and shards\n"
         "without an index, are always streamed; a server that ignores Range needs --streaming).\n"
         "A SOURCE that names an existing file or folder is that path, literally.")
      ->type_name("SOURCE");
  app.add_option("--generate", generate,
                 "generate (once, cached) a photo-like dataset of about N images and use it")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  app.add_option("--dataset", dataset,
                 "the generated dataset: photos (default: all baseline 4:2:0 YCbCr) or mixed\n"
                 "(ImageNet-like: a few percent each of gray, CMYK, YCCK, progressive, 4:4:4)")
      ->type_name("KIND")
      ->check(CLI::IsMember({"photos", "mixed"}));
  app.add_option("--batch-size", c.batch_size, "images per batch (default 256)")
      ->type_name("B")
      ->check(CLI::PositiveNumber);
  // --workers W or auto, read here once: auto is BenchConfig::auto_workers, W is workers.
  app.add_option_function<std::string>(
         "--workers",
         [&c](const std::string& w) {
           size_t n = 0;
           c.auto_workers = w == "auto";
           if (c.auto_workers) return;
           if (!CLI::detail::lexical_cast(w, n) || n == 0) {
             throw CLI::ValidationError("--workers",
                                        "takes a positive number or auto, got '" + w + "'");
           }
           c.workers = n;
         },
         "decoding threads (default: all cores), or auto: Conveyor chooses while it runs how\n"
         "many of --max-workers work (LoaderOptions::workers = kAutoWorkers); the\n"
         "references run --max-workers threads")
      ->type_name("W|auto");
  app.add_option("--max-workers", max_workers,
                 "the budget of --workers auto: the most workers at once (default: all cores)")
      ->type_name("M")
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", c.epochs, "epochs to time (default 2)")
      ->type_name("E")
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", c.rounds,
                 "run Conveyor and each reference R times, interleaved; report the median of the\n"
                 "per-round ratios (default 3)")
      ->type_name("R")
      ->check(CLI::PositiveNumber);
  app.add_option("--crop", c.crop, "RandomResizedCrop output size (default 224)")
      ->type_name("S")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", c.device,
                 "cpu or cuda[:index] (default: cuda if a GPU is usable, else cpu)")
      ->type_name("D");
  app.add_option("--compare", compare,
                 "reference runs, comma-separated: ceiling, torch, torch-fused, naive, all; they\n"
                 "read image files from a folder: the first --reference-data whose SOURCE is a\n"
                 "folder, else --data (which must then be a folder). cpu-decode: Conveyor itself\n"
                 "on --data with --gpu-decode off, beside a --gpu-decode run (not in all).\n"
                 "no-discard: Conveyor itself on --data with the JPEG discard hook off\n"
                 "(DecodeOptions::discard_outside_crop; not in all). stock-entropy: Conveyor\n"
                 "itself on --data without the own entropy decoder (as --stock-entropy)\n"
                 "(not in all)")
      ->type_name("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember({"ceiling", "torch", "torch-fused", "naive", "all", "cpu-decode",
                             "no-discard", "stock-entropy"}));
  app.add_option(
         "--reference-data", references,
         "(repeatable) one more reference run, \"conveyor:NAME\": Conveyor itself with the\n"
         "same options on SOURCE (a folder or shards, as for --data), in the same rounds\n"
         "as the other references")
      ->type_name("NAME=SOURCE")
      ->check(reference_problem, "NAME=SOURCE");
  app.add_option("--on-error", on_error, "raise (default) or skip")
      ->type_name("P")
      ->check(CLI::IsMember({"raise", "skip"}));
  bool stock_entropy = false;
  app.add_flag("--stock-entropy", stock_entropy,
               "Conveyor decodes JPEG scans with libjpeg-turbo's entropy decoder instead of its\n"
               "own (DecodeOptions::own_entropy_decoder off; the same pixels, to compare)");
  app.add_option("--entropy-index-mib", c.entropy_index_mib,
                 "the budget of the per-file entropy index Conveyor's run shares across its\n"
                 "workers, in MiB (JpegEntropyIndex; default 64, 0: none)")
      ->type_name("M");
  app.add_option("--entropy-index-file", c.entropy_index_file,
                 "the entropy index is loaded from PATH at each round's start\n"
                 "(when it exists) and saved there at its end, so that a round, or the next run,\n"
                 "starts indexed (JpegEntropyIndex(budget, file))")
      ->type_name("PATH");
  app.add_flag("--streaming", c.streaming,
               "read tar shards in streaming mode (whole shards in order through a shuffle buffer\n"
               "of 1000) instead of at random through their index");
  app.add_option(
         "--gpu-decode", c.gpu_decode,
         "Conveyor also decodes on the GPU's hardware JPEG engines (nvJPEG; --device cuda):\n"
         "off (default), auto (each chunk to the decoder that drains first), hw-only\n"
         "(every file the hardware takes) or a share in [0, 1] of the samples; where it\n"
         "cannot run, the table's mode line says why")
      ->type_name("MODE")
      ->check(
          [](const std::string& text) {
            try {
              (void)GpuDecode::parse(text);
              return std::string();
            } catch (const std::invalid_argument& e) {
              return std::string(e.what());
            }
          },
          "off|auto|hw-only|SHARE");
  app.add_option("--json", c.json, "also write the figures as JSON")->type_name("FILE");
  app.add_option("--plot", c.plot,
                 "also draw them (matplotlib, from the JSON): FILE.svg or FILE.png shows images/s\n"
                 "over time for every run, the per-batch latency distribution, and where\n"
                 "Conveyor's time goes (read, decode, resize, copy, consumer wait)")
      ->type_name("FILE")
      ->check(
          [](const std::string& path) {
            return is_plot_name(path) ? std::string() : "--plot takes FILE.svg or FILE.png";
          },
          "FILE.svg|FILE.png");
  app.add_flag(
      "--generate-only", generate_only,
      "generate the dataset if needed (--generate, --dataset), print its folder on stdout\n"
      "and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help
      std::cout << app.help();
      std::exit(0);
    }
    usage_error(app, e.what());
  }
  c.own_entropy_decoder = !stock_entropy;

  if (max_workers) {
    if (!c.auto_workers) {
      usage_error(app,
                  "--max-workers is the budget of --workers auto; with a fixed count, give "
                  "--workers W alone");
    }
    c.workers = *max_workers;
  }
  c.skip = on_error == "skip";
  for (const std::string& item : compare) {
    if (item == "all") {
      c.compare = {"ceiling", "torch", "torch-fused", "naive"};
    } else if (item == "cpu-decode") {
      if (GpuDecode::parse(c.gpu_decode).mode == GpuDecode::Mode::kOff) {
        usage_error(app,
                    "--compare cpu-decode is Conveyor with --gpu-decode off, beside a run "
                    "with --gpu-decode auto, hw-only or a share");
      }
      c.cpu_decode_reference = true;
    } else if (item == "no-discard") {
      c.no_discard_reference = true;
    } else if (item == "stock-entropy") {
      if (stock_entropy) {
        usage_error(app,
                    "--compare stock-entropy is Conveyor without the own entropy decoder, beside "
                    "a run with it: drop --stock-entropy");
      }
      c.stock_entropy_reference = true;
    } else {
      c.compare.push_back(item);
    }
  }
  for (const std::string& text : references) {
    const size_t eq = text.find('=');
    const ReferenceData ref{text.substr(0, eq), text.substr(eq + 1)};
    for (const auto& other : c.reference_data) {
      if (other.name == ref.name) usage_error(app, "--reference-data " + ref.name + " given twice");
    }
    c.reference_data.push_back(ref);
  }
  if (generate_only && !c.data.empty()) usage_error(app, "--generate-only generates; drop --data");
  if (c.data.empty()) {
    c.data = generated_dataset(generate, dataset == "mixed");
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
  if (c.reference_folder.empty() && !c.compare.empty()) {  // cpu-decode reads --data
    usage_error(app, "--compare " + c.compare.front() +
                         " reads image files from a folder, but --data is tar shards (" +
                         source_kind_name(source_kind(c.data)) +
                         "): add --reference-data NAME=DIR with an ImageFolder of the same images "
                         "(e.g. the folder conveyor-prepare made the shards from), or drop "
                         "--compare");
  }
  return c;
}

}  // namespace conveyor::bench
