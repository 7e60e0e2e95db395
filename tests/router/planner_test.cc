// router/planner.h: the switch planner, a pure function of the ledger, on
// hand-made ledgers.
#include "router/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace kvl::router {
namespace {

using ::testing::HasSubstr;

// ---- planner ---------------------------------------------------------------

std::vector<KvSpan> Native(int64_t n) { return n == 0 ? std::vector<KvSpan>{} : std::vector<KvSpan>{{0, n, true}}; }

PlannerInput Input(int target, Strategy strategy, const std::vector<LedgerSpan>& ledger,
                   std::vector<std::vector<KvSpan>> lines, int last, int64_t tail_begin) {
  PlannerInput in;
  in.target = target;
  in.strategy = strategy;
  in.ledger = &ledger;
  in.n_history = ledger.back().end;
  in.line_spans = std::move(lines);
  in.last_model = last;
  in.tail_begin = tail_begin;
  in.tail_end = ledger.back().end;
  in.has_translator = [](int s, int t) { return !(s == 2 && t == 0); };  // no C->A
  in.model_names = {"A", "B", "C"};
  return in;
}

TEST(PlannerTest, NativeContinuationIsNotAHandover) {
  const std::vector<LedgerSpan> ledger = {{0, 20, 0}};
  HandoverPlan p = PlanHandover(Input(0, Strategy::kTranslate, ledger, {Native(18), {}, {}}, 0, 18));
  EXPECT_EQ(p.path, CachePath::kNative);
  ASSERT_EQ(p.steps.size(), 1u);
  EXPECT_EQ(p.steps[0].kind, PlanStep::kNativePrefill);
  EXPECT_EQ(p.steps[0].begin, 18);
  EXPECT_EQ(p.tokens_reprefilled, 0);
}

TEST(PlannerTest, TranslatesEachMissingSpanFromItsWriterAndPrefillsTheRest) {
  // A wrote [0,10), B [10,20), C [20,30); C answered last and holds [0,28).
  const std::vector<LedgerSpan> ledger = {{0, 10, 0}, {10, 20, 1}, {20, 30, 2}};
  // A holds [0,9) natively; B holds [0,10) foreign + [10,19) native.
  std::vector<std::vector<KvSpan>> lines = {
      Native(9), {{0, 10, false}, {10, 19, true}}, {{0, 20, false}, {20, 28, true}}};
  HandoverPlan p = PlanHandover(Input(0, Strategy::kTranslate, ledger, lines, 2, 28));
  // A keeps [0,9), prefills its own [9,10), translates [10,19) from B,
  // prefills B's unrun [19,20), and C->A has no translator: prefills [20,30).
  ASSERT_EQ(p.steps.size(), 3u);
  EXPECT_EQ(p.keep, 9);
  EXPECT_EQ(p.steps[0].kind, PlanStep::kPrefill);
  EXPECT_EQ(p.steps[0].end, 10);
  EXPECT_EQ(p.steps[1].kind, PlanStep::kTranslate);
  EXPECT_EQ(p.steps[1].source, 1);
  EXPECT_EQ(p.steps[1].begin, 10);
  EXPECT_EQ(p.steps[1].end, 19);
  EXPECT_EQ(p.steps[2].kind, PlanStep::kPrefill);
  EXPECT_EQ(p.steps[2].begin, 19);
  EXPECT_EQ(p.steps[2].end, 30);
  EXPECT_EQ(p.tokens_translated, 9);
  EXPECT_EQ(p.spans_translated, 1);
  EXPECT_EQ(p.tokens_reprefilled, 12);
  EXPECT_EQ(p.path, CachePath::kTranslated);
  EXPECT_THAT(p.notes, ::testing::Contains(HasSubstr("no translator C->A")));
}

TEST(PlannerTest, AnEvictedWriterFallsBackToPrefillAndSaysSo) {
  const std::vector<LedgerSpan> ledger = {{0, 10, 0}, {10, 20, 1}};
  HandoverPlan p =
      PlanHandover(Input(2, Strategy::kTranslate, ledger, {{}, Native(19), {}}, 1, 19));
  ASSERT_GE(p.steps.size(), 2u);
  EXPECT_EQ(p.steps[0].kind, PlanStep::kPrefill);  // A's span: A's line is gone
  EXPECT_THAT(p.notes, ::testing::Contains(HasSubstr("no longer holds [0, 10)")));
  EXPECT_EQ(p.tokens_translated, 9);
}

TEST(PlannerTest, ANativeTailPrefillsTheLastTokensOfTheHistoryInsteadOfTranslatingThem) {
  // A wrote [0,10), B [10,30) and answered last (holds [0,29), [29,30) unrun);
  // C switches in with nothing.
  const std::vector<LedgerSpan> ledger = {{0, 10, 0}, {10, 30, 1}};
  const std::vector<std::vector<KvSpan>> lines = {Native(10), {{0, 10, false}, {10, 29, true}}, {}};
  for (int64_t tail : {0, 5, 19, 20, 25, 40}) {
    PlannerInput in = Input(2, Strategy::kTranslate, ledger, lines, 1, 29);
    in.native_tail_tokens = tail;
    HandoverPlan p = PlanHandover(in);
    // Translated: A's [0,10) and B's held [10,29), both cut at 30 - tail.
    const int64_t limit = std::max<int64_t>(0, 30 - tail);
    const int64_t from_a = std::min<int64_t>(10, limit);
    const int64_t from_b = std::max<int64_t>(0, std::min<int64_t>(29, limit) - 10);
    EXPECT_EQ(p.tokens_translated, from_a + from_b) << tail;
    EXPECT_EQ(p.tokens_reprefilled, 30 - from_a - from_b) << tail;
    EXPECT_EQ(p.spans_translated, (from_a > 0) + (from_b > 0)) << tail;
    EXPECT_EQ(p.path, from_a + from_b > 0 ? CachePath::kTranslated : CachePath::kReprefill);
    // Steps cover [0, 30) in order, every translated token before `limit`,
    // every token from `limit` on prefilled; no fallback notes.
    int64_t at = 0;
    for (const PlanStep& step : p.steps) {
      EXPECT_EQ(step.begin, at) << tail;
      if (step.kind == PlanStep::kTranslate) {
        EXPECT_LE(step.end, limit) << tail;
      }
      if (step.end > limit) {
        EXPECT_EQ(step.kind, PlanStep::kPrefill) << tail;
      }
      at = step.end;
    }
    EXPECT_EQ(at, 30) << tail;
    EXPECT_THAT(p.notes, ::testing::IsEmpty()) << tail;
  }
}

TEST(PlannerTest, StrategiesReprefillAndReprefillMissing) {
  const std::vector<LedgerSpan> ledger = {{0, 10, 0}, {10, 20, 1}};
  std::vector<std::vector<KvSpan>> lines = {Native(9), Native(19), {}};
  HandoverPlan full = PlanHandover(Input(0, Strategy::kReprefill, ledger, lines, 1, 19));
  EXPECT_TRUE(full.fresh_line);
  EXPECT_EQ(full.keep, 0);
  EXPECT_EQ(full.tokens_reprefilled, 20);
  EXPECT_EQ(full.path, CachePath::kReprefill);
  HandoverPlan missing = PlanHandover(Input(0, Strategy::kReprefillMissing, ledger, lines, 1, 19));
  EXPECT_FALSE(missing.fresh_line);
  EXPECT_EQ(missing.keep, 9);
  EXPECT_EQ(missing.tokens_reprefilled, 11);
  EXPECT_EQ(missing.tokens_translated, 0);
  // The TTFT label tells the two apart: a prefill on a kept start is a
  // native tail, one from token 0 a full re-prefill.
  EXPECT_EQ(missing.path, CachePath::kNativeTail);
  lines[0] = {};
  HandoverPlan from_nothing =
      PlanHandover(Input(0, Strategy::kReprefillMissing, ledger, lines, 1, 19));
  EXPECT_EQ(from_nothing.keep, 0);
  EXPECT_EQ(from_nothing.tokens_reprefilled, 20);
  EXPECT_EQ(from_nothing.path, CachePath::kReprefill);
}
}  // namespace
}  // namespace kvl::router
