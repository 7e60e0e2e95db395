// cache_store/: the span ledger, turn leases (commit and exact rollback), the
// byte budget with least-recently-used eviction, and exclusive use.
#include "cache_store/cache_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "model/engine.h"
#include "tests/model/test_models.h"

namespace kvl {
namespace {

class CacheStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Checkpoint c;
    c.config = testing::TinyConfig({"qwen3", true, false, false, 4, 2}, 2);
    c.weights = testing::RandomWeights(c.config, 5);
    RuntimeOptions o;
    o.n_threads = 1;
    engine_ = std::move(*Engine::Create(c, o)).release();
  }
  static void TearDownTestSuite() { delete engine_; }

  // A line holding n tokens (capacity: the cache's minimum growth, 64 tokens).
  static std::unique_ptr<KvCache> Line(int64_t n) {
    auto line = engine_->NewCache();
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(i % 50);
    EXPECT_TRUE(engine_->Prefill(*line, ids).ok());
    return line;
  }
  static int64_t LineBytes() { return Line(1)->Bytes(); }

  static Engine* engine_;
};
Engine* CacheStoreTest::engine_ = nullptr;

TEST(LedgerTest, AppendMergesSameWriterAndRefusesGaps) {
  std::vector<LedgerSpan> ledger;
  AppendLedgerSpan(&ledger, 0, 5, 0);
  AppendLedgerSpan(&ledger, 5, 9, 0);
  AppendLedgerSpan(&ledger, 9, 9, 1);  // empty: ignored
  AppendLedgerSpan(&ledger, 9, 12, 1);
  EXPECT_THAT(ledger, ::testing::ElementsAre(LedgerSpan{0, 9, 0}, LedgerSpan{9, 12, 1}));
  EXPECT_ANY_THROW(AppendLedgerSpan(&ledger, 13, 14, 0));
}

TEST_F(CacheStoreTest, CommitKeepsLinesAndAbandonRestoresThemExactly) {
  CacheStore store({2, int64_t{1} << 30, nullptr});
  ASSERT_TRUE(store.Create("s", "", {1, 2, 3}).ok());
  EXPECT_EQ(store.Create("s", "", {}).status().code(), absl::StatusCode::kAlreadyExists);
  {
    auto lease = store.Begin("s");
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ((*lease)->state().preamble, (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ((*lease)->line(0), nullptr);
    (*lease)->ReplaceLine(0, Line(10));
    ConversationState next;
    next.history.assign(11, 7);
    AppendLedgerSpan(&next.ledger, 0, 11, 0);
    next.turns = 1;
    next.last_model = 0;
    next.tail_begin = 10;
    (*lease)->Commit(next);
  }
  auto view = store.View("s");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->state.turns, 1);
  ASSERT_EQ(view->lines.size(), 1u);
  EXPECT_EQ(view->lines[0].tokens, 10);
  EXPECT_EQ(view->lines[0].bytes, LineBytes());
  EXPECT_EQ(store.Stats().total_bytes, LineBytes());

  // An abandoned turn: line 0 grows, line 1 is created; both are undone.
  {
    auto lease = store.Begin("s");
    ASSERT_TRUE(lease.ok());
    KvCache* line = (*lease)->line(0);
    ASSERT_TRUE(engine_->Prefill(*line, {4, 5, 6}).ok());
    (*lease)->ReplaceLine(1, Line(4));
  }
  view = store.View("s");
  ASSERT_EQ(view->lines.size(), 1u);
  EXPECT_EQ(view->lines[0].tokens, 10);
  EXPECT_EQ(view->state.history.size(), 11u);

  // An abandoned re-prefill: the replaced line comes back unchanged.
  {
    auto lease = store.Begin("s");
    KvCache* before = (*lease)->line(0);
    (*lease)->ReplaceLine(0, Line(2));
    EXPECT_NE((*lease)->line(0), before);
  }
  auto lease = store.Begin("s");
  EXPECT_EQ((*lease)->line(0)->Length(), 10);
}

TEST_F(CacheStoreTest, ASessionServesOneTurnAtATime) {
  CacheStore store({1, int64_t{1} << 30, nullptr});
  ASSERT_TRUE(store.Create("s", "", {}).ok());
  EXPECT_EQ(store.Begin("nope").status().code(), absl::StatusCode::kNotFound);
  auto first = store.Begin("s");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(store.Begin("s").status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(store.View("s")->in_turn);
  first->reset();
  EXPECT_TRUE(store.Begin("s").ok());
}

TEST_F(CacheStoreTest, BudgetEvictsLeastRecentlyUsedIdleLinesAndRefusesWhatCannotFit) {
  const int64_t line_bytes = LineBytes();
  CacheStore store({1, 2 * line_bytes, nullptr});
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(store.Create(id, "", {}).ok());
  auto serve = [&](const char* id) {
    auto lease = store.Begin(id);
    ASSERT_TRUE(lease.ok());
    const bool had_line = (*lease)->line(0) != nullptr;
    ASSERT_TRUE((*lease)->Reserve(had_line ? 0 : line_bytes).ok()) << id;
    if (!had_line) (*lease)->ReplaceLine(0, Line(8));
    ConversationState next = (*lease)->state();
    next.turns += 1;
    (*lease)->Commit(next);
  };
  serve("a");
  serve("b");
  EXPECT_EQ(store.Stats().total_bytes, 2 * line_bytes);
  serve("a");  // a is now more recent than b
  serve("c");  // evicts b, the least recently used
  EXPECT_FALSE(store.View("a")->lines[0].evicted);
  EXPECT_TRUE(store.View("b")->lines[0].evicted);
  EXPECT_EQ(store.View("b")->lines[0].bytes, 0);
  EXPECT_EQ(store.View("b")->state.turns, 1);  // the history stays
  CacheStoreStats stats = store.Stats();
  EXPECT_EQ(stats.total_bytes, 2 * line_bytes);
  EXPECT_EQ(stats.lines_evicted_total, 1);
  EXPECT_EQ(stats.sessions_with_evicted_lines, 1);

  // While a and c are in use nothing is evictable.
  auto la = store.Begin("a");
  auto lc = store.Begin("c");
  auto lb = store.Begin("b");
  ASSERT_TRUE(la.ok() && lb.ok() && lc.ok());
  EXPECT_EQ((*lb)->Reserve(line_bytes).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*lb)->evicted(0));
  la->reset();
  EXPECT_TRUE((*lb)->Reserve(line_bytes).ok());  // evicts a
  EXPECT_TRUE(store.View("a")->lines[0].evicted);
}

// A session read by two tokenizers (issue 54): the ledger maps into the
// other rendering at the same segment starts.
TEST(LedgerTest, TheLedgerMapsIntoARenderingAtTheSameSegments) {
  ConversationState state;
  state.history.assign(20, 7);
  state.bounds = {0, 6, 12, 12, 15};  // an empty segment at 12
  state.ledger = {{0, 12, 0}, {12, 20, 1}};
  state.renderings.push_back({std::vector<int64_t>(17, 3), {0, 5, 10, 10, 13}});
  EXPECT_EQ(LedgerInRendering(state, 0), state.ledger);
  EXPECT_THAT(LedgerInRendering(state, 1),
              ::testing::ElementsAre(LedgerSpan{0, 10, 0}, LedgerSpan{10, 17, 1}));
  EXPECT_EQ(&StreamIds(state, 1), &state.renderings[0].ids);
  EXPECT_EQ(&StreamBounds(state, 0), &state.bounds);
  // A boundary inside a segment (a record from before segments were kept)
  // maps to that segment's start.
  state.ledger = {{0, 8, 0}, {8, 20, 1}};
  EXPECT_THAT(LedgerInRendering(state, 1),
              ::testing::ElementsAre(LedgerSpan{0, 5, 0}, LedgerSpan{5, 17, 1}));
  // A session with no rendering for the group yet: an empty stream and ledger.
  EXPECT_TRUE(StreamIds(state, 2).empty());
  EXPECT_TRUE(LedgerInRendering(state, 2).empty());
}

TEST(LineProvenanceTest, TranslatedRunsAreSplitByTheirWriterAndLikeRunsMerge) {
  const std::vector<LedgerSpan> ledger = {{0, 10, 0}, {10, 20, 1}, {20, 30, 2}, {30, 40, 0}};
  // A line of model 2: native head, then a translation of what 1 and 0
  // wrote... around 2's own turn, then repaired and native tokens.
  const std::vector<KvSpan> spans = {{0, 4, true, false},   {4, 15, false, false},
                                     {15, 20, false, false}, {20, 30, true, false},
                                     {30, 35, true, true},   {35, 38, true, true},
                                     {38, 40, true, false}};
  EXPECT_THAT(LineProvenance(spans, ledger),
              ::testing::ElementsAre(LineSpanInfo{0, 4, SpanProvenance::kNative, -1},
                                     LineSpanInfo{4, 10, SpanProvenance::kTranslated, 0},
                                     LineSpanInfo{10, 20, SpanProvenance::kTranslated, 1},
                                     LineSpanInfo{20, 30, SpanProvenance::kNative, -1},
                                     LineSpanInfo{30, 38, SpanProvenance::kRepaired, -1},
                                     LineSpanInfo{38, 40, SpanProvenance::kNative, -1}));
  EXPECT_TRUE(LineProvenance({}, ledger).empty());
}

// Background repair's copy is held against the budget: it evicts idle lines
// as a turn would, stays reserved after its lease, and is refused when
// nothing can make room.
TEST_F(CacheStoreTest, ADetachedReservationHoldsBytesPastItsLease) {
  const int64_t line_bytes = LineBytes();
  CacheStore store({1, 2 * line_bytes, nullptr});
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(store.Create(id, "", {}).ok());
    auto lease = store.Begin(id);
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE((*lease)->Reserve(line_bytes).ok());
    (*lease)->ReplaceLine(0, Line(8));
    (*lease)->Commit((*lease)->state());
  }
  std::unique_ptr<ByteReservation> held;
  {
    auto lease = store.Begin("b", LeaseUse::kBackground);
    ASSERT_TRUE(lease.ok());
    auto r = (*lease)->ReserveDetached(line_bytes);  // evicts a, the idle one
    ASSERT_TRUE(r.ok()) << r.status();
    held = *std::move(r);
    EXPECT_EQ(held->bytes(), line_bytes);
    EXPECT_EQ((*lease)->ReserveDetached(line_bytes).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_TRUE(store.View("a")->lines[0].evicted);
  // Past the lease the bytes are still held: a's line comes back only by
  // evicting b's (b's line and the reservation fill the budget).
  {
    auto lease = store.Begin("a");
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE((*lease)->Reserve(line_bytes).ok());
    EXPECT_TRUE(store.View("b")->lines[0].evicted);
    // And with a in use and b gone, nothing is left to evict.
    EXPECT_EQ((*lease)->Reserve(line_bytes).code(), absl::StatusCode::kResourceExhausted);
  }
  held.reset();
  auto lease = store.Begin("a");
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE((*lease)->Reserve(2 * line_bytes).ok());
}

TEST_F(CacheStoreTest, ABackgroundLeaseDoesNotMarkTheSessionActive) {
  int64_t now = 100;
  CacheStore store({1, int64_t{1} << 30, [&now] { return now; }});
  ASSERT_TRUE(store.Create("s", "", {}).ok());
  now = 200;
  {
    auto lease = store.Begin("s", LeaseUse::kBackground);
    ASSERT_TRUE(lease.ok());
    (*lease)->Commit((*lease)->state());
  }
  EXPECT_EQ(store.View("s")->last_active_unix_seconds, 100);
  EXPECT_EQ(store.RemoveIdle(100), std::vector<std::string>{"s"});
}

TEST_F(CacheStoreTest, CreateRefusesASessionPastTheLimitUntilOneIsDeleted) {
  CacheStoreOptions o{1, int64_t{1} << 30, nullptr};
  o.max_sessions = 2;
  CacheStore store(o);
  ASSERT_TRUE(store.Create("a", "", {}).ok());
  ASSERT_TRUE(store.Create("", "", {}).ok());
  const absl::Status refused = store.Create("c", "", {}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("holds 2 sessions (limits.max_sessions = 2)"));
  EXPECT_EQ(store.View("c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Stats().sessions, 2);
  ASSERT_TRUE(store.Remove("a").ok());
  EXPECT_TRUE(store.Create("c", "", {}).ok());
}

TEST_F(CacheStoreTest, RemoveFreesTheSessionEvenDuringATurn) {
  CacheStore store({1, int64_t{1} << 30, nullptr});
  ASSERT_TRUE(store.Create("s", "", {}).ok());
  {
    auto lease = store.Begin("s");
    (*lease)->ReplaceLine(0, Line(3));
    ASSERT_TRUE(store.Remove("s").ok());
    EXPECT_EQ(store.View("s").status().code(), absl::StatusCode::kNotFound);
    (*lease)->Commit((*lease)->state());
  }
  EXPECT_EQ(store.Stats().total_bytes, 0);
  EXPECT_EQ(store.Stats().sessions, 0);
  EXPECT_EQ(store.Remove("s").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvl
