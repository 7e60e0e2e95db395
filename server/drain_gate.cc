#include "server/drain_gate.h"

namespace kvl::server {

DrainGate::Admission DrainGate::TryEnter(int64_t max_in_flight) {
  absl::MutexLock lock(&mu_);
  if (draining_) return Admission::kDraining;
  if (max_in_flight > 0 && in_flight_ >= max_in_flight) return Admission::kFull;
  ++in_flight_;
  return Admission::kAdmitted;
}

void DrainGate::Exit() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void DrainGate::BeginDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool DrainGate::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool DrainGate::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(this, &DrainGate::IdleLocked), timeout);
}

bool DrainGate::IdleLocked() const { return in_flight_ == 0; }

int64_t DrainGate::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace kvl::server
