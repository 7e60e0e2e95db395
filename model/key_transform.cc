#include "model/key_transform.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace kvl {
namespace {

// The fused loops below serve float32 CPU tensors of [T, H, D] whose head
// vectors are contiguous (any other strides), which is how the decoder's
// projections and a cache line's views come. They run the very operations of
// the ATen path (docs/model-runtime.md), each rounded to float32 in the same
// order, in one pass over each head vector instead of a dozen full-size
// temporaries; only the k-norm's sum of squares is added in another order.
// They run on the calling thread (kvlingo's sources are built without OpenMP,
// so at::parallel_for would too): a pass costs about what the memory traffic
// does, a few ms for a 4k-token switch (docs/model-runtime.md).
bool Fusable(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.device().is_cpu() && t.dim() == 3 && t.stride(2) == 1;
}

// Apply's input may also be bfloat16 (a translator's product, KvCache::Accept):
// each head vector is widened to float32 first, exactly, so the result is the
// float32 loop's on the widened tensor.
bool FusableInput(const at::Tensor& t) {
  return (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && t.device().is_cpu() &&
         t.dim() == 3 && t.stride(2) == 1;
}

// The head vector at x as float32: x itself, or widened into buf.
inline const float* Widened(const float* x, float* /*buf*/, int64_t /*d*/) { return x; }
inline const float* Widened(const c10::BFloat16* x, float* buf, int64_t d) {
  for (int64_t e = 0; e < d; ++e) buf[e] = static_cast<float>(x[e]);
  return buf;
}

}  // namespace

KeyTransform::KeyTransform(const ModelConfig& config, std::vector<at::Tensor> k_norm,
                           at::TensorOptions options)
    : qk_norm_(config.qk_norm),
      eps_(config.rms_norm_eps),
      k_norm_(std::move(k_norm)),
      dtype_(options.dtype().toScalarType()) {
  std::vector<std::pair<double, double>> kinds;  // (base, factor) per inv_freq_ entry
  for (int64_t il = 0; il < config.n_layer; ++il) {
    const std::pair<double, double> kind{config.RopeTheta(il), config.RopeFactor(il)};
    auto it = std::find(kinds.begin(), kinds.end(), kind);
    if (it == kinds.end()) {
      kinds.push_back(kind);
      // Linear scaling divides the frequencies (HF: inv_freq /= factor, float32).
      at::Tensor inv_freq = ops::RopeInvFreq(config.head_dim, kind.first);
      if (kind.second != 1.0) inv_freq = inv_freq / kind.second;
      inv_freq_.push_back(inv_freq.to(options.device()));
      it = kinds.end() - 1;
    }
    layer_rope_.push_back(static_cast<int>(it - kinds.begin()));
  }
}

LayerRope KeyTransform::Rope(int64_t pos0, int64_t n_tokens) const {
  LayerRope rope{{}, &layer_rope_};
  for (const at::Tensor& inv_freq : inv_freq_) {
    rope.tables.push_back(ops::MakeRopeTable(inv_freq, pos0, n_tokens, dtype_));
  }
  return rope;
}

LayerRope KeyTransform::RopeAt(const at::Tensor& positions) const {
  LayerRope rope{{}, &layer_rope_};
  for (const at::Tensor& inv_freq : inv_freq_) {
    rope.tables.push_back(ops::MakeRopeTableAt(inv_freq, positions, dtype_));
  }
  return rope;
}

void KeyTransform::Apply(int64_t il, const at::Tensor& k, const ops::RopeTable& rope,
                         const at::Tensor& out, const at::Tensor& inv_rms_out) const {
  if (k.scalar_type() != out.scalar_type() &&
      !(k.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kFloat)) {
    // Converted first; bfloat16 into float32 is widened as the fused loop reads.
    Apply(il, k.to(out.scalar_type()), rope, out, inv_rms_out);
    return;
  }
  if (FusableInput(k) && Fusable(out) && rope.cos.scalar_type() == at::kFloat && FloatNorm(il) &&
      (!inv_rms_out.defined() || inv_rms_out.scalar_type() == at::kFloat)) {
    if (k.scalar_type() == at::kFloat) {
      ApplyFused<float>(il, k, rope, out, inv_rms_out);
    } else {
      ApplyFused<c10::BFloat16>(il, k, rope, out, inv_rms_out);
    }
    return;
  }
  // The op-by-op path computes in the output's dtype (bfloat16 keys into a
  // float32 out reach it only when the loop cannot run).
  const at::Tensor k_out = k.scalar_type() == out.scalar_type() ? k : k.to(out.scalar_type());
  if (!qk_norm_) {
    ops::ApplyRope(k_out, rope, out);
    return;
  }
  at::Tensor inv_rms;
  const at::Tensor normed = ops::RmsNorm(k_out, k_norm_[il], eps_, &inv_rms);
  ops::ApplyRope(normed, rope, out);
  if (inv_rms_out.defined()) inv_rms_out.copy_(inv_rms);
}

void KeyTransform::Invert(int64_t il, const at::Tensor& k_post, const at::Tensor& inv_rms,
                          const ops::RopeTable& rope, const at::Tensor& out) const {
  if (Fusable(k_post) && Fusable(out) && rope.cos.scalar_type() == at::kFloat && FloatNorm(il)) {
    InvertFloat(il, k_post, inv_rms, rope, out);
    return;
  }
  at::Tensor k = ops::InvertRopeFloat(k_post, rope);  // k-norm output, float32
  if (qk_norm_) {
    // k-norm computed w * cast(k * inv_rms); undo both factors.
    k.div_(k_norm_[il].to(at::kFloat)).div_(inv_rms.unsqueeze(-1));
  }
  out.copy_(k);
}

template <typename In>
void KeyTransform::ApplyFused(int64_t il, const at::Tensor& k, const ops::RopeTable& rope,
                              const at::Tensor& out, const at::Tensor& inv_rms_out) const {
  const int64_t n = k.size(0), h = k.size(1), d = k.size(2), half = d / 2;
  TORCH_CHECK(out.size(0) == n && out.size(1) == h && out.size(2) == d, "Apply: out shape");
  TORCH_CHECK(
      rope.cos.size(0) == n && rope.cos.size(1) == half && rope.sin.sizes() == rope.cos.sizes(),
      "Apply: rope table shape");
  TORCH_CHECK(!inv_rms_out.defined() ||
                  (inv_rms_out.dim() == 2 && inv_rms_out.size(0) == n && inv_rms_out.size(1) == h),
              "Apply: inv_rms_out shape");
  const at::Tensor cos = rope.cos.contiguous(), sin = rope.sin.contiguous();
  const In* kp = k.data_ptr<In>();
  float* op = out.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const at::Tensor w = qk_norm_ ? k_norm_[il].contiguous() : at::Tensor();
  const float* wp = qk_norm_ ? w.data_ptr<float>() : nullptr;
  float* ip = inv_rms_out.defined() && qk_norm_ ? inv_rms_out.data_ptr<float>() : nullptr;
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), os0 = out.stride(0), os1 = out.stride(1);
  const int64_t is0 = ip ? inv_rms_out.stride(0) : 0, is1 = ip ? inv_rms_out.stride(1) : 0;
  const float eps = static_cast<float>(eps_), fd = static_cast<float>(d);
  // Once per call, never per token.
  std::vector<float> normed(static_cast<size_t>(d)), widened(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cp + t * half;
    const float* s = sp + t * half;
    for (int64_t j = 0; j < h; ++j) {
      const float* x = Widened(kp + t * ks0 + j * ks1, widened.data(), d);
      float* o = op + t * os0 + j * os1;
      if (wp != nullptr) {
        // HF RMSNorm in float32: x * rsqrt(mean(x^2) + eps), then * w.
        float ss = 0;
        for (int64_t e = 0; e < d; ++e) ss += x[e] * x[e];
        const float inv = 1.0f / std::sqrt(ss / fd + eps);
        for (int64_t e = 0; e < d; ++e) normed[e] = x[e] * inv * wp[e];
        if (ip != nullptr) ip[t * is0 + j * is1] = inv;
        x = normed.data();
      }
      // x * cos + rotate_half(x) * sin, a product and a sum each.
      for (int64_t e = 0; e < half; ++e) {
        o[e] = x[e] * c[e] - x[e + half] * s[e];
        o[e + half] = x[e + half] * c[e] + x[e] * s[e];
      }
    }
  }
}

void KeyTransform::InvertFloat(int64_t il, const at::Tensor& k_post, const at::Tensor& inv_rms,
                               const ops::RopeTable& rope, const at::Tensor& out) const {
  const int64_t n = k_post.size(0), h = k_post.size(1), d = k_post.size(2), half = d / 2;
  TORCH_CHECK(out.size(0) == n && out.size(1) == h && out.size(2) == d, "Invert: out shape");
  TORCH_CHECK(
      rope.cos.size(0) == n && rope.cos.size(1) == half && rope.sin.sizes() == rope.cos.sizes(),
      "Invert: rope table shape");
  TORCH_CHECK(!qk_norm_ || (inv_rms.defined() && inv_rms.dim() == 2 && inv_rms.size(0) == n &&
                            inv_rms.size(1) == h),
              "Invert: inv_rms must be [T, H] with k-norm");
  const at::Tensor cos = rope.cos.contiguous(), sin = rope.sin.contiguous();
  const float* yp = k_post.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const at::Tensor w = qk_norm_ ? k_norm_[il].contiguous() : at::Tensor();
  const float* wp = qk_norm_ ? w.data_ptr<float>() : nullptr;
  const at::Tensor inv = qk_norm_ ? inv_rms.to(at::kFloat) : at::Tensor();
  const float* ip = qk_norm_ ? inv.data_ptr<float>() : nullptr;
  const int64_t ys0 = k_post.stride(0), ys1 = k_post.stride(1);
  const int64_t os0 = out.stride(0), os1 = out.stride(1);
  const int64_t is0 = ip ? inv.stride(0) : 0, is1 = ip ? inv.stride(1) : 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cp + t * half;
    const float* s = sp + t * half;
    for (int64_t j = 0; j < h; ++j) {
      const float* y = yp + t * ys0 + j * ys1;
      float* o = op + t * os0 + j * os1;
      // The rotation used cos/sin rounded to the cache dtype, so it scaled
      // by c^2 + s^2 (1 up to that rounding); dividing by it inverts it.
      for (int64_t e = 0; e < half; ++e) {
        const float scale = 1.0f / (c[e] * c[e] + s[e] * s[e]);
        o[e] = (y[e] * c[e] + y[e + half] * s[e]) * scale;
        o[e + half] = (y[e + half] * c[e] - y[e] * s[e]) * scale;
      }
      if (wp != nullptr) {
        // k-norm computed w * (k * inv_rms); undo both factors.
        const float r = ip[t * is0 + j * is1];
        for (int64_t e = 0; e < d; ++e) o[e] = o[e] / wp[e] / r;
      }
    }
  }
}

}  // namespace kvl
