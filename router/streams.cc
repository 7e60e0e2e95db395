#include "router/streams.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvl::router {
namespace {

// Where segment k of a rendering ends.
int64_t SegmentEnd(const StreamView& s, size_t k) {
  return k + 1 < s.bounds->size() ? (*s.bounds)[k + 1] : static_cast<int64_t>(s.ids->size());
}

std::vector<int32_t> Slice32(const std::vector<int64_t>& ids, int64_t begin, int64_t end) {
  return std::vector<int32_t>(ids.begin() + begin, ids.begin() + end);
}

}  // namespace

absl::StatusOr<AlignedSpan> AlignAcross(const StreamView& source, const StreamView& target,
                                        int64_t begin, int64_t end, int64_t source_limit) {
  if (source.bounds->size() != target.bounds->size()) {
    return absl::InvalidArgumentError(absl::StrCat("the renderings have ", source.bounds->size(),
                                                   " and ", target.bounds->size(), " segments"));
  }
  const std::vector<int64_t>& t_bounds = *target.bounds;
  if (begin < 0 || begin > static_cast<int64_t>(target.ids->size()) ||
      (t_bounds.empty() && begin > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("target token ", begin, " is outside the ",
                                                   target.ids->size(), " of the stream"));
  }
  AlignedSpan out;
  out.target_begin = out.target_end = begin;
  if (t_bounds.empty()) return out;
  // The last segment starting at or before `begin` (the first of equal
  // starts: empty segments before a non-empty one).
  size_t k0 = static_cast<size_t>(
      std::upper_bound(t_bounds.begin(), t_bounds.end(), begin) - t_bounds.begin() - 1);
  while (k0 > 0 && t_bounds[k0 - 1] == t_bounds[k0]) --k0;
  const bool inside = t_bounds[k0] < begin;
  out.source_begin = out.source_end = (*source.bounds)[k0];
  bool started = !inside;  // past `begin`: groups are taken from here
  std::vector<AlignedGroup> taken;  // relative to source_begin and target_begin
  for (size_t k = k0; k < t_bounds.size() && (k == k0 || t_bounds[k] < end); ++k) {
    const int64_t tb = t_bounds[k], te = SegmentEnd(target, k);
    const int64_t sb = (*source.bounds)[k], se = SegmentEnd(source, k);
    const std::vector<int32_t> t32 = Slice32(*target.ids, tb, te);
    const std::vector<int32_t> s32 = Slice32(*source.ids, sb, se);
    const std::string text = target.tokenizer->Decode(t32);
    absl::StatusOr<std::vector<AlignedGroup>> groups =
        AlignSpellings(*source.tokenizer, s32, *target.tokenizer, t32, text);
    if (!groups.ok()) break;  // not spelled alike: prefilled
    bool whole = true;
    for (AlignedGroup g : *groups) {
      if (!started) {
        // Groups before `begin`, and the one it falls inside, are skipped.
        if (tb + g.b_begin < begin) continue;
        started = true;
        out.target_begin = out.target_end = tb + g.b_begin;
        out.source_begin = out.source_end = sb + g.a_begin;
      }
      if (tb + g.b_end > end || sb + g.a_end > source_limit) {
        whole = false;
        break;
      }
      g.a_begin += sb - out.source_begin;
      g.a_end += sb - out.source_begin;
      g.b_begin += tb - out.target_begin;
      g.b_end += tb - out.target_begin;
      out.source_end = out.source_begin + g.a_end;
      out.target_end = out.target_begin + g.b_end;
      ++out.n_groups;
      out.n_one_to_one += g.one_to_one() ? 1 : 0;
      taken.push_back(g);
    }
    if (!whole) break;
  }
  absl::StatusOr<std::vector<TokenRun>> runs = AssignWithinGroups(taken);
  if (!runs.ok()) return runs.status();
  out.runs = *std::move(runs);
  return out;
}

}  // namespace kvl::router
