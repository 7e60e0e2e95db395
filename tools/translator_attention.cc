#include "tools/translator_attention.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <limits>

namespace kvl::tools {
namespace {

// As model/reference.cc: float32 statistics, cast back, times the weight.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  return weight * (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

AttentionMass PrefixAttentionMass(const ModelConfig& config, const ModelWeights& weights,
                                  const std::vector<int64_t>& ids, int64_t n_prefix) {
  const int64_t n = static_cast<int64_t>(ids.size());
  TORCH_CHECK(n_prefix >= 1 && n_prefix < n, "PrefixAttentionMass needs 1 <= n_prefix < T");
  c10::InferenceMode guard;
  const int64_t n_head = config.n_head, n_head_kv = config.n_head_kv, d = config.head_dim;
  const at::TensorOptions opts = weights.embed_tokens.options();
  const at::ScalarType dtype = weights.embed_tokens.scalar_type();

  const at::Tensor inv_freq =
      1.0 / at::pow(config.rope_theta,
                    at::arange(0, d, 2, opts.dtype(at::kLong)).to(at::kFloat) / static_cast<double>(d));
  const at::Tensor freqs =
      at::arange(n, opts.dtype(at::kLong)).to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // [T, D]
  const at::Tensor cos = emb.cos().to(dtype), sin = emb.sin().to(dtype);
  const at::Tensor pos = at::arange(n, opts.dtype(at::kLong));
  const at::Tensor masked = pos.unsqueeze(0) > pos.unsqueeze(1);  // [T, T]: key after query
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  at::Tensor received = at::zeros({n_prefix}, opts.dtype(at::kDouble));
  at::Tensor x = at::embedding(weights.embed_tokens, at::tensor(ids, opts.dtype(at::kLong)));
  for (const LayerWeights& w : weights.layers) {
    const at::Tensor h = RmsNorm(x, w.input_layernorm, config.rms_norm_eps);  // [T, E]
    at::Tensor q = Linear(h, w.q_proj, w.q_bias).view({n, n_head, d}).transpose(0, 1);
    at::Tensor k = Linear(h, w.k_proj, w.k_bias).view({n, n_head_kv, d}).transpose(0, 1);
    at::Tensor v = Linear(h, w.v_proj, w.v_bias).view({n, n_head_kv, d}).transpose(0, 1);
    if (config.qk_norm) {
      q = RmsNorm(q, w.q_norm, config.rms_norm_eps);
      k = RmsNorm(k, w.k_norm, config.rms_norm_eps);
    }
    q = Rope(q, cos, sin);
    k = Rope(k, cos, sin).repeat_interleave(n_head / n_head_kv, 0);  // [Hq, T, D]
    v = v.repeat_interleave(n_head / n_head_kv, 0);
    const at::Tensor scores = (at::matmul(q, k.transpose(1, 2)) * scale)
                                  .masked_fill(masked, -std::numeric_limits<double>::infinity());
    const at::Tensor probs = at::softmax(scores, -1, at::kFloat);  // [Hq, T, T]
    // Continuation queries [P, T) onto prefix keys [0, P), summed over queries.
    received += probs.narrow(1, n_prefix, n - n_prefix)
                    .narrow(2, 0, n_prefix)
                    .sum(1)
                    .mean(0)
                    .to(at::kDouble);
    const at::Tensor attn = at::matmul(probs.to(dtype), v).transpose(0, 1).reshape({n, n_head * d});
    x = x + Linear(attn, w.o_proj, w.o_bias);
    const at::Tensor h2 = RmsNorm(x, w.post_attention_layernorm, config.rms_norm_eps);
    x = x + at::linear(at::silu(at::linear(h2, w.gate_proj)) * at::linear(h2, w.up_proj),
                       w.down_proj);
  }
  AttentionMass out;
  out.received = received / static_cast<double>(weights.layers.size());
  out.logits = at::linear(RmsNorm(x, weights.norm, config.rms_norm_eps), weights.lm_head)
                   .to(at::kFloat);
  return out;
}

}  // namespace kvl::tools
