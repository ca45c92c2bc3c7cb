// check_device_rows and host_rows (conveyor/prefetch.h): the one check of the rows GPU decode
// left on the device, before a copy engine queues anything, and the one rule of which rows come
// from the host.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "conveyor/prefetch.h"

namespace conveyor {

void check_device_rows(const std::vector<at::Tensor>& host,
                       const std::vector<DeviceRows>& on_device, const c10::Device& device) {
  for (size_t i = 0; i < on_device.size(); ++i) {
    const DeviceRows& d = on_device[i];
    const std::string which = "conveyor: device rows " + std::to_string(i) + " (field " +
                              std::to_string(d.field) + ", from row " +
                              std::to_string(d.first_row) + ")";
    if (d.field >= host.size()) {
      throw std::invalid_argument(which + ": the batch has " + std::to_string(host.size()) +
                                  " fields");
    }
    const at::Tensor& h = host[d.field];
    if (!d.rows.defined() || d.rows.dim() != h.dim() || h.dim() == 0) {
      throw std::invalid_argument(which + ": not rows of the field's shape");
    }
    if (d.first_row < 0 || d.first_row + d.rows.size(0) > h.size(0)) {
      throw std::invalid_argument(which + ": " + std::to_string(d.rows.size(0)) +
                                  " rows do not fit a field of " + std::to_string(h.size(0)));
    }
    if (d.rows.sizes().slice(1) != h.sizes().slice(1) || d.rows.dtype() != h.dtype()) {
      throw std::invalid_argument(which + ": rows of another shape or dtype than the field's");
    }
    if (!d.rows.is_contiguous()) throw std::invalid_argument(which + ": not contiguous");
    if (d.rows.device() != device) {
      throw std::invalid_argument(which + ": on " + d.rows.device().str() + ", not on " +
                                  device.str());
    }
  }
}

std::vector<HostRows> host_rows(const std::vector<at::Tensor>& host,
                                const std::vector<DeviceRows>& on_device) {
  std::vector<HostRows> runs;
  std::vector<std::pair<int64_t, int64_t>> replaced;  // one field's [first, last) from the device
  for (size_t f = 0; f < host.size(); ++f) {
    const int64_t rows = host[f].dim() == 0 ? 1 : host[f].size(0);
    replaced.clear();
    for (const DeviceRows& d : on_device) {
      if (d.field == f) replaced.emplace_back(d.first_row, d.first_row + d.rows.size(0));
    }
    std::sort(replaced.begin(), replaced.end());
    int64_t next = 0;  // the first row not yet placed in a run or replaced
    for (const auto& [first, last] : replaced) {
      if (first > next) runs.push_back(HostRows{f, next, first - next});
      next = std::max(next, last);
    }
    if (next < rows) runs.push_back(HostRows{f, next, rows - next});
  }
  return runs;
}

}  // namespace conveyor
