// SerialIntraOpScope and PrepareIntraOpThread (model/engine.h): a translated
// span runs on its turn's thread alone, while every other thread keeps the
// process's intra-op thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "base/notification.h"
#include "model/engine.h"

namespace kvl {
namespace {

// 3, not the machine's core count, so that a default cannot pass for it.
constexpr int kThreads = 3;

// The most distinct intra-op threads one at::parallel_for over many small
// chunks ran on (1 when it ran serially).
int ThreadsUsedByAParallelFor() {
  std::atomic<int> max_id{0};
  at::parallel_for(0, 1 << 16, /*grain_size=*/1, [&](int64_t, int64_t) {
    int id = at::get_thread_num();
    int seen = max_id.load();
    while (id > seen && !max_id.compare_exchange_weak(seen, id)) {
    }
  });
  return max_id.load() + 1;
}

TEST(SerialIntraOpScopeTest, OnlyTheCallingThreadRunsSeriallyAndOnlyWhileTheScopeLives) {
  at::set_num_threads(kThreads);
  ASSERT_EQ(at::get_num_threads(), kThreads);

  // Another thread, already set up and mid-"turn" while the scope is open.
  Notification other_ready, scope_open, other_checked;
  int other_inside = 0;
  std::thread other([&] {
    PrepareIntraOpThread();
    other_ready.Notify();
    scope_open.WaitForNotification();
    other_inside = at::get_num_threads();
    other_checked.Notify();
  });
  other_ready.WaitForNotification();
  {
    SerialIntraOpScope serial;
    scope_open.Notify();
    other_checked.WaitForNotification();
    EXPECT_EQ(other_inside, kThreads);
    EXPECT_EQ(at::get_num_threads(), 1);
    EXPECT_EQ(ThreadsUsedByAParallelFor(), 1);
    {
      SerialIntraOpScope nested;
      EXPECT_EQ(at::get_num_threads(), 1);
    }
    EXPECT_EQ(at::get_num_threads(), 1);
    // Work inside the scope gives the same numbers.
    const at::Tensor x = at::arange(1 << 20, at::kDouble);
    EXPECT_EQ(x.sum().item<double>(), (1 << 20) * ((1 << 20) - 1.0) / 2);
  }
  other.join();
  EXPECT_EQ(at::get_num_threads(), kThreads);
  EXPECT_GT(ThreadsUsedByAParallelFor(), 1);
}

TEST(SerialIntraOpScopeTest, WorksOnAThreadThatNeverRanAParallelOperation) {
  at::set_num_threads(kThreads);
  int inside = 0, used_inside = 0, after = 0;
  std::thread t([&] {
    {
      SerialIntraOpScope serial;
      inside = at::get_num_threads();
      used_inside = ThreadsUsedByAParallelFor();
    }
    after = at::get_num_threads();
  });
  t.join();
  EXPECT_EQ(inside, 1);
  EXPECT_EQ(used_inside, 1);
  EXPECT_EQ(after, kThreads);
}

}  // namespace
}  // namespace kvl
