// One KV cache line: the attention keys and values one model holds for one
// session, plus what translation needs.
//
// Legend: L=n_layer, H=n_head_kv, T=tokens, D=head_dim.
//
// Storage, per layer: keys after k-norm and RoPE (what attention reads) and
// values, [H, capacity, D] in the model's dtype, growing geometrically
// (append-only; Rollback shortens). Translation taps need keys *before* k-norm
// and RoPE; the line keeps what inverts both instead of a third copy of the
// keys: per (layer, head, token) the float32 1/rms that k-norm divided by
// (nothing for models without k-norm), and the RoPE positions are implied. See
// docs/model-runtime.md for the measured cost of both options; KeyTapMode
// selects one.
//
// Spans are marked native (the model computed them) or foreign (accepted from
// elsewhere, e.g. a translator); taps of foreign spans are refused, since a
// translation is never translated again.
//
// Not thread-safe: a line is used by one thread at a time. In a Router that is
// the turn's thread between engine requests (hand-over, translation) and the
// model's engine loop while a request on the line runs (the turn's thread
// waits for it: model/scheduler.h); the repair thread's copy likewise.
// Distinct lines are independent.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvl {

class Decoder;
class KeyTransform;

enum class KeyTapMode {
  kInvert,        // keep 1/rms per (layer, head, token); invert k-norm and RoPE on tap
  kStorePreNorm,  // keep a copy of the pre-norm keys (+50% over K+V)
};

struct KvSpan {
  int64_t t0 = 0, t1 = 0;  // [t0, t1)
  bool native = true;
  // Native, computed by background repair where the line held a translation
  // (KvCache::MarkRepaired): provenance only, read as native everywhere.
  bool repaired = false;
  // Foreign, accepted with unread tokens (KvCache::Accept): some sliding
  // layers hold only the entries a query after the span reads (its last
  // W - 1 tokens), zeros before them. The line goes on only from the span's
  // end, never from inside it (KvCache::ExtendablePrefix).
  bool thin = false;
};

struct KvTaps {
  at::Tensor keys;    // [L, H, T, D] before k-norm and RoPE, cache dtype
  at::Tensor values;  // [L, H, T, D]
};

class KvCache {
 public:
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();

  int64_t Length() const { return n_tokens_; }
  int64_t Capacity() const { return capacity_; }
  int64_t n_layer() const { return n_layer_; }
  KeyTapMode tap_mode() const { return tap_mode_; }
  // Bytes of tensor storage actually allocated (capacity included).
  int64_t Bytes() const;
  // Bytes each additional token of capacity costs.
  int64_t BytesPerToken() const;
  // Spans in order, covering [0, Length()), adjacent spans of equal kind
  // merged (a thin span is never merged).
  const std::vector<KvSpan>& Spans() const { return spans_; }

  // Makes room for n_tokens in total without further growth.
  absl::Status Reserve(int64_t n_tokens);
  // Shortens the line to n_tokens (OutOfRange if longer than Length();
  // FailedPrecondition, the line unchanged, if n_tokens cuts a thin span,
  // which could not go on from there). Capacity is kept.
  absl::Status Rollback(int64_t n_tokens);

  // A new line holding a copy of this line's first n_tokens (their keys,
  // values, what inverts the keys and their spans), with capacity for
  // `capacity` tokens (at least n_tokens). The background repair
  // (router/repair.h) recomputes a line's translated tail on such a copy
  // while the session goes on using the original. OutOfRange when n_tokens
  // exceeds Length(); FailedPrecondition when it cuts a thin span (as
  // Rollback); ResourceExhausted when the memory cannot be allocated.
  absl::StatusOr<std::unique_ptr<KvCache>> ClonePrefix(int64_t n_tokens, int64_t capacity) const;
  // The first token of the first foreign span; -1 when the line is all native.
  int64_t FirstForeignToken() const;
  // The longest prefix of at most n tokens (n <= Length()) that the model can
  // go on from: n, or the start of a thin span (KvSpan::thin) that n cuts,
  // since a query after n would read the zeros that span holds in place of
  // entries nobody was to read. Where a fork's copy of a prefix stops.
  int64_t ExtendablePrefix(int64_t n) const;
  // Marks the native tokens [from, Length()) as repaired (KvSpan::repaired),
  // splitting the span that holds `from`. The repair's copy, once it has
  // recomputed them.
  void MarkRepaired(int64_t from);

  // Keys before k-norm/RoPE and values of [t0, t1): copies, and normal (not
  // inference) tensors, so training code may use them under autograd.
  // InvalidArgument for a bad range, FailedPrecondition if any part of it is
  // foreign.
  absl::StatusOr<KvTaps> Taps(int64_t t0, int64_t t1) const;
  // Appends a foreign span at [Length(), Length() + T): keys [L, H, T, D] before
  // k-norm and RoPE (this model's k-norm and RoPE at the target positions are
  // applied here, exactly as the forward does), values [L, H, T, D]. Any float
  // dtype is converted; any strides are read as they are (Translator::Translate's
  // Output::kProduct views). InvalidArgument on shape mismatch, or for tensors
  // on another device than the line's (nothing crosses devices silently).
  // unread (empty, or one count per layer, UnreadTokens): layer il's first
  // unread[il] tokens are stored as zeros, neither read nor transformed, and
  // the span is thin when any count is positive (InvalidArgument for a count
  // outside [0, T] or a list of another length).
  absl::Status Accept(const at::Tensor& keys, const at::Tensor& values,
                      const std::vector<int64_t>& unread = {});

  // Attention views of layer il for the decoder, [H, Length(), D].
  at::Tensor Keys(int64_t il) const;
  at::Tensor Values(int64_t il) const;

 private:
  friend class Decoder;
  KvCache(std::shared_ptr<const KeyTransform> transform, int64_t n_layer, int64_t n_head_kv,
          int64_t head_dim, at::TensorOptions options, KeyTapMode tap_mode);

  // Grows capacity to at least n_tokens (geometric), copying what is held.
  void EnsureCapacity(int64_t n_tokens);
  KvTaps TapsUnchecked(int64_t t0, int64_t t1) const;
  // Records [Length(), Length() + n) as written and of the given kind.
  void Commit(int64_t n, bool native, bool thin = false);

  std::shared_ptr<const KeyTransform> transform_;
  int64_t n_layer_, n_head_kv_, head_dim_;
  at::TensorOptions options_;
  KeyTapMode tap_mode_;
  bool keep_inv_rms_;
  int64_t n_tokens_ = 0, capacity_ = 0;
  at::Tensor keys_, values_;  // [L, H, capacity, D]
  at::Tensor keys_prenorm_;   // [L, H, capacity, D]; kStorePreNorm only
  at::Tensor inv_rms_;        // [L, H, capacity] float32; kInvert with k-norm only
  std::vector<KvSpan> spans_;
};

}  // namespace kvl
