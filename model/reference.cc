#include "model/reference.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace kvl {
namespace {

// HF RMSNorm: float32 statistics, cast back to the input dtype, then * weight.
// Gemma's (config.norm_weight_offset): the float32 result times (1 + w) in
// float32, then cast back.
at::Tensor RmsNorm(const ModelConfig& config, const at::Tensor& x, const at::Tensor& weight) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor normed = xf * at::rsqrt(variance + config.rms_norm_eps);
  if (config.norm_weight_offset) {
    return (normed * (1.0 + weight.to(at::kFloat))).to(x.scalar_type());
  }
  return weight * normed.to(x.scalar_type());
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

// [.., D] -> cat(-x2, x1) with x1, x2 the two halves.
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// cos, sin of layer il: [T, D] for positions [pos0, pos0 + T), float32 then
// cast to dtype; linear scaling divides the frequencies by its factor.
std::pair<at::Tensor, at::Tensor> RopeCosSin(const ModelConfig& config, int64_t il, int64_t pos0,
                                             int64_t n_tokens, const at::TensorOptions& opts) {
  const int64_t d = config.head_dim;
  const at::TensorOptions f32 = opts.dtype(at::kFloat);
  at::Tensor inv_freq =
      1.0 / at::pow(config.RopeTheta(il),
                    at::arange(0, d, 2, f32.dtype(at::kLong)).to(at::kFloat) /
                        static_cast<double>(d));
  if (config.RopeFactor(il) != 1.0) inv_freq = inv_freq / config.RopeFactor(il);
  const at::Tensor pos = at::arange(pos0, pos0 + n_tokens, f32.dtype(at::kLong)).to(at::kFloat);
  const at::Tensor freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0);  // [T, D/2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                 // [T, D]
  return {emb.cos().to(opts.dtype()), emb.sin().to(opts.dtype())};
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

// down(act(gate(h)) * up(h)), act SiLU or GELU with the tanh approximation.
at::Tensor GatedMlp(const ModelConfig& config, const at::Tensor& h, const at::Tensor& gate_proj,
                    const at::Tensor& up_proj, const at::Tensor& down_proj) {
  const at::Tensor gate = at::linear(h, gate_proj);
  const at::Tensor act =
      config.hidden_act == Activation::kGeluTanh ? at::gelu(gate, "tanh") : at::silu(gate);
  return at::linear(act * at::linear(h, up_proj), down_proj);
}

// The layer's MLP over h [B, T, E]. A mixture-of-experts layer, as HF's
// Qwen3-MoE block: router softmax in float32, the top k experts per token
// (renormalized with norm_topk_prob), weights cast to h's dtype, each
// expert's output times its weight added in ascending expert order.
// `router_out`, when given, receives the router's probabilities and choices.
at::Tensor Mlp(const ModelConfig& config, const LayerWeights& w, const at::Tensor& h,
               ReferenceOutput* router_out) {
  if (!w.router.defined()) return GatedMlp(config, h, w.gate_proj, w.up_proj, w.down_proj);
  const at::Tensor flat = h.reshape({-1, h.size(-1)});  // [B*T, E]
  const at::Tensor probs = at::softmax(at::linear(flat, w.router), -1, at::kFloat);
  auto [weights, experts] = probs.topk(config.n_expert_used, -1);  // [B*T, k]
  if (router_out != nullptr) {
    router_out->router_probs.push_back(probs);
    router_out->router_experts.push_back(experts);
  }
  if (config.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(h.scalar_type());
  at::Tensor out = at::zeros_like(flat);
  for (int64_t x = 0; x < config.n_expert; ++x) {
    const at::Tensor hit = (experts == x).nonzero();  // [n, 2]: (token, slot)
    if (hit.size(0) == 0) continue;
    const at::Tensor token = hit.select(1, 0), slot = hit.select(1, 1);
    const at::Tensor y = GatedMlp(config, flat.index_select(0, token), w.expert_gate[x],
                                  w.expert_up[x], w.expert_down[x]);
    const at::Tensor weight =
        weights.reshape({-1}).index_select(0, token * config.n_expert_used + slot);
    out = out.index_add(0, token, y * weight.unsqueeze(1));
  }
  return out.view(h.sizes());
}

}  // namespace

at::Tensor EagerAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& masked, double scale,
                          const std::function<void(const at::Tensor& probs)>& observe) {
  const int64_t n_batch = q.size(0), n_head = q.size(1), n_tokens = q.size(2), d = q.size(3);
  const int64_t n_group = n_head / k.size(1);
  const at::Tensor kr = k.repeat_interleave(n_group, 1);  // [B, Hq, P+T, D]
  const at::Tensor vr = v.repeat_interleave(n_group, 1);
  at::Tensor scores = at::matmul(q, kr.transpose(2, 3)) * scale;  // [B, Hq, T, P+T]
  scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
  const at::Tensor probs32 = at::softmax(scores, -1, at::kFloat);
  if (observe) observe(probs32);
  const at::Tensor probs = probs32.to(v.scalar_type());
  return at::matmul(probs, vr).transpose(1, 2).reshape({n_batch, n_tokens, n_head * d});
}

ReferenceOutput ReferenceForward(const ModelConfig& config, const ModelWeights& weights,
                                 const at::Tensor& ids, const ReferenceOptions& options) {
  TORCH_CHECK(ids.dim() == 2, "ids must be [B, T]");
  const int64_t n_batch = ids.size(0), n_tokens = ids.size(1);
  const int64_t n_head = config.n_head, n_head_kv = config.n_head_kv, d = config.head_dim;
  const bool has_prefix = !options.prefix_keys.empty();
  TORCH_CHECK(!has_prefix || (options.prefix_keys.size() == weights.layers.size() &&
                              options.prefix_values.size() == weights.layers.size()),
              "prefix needs keys and values for every layer");
  const int64_t n_prefix = has_prefix ? options.prefix_keys[0].size(2) : 0;
  const at::ScalarType dtype = weights.embed_tokens.scalar_type();
  const at::TensorOptions opts = weights.embed_tokens.options();

  // Causal mask over [prefix | ids]: query i sees every prefix key and ids keys <= i.
  const at::Tensor key_pos = at::arange(n_prefix + n_tokens, opts.dtype(at::kLong));
  const at::Tensor query_pos = at::arange(n_prefix, n_prefix + n_tokens, opts.dtype(at::kLong));
  const at::Tensor masked = key_pos.unsqueeze(0) > query_pos.unsqueeze(1);  // [T, P+T]
  const double scale =
      1.0 / std::sqrt(config.query_pre_attn_scalar > 0 ? config.query_pre_attn_scalar
                                                       : static_cast<double>(d));

  ReferenceOutput out;
  ReferenceOutput* const router_out = options.capture_router ? &out : nullptr;
  TORCH_CHECK(options.first_layer == 0 || (options.hidden.defined() && !has_prefix),
              "a forward from layer ", options.first_layer, " needs its hidden input, no prefix");
  if (options.hidden.defined()) {
    TORCH_CHECK(options.hidden.dim() == 3 && options.hidden.size(0) == n_batch &&
                    options.hidden.size(1) == n_tokens &&
                    options.hidden.size(2) == config.hidden_size,
                "hidden must be [B, T, E]");
  }
  at::Tensor x = options.hidden.defined() ? options.hidden.to(dtype)
                                          : at::embedding(weights.embed_tokens, ids);  // [B, T, E]
  if (config.scale_embeddings && !options.hidden.defined()) {
    // Gemma: times sqrt(E) as a tensor in the weights' dtype.
    x = x * at::scalar_tensor(std::sqrt(static_cast<double>(config.hidden_size)), opts);
  }
  for (size_t il = 0; il < weights.layers.size(); ++il) {
    if (static_cast<int64_t>(il) < options.first_layer) {
      if (options.capture_kv) {
        out.keys_prenorm.emplace_back();
        out.values.emplace_back();
      }
      continue;
    }
    const LayerWeights& w = weights.layers[il];
    const auto [cos, sin] = RopeCosSin(config, static_cast<int64_t>(il), n_prefix, n_tokens, opts);
    const auto [cos_prefix, sin_prefix] =
        RopeCosSin(config, static_cast<int64_t>(il), 0, n_prefix, opts);
    const at::Tensor h = RmsNorm(config, x, w.input_layernorm);
    at::Tensor q =
        Linear(h, w.q_proj, w.q_bias).view({n_batch, n_tokens, n_head, d}).transpose(1, 2);
    at::Tensor k =
        Linear(h, w.k_proj, w.k_bias).view({n_batch, n_tokens, n_head_kv, d}).transpose(1, 2);
    at::Tensor v =
        Linear(h, w.v_proj, w.v_bias).view({n_batch, n_tokens, n_head_kv, d}).transpose(1, 2);
    if (options.capture_kv) {
      out.keys_prenorm.push_back(k);
      out.values.push_back(v);
    }
    if (has_prefix) {  // prefix keys go through the same k-norm and RoPE, at their positions
      k = at::cat({options.prefix_keys[il].to(dtype), k}, 2);
      v = at::cat({options.prefix_values[il].to(dtype), v}, 2);
    }
    if (config.qk_norm) {
      q = RmsNorm(config, q, w.q_norm);
      k = RmsNorm(config, k, w.k_norm);
    }
    q = ApplyRope(q, cos, sin);
    k = ApplyRope(k, at::cat({cos_prefix, cos}, 0), at::cat({sin_prefix, sin}, 0));

    // A windowed layer also hides the keys at or before query - window.
    const int64_t window = config.AttentionWindow(static_cast<int64_t>(il));
    const at::Tensor layer_masked =
        window > 0 ? masked.logical_or(key_pos.unsqueeze(0) <= (query_pos - window).unsqueeze(1))
                   : masked;
    const at::Tensor attn =
        options.attention
            ? options.attention(static_cast<int64_t>(il), q, k, v, layer_masked, scale)
            : EagerAttention(q, k, v, layer_masked, scale);
    const at::Tensor attn_out = Linear(attn, w.o_proj, w.o_bias);
    if (config.sandwich_norms) {
      x = x + RmsNorm(config, attn_out, w.post_attention_layernorm);
      const at::Tensor h2 = RmsNorm(config, x, w.pre_feedforward_layernorm);
      x = x + RmsNorm(config, Mlp(config, w, h2, router_out), w.post_feedforward_layernorm);
    } else {
      x = x + attn_out;
      x = x + Mlp(config, w, RmsNorm(config, x, w.post_attention_layernorm), router_out);
    }
  }
  if (options.no_logits) return out;
  x = RmsNorm(config, x, weights.norm);
  if (options.last_logits_only) x = x.narrow(1, n_tokens - 1, 1);
  at::Tensor logits = at::linear(x, weights.lm_head);
  if (config.final_logit_softcapping > 0) {
    logits = at::tanh(logits / config.final_logit_softcapping) * config.final_logit_softcapping;
  }
  out.logits = logits.to(at::kFloat);
  return out;
}

}  // namespace kvl
