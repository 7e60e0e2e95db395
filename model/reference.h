// The reference forward: eager, cache-free, full-sequence, written for clarity
// with plain tensor operations in Hugging Face's order and dtypes. It is the
// oracle for the cached decoder (tests/model/decoder_test.cc) and the
// functional forward for training: it runs under autograd (no in-place updates
// of anything autograd needs), on batches, and can attend to an injected prefix
// of keys/values through which gradients flow (KV translator distillation).
//
// Legend: B=batch, T=tokens, P=prefix tokens, L=n_layer, H=n_head_kv,
// D=head_dim, V=vocab_size.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace kvl {

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
  // Attention for training and evaluation: each kv head's query group as one
  // batched product with the scale and the causal mask folded in (baddbmm over
  // an additive -inf bias), queries in blocks of grouped_attention_block tokens
  // against only the keys they may see, softmax in the compute dtype (the
  // autocast dtype under autocast, else the queries' dtype). Same function: in
  // float32 it agrees with the default to rounding, in bf16 to bf16 rounding of
  // the probabilities (the default keeps Hugging Face's float32 softmax, and
  // stays the oracle). Faster per training step: bench/train_step_bench,
  // docs/training.md.
  bool grouped_attention = false;
  int64_t grouped_attention_block = 128;
};

struct ReferenceOutput {
  at::Tensor logits;                     // [B, T, V] in float32 ([B, 1, V] if last only)
  std::vector<at::Tensor> keys_prenorm;  // L x [B, H, T, D] when capture_kv
  std::vector<at::Tensor> values;        // L x [B, H, T, D] when capture_kv
};

// ids: [B, T] int64. Weights in any one dtype/device; computation follows them.
// Shape errors are programming errors (TORCH_CHECK).
ReferenceOutput ReferenceForward(const ModelConfig& config, const ModelWeights& weights,
                                 const at::Tensor& ids, const ReferenceOptions& options = {});

}  // namespace kvl
