// The attention kernels training and its measurements plug into the reference
// forward (ReferenceOptions::attention, model/reference.h), which stays the
// decoder's oracle with Hugging Face's eager attention.
//
// Legend: B=batch, T=tokens, P=prefix tokens, L=n_layer, Hq=n_head,
// H=n_head_kv, D=head_dim, V=vocab_size.
//
// Thread safety: free functions; a returned AttentionFn holds no state.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/reference.h"
#include "model/weights.h"

namespace kvl::training {

// The training forward's attention: each kv head's query group as one batched
// product with the scale and the causal mask folded in (baddbmm over an
// additive -inf bias), queries in blocks of `block` tokens against only the
// keys they may see, softmax in the compute dtype (the autocast dtype under
// autocast, else the queries'). The same function as EagerAttention: in
// float32 it agrees to rounding, under bf16 autocast to bf16 rounding of the
// probabilities (tests/training/attention_test.cc); faster per training step
// (bench/train_step_bench, docs/training.md).
inline constexpr int64_t kDefaultAttentionBlock = 128;
AttentionFn GroupedAttention(int64_t block = kDefaultAttentionBlock);

// Attention weights for the attention-weighted closed-form fit (`kvl fit
// --weighting attention`, KV-Lingo §3.2 and appendix O): how much attention
// each prefix position receives from the target's continuation queries.
struct AttentionMass {
  // [P] float64: for each prefix position t < n_prefix, the attention
  // probability the queries at positions [n_prefix, T) put on t, summed over
  // those queries and averaged over layers and query heads. Sums to at most
  // T - n_prefix (the rest goes to the continuation itself).
  at::Tensor received;
  at::Tensor logits;  // [T, V] float32: the reference forward's
};

// ids: one sequence; 1 <= n_prefix < T. The reference forward with its eager
// attention, recording the probabilities; runs under InferenceMode.
AttentionMass PrefixAttentionMass(const ModelConfig& config, const ModelWeights& weights,
                                  const std::vector<int64_t>& ids, int64_t n_prefix);

}  // namespace kvl::training
