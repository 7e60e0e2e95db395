#include "training/attention.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>

namespace kvl::training {

AttentionFn GroupedAttention(int64_t block) {
  TORCH_CHECK(block >= 1, "grouped attention needs a positive block size");
  return [block](int64_t /*il*/, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& masked, double scale) {
    const int64_t n_batch = q.size(0), n_head = q.size(1), n_tokens = q.size(2), d = q.size(3);
    const int64_t n_head_kv = k.size(1), n_keys = k.size(2), n_group = n_head / n_head_kv;
    const int64_t n_prefix = n_keys - n_tokens, n_bh = n_batch * n_head_kv;
    TORCH_CHECK(n_tokens >= 1, "grouped attention needs at least one query token");
    const at::ScalarType compute =
        at::autocast::is_cpu_enabled() ? at::autocast::get_autocast_cpu_dtype() : q.scalar_type();
    // One cast-and-copy each into [B, H(q), T, D] order; the views below are free.
    const auto packed = [&](const at::Tensor& x) {
      return x.scalar_type() == compute ? x.contiguous()
                                        : x.to(compute, /*non_blocking=*/false, /*copy=*/false,
                                               at::MemoryFormat::Contiguous);
    };
    // Query head j*G + g, token t: [j, g, t] of the [B*H, G, T, D] view.
    const at::Tensor qg = packed(q).view({n_bh, n_group, n_tokens, d});
    const at::Tensor kg = packed(k).view({n_bh, n_keys, d});
    const at::Tensor vg = packed(v).view({n_bh, n_keys, d});
    std::vector<at::Tensor> parts;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += block) {
      // Each block of queries against the prefix and the ids up to its last
      // token: most of the causal mask's upper triangle is never computed.
      const int64_t n_rows = std::min(block, n_tokens - t0), n_seen = n_prefix + t0 + n_rows;
      const at::Tensor rows = qg.narrow(2, t0, n_rows).reshape({n_bh, n_group * n_rows, d});
      const at::Tensor bias = at::zeros({n_rows, n_seen}, q.options().dtype(compute))
                                  .masked_fill_(masked.narrow(0, t0, n_rows).narrow(1, 0, n_seen),
                                                -std::numeric_limits<double>::infinity())
                                  .repeat({n_group, 1});  // [G*rows, seen]
      const at::Tensor scores = at::baddbmm(bias, rows, kg.narrow(1, 0, n_seen).transpose(1, 2),
                                            /*beta=*/1.0, /*alpha=*/scale);
      parts.push_back(at::bmm(at::softmax(scores, -1), vg.narrow(1, 0, n_seen))
                          .view({n_bh, n_group, n_rows, d}));
    }
    const at::Tensor out = parts.size() == 1 ? parts[0] : at::cat(parts, 2);  // [B*H, G, T, D]
    return out.view({n_batch, n_head, n_tokens, d})
        .transpose(1, 2)
        .reshape({n_batch, n_tokens, n_head * d});
  };
}

AttentionMass PrefixAttentionMass(const ModelConfig& config, const ModelWeights& weights,
                                  const std::vector<int64_t>& ids, int64_t n_prefix) {
  const int64_t n = static_cast<int64_t>(ids.size());
  TORCH_CHECK(n_prefix >= 1 && n_prefix < n, "PrefixAttentionMass needs 1 <= n_prefix < T");
  c10::InferenceMode guard;
  const at::TensorOptions opts = weights.embed_tokens.options();
  at::Tensor received = at::zeros({n_prefix}, opts.dtype(at::kDouble));
  ReferenceOptions options;
  // What the continuation's queries put on the prefix: of probs [1, Hq, T, T],
  // rows [P, T) onto columns [0, P), summed over the queries and averaged over
  // the heads.
  const auto record = [&](const at::Tensor& probs) {
    received += probs[0]
                    .narrow(1, n_prefix, n - n_prefix)
                    .narrow(2, 0, n_prefix)
                    .sum(1)
                    .mean(0)
                    .to(at::kDouble);
  };
  options.attention = [&](int64_t /*il*/, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& masked, double scale) {
    return EagerAttention(q, k, v, masked, scale, record);
  };
  const at::Tensor batch = at::tensor(ids, opts.dtype(at::kLong)).unsqueeze(0);
  ReferenceOutput forward = ReferenceForward(config, weights, batch, options);
  AttentionMass out;
  out.received = received / static_cast<double>(weights.layers.size());
  out.logits = forward.logits[0];
  return out;
}

}  // namespace kvl::training
