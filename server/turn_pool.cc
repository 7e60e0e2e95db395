#include "server/turn_pool.h"

#include <utility>

namespace kvl::server {

TurnPool::TurnPool(int n_threads, std::function<void()> thread_init) {
  for (int i = 0; i < n_threads; ++i) {
    threads_.emplace_back([this, thread_init] { Loop(thread_init); });
  }
  std::unique_lock<std::mutex> lock(mu_);
  started_.wait(lock, [this, n_threads] { return n_started_ == n_threads; });
}

TurnPool::~TurnPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TurnPool::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  work_.notify_one();
}

void TurnPool::Loop(const std::function<void()>& thread_init) {
  if (thread_init) thread_init();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_started_;
  }
  started_.notify_one();
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace kvl::server
