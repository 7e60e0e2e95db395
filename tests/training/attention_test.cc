// training::GroupedAttention against the eager attention it replaces
// in training and evaluation: in float32 the same logits and the same gradients
// (weights, and an injected prefix as distillation trains through), with the
// queries in one block or several; under bf16 autocast the same loss and
// gradient directions to bf16 rounding.
#include "training/attention.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/model/test_models.h"

namespace kvl::training {
namespace {

using testing::MaxAbsDiff;
using testing::RandomIds;
using testing::RandomWeights;
using testing::TinyConfig;
using testing::TinyModel;

struct StepResult {
  at::Tensor logits;
  at::Tensor loss;
  std::vector<at::Tensor> grads;  // every weight, then every prefix key and value
};

// A cross-entropy step over ids[:, 1:], optionally attending to a prefix of
// n_prefix random keys/values that require gradients. Fresh leaves per run so
// that the two attention variants see identical inputs and separate grads.
StepResult Step(const ModelConfig& config, const ModelWeights& base, const at::Tensor& ids,
                int64_t n_prefix, bool grouped, bool bf16_autocast, int64_t block = 128) {
  std::map<std::string, at::Tensor> named = base.Named(config);
  for (auto& [name, t] : named) t = t.clone();
  ModelWeights weights = ModelWeights::FromNamed(config, std::move(named)).value();
  std::vector<at::Tensor> leaves = weights.All();
  for (at::Tensor& t : leaves) t.requires_grad_(true);
  ReferenceOptions options;
  if (grouped) options.attention = GroupedAttention(block);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (int64_t il = 0; il < config.n_layer && n_prefix > 0; ++il) {
    const std::vector<int64_t> shape = {ids.size(0), config.n_head_kv, n_prefix, config.head_dim};
    options.prefix_keys.push_back(at::randn(shape, gen).requires_grad_(true));
    options.prefix_values.push_back(at::randn(shape, gen).requires_grad_(true));
  }
  for (const auto& prefix : {options.prefix_keys, options.prefix_values}) {
    leaves.insert(leaves.end(), prefix.begin(), prefix.end());
  }
  StepResult run;
  const at::Tensor inputs = ids.narrow(1, 0, ids.size(1) - 1);
  const at::Tensor targets = ids.narrow(1, 1, ids.size(1) - 1);
  if (bf16_autocast) {
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
  run.logits = ReferenceForward(config, weights, inputs, options).logits;
  if (bf16_autocast) {
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
  }
  run.loss =
      at::cross_entropy_loss(run.logits.reshape({-1, config.vocab_size}), targets.reshape({-1}));
  run.loss.backward();
  for (const at::Tensor& t : leaves) {
    run.grads.push_back(t.grad().defined() ? t.grad().clone() : at::zeros_like(t));
  }
  return run;
}

double Cosine(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble).flatten(), y = b.to(at::kDouble).flatten();
  return (x.dot(y) / (x.norm() * y.norm()).clamp_min(1e-300)).item<double>();
}

class GroupedAttentionTest : public ::testing::TestWithParam<TinyModel> {};

// Query heads per kv head 1, 2 and 4 (grouping is where the row order could go
// wrong), with and without a prefix (the mask's offset), both norms' variants.
INSTANTIATE_TEST_SUITE_P(Shapes, GroupedAttentionTest,
                         ::testing::Values(TinyModel{"mha", true, false, true, 4, 4},
                                           TinyModel{"gqa2", true, false, false, 4, 2},
                                           TinyModel{"gqa4_llama", false, true, true, 4, 1}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_P(GroupedAttentionTest, Float32MatchesTheEagerAttentionWithAndWithoutAPrefix) {
  const ModelConfig config = TinyConfig(GetParam());
  const ModelWeights weights = RandomWeights(config, 11);
  const at::Tensor ids = RandomIds(config.vocab_size, {2, 13}, 3);
  // Blocks: one (128), several of 5 with a short last one (12 = 5 + 5 + 2).
  for (auto [n_prefix, block] : {std::pair{0, 128}, {5, 128}, {0, 5}, {5, 5}}) {
    SCOPED_TRACE("prefix " + std::to_string(n_prefix) + ", block " + std::to_string(block));
    const StepResult eager = Step(config, weights, ids, n_prefix, false, false);
    const StepResult grouped = Step(config, weights, ids, n_prefix, true, false, block);
    const double scale = eager.logits.abs().max().item<double>();
    EXPECT_LT(MaxAbsDiff(grouped.logits, eager.logits), 1e-5 * scale);
    ASSERT_EQ(grouped.grads.size(), eager.grads.size());
    for (size_t i = 0; i < eager.grads.size(); ++i) {
      const double g = eager.grads[i].abs().max().item<double>();
      EXPECT_LT(MaxAbsDiff(grouped.grads[i], eager.grads[i]), 1e-4 * g + 1e-7) << "leaf " << i;
    }
  }
}

TEST_P(GroupedAttentionTest, Bf16AutocastAgreesToBf16Rounding) {
  const ModelConfig config = TinyConfig(GetParam());
  const ModelWeights weights = RandomWeights(config, 12);
  const at::Tensor ids = RandomIds(config.vocab_size, {2, 33}, 4);
  // With a prefix, keys and values reach the attention in float32 (the prefix
  // is float32), without one the values are bf16 (autocast's projection).
  for (int64_t n_prefix : {0, 5}) {
    SCOPED_TRACE("prefix " + std::to_string(n_prefix));
    const StepResult eager = Step(config, weights, ids, n_prefix, false, true);
    const StepResult grouped = Step(config, weights, ids, n_prefix, true, true, /*block=*/8);
    const StepResult exact = Step(config, weights, ids, n_prefix, false, false);
    const double loss = exact.loss.item<double>();
    // bf16 keeps 8 bits of mantissa: both autocast losses sit within 1% of the
    // float32 loss, and the grouped one no further from it than twice the
    // eager's distance (plus 0.2%, for when the eager one happens to land on it).
    const double eager_error = std::abs(eager.loss.item<double>() - loss);
    const double grouped_error = std::abs(grouped.loss.item<double>() - loss);
    EXPECT_LT(eager_error, 0.01 * loss);
    EXPECT_LT(grouped_error, 2 * eager_error + 0.002 * loss);
    for (size_t i = 0; i < exact.grads.size(); ++i) {
      EXPECT_GT(Cosine(grouped.grads[i], exact.grads[i]), 0.99) << "leaf " << i;
    }
  }
}

}  // namespace
}  // namespace kvl::training
