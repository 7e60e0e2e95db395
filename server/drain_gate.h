// Admission of long-running calls (Chat streams) and waiting for them at
// shutdown. Thread-safe.
//
// The server's classes synchronise with std::mutex / std::condition_variable,
// not absl::Mutex: ThreadSanitizer sees pthread, but not the uninstrumented
// shared libabsl (docs/testing.md, experiments/tsan_scheduler/README.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/time/time.h"

namespace kvl::server {

class DrainGate {
 public:
  enum class Admission {
    kAdmitted,  // the caller owns one slot and must Exit() exactly once
    kDraining,  // draining has begun: refuse the call (UNAVAILABLE)
    kFull,      // max_in_flight calls are in flight: refuse it (RESOURCE_EXHAUSTED)
  };
  // max_in_flight 0: no limit.
  Admission TryEnter(int64_t max_in_flight = 0);
  void Exit();
  void BeginDrain();
  bool draining() const;
  // Waits until no call is in flight or `timeout` passes; true if none is left.
  bool WaitIdle(absl::Duration timeout);
  int64_t in_flight() const;

 private:
  // mu_ guards draining_ and in_flight_; idle_ wakes WaitIdle when a call exits.
  mutable std::mutex mu_;
  std::condition_variable idle_;
  bool draining_ = false;
  int64_t in_flight_ = 0;
};

}  // namespace kvl::server
