// server/protobuf_log.h: the rate limiter on an injected clock.
#include "server/protobuf_log.h"

#include <gtest/gtest.h>

#include <chrono>

namespace kvl::server {
namespace {

using namespace std::chrono_literals;

TEST(LogRateLimiterTest, AllowsABurstPerWindowAndCountsTheDropped) {
  std::chrono::steady_clock::time_point now{};
  LogRateLimiter limiter(3, 60s, [&] { return now; });
  int64_t dropped = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.Allow(&dropped));
    EXPECT_EQ(dropped, 0);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.Allow(&dropped));
  now += 59s;
  EXPECT_FALSE(limiter.Allow(&dropped));
  now += 1s;
  ASSERT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 1001);
  EXPECT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 0);
}

}  // namespace
}  // namespace kvl::server
