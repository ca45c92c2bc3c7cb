// ddp_train: data-parallel training on many processes through torch.distributed's C++ core (c10d).
//
// Each process (rank) reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK from the
// environment, as torchrun sets them (scripts/ddp-run N -- ddp_train ... does the same on one
// machine). Rank 0 serves a c10d::TCPStore; every rank joins a ProcessGroupGloo through it. Each
// rank loads its own share of every epoch through a conveyor::DataLoader with a DistributedSampler,
// computes the gradients of a small MLP on its batch, all-reduces them (sum, then / world size) and
// steps SGD, so the replicas stay identical. On a GPU machine rank r trains on cuda:LOCAL_RANK, or
// on cuda:0 where each rank sees one GPU of its own (conveyor::device_for_local_rank; the loader
// delivers its batches there); on the CPU the same loop runs with Gloo alone.
//
// Checkpoints (--checkpoint DIR): every --checkpoint-every steps and at each epoch's end, each rank
// writes DIR/step-S/rank-R.pt (the loader's position and the step counter), rank 0 also
// DIR/step-S/model.pt (model and optimizer); after a barrier rank 0 points DIR/latest at step S.
// Every file is written to a temporary name and renamed. At start-up a job resumes from
// DIR/latest, on the same or another number of ranks: rank r loads the loader state of rank
// r % (the old world size), and the loader continues the epoch with the samples not yet consumed.
//
// At each epoch's end the ranks all-gather the indices they saw in it; rank 0 checks that the
// ranks got equal counts and together covered the epoch (PyTorch's padding and drop_last rules),
// prints the figures, and the job fails if they are wrong.
//
// Options:
//   --epochs N (2) --batch N (8) --workers N (2) --samples N (96: dataset size) --seed N (0)
//   --lr X (0.05) --drop-last (the sampler drops the tail instead of padding)
//   --checkpoint DIR  --checkpoint-every N (0: epoch ends only)
//   --log PREFIX      each rank appends "epoch E step S indices i j k ..." to PREFIX.rankR.log
//   --die-at-step S --die-rank R   rank R sends itself SIGKILL on receiving the batch of step S
//   --stop-at-step S               checkpoint after step S-1 (with --checkpoint) and exit 0
#include <torch/torch.h>

#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "conveyor/conveyor.h"
#include "synthetic.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kFeatures = 64;  // bytes per PatternSource sample: the model's input
constexpr int64_t kClasses = 4;    // target: dataset index % kClasses
constexpr auto kCollectiveTimeout = std::chrono::seconds(30);

struct Settings {
  int64_t epochs = 2;
  size_t batch = 8;
  size_t workers = 2;
  size_t samples = 96;
  uint64_t seed = 0;
  double lr = 0.05;
  bool drop_last = false;
  std::string checkpoint;
  int64_t checkpoint_every = 0;
  std::string log;
  int64_t die_at_step = -1;
  int64_t die_rank = 0;
  int64_t stop_at_step = -1;
};

// The command line (CLI11, as conveyor-bench and conveyor-prepare): --help lists every option with
// its default; a usage error prints the problem and exits with status 2.
Settings parse(int argc, char** argv) {
  Settings s;
  CLI::App app(
      "ddp_train: data-parallel training on c10d (Gloo) with Conveyor's DistributedSampler,\n"
      "checkpoints and resume. Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK\n"
      "(scripts/ddp-run sets them).");
  app.get_formatter()->column_width(26);
  app.add_option("--epochs", s.epochs, "epochs")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", s.batch, "batch size per rank")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", s.workers, "decode threads per rank")->capture_default_str();
  app.add_option("--samples", s.samples, "dataset size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", s.seed, "the loader's seed")->capture_default_str();
  app.add_option("--lr", s.lr, "SGD learning rate")->capture_default_str();
  app.add_flag("--drop-last", s.drop_last, "the sampler drops the tail instead of padding");
  app.add_option("--checkpoint", s.checkpoint, "write and resume checkpoints in DIR");
  app.add_option("--checkpoint-every", s.checkpoint_every,
                 "checkpoint every N steps (0: at each epoch's end only)")
      ->capture_default_str();
  app.add_option("--log", s.log,
                 "each rank appends \"epoch E step S indices i j k ...\" to PREFIX.rankR.log");
  app.add_option("--die-at-step", s.die_at_step,
                 "rank --die-rank sends itself SIGKILL on receiving the batch of step S");
  app.add_option("--die-rank", s.die_rank, "the rank that --die-at-step kills")
      ->capture_default_str();
  app.add_option("--stop-at-step", s.stop_at_step,
                 "checkpoint after step S-1 (with --checkpoint) and exit 0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  return s;
}

int64_t env_int(const char* name, std::optional<int64_t> fallback = std::nullopt) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    if (fallback) return *fallback;
    throw std::runtime_error(std::string("ddp_train: ") + name +
                             " is not set (start it with scripts/ddp-run or torchrun)");
  }
  return std::stoll(value);
}

std::string env_string(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

struct Mlp : torch::nn::Module {
  Mlp()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

// The job: the process group and this rank's place in it.
struct Group {
  int rank = 0;
  int world = 1;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;

  void wait(const c10::intrusive_ptr<c10d::Work>& work) const {
    if (!work->wait(kCollectiveTimeout)) throw std::runtime_error("collective timed out");
  }
  void barrier() const { wait(pg->barrier()); }
  // Sums `t` (a CPU tensor) over the ranks, in place.
  void allreduce(torch::Tensor& t) const {
    std::vector<torch::Tensor> tensors{t};
    wait(pg->allreduce(tensors));
  }
  // One tensor per rank, each shaped like `t` (a CPU tensor).
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) const {
    std::vector<torch::Tensor> inputs{t};
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < world; ++r) outputs[0].push_back(torch::empty_like(t));
    wait(pg->allgather(outputs, inputs));
    return outputs[0];
  }
};

Group join_group() {
  Group g;
  g.rank = static_cast<int>(env_int("RANK"));
  g.world = static_cast<int>(env_int("WORLD_SIZE"));
  const std::string master = env_string("MASTER_ADDR", "127.0.0.1");
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env_int("MASTER_PORT", 29500));
  store_options.isServer = g.rank == 0;
  store_options.numWorkers = static_cast<size_t>(g.world);
  store_options.timeout = kCollectiveTimeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(master, store_options);

  auto options = c10d::ProcessGroupGloo::Options::create(kCollectiveTimeout);
  // On one machine every rank talks over loopback; across machines Gloo binds the address this
  // machine's hostname resolves to.
  const bool local = master == "127.0.0.1" || master == "localhost";
  options->devices.push_back(local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
  g.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, g.rank, g.world, options);
  return g;
}

// Sums every gradient over the ranks and divides by the world size, through one flat CPU buffer
// (one collective per step; on a GPU the buffer is staged through host memory).
void average_gradients(const Group& g, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params) grads.push_back(p.grad().reshape(-1));
  torch::Tensor flat = torch::cat(grads).to(torch::kCPU).contiguous();
  g.allreduce(flat);
  flat.div_(g.world);
  flat = flat.to(params.front().device());
  int64_t offset = 0;
  for (const torch::Tensor& p : params) {
    const int64_t n = p.numel();
    p.grad().copy_(flat.slice(0, offset, offset + n).view_as(p));
    offset += n;
  }
}

// Rank 0 broadcasts its parameters so every replica starts from the same weights.
void broadcast_parameters(const Group& g, const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& p : params) {
    std::vector<torch::Tensor> tensors{p.detach().to(torch::kCPU).contiguous()};
    g.wait(g.pg->broadcast(tensors));
    p.copy_(tensors[0].to(p.device()));
  }
}

void save_atomically(torch::serialize::OutputArchive& archive, const fs::path& path) {
  const fs::path tmp = path.string() + ".tmp";
  archive.save_to(tmp.string());
  fs::rename(tmp, path);
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor t;
  archive.read(key, t);
  return t.item<int64_t>();
}

// Where a job stands: the steps done and the epoch the next batch belongs to (or, when the loader
// says that epoch is complete, the one after).
struct Position {
  int64_t step = 0;
  int64_t epoch = 0;
};

void save_checkpoint(const Group& g, const Settings& s, const Position& at, Mlp& model,
                     torch::optim::SGD& optimizer, const conveyor::DataLoader& loader) {
  const fs::path root = s.checkpoint;
  const fs::path dir = root / ("step-" + std::to_string(at.step));
  fs::create_directories(dir);
  {
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive loader_state;
    loader.save(loader_state);  // the loader's position: epoch, batches received, sampler
    archive.write("loader", loader_state);
    archive.write("step", torch::tensor(at.step));
    archive.write("epoch", torch::tensor(at.epoch));
    archive.write("world_size", torch::tensor(static_cast<int64_t>(g.world)));
    save_atomically(archive, dir / ("rank-" + std::to_string(g.rank) + ".pt"));
  }
  if (g.rank == 0) {
    torch::serialize::OutputArchive archive;
    torch::serialize::OutputArchive model_state;
    torch::serialize::OutputArchive optimizer_state;
    model.save(model_state);
    optimizer.save(optimizer_state);
    archive.write("model", model_state);
    archive.write("optimizer", optimizer_state);
    save_atomically(archive, dir / "model.pt");
  }
  g.barrier();  // every rank's file is in place before `latest` names the step
  if (g.rank == 0) {
    const fs::path tmp = root / "latest.tmp";
    {
      std::ofstream out(tmp);
      out << at.step << ' ' << g.world << '\n';
      out.flush();
      if (!out) throw std::runtime_error("cannot write " + tmp.string());
    }
    fs::rename(tmp, root / "latest");
    for (const fs::directory_entry& entry : fs::directory_iterator(root)) {  // older steps
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && name.rfind("step-", 0) == 0 && entry.path() != dir) {
        fs::remove_all(entry.path());
      }
    }
  }
}

// Loads DIR/latest if there is one; returns the position to continue from.
std::optional<Position> load_checkpoint(const Group& g, const Settings& s, Mlp& model,
                                        torch::optim::SGD& optimizer,
                                        conveyor::DataLoader& loader) {
  const fs::path root = s.checkpoint;
  std::ifstream latest(root / "latest");
  int64_t step = 0, old_world = 0;
  if (!(latest >> step >> old_world)) return std::nullopt;
  const fs::path dir = root / ("step-" + std::to_string(step));
  {
    torch::serialize::InputArchive archive;
    archive.load_from((dir / "model.pt").string());
    torch::serialize::InputArchive model_state;
    torch::serialize::InputArchive optimizer_state;
    archive.read("model", model_state);
    archive.read("optimizer", optimizer_state);
    model.load(model_state);
    optimizer.load(optimizer_state);
  }
  torch::serialize::InputArchive archive;
  archive.load_from((dir / ("rank-" + std::to_string(g.rank % old_world) + ".pt")).string());
  torch::serialize::InputArchive loader_state;
  archive.read("loader", loader_state);
  loader.load(loader_state);  // the next begin() continues the saved epoch
  Position at;
  at.step = read_int(archive, "step");
  at.epoch = read_int(archive, "epoch");
  if (g.rank == 0) {
    std::printf("resumed from %s: step %lld, epoch %lld, saved by %lld ranks, now %d\n",
                dir.string().c_str(), static_cast<long long>(at.step),
                static_cast<long long>(at.epoch), static_cast<long long>(old_world), g.world);
  }
  return at;
}

// All-gathers the indices each rank saw in `epoch`; rank 0 prints the coverage and, for an epoch
// this run saw whole, checks PyTorch's rules. Returns false (on every rank) if the check failed.
bool check_coverage(const Group& g, const Settings& s, int64_t epoch, bool whole,
                    const std::vector<int64_t>& seen) {
  torch::Tensor count = torch::tensor(static_cast<int64_t>(seen.size()));
  const std::vector<torch::Tensor> counts = g.allgather(count.reshape({1}));
  int64_t most = 0;
  bool equal = true;
  for (const torch::Tensor& c : counts) {
    most = std::max(most, c.item<int64_t>());
    equal = equal && c.item<int64_t>() == counts[0].item<int64_t>();
  }
  // Equal-sized pieces for the all-gather: pad with -1 (only when counts differ, which fails).
  torch::Tensor mine = torch::full({most}, int64_t{-1});
  std::copy(seen.begin(), seen.end(), mine.data_ptr<int64_t>());
  const std::vector<torch::Tensor> all = g.allgather(mine);
  bool ok = equal;
  if (g.rank == 0) {
    std::map<int64_t, int64_t> times;
    int64_t total = 0;
    for (const torch::Tensor& t : all) {
      const int64_t* data = t.data_ptr<int64_t>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t index = data[i];
        if (index < 0) continue;
        ++times[index];
        ++total;
      }
    }
    const auto n = static_cast<int64_t>(s.samples);
    const int64_t distinct = static_cast<int64_t>(times.size());
    const int64_t repeats = total - distinct;
    if (whole) {
      const int64_t per_rank = s.drop_last ? n / g.world : (n + g.world - 1) / g.world;
      const int64_t expected_distinct = s.drop_last ? per_rank * g.world : n;
      ok = ok && counts[0].item<int64_t>() == per_rank && distinct == expected_distinct &&
           repeats == per_rank * g.world - expected_distinct;
    } else {
      ok = ok && repeats < g.world;  // a resumed epoch's rest: padding repeats at most W-1
    }
    std::printf("epoch %lld%s: %d ranks x %lld samples, %lld distinct of %lld, %lld repeated: %s\n",
                static_cast<long long>(epoch), whole ? "" : " (resumed part)", g.world,
                static_cast<long long>(counts[0].item<int64_t>()), static_cast<long long>(distinct),
                static_cast<long long>(n), static_cast<long long>(repeats),
                ok ? "coverage ok" : "COVERAGE WRONG");
  }
  torch::Tensor verdict = torch::tensor(static_cast<int64_t>(ok ? 0 : 1)).reshape({1});
  std::vector<torch::Tensor> tensors{verdict};
  g.wait(g.pg->broadcast(tensors));
  return tensors[0].item<int64_t>() == 0;
}

int train(const Settings& s) {
  const Group g = join_group();
  const int64_t local_rank = env_int("LOCAL_RANK", g.rank);
  // cuda:LOCAL_RANK on a node whose GPUs every rank sees; cuda:0 where each rank sees one GPU
  // (SLURM, or CUDA_VISIBLE_DEVICES per rank); the CPU without a GPU.
  const torch::Device device = conveyor::device_for_local_rank(local_rank);
  if (device.is_cuda()) c10::cuda::set_device(device.index());  // torch's "cuda" is this GPU too

  conveyor::LoaderOptions options;
  options.batch_size = s.batch;
  options.workers = s.workers;
  options.seed = s.seed;
  options.device = device;
  conveyor::DataLoader loader(
      std::make_shared<conveyor::PatternSource>(s.samples, kFeatures), options,
      conveyor::DistributedSampler::make(static_cast<size_t>(g.rank), static_cast<size_t>(g.world),
                                         /*shuffle=*/true, s.seed, s.drop_last));

  torch::manual_seed(s.seed);
  Mlp model;
  model.to(device);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(s.lr).momentum(0.9));
  const std::vector<torch::Tensor> params = model.parameters();

  Position at;
  bool resumed = false;
  if (!s.checkpoint.empty()) {
    fs::create_directories(s.checkpoint);
    if (std::optional<Position> loaded = load_checkpoint(g, s, model, optimizer, loader)) {
      at = *loaded;
      resumed = true;
    }
  }
  broadcast_parameters(g, params);
  if (g.rank == 0) {
    std::printf("ddp_train: %d ranks, gloo, %s, %zu samples, batch %zu, %zu batches per rank\n",
                g.world, device.str().c_str(), s.samples, s.batch, loader.batches_per_epoch());
  }

  std::FILE* log = nullptr;
  if (!s.log.empty()) {
    const std::string path = s.log + ".rank" + std::to_string(g.rank) + ".log";
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
    log = std::fopen(path.c_str(), "a");
    if (log == nullptr) throw std::runtime_error("cannot open " + path);
  }
  const bool checkpoints = !s.checkpoint.empty();
  const auto started = Clock::now();
  int64_t steps_this_run = 0;
  int64_t samples_this_run = 0;  // this rank's
  double last_loss = 0;
  bool stop = false;
  bool coverage_ok = true;

  while (!stop && at.epoch < s.epochs) {
    bool first_batch = true;
    bool whole = !resumed;  // this run saw the epoch from its first batch
    std::vector<int64_t> seen;
    for (auto it = loader.begin(); it != loader.end(); ++it) {
      conveyor::Batch& batch = *it;
      const auto epoch = static_cast<int64_t>(batch.epoch);
      if (first_batch && epoch != at.epoch) {
        // The checkpoint ended exactly at an epoch's last batch; the loader moved on.
        at.epoch = epoch;
        whole = true;
      }
      first_batch = false;
      if (at.epoch >= s.epochs) {
        stop = true;
        break;
      }
      if (at.step == s.die_at_step && g.rank == s.die_rank) {
        std::fprintf(stderr, "rank %d: SIGKILL at step %lld\n", g.rank,
                     static_cast<long long>(at.step));
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      if (log != nullptr) {
        std::fprintf(log, "epoch %lld step %lld indices", static_cast<long long>(epoch),
                     static_cast<long long>(at.step));
        for (size_t index : batch.indices) std::fprintf(log, " %zu", index);
        std::fprintf(log, "\n");
        std::fflush(log);
      }
      for (size_t index : batch.indices) seen.push_back(static_cast<int64_t>(index));

      // PatternSource: uint8 [B, 64] features and the dataset index as an int64 label.
      torch::Tensor x = batch.images().to(torch::kFloat).div(255.0).sub(0.5);
      torch::Tensor y = batch.labels().remainder(kClasses);
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model.forward(x), y);
      loss.backward();
      average_gradients(g, params);
      optimizer.step();
      last_loss = loss.item<double>();
      ++at.step;
      ++steps_this_run;
      samples_this_run += static_cast<int64_t>(batch.size());
      if (g.rank == 0) {
        std::printf("epoch %lld step %lld: loss %.4f\n", static_cast<long long>(epoch),
                    static_cast<long long>(at.step - 1), last_loss);
      }
      const bool stopping = s.stop_at_step >= 0 && at.step >= s.stop_at_step;
      if (checkpoints &&
          (stopping || (s.checkpoint_every > 0 && at.step % s.checkpoint_every == 0))) {
        save_checkpoint(g, s, at, model, optimizer, loader);
      }
      if (stopping) {
        stop = true;
        break;
      }
    }
    if (stop) break;
    if (!check_coverage(g, s, at.epoch, whole, seen)) coverage_ok = false;
    ++at.epoch;
    resumed = false;
    if (checkpoints) save_checkpoint(g, s, at, model, optimizer, loader);
  }
  if (log != nullptr) std::fclose(log);

  // The samples the job trained on in this run: every rank's count, summed.
  torch::Tensor samples = torch::tensor(samples_this_run).reshape({1});
  g.allreduce(samples);
  if (g.rank == 0) {
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    std::printf(
        "summary: %d ranks, %lld steps in all (%lld in this run, on %lld samples over the ranks), "
        "epoch %lld, loss %.4f, %.2f s%s\n",
        g.world, static_cast<long long>(at.step), static_cast<long long>(steps_this_run),
        static_cast<long long>(samples.item<int64_t>()), static_cast<long long>(at.epoch),
        last_loss, seconds, stop ? " (stopped early)" : "");
  }
  g.barrier();
  return coverage_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse(argc, argv);
  try {
    return train(settings);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train (rank %s): %s\n", env_string("RANK", "?").c_str(), e.what());
    return 1;
  }
}
