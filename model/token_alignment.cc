#include "model/token_alignment.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvl {

absl::StatusOr<std::vector<AlignedGroup>> AlignByBytes(const std::vector<int64_t>& a_bytes,
                                                       const std::vector<int64_t>& b_bytes) {
  int64_t a_total = 0, b_total = 0;
  for (const auto* lengths : {&a_bytes, &b_bytes}) {
    int64_t& total = lengths == &a_bytes ? a_total : b_total;
    for (int64_t n : *lengths) {
      if (n < 0) return absl::InvalidArgumentError("a token covers a negative number of bytes");
      total += n;
    }
  }
  if (a_total != b_total) {
    return absl::InvalidArgumentError(absl::StrCat("the tokenizations cover ", a_total, " and ",
                                                   b_total, " bytes: not one text"));
  }
  std::vector<AlignedGroup> groups;
  const int64_t n_a = static_cast<int64_t>(a_bytes.size());
  const int64_t n_b = static_cast<int64_t>(b_bytes.size());
  int64_t i = 0, j = 0, a = 0, b = 0;  // tokens taken, bytes they cover
  AlignedGroup g;                      // the open group
  while (i < n_a || j < n_b) {
    // Where the sides meet, empty tokens are taken first (they join the group
    // that closes there); otherwise the side behind takes its next token (the
    // first side on a tie).
    if (a == b && i < n_a && a_bytes[i] == 0) {
      ++i;
    } else if (a == b && j < n_b && b_bytes[j] == 0) {
      ++j;
    } else if (i < n_a && (a <= b || j == n_b)) {
      a += a_bytes[i++];
    } else {
      b += b_bytes[j++];
    }
    // Both sides meet past the group's start, each with a token taken, and
    // neither has an empty token next (it joins this group first).
    if (a == b && a > g.byte_begin && i > g.a_begin && j > g.b_begin &&
        (i == n_a || a_bytes[i] > 0) && (j == n_b || b_bytes[j] > 0)) {
      g.a_end = i;
      g.b_end = j;
      g.byte_end = a;
      groups.push_back(g);
      g = AlignedGroup{i, i, j, j, a, a};
    }
  }
  if (groups.empty() && (n_a > 0 || n_b > 0)) {
    groups.push_back(AlignedGroup{0, n_a, 0, n_b, 0, 0});  // tokens of no bytes only
  }
  return groups;
}

absl::StatusOr<std::vector<TokenRun>> AssignWithinGroups(const std::vector<AlignedGroup>& groups) {
  std::vector<TokenRun> runs;
  int64_t a_next = 0, b_next = 0;
  for (const AlignedGroup& g : groups) {
    if (g.a_begin != a_next || g.b_begin != b_next || g.a_end < g.a_begin || g.b_end < g.b_begin) {
      return absl::InvalidArgumentError("the groups do not tile both tokenizations in order");
    }
    const int64_t m = g.a_end - g.a_begin, n = g.b_end - g.b_begin;
    if ((m == 0) != (n == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a group has tokens on one side only (first side ", m, ", second ", n, ")"));
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t lo = k * m / n;
      const int64_t hi = std::max(lo + 1, (k + 1) * m / n);
      runs.push_back(TokenRun{g.a_begin + lo, g.a_begin + hi});
    }
    a_next = g.a_end;
    b_next = g.b_end;
  }
  return runs;
}

absl::StatusOr<std::vector<int64_t>> TokenByteLengths(const Tokenizer& tokenizer,
                                                      const std::vector<int32_t>& ids,
                                                      std::string_view text) {
  std::vector<int64_t> lengths;
  lengths.reserve(ids.size());
  size_t at = 0;
  bool first = true;
  for (int32_t id : ids) {
    const std::string_view bytes =
        first ? tokenizer.LeadingTokenBytes(id) : tokenizer.TokenBytes(id);
    if (text.substr(at, bytes.size()) != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("token ", lengths.size(), " (id ", id,
                                                     ") decodes to bytes the text does not have at "
                                                     "byte ",
                                                     at));
    }
    at += bytes.size();
    if (!bytes.empty()) first = false;
    lengths.push_back(static_cast<int64_t>(bytes.size()));
  }
  if (at != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokens spell ", at, " of the text's ", text.size(), " bytes"));
  }
  return lengths;
}

absl::StatusOr<std::vector<AlignedGroup>> AlignSpellings(const Tokenizer& a,
                                                         const std::vector<int32_t>& a_ids,
                                                         const Tokenizer& b,
                                                         const std::vector<int32_t>& b_ids,
                                                         std::string_view text) {
  absl::StatusOr<std::vector<int64_t>> a_bytes = TokenByteLengths(a, a_ids, text);
  if (!a_bytes.ok()) return a_bytes.status();
  absl::StatusOr<std::vector<int64_t>> b_bytes = TokenByteLengths(b, b_ids, text);
  if (!b_bytes.ok()) return b_bytes.status();
  return AlignByBytes(*a_bytes, *b_bytes);
}

}  // namespace kvl
