#include "model/kv_cache.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/key_transform.h"

namespace kvl {
namespace {

// Smallest allocation, in tokens, so that short chats do not regrow at once.
constexpr int64_t kMinCapacity = 64;

int64_t Nbytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

KvCache::KvCache(std::shared_ptr<const KeyTransform> transform, int64_t n_layer, int64_t n_head_kv,
                 int64_t head_dim, at::TensorOptions options, KeyTapMode tap_mode)
    : transform_(std::move(transform)),
      n_layer_(n_layer),
      n_head_kv_(n_head_kv),
      head_dim_(head_dim),
      options_(options),
      tap_mode_(tap_mode),
      keep_inv_rms_(tap_mode == KeyTapMode::kInvert && transform_->has_norm()) {}

KvCache::~KvCache() = default;

int64_t KvCache::Bytes() const {
  return Nbytes(keys_) + Nbytes(values_) + Nbytes(keys_prenorm_) + Nbytes(inv_rms_);
}

int64_t KvCache::BytesPerToken() const {
  const int64_t kv_elems = n_layer_ * n_head_kv_ * head_dim_;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(options_.dtype().toScalarType()));
  int64_t bytes = 2 * kv_elems * elem;
  if (tap_mode_ == KeyTapMode::kStorePreNorm) bytes += kv_elems * elem;
  if (keep_inv_rms_) bytes += n_layer_ * n_head_kv_ * static_cast<int64_t>(sizeof(float));
  return bytes;
}

void KvCache::EnsureCapacity(int64_t n_tokens) {
  if (n_tokens <= capacity_) return;
  c10::InferenceMode inference;  // the line's tensors are inference tensors
  const int64_t new_capacity = std::max({n_tokens, 2 * capacity_, kMinCapacity});
  auto grow = [&](at::Tensor& t, at::TensorOptions opts, bool per_dim) {
    at::Tensor fresh = per_dim ? at::empty({n_layer_, n_head_kv_, new_capacity, head_dim_}, opts)
                               : at::empty({n_layer_, n_head_kv_, new_capacity}, opts);
    if (n_tokens_ > 0) fresh.narrow(2, 0, n_tokens_).copy_(t.narrow(2, 0, n_tokens_));
    t = std::move(fresh);
  };
  grow(keys_, options_, true);
  grow(values_, options_, true);
  if (tap_mode_ == KeyTapMode::kStorePreNorm) grow(keys_prenorm_, options_, true);
  if (keep_inv_rms_) grow(inv_rms_, options_.dtype(at::kFloat), false);
  capacity_ = new_capacity;
}

absl::Status KvCache::Reserve(int64_t n_tokens) {
  if (n_tokens < 0) return absl::InvalidArgumentError("Reserve: negative token count");
  try {
    EnsureCapacity(n_tokens);
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("reserve: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::ClonePrefix(int64_t n_tokens,
                                                               int64_t capacity) const {
  if (n_tokens < 0 || n_tokens > n_tokens_) {
    return absl::OutOfRangeError(
        absl::StrCat("ClonePrefix of ", n_tokens, " tokens: the line holds ", n_tokens_));
  }
  if (const int64_t start = ExtendablePrefix(n_tokens); start != n_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ClonePrefix of ", n_tokens, " tokens cuts the thin translated span from ", start));
  }
  std::unique_ptr<KvCache> copy(
      new KvCache(transform_, n_layer_, n_head_kv_, head_dim_, options_, tap_mode_));
  try {
    copy->EnsureCapacity(std::max(n_tokens, capacity));
    c10::InferenceMode inference;
    if (n_tokens > 0) {
      copy->keys_.narrow(2, 0, n_tokens).copy_(keys_.narrow(2, 0, n_tokens));
      copy->values_.narrow(2, 0, n_tokens).copy_(values_.narrow(2, 0, n_tokens));
      if (keys_prenorm_.defined()) {
        copy->keys_prenorm_.narrow(2, 0, n_tokens).copy_(keys_prenorm_.narrow(2, 0, n_tokens));
      }
      if (inv_rms_.defined()) {
        copy->inv_rms_.narrow(2, 0, n_tokens).copy_(inv_rms_.narrow(2, 0, n_tokens));
      }
    }
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("clone: ", e.what_without_backtrace()));
  }
  copy->n_tokens_ = n_tokens;
  for (const KvSpan& span : spans_) {
    if (span.t0 >= n_tokens) break;
    KvSpan kept = span;
    kept.t1 = std::min(span.t1, n_tokens);
    copy->spans_.push_back(kept);
  }
  return copy;
}

void KvCache::MarkRepaired(int64_t from) {
  std::vector<KvSpan> spans;
  for (const KvSpan& span : spans_) {
    if (span.t1 <= from || !span.native) {
      spans.push_back(span);
    } else if (span.t0 >= from) {
      spans.push_back({span.t0, span.t1, true, true});
    } else {
      spans.push_back({span.t0, from, true, span.repaired});  // native: never thin
      spans.push_back({from, span.t1, true, true});
    }
  }
  spans_ = std::move(spans);
}

int64_t KvCache::ExtendablePrefix(int64_t n) const {
  for (const KvSpan& span : spans_) {
    if (span.thin && span.t0 < n && n < span.t1) return span.t0;
  }
  return n;
}

int64_t KvCache::FirstForeignToken() const {
  for (const KvSpan& span : spans_) {
    if (!span.native) return span.t0;
  }
  return -1;
}

absl::Status KvCache::Rollback(int64_t n_tokens) {
  if (n_tokens < 0 || n_tokens > n_tokens_) {
    return absl::OutOfRangeError(
        absl::StrCat("Rollback to ", n_tokens, " tokens: the line holds ", n_tokens_));
  }
  if (const int64_t start = ExtendablePrefix(n_tokens); start != n_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Rollback to ", n_tokens, " tokens cuts the thin translated span from ", start));
  }
  n_tokens_ = n_tokens;
  while (!spans_.empty() && spans_.back().t0 >= n_tokens) spans_.pop_back();
  if (!spans_.empty()) spans_.back().t1 = std::min(spans_.back().t1, n_tokens);
  return absl::OkStatus();
}

void KvCache::Commit(int64_t n, bool native, bool thin) {
  if (n == 0) return;
  // Only newly computed tokens come here: they never extend a repaired span.
  // A thin span stays apart from its foreign neighbours, so that the line
  // may still be cut where it ends or where the next one starts.
  if (!spans_.empty() && spans_.back().native == native && !spans_.back().repaired &&
      !spans_.back().thin && !thin) {
    spans_.back().t1 += n;
  } else {
    KvSpan span{n_tokens_, n_tokens_ + n, native};
    span.thin = thin;
    spans_.push_back(span);
  }
  n_tokens_ += n;
}

at::Tensor KvCache::Keys(int64_t il) const { return keys_[il].narrow(1, 0, n_tokens_); }
at::Tensor KvCache::Values(int64_t il) const { return values_[il].narrow(1, 0, n_tokens_); }

absl::StatusOr<KvTaps> KvCache::Taps(int64_t t0, int64_t t1) const {
  if (t0 < 0 || t1 < t0 || t1 > n_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("taps [", t0, ", ", t1, "): the line holds ", n_tokens_, " tokens"));
  }
  for (const KvSpan& s : spans_) {
    if (!s.native && s.t0 < t1 && t0 < s.t1) {
      return absl::FailedPreconditionError(
          absl::StrCat("taps [", t0, ", ", t1, ") overlap the foreign span [", s.t0, ", ", s.t1,
                       "): a translation is never translated again"));
    }
  }
  // Deliberately outside InferenceMode: the copies are normal tensors, usable
  // by training code (translator fitting) under autograd.
  try {
    return TapsUnchecked(t0, t1);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("taps: ", e.what_without_backtrace()));
  }
}

KvTaps KvCache::TapsUnchecked(int64_t t0, int64_t t1) const {
  const int64_t n = t1 - t0;
  KvTaps taps;
  taps.values = values_.narrow(2, t0, n).clone(at::MemoryFormat::Contiguous);
  if (tap_mode_ == KeyTapMode::kStorePreNorm) {
    taps.keys = keys_prenorm_.narrow(2, t0, n).clone(at::MemoryFormat::Contiguous);
    return taps;
  }
  taps.keys = at::empty({n_layer_, n_head_kv_, n, head_dim_}, options_);
  const LayerRope rope = transform_->Rope(t0, n);
  for (int64_t il = 0; il < n_layer_; ++il) {
    const at::Tensor post = keys_[il].narrow(1, t0, n).transpose(0, 1);  // [T, H, D]
    const at::Tensor inv = keep_inv_rms_ ? inv_rms_[il].narrow(1, t0, n).t() : at::Tensor();
    transform_->Invert(il, post, inv, rope.For(il), taps.keys[il].transpose(0, 1));
  }
  return taps;
}

absl::Status KvCache::Accept(const at::Tensor& keys, const at::Tensor& values,
                             const std::vector<int64_t>& unread) {
  auto check = [&](const at::Tensor& t, const char* what) -> absl::Status {
    if (!t.defined() || t.dim() != 4 || t.size(0) != n_layer_ || t.size(1) != n_head_kv_ ||
        t.size(3) != head_dim_ || !at::isFloatingType(t.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Accept: ", what, " must be float [L=", n_layer_, ", H=", n_head_kv_, ", T, D=",
          head_dim_, "], got ", t.defined() ? c10::str(t.sizes()) : std::string("undefined")));
    }
    return absl::OkStatus();
  };
  KVL_RETURN_IF_ERROR(check(keys, "keys"));
  KVL_RETURN_IF_ERROR(check(values, "values"));
  if (keys.size(2) != values.size(2)) {
    return absl::InvalidArgumentError("Accept: keys and values cover different token counts");
  }
  if (keys.device() != options_.device() || values.device() != options_.device()) {
    // No silent copy across devices: a translator computes where the line is.
    return absl::InvalidArgumentError(absl::StrCat(
        "Accept: keys on ", keys.device().str(), " and values on ", values.device().str(),
        ", the line on ", options_.device().str()));
  }
  const int64_t n = keys.size(2), t0 = n_tokens_;
  if (!unread.empty() && static_cast<int64_t>(unread.size()) != n_layer_) {
    return absl::InvalidArgumentError(absl::StrCat("Accept: ", unread.size(),
                                                   " unread counts for ", n_layer_, " layers"));
  }
  bool thin = false;
  for (int64_t u : unread) {
    if (u < 0 || u > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("Accept: unread count ", u, " outside [0, ", n, "]"));
    }
    thin = thin || u > 0;
  }
  try {
    c10::InferenceMode inference;
    EnsureCapacity(t0 + n);
    // KeyTransform::Apply converts the keys' dtype as it needs (bfloat16 ones,
    // a translator's product, a float32 line reads as they are).
    const LayerRope rope = transform_->Rope(t0, n);
    for (int64_t il = 0; il < n_layer_; ++il) {
      const int64_t u = unread.empty() ? 0 : unread[static_cast<size_t>(il)], m = n - u;
      if (u > 0) {
        keys_[il].narrow(1, t0, u).zero_();
        values_[il].narrow(1, t0, u).zero_();
      }
      if (m == 0) continue;
      const ops::RopeTable& table = rope.For(il);
      transform_->Apply(il, keys[il].narrow(1, u, m).transpose(0, 1),
                        {table.cos.narrow(0, u, m), table.sin.narrow(0, u, m)},
                        keys_[il].narrow(1, t0 + u, m).transpose(0, 1), at::Tensor());
      values_[il].narrow(1, t0 + u, m).copy_(values[il].narrow(1, u, m));  // converts
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("accept: ", e.what_without_backtrace()));
  }
  Commit(n, /*native=*/false, thin);
  return absl::OkStatus();
}

}  // namespace kvl
