#include "server/turn_pool.h"

#include <utility>

namespace kvl::server {

TurnPool::TurnPool(int n_threads, std::function<void()> thread_init) {
  for (int i = 0; i < n_threads; ++i) {
    threads_.emplace_back([this, thread_init] { Loop(thread_init); });
  }
  absl::MutexLock lock(&mu_);
  auto all_started = [this, n_threads]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return n_started_ == n_threads;
  };
  mu_.Await(absl::Condition(&all_started));
}

TurnPool::~TurnPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void TurnPool::Submit(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

void TurnPool::Loop(const std::function<void()>& thread_init) {
  if (thread_init) thread_init();
  {
    absl::MutexLock lock(&mu_);
    ++n_started_;
  }
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !jobs_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace kvl::server
