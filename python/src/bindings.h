// python/src/bindings.h: the C++ side of the Python package (conveyor._C), shared by its files.
//
// What it is for: wrapping the engine (conveyor::DataLoader, ImageSource) for Python without
// re-implementing any of it. Python's own rules are kept here: the GIL is released while the
// consumer waits (the workers never take it), a wait can be interrupted by Ctrl-C, an object used
// in a forked child fails with a clear error, and engine exceptions become Python exceptions.
// Requires: the GIL is held on entry to every function, as pybind11 calls them.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <torch/csrc/utils/pybind.h>

#include "conveyor/conveyor.h"
#include "synthetic.h"  // generate_image_folder, make_photo_jpeg, PatternSource

namespace conveyor::python {

namespace py = pybind11;

// An object made in one process and used in a process forked from it: the fork copied no worker
// thread, so the engine cannot run there. Throws std::runtime_error saying so (RuntimeError).
void check_same_process(pid_t creator, const char* what);

// True in a process forked from the one that made an object: its destructor must then not join
// threads or free CUDA memory that belong to the parent, so the object is left to the OS.
inline bool forked_from(pid_t creator) { return ::getpid() != creator; }

// A dataset for Python: an engine SampleSource and, for images, its ImageSource face. A source
// serves one DataLoader at a time (SampleSource's contract); claim() hands it to one and in_use()
// says whether that loader still holds it, so the Python side makes a fresh source otherwise.
class Source {
 public:
  Source(std::shared_ptr<SampleSource> source, const ImageSource* image);
  ~Source();
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  size_t size() const { return source_->size(); }
  pid_t creator() const { return creator_; }
  const ImageSource* image() const { return image_; }
  std::string describe(size_t index) const;
  bool in_use() const { return !owner_.expired(); }
  // Hands the source to a loader, which keeps `owner` alive while it uses it. Throws
  // std::logic_error if another loader holds it.
  std::shared_ptr<SampleSource> claim(const std::shared_ptr<const void>& owner);

 private:
  pid_t creator_;
  std::shared_ptr<SampleSource> source_;
  const ImageSource* image_;  // source_ as an ImageSource, or null
  std::weak_ptr<const void> owner_;
};

// Registers the engine's option structs (ImageTransform, DecodeLimits, FolderOptions,
// RemoteOptions, ShardOptions, GpuDecode, LoaderOptions) and enums (ErrorPolicy, ImageLayout,
// ImageTransform.Mode, GpuDecode.Mode) as classes of `m`, each field a read-write attribute
// (options.cpp). Durations are seconds; an enum's value names are the texts the Python API takes.
// Binds Field and the sources of named fields (fields.cpp).
void bind_fields(py::module_& m);
// conveyor._C.augment: the batch ops (augment.cpp).
void bind_augment(py::module_& m);
// An AugmentRecord as Python data: {"rows": [[(op, name, value), ...] per row], "batch":
// [(op, name, value), ...]} (conveyor/augment.h).
py::dict augment_record(const AugmentRecord& record);

void bind_options(py::module_& m);

// Binds from_dataset (the user's own map-style dataset as named fields: a Source and its
// DatasetReader, whose gil() times the GIL and take_error(index) gives back the exception that
// __getitem__ raised) (dataset_reader.cpp). Requires the Source class bound on `m`.
void bind_dataset_reader(py::module_& m);

// Converts the loader's checkpoint (DataLoader::state(), a LoaderState) to a dict of Python ints
// and strings, and back (state_dict.cpp), without a torch archive. load_state() throws ValueError
// naming the key whose value is not an int (of 64 bits), bool, str or list of ints, and the
// engine's std::invalid_argument (ValueError) naming the field that is out of range or does not
// fit the loader; a key or string from the state is quoted bounded and escaped.
py::dict save_state(const DataLoader& loader);
void load_state(DataLoader& loader, const py::dict& state);

// The next batch of the current epoch (nullopt at its end), waited for with the GIL released, in
// DataLoader::poll steps of 50 ms, between which Python's signal handlers run: Ctrl-C raises
// KeyboardInterrupt within a step and loses no batch (the next call takes it).
inline std::optional<Batch> wait_for_batch(DataLoader& loader) {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  for (;;) {
    DataLoader::Poll step;
    {
      py::gil_scoped_release released;
      step = loader.poll(std::chrono::milliseconds(50));
    }
    if (step.batch) return std::move(step.batch);
    if (step.end) return std::nullopt;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace conveyor::python
