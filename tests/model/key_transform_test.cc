// The key transform's fused float32 loops (k-norm + RoPE and their inverse, as
// the decoder writes keys, the cache accepts translated ones and taps them)
// against the op-by-op ATen composition of model/decoder_ops.h, which follows
// Hugging Face's Qwen3/Llama numerics step by step.
#include "model/key_transform.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "model/decoder_ops.h"
#include "tests/model/test_models.h"

namespace kvl {
namespace {

using testing::TinyConfig;

constexpr int64_t kTokens = 37, kHeads = 3, kDim = 16, kCapacity = 50;

// Largest difference relative to the largest magnitude of `want`.
double RelMax(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max()).item<double>();
}

struct Layouts {
  at::Tensor k;     // [T, H, D] view of a projection row block, as the decoder passes
  at::Tensor line;  // [H, capacity, D], a cache line layer
  at::Tensor out;   // [T, H, D] view into `line` at position 5
  at::Tensor rms;   // [H, capacity], the line's 1/rms store
  at::Tensor rms_out;
};

Layouts MakeLayouts(uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  Layouts l;
  // Rows of a fused projection: 2 heads of something else before ours.
  const at::Tensor qkv = at::randn({kTokens, (kHeads + 2) * kDim}) * 3;
  l.k = qkv.narrow(1, 2 * kDim, kHeads * kDim).view({kTokens, kHeads, kDim});
  l.line = at::zeros({kHeads, kCapacity, kDim});
  l.out = l.line.narrow(1, 5, kTokens).transpose(0, 1);
  l.rms = at::zeros({kHeads, kCapacity});
  l.rms_out = l.rms.narrow(1, 5, kTokens).t();
  return l;
}

class KeyTransformFloat32Test : public ::testing::TestWithParam<bool> {
 protected:
  KeyTransformFloat32Test() {
    at::manual_seed(5);
    config_ = TinyConfig({"m", GetParam(), false, false, 2 * kHeads, kHeads}, 2, 64, kDim);
    config_.rope_theta = 10000;
    // Away from 1, so that multiplying and dividing by it count.
    for (int il = 0; il < 2; ++il) k_norm_.push_back(at::rand({kDim}) * 1.5 + 0.25);
  }
  ModelConfig config_;
  std::vector<at::Tensor> k_norm_;
};

TEST_P(KeyTransformFloat32Test, ApplyMatchesTheOpByOpPathOnStridedViews) {
  const KeyTransform transform(config_, k_norm_, at::TensorOptions().dtype(at::kFloat));
  Layouts l = MakeLayouts(7);
  const ops::RopeTable rope = transform.Rope(100, kTokens).For(0);
  transform.Apply(1, l.k, rope, l.out, l.rms_out);

  at::Tensor inv_rms;
  const at::Tensor normed =
      GetParam() ? ops::RmsNorm(l.k, k_norm_[1], config_.rms_norm_eps, &inv_rms) : l.k;
  const at::Tensor want = at::empty({kTokens, kHeads, kDim});
  ops::ApplyRope(normed, rope, want);
  // Only the k-norm's sum of squares is added in another order: a few ulp.
  EXPECT_LT(RelMax(l.out, want), 1e-6);
  if (GetParam()) {
    EXPECT_LT(RelMax(l.rms_out, inv_rms), 1e-6);
  } else {
    EXPECT_EQ(l.rms.abs().max().item<float>(), 0) << "no k-norm: no 1/rms written";
  }
  // Nothing outside the span was touched.
  EXPECT_EQ(l.line.narrow(1, 0, 5).abs().max().item<float>(), 0);
  EXPECT_EQ(l.line.narrow(1, 5 + kTokens, kCapacity - 5 - kTokens).abs().max().item<float>(), 0);
}

TEST_P(KeyTransformFloat32Test, InvertMatchesTheOpByOpPathAndUndoesApply) {
  const KeyTransform transform(config_, k_norm_, at::TensorOptions().dtype(at::kFloat));
  Layouts l = MakeLayouts(8);
  const ops::RopeTable rope = transform.Rope(1000, kTokens).For(0);
  transform.Apply(0, l.k, rope, l.out, l.rms_out);

  // Into a [H, T, D] taps layout, as KvCache::Taps writes.
  const at::Tensor taps = at::zeros({kHeads, kTokens, kDim});
  transform.Invert(0, l.out, l.rms_out, rope, taps.transpose(0, 1));

  at::Tensor want = ops::InvertRopeFloat(l.out, rope);
  if (GetParam()) want.div_(k_norm_[0]).div_(l.rms_out.unsqueeze(-1));
  EXPECT_LT(RelMax(taps.transpose(0, 1), want), 1e-6);
  // float32 rounding of the forward and the inverse, a few ulp of the largest
  // element (DecoderTaps.InvertedKeysMatchStoredKeys bounds it at 2e-6).
  EXPECT_LT(RelMax(taps.transpose(0, 1), l.k), 2e-6);
}

TEST_P(KeyTransformFloat32Test, Bfloat16KeysIntoAFloat32LineEqualTheirFloat32Widening) {
  // A bfloat16 translator's product goes into a float32 line as it is
  // (KvCache::Accept): exactly what the widened keys give.
  const KeyTransform transform(config_, k_norm_, at::TensorOptions().dtype(at::kFloat));
  Layouts l = MakeLayouts(9);
  // Strided like l.k: rows of a wider product.
  const at::Tensor k = at::empty({kTokens, (kHeads + 2) * kDim}, at::kBFloat16)
                           .narrow(1, 2 * kDim, kHeads * kDim)
                           .view({kTokens, kHeads, kDim})
                           .copy_(l.k);
  ASSERT_EQ(k.stride(0), l.k.stride(0));
  const ops::RopeTable rope = transform.Rope(40, kTokens).For(0);
  transform.Apply(1, k, rope, l.out, l.rms_out);
  Layouts want = MakeLayouts(9);
  transform.Apply(1, k.to(at::kFloat), rope, want.out, want.rms_out);
  EXPECT_TRUE(at::equal(l.line, want.line));
  EXPECT_TRUE(at::equal(l.rms, want.rms));
}

INSTANTIATE_TEST_SUITE_P(KNorm, KeyTransformFloat32Test, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "qwen3" : "llama"; });

TEST(KeyTransform, Bfloat16KeysTakeTheOpByOpPath) {
  // Outside float32 the transform runs the ATen composition itself, with its
  // roundings to bfloat16 between operations: equal to it exactly.
  ModelConfig config = TinyConfig({"m", true, false, false, 2 * kHeads, kHeads}, 1, 64, kDim);
  const std::vector<at::Tensor> k_norm{(at::rand({kDim}) + 0.5).to(at::kBFloat16)};
  const KeyTransform transform(config, k_norm, at::TensorOptions().dtype(at::kBFloat16));
  const at::Tensor k = at::randn({kTokens, kHeads, kDim}).to(at::kBFloat16);
  const ops::RopeTable rope = transform.Rope(3, kTokens).For(0);
  const at::Tensor got = at::empty({kTokens, kHeads, kDim}, at::kBFloat16);
  const at::Tensor got_rms = at::empty({kTokens, kHeads});
  transform.Apply(0, k, rope, got, got_rms);
  at::Tensor inv_rms;
  const at::Tensor want = at::empty({kTokens, kHeads, kDim}, at::kBFloat16);
  ops::ApplyRope(ops::RmsNorm(k, k_norm[0], config.rms_norm_eps, &inv_rms), rope, want);
  EXPECT_TRUE(at::equal(got, want));
  EXPECT_TRUE(at::equal(got_rms, inv_rms));
}

}  // namespace
}  // namespace kvl
