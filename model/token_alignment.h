// Two tokenizations of one text, aligned (issue 54; the paper's appendix K):
// minimal matching groups by the shared-boundary rule. Walk both token
// sequences by the text bytes each token covers and close a group wherever
// both have consumed the same number of bytes: each group is the smallest run
// of tokens on each side covering the same bytes. Linear, deterministic, no
// training. Identical tokenizations align one token to one token.
//
// Tokens that cover no bytes (a tokenizer's empty pieces) join the group
// before them (the first group, at the start).
//
// Thread-safe: free functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace kvl {

// Tokens [a_begin, a_end) of the first tokenization and [b_begin, b_end) of
// the second cover the text's bytes [byte_begin, byte_end).
struct AlignedGroup {
  int64_t a_begin = 0, a_end = 0;
  int64_t b_begin = 0, b_end = 0;
  int64_t byte_begin = 0, byte_end = 0;
  bool one_to_one() const { return a_end - a_begin == 1 && b_end - b_begin == 1; }
  bool operator==(const AlignedGroup& o) const {
    return a_begin == o.a_begin && a_end == o.a_end && b_begin == o.b_begin && b_end == o.b_end &&
           byte_begin == o.byte_begin && byte_end == o.byte_end;
  }
};

// Tokens [begin, end) of the first tokenization.
struct TokenRun {
  int64_t begin = 0, end = 0;
  bool operator==(const TokenRun& o) const { return begin == o.begin && end == o.end; }
};

// Which tokens of the first tokenization each token of the second is made
// from, within their group (the paper's appendix K assigns source tokens
// across target tokens within minimal groups; the cache translation of issue
// 54 gives target token j the mean of its run's translated entries). In a
// group of m first-side and n second-side tokens, its k-th second-side token
// takes the run [floor(k m / n), max(floor(k m / n) + 1, floor((k + 1) m / n)))
// of the group's first-side tokens: one to one pairs them, m > n splits the m
// tokens into n consecutive runs, m < n gives each first-side token to about
// n / m consecutive second-side tokens. One run per second-side token, in
// order. InvalidArgument for a group with tokens on one side only (a text
// one tokenization spells with no bytes) or groups that do not tile both
// tokenizations from 0.
absl::StatusOr<std::vector<TokenRun>> AssignWithinGroups(const std::vector<AlignedGroup>& groups);

// a_bytes[i]: how many bytes token i of the first tokenization covers, in
// order (likewise b_bytes). InvalidArgument when a length is negative or the
// two cover different byte counts.
absl::StatusOr<std::vector<AlignedGroup>> AlignByBytes(const std::vector<int64_t>& a_bytes,
                                                       const std::vector<int64_t>& b_bytes);

// How many bytes of `text` each of `ids` covers, with `ids` an encoding of
// `text` by `tokenizer` (Tokenizer::Encode, no BOS added): the tokens' decoded
// bytes (the first token's as a decode begins). InvalidArgument when they do
// not spell `text` (a normalizer that changes the text, an id not in the
// vocabulary, or a text the tokenizer cannot spell: Gemma-3 reads a literal
// U+2581 as its word mark and decodes it to a space).
absl::StatusOr<std::vector<int64_t>> TokenByteLengths(const Tokenizer& tokenizer,
                                                      const std::vector<int32_t>& ids,
                                                      std::string_view text);

// Two tokenizations of `text` aligned: each side's byte lengths
// (TokenByteLengths), then AlignByBytes. Their errors: InvalidArgument when a
// side does not spell the text.
absl::StatusOr<std::vector<AlignedGroup>> AlignSpellings(const Tokenizer& a,
                                                         const std::vector<int32_t>& a_ids,
                                                         const Tokenizer& b,
                                                         const std::vector<int32_t>& b_ids,
                                                         std::string_view text);

}  // namespace kvl
