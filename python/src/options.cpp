// The engine's option structs and enums as Python classes of conveyor._C: one def_readwrite (or
// def_seconds) line per field, so that an option reaches Python with one line here and its
// keyword in python/conveyor. The enums' value names are the texts the Python API takes
// ("raise", "CHW", "random_resized_crop"): python/conveyor/_options.py reads every such text
// through them (choice()) and writes every struct back as a dict (to_dict()), so neither the
// texts nor the fields are listed anywhere else. The field kinds of conveyor/fields.h (issue 31)
// are bound the same way: a py::class_ with a def_readwrite per member, a py::enum_ whose names
// are the texts, and _options.make() on the Python side.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "bindings.h"

namespace conveyor::python {
namespace {

// The Python API gives durations in seconds (a float); the engine keeps milliseconds. Rounded to
// the nearest millisecond. Throws std::invalid_argument (ValueError) naming the option for a
// value that is not a finite number of seconds or does not fit.
std::chrono::milliseconds to_ms(double seconds, const char* name) {
  constexpr double kMostSeconds = 1e12;        // about 31,700 years: far inside int64 milliseconds
  if (!(std::abs(seconds) <= kMostSeconds)) {  // NaN too
    std::ostringstream message;
    message << "conveyor: " << name << " must be a finite number of seconds, at most "
            << kMostSeconds << ", not " << seconds;
    throw std::invalid_argument(message.str());
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000.0));
}

double to_seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// A std::chrono::milliseconds field as a property in seconds.
template <typename Class, typename Member, typename... Options>
void def_seconds(py::class_<Class, Options...>& bound, const char* name,
                 std::chrono::milliseconds Member::*field, const char* doc) {
  bound.def_property(
      name, [field](const Class& o) { return to_seconds(o.*field); },
      [field, name](Class& o, double seconds) { o.*field = to_ms(seconds, name); }, doc);
}

// GpuDecode as GpuDecode::parse reads it back: "off", "auto", "hw-only" or the share.
std::string gpu_decode_text(const GpuDecode& g) {
  if (g.mode == GpuDecode::Mode::kOff) return "off";
  if (g.mode == GpuDecode::Mode::kAuto) return "auto";
  if (g.share >= 1.0) return "hw-only";
  std::ostringstream share;
  share << g.share;
  return share.str();
}

}  // namespace

void bind_options(py::module_& m) {
  py::enum_<ErrorPolicy>(m, "ErrorPolicy", "LoaderOptions.on_error (conveyor/loader.h)")
      .value("raise", ErrorPolicy::kRaise)
      .value("skip", ErrorPolicy::kSkip);
  py::enum_<ImageLayout>(m, "ImageLayout", "ImageTransform.layout (conveyor/datasets.h)")
      .value("CHW", ImageLayout::kCHW)
      .value("HWC", ImageLayout::kHWC);

  // conveyor.Image's mode texts are the C++ names (ImageOutput::mode_name), written there once.
  py::class_<ImageOutput> output(m, "ImageOutput", "conveyor::ImageOutput (conveyor/fields.h)");
  py::enum_<ImageOutput::Mode> modes(output, "Mode");
  for (ImageOutput::Mode mode :
       {ImageOutput::Mode::kRGB, ImageOutput::Mode::kRGBA, ImageOutput::Mode::kL}) {
    modes.value(ImageOutput::mode_name(mode), mode);
  }

  py::class_<DecodeLimits>(m, "DecodeLimits", "conveyor::DecodeLimits (conveyor/jpeg.h)")
      .def(py::init<>())
      .def_readwrite("max_pixels", &DecodeLimits::max_pixels)
      .def_readwrite("max_scans", &DecodeLimits::max_scans);

  py::class_<JpegEntropyIndex, std::shared_ptr<JpegEntropyIndex>>(
      m, "JpegEntropyIndex", "conveyor::JpegEntropyIndex (conveyor/jpeg.h)")
      .def(py::init([](size_t budget_bytes, const std::string& file) {
             return file.empty() ? std::make_shared<JpegEntropyIndex>(budget_bytes)
                                 : std::make_shared<JpegEntropyIndex>(budget_bytes,
                                                                      std::filesystem::path(file));
           }),
           py::arg("budget_bytes") = JpegEntropyIndex::kDefaultBudgetBytes,
           py::arg("file") = std::string())
      .def_property_readonly("budget_bytes", &JpegEntropyIndex::budget_bytes)
      .def_property_readonly("bytes", &JpegEntropyIndex::bytes)
      .def_property_readonly("files", &JpegEntropyIndex::files)
      .def_property_readonly("file", [](const JpegEntropyIndex& i) { return i.file().string(); })
      .def_property_readonly("loaded",
                             [](const JpegEntropyIndex& i) {
                               const JpegEntropyIndexLoad& l = i.loaded();
                               py::dict d;
                               d["file_found"] = l.file_found;
                               d["file_refused"] = l.file_refused;
                               d["refusal"] = l.refusal;
                               d["entries_loaded"] = l.entries_loaded;
                               d["entries_refused"] = l.entries_refused;
                               d["entries_over_budget"] = l.entries_over_budget;
                               d["rest_dropped"] = l.rest_dropped;
                               return d;
                             })
      .def("save", &JpegEntropyIndex::save, py::call_guard<py::gil_scoped_release>());
  py::class_<ImageTransform> transform(m, "ImageTransform",
                                       "conveyor::ImageTransform (conveyor/datasets.h)");
  py::enum_<ImageTransform::Mode>(transform, "Mode")
      .value("random_resized_crop", ImageTransform::Mode::kRandomResizedCrop)
      .value("resize_center_crop", ImageTransform::Mode::kResizeCenterCrop)
      .value("resize", ImageTransform::Mode::kResize);
  transform.def(py::init<>())
      .def_readwrite("mode", &ImageTransform::mode)
      .def_readwrite("size", &ImageTransform::size)
      .def_readwrite("resize", &ImageTransform::resize)
      .def_readwrite("scale_min", &ImageTransform::scale_min)
      .def_readwrite("scale_max", &ImageTransform::scale_max)
      .def_readwrite("ratio_min", &ImageTransform::ratio_min)
      .def_readwrite("ratio_max", &ImageTransform::ratio_max)
      .def_readwrite("flip_probability", &ImageTransform::flip_probability)
      .def_readwrite("layout", &ImageTransform::layout)
      .def_readwrite("limits", &ImageTransform::limits)
      .def_readwrite("exif_orientation", &ImageTransform::exif_orientation)
      .def_readwrite("dct_scales", &ImageTransform::dct_scales)
      .def_readwrite("own_entropy_decoder", &ImageTransform::own_entropy_decoder)
      .def_readwrite("entropy_index", &ImageTransform::entropy_index)
      .def_readwrite("views", &ImageTransform::views)
      .def_readwrite("decode_views_once", &ImageTransform::decode_views_once);
  py::class_<ViewGroup>(m, "ViewGroup", "conveyor::ViewGroup (conveyor/sample_source.h)")
      .def(py::init<>())
      .def_readwrite("name", &ViewGroup::name)
      .def_readwrite("count", &ViewGroup::count)
      .def_readwrite("transform", &ViewGroup::transform);

  // Where ImageSource::image_folder and file_list read (its storage is C++'s only, for now).
  py::class_<FolderOptions>(m, "FolderOptions", "conveyor::FolderOptions (conveyor/datasets.h)")
      .def(py::init<>());

  py::class_<RemoteOptions> remote(m, "RemoteOptions",
                                   "conveyor::RemoteOptions (conveyor/storage.h); durations in "
                                   "seconds");
  remote.def(py::init<>()).def_readwrite("retries", &RemoteOptions::retries);
  def_seconds(remote, "backoff_initial", &RemoteOptions::backoff_initial, "seconds");
  def_seconds(remote, "backoff_max", &RemoteOptions::backoff_max, "seconds");
  def_seconds(remote, "request_timeout", &RemoteOptions::request_timeout, "seconds");
  def_seconds(remote, "connect_timeout", &RemoteOptions::connect_timeout, "seconds");
  remote.def_readwrite("min_bytes_per_second", &RemoteOptions::min_bytes_per_second)
      .def_readwrite("requests_in_flight", &RemoteOptions::requests_in_flight);

  py::class_<ShardOptions, RemoteOptions>(m, "ShardOptions",
                                          "conveyor::ShardOptions (conveyor/datasets.h)")
      .def(py::init<>())
      .def_readwrite("index", &ShardOptions::index)
      .def_readwrite("streaming", &ShardOptions::streaming)
      .def_readwrite("shuffle_buffer", &ShardOptions::shuffle_buffer)
      .def_readwrite("rank", &ShardOptions::rank)
      .def_readwrite("world_size", &ShardOptions::world_size)
      .def_readwrite("epoch_samples", &ShardOptions::epoch_samples)
      .def_readwrite("stream_window", &ShardOptions::stream_window)
      .def_readwrite("stream_lookahead", &ShardOptions::stream_lookahead);

  py::class_<GpuDecode> gpu(m, "GpuDecode", "conveyor::GpuDecode (conveyor/loader.h)");
  py::enum_<GpuDecode::Mode>(gpu, "Mode")
      .value("off", GpuDecode::Mode::kOff)
      .value("share", GpuDecode::Mode::kShare)
      .value("auto", GpuDecode::Mode::kAuto);
  gpu.def(py::init<>())
      .def_readwrite("mode", &GpuDecode::mode)
      .def_readwrite("share", &GpuDecode::share)
      .def_readwrite("threads", &GpuDecode::threads)
      .def_readwrite("max_batch", &GpuDecode::max_batch)
      .def_static("parse", &GpuDecode::parse, py::arg("text"),
                  "'off', 'auto', 'hw-only' or a share in [0, 1]; ValueError otherwise")
      .def("__str__", &gpu_decode_text);

  py::class_<LoaderOptions>(m, "LoaderOptions", "conveyor::LoaderOptions (conveyor/loader.h)")
      .def(py::init<>())
      .def_readwrite("batch_size", &LoaderOptions::batch_size)
      .def_readwrite("workers", &LoaderOptions::workers)
      .def_readwrite("max_workers", &LoaderOptions::max_workers)
      .def_readwrite("drop_last", &LoaderOptions::drop_last)
      .def_readwrite("enforce_ordering", &LoaderOptions::enforce_ordering)
      .def_property(
          "timeout",
          [](const LoaderOptions& o) -> std::optional<double> {
            if (!o.timeout) return std::nullopt;
            return to_seconds(*o.timeout);
          },
          [](LoaderOptions& o, std::optional<double> seconds) {
            // None or 0: no limit; otherwise at least a millisecond, its sign kept (the
            // engine refuses a negative timeout).
            if (!seconds || *seconds == 0) {
              o.timeout.reset();
              return;
            }
            const std::chrono::milliseconds ms = to_ms(*seconds, "timeout");
            constexpr std::chrono::milliseconds kOne{1};
            o.timeout = *seconds > 0 ? std::max(kOne, ms) : std::min(-kOne, ms);
          },
          "seconds, or None: no limit (0 is None)")
      .def_readwrite("seed", &LoaderOptions::seed)
      .def_readwrite("on_error", &LoaderOptions::on_error)
      .def_readwrite("max_substitutes", &LoaderOptions::max_substitutes)
      .def_readwrite("device", &LoaderOptions::device)
      .def_readwrite("pin_memory", &LoaderOptions::pin_memory)
      .def_readwrite("prefetch_factor", &LoaderOptions::prefetch_factor)
      .def_readwrite("slots", &LoaderOptions::slots)
      .def_readwrite("chunk_size", &LoaderOptions::chunk_size)
      .def_readwrite("gpu_decode", &LoaderOptions::gpu_decode)
      .def_readwrite("record_augment_params", &LoaderOptions::record_augment_params)
      .def_property(
          "batch_transform",
          [](const LoaderOptions& o) -> std::optional<std::string> {
            if (!o.batch_transform) return std::nullopt;
            return o.batch_transform->name();
          },
          [](LoaderOptions& o, std::shared_ptr<BatchOp> op) { o.batch_transform = std::move(op); },
          "a conveyor._C.augment op or None; reads back as the op's name");
}

}  // namespace conveyor::python
