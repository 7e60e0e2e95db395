#include "server/drain_gate.h"

#include "base/wait.h"

namespace kvl::server {

DrainGate::Admission DrainGate::TryEnter(int64_t max_in_flight) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return Admission::kDraining;
  if (max_in_flight > 0 && in_flight_ >= max_in_flight) return Admission::kFull;
  ++in_flight_;
  return Admission::kAdmitted;
}

void DrainGate::Exit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) idle_.notify_all();
}

void DrainGate::BeginDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool DrainGate::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

bool DrainGate::WaitIdle(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, WaitForTimeout(timeout),
                        [this] { return in_flight_ == 0; });
}

int64_t DrainGate::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

}  // namespace kvl::server
