// SerialIntraOpScope and PrepareIntraOpThread (model/engine.h): a translated
// span runs on its turn's thread alone, while every other thread keeps the
// process's intra-op thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <thread>

#include "model/engine.h"

namespace kvl {
namespace {

int ThreadsSeenByANewThread() {
  int n = 0;
  std::thread t([&n] {
    PrepareIntraOpThread();
    n = at::get_num_threads();
  });
  t.join();
  return n;
}

TEST(SerialIntraOpScopeTest, OnlyTheCallingThreadRunsSeriallyAndOnlyWhileTheScopeLives) {
  at::set_num_threads(2);
  ASSERT_EQ(at::get_num_threads(), 2);
  {
    SerialIntraOpScope serial;
    EXPECT_EQ(at::get_num_threads(), 1);
    EXPECT_EQ(ThreadsSeenByANewThread(), 2);
    {
      SerialIntraOpScope nested;
      EXPECT_EQ(at::get_num_threads(), 1);
    }
    EXPECT_EQ(at::get_num_threads(), 1);
    // Work inside the scope gives the same numbers.
    const at::Tensor x = at::arange(1 << 20, at::kDouble);
    EXPECT_EQ(x.sum().item<double>(), (1 << 20) * ((1 << 20) - 1.0) / 2);
  }
  EXPECT_EQ(at::get_num_threads(), 2);
}

TEST(SerialIntraOpScopeTest, WorksOnAThreadThatNeverRanAParallelOperation) {
  at::set_num_threads(2);
  int inside = 0, after = 0;
  std::thread t([&] {
    {
      SerialIntraOpScope serial;
      inside = at::get_num_threads();
    }
    after = at::get_num_threads();
  });
  t.join();
  EXPECT_EQ(inside, 1);
  EXPECT_EQ(after, 2);
}

}  // namespace
}  // namespace kvl
