// router/gate.h: the live quality gate on a clock the test moves.
#include "router/gate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <optional>
#include <string>

namespace kvl::router {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

class GateTest : public ::testing::Test {
 protected:
  QualityGate Make(double bound, int64_t window, int64_t min_samples) {
    GateConfig config;
    config.max_divergence = bound;
    config.window = window;
    config.min_samples = min_samples;
    config.cooldown = std::chrono::seconds(600);
    return QualityGate(3, config, [this] { return now_; });
  }
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
};

TEST_F(GateTest, APairClosesOnceItsMeanOverTheWindowExceedsTheBound) {
  QualityGate gate = Make(0.5, 3, 2);
  EXPECT_FALSE(gate.Feed(0, 2, 0.9).has_value());  // one sample: below min_samples
  EXPECT_TRUE(gate.Open(0, 2));
  EXPECT_FALSE(gate.Feed(0, 2, 0.0).has_value());  // mean 0.45
  EXPECT_TRUE(gate.Open(0, 2));
  // The window keeps the last 3: {0.9, 0.0, 0.7}, mean 0.533.
  const std::optional<std::string> closed = gate.Feed(0, 2, 0.7);
  ASSERT_TRUE(closed.has_value());
  EXPECT_THAT(*closed, HasSubstr("mean switch divergence 0.533333 nats/token over the last 3"));
  EXPECT_THAT(*closed, HasSubstr("exceeds 0.5 (for 600 s)"));
  std::string why;
  EXPECT_FALSE(gate.Open(0, 2, &why));
  EXPECT_EQ(why, *closed);
  // Other pairs, the reverse direction included, are untouched.
  EXPECT_TRUE(gate.Open(2, 0));
  EXPECT_TRUE(gate.Open(0, 1));
  // A closed pair takes no scores.
  EXPECT_FALSE(gate.Feed(0, 2, 100.0).has_value());
}

TEST_F(GateTest, AClosedPairReopensAfterItsCoolDownOnProbation) {
  QualityGate gate = Make(0.5, 10, 2);
  ASSERT_FALSE(gate.Feed(1, 0, 1.0).has_value());
  ASSERT_TRUE(gate.Feed(1, 0, 1.0).has_value());
  now_ += std::chrono::seconds(599);
  bool reopened = true;
  EXPECT_FALSE(gate.Open(1, 0, nullptr, &reopened));
  EXPECT_FALSE(reopened);
  now_ += std::chrono::seconds(1);
  EXPECT_TRUE(gate.Open(1, 0, nullptr, &reopened));
  EXPECT_TRUE(reopened);
  EXPECT_TRUE(gate.Open(1, 0, nullptr, &reopened));
  EXPECT_FALSE(reopened);  // reported once
  // On probation: the window starts empty, so the scores before the closing
  // do not count, and min_samples new ones above the bound close it again.
  EXPECT_FALSE(gate.Feed(1, 0, 0.6).has_value());
  EXPECT_TRUE(gate.Feed(1, 0, 0.6).has_value());
  EXPECT_FALSE(gate.Open(1, 0));
}

TEST_F(GateTest, AtInfinityNoScoreClosesAPair) {
  QualityGate gate = Make(std::numeric_limits<double>::infinity(), 1, 1);
  EXPECT_FALSE(gate.Feed(0, 1, 1e300).has_value());
  EXPECT_TRUE(gate.Open(0, 1));
}

TEST_F(GateTest, ARefusedPairStaysClosedWhateverTheClock) {
  QualityGate gate = Make(0.5, 1, 1);
  gate.Refuse(0, 1, "refused at load by the quality gate: recovered 0.1 < 0.5");
  now_ += std::chrono::hours(24 * 365 * 100);
  std::string why;
  EXPECT_FALSE(gate.Open(0, 1, &why));
  EXPECT_EQ(why, "refused at load by the quality gate: recovered 0.1 < 0.5");
}

}  // namespace
}  // namespace kvl::router
