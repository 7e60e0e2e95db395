// The server's turn threads (server/turn_pool.h).
#include "server/turn_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "base/notification.h"

namespace kvl::server {
namespace {

TEST(TurnPoolTest, EveryThreadRunsItsInitBeforeTheConstructorReturnsAndBeforeAnyJob) {
  constexpr int kThreads = 4;
  std::mutex mu;
  std::set<std::thread::id> initialised;
  std::atomic<int> inits{0};
  TurnPool pool(kThreads, [&] {
    // Slow enough that a constructor which did not wait would return first.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    initialised.insert(std::this_thread::get_id());
    inits.fetch_add(1);
  });
  EXPECT_EQ(inits.load(), kThreads);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(initialised.size(), static_cast<size_t>(kThreads));
  }

  // kThreads jobs that wait for each other occupy every thread at once.
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  Notification all_finished;
  std::set<std::thread::id> ran_on;
  for (int i = 0; i < kThreads; ++i) {
    pool.Submit([&] {
      {
        std::lock_guard<std::mutex> lock(mu);
        ran_on.insert(std::this_thread::get_id());
      }
      started.fetch_add(1);
      // Fewer threads than jobs would leave this waiting: give up after 30 s
      // (and fail below) rather than hang.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (started.load() < kThreads && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::yield();
      }
      if (finished.fetch_add(1) + 1 == kThreads) all_finished.Notify();
    });
  }
  all_finished.WaitForNotification();
  EXPECT_EQ(started.load(), kThreads);
  EXPECT_EQ(ran_on, initialised);
  EXPECT_EQ(inits.load(), kThreads);  // once per thread, not per job
}

TEST(TurnPoolTest, DestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    TurnPool pool(1);
    Notification first_running;
    Notification release;
    pool.Submit([&] {
      first_running.Notify();
      release.WaitForNotification();
      ran.fetch_add(1);
    });
    first_running.WaitForNotification();
    for (int i = 0; i < 5; ++i) pool.Submit([&] { ran.fetch_add(1); });
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 6);
}

}  // namespace
}  // namespace kvl::server
