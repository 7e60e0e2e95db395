// Moving a span's taps from the source tokenizer's tokens onto the target's
// (issue 54: switches across tokenizers; the paper's appendix K). The
// translator is token-wise affine, so the mean of its outputs over a run of
// source tokens is its output of their mean taps: resampling the source
// taps onto the target's tokens before Translate gives each target token the
// mean translated entry of the source tokens assigned to it
// (AssignWithinGroups), computed once per target token.
//
// Thread-safe: a free function.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "model/kv_cache.h"
#include "model/token_alignment.h"

namespace kvl {

// source: [L, H, T, D] keys and values (KvCache::Taps, any float dtype, any
// device). Returns [L, H, runs.size(), D] in source's dtype and device: row j
// is the mean of source rows [runs[j].begin, runs[j].end), summed in float32
// at least (bfloat16 taps are rounded once, at the end). A run of one token
// is a copy of its row. InvalidArgument for an empty run or one outside
// [0, T), or taps that are not [L, H, T, D] pairs. Runs in the caller's
// autograd mode (gradients flow to the taps when they require them).
absl::StatusOr<KvTaps> ResampleTaps(const KvTaps& source, const std::vector<TokenRun>& runs);

}  // namespace kvl
