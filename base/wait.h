// Timeouts for std::condition_variable::wait_for given as absl::Duration.
#pragma once

#include <algorithm>
#include <chrono>

#include "absl/time/time.h"

namespace kvl {

// `timeout` as the std::chrono duration a condition variable waits for, cut to
// a year: wait_for adds it to steady_clock::now(), which overflows for
// absl::InfiniteDuration() and other huge values. Negative means do not wait.
inline std::chrono::nanoseconds WaitForTimeout(absl::Duration timeout) {
  constexpr absl::Duration kLongestWait = absl::Hours(24 * 365);
  return absl::ToChronoNanoseconds(std::min(timeout, kLongestWait));
}

}  // namespace kvl
