// Admission of long-running calls (Chat streams) and waiting for them at
// shutdown. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
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
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvl::server
