// conveyor._C's reader of the user's own map-style dataset (issue 36): a MemberReader
// (conveyor/fields.h) whose read() calls dataset[i] under the GIL and copies what it returned
// into the worker's MemberList; the fields decode and write it without the GIL.
//
// The split: the GIL is held only for __getitem__ and the copy (measured: stats()["gil"]).
// Nothing Python outlives a read() but the exception of a sample that raised, kept (bounded) so
// that Python can chain it (SampleError.__cause__) or re-raise a KeyboardInterrupt as itself.
// Free-threaded builds (3.13t, 3.14t): the reader's own state is atomics and a mutex, never the
// GIL, so the fetches may run at once.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <c10/core/DynamicCast.h>
#include <torch/csrc/autograd/python_variable.h>

#include "bindings.h"

namespace conveyor::python {
namespace {

// The Python exceptions kept for Python to chain: the latest kMaxKeptErrors samples'.
constexpr size_t kMaxKeptErrors = 64;
// The most of a formatted traceback that an error's message carries (its end: the raising frame).
constexpr size_t kMaxTracebackBytes = 8 * 1024;

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// "PIL.Image.Image", "numpy.ndarray", "NoneType" (builtins without their module).
std::string type_name(PyObject* object) {
  const py::handle type(reinterpret_cast<PyObject*>(Py_TYPE(object)));
  std::string qualname = py::str(type.attr("__qualname__"));
  const std::string module = py::str(type.attr("__module__"));
  return module == "builtins" ? qualname : module + "." + qualname;
}

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

// Copies an array of `ndim` dimensions, `shape` and byte `strides`, of `itemsize` bytes an element,
// in C order into `out`.
void strided_copy(const std::byte* in, const Py_ssize_t* shape, const Py_ssize_t* strides,
                  size_t ndim, size_t itemsize, std::byte*& out) {
  if (ndim == 0) {
    std::memcpy(out, in, itemsize);
    out += itemsize;
    return;
  }
  if (ndim == 1 && strides[0] == static_cast<Py_ssize_t>(itemsize)) {
    const size_t bytes = static_cast<size_t>(shape[0]) * itemsize;
    if (bytes > 0) std::memcpy(out, in, bytes);
    out += bytes;
    return;
  }
  for (Py_ssize_t i = 0; i < shape[0]; ++i) {
    strided_copy(in + i * strides[0], shape + 1, strides + 1, ndim - 1, itemsize, out);
  }
}

// A buffer's element type (struct-module format and itemsize: what numpy exports), or nullopt.
std::optional<c10::ScalarType> buffer_dtype(const char* format, Py_ssize_t itemsize) {
  std::string_view f = format == nullptr ? "B" : format;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<' || f[0] == '|')) f.remove_prefix(1);
  if (f.size() != 1) return std::nullopt;  // big-endian, complex, structured, ...
  using c10::ScalarType;
  struct BufferType {
    std::string_view codes;  // the struct module's codes of this kind
    Py_ssize_t size;
    ScalarType dtype;
  };
  static constexpr BufferType kTypes[] = {
      {"?", 1, ScalarType::Bool},       {"bhilq", 1, ScalarType::Char},
      {"bhilq", 2, ScalarType::Short},  {"bhilq", 4, ScalarType::Int},
      {"bhilq", 8, ScalarType::Long},   {"BHILQ", 1, ScalarType::Byte},
      {"BHILQ", 2, ScalarType::UInt16}, {"BHILQ", 4, ScalarType::UInt32},
      {"BHILQ", 8, ScalarType::UInt64}, {"e", 2, ScalarType::Half},
      {"f", 4, ScalarType::Float},      {"d", 8, ScalarType::Double},
  };
  for (const BufferType& t : kTypes) {
    if (t.size == itemsize && t.codes.find(f[0]) != std::string_view::npos) return t.dtype;
  }
  return std::nullopt;
}

// A 0-d array's value (`data`, of `dtype`) as the member it is: an integer or a floating number.
void add_scalar(MemberList& out, std::string_view name, c10::ScalarType dtype, const void* data) {
  if (dtype == c10::ScalarType::UInt64 &&
      c10::fetch_and_cast<uint64_t>(dtype, data) > static_cast<uint64_t>(INT64_MAX)) {
    throw std::runtime_error("member " + quoted(name) + " is the integer " +
                             std::to_string(c10::fetch_and_cast<uint64_t>(dtype, data)) +
                             ", outside int64");
  }
  if (c10::isIntegralType(dtype, /*includeBool=*/true)) {
    out.add_integer(name, c10::fetch_and_cast<int64_t>(dtype, data));
  } else if (c10::isFloatingType(dtype)) {
    out.add_floating(name, c10::fetch_and_cast<double>(dtype, data));
  } else {
    throw std::runtime_error("member " + quoted(name) + " is a 0-d array of " +
                             c10::toString(dtype) + ", not a number");
  }
}

// A Python buffer (PyObject_GetBuffer's view), released on scope exit.
class BufferView {
 public:
  // False (and no Python error set) when `object` has no buffer of these flags.
  bool get(PyObject* object, int flags) {
    if (PyObject_GetBuffer(object, &view_, flags) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    return true;
  }
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }
  const Py_buffer& operator*() const { return view_; }
  const Py_buffer* operator->() const { return &view_; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

}  // namespace

// A loader thread's own Python thread state: made at the thread's first __getitem__ and kept
// until the thread ends, as a worker process keeps its interpreter. So a threading.local of the
// dataset's (a connection per thread) lasts from call to call, and a call does not make and free
// a thread state. The thread ends when its loader is closed, which joins it with the GIL released
// (Loader::close): the state is freed then, under the GIL; once the interpreter is finalizing it
// is left to CPython (taking the GIL then would end the thread inside CPython).
class ThreadStateOfThisThread {
 public:
  // Requires: the GIL is not held by this thread. Guarantees: this thread has a Python thread
  // state that py::gil_scoped_acquire reuses (it finds PyGILState_GetThisThreadState()).
  static void ensure() {
    thread_local ThreadStateOfThisThread kept;
    if (kept.made_) return;
    kept.state_ = PyGILState_Ensure();  // makes the thread state and takes the GIL with it
    kept.made_ = true;
    (void)PyEval_SaveThread();  // the GIL goes; the thread state stays this thread's
  }

  ~ThreadStateOfThisThread() {
    if (!made_ || interpreter_finalizing() || Py_IsInitialized() == 0) return;
    PyEval_RestoreThread(PyGILState_GetThisThreadState());
    PyGILState_Release(state_);  // the last reference: frees the thread state, drops the GIL
  }

 private:
  ThreadStateOfThisThread() = default;
  PyGILState_STATE state_ = PyGILState_UNLOCKED;
  bool made_ = false;
};

// The dataset's samples, one __getitem__ each. Made and destroyed under the GIL, or destroyed
// without it by a loader's thread (then it takes the GIL to drop its objects, or leaks them once
// the interpreter is finalizing).
class PythonDatasetReader final : public MemberReader {
 public:
  struct GilTime {
    double held_seconds = 0;
    double wait_seconds = 0;
    uint64_t calls = 0;
  };

  // Requires the GIL. `names`: the members of a sample that is a tuple or list, in order.
  PythonDatasetReader(py::object dataset, std::vector<std::string> names)
      : dataset_(std::move(dataset)), names_(std::move(names)) {
    const Py_ssize_t size = PyObject_Length(dataset_.ptr());
    if (size < 0) throw py::error_already_set();
    size_ = static_cast<size_t>(size);
    name_ = py::str(py::type::handle_of(dataset_).attr("__qualname__"));
    json_dumps_ = py::module_::import("json").attr("dumps");
    format_exception_ = py::module_::import("traceback").attr("format_exception");
  }

  ~PythonDatasetReader() override {
    if (interpreter_finalizing()) {
      // Taking the GIL now would end this thread inside CPython: the objects are left.
      (void)dataset_.release();
      (void)json_dumps_.release();
      (void)format_exception_.release();
      for (Kept& k : kept_) (void)k.error.release();
      return;
    }
    py::gil_scoped_acquire gil;
    dataset_ = py::object();
    json_dumps_ = py::object();
    format_exception_ = py::object();
    kept_.clear();
  }
  PythonDatasetReader(const PythonDatasetReader&) = delete;
  PythonDatasetReader& operator=(const PythonDatasetReader&) = delete;

  size_t size() const override { return size_; }

  // A loader starts: its GIL time is counted from zero.
  void prepare(size_t workers) override {
    (void)workers;
    held_ns_.store(0);
    wait_ns_.store(0);
    calls_.store(0);
  }

  void read(const SampleContext& ctx, MemberList& out) override {
    using Clock = std::chrono::steady_clock;
    if (interpreter_finalizing()) throw LoadingInterrupted("the interpreter is shutting down");
    ThreadStateOfThisThread::ensure();
    const Clock::time_point asked = Clock::now();
    py::gil_scoped_acquire gil;
    const Clock::time_point taken = Clock::now();
    // Counted before the GIL goes (this is destroyed before `gil`).
    struct Count {
      PythonDatasetReader& reader;
      Clock::time_point asked, taken;
      ~Count() {
        const auto ns = [](Clock::duration d) {
          return static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
        };
        reader.wait_ns_.fetch_add(ns(taken - asked), std::memory_order_relaxed);
        reader.held_ns_.fetch_add(ns(Clock::now() - taken), std::memory_order_relaxed);
        reader.calls_.fetch_add(1, std::memory_order_relaxed);
      }
    } count{*this, asked, taken};
    const py::object index = py::int_(ctx.index);
    PyObject* item = PyObject_GetItem(dataset_.ptr(), index.ptr());
    if (item == nullptr) raised(ctx.index);
    const py::object sample = py::reinterpret_steal<py::object>(item);
    try {
      add_sample(sample.ptr(), out);
    } catch (const py::error_already_set& e) {
      // A Python error reading a value (a str that is not UTF-8, a failing __index__): its text
      // leaves with a plain exception, which a loader's thread may drop without the GIL.
      throw std::runtime_error(std::string("reading what __getitem__ returned: ") + e.what());
    }
  }

  std::string describe(size_t index) const override {
    return name_ + "[" + std::to_string(index) + "]";
  }

  GilTime gil_time() const {
    GilTime t;
    t.held_seconds = static_cast<double>(held_ns_.load()) * 1e-9;
    t.wait_seconds = static_cast<double>(wait_ns_.load()) * 1e-9;
    t.calls = calls_.load();
    return t;
  }

  // The exception that __getitem__(index) raised, taken out (None if none is kept). GIL held.
  py::object take_error(size_t index) {
    py::object error;
    {
      const std::lock_guard<std::mutex> lock(kept_mutex_);
      for (auto it = kept_.begin(); it != kept_.end(); ++it) {
        if (it->index == index) {
          error = std::move(it->error);
          kept_.erase(it);
          break;
        }
      }
    }
    return error ? error : py::none();
  }

 private:
  struct Kept {
    size_t index;
    py::object error;
  };

  // __getitem__(index) raised (the Python error is set): keeps the exception and throws.
  [[noreturn]] void raised(size_t index) {
    py::error_already_set e;  // fetches (and normalizes) the error
    py::object value = e.value();
    const auto held_trace =
        py::reinterpret_steal<py::object>(PyException_GetTraceback(value.ptr()));
    if (e.trace() && (!held_trace || held_trace.is_none())) {
      PyException_SetTraceback(value.ptr(), e.trace().ptr());  // for format_exception and Python
    }
    const bool interrupt = !e.matches(PyExc_Exception);  // KeyboardInterrupt, SystemExit
    const std::string type = type_name(value.ptr());
    std::string message;
    try {
      message = py::str(value);
    } catch (const py::error_already_set&) {
      message = "(its str() raised)";
    }
    std::string traceback;
    try {
      const py::object lines = format_exception_(value);  // with its __traceback__
      traceback = py::str(py::str("").attr("join")(lines));
    } catch (const py::error_already_set&) {
      traceback = "(its traceback could not be formatted)";
    }
    if (traceback.size() > kMaxTracebackBytes) {
      traceback = "...\n" + traceback.substr(traceback.size() - kMaxTracebackBytes);
    }
    keep(index, std::move(value));
    const std::string what = name_ + ".__getitem__(" + std::to_string(index) + ") raised " + type +
                             (message.empty() ? "" : ": " + message) + "\n" + traceback;
    if (interrupt) throw LoadingInterrupted(what);
    throw std::runtime_error(what);
  }

  void keep(size_t index, py::object error) {
    py::object dropped;  // released after the lock, under the GIL still
    const std::lock_guard<std::mutex> lock(kept_mutex_);
    if (kept_.size() >= kMaxKeptErrors) {
      dropped = std::move(kept_.front().error);
      kept_.pop_front();
    }
    kept_.push_back({index, std::move(error)});
  }

  // The sample dataset[i] returned: a dict (or Mapping) of members, or a tuple or list of them
  // in the order of names_.
  void add_sample(PyObject* sample, MemberList& out) {
    if (PyDict_Check(sample)) {
      PyObject* key = nullptr;
      PyObject* value = nullptr;
      Py_ssize_t position = 0;
      while (PyDict_Next(sample, &position, &key, &value)) add_value(member_name(key), value, out);
      return;
    }
    if (PyTuple_Check(sample) || PyList_Check(sample)) {
      const py::sequence items = py::reinterpret_borrow<py::sequence>(sample);
      if (names_.empty()) {
        throw std::runtime_error("__getitem__ returned a " + type_name(sample) +
                                 ", and no names= were given for its items (or return a dict)");
      }
      if (items.size() != names_.size()) {
        throw std::runtime_error("__getitem__ returned a " + type_name(sample) + " of " +
                                 std::to_string(items.size()) + " items, not the " +
                                 std::to_string(names_.size()) + " that names= lists");
      }
      for (size_t i = 0; i < names_.size(); ++i) add_value(names_[i], items[i].ptr(), out);
      return;
    }
    if (PyMapping_Check(sample) && PyObject_HasAttrString(sample, "items")) {
      const py::object items = py::reinterpret_steal<py::object>(PyMapping_Items(sample));
      if (!items) throw py::error_already_set();
      for (const py::handle pair : items) {
        const py::tuple kv = py::reinterpret_borrow<py::tuple>(pair);
        add_value(member_name(kv[0].ptr()), kv[1].ptr(), out);
      }
      return;
    }
    throw std::runtime_error("__getitem__ returned a " + type_name(sample) +
                             ", not a dict of members (or a tuple with names=)");
  }

  static std::string member_name(PyObject* key) {
    if (!PyUnicode_Check(key)) {
      throw std::runtime_error("a member's name is a " + type_name(key) + ", not a str");
    }
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(key, &size);
    if (text == nullptr) throw py::error_already_set();
    return std::string(text, static_cast<size_t>(size));
  }

  // One member's value, copied in by the one table of docs/python.md ("Your own dataset").
  void add_value(std::string_view name, PyObject* value, MemberList& out) {
    if (PyBool_Check(value)) {
      out.add_integer(name, value == Py_True ? 1 : 0);
    } else if (PyLong_Check(value)) {
      add_python_integer(name, value, out);
    } else if (PyFloat_Check(value)) {
      out.add_floating(name, PyFloat_AS_DOUBLE(value));
    } else if (PyBytes_Check(value)) {
      out.add_bytes(name, PyBytes_AS_STRING(value), static_cast<size_t>(PyBytes_GET_SIZE(value)));
    } else if (PyByteArray_Check(value)) {
      out.add_bytes(name, PyByteArray_AS_STRING(value),
                    static_cast<size_t>(PyByteArray_GET_SIZE(value)));
    } else if (PyUnicode_Check(value)) {
      Py_ssize_t size = 0;
      const char* text = PyUnicode_AsUTF8AndSize(value, &size);
      if (text == nullptr) throw py::error_already_set();  // a lone surrogate: not UTF-8
      out.add_bytes(name, text, static_cast<size_t>(size));
    } else if (PyMemoryView_Check(value)) {
      BufferView view;
      if (!view.get(value, PyBUF_C_CONTIGUOUS)) {
        throw std::runtime_error("member " + quoted(name) +
                                 " is a memoryview that is not C-contiguous: pass bytes(view)");
      }
      out.add_bytes(name, view->buf, static_cast<size_t>(view->len));
    } else if (THPVariable_Check(value)) {
      add_tensor(name, THPVariable_Unpack(value), out);
    } else if (add_buffer(name, value, out)) {
      // numpy arrays and scalars, array.array, ...
    } else if (PyIndex_Check(value)) {
      const py::object integer = py::reinterpret_steal<py::object>(PyNumber_Index(value));
      if (!integer) throw py::error_already_set();
      add_python_integer(name, integer.ptr(), out);
    } else if (PyList_Check(value) || PyTuple_Check(value) || PyDict_Check(value)) {
      // Read as a JSON Lines manifest's cell is: Json, Array (multi_hot) and Text fields take it.
      py::object text;
      try {
        text = json_dumps_(py::handle(value));
      } catch (const py::error_already_set& e) {
        throw std::runtime_error("member " + quoted(name) + " is a " + type_name(value) +
                                 " that json.dumps refuses: " + e.what());
      }
      Py_ssize_t size = 0;
      const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
      if (utf8 == nullptr) throw py::error_already_set();
      out.add_bytes(name, utf8, static_cast<size_t>(size));
    } else {
      throw std::runtime_error(
          "member " + quoted(name) + " is a " + type_name(value) +
          ": return bytes (an encoded image), str, int, float, a numpy array or tensor, or a "
          "list or dict (JSON); for an image, its encoded bytes, or a tensor for an Array field");
    }
  }

  static void add_python_integer(std::string_view name, PyObject* value, MemberList& out) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0) {
      throw std::runtime_error("member " + quoted(name) + " is the int " +
                               std::string(py::str(value)) + ", outside int64");
    }
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    out.add_integer(name, static_cast<int64_t>(v));
  }

  static void add_tensor(std::string_view name, const at::Tensor& given, MemberList& out) {
    const at::Tensor t = given.detach().cpu().contiguous();
    if (t.dim() == 0) {
      add_scalar(out, name, t.scalar_type(), t.const_data_ptr());
      return;
    }
    std::byte* to = out.add_array(name, t.scalar_type(), t.sizes());
    const size_t bytes = t.nbytes();
    if (bytes > 0) std::memcpy(to, t.const_data_ptr(), bytes);
  }

  // A value with the buffer protocol (numpy): false if it has none.
  static bool add_buffer(std::string_view name, PyObject* value, MemberList& out) {
    if (!PyObject_CheckBuffer(value)) return false;
    BufferView view;
    if (!view.get(value, PyBUF_RECORDS_RO)) return false;
    const std::optional<c10::ScalarType> dtype = buffer_dtype(view->format, view->itemsize);
    if (!dtype) {
      throw std::runtime_error("member " + quoted(name) + " is a " + type_name(value) +
                               " of format '" + std::string(view->format ? view->format : "B") +
                               "', which has no torch dtype (little-endian bool, integers and "
                               "floats have)");
    }
    const auto ndim = static_cast<size_t>(view->ndim);
    if (ndim == 0) {
      add_scalar(out, name, *dtype, view->buf);
      return true;
    }
    std::vector<int64_t> shape(view->shape, view->shape + ndim);
    std::byte* to = out.add_array(name, *dtype, shape);
    strided_copy(static_cast<const std::byte*>(view->buf), view->shape, view->strides, ndim,
                 static_cast<size_t>(view->itemsize), to);
    return true;
  }

  py::object dataset_;
  std::vector<std::string> names_;
  size_t size_ = 0;
  std::string name_;  // the dataset's class, for describe()
  py::object json_dumps_;
  py::object format_exception_;
  std::mutex kept_mutex_;
  std::deque<Kept> kept_;  // the latest samples' exceptions, oldest first
  std::atomic<uint64_t> held_ns_{0}, wait_ns_{0}, calls_{0};
};

void bind_dataset_reader(py::module_& m) {
  py::class_<PythonDatasetReader, std::shared_ptr<PythonDatasetReader>>(m, "DatasetReader")
      .def("gil",
           [](const PythonDatasetReader& r) {
             const PythonDatasetReader::GilTime t = r.gil_time();
             py::dict d;
             d["held_seconds"] = t.held_seconds;
             d["wait_seconds"] = t.wait_seconds;
             d["calls"] = t.calls;
             return d;
           })
      .def("take_error", &PythonDatasetReader::take_error, py::arg("index"));

  m.def(
      "from_dataset",
      [](py::object dataset, const std::vector<std::pair<std::string, Field>>& fields,
         std::vector<std::string> names) {
        auto reader = std::make_shared<PythonDatasetReader>(std::move(dataset), std::move(names));
        std::shared_ptr<SampleSource> source =
            FieldSource::from_reader(reader, Fields(fields.begin(), fields.end()));
        return py::make_tuple(std::make_unique<Source>(std::move(source), nullptr),
                              std::move(reader));
      },
      py::arg("dataset"), py::arg("fields"), py::arg("names"));
}

}  // namespace conveyor::python
