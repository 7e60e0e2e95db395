#include "model/decoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/decoder_ops.h"
#include "model/key_transform.h"

namespace kvl {

// Fused per-layer weights in the runtime dtype/device. Linear weights stay
// [out, in]; matmuls read them transposed (BLAS handles it without a copy).
struct Decoder::Layer {
  at::Tensor input_layernorm;           // [E]
  at::Tensor qkv, qkv_bias;             // [(Hq + 2H) * D, E], [(Hq + 2H) * D] or undefined
  at::Tensor o_proj, o_bias;            // [E, Hq * D], [E] or undefined
  at::Tensor q_norm;                    // [D] or undefined
  at::Tensor post_attention_layernorm;  // [E]
  at::Tensor gate_up;                   // [2F, E]
  at::Tensor down_proj;                 // [E, F]
};

Decoder::~Decoder() = default;

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const ModelConfig& config,
                                                         const ModelWeights& weights,
                                                         const DecoderOptions& options) {
  if (config.n_head_kv <= 0 || config.n_head % config.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", config.n_head,
                                                   " is not a multiple of num_key_value_heads ",
                                                   config.n_head_kv));
  }
  if (config.head_dim <= 0 || config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", config.head_dim, " must be even"));
  }
  if (static_cast<int64_t>(weights.layers.size()) != config.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", weights.layers.size(), " layers, config ", config.n_layer));
  }
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16 && options.dtype != at::kHalf) {
    return absl::InvalidArgumentError("decoder dtype must be float32, bfloat16 or float16");
  }
  std::unique_ptr<Decoder> d(new Decoder());
  try {
    const at::Device device(options.device);
    if (device.is_cuda() && !at::hasCUDA()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", options.device, ": this LibTorch has no CUDA"));
    }
    if (device.is_cpu() && options.dtype == at::kHalf) {
      return absl::InvalidArgumentError("float16 is not supported on cpu; use bfloat16");
    }
    const ModelWeights w = weights.To(options.dtype, options.device);
    d->config_ = config;
    d->dtype_ = options.dtype;
    d->options_ = at::TensorOptions().dtype(options.dtype).device(device);
    d->max_scores_bytes_ = std::max<int64_t>(options.max_scores_bytes, 1);
    d->embed_tokens_ = w.embed_tokens.detach();
    d->norm_ = w.norm.detach();
    d->lm_head_ = w.lm_head.detach();
    std::vector<at::Tensor> k_norm;
    bool k_norm_invertible = true;
    for (const LayerWeights& lw : w.layers) {
      Layer l;
      l.input_layernorm = lw.input_layernorm.detach();
      l.qkv = at::cat({lw.q_proj, lw.k_proj, lw.v_proj}, 0).detach();
      if (config.attention_bias) {
        l.qkv_bias = at::cat({lw.q_bias, lw.k_bias, lw.v_bias}, 0).detach();
        l.o_bias = lw.o_bias.detach();
      }
      l.o_proj = lw.o_proj.detach().contiguous();
      if (config.qk_norm) {
        l.q_norm = lw.q_norm.detach();
        k_norm.push_back(lw.k_norm.detach());
        k_norm_invertible = k_norm_invertible && !(lw.k_norm == 0).any().item<bool>();
      }
      l.post_attention_layernorm = lw.post_attention_layernorm.detach();
      l.gate_up = at::cat({lw.gate_proj, lw.up_proj}, 0).detach();
      l.down_proj = lw.down_proj.detach().contiguous();
      d->layers_.push_back(std::move(l));
    }
    d->tap_mode_ = k_norm_invertible ? options.tap_mode : KeyTapMode::kStorePreNorm;
    d->key_transform_ = std::make_shared<KeyTransform>(config, std::move(k_norm), d->options_);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("preparing the decoder: ", e.what_without_backtrace()));
  }
  return d;
}

std::unique_ptr<KvCache> Decoder::NewCache() const {
  return std::unique_ptr<KvCache>(new KvCache(key_transform_, config_.n_layer, config_.n_head_kv,
                                              config_.head_dim, options_, tap_mode_));
}

at::Tensor Decoder::Forward(KvCache& cache, const at::Tensor& ids, bool all_logits) {
  c10::InferenceMode inference;
  TORCH_CHECK(ids.dim() == 1 && ids.numel() > 0, "Forward: ids must be a non-empty [T]");
  const int64_t n = ids.numel(), p0 = cache.Length(), n_ctx = p0 + n;
  const int64_t n_head = config_.n_head, n_head_kv = config_.n_head_kv, d = config_.head_dim;
  const int64_t n_group = n_head / n_head_kv, q_dim = n_head * d, kv_dim = n_head_kv * d;
  const int64_t ffn = config_.intermediate_size;
  const double eps = config_.rms_norm_eps;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const bool bf16_softmax = dtype_ != at::kFloat;
  cache.EnsureCapacity(n_ctx);

  // Query blocks bound the scores buffer [H, block * G, keys].
  const int64_t score_elem = static_cast<int64_t>(c10::elementSize(dtype_));
  const int64_t block =
      std::clamp<int64_t>(max_scores_bytes_ / (n_head * n_ctx * score_elem), 1, n);
  // Causal mask of a block against its own tokens' keys, rows ordered (token,
  // group): row i*G+g may see key column c iff c <= i. Earlier keys are all
  // visible. Shorter (last) blocks use its top-left corner.
  at::Tensor diag_mask;
  if (block > 1) {
    const at::Tensor pos = at::arange(block, options_.dtype(at::kLong));
    const at::Tensor hidden = pos.unsqueeze(0) > pos.unsqueeze(1);  // [block, block]
    diag_mask = at::zeros({block, block}, options_)
                    .masked_fill_(hidden, -std::numeric_limits<double>::infinity())
                    .unsqueeze(1)
                    .expand({block, n_group, block})
                    .reshape({block * n_group, block});
  }

  const at::Tensor ids_dev = ids.to(options_.device(), at::kLong);
  at::Tensor x = at::embedding(embed_tokens_, ids_dev);  // [T, E]
  const ops::RopeTable rope = key_transform_->Rope(p0, n);
  // Queries in the layout the grouped attention matmul reads: [H, T, G, D].
  at::Tensor q_buf = at::empty({n_head_kv, n, n_group, d}, options_);
  const at::Tensor q_dst = q_buf.permute({1, 0, 2, 3});  // [T, H, G, D] view
  at::Tensor attn_buf = at::empty({n_head_kv, n, n_group, d}, options_);

  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& w = layers_[il];
    const at::Tensor h = ops::RmsNorm(x, w.input_layernorm, eps);
    const at::Tensor qkv = w.qkv_bias.defined() ? at::addmm(w.qkv_bias, h, w.qkv.t())
                                                : at::mm(h, w.qkv.t());  // [T, (Hq + 2H) * D]
    at::Tensor q = qkv.narrow(1, 0, q_dim).view({n, n_head, d});
    const at::Tensor k = qkv.narrow(1, q_dim, kv_dim).view({n, n_head_kv, d});
    const at::Tensor v = qkv.narrow(1, q_dim + kv_dim, kv_dim).view({n, n_head_kv, d});

    if (w.q_norm.defined()) q = ops::RmsNorm(q, w.q_norm, eps);
    ops::ApplyRope(q.view({n, n_head_kv, n_group, d}), rope, q_dst);

    const at::Tensor k_dst = cache.keys_[il].narrow(1, p0, n).transpose(0, 1);  // [T, H, D]
    const at::Tensor inv_rms_dst =
        cache.keep_inv_rms_ ? cache.inv_rms_[il].narrow(1, p0, n).t() : at::Tensor();
    key_transform_->Apply(static_cast<int64_t>(il), k, rope, k_dst, inv_rms_dst);
    if (cache.tap_mode_ == KeyTapMode::kStorePreNorm) {
      cache.keys_prenorm_[il].narrow(1, p0, n).copy_(k.transpose(0, 1));
    }
    cache.values_[il].narrow(1, p0, n).copy_(v.transpose(0, 1));

    const at::Tensor keys = cache.keys_[il];      // [H, capacity, D]
    const at::Tensor values = cache.values_[il];  // [H, capacity, D]
    for (int64_t i0 = 0; i0 < n; i0 += block) {
      const int64_t nb = std::min(block, n - i0), n_keys = p0 + i0 + nb;
      const at::Tensor qb = q_buf.narrow(1, i0, nb).view({n_head_kv, nb * n_group, d});
      // Per kv head: each head's cached keys/values are a contiguous [T, D]
      // block; at::bmm over the strided [H, T, D] views of the line falls back
      // to a path far slower than one GEMM per head (docs/model-runtime.md).
      at::Tensor scores = at::empty({n_head_kv, nb * n_group, n_keys}, options_);
      // HF order, q k^T then * scale, as the GEMM's alpha: the product is
      // rounded once and then scaled, as a separate multiply would, without
      // another pass over the scores (beta 0: dst's contents are ignored).
      for (int64_t h = 0; h < n_head_kv; ++h) {
        at::Tensor dst = scores[h];
        at::addmm_out(dst, dst, qb[h], keys[h].narrow(0, 0, n_keys).t(), /*beta=*/0,
                      /*alpha=*/scale);
      }
      if (nb > 1)
        scores.narrow(2, p0 + i0, nb).add_(diag_mask.narrow(0, 0, nb * n_group).narrow(1, 0, nb));
      const at::Tensor probs =
          bf16_softmax ? at::softmax(scores, -1, at::kFloat).to(dtype_) : at::softmax(scores, -1);
      at::Tensor out = at::empty({n_head_kv, nb * n_group, d}, options_);
      for (int64_t h = 0; h < n_head_kv; ++h) {
        at::Tensor dst = out[h];
        at::mm_out(dst, probs[h], values[h].narrow(0, 0, n_keys));
      }
      if (nb == n) {
        attn_buf = out.view({n_head_kv, n, n_group, d});
      } else {
        attn_buf.narrow(1, i0, nb).copy_(out.view({n_head_kv, nb, n_group, d}));
      }
    }
    const at::Tensor attn = attn_buf.permute({1, 0, 2, 3}).reshape({n, q_dim});  // [T, Hq * D]
    if (w.o_bias.defined()) {
      x.add_(at::addmm(w.o_bias, attn, w.o_proj.t()));
    } else {
      x.add_(at::mm(attn, w.o_proj.t()));
    }

    const at::Tensor h2 = ops::RmsNorm(x, w.post_attention_layernorm, eps);
    const at::Tensor gate_up = at::mm(h2, w.gate_up.t());  // [T, 2F]
    at::Tensor act = at::silu(gate_up.narrow(1, 0, ffn));
    act.mul_(gate_up.narrow(1, ffn, ffn));
    x.add_(at::mm(act, w.down_proj.t()));
  }
  cache.Commit(n, /*native=*/true);

  const at::Tensor last = all_logits ? x : x.narrow(0, n - 1, 1);
  const at::Tensor h = ops::RmsNorm(last, norm_, eps);
  // One row: matrix-vector beats a 1-row GEMM here (docs/model-runtime.md).
  at::Tensor logits =
      h.size(0) == 1 ? at::mv(lm_head_, h[0]).unsqueeze(0) : at::mm(h, lm_head_.t());
  return logits.scalar_type() == at::kFloat ? logits : logits.to(at::kFloat);
}

}  // namespace kvl
