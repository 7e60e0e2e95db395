#include "model/key_transform.h"

#include <ATen/ATen.h>

#include <utility>

namespace kvl {

KeyTransform::KeyTransform(const ModelConfig& config, std::vector<at::Tensor> k_norm,
                           at::TensorOptions options)
    : qk_norm_(config.qk_norm),
      eps_(config.rms_norm_eps),
      k_norm_(std::move(k_norm)),
      inv_freq_(ops::RopeInvFreq(config.head_dim, config.rope_theta).to(options.device())),
      dtype_(options.dtype().toScalarType()) {}

ops::RopeTable KeyTransform::Rope(int64_t pos0, int64_t n_tokens) const {
  return ops::MakeRopeTable(inv_freq_, pos0, n_tokens, dtype_);
}

void KeyTransform::Apply(int64_t il, const at::Tensor& k, const ops::RopeTable& rope,
                         const at::Tensor& out, const at::Tensor& inv_rms_out) const {
  if (!qk_norm_) {
    ops::ApplyRope(k, rope, out);
    return;
  }
  at::Tensor inv_rms;
  const at::Tensor normed = ops::RmsNorm(k, k_norm_[il], eps_, &inv_rms);
  ops::ApplyRope(normed, rope, out);
  if (inv_rms_out.defined()) inv_rms_out.copy_(inv_rms);
}

at::Tensor KeyTransform::Invert(int64_t il, const at::Tensor& k_post, const at::Tensor& inv_rms,
                                const ops::RopeTable& rope) const {
  at::Tensor k = ops::InvertRopeFloat(k_post, rope);  // k-norm output, float32
  if (qk_norm_) {
    // k-norm computed w * cast(k * inv_rms); undo both factors.
    k.div_(k_norm_[il].to(at::kFloat)).div_(inv_rms.unsqueeze(-1));
  }
  return k.to(dtype_);
}

}  // namespace kvl
