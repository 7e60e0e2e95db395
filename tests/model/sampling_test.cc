// Sampling: greedy, seeded determinism, and the sets top-k / top-p allow.
#include "model/sampling.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

namespace kvl {
namespace {

SamplingParams Params(double temperature, int64_t top_k = 0, double top_p = 1.0) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

// logits whose softmax is exactly probs.
at::Tensor FromProbs(const std::vector<double>& probs) {
  return at::tensor(probs, at::TensorOptions().dtype(at::kDouble)).log().to(at::kFloat);
}

std::map<int64_t, int> Histogram(Sampler& s, const at::Tensor& logits, int n) {
  std::map<int64_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.Sample(logits)];
  return h;
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler s(Params(0.0), 1);
  EXPECT_EQ(s.Sample(at::tensor({0.1f, 2.0f, -1.0f, 2.0f})), 1);
  EXPECT_EQ(s.Sample(at::tensor({5.0f, 2.0f})), 0);
}

TEST(Sampler, DeterministicPerSeed) {
  const at::Tensor logits = at::randn({500});
  auto draw = [&](uint64_t seed) {
    Sampler s(Params(1.0, 50, 0.9), seed);
    std::vector<int64_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.Sample(logits));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, TopKOnlyDrawsFromTheKBest) {
  const at::Tensor logits = at::tensor({1.0f, 3.0f, 0.5f, 2.5f, 2.9f, -4.0f});
  Sampler s(Params(1.0, 3), 7);
  const auto h = Histogram(s, logits, 3000);
  std::set<int64_t> seen;
  for (const auto& [id, n] : h) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int64_t>{1, 3, 4}));  // all three appear, nothing else
}

TEST(Sampler, TopKKeepsTies) {
  Sampler s(Params(1.0, 1), 1);
  const auto c = s.Candidates(at::tensor({2.0f, 1.0f, 2.0f}));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].first, 0);
  EXPECT_EQ(c[1].first, 2);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  const at::Tensor logits = FromProbs({0.15, 0.5, 0.05, 0.3});
  {
    // 0.5 < 0.75, 0.5 + 0.3 >= 0.75: tokens 1 and 3.
    Sampler s(Params(1.0, 0, 0.75), 3);
    const auto c = s.Candidates(logits);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0].first, 1);
    EXPECT_EQ(c[1].first, 3);
    EXPECT_NEAR(c[0].second, 0.5 / 0.8, 1e-6);
    const auto h = Histogram(s, logits, 4000);
    EXPECT_EQ(h.size(), 2u);
    EXPECT_NEAR(h.at(1) / 4000.0, 0.625, 0.04);  // ~5 sigma
  }
  {
    Sampler s(Params(1.0, 0, 0.81), 3);
    const auto h = Histogram(s, logits, 3000);
    EXPECT_EQ(h.size(), 3u);
    EXPECT_EQ(h.count(2), 0u);
  }
}

TEST(Sampler, TopPOverLargeVocabularies) {
  // The growing partial sort must still find the whole nucleus.
  const at::Tensor logits = at::zeros({10000});  // uniform
  Sampler s(Params(1.0, 0, 0.49995), 1);         // 5000 tokens of 1e-4 reach it, 4999 do not
  EXPECT_EQ(s.Candidates(logits).size(), 5000u);
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  const at::Tensor logits = FromProbs({0.6, 0.4});
  Sampler cold(Params(0.25), 1), hot(Params(4.0), 1);
  EXPECT_GT(cold.Candidates(logits)[0].second, 0.8);  // 0.6^4 / (0.6^4 + 0.4^4) = 0.835
  EXPECT_LT(hot.Candidates(logits)[0].second, 0.53);  // 0.6^.25 / (...) = 0.525
}

TEST(Sampler, ValidatesParams) {
  EXPECT_TRUE(ValidateSamplingParams(Params(0.7, 40, 0.95)).ok());
  EXPECT_EQ(ValidateSamplingParams(Params(-1.0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0, -2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0, 0, 0.0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0, 0, 1.5)).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl
