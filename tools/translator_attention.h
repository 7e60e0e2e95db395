// Attention weights for the attention-weighted closed-form fit (`kvl fit
// --weighting attention`, KV-Lingo §3.2 and appendix O): how much attention
// each prefix position receives from the target's continuation queries. The
// model runtime does not expose attention probabilities, so this is an eager
// forward of its own, op for op the same model as model/reference.h (its
// logits are checked against ReferenceForward in the tests).
//
// Legend: T=tokens, P=prefix tokens, L=n_layer, Hq=n_head, V=vocab_size.
//
// Thread safety: a free function.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace kvl::tools {

struct AttentionMass {
  // [P] float64: for each prefix position t < n_prefix, the attention
  // probability the queries at positions [n_prefix, T) put on t, summed over
  // those queries and averaged over layers and query heads. Sums to at most
  // T - n_prefix (the rest goes to the continuation itself).
  at::Tensor received;
  at::Tensor logits;  // [T, V] float32, for checking the forward
};

// ids: one sequence; 1 <= n_prefix < T. Runs under InferenceMode.
AttentionMass PrefixAttentionMass(const ModelConfig& config, const ModelWeights& weights,
                                  const std::vector<int64_t>& ids, int64_t n_prefix);

}  // namespace kvl::tools
