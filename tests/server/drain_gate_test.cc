// Admission and draining of Chat streams (server/drain_gate.h).
#include "server/drain_gate.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kvl::server {
namespace {

TEST(DrainGateTest, RefusesNewCallsOnceDrainingAndWaitsForRunningOnes) {
  DrainGate gate;
  ASSERT_EQ(gate.TryEnter(), DrainGate::Admission::kAdmitted);
  ASSERT_EQ(gate.TryEnter(), DrainGate::Admission::kAdmitted);
  EXPECT_EQ(gate.in_flight(), 2);
  gate.BeginDrain();
  EXPECT_TRUE(gate.draining());
  EXPECT_EQ(gate.TryEnter(), DrainGate::Admission::kDraining);
  EXPECT_EQ(gate.in_flight(), 2);

  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(gate.WaitIdle(absl::Milliseconds(50)));
  // Abseil times the wait on its own clock, which may end it a fraction of a
  // millisecond before steady_clock says 50 ms have passed (seen: 49.7 ms).
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));

  gate.Exit();
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.Exit();
  });
  EXPECT_TRUE(gate.WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(gate.in_flight(), 0);
  finisher.join();
}

TEST(DrainGateTest, AdmitsUpToTheLimitAndAgainOnceACallEnds) {
  DrainGate gate;
  ASSERT_EQ(gate.TryEnter(2), DrainGate::Admission::kAdmitted);
  ASSERT_EQ(gate.TryEnter(2), DrainGate::Admission::kAdmitted);
  EXPECT_EQ(gate.TryEnter(2), DrainGate::Admission::kFull);
  EXPECT_EQ(gate.in_flight(), 2);  // a refused call holds no slot
  gate.Exit();
  EXPECT_EQ(gate.TryEnter(2), DrainGate::Admission::kAdmitted);
  EXPECT_EQ(gate.TryEnter(0), DrainGate::Admission::kAdmitted);  // 0: no limit
  gate.BeginDrain();
  EXPECT_EQ(gate.TryEnter(100), DrainGate::Admission::kDraining);
}

// An operator's "wait for ever" (absl::InfiniteDuration) waits until the last
// call ends: a condition variable adds the timeout to now(), so an unclamped
// infinite timeout would overflow into the past and return at once, false.
TEST(DrainGateTest, AnInfiniteWaitEndsWhenTheLastCallDoes) {
  DrainGate gate;
  ASSERT_EQ(gate.TryEnter(), DrainGate::Admission::kAdmitted);
  gate.BeginDrain();
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.Exit();
  });
  EXPECT_TRUE(gate.WaitIdle(absl::InfiniteDuration()));
  EXPECT_EQ(gate.in_flight(), 0);
  finisher.join();
}

TEST(DrainGateTest, IdleGateDrainsAtOnce) {
  DrainGate gate;
  gate.BeginDrain();
  EXPECT_TRUE(gate.WaitIdle(absl::ZeroDuration()));
}

}  // namespace
}  // namespace kvl::server
