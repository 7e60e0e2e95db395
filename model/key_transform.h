// What a model does to keys between the k projection and the cache: per-head
// k-norm (Qwen3, Gemma-3) and RoPE at the token's position, with each layer's
// base and scaling (Gemma-3's sliding and global layers differ); and its
// inverse for translation taps. Shared by the decoder and the KV cache so that the accept
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

// The rotary tables of some positions for every layer: one table per
// distinct (base, scaling) of the model's layers, For(il) is layer il's.
// Valid while the KeyTransform that made it lives.
struct LayerRope {
  std::vector<ops::RopeTable> tables;
  const std::vector<int>* layer_table = nullptr;
  const ops::RopeTable& For(int64_t il) const { return tables[(*layer_table)[il]]; }
};

class KeyTransform {
 public:
  // k_norm: per layer [D] weights in the cache dtype/device, or float32
  // (1 + w) for Gemma's norm (ops::RmsNorm); ignored without qk_norm.
  KeyTransform(const ModelConfig& config, std::vector<at::Tensor> k_norm,
               at::TensorOptions options);

  bool has_norm() const { return qk_norm_; }

  // cos/sin for positions [pos0, pos0 + n_tokens) in the cache dtype.
  LayerRope Rope(int64_t pos0, int64_t n_tokens) const;
  // cos/sin for any positions [T] (int64), row by row as Rope's.
  LayerRope RopeAt(const at::Tensor& positions) const;

  // k: [T, H, D] before k-norm/RoPE (rope: the layer's, LayerRope::For), in out's dtype (any other is converted
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
  std::vector<at::Tensor> k_norm_;   // L x [D]
  std::vector<at::Tensor> inv_freq_; // per distinct (base, scaling): [D/2] float32
  std::vector<int> layer_rope_;      // L: index into inv_freq_
  at::ScalarType dtype_;
};

}  // namespace kvl
