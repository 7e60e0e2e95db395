#include "model/decoder_ops.h"

#include <ATen/ATen.h>

#include <vector>

namespace kvl::ops {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                   at::Tensor* inv_rms_out) {
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  at::Tensor inv_rms = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  at::Tensor normed = xf * inv_rms;
  if (inv_rms_out != nullptr) *inv_rms_out = inv_rms.squeeze(-1);
  if (x.scalar_type() != at::kFloat) normed = normed.to(x.scalar_type());
  return normed.mul_(weight);
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

}  // namespace kvl::ops
