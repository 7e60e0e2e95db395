// The reference forward: eager, cache-free, full-sequence, written for clarity
// with plain tensor operations in Hugging Face's order and dtypes. It is the
// oracle for the cached decoder (tests/model/decoder_test.cc). Because it is
// plain tensor code (no in-place updates of anything autograd needs), it runs
// under autograd too, on batches, with an injected prefix of keys/values that
// gradients flow through; training brings its own attention kernel
// (ReferenceOptions::attention, training/attention.h) and keeps everything
// that learns out of this folder.
//
// Legend: B=batch, T=tokens, P=prefix tokens, L=n_layer, H=n_head_kv,
// D=head_dim, V=vocab_size.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace kvl {

// One layer's attention: q [B, Hq, T, D] after q-norm and RoPE; k, v
// [B, H, P+T, D] (k after k-norm and RoPE); masked [T, P+T], true where the key
// comes after the query, or (a windowed layer, ModelConfig::AttentionWindow)
// at or before the query's position minus the window; scale 1/sqrt(D); layer
// il. Returns [B, T, Hq*D].
using AttentionFn = std::function<at::Tensor(int64_t il, const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& masked,
                                             double scale)>;

// Grouped-query attention as Hugging Face writes it: kv head j serves query
// heads j*G .. j*G+G-1, repeated to Hq heads; float32 softmax, cast back to
// v's dtype. `observe`, when set, sees the float32 probabilities
// [B, Hq, T, P+T] (what attention-weighted fitting measures).
at::Tensor EagerAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& masked, double scale,
                          const std::function<void(const at::Tensor& probs)>& observe = nullptr);

struct ReferenceOptions {
  // Optional prefix occupying positions [0, P): per layer, keys before k-norm
  // and RoPE and values, [B, H, P, D] each (the form translation taps use). The
  // forward applies this model's k-norm and RoPE to the keys, as the cache's
  // accept path does. Empty: no prefix. ids then sit at positions [P, P + T).
  std::vector<at::Tensor> prefix_keys;
  std::vector<at::Tensor> prefix_values;
  // Keep the per-layer keys before k-norm/RoPE and the values of ids.
  bool capture_kv = false;
  // Compute logits only for the last position (a [B, 1, V] result).
  bool last_logits_only = false;
  // The attention of each layer; null: EagerAttention (the oracle's).
  AttentionFn attention;
  // Start at layer first_layer from `hidden` [B, T, E], the residual stream
  // at its input, instead of the embeddings of ids (which then only give
  // B and T); the layers below it are skipped, and with capture_kv their
  // entries are undefined tensors. Without a prefix. The native-depth
  // dial's distillation (training/residual_fit.h).
  int64_t first_layer = 0;
  at::Tensor hidden;
  // Stop after the layers (no final norm or logits: `logits` undefined).
  bool no_logits = false;
  // Keep each mixture-of-experts layer's router probabilities (what a
  // load-balancing loss reads: training/train_lm.h).
  bool capture_router = false;
};

struct ReferenceOutput {
  at::Tensor logits;                     // [B, T, V] in float32 ([B, 1, V] if last only)
  std::vector<at::Tensor> keys_prenorm;  // L x [B, H, T, D] when capture_kv
  std::vector<at::Tensor> values;        // L x [B, H, T, D] when capture_kv
  // With capture_router, per sparse layer in order: the router's float32
  // softmax [B*T, n_expert] (gradients flow through it) and the chosen
  // experts [B*T, n_expert_used] int64.
  std::vector<at::Tensor> router_probs;
  std::vector<at::Tensor> router_experts;
};

// ids: [B, T] int64. Weights in any one dtype/device; computation follows them.
// Shape errors are programming errors (TORCH_CHECK).
ReferenceOutput ReferenceForward(const ModelConfig& config, const ModelWeights& weights,
                                 const at::Tensor& ids, const ReferenceOptions& options = {});

}  // namespace kvl
