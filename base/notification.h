// A one-shot event: one thread calls Notify() once, any number of threads wait
// for it. The interface of absl::Notification, built on std::mutex and
// std::condition_variable: ThreadSanitizer sees those directly (they go
// through pthread). Debian's libabsl is not instrumented; TSan builds see its
// Notification only through base/tsan/hidden_sync.cc, which cannot cover the
// inline HasBeenNotified() (docs/testing.md, "ThreadSanitizer").
//
// Thread-safe. The object may be destroyed as soon as a wait has returned:
// Notify() wakes the waiters while it holds the mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace kvl {

class Notification {
 public:
  Notification() = default;
  Notification(const Notification&) = delete;
  Notification& operator=(const Notification&) = delete;

  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    notified_ = true;
    cv_.notify_all();
  }
  bool HasBeenNotified() const {
    std::lock_guard<std::mutex> lock(mu_);
    return notified_;
  }
  void WaitForNotification() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return notified_; });
  }
  // True if notified within `timeout`.
  template <class Rep, class Period>
  bool WaitForNotificationWithTimeout(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return notified_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool notified_ = false;
};

}  // namespace kvl
