// loader/src/errors.h (detail): the messages the engine and the drop-in share, written once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>

namespace conveyor::detail {

// A loader used after join(): std::logic_error (conveyor::DataLoader and the drop-in).
[[noreturn]] void throw_joined();

// A sample's failure in its batch, as the consumer sees it: SampleError("conveyor: sample INDEX
// (PATH) failed in batch BATCH of epoch EPOCH: WHAT"), carrying `original`.
[[noreturn]] void throw_sample_failure(size_t index, const std::string& path, size_t batch,
                                       uint64_t epoch, const std::string& what,
                                       std::exception_ptr original);

// What an exception says: its what(), or a note that it is not a std::exception.
std::string exception_message(const std::exception_ptr& error);

// torch::data's timeout error (c10::Error, "Timeout in DataLoader queue while waiting for next
// batch (timeout was N ms)"), followed by Conveyor's `detail` on what was being waited for.
[[noreturn]] void throw_torch_timeout(std::optional<std::chrono::milliseconds> timeout,
                                      const std::string& detail);

}  // namespace conveyor::detail
