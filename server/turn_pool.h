// A fixed set of threads that run chat turns, so that gRPC reactions only
// enqueue (a turn blocks its thread on model work for its whole length). The
// server keeps a second, small one for the session calls' store work
// (server/services.h), so that they never wait behind turns.
//
// Thread-safe: Submit may be called from any thread. The destructor runs what
// is queued, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace kvl::server {

class TurnPool {
 public:
  // Each thread runs thread_init (when set) as it starts; the constructor
  // returns once all of them have, so per-thread set-up costs start-up time,
  // never a turn's. thread_init must not throw (it would end the process).
  explicit TurnPool(int n_threads, std::function<void()> thread_init = nullptr);
  ~TurnPool();
  TurnPool(const TurnPool&) = delete;
  TurnPool& operator=(const TurnPool&) = delete;

  void Submit(std::function<void()> job);

 private:
  void Loop(const std::function<void()>& thread_init);

  // work_ wakes the threads when a job queues or stopping_ is set;
  // started_ wakes the constructor as each thread has run thread_init.
  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable started_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int n_started_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

}  // namespace kvl::server
