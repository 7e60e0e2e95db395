#include "model/decoder_ops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvl::ops {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                   at::Tensor* inv_rms_out) {
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  at::Tensor inv_rms = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  at::Tensor normed = xf * inv_rms;
  if (inv_rms_out != nullptr) *inv_rms_out = inv_rms.squeeze(-1);
  if (x.scalar_type() == at::kFloat) return normed.mul_(weight);
  if (weight.scalar_type() == at::kFloat) return normed.mul_(weight).to(x.scalar_type());
  return normed.to(x.scalar_type()).mul_(weight);
}

at::Tensor RopeInvFreq(int64_t head_dim, double theta) {
  const at::Tensor exponent =
      at::arange(0, head_dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
      static_cast<double>(head_dim);
  return at::pow(theta, exponent).reciprocal();
}

RopeTable MakeRopeTable(const at::Tensor& inv_freq, int64_t pos0, int64_t n_tokens,
                        at::ScalarType dtype) {
  return MakeRopeTableAt(inv_freq,
                         at::arange(pos0, pos0 + n_tokens, inv_freq.options().dtype(at::kLong)),
                         dtype);
}

RopeTable MakeRopeTableAt(const at::Tensor& inv_freq, const at::Tensor& positions,
                          at::ScalarType dtype) {
  const at::Tensor pos = positions.to(inv_freq.device(), at::kLong).to(at::kFloat);
  const at::Tensor freqs = at::outer(pos, inv_freq);  // [T, D/2], one fp32 product each
  RopeTable t{freqs.cos(), freqs.sin()};
  if (dtype != at::kFloat) {
    t.cos = t.cos.to(dtype);
    t.sin = t.sin.to(dtype);
  }
  return t;
}

namespace {

// [T, D/2] -> [T, 1, .., 1, D/2] broadcasting against x: [T, .., D/2].
at::Tensor Broadcastable(const at::Tensor& table, const at::Tensor& x) {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape.front() = table.size(0);
  shape.back() = table.size(1);
  return table.view(shape);
}

}  // namespace

void ApplyRope(const at::Tensor& x, const RopeTable& table, const at::Tensor& out) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor c = Broadcastable(table.cos, x);
  const at::Tensor s = Broadcastable(table.sin, x);
  const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  at::Tensor o1 = out.narrow(-1, 0, half), o2 = out.narrow(-1, half, half);
  // Separate multiply and add, in x's dtype, as HF's q * cos + rotate_half(q) * sin.
  at::mul_out(o1, x1, c);
  o1.sub_(x2 * s);
  at::mul_out(o2, x2, c);
  o2.add_(x1 * s);
}

at::Tensor InvertRopeFloat(const at::Tensor& y, const RopeTable& table) {
  const int64_t half = y.size(-1) / 2;
  const at::Tensor yf = y.to(at::kFloat);
  const at::Tensor c = Broadcastable(table.cos.to(at::kFloat), y);
  const at::Tensor s = Broadcastable(table.sin.to(at::kFloat), y);
  const at::Tensor y1 = yf.narrow(-1, 0, half), y2 = yf.narrow(-1, half, half);
  // The rotation applied used cos/sin rounded to the cache dtype, so it scaled by
  // c^2 + s^2 (1 up to that rounding); dividing by it inverts it exactly.
  const at::Tensor scale = (c * c + s * s).reciprocal_();
  return at::cat({(y1 * c + y2 * s).mul_(scale), (y2 * c - y1 * s).mul_(scale)}, -1);
}

namespace {

// The x86-64 baseline (SSE2) runs these loops at half of AVX2's width;
// the best clone is chosen at load. Not under ThreadSanitizer: gcc instruments
// the clones' resolver, which the dynamic loader runs before TSan's runtime is
// up (translator/translator.cc has the same guard).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#define KVL_ATTENTION_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVL_ATTENTION_CLONES
#endif

// scores[g * n_keys + t] = scale * q[g] . keys[t] for the G query rows of one
// head. Eight partial sums per dot product, added in a fixed order, so that
// every clone gives the same result.
KVL_ATTENTION_CLONES void Scores(const float* __restrict q, const float* __restrict keys,
                                 int64_t n_group, int64_t d, int64_t n_keys, float scale,
                                 float* __restrict scores) {
  for (int64_t t = 0; t < n_keys; ++t) {
    const float* k = keys + t * d;
    for (int64_t g = 0; g < n_group; ++g) {
      const float* qg = q + g * d;
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) {
        for (int j = 0; j < 8; ++j) part[j] += qg[i + j] * k[i + j];
      }
      float dot = ((part[0] + part[1]) + (part[2] + part[3])) +
                  ((part[4] + part[5]) + (part[6] + part[7]));
      for (; i < d; ++i) dot += qg[i] * k[i];
      scores[g * n_keys + t] = dot * scale;
    }
  }
}

// out[g] = sum_t probs[g * n_keys + t] * values[t] for the G rows of one head.
KVL_ATTENTION_CLONES void WeightedValues(const float* __restrict probs,
                                         const float* __restrict values, int64_t n_group,
                                         int64_t d, int64_t n_keys, float* __restrict out) {
  for (int64_t g = 0; g < n_group; ++g) std::fill(out + g * d, out + (g + 1) * d, 0.0f);
  for (int64_t t = 0; t < n_keys; ++t) {
    const float* v = values + t * d;
    for (int64_t g = 0; g < n_group; ++g) {
      const float p = probs[g * n_keys + t];
      float* o = out + g * d;
      for (int64_t i = 0; i < d; ++i) o[i] += p * v[i];
    }
  }
}

}  // namespace

void DecodeAttention(const DecodeAttentionShape& shape, const float* q, int64_t q_head_stride,
                     const float* keys, const float* values, float scale, float* out,
                     int64_t out_head_stride, float* scratch) {
  const int64_t g_n = shape.n_group, d = shape.head_dim, n_keys = shape.n_keys;
  for (int64_t h = 0; h < shape.n_head_kv; ++h) {
    const float* head_keys = keys + h * shape.capacity * d;
    const float* head_values = values + h * shape.capacity * d;
    Scores(q + h * q_head_stride, head_keys, g_n, d, n_keys, scale, scratch);
    for (int64_t g = 0; g < g_n; ++g) {
      float* row = scratch + g * n_keys;
      const float top = *std::max_element(row, row + n_keys);
      float sum = 0;
      for (int64_t t = 0; t < n_keys; ++t) {
        row[t] = std::exp(row[t] - top);
        sum += row[t];
      }
      const float inv = 1.0f / sum;
      for (int64_t t = 0; t < n_keys; ++t) row[t] *= inv;
    }
    WeightedValues(scratch, head_values, g_n, d, n_keys, out + h * out_head_stride);
  }
}

}  // namespace kvl::ops
