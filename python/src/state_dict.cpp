// The loader's checkpoint as a plain dict: DataLoader::state()'s values (ints, strings, lists of
// ints) as Python values, and back into a LoaderState for DataLoader::load_state(). Nothing goes
// through a torch archive, so nothing is executed: torch.save() stores the state as Python
// values and torch.load(weights_only=True) reads it back.
#include <Python.h>

#include <stdexcept>
#include <string_view>
#include <variant>

#include "bindings.h"
#include "conveyor/internal/printable.h"

namespace conveyor::python {
namespace {

// `text` as UTF-8 (no copy), or std::invalid_argument naming `what`.
std::string_view utf8_of(const py::handle& text, const std::string& what) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    throw std::invalid_argument("conveyor: load_state_dict: " + what +
                                " is a str that is not valid text (it cannot be UTF-8)");
  }
  return {data, static_cast<size_t>(size)};
}

// A Python int as an int64, or std::invalid_argument naming `what`.
int64_t int64_of(const py::handle& value, const std::string& what) {
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0) {
    throw std::invalid_argument(
        "conveyor: load_state_dict: " + what + " is an integer of " +
        std::to_string(value.attr("bit_length")().cast<size_t>()) +
        " bits; a Conveyor state holds integers of 64 bits (-2**63 to 2**63 - 1)");
  }
  if (number == -1 && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<int64_t>(number);
}

std::string type_name(const py::handle& value) {
  return detail::printable(py::str(py::type::of(value)).cast<std::string>());
}

}  // namespace

py::dict save_state(const DataLoader& loader) {
  const LoaderState saved = loader.state();  // held: values() refers into it
  py::dict state;
  for (const auto& [key, value] : saved.values()) {
    if (const auto* number = std::get_if<int64_t>(&value)) {
      state[py::str(key)] = py::int_(*number);
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      state[py::str(key)] = py::str(*text);
    } else {
      py::list list;
      for (const int64_t v : std::get<std::vector<int64_t>>(value)) list.append(py::int_(v));
      state[py::str(key)] = list;
    }
  }
  return state;
}

void load_state(DataLoader& loader, const py::dict& state) {
  LoaderState values;
  for (const auto& [key_object, value] : state) {
    if (!py::isinstance<py::str>(key_object)) {
      throw std::invalid_argument("conveyor: load_state_dict: the state's keys are strings, not " +
                                  type_name(key_object));
    }
    const std::string_view key = utf8_of(key_object, "a key");
    const std::string where = "state['" + detail::printable(key) + "']";
    if (py::isinstance<py::bool_>(value)) {
      values.set_int(key, value.cast<bool>() ? 1 : 0);
    } else if (py::isinstance<py::int_>(value)) {
      values.set_int(key, int64_of(value, where));
    } else if (py::isinstance<py::str>(value)) {
      values.set_string(key, utf8_of(value, where));
    } else if (py::isinstance<py::list>(value)) {
      const auto list = py::reinterpret_borrow<py::list>(value);
      std::vector<int64_t> numbers;
      numbers.reserve(list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string item = where + "[" + std::to_string(i) + "]";
        if (!py::isinstance<py::int_>(list[i]) || py::isinstance<py::bool_>(list[i])) {
          throw std::invalid_argument("conveyor: load_state_dict: " + item + " is a " +
                                      type_name(list[i]) + ", not an int");
        }
        numbers.push_back(int64_of(list[i], item));
      }
      values.set_list(key, std::move(numbers));
    } else {
      throw std::invalid_argument("conveyor: load_state_dict: " + where + " is a " +
                                  type_name(value) +
                                  "; a Conveyor state holds ints, strings and lists of ints");
    }
  }
  loader.load_state(values);
}

}  // namespace conveyor::python
