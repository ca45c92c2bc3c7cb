// conveyor._C: the engine's DataLoader, image sources, transforms and helpers for Python. The
// Python package (python/conveyor) builds its public classes on these; nothing here decodes,
// schedules or copies anything itself.
#include <sys/types.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"

namespace conveyor::python {
namespace {

// ---------------------------------------------------------------------------------------------
// Errors

void set_sample_error(const SampleError& error) {
  std::string reason;
  if (error.original()) {
    try {
      error.rethrow_original();
    } catch (const std::exception& original) {
      reason = original.what();
    } catch (...) {
      reason = "an exception that is not a std::exception";
    }
  }
  const py::object type = py::module_::import("conveyor._errors").attr("SampleError");
  const py::object value = type(error.what(), error.index(), error.path(), reason);
  PyErr_SetObject(type.ptr(), value.ptr());
}

void translate_exception(std::exception_ptr thrown) {
  try {
    if (thrown) std::rethrow_exception(thrown);
  } catch (const SampleError& error) {
    set_sample_error(error);
  } catch (const TimeoutError& error) {
    PyErr_SetString(PyExc_TimeoutError, error.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Sources

std::unique_ptr<Source> image_source(std::unique_ptr<ImageSource> made) {
  const ImageSource* image = made.get();
  return std::make_unique<Source>(std::shared_ptr<SampleSource>(std::move(made)), image);
}

std::unique_ptr<Source> image_folder(const std::string& root, const ImageTransform& transform,
                                     const FolderOptions& options) {
  std::unique_ptr<ImageSource> made;
  {
    py::gil_scoped_release released;  // a large tree takes a while to list
    made = ImageSource::image_folder(root, transform, options);
  }
  return image_source(std::move(made));
}

std::unique_ptr<Source> file_list(const std::string& list, const ImageTransform& transform,
                                  const FolderOptions& options) {
  std::unique_ptr<ImageSource> made;
  {
    py::gil_scoped_release released;
    made = ImageSource::file_list(list, transform, options);
  }
  return image_source(std::move(made));
}

std::unique_ptr<Source> in_memory(const std::vector<py::bytes>& jpegs,
                                  const std::vector<int64_t>& labels,
                                  const ImageTransform& transform) {
  if (jpegs.size() != labels.size()) {
    throw std::invalid_argument("conveyor: JpegBytes got " + std::to_string(jpegs.size()) +
                                " images but " + std::to_string(labels.size()) + " labels");
  }
  std::vector<std::vector<uint8_t>> bytes;
  bytes.reserve(jpegs.size());
  for (const py::bytes& jpeg : jpegs) {
    const std::string_view view = jpeg;
    bytes.emplace_back(view.begin(), view.end());
  }
  return image_source(ImageSource::in_memory(std::move(bytes), labels, transform));
}

// `shards`: the user's patterns (a Python str), or, with `literal`, names taken as they are (a
// Python list: conveyor::literal_shard_location, never a pattern or a command).
std::unique_ptr<Source> tar_shards(const std::vector<std::string>& shards, bool literal,
                                   const ImageTransform& transform, const ShardOptions& o) {
  std::unique_ptr<ImageSource> made;
  {
    py::gil_scoped_release released;  // reads every index (over HTTP, maybe)
    if (literal) {
      std::vector<ShardLocation> locations;
      for (const std::string& name : shards) locations.push_back(literal_shard_location(name));
      made = ImageSource::tar_shards(locations, transform, o);
    } else {
      made = ImageSource::tar_shards(shards, transform, o);
    }
  }
  return image_source(std::move(made));
}

std::unique_ptr<Source> pattern_source(size_t size, size_t sample_bytes) {
  return std::make_unique<Source>(std::make_shared<PatternSource>(size, sample_bytes), nullptr);
}

py::list source_items(const Source& source) {
  py::list items;
  if (source.image() == nullptr) return items;
  for (const ImageItem& item : source.image()->items()) {
    items.append(py::make_tuple(item.path, item.label));
  }
  return items;
}

std::vector<std::string> source_classes(const Source& source) {
  return source.image() ? source.image()->classes() : std::vector<std::string>{};
}

// ---------------------------------------------------------------------------------------------
// The loader

std::unique_ptr<Sampler> make_sampler(const std::string& kind, uint64_t seed, size_t rank,
                                      size_t world_size, bool shuffle, bool drop_last,
                                      uint32_t num_repeats, size_t selected_round) {
  if (kind == "sequential") return SequentialSampler::make();
  if (kind == "repeated_augmentation") {
    return RASampler::make(rank, world_size, num_repeats, shuffle, seed, selected_round);
  }
  if (kind == "random") return RandomSampler::make(seed);
  if (kind == "distributed") {
    return DistributedSampler::make(rank, world_size, shuffle, seed, drop_last);
  }
  throw std::invalid_argument("conveyor: unknown sampler kind '" + kind + "'");
}

// The end of a device batch's copy (Batch::copy_fence), for Python's Batch.record_stream: the
// one C++ path (CopyFence::use_on) that makes a stream wait for the batch's own copy.
struct BatchFence {
  std::shared_ptr<const CopyFence> fence;  // never null
};

class Loader {
 public:
  Loader(Source& source, LoaderOptions options, const std::string& sampler, uint64_t sampler_seed,
         size_t rank, size_t world_size, bool shuffle, bool sampler_drop_last, uint32_t num_repeats,
         size_t selected_round)
      : creator_(::getpid()), token_(std::make_shared<int>(0)) {
    check_same_process(source.creator(), "dataset");
    std::shared_ptr<SampleSource> claimed = source.claim(token_);
    std::unique_ptr<Sampler> order = make_sampler(sampler, sampler_seed, rank, world_size, shuffle,
                                                  sampler_drop_last, num_repeats, selected_round);
    py::gil_scoped_release released;
    loader_ = std::make_unique<DataLoader>(std::move(claimed), options, std::move(order));
  }

  ~Loader() {
    if (forked_from(creator_)) {
      // The workers and the ring belong to the parent process: joining or freeing them here
      // would wait for threads that do not exist. Left to the OS, as the rest of the copy is.
      (void)loader_.release();  // NOLINT(bugprone-unused-return-value): deliberate
      return;
    }
    close();
  }
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  DataLoader& get() {
    check_same_process(creator_, "DataLoader");
    if (!loader_) throw std::runtime_error("conveyor: this DataLoader was closed");
    return *loader_;
  }

  void start_epoch() {
    DataLoader& loader = get();
    py::gil_scoped_release released;  // cancelling the rest of an epoch waits for the workers
    loader.start_epoch();
  }

  // (fields, names, indices, epoch, sequence, fence), or None at the end of the epoch. fence: the
  // end of the batch's copy to the device (a BatchFence), None for a CPU batch.
  // (fields, offsets, names, indices, epoch, sequence, fence, repeats): offsets has one entry per
  // field, None for a fixed field, a ragged field's offsets tensor otherwise (Batch::offsets);
  // repeats: each row's repeat number (Batch::repeats), None when all are 0; augment_params:
  // Batch::augment_params as augment_record() writes it, None when not recorded.
  py::object next() {
    std::optional<Batch> batch = wait_for_batch(get());
    if (!batch) return py::none();
    py::tuple fields(batch->fields.size());
    py::tuple offsets(batch->fields.size());
    for (size_t i = 0; i < batch->fields.size(); ++i) {
      fields[i] = py::cast(std::move(batch->fields[i]));  // the same TensorImpl: no copy
      const bool ragged = i < batch->offsets.size() && batch->offsets[i].defined();
      offsets[i] = ragged ? py::cast(std::move(batch->offsets[i])) : py::none();
    }
    py::object fence = py::none();
    if (batch->copy_fence) fence = py::cast(BatchFence{std::move(batch->copy_fence)});
    py::object repeats = py::none();
    if (!batch->repeats.empty()) repeats = py::cast(batch->repeats);
    py::object params = py::none();
    if (batch->augment_params) params = augment_record(*batch->augment_params);
    return py::make_tuple(fields, offsets, py::cast(batch->names), py::cast(batch->indices),
                          batch->epoch, batch->sequence, fence, repeats, params);
  }

  void close() {
    if (!loader_) return;
    {
      py::gil_scoped_release released;
      loader_->join();
    }
    loader_.reset();
    token_.reset();  // the source may serve another loader now
  }

  bool closed() const { return !loader_; }

 private:
  pid_t creator_;
  std::shared_ptr<const void> token_;  // keeps the Source claimed while this loader lives
  std::unique_ptr<DataLoader> loader_;
};

py::dict stats_dict(const LoaderStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["skipped"] = s.skipped;
  d["errors"] = s.errors;
  py::list skipped;
  for (const SkippedSample& k : s.skipped_samples) {
    py::dict one;
    one["index"] = k.index;
    one["path"] = k.path;
    one["message"] = k.message;
    one["epoch"] = k.epoch;
    skipped.append(one);
  }
  d["skipped_samples"] = skipped;
  d["fill_seconds"] = s.fill_seconds;
  d["copy_issue_seconds"] = s.copy_issue_seconds;
  d["transform_seconds"] = s.transform_seconds;
  d["wait_seconds"] = s.wait_seconds;
  py::dict slots;
  for (size_t i = 0; i < s.slot_states.size(); ++i) {
    slots[py::str(to_string(static_cast<SlotState>(i)))] = s.slot_states[i];
  }
  d["slot_states"] = slots;
  d["copies_to_host"] = s.copies_to_host;
  d["active_workers"] = s.active_workers;
  py::list history;  // num_workers="auto": (batch, seconds, workers) from the start, per change
  for (const ActiveWorkers& a : s.active_workers_history) {
    history.append(py::make_tuple(a.batch, a.seconds, a.workers));
  }
  d["active_workers_history"] = history;
  py::dict gpu;  // LoaderStats::gpu_decode: the split between the CPU and the GPU decoder
  const GpuDecodeStats& g = s.gpu_decode;
  gpu["active"] = g.active;
  gpu["status"] = g.status;
  gpu["gpu_images"] = g.gpu_images;
  gpu["cpu_images"] = g.cpu_images;
  gpu["gpu_share"] = g.gpu_share();
  gpu["refused"] = g.refused;
  gpu["failed_batches"] = g.failed_batches;
  gpu["gpu_busy_seconds"] = g.gpu_busy_seconds;
  gpu["gpu_idle_seconds"] = g.gpu_idle_seconds;
  gpu["cpu_idle_seconds"] = g.cpu_idle_seconds;
  gpu["cpu_ns_per_image"] = g.cpu_ns_per_image;
  gpu["gpu_ns_per_image"] = g.gpu_ns_per_image;
  d["gpu_decode"] = gpu;
  return d;
}

py::dict generate(const std::string& root, size_t classes, size_t images_per_class, int quality,
                  uint64_t seed, size_t threads, bool mixed) {
  GeneratorOptions g;
  g.classes = classes;
  g.images_per_class = images_per_class;
  g.quality = quality;
  g.seed = seed;
  g.threads = threads;
  g.mixed = mixed;
  GeneratedDataset d;
  {
    py::gil_scoped_release released;
    d = generate_image_folder(root, g);
  }
  py::dict out;
  out["root"] = d.root.string();
  out["images"] = d.images;
  out["bytes"] = d.bytes;
  out["reused"] = d.reused;
  return out;
}

at::Tensor normalize(const at::Tensor& images, std::vector<float> mean, std::vector<float> std,
                     c10::ScalarType dtype, bool hwc, bool channels_last) {
  NormalizeOptions o;
  o.mean = std::move(mean);
  o.std = std::move(std);
  o.dtype = dtype;
  o.hwc = hwc;
  o.channels_last = channels_last;
  return normalize_images(images, o);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void check_same_process(pid_t creator, const char* what) {
  const pid_t now = ::getpid();
  if (now == creator) return;
  throw std::runtime_error(
      std::string("conveyor: this ") + what + " was made in process " + std::to_string(creator) +
      " and is used in process " + std::to_string(now) +
      ", forked from it. A fork copies no threads, so its worker threads are not here. Make the "
      "conveyor objects in the process that iterates them (after the fork, e.g. in a "
      "torch.utils.data worker's worker_init_fn), or start processes with the 'spawn' method.");
}

Source::Source(std::shared_ptr<SampleSource> source, const ImageSource* image)
    : creator_(::getpid()), source_(std::move(source)), image_(image) {}

Source::~Source() {
  if (forked_from(creator_)) {
    // A streaming source owns a reader thread of the parent's: leave it to the OS (see ~Loader).
    (void)std::make_unique<std::shared_ptr<SampleSource>>(std::move(source_)).release();
  }
}

std::string Source::describe(size_t index) const {
  if (index >= source_->size()) {
    throw std::out_of_range("conveyor: index " + std::to_string(index) + " is outside the " +
                            std::to_string(source_->size()) + " samples of the dataset");
  }
  return source_->describe(index);
}

std::shared_ptr<SampleSource> Source::claim(const std::shared_ptr<const void>& owner) {
  if (in_use()) {
    throw std::logic_error("conveyor: this dataset already serves a live DataLoader");
  }
  owner_ = owner;
  return source_;
}

}  // namespace conveyor::python

// The module needs no GIL of its own (a free-threaded build runs it without one): its state is
// the engine's, behind the engine's locks, and the dataset reader's, behind atomics and a mutex.
PYBIND11_MODULE(_C, m, pybind11::mod_gil_not_used()) {
  namespace py = pybind11;
  using namespace conveyor::python;
  m.doc() = "Conveyor's C++ engine (use the `conveyor` package, not this module)";
  py::register_exception_translator(&translate_exception);

  bind_options(m);
  bind_fields(m);
  bind_augment(m);
  m.attr("AUTO_WORKERS") = conveyor::kAutoWorkers;  // LoaderOptions.workers for "auto"
  m.attr("SIMD_DCT_SCALES") = conveyor::kSimdDctScales;
  m.attr("FULL_DCT_SCALE") = conveyor::kFullDctScale;
  m.attr("ALL_DCT_SCALES") = conveyor::kAllDctScales;

  py::class_<Source>(m, "Source")
      .def("__len__", &Source::size)
      .def("describe", &Source::describe)
      .def_property_readonly("in_use", &Source::in_use)
      .def_property_readonly("items", &source_items)
      .def_property_readonly("classes", &source_classes)
      .def("scale_histogram",
           [](const Source& s) {
             return s.image() ? s.image()->scale_histogram() : std::vector<uint64_t>{};
           })
      .def("work_time", [](const Source& s) {
        py::dict d;
        if (s.image()) {
          const conveyor::ImageSource::WorkTime w = s.image()->work_time();
          d["read_seconds"] = w.read_seconds;
          d["decode_seconds"] = w.decode_seconds;
          d["transform_seconds"] = w.transform_seconds;
        }
        return d;
      });
  bind_dataset_reader(m);
  m.def("image_folder", &image_folder, py::arg("root"), py::arg("transform"), py::arg("options"));
  m.def("file_list", &file_list, py::arg("list"), py::arg("transform"), py::arg("options"));
  m.def("in_memory", &in_memory, py::arg("jpegs"), py::arg("labels"), py::arg("transform"));
  m.def("tar_shards", &tar_shards, py::arg("shards"), py::arg("literal"), py::arg("transform"),
        py::arg("options"));
  m.def("pattern_source", &pattern_source, py::arg("size"), py::arg("sample_bytes"));
  m.def("pattern_byte", &conveyor::PatternSource::pattern_byte, py::arg("index"),
        py::arg("offset"));

  py::class_<BatchFence>(m, "BatchFence")
      .def(
          "use_on",
          [](const BatchFence& f, c10::Stream stream, const std::vector<at::Tensor>& tensors) {
            f.fence->use_on(stream, tensors);
          },
          py::arg("stream"), py::arg("tensors"))
      .def("done", [](const BatchFence& f) { return f.fence->done(); });

  py::class_<Loader>(m, "Loader")
      .def(py::init<Source&, conveyor::LoaderOptions, const std::string&, uint64_t, size_t, size_t,
                    bool, bool, uint32_t, size_t>(),
           py::arg("source"), py::arg("options"), py::arg("sampler"), py::arg("sampler_seed"),
           py::arg("rank"), py::arg("world_size"), py::arg("shuffle"), py::arg("sampler_drop_last"),
           py::arg("num_repeats") = 1, py::arg("selected_round") = 0)
      .def("start_epoch", &Loader::start_epoch)
      .def("next", &Loader::next)
      .def("set_epoch", [](Loader& l, uint64_t epoch) { l.get().set_epoch(epoch); })
      .def("state_dict", [](Loader& l) { return save_state(l.get()); })
      .def("load_state_dict", [](Loader& l, const py::dict& state) { load_state(l.get(), state); })
      .def("close", &Loader::close)
      .def_property_readonly("closed", &Loader::closed)
      .def_property_readonly("epoch", [](Loader& l) { return l.get().epoch(); })
      .def("batches_per_epoch", [](Loader& l) { return l.get().batches_per_epoch(); })
      .def_property_readonly("workers", [](Loader& l) { return l.get().workers(); })
      .def_property_readonly("options",
                             [](Loader& l) { return conveyor::LoaderOptions(l.get().options()); })
      .def_property_readonly("pinned_bytes", [](Loader& l) { return l.get().pinned_bytes(); })
      .def_property_readonly("is_pinned", [](Loader& l) { return l.get().is_pinned(); })
      .def_property_readonly("mode", [](Loader& l) { return l.get().mode(); })
      .def("stats", [](Loader& l) { return stats_dict(l.get().stats()); });

  m.def("generate_image_folder", &generate, py::arg("root"), py::arg("classes"),
        py::arg("images_per_class"), py::arg("quality"), py::arg("seed"), py::arg("threads"),
        py::arg("mixed"));
  m.def(
      "make_photo_jpeg",
      [](int width, int height, uint64_t seed, int quality) {
        const std::vector<uint8_t> jpeg = conveyor::make_photo_jpeg(width, height, seed, quality);
        return py::bytes(reinterpret_cast<const char*>(jpeg.data()), jpeg.size());
      },
      py::arg("width"), py::arg("height"), py::arg("seed"), py::arg("quality"));
  m.def("expand_shard_braces", &conveyor::expand_shard_braces, py::arg("pattern"));
  m.def("cuda_available", &conveyor::cuda_available);
  m.def("normalize", &normalize, py::arg("images"), py::arg("mean"), py::arg("std"),
        py::arg("dtype"), py::arg("hwc"), py::arg("channels_last"));
}
