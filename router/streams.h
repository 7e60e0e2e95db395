// A conversation rendered by models with different tokenizers (issue 54):
// each tokenizer has its own token stream of the same text, cut into the
// same segments (the preamble, each turn's rendered user message, reply and
// closing template), each segment the stream's own encoding of the
// segment's text (or, for the model that wrote it, its generated tokens). A
// switch across tokenizers translates the target's missing tokens from the
// writer's line on the writer's stream: AlignAcross pairs the two streams'
// tokens segment by segment through the minimal matching groups of the
// segment's text (model/token_alignment.h) and gives each target token the
// run of source tokens whose taps it takes (AssignWithinGroups,
// translator/resample.h).
//
// Thread-safe: free functions over values the caller owns.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/token_alignment.h"
#include "model/tokenizer.h"

namespace kvl::router {

// One tokenizer's rendering: its ids and the start of each segment in them
// (ascending; the first 0 when there are ids). Every rendering of one
// conversation has the same number of segments.
struct StreamView {
  const Tokenizer* tokenizer = nullptr;
  const std::vector<int64_t>* ids = nullptr;
  const std::vector<int64_t>* bounds = nullptr;
};

// Target tokens [target_begin, target_end) paired with source tokens
// [source_begin, source_end): runs[j] is the run of source tokens (relative to
// source_begin) that target token target_begin + j takes.
struct AlignedSpan {
  int64_t target_begin = 0, target_end = 0;
  int64_t source_begin = 0, source_end = 0;
  std::vector<TokenRun> runs;
  int64_t n_groups = 0, n_one_to_one = 0;
};

// Aligns the target's tokens from `begin` towards `end` with the source's:
// segment by segment, each segment's text (the target's
// tokens decoded) spelled by both streams' tokens of that segment and cut
// into minimal matching groups. The span stops before the first group that
// would pass `end` on the target's side or `source_limit` on the source's
// (the tokens the source's line holds), and before a segment whose text the
// two streams do not both spell (a tokenizer that rewrites it, such as
// Gemma-3 reading a literal U+2581): what is left is the caller's to prefill.
// So target_end <= end, and target_end == target_begin when nothing aligns.
// A `begin` inside a segment starts the span at the first group boundary at
// or after it (target_begin >= begin: the tokens before are the caller's to
// prefill too). InvalidArgument when the two renderings have different
// segment counts or `begin` is past the target's stream.
absl::StatusOr<AlignedSpan> AlignAcross(const StreamView& source, const StreamView& target,
                                        int64_t begin, int64_t end, int64_t source_limit);

}  // namespace kvl::router
