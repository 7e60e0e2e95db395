// AlignAcross (router/streams.h): a conversation rendered by the house
// tokenizer and the second house tokenizer (models/tokenizer-t2), segment by
// segment, aligned for a switch across them. The oracle is each token's byte
// span in the conversation's text, computed here: a one-to-one pair covers
// the same bytes, and every run stays inside its segment.
#include "router/streams.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace kvl::router {
namespace {

std::unique_ptr<Tokenizer> Load(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t =
      Tokenizer::FromFile(std::string(KVL_SOURCE_DIR) + "/" + dir + "/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

// One tokenizer's rendering of segments, with each token's [first, last) byte
// in the whole text.
struct Rendering {
  std::vector<int64_t> ids, bounds, byte_begin, byte_end;
  StreamView View(const Tokenizer& t) const { return {&t, &ids, &bounds}; }
};

Rendering Render(const Tokenizer& t, const std::vector<std::string>& segments) {
  Rendering r;
  int64_t at = 0;
  for (const std::string& text : segments) {
    r.bounds.push_back(static_cast<int64_t>(r.ids.size()));
    const std::vector<int32_t> ids = t.Encode(text);
    absl::StatusOr<std::vector<int64_t>> lengths = TokenByteLengths(t, ids, text);
    EXPECT_TRUE(lengths.ok()) << lengths.status();
    for (size_t i = 0; i < ids.size(); ++i) {
      r.ids.push_back(ids[i]);
      r.byte_begin.push_back(at);
      at += (*lengths)[i];
      r.byte_end.push_back(at);
    }
  }
  return r;
}

const std::vector<std::string> kSegments = {
    "<|im_start|>system\nAnswer briefly.<|im_end|>\n",
    "<|im_start|>user\nMy cat Muffin lives at 12345 Long Road, flat 678.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "Noted: Muffin, 12345 Long Road, flat 678.",
    "<|im_end|>\n",
    "<|im_start|>user\nWhere does Muffin live? Say it twice: 98765 4321.<|im_end|>\n"
    "<|im_start|>assistant\n",
};

TEST(AlignAcrossTest, PairsTheSameBytesSegmentBySegment) {
  const std::unique_ptr<Tokenizer> house = Load("models/tokenizer");
  const std::unique_ptr<Tokenizer> t2 = Load("models/tokenizer-t2");
  const Rendering s = Render(*house, kSegments), t = Render(*t2, kSegments);
  const int64_t n_s = static_cast<int64_t>(s.ids.size()), n_t = static_cast<int64_t>(t.ids.size());
  absl::StatusOr<AlignedSpan> all = AlignAcross(s.View(*house), t.View(*t2), 0, n_t, n_s);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->target_end, n_t);
  EXPECT_EQ(all->source_end, n_s);
  ASSERT_EQ(static_cast<int64_t>(all->runs.size()), n_t);
  EXPECT_LT(all->n_one_to_one, all->n_groups) << "the tokenizers split these numbers alike";
  EXPECT_GT(all->n_one_to_one, all->n_groups / 2);
  int64_t exact = 0;
  for (int64_t j = 0; j < n_t; ++j) {
    const TokenRun& r = all->runs[static_cast<size_t>(j)];
    ASSERT_LT(r.begin, r.end);
    // Inside the target token's segment.
    size_t k = 0;
    while (k + 1 < t.bounds.size() && t.bounds[k + 1] <= j) ++k;
    const int64_t seg_end = k + 1 < s.bounds.size() ? s.bounds[k + 1] : n_s;
    EXPECT_GE(r.begin, s.bounds[k]) << j;
    EXPECT_LE(r.end, seg_end) << j;
    // A single source token covering the same bytes as the target token.
    if (r.end - r.begin == 1 && s.byte_begin[r.begin] == t.byte_begin[j] &&
        s.byte_end[r.begin] == t.byte_end[j]) {
      ++exact;
    }
  }
  EXPECT_EQ(exact, all->n_one_to_one);

  // One tokenizer on both sides: token i takes token i.
  absl::StatusOr<AlignedSpan> same = AlignAcross(s.View(*house), s.View(*house), 0, n_s, n_s);
  ASSERT_TRUE(same.ok());
  ASSERT_EQ(static_cast<int64_t>(same->runs.size()), n_s);
  for (int64_t i = 0; i < n_s; ++i) EXPECT_EQ(same->runs[i], (TokenRun{i, i + 1}));

  // From the third segment on: runs are relative to the source's segment start.
  absl::StatusOr<AlignedSpan> later =
      AlignAcross(s.View(*house), t.View(*t2), t.bounds[2], n_t, n_s);
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->source_begin, s.bounds[2]);
  ASSERT_EQ(later->target_end - later->target_begin, n_t - t.bounds[2]);
  for (size_t j = 0; j < later->runs.size(); ++j) {
    const TokenRun& a = later->runs[j];
    const TokenRun& b = all->runs[static_cast<size_t>(t.bounds[2]) + j];
    EXPECT_EQ(a.begin + later->source_begin, b.begin);
    EXPECT_EQ(a.end + later->source_begin, b.end);
  }
}

TEST(AlignAcrossTest, StopsAtALimitOnEitherSideAndBeforeASegmentSpelledOtherwise) {
  const std::unique_ptr<Tokenizer> house = Load("models/tokenizer");
  const std::unique_ptr<Tokenizer> t2 = Load("models/tokenizer-t2");
  const Rendering s = Render(*house, kSegments), t = Render(*t2, kSegments);
  const int64_t n_s = static_cast<int64_t>(s.ids.size()), n_t = static_cast<int64_t>(t.ids.size());
  absl::StatusOr<AlignedSpan> all = AlignAcross(s.View(*house), t.View(*t2), 0, n_t, n_s);
  ASSERT_TRUE(all.ok());
  // Every end on either side stops at the last group boundary before it: a
  // position where both streams start a token at the same byte (minimal
  // groups close exactly there), found here from the byte spans.
  std::set<int64_t> s_starts(s.byte_begin.begin(), s.byte_begin.end());
  std::set<int64_t> t_starts(t.byte_begin.begin(), t.byte_begin.end());
  std::vector<int64_t> t_cuts = {n_t}, s_cuts = {n_s};
  for (int64_t j = 0; j < n_t; ++j) {
    if (s_starts.count(t.byte_begin[j])) t_cuts.push_back(j);
  }
  for (int64_t i = 0; i < n_s; ++i) {
    if (t_starts.count(s.byte_begin[i])) s_cuts.push_back(i);
  }
  auto last_at_or_before = [](const std::vector<int64_t>& cuts, int64_t x) {
    int64_t best = 0;
    for (int64_t c : cuts) {
      if (c <= x) best = std::max(best, c);
    }
    return best;
  };
  for (int64_t end = 0; end <= n_t; ++end) {
    absl::StatusOr<AlignedSpan> cut = AlignAcross(s.View(*house), t.View(*t2), 0, end, n_s);
    ASSERT_TRUE(cut.ok());
    EXPECT_EQ(cut->target_end, last_at_or_before(t_cuts, end)) << end;
    ASSERT_EQ(static_cast<int64_t>(cut->runs.size()), cut->target_end);
    for (size_t j = 0; j < cut->runs.size(); ++j) EXPECT_EQ(cut->runs[j], all->runs[j]);
  }
  for (int64_t limit = 0; limit <= n_s; ++limit) {
    absl::StatusOr<AlignedSpan> cut = AlignAcross(s.View(*house), t.View(*t2), 0, n_t, limit);
    ASSERT_TRUE(cut.ok());
    EXPECT_EQ(cut->source_end, last_at_or_before(s_cuts, limit)) << limit;
    for (const TokenRun& r : cut->runs) EXPECT_LE(r.end, cut->source_end);
  }
  // A source segment that spells another text (as a tokenizer that rewrote
  // it would): the span stops before it.
  Rendering odd = s;
  std::vector<std::string> other = kSegments;
  other[2] = "Noted: Muffin, 12345 Long Road, flat 679.";
  const Rendering rewritten = Render(*house, other);
  absl::StatusOr<AlignedSpan> stop =
      AlignAcross(rewritten.View(*house), t.View(*t2), 0, n_t, n_s);
  ASSERT_TRUE(stop.ok());
  EXPECT_EQ(stop->target_end, t.bounds[2]);
  EXPECT_EQ(stop->source_end, rewritten.bounds[2]);

  // A begin inside a segment starts at the next group boundary (the tokens
  // before it are the caller's to prefill), the runs as the whole span's.
  for (int64_t begin : {int64_t{1}, t.bounds[2] + 3, n_t - 2}) {
    absl::StatusOr<AlignedSpan> mid = AlignAcross(s.View(*house), t.View(*t2), begin, n_t, n_s);
    ASSERT_TRUE(mid.ok()) << mid.status();
    int64_t first = n_t;
    for (int64_t c : t_cuts) {
      if (c >= begin) first = std::min(first, c);
    }
    EXPECT_EQ(mid->target_begin, first) << begin;
    EXPECT_EQ(mid->target_end, n_t);
    for (size_t j = 0; j < mid->runs.size(); ++j) {
      const TokenRun& whole = all->runs[static_cast<size_t>(first) + j];
      EXPECT_EQ(mid->runs[j].begin + mid->source_begin, whole.begin) << begin << " " << j;
      EXPECT_EQ(mid->runs[j].end + mid->source_begin, whole.end) << begin << " " << j;
    }
  }
  EXPECT_EQ(AlignAcross(s.View(*house), t.View(*t2), n_t + 1, n_t + 1, n_s).status().code(),
            absl::StatusCode::kInvalidArgument);
  odd.bounds.pop_back();
  EXPECT_EQ(AlignAcross(odd.View(*house), t.View(*t2), 0, n_t, n_s).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl::router
