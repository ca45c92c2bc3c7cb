#include "errors.h"

#include <stdexcept>

#include <c10/util/Exception.h>

#include "conveyor/loader.h"

namespace conveyor::detail {

void throw_joined() {
  throw std::logic_error("conveyor: the DataLoader was joined; it yields no batches");
}

void throw_sample_failure(size_t index, const std::string& path, size_t batch, uint64_t epoch,
                          const std::string& what, std::exception_ptr original) {
  throw SampleError("conveyor: sample " + std::to_string(index) + " (" + path +
                        ") failed in batch " + std::to_string(batch) + " of epoch " +
                        std::to_string(epoch) + ": " + what,
                    index, path, std::move(original));
}

std::string exception_message(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception (not derived from std::exception)";
  }
}

void throw_torch_timeout(std::optional<std::chrono::milliseconds> timeout,
                         const std::string& detail) {
  TORCH_CHECK(false, "Timeout in DataLoader queue while waiting for next batch (timeout was ",
              timeout ? timeout->count() : 0, " ms); ", detail);
  std::terminate();  // TORCH_CHECK(false, ...) always throws
}

}  // namespace conveyor::detail
