// What a model does to keys between the k projection and the cache: per-head
// k-norm (Qwen3) and RoPE at the token's position; and its inverse for
// translation taps. Shared by the decoder and the KV cache so that the accept
// path and the forward run the very same operations.
//
// Legend: T=tokens, H=n_head_kv, D=head_dim. Immutable, so thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/decoder_ops.h"

namespace kvl {

class KeyTransform {
 public:
  // k_norm: per layer [D] weights in the cache dtype/device (ignored without qk_norm).
  KeyTransform(const ModelConfig& config, std::vector<at::Tensor> k_norm,
               at::TensorOptions options);

  bool has_norm() const { return qk_norm_; }
  const at::Tensor& inv_freq() const { return inv_freq_; }

  // cos/sin for positions [pos0, pos0 + n_tokens) in the cache dtype.
  ops::RopeTable Rope(int64_t pos0, int64_t n_tokens) const;
  // cos/sin for any positions [T] (int64), row by row as Rope's.
  ops::RopeTable RopeAt(const at::Tensor& positions) const;

  // k: [T, H, D] before k-norm/RoPE, in out's dtype (any other is converted
  // first; bfloat16 into a float32 out is widened exactly, head vector by head
  // vector, without a copy). Writes the attention keys into out ([T, H, D],
  // may be a strided view into a cache line, must not overlap k) and, when
  // defined and the model has k-norm, the float32 1/rms of each (token, head)
  // into inv_rms_out [T, H].
  void Apply(int64_t il, const at::Tensor& k, const ops::RopeTable& rope, const at::Tensor& out,
             const at::Tensor& inv_rms_out) const;

  // The inverse: attention keys [T, H, D] (+ inv_rms [T, H] with k-norm) ->
  // keys before k-norm/RoPE, written into out ([T, H, D] in the cache dtype,
  // may be a strided view, must not overlap k_post). Computed in float32; see
  // docs/model-runtime.md for its accuracy.
  void Invert(int64_t il, const at::Tensor& k_post, const at::Tensor& inv_rms,
              const ops::RopeTable& rope, const at::Tensor& out) const;

 private:
  // Apply and Invert for float32 head-contiguous tensors (Apply's input may
  // also be bfloat16, In): one pass per head vector, no temporaries.
  template <typename In>
  void ApplyFused(int64_t il, const at::Tensor& k, const ops::RopeTable& rope,
                  const at::Tensor& out, const at::Tensor& inv_rms_out) const;
  void InvertFloat(int64_t il, const at::Tensor& k_post, const at::Tensor& inv_rms,
                   const ops::RopeTable& rope, const at::Tensor& out) const;
  // The layer's k-norm weight, if any, is float32 (the loops read it as such).
  bool FloatNorm(int64_t il) const { return !qk_norm_ || k_norm_[il].scalar_type() == at::kFloat; }

  bool qk_norm_;
  double eps_;
  std::vector<at::Tensor> k_norm_;  // L x [D]
  at::Tensor inv_freq_;             // [D/2] float32
  at::ScalarType dtype_;
};

}  // namespace kvl
