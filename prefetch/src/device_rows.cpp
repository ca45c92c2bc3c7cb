// check_device_rows (conveyor/prefetch.h): the one check of the rows GPU decode left on the
// device, before a copy engine queues anything.
#include <stdexcept>
#include <string>

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

}  // namespace conveyor
