// tests/expect_sample_error.h: the check every test of a bad sample makes.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "conveyor/conveyor.h"

namespace conveyor::testing {

// Iterates `loader` until it throws, and expects a SampleError for sample `index` whose message
// holds every one of `phrases` (a file, a line, a field, a bound). Fails when nothing is thrown.
inline void expect_sample_error(DataLoader& loader, size_t index,
                                const std::vector<std::string>& phrases) {
  try {
    for (Batch& batch : loader) (void)batch;
  } catch (const SampleError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.index(), index) << what;
    for (const std::string& phrase : phrases) {
      EXPECT_NE(what.find(phrase), std::string::npos) << "no \"" << phrase << "\" in: " << what;
    }
    return;
  }
  ADD_FAILURE() << "no error: every sample was delivered";
}

}  // namespace conveyor::testing
