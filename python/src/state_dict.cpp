// The loader's checkpoint as a plain dict: DataLoader::save() writes a torch::serialize archive,
// which is written to memory and read back to list its values (ints and strings); the dict is
// written into an archive the same way for DataLoader::load(). So torch.save() stores the state
// as Python values and torch.load(weights_only=True) reads it back, with no engine change.
#include <sstream>
#include <stdexcept>

#include <torch/serialize/archive.h>

#include "bindings.h"

namespace conveyor::python {

py::dict save_state(const DataLoader& loader) {
  torch::serialize::OutputArchive out;
  loader.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  py::dict state;
  for (const std::string& key : in.keys()) {
    c10::IValue value;
    in.read(key, value);
    if (value.isInt()) {
      state[py::str(key)] = py::int_(value.toInt());
    } else if (value.isString()) {
      state[py::str(key)] = py::str(value.toStringRef());
    } else if (value.isBool()) {
      state[py::str(key)] = py::bool_(value.toBool());
    } else if (value.isDouble()) {
      state[py::str(key)] = py::float_(value.toDouble());
    } else {
      throw std::logic_error("conveyor: the checkpoint's '" + key + "' is a " + value.tagKind() +
                             ", which the Python state dict does not carry");
    }
  }
  return state;
}

void load_state(DataLoader& loader, const py::dict& state) {
  torch::serialize::OutputArchive out;
  for (const auto& [key_object, value] : state) {
    if (!py::isinstance<py::str>(key_object)) {
      throw std::invalid_argument(
          "conveyor: load_state_dict: the state's keys are strings, not " +
          std::string(py::str(py::type::of(key_object)).cast<std::string>()));
    }
    const std::string key = key_object.cast<std::string>();
    if (py::isinstance<py::bool_>(value)) {
      out.write(key, c10::IValue(static_cast<int64_t>(value.cast<bool>())));
    } else if (py::isinstance<py::int_>(value)) {
      out.write(key, c10::IValue(value.cast<int64_t>()));
    } else if (py::isinstance<py::str>(value)) {
      out.write(key, c10::IValue(value.cast<std::string>()));
    } else if (py::isinstance<py::float_>(value)) {
      out.write(key, c10::IValue(value.cast<double>()));
    } else {
      throw std::invalid_argument("conveyor: load_state_dict: state['" + key + "'] is a " +
                                  py::str(py::type::of(value)).cast<std::string>() +
                                  "; a Conveyor state holds ints and strings only");
    }
  }
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  loader.load(in);
}

}  // namespace conveyor::python
