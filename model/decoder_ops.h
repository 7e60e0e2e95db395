// Building blocks shared by the cached decoder and the KV cache's translation
// taps. They follow Hugging Face's Qwen3/Llama numerics step by step (same
// operations in the same dtype, in the same order) so that keys the cache
// accepts from elsewhere go through exactly what the forward applies.
//
// Legend: T=tokens, H=heads (query or key/value), D=head_dim.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace kvl::ops {

// HF RMSNorm over the last dimension: in float32, x * rsqrt(mean(x^2) + eps),
// cast back to x's dtype, then times weight (Llama, Qwen3). A float32 weight
// on a lower-precision x scales before the cast instead (Gemma, whose weight
// is 1 + w in float32). When inv_rms_out is given it receives the float32
// rsqrt(mean(x^2) + eps) (x's shape without its last dim).
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                   at::Tensor* inv_rms_out = nullptr);

// RoPE frequencies as HF computes them in float32: 1 / theta^(2i/D), [D/2].
at::Tensor RopeInvFreq(int64_t head_dim, double theta);

// cos and sin of pos * inv_freq for positions [pos0, pos0 + n_tokens), computed
// in float32 and cast to dtype, [T, D/2] each (HF's tables are these halves
// concatenated twice; the rotate_half convention pairs dim i with i + D/2).
struct RopeTable {
  at::Tensor cos, sin;  // [T, D/2]
};
RopeTable MakeRopeTable(const at::Tensor& inv_freq, int64_t pos0, int64_t n_tokens,
                        at::ScalarType dtype);
// The same for any positions [T] (int64): row i is position positions[i],
// equal to MakeRopeTable's row for that position.
RopeTable MakeRopeTableAt(const at::Tensor& inv_freq, const at::Tensor& positions,
                          at::ScalarType dtype);

// out = x * cos + rotate_half(x) * sin for x: [T, .., D] (any strides); out may
// be a strided view (e.g. into a cache line), must not overlap x.
void ApplyRope(const at::Tensor& x, const RopeTable& table, const at::Tensor& out);

// Attention of one query token against the first n_keys keys and values of a
// cache line's layer, float32 on the CPU, written as loops over raw memory:
// the decode step runs it once per row, where the tensor-operation path (two
// GEMMs per kv head that pack a 32-wide block each time, a softmax, copies)
// costs several times the arithmetic (bench/batch_step_bench.cc,
// docs/model-runtime.md). Numerics as HF's eager attention in float32: the dot
// product q.k, times scale, softmax (max subtracted, exp, divided by the sum),
// then the probabilities times the values, each accumulated in float32.
//   q:      [H, G, D], head h at q + h * q_head_stride, its G rows contiguous;
//   keys, values: [H, capacity, D] contiguous, the line's layer;
//   out:    as q's layout (out_head_stride);
//   scratch: at least G * n_keys floats.
struct DecodeAttentionShape {
  int64_t n_head_kv, n_group, head_dim, capacity, n_keys;
};
void DecodeAttention(const DecodeAttentionShape& shape, const float* q, int64_t q_head_stride,
                     const float* keys, const float* values, float scale, float* out,
                     int64_t out_head_stride, float* scratch);

// The inverse of ApplyRope, computed in float32, y: [T, H, D]
// -> float32 [T, H, D].
at::Tensor InvertRopeFloat(const at::Tensor& y, const RopeTable& table);

}  // namespace kvl::ops
