// router/: the switch planner on hand-made ledgers, and the orchestrator on
// three small random models with fitted translators, checked against engines
// driven by hand from the same state.
#include "router/router.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "model/chat_template.h"
#include "router/loader.h"
#include "router/planner.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/model/test_models.h"
#include "tests/router/model_fixture.h"
#include "tests/testing/temp_dir.h"

namespace kvl::router {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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

// ---- orchestrator ----------------------------------------------------------

class RouterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("router");
    ASSERT_TRUE(testing::WriteFixtureModels(dir_->path()).ok());
    ASSERT_TRUE(testing::WriteFixtureTranslators(
                    dir_->path(), {{"small", "large"}, {"large", "small"}, {"small", "small-b"},
                                   {"small-b", "large"}, {"large", "small-b"}})
                    .ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  void MakeRouter(RoutingConfig routing, int64_t budget = int64_t{1} << 30,
                  DType translate_dtype = DType::kFloat32, TurnObserver* observer = nullptr) {
    std::vector<LoadedModel> models;
    std::vector<std::string> identity;
    RuntimeOptions options;
    options.n_threads = 2;
    for (const auto& m : testing::FixtureModels()) {
      auto model = LoadModelDir(dir_->path() + "/" + m.name, options);
      ASSERT_TRUE(model.ok()) << model.status();
      identity.push_back(model->identity);
      // A second engine of the same weights drives the by-hand oracles.
      engines_.push_back(Engine::Create(model->checkpoint, options).value().release());
      models.push_back({m.name, model->path, std::move(model->engine)});
    }
    auto tokenizer = Tokenizer::FromFile(testing::TokenizerJsonPath());
    ASSERT_TRUE(tokenizer.ok());
    const std::string hash = (*tokenizer)->content_hash();
    std::vector<LoadedTranslator> translators;
    for (int s = 0; s < 3; ++s) {
      for (int t = 0; t < 3; ++t) {
        const std::string path =
            testing::TranslatorPath(dir_->path(), models[s].name, models[t].name);
        if (s == t || !std::filesystem::exists(path)) continue;
        auto tr = Translator::Load(path, {identity[s], identity[t], hash, hash}, translate_dtype);
        ASSERT_TRUE(tr.ok()) << tr.status();
        translators.push_back(
            {models[s].name + "->" + models[t].name, path, s, t, *std::move(tr), ""});
      }
    }
    store_ = std::make_unique<CacheStore>(CacheStoreOptions{3, budget, clock_});
    auto r = Router::Create(std::move(models), std::move(translators), *std::move(tokenizer),
                            std::move(routing), store_.get(), observer);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
  }
  void TearDown() override {
    router_.reset();
    for (Engine* e : engines_) delete e;
  }

  absl::StatusOr<TurnResult> Turn(const std::string& session, const std::string& text, int model,
                                  Strategy strategy = Strategy::kTranslate,
                                  std::optional<Policy> policy = Policy::kExplicit,
                                  std::function<bool()> cancelled = nullptr) {
    TurnOptions o;
    o.user_message = text;
    o.policy = policy;
    o.explicit_model = model;
    o.strategy = strategy;
    o.max_tokens = 6;
    o.cancelled = std::move(cancelled);
    return router_->RunTurn(session, o, {});
  }

  std::vector<int64_t> TurnTokens(const std::string& text) {
    std::vector<int64_t> ids;
    for (int32_t id : router_->tokenizer().Encode(RenderUserTurn(text))) ids.push_back(id);
    return ids;
  }

  // Greedy generation of `engine` on `line` from `prompt`, as the router runs it.
  std::vector<int64_t> Generate(Engine& engine, KvCache& line, const std::vector<int64_t>& prompt) {
    GenerateOptions g;
    g.max_tokens = 6;
    auto im_end = router_->tokenizer().AddedTokenId("<|im_end|>");
    g.stop_token_ids = {*im_end, *router_->tokenizer().AddedTokenId("<|endoftext|>")};
    auto r = engine.Generate(line, prompt, g);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<int64_t>{};
  }

  // A small -> large switch under the translate strategy (router made with
  // Explicit() and `native_tail` tokens of native tail), checked against the
  // same switch driven by hand with the router's own small -> large translator,
  // which computes in `compute`; the router must translate all but the last
  // native_tail tokens of the history.
  void ExpectTranslateSwitchEqualsHandDriven(DType compute, int64_t native_tail = 0) {
    ASSERT_TRUE(store_->Create("s", "", router_->RenderPreamble("Be brief.")).ok());
    auto t1 = Turn("s", "Hello there, how are you?", 0);
    ASSERT_TRUE(t1.ok()) << t1.status();
    EXPECT_EQ(t1->routing.path, CachePath::kNative);
    const ConversationState after1 = store_->View("s")->state;
    EXPECT_EQ(after1.ledger.size(), 1u);

    auto t2 = Turn("s", "Tell me about caches.", 2);
    ASSERT_TRUE(t2.ok()) << t2.status();
    EXPECT_TRUE(t2->routing.switched);
    EXPECT_EQ(t2->routing.path, CachePath::kTranslated);
    // small holds [0, tail_begin) natively; the rest of the history is its
    // unrun tail.
    const int64_t n_history = static_cast<int64_t>(after1.history.size());
    const int64_t n_held = std::min(after1.tail_begin, n_history - native_tail);
    ASSERT_GT(n_held, 0);
    EXPECT_EQ(t2->routing.spans_translated, 1);
    EXPECT_EQ(t2->routing.tokens_translated, n_held);
    EXPECT_GT(t2->routing.translation_seconds, 0);

    // By hand: small prefills what it held natively, the translator moves the
    // part before the native tail to large, large runs the rest of the history
    // plus the new turn and decodes.
    Engine& small = *engines_[0];
    Engine& large = *engines_[2];
    auto small_line = small.NewCache();
    const std::vector<int64_t> held(after1.history.begin(), after1.history.begin() + n_held);
    ASSERT_TRUE(small.Prefill(*small_line, held).ok());
    auto taps = small_line->Taps(0, n_held);
    ASSERT_TRUE(taps.ok());
    std::unique_ptr<KvCache> large_line = large.NewCache();
    {
      SerialIntraOpScope serial;  // the router translates on one intra-op thread
      const Translator* translator = router_->FindTranslator(0, 2);
      ASSERT_EQ(translator->compute_dtype(), compute);
      auto moved = translator->Translate(*taps);
      ASSERT_TRUE(moved.ok());
      ASSERT_TRUE(large_line->Accept(moved->keys, moved->values).ok());
    }
    std::vector<int64_t> prompt(after1.history.begin() + n_held, after1.history.end());
    for (int64_t id : TurnTokens("Tell me about caches.")) prompt.push_back(id);
    EXPECT_EQ(t2->tokens, Generate(large, *large_line, prompt));
    EXPECT_FALSE(t2->tokens.empty());

    // The router's line of large holds the hand-made translation, and not the
    // one of the other dtype (relative Frobenius distance per layer).
    const DType other = compute == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    const Translator& own = *router_->FindTranslator(0, 2);
    auto other_translator = Translator::Create(own.spec(), own.key_maps(), own.value_maps(), other);
    ASSERT_TRUE(other_translator.ok()) << other_translator.status();
    auto moved_other = (*other_translator)->Translate(*taps);
    ASSERT_TRUE(moved_other.ok());
    auto other_line = large.NewCache();
    ASSERT_TRUE(other_line->Accept(moved_other->keys, moved_other->values).ok());
    auto lease = store_->Begin("s");
    ASSERT_TRUE(lease.ok()) << lease.status();
    KvCache* routed = (*lease)->line(2);
    ASSERT_NE(routed, nullptr);
    for (int64_t il = 0; il < routed->n_layer(); ++il) {
      const at::Tensor keys = routed->Keys(il).narrow(1, 0, n_held);
      const at::Tensor values = routed->Values(il).narrow(1, 0, n_held);
      auto rel = [](const at::Tensor& a, const at::Tensor& b) {
        return ((a - b).norm() / b.norm()).item<double>();
      };
      const double same_k = rel(keys, large_line->Keys(il).narrow(1, 0, n_held));
      const double same_v = rel(values, large_line->Values(il).narrow(1, 0, n_held));
      const double other_v = rel(values, other_line->Values(il));
      // Same dtype: the router's small line decoded its reply token by token,
      // the hand-made one prefilled it, so the taps differ by float32 rounding
      // (1e-6), which may flip a bfloat16 rounding here and there (measured
      // <= 3e-4). The other dtype is bfloat16 rounding everywhere (measured
      // 3.6e-3 to 3.9e-3).
      EXPECT_LT(same_k, 1e-3) << il;
      EXPECT_LT(same_v, 1e-3) << il;
      EXPECT_GT(other_v, 1.5e-3) << il;
    }
  }

  static testing::TempDir* dir_;
  std::unique_ptr<CacheStore> store_;
  std::function<int64_t()> clock_;  // the store's clock; null: the system clock
  std::unique_ptr<Router> router_;
  std::vector<Engine*> engines_;  // independent copies for the hand-driven oracles
};
testing::TempDir* RouterTest::dir_ = nullptr;

RoutingConfig Explicit() {
  RoutingConfig r;
  r.policy = Policy::kExplicit;
  r.order = {0, 2};
  return r;
}

TEST_F(RouterTest, TranslateSwitchEqualsAnEngineDrivenByHandFromTheTranslatedState) {
  MakeRouter(Explicit());
  ExpectTranslateSwitchEqualsHandDriven(DType::kFloat32);
}

TEST_F(RouterTest, ABfloat16TranslatorTranslatesTheSwitchInBfloat16) {
  MakeRouter(Explicit(), int64_t{1} << 30, DType::kBFloat16);
  ExpectTranslateSwitchEqualsHandDriven(DType::kBFloat16);
}

TEST_F(RouterTest, ANativeTailIsPrefilledByTheTargetAfterTheTranslatedHead) {
  RoutingConfig routing = Explicit();
  routing.native_tail_tokens = 6;
  MakeRouter(routing);
  ExpectTranslateSwitchEqualsHandDriven(DType::kFloat32, 6);
}

struct PrefillCalls : TurnObserver {
  void OnPrefillTokens(int model, int64_t n) override { calls.emplace_back(model, n); }
  std::vector<std::pair<int, int64_t>> calls;
};

TEST_F(RouterTest, ASwitchSizesTheTargetsLineOnceAndRunsItsNativeTailWithTheTurn) {
  // A line grows by copying what it holds, and each prefill call reads all of
  // it: a translated switch must neither grow the fresh line again at the next
  // prefill nor run the native tail and the turn in two passes.
  RoutingConfig routing = Explicit();
  routing.native_tail_tokens = 4;
  PrefillCalls prefills;
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &prefills);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  std::string long_turn;
  for (int i = 0; i < 80; ++i) long_turn += absl::StrFormat("word%d ", i);
  ASSERT_TRUE(Turn("s", long_turn, 0).ok());
  const int64_t n_history = static_cast<int64_t>(store_->View("s")->state.history.size());
  ASSERT_GT(n_history, 2 * 64);  // past the line's minimum capacity

  prefills.calls.clear();
  const std::string ask = "Tell me about caches.";
  const int64_t n_ask = static_cast<int64_t>(TurnTokens(ask).size());
  auto t2 = Turn("s", ask, 2);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->routing.path, CachePath::kTranslated);
  EXPECT_EQ(t2->routing.tokens_reprefilled, 4);
  EXPECT_EQ(t2->routing.tokens_translated, n_history - 4);
  // One prefill: the native tail with the turn's tokens.
  EXPECT_THAT(prefills.calls, ::testing::ElementsAre(std::make_pair(2, 4 + n_ask)));
  EXPECT_EQ(t2->prefill_tokens, 4 + n_ask);

  {
    auto lease = store_->Begin("s");
    ASSERT_TRUE(lease.ok()) << lease.status();
    const KvCache* line = (*lease)->line(2);
    ASSERT_NE(line, nullptr);
    // The history, the turn's tokens and its max_tokens (6, under the
    // router's 256 tokens of decoding room), allocated once.
    EXPECT_EQ(line->Capacity(), n_history + n_ask + 6);
    EXPECT_LE(line->Length(), line->Capacity());
  }

  // The next turn on the same model: its own unrun tail (last sampled token,
  // closing template) goes with the prompt too.
  const ConversationState after2 = store_->View("s")->state;
  const int64_t unrun = static_cast<int64_t>(after2.history.size()) - after2.tail_begin;
  ASSERT_GT(unrun, 0);
  prefills.calls.clear();
  auto t3 = Turn("s", "And then?", 2);
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_EQ(t3->routing.path, CachePath::kNative);
  EXPECT_THAT(prefills.calls,
              ::testing::ElementsAre(std::make_pair(
                  2, unrun + static_cast<int64_t>(TurnTokens("And then?").size()))));
}

TEST_F(RouterTest, AnUntranslatableSpanRunsWithTheTurnWhileAReprefillStaysInTheSwitch) {
  PrefillCalls prefills;
  MakeRouter(Explicit(), int64_t{1} << 30, DType::kFloat32, &prefills);
  const std::string ask = "Over to you.";
  const int64_t n_ask = static_cast<int64_t>(TurnTokens(ask).size());

  // No small-b -> small translator: under strategy translate, small prefills
  // the history itself, in the same pass as the turn, and the switch took no
  // time of its own.
  ASSERT_TRUE(store_->Create("a", "", {}).ok());
  ASSERT_TRUE(Turn("a", "Hello from the other small model.", 1).ok());
  const int64_t n_a = static_cast<int64_t>(store_->View("a")->state.history.size());
  prefills.calls.clear();
  auto ta = Turn("a", ask, 0);
  ASSERT_TRUE(ta.ok()) << ta.status();
  EXPECT_EQ(ta->routing.path, CachePath::kReprefill);
  EXPECT_EQ(ta->routing.tokens_reprefilled, n_a);
  EXPECT_THAT(ta->routing.reason, ::testing::HasSubstr("no translator"));
  EXPECT_THAT(prefills.calls, ::testing::ElementsAre(std::make_pair(0, n_a + n_ask)));
  EXPECT_EQ(ta->switch_seconds, 0);
  EXPECT_GT(ta->prefill_seconds, 0);

  // Strategy reprefill: the history is prefilled by the hand-over, reported
  // as switch time, and the turn runs after it.
  ASSERT_TRUE(store_->Create("b", "", {}).ok());
  ASSERT_TRUE(Turn("b", "Hello from the other small model.", 1).ok());
  const int64_t n_b = static_cast<int64_t>(store_->View("b")->state.history.size());
  prefills.calls.clear();
  auto tb = Turn("b", ask, 0, Strategy::kReprefill);
  ASSERT_TRUE(tb.ok()) << tb.status();
  EXPECT_EQ(tb->routing.path, CachePath::kReprefill);
  EXPECT_THAT(prefills.calls,
              ::testing::ElementsAre(std::make_pair(0, n_b), std::make_pair(0, n_ask)));
  EXPECT_GT(tb->switch_seconds, 0);
  // Same history, same tokens either way.
  EXPECT_EQ(ta->tokens, tb->tokens);
}

TEST_F(RouterTest, ReprefillOutputEqualsTheTargetsNativeOutput) {
  MakeRouter(Explicit());
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  ASSERT_TRUE(Turn("s", "First question?", 0).ok());
  ASSERT_TRUE(Turn("s", "A second one.", 2).ok());  // large now holds a line
  const ConversationState before = store_->View("s")->state;
  ASSERT_TRUE(Turn("s", "Back to small.", 0).ok());
  const ConversationState mid = store_->View("s")->state;
  auto t = Turn("s", "And large again, from scratch.", 2, Strategy::kReprefill);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->routing.path, CachePath::kReprefill);
  EXPECT_EQ(t->routing.tokens_reprefilled, static_cast<int64_t>(mid.history.size()));
  EXPECT_EQ(t->routing.tokens_translated, 0);

  Engine& large = *engines_[2];
  auto line = large.NewCache();
  std::vector<int64_t> prompt = mid.history;
  for (int64_t id : TurnTokens("And large again, from scratch.")) prompt.push_back(id);
  EXPECT_EQ(t->tokens, Generate(large, *line, prompt));
  (void)before;
}

// Continuous batching changes nothing a session sees: sessions conversing at
// once on a batched router, with translated and re-prefilled switches, get
// the tokens each gets alone on an unbatched one (greedy decoding).
TEST_F(RouterTest, BatchedConcurrentSessionsEqualTheUnbatchedRouterTurnForTurn) {
  struct Step {
    const char* text;
    int model;
    Strategy strategy;
  };
  const std::vector<Step> steps = {{"First question?", 0, Strategy::kTranslate},
                                   {"A second one.", 2, Strategy::kTranslate},
                                   {"Back to small.", 0, Strategy::kReprefill},
                                   {"Large again, please.", 2, Strategy::kTranslate},
                                   {"And once more on large.", 2, Strategy::kTranslate}};
  constexpr int kSessions = 4;
  auto converse = [&](int i) {
    std::vector<std::vector<int64_t>> replies;
    const std::string id = absl::StrCat("s", i);
    EXPECT_TRUE(store_->Create(id, "", {}).ok());
    for (const Step& step : steps) {
      auto t = Turn(id, absl::StrCat(step.text, " (session ", i, ")"), step.model, step.strategy);
      EXPECT_TRUE(t.ok()) << t.status();
      replies.push_back(t.ok() ? t->tokens : std::vector<int64_t>{});
    }
    return replies;
  };
  MakeRouter(Explicit());
  std::vector<std::vector<std::vector<int64_t>>> expected;
  for (int i = 0; i < kSessions; ++i) expected.push_back(converse(i));

  router_.reset();
  RoutingConfig batched = Explicit();
  batched.batching = true;
  batched.batch_max_step_tokens = 16;  // prompts cut into chunks beside decoding turns
  MakeRouter(batched);
  std::vector<std::vector<std::vector<int64_t>>> got(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) threads.emplace_back([&, i] { got[i] = converse(i); });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(got[i], expected[i]) << "session " << i;
}

// A given reply leaves the history and ledger exactly as generating the same
// text would, across a translated switch, and the answering model's line
// holds every reply token (the stop token and closing newline are run with
// the next turn, as after a generated stop).
TEST_F(RouterTest, AGivenReplyLeavesTheSessionAsGeneratingItWould) {
  MakeRouter(Explicit());
  ASSERT_TRUE(store_->Create("gen", "", {}).ok());
  ASSERT_TRUE(store_->Create("given", "", {}).ok());
  ASSERT_TRUE(Turn("gen", "First question?", 0).ok());
  ASSERT_TRUE(Turn("given", "First question?", 0).ok());
  // The second turn switches to large: generated in one session, given in the other.
  auto generated = Turn("gen", "What comes next?", 2);
  ASSERT_TRUE(generated.ok()) << generated.status();
  TurnOptions o;
  o.user_message = "What comes next?";
  o.policy = Policy::kExplicit;
  o.explicit_model = 2;
  o.reply = generated->text;
  auto given = router_->RunTurn("given", o, {});
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->tokens, generated->tokens);
  EXPECT_EQ(given->routing.path, generated->routing.path);
  const SessionView a = *store_->View("gen"), b = *store_->View("given");
  EXPECT_EQ(a.state.history, b.state.history);
  EXPECT_EQ(a.state.ledger, b.state.ledger);
  // history: ... reply <|im_end|> "\n"; the line stops after the reply.
  EXPECT_EQ(b.state.tail_begin, static_cast<int64_t>(b.state.history.size()) - 2);
  EXPECT_EQ(given->finish_reason, FinishReason::kStopToken);

  EXPECT_EQ(given->reply_logprobs.size(), given->tokens.size() + 1);
  for (double x : given->reply_logprobs) EXPECT_LE(x, 0.0);
  // The reply is what greedy decoding wrote on the same line: every token was
  // the model's first choice (the stop token only when it stopped there).
  ASSERT_EQ(given->reply_greedy.size(), given->reply_logprobs.size());
  for (size_t i = 0; i < given->tokens.size(); ++i) EXPECT_TRUE(given->reply_greedy[i]) << i;
  if (generated->finish_reason == FinishReason::kStopToken) {
    EXPECT_TRUE(given->reply_greedy.back());
  }
}

TEST_F(RouterTest, AGivenReplyOnTheSameModelScoresAsAFreshPrefill) {
  MakeRouter(Explicit());
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  ASSERT_TRUE(Turn("s", "First question?", 2).ok());
  const int64_t h0 = static_cast<int64_t>(store_->View("s")->state.history.size());
  TurnOptions o;
  o.user_message = "And the second?";
  o.policy = Policy::kExplicit;
  o.explicit_model = 2;
  o.reply = "Paris, I think.";
  auto t = router_->RunTurn("s", o, {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(t->text, "Paris, I think.");
  const std::vector<int64_t> history = store_->View("s")->state.history;
  const int64_t start = h0 + static_cast<int64_t>(TurnTokens("And the second?").size());
  const int64_t n = static_cast<int64_t>(t->tokens.size()) + 1;  // the reply and its stop token
  ASSERT_EQ(t->reply_logprobs.size(), static_cast<size_t>(n));
  EXPECT_EQ(std::vector<int64_t>(history.begin() + start, history.begin() + start + n - 1),
            t->tokens);
  // Every token the turn wrote is large's own: a fresh native prefill of the
  // history gives the same scores (float32 decoder, chunked differently).
  auto line = engines_[2]->NewCache();
  auto logits = engines_[2]->Prefill(
      *line, std::vector<int64_t>(history.begin(), history.begin() + start + n), true);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const at::Tensor lp = at::log_softmax(*logits, -1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = start + i;
    EXPECT_NEAR(t->reply_logprobs[i], lp[pos - 1][history[pos]].item<double>(), 1e-4) << i;
  }
}

TEST_F(RouterTest, ThreeModelsRoundTripTranslatesOnlyTheMissingSpans) {
  MakeRouter(Explicit());
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  const int order[] = {0, 1, 2, 0};  // A -> B -> C -> A
  std::vector<TurnResult> results;
  for (int i = 0; i < 4; ++i) {
    auto t = Turn("s", "Turn number " + std::to_string(i) + ", please answer.", order[i]);
    ASSERT_TRUE(t.ok()) << i << ": " << t.status();
    results.push_back(*t);
  }
  EXPECT_FALSE(results[0].routing.switched);
  for (int i = 1; i < 4; ++i) {
    EXPECT_TRUE(results[i].routing.switched) << i;
    EXPECT_EQ(results[i].routing.path, CachePath::kTranslated) << i;
  }
  // Back at A: it lacks B's and C's turns. C's is translated from C (which
  // wrote it natively; C's copies of A's and B's spans are translations and
  // are never translated again); small-b -> small has no translator in the
  // fixture, so B's span is prefilled, and the reason says so.
  EXPECT_EQ(results[3].routing.spans_translated, 1);
  auto view = store_->View("s");
  ASSERT_TRUE(view.ok());
  std::vector<int> writers;
  for (const LedgerSpan& s : view->state.ledger) writers.push_back(s.model);
  EXPECT_THAT(writers, ::testing::ElementsAre(0, 1, 2, 0));
  EXPECT_EQ(view->state.turns, 4);
  for (const CacheLineInfo& line : view->lines) {
    EXPECT_LE(line.tokens, static_cast<int64_t>(view->state.history.size()));
  }
  EXPECT_THAT(results[3].routing.reason, HasSubstr("no translator small-b->small"));
}

TEST_F(RouterTest, CancellationLeavesTheSessionExactlyAsItWas) {
  MakeRouter(Explicit());
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  ASSERT_TRUE(Turn("s", "Hello.", 0).ok());
  const SessionView before = *store_->View("s");
  int polls = 0;
  auto t = Turn("s", "Now switch and stop.", 2, Strategy::kTranslate, Policy::kExplicit,
                [&] { return ++polls > 3; });
  EXPECT_EQ(t.status().code(), absl::StatusCode::kCancelled);
  const SessionView after = *store_->View("s");
  EXPECT_EQ(after.state.history, before.state.history);
  EXPECT_EQ(after.state.ledger, before.state.ledger);
  EXPECT_EQ(after.state.turns, before.state.turns);
  ASSERT_EQ(after.lines.size(), before.lines.size());
  for (size_t i = 0; i < after.lines.size(); ++i) {
    EXPECT_EQ(after.lines[i].model, before.lines[i].model);
    EXPECT_EQ(after.lines[i].tokens, before.lines[i].tokens);
  }
  // And the session still works, as if the cancelled turn never happened.
  auto again = Turn("s", "Now switch and stop.", 2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->routing.path, CachePath::kTranslated);
}

TEST_F(RouterTest, ATurnThatDoesNotFitThePolicyIsRefusedAndChangesNothing) {
  RoutingConfig r;  // fixed on model 0, no order, no rules
  MakeRouter(r);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  struct Case {
    std::optional<Policy> policy;
    int model;
    const char* field;
  };
  for (const Case& c : {Case{Policy::kExplicit, -1, "routing.model: required"},
                        Case{Policy::kExplicit, 3, "routing.model: index 3"},
                        Case{Policy::kCascade, -1, "routing.policy: 'cascade' needs"},
                        Case{Policy::kAlternate, -1, "routing.policy: 'alternate' needs"},
                        Case{Policy::kRules, -1, "routing.policy: 'rules' needs"}}) {
    TurnOptions o;
    o.user_message = "Hi.";
    o.policy = c.policy;
    o.explicit_model = c.model;
    const absl::Status v = router_->ValidateTurn(o);
    EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(v.message(), HasSubstr(c.field));
    auto t = Turn("s", "Hi.", c.model, Strategy::kTranslate, c.policy);
    EXPECT_EQ(t.status(), v);
  }
  EXPECT_EQ(store_->View("s")->state.turns, 0);
  EXPECT_TRUE(store_->View("s")->state.history.empty());
  TurnOptions fixed;
  fixed.user_message = "Hi.";
  EXPECT_TRUE(router_->ValidateTurn(fixed).ok());
}

TEST_F(RouterTest, CascadeEscalatesAboveTheEntropyThresholdAndStaysEscalated) {
  RoutingConfig r;
  r.policy = Policy::kCascade;
  r.order = {0, 2};
  r.cascade_max_entropy = 0.0;  // every distribution has positive entropy: escalate
  MakeRouter(r);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  auto t1 = Turn("s", "Something hard.", -1, Strategy::kTranslate, std::nullopt);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(t1->routing.model, 2);
  EXPECT_THAT(t1->routing.reason, HasSubstr("escalated to large"));
  // The turn's tokens that small scored were translated to large.
  EXPECT_EQ(t1->routing.path, CachePath::kTranslated);
  auto view = store_->View("s");
  EXPECT_EQ(view->state.cascade_level, 1);
  EXPECT_EQ(view->state.ledger.front().model, 0);
  auto t2 = Turn("s", "Follow-up.", -1, Strategy::kTranslate, std::nullopt);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->routing.model, 2);
  EXPECT_EQ(t2->routing.path, CachePath::kNative);
  EXPECT_THAT(t2->routing.reason, HasSubstr("stays there"));
}

TEST_F(RouterTest, CascadeEscalatesBelowTheMeanLogProbabilityThreshold) {
  RoutingConfig r;
  r.policy = Policy::kCascade;
  r.order = {0, 2};
  r.cascade_max_entropy = std::numeric_limits<double>::infinity();
  r.cascade_min_mean_logprob = 0.0;  // every turn is "unsure"
  MakeRouter(r);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  auto t1 = Turn("s", "Something hard.", -1, Strategy::kTranslate, std::nullopt);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(t1->routing.model, 2);
  EXPECT_THAT(t1->routing.reason, HasSubstr("escalated to large"));
}

TEST_F(RouterTest, CascadeKeepsTheCheapModelWhenConfidentAndReportsItsEntropy) {
  RoutingConfig r;
  r.policy = Policy::kCascade;
  r.order = {0, 2};
  r.cascade_max_entropy = std::numeric_limits<double>::infinity();
  MakeRouter(r);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  auto t1 = Turn("s", "Easy.", -1, Strategy::kTranslate, std::nullopt);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(t1->routing.model, 0);
  EXPECT_THAT(t1->routing.reason, HasSubstr("confident"));
  // The entropy reported is that of small's next-token distribution after the
  // whole turn, computed here from its logits.
  auto probe = engines_[0]->NewCache();
  absl::StatusOr<at::Tensor> logits = engines_[0]->Prefill(*probe, TurnTokens("Easy."));
  ASSERT_TRUE(logits.ok()) << logits.status();
  const at::Tensor lp = at::log_softmax(logits->to(at::kFloat).reshape({-1}), -1);
  const double entropy = -(lp.exp() * lp).sum().item<double>();
  EXPECT_THAT(t1->routing.reason,
              HasSubstr(absl::StrFormat("next-token entropy %.3f nats", entropy)));
  // Reading the entropy leaves no trace: the answer equals small answering
  // the turn natively.
  auto line = engines_[0]->NewCache();
  EXPECT_EQ(t1->tokens, Generate(*engines_[0], *line, TurnTokens("Easy.")));
}

// Engine-loop steps per model, by a batched router's schedulers.
struct StepCount : TurnObserver {
  void OnBatchStep(int model, int64_t rows, int64_t decode_rows, int64_t tokens,
                   double seconds) override {
    std::lock_guard<std::mutex> lock(mu);
    steps[model] += 1;
    step_tokens[model] += tokens;
    max_rows[model] = std::max(max_rows[model], rows);
  }
  std::mutex mu;
  std::map<int, int64_t> steps, step_tokens, max_rows;
};

// With batching, the cascade's scoring runs in the engine loops (no model
// lock): small only scores here (every turn escalates), so every step small's
// loop runs is scoring, and concurrent sessions' scorings share steps. The
// outcome is the unbatched router's, session by session: the same model, the
// same verdict and the same tokens.
TEST_F(RouterTest, BatchedCascadeScoresInTheEngineLoopAndEqualsTheUnbatchedRouter) {
  RoutingConfig r;
  r.policy = Policy::kCascade;
  r.order = {0, 2};
  r.cascade_max_entropy = 0.0;  // every level below the last escalates
  r.repair = RepairMode::kOff;  // a repair's timing would change later turns' lines
  constexpr int kSessions = 4;
  const std::vector<std::string> texts = {"Something hard.", "A follow-up, longer than the first.",
                                          "Third."};
  auto converse = [&](const std::string& prefix, int i) {
    std::vector<TurnResult> turns;
    const std::string id = absl::StrCat(prefix, i);
    EXPECT_TRUE(store_->Create(id, "", {}).ok());
    for (const std::string& text : texts) {
      auto t = Turn(id, absl::StrCat(text, " (session ", i, ")"), -1, Strategy::kTranslate,
                    std::nullopt);
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) turns.push_back(*std::move(t));
    }
    return turns;
  };
  MakeRouter(r);
  std::vector<std::vector<TurnResult>> expected;
  for (int i = 0; i < kSessions; ++i) expected.push_back(converse("unbatched", i));

  router_.reset();
  StepCount steps;
  r.batching = true;
  MakeRouter(r, int64_t{1} << 30, DType::kFloat32, &steps);
  std::vector<std::vector<TurnResult>> got(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] { got[i] = converse("batched", i); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) {
    SCOPED_TRACE(absl::StrCat("session ", i));
    ASSERT_EQ(got[i].size(), expected[i].size());
    for (size_t t = 0; t < got[i].size(); ++t) {
      EXPECT_EQ(got[i][t].routing.model, expected[i][t].routing.model);
      EXPECT_EQ(got[i][t].routing.path, expected[i][t].routing.path);
      EXPECT_EQ(got[i][t].tokens, expected[i][t].tokens);
      EXPECT_EQ(got[i][t].prefill_tokens, expected[i][t].prefill_tokens);
    }
    // The first turn escalated from small (which scored it); later turns stay.
    EXPECT_EQ(got[i][0].routing.model, 2);
    EXPECT_THAT(got[i][0].routing.reason, HasSubstr("escalated to large"));
  }
  std::lock_guard<std::mutex> lock(steps.mu);
  // Small scored each session's first turn: all but the last token, then
  // that token alone, in its loop.
  int64_t scored = 0;
  for (int i = 0; i < kSessions; ++i) {
    scored += static_cast<int64_t>(
        TurnTokens(absl::StrCat(texts[0], " (session ", i, ")")).size());
  }
  EXPECT_EQ(steps.step_tokens[0], scored);
  EXPECT_GT(steps.steps[0], 0);
  EXPECT_GT(steps.steps[2], 0);
}

TEST_F(RouterTest, EvictedLinesAreRebuiltByPrefillAndAnOverBudgetTurnChangesNothing) {
  // A line takes at least 64 tokens of capacity: room for one idle line of
  // small plus one turn's reservation.
  const int64_t bpt = 4 * 2 * 32 * 2 * 4 + 4 * 2 * 4;  // K+V float32 + 1/rms per (layer, head)
  MakeRouter(Explicit(), 100 * bpt);
  ASSERT_TRUE(store_->Create("x", "", {}).ok());
  ASSERT_TRUE(store_->Create("y", "", {}).ok());
  ASSERT_TRUE(Turn("x", "Hi from x.", 0).ok());
  ASSERT_TRUE(Turn("y", "Hi from y.", 0).ok());
  EXPECT_TRUE(store_->View("x")->lines[0].evicted);
  EXPECT_GE(store_->Stats().lines_evicted_total, 1);
  const ConversationState x1 = store_->View("x")->state;
  auto x2 = Turn("x", "Still there?", 0);
  ASSERT_TRUE(x2.ok()) << x2.status();
  EXPECT_EQ(x2->routing.path, CachePath::kReprefill);
  auto line = engines_[0]->NewCache();
  std::vector<int64_t> prompt = x1.history;
  for (int64_t id : TurnTokens("Still there?")) prompt.push_back(id);
  EXPECT_EQ(x2->tokens, Generate(*engines_[0], *line, prompt));

  // large needs more than the whole budget: refused, nothing changes.
  const SessionView before = *store_->View("x");
  auto big = Turn("x", "Switch to large.", 2);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->View("x")->state.history, before.state.history);
  EXPECT_EQ(store_->View("x")->lines.size(), before.lines.size());
}


// Background repair (router/repair.cc).
namespace repair_test {

// A long first turn (more than one repair chunk), then fixed replies, so that
// every session below holds the same history whatever its cache.
const char* kLongTurn =
    "Here is what I know about the trip. My sister lives in Lisbon, near the river, "
    "and the flight leaves at nine. The hotel is the one with the green door on the "
    "corner of the square. We booked twelve nights, and the code for the locker is "
    "four seven one nine. Remember that the museum closes early on Mondays, that the "
    "tram to the castle starts at seven, and that the bakery by the station sells the "
    "best custard tarts in town. The car rental desk is in hall two, the deposit is "
    "three hundred euros, and the insurance covers scratches but not the tyres. My "
    "cousin arrives on Thursday from Porto with the kids, so we need a table for six "
    "at the fish restaurant on Friday evening, ideally by the window. On Saturday we "
    "take the train to Sintra: it leaves from Rossio every twenty minutes, the palace "
    "opens at half past nine, and the walk up the hill takes about forty minutes, so "
    "bring water and good shoes. The gardens close at six. On Sunday the flea market "
    "behind the monastery opens at dawn; my sister says the best stalls are gone by "
    "ten, and that the man with the blue umbrella sells old maps of the city. Our "
    "return flight is on the last Tuesday, gate numbers are posted an hour before, "
    "and the taxi to the airport should be booked the night before, for six sharp.";

}  // namespace repair_test

// The three conditions of one conversation: small answers a long turn, large
// takes over (translated, or re-prefilled for the twin) with a given reply,
// then large reads a question with a given answer. Returns the last turn's
// reply log-probabilities.
class RepairTest : public RouterTest {
 protected:
  std::vector<double> RunConversation(const std::string& session, Strategy switch_strategy,
                                      std::function<void()> before_last = nullptr) {
    EXPECT_TRUE(store_->Create(session, "", router_->RenderPreamble("Be brief.")).ok());
    auto t1 = Given(session, repair_test::kLongTurn, 0, "Noted.", Strategy::kTranslate);
    EXPECT_TRUE(t1.ok()) << t1.status();
    auto t2 = Given(session, "Where does my sister live?", 2, "In Lisbon.", switch_strategy);
    EXPECT_TRUE(t2.ok()) << t2.status();
    if (before_last) before_last();
    auto t3 = Given(session, "And the locker code?", 2, "Four seven one nine.",
                    Strategy::kTranslate);
    EXPECT_TRUE(t3.ok()) << t3.status();
    return t3.ok() ? t3->reply_logprobs : std::vector<double>{};
  }

  absl::StatusOr<TurnResult> Given(const std::string& session, const std::string& text, int model,
                                   const std::string& reply, Strategy strategy) {
    TurnOptions o;
    o.user_message = text;
    o.policy = Policy::kExplicit;
    o.explicit_model = model;
    o.strategy = strategy;
    o.reply = reply;
    return router_->RunTurn(session, o, {});
  }

  CacheLineInfo LineOf(const std::string& session, int model) {
    const absl::StatusOr<SessionView> view = store_->View(session);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) return {};
    for (const CacheLineInfo& line : view->lines) {
      if (line.model == model) return line;
    }
    ADD_FAILURE() << "no line of model " << model;
    return {};
  }

  static double MaxDiff(const std::vector<double>& a, const std::vector<double>& b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i] - b[i]));
    return d;
  }

  // The large model's line of `session` against large's own prefill of the
  // history it holds: max relative Frobenius distance over layers, keys and
  // values.
  double DistanceFromNativePrefill(const std::string& session) {
    const ConversationState state = store_->View(session)->state;
    auto lease = store_->Begin(session);
    EXPECT_TRUE(lease.ok()) << lease.status();
    KvCache* line = (*lease)->line(2);
    EXPECT_NE(line, nullptr);
    auto native = engines_[2]->NewCache();
    const std::vector<int64_t> held(state.history.begin(), state.history.begin() + line->Length());
    EXPECT_TRUE(engines_[2]->Prefill(*native, held).ok());
    double worst = 0;
    for (int64_t il = 0; il < line->n_layer(); ++il) {
      for (const auto& [a, b] : {std::pair{line->Keys(il), native->Keys(il)},
                                 {line->Values(il), native->Values(il)}}) {
        worst = std::max(worst, ((a - b).norm() / b.norm()).item<double>());
      }
    }
    return worst;
  }
};

TEST_F(RepairTest, ARepairedLineEqualsANativePrefillAndTheNextTurnTheReprefilledTwins) {
  // Without repair: the translated line stays, and the last turn reads it.
  MakeRouter(Explicit());
  const std::vector<double> translated = RunConversation("plain", Strategy::kTranslate);
  const double translated_distance = DistanceFromNativePrefill("plain");
  const std::vector<double> twin = RunConversation("twin", Strategy::kReprefill);
  ASSERT_FALSE(twin.empty());
  // The translation is lossy: the test below could fail.
  EXPECT_GT(MaxDiff(translated, twin), 1e-3);
  EXPECT_GT(translated_distance, 1e-2);

  RoutingConfig routing = Explicit();
  routing.repair = RepairMode::kAfterTurn;
  MakeRouter(routing);
  const std::vector<double> repaired = RunConversation("s", Strategy::kTranslate, [&] {
    ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
  });
  // The last turn, after the repair, reads what the re-prefilled twin reads:
  // equal up to the decoder's chunking (the repair runs 256-token chunks on
  // top of the native head, the twin's re-prefill its own chunks).
  EXPECT_LT(MaxDiff(repaired, twin), 1e-4);
  ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
  EXPECT_LT(DistanceFromNativePrefill("s"), 1e-5);
  const CacheLineInfo large = LineOf("s", 2);
  EXPECT_EQ(large.translated_tokens, 0);
  EXPECT_GT(large.repaired_tokens, Router::kRepairChunkTokens);  // more than one chunk
  EXPECT_EQ(router_->RepairBacklog(), 0);
}

// The session view says where each run of a line came from: translated from
// the model that wrote it, native, or recomputed by repair.
TEST_F(RepairTest, TheViewNamesEachSpansProvenance) {
  MakeRouter(Explicit());
  RunConversation("plain", Strategy::kTranslate);
  const SessionView plain = *store_->View("plain");
  const CacheLineInfo large = LineOf("plain", 2);
  ASSERT_EQ(large.spans.size(), 2u);
  // small wrote everything before the switch turn (the ledger's first span),
  // and large's line holds it translated from small.
  // (Up to small's unrun tail, the closing template, which large prefilled.)
  EXPECT_EQ(large.spans[0].begin, 0);
  EXPECT_EQ(large.spans[0].provenance, SpanProvenance::kTranslated);
  EXPECT_EQ(large.spans[0].source, 0);
  EXPECT_LE(large.spans[0].end, plain.state.ledger[0].end);
  EXPECT_GT(large.spans[0].end, plain.state.ledger[0].end - 4);
  EXPECT_EQ(large.spans[1].provenance, SpanProvenance::kNative);
  EXPECT_EQ(large.spans[1].begin, large.spans[0].end);
  EXPECT_EQ(large.spans[1].end, large.tokens);
  EXPECT_EQ(large.translated_tokens, large.spans[0].end);
  const CacheLineInfo small = LineOf("plain", 0);
  ASSERT_EQ(small.spans.size(), 1u);
  EXPECT_EQ(small.spans[0], (LineSpanInfo{0, small.tokens, SpanProvenance::kNative, -1}));

  RoutingConfig routing = Explicit();
  routing.repair = RepairMode::kAfterTurn;
  MakeRouter(routing);
  RunConversation("s", Strategy::kTranslate,
                  [&] { ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60))); });
  ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
  const CacheLineInfo repaired = LineOf("s", 2);
  // Repaired from the first translated token (0) to the line's end at the
  // repair; the last turn's tokens native after it.
  ASSERT_EQ(repaired.spans.size(), 2u);
  EXPECT_EQ(repaired.spans[0].provenance, SpanProvenance::kRepaired);
  EXPECT_EQ(repaired.spans[0].begin, 0);
  EXPECT_EQ(repaired.spans[0].end - repaired.spans[0].begin, repaired.repaired_tokens);
  EXPECT_EQ(repaired.spans[1].provenance, SpanProvenance::kNative);
  EXPECT_EQ(repaired.spans[1].end, repaired.tokens);
}

TEST_F(RepairTest, ARepairDoesNotRestartTheSessionsIdleTimer) {
  // The turns run on this thread, the repair on the router's: a clock that
  // tells them apart shows which of them last marked the session active.
  const std::thread::id turns = std::this_thread::get_id();
  clock_ = [turns] { return std::this_thread::get_id() == turns ? 1000 : 2000; };
  RoutingConfig routing = Explicit();
  routing.repair = RepairMode::kAfterTurn;
  MakeRouter(routing);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  ASSERT_TRUE(Given("s", repair_test::kLongTurn, 0, "Noted.", Strategy::kTranslate).ok());
  ASSERT_TRUE(Given("s", "Where does my sister live?", 2, "In Lisbon.", Strategy::kTranslate).ok());
  ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
  EXPECT_GT(LineOf("s", 2).repaired_tokens, 0);
  EXPECT_EQ(store_->View("s")->last_active_unix_seconds, 1000);
}

// Blocks the repair thread after its first chunk until released.
struct ChunkGate : TurnObserver {
  std::mutex mu;
  std::condition_variable changed;
  bool first_chunk_done ABSL_GUARDED_BY(mu) = false;
  bool released ABSL_GUARDED_BY(mu) = false;
  int64_t chunks ABSL_GUARDED_BY(mu) = 0;
  int64_t repaired_tokens ABSL_GUARDED_BY(mu) = 0;
  void OnRepairChunk(int model, int64_t done, int64_t target) override {
    std::unique_lock<std::mutex> lock(mu);
    ++chunks;
    first_chunk_done = true;
    changed.notify_all();
    changed.wait(lock, [this] { return released; });
  }
  void OnRepair(int model, int64_t tokens, double seconds) override {
    std::lock_guard<std::mutex> lock(mu);
    repaired_tokens += tokens;
  }
};

TEST_F(RepairTest, ATurnArrivingMidRepairReadsTheTranslatedLineAndTheRepairStillLands) {
  MakeRouter(Explicit());
  const std::vector<double> translated = RunConversation("plain", Strategy::kTranslate);

  ChunkGate gate;
  auto release = [&gate] {
    std::lock_guard<std::mutex> lock(gate.mu);
    gate.released = true;
    gate.changed.notify_all();
  };
  // Whatever happens below, the repair thread is let go and the router (which
  // calls the gate) ends before the gate does.
  absl::Cleanup done = [&] {
    release();
    router_.reset();
  };
  RoutingConfig routing = Explicit();
  routing.repair = RepairMode::kAfterTurn;
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &gate);
  const std::vector<double> mid = RunConversation("s", Strategy::kTranslate, [&] {
    // The last turn starts while the repair is half-way: after its first chunk.
    std::unique_lock<std::mutex> lock(gate.mu);
    gate.changed.wait(lock, [&gate] { return gate.first_chunk_done; });
  });
  // Answered on the translated line, exactly as without repair.
  EXPECT_EQ(mid, translated);
  release();
  ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
  // The repair caught up with the tokens that turn added, then landed.
  EXPECT_LT(DistanceFromNativePrefill("s"), 1e-5);
  const CacheLineInfo line = LineOf("s", 2);
  EXPECT_EQ(line.translated_tokens, 0);
  {
    std::lock_guard<std::mutex> lock(gate.mu);
    EXPECT_GE(gate.chunks, 3);  // two for the switch's line, at least one for the catch-up
    EXPECT_EQ(gate.repaired_tokens, line.repaired_tokens);
  }
  // The next turn reads the repaired line: as a re-prefilled twin's does.
  RunConversation("twin", Strategy::kReprefill);
  auto next = Given("s", "One more thing?", 2, "Yes.", Strategy::kTranslate);
  auto twin_next = Given("twin", "One more thing?", 2, "Yes.", Strategy::kTranslate);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(twin_next.ok()) << twin_next.status();
  EXPECT_LT(MaxDiff(next->reply_logprobs, twin_next->reply_logprobs), 1e-4);
}

struct FidelityLog : TurnObserver {
  std::mutex mu;
  struct Call {
    int source, target;
    double nats;
    int64_t tokens;
    bool differs;
  };
  std::vector<Call> calls ABSL_GUARDED_BY(mu);
  void OnSwitchFidelity(int source, int target, double nats, int64_t tokens,
                        bool differs) override {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back({source, target, nats, tokens, differs});
  }
};

// log p of ids[i] given ids[0..i), for i in [first, ids.size()), from one
// prefill of `line` (already holding ids[0..start)) with every position's logits.
std::vector<double> ScoreByPrefill(Engine& engine, KvCache& line, const std::vector<int64_t>& ids,
                                   int64_t first, int64_t* argmax_first) {
  const int64_t start = line.Length();
  const std::vector<int64_t> run(ids.begin() + start, ids.end() - 1);
  auto logits = engine.Prefill(line, run, /*all_logits=*/true);
  EXPECT_TRUE(logits.ok()) << logits.status();
  const at::Tensor lp = at::log_softmax(logits->to(at::kDouble), -1);
  std::vector<double> out;
  for (int64_t i = first; i < static_cast<int64_t>(ids.size()); ++i) {
    const int64_t row = i - 1 - start;
    out.push_back(lp[row][ids[i]].item<double>());
    if (i == first) *argmax_first = lp[row].argmax().item<int64_t>();
  }
  return out;
}

TEST_F(RepairTest, TheRepairScoresTheSwitchReplyOnTheNativeLineAgainstTheTranslatedOne) {
  FidelityLog log;
  RoutingConfig routing = Explicit();
  routing.repair = RepairMode::kAfterTurn;
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &log);
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls `log`
  ASSERT_TRUE(store_->Create("s", "", router_->RenderPreamble("Be brief.")).ok());
  ASSERT_TRUE(Turn("s", repair_test::kLongTurn, 0).ok());
  const ConversationState after1 = store_->View("s")->state;
  auto t2 = Turn("s", "Where does my sister live?", 2);
  ASSERT_TRUE(t2.ok()) << t2.status();
  ASSERT_EQ(t2->routing.path, CachePath::kTranslated);
  ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
  // A plain continuation on large is not a switch: no second score.
  ASSERT_TRUE(Turn("s", "Thanks.", 2).ok());
  ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));

  // The oracle, by hand: the reply (and its stop token) scored by one prefill
  // on large's own cache of the history, and on a cache translated by the
  // router's translator from small's prefill of what small held.
  const ConversationState after2 = store_->View("s")->state;
  const int64_t first = static_cast<int64_t>(after1.history.size() +
                                             TurnTokens("Where does my sister live?").size());
  const int64_t n_scored = static_cast<int64_t>(t2->tokens.size()) +
                           (t2->finish_reason == FinishReason::kStopToken ? 1 : 0);
  const std::vector<int64_t> ids(after2.history.begin(), after2.history.begin() + first + n_scored);
  Engine& small = *engines_[0];
  Engine& large = *engines_[2];
  auto native_line = large.NewCache();
  int64_t native_first = -1, translated_first = -1;
  const std::vector<double> native = ScoreByPrefill(large, *native_line, ids, first, &native_first);
  auto small_line = small.NewCache();
  const int64_t n_held = after1.tail_begin;
  ASSERT_TRUE(small.Prefill(*small_line, {after1.history.begin(), after1.history.begin() + n_held})
                  .ok());
  auto taps = small_line->Taps(0, n_held);
  ASSERT_TRUE(taps.ok());
  auto moved = router_->FindTranslator(0, 2)->Translate(*taps);
  ASSERT_TRUE(moved.ok());
  auto translated_line = large.NewCache();
  ASSERT_TRUE(translated_line->Accept(moved->keys, moved->values).ok());
  const std::vector<double> translated =
      ScoreByPrefill(large, *translated_line, ids, first, &translated_first);
  double expected = 0;
  for (int64_t i = 0; i < n_scored; ++i) expected += translated[i] - native[i];
  expected /= static_cast<double>(n_scored);

  std::lock_guard<std::mutex> lock(log.mu);
  ASSERT_EQ(log.calls.size(), 1u);
  const FidelityLog::Call& call = log.calls[0];
  EXPECT_EQ(call.source, 0);
  EXPECT_EQ(call.target, 2);
  EXPECT_EQ(call.tokens, n_scored);
  // The router scored the reply token by token while decoding and the repair
  // in 256-token chunks; the oracle prefills once: float32 rounding apart.
  EXPECT_NEAR(call.nats, expected, 1e-3);
  EXPECT_GT(std::abs(expected), 1e-4);  // the two caches do disagree
  EXPECT_EQ(call.differs, native_first != translated_first);
}

struct GateLog : TurnObserver {
  std::mutex mu;
  std::vector<std::pair<std::pair<int, int>, bool>> events ABSL_GUARDED_BY(mu);
  void OnGate(int source, int target, bool open, const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({{source, target}, open});
  }
};

TEST_F(RepairTest, TheLiveGateClosesAPairAboveItsBoundAndReopensItAfterTheCoolDown) {
  GateLog log;
  RoutingConfig routing = Explicit();
  routing.repair = RepairMode::kAfterTurn;
  // Every score exceeds this bound: the first repaired switch closes its pair.
  routing.gate_max_divergence = -1e9;
  routing.gate_window = 1;
  routing.gate_min_samples = 1;
  routing.gate_cooldown_seconds = 3.0;  // far longer than the two turns it must cover
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &log);
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls `log`
  auto turn = [&](const std::string& text, int model) {
    auto t = Turn("s", text, model);
    EXPECT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
    return t.ok() ? *t : TurnResult{};
  };
  ASSERT_TRUE(store_->Create("s", "", router_->RenderPreamble("Be brief.")).ok());
  turn(repair_test::kLongTurn, 0);
  const TurnResult first = turn("Where does my sister live?", 2);
  EXPECT_GT(first.routing.tokens_translated, 0);
  {
    std::lock_guard<std::mutex> lock(log.mu);
    ASSERT_FALSE(log.events.empty());
    EXPECT_EQ(log.events[0], (std::pair<std::pair<int, int>, bool>{{0, 2}, false}));
  }
  const absl::Time closed_at = absl::Now();
  turn("Back to small.", 0);
  // small -> large is closed: small's new span is prefilled, and the routing
  // decision says why.
  const TurnResult gated = turn("And large again?", 2);
  ASSERT_LT(absl::Now() - closed_at, absl::Seconds(3)) << "the machine is too slow for this test";
  EXPECT_EQ(gated.routing.tokens_translated, 0);
  EXPECT_THAT(gated.routing.reason,
              HasSubstr("translator small->large closed by the quality gate"));
  // After the cool-down the pair is used again (on probation).
  absl::SleepFor(absl::Seconds(3) - (absl::Now() - closed_at) + absl::Milliseconds(50));
  turn("Small once more.", 0);
  const TurnResult reopened = turn("Large once more?", 2);
  EXPECT_GT(reopened.routing.tokens_translated, 0);
  std::lock_guard<std::mutex> lock(log.mu);
  EXPECT_NE(std::find(log.events.begin(), log.events.end(),
                      std::pair<std::pair<int, int>, bool>{{0, 2}, true}),
            log.events.end());
}

// ---- admission ---------------------------------------------------------------

// Counts turns waiting for each model, as the router reports them.
struct QueueLog : TurnObserver {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<int> waiting ABSL_GUARDED_BY(mu) = std::vector<int>(3, 0);
  std::vector<std::string> rejected ABSL_GUARDED_BY(mu);
  void OnModelQueue(int model, int running, int w) override {
    std::lock_guard<std::mutex> lock(mu);
    waiting[model] = w;
    changed.notify_all();
  }
  void OnRejected(const std::string& limit) override {
    std::lock_guard<std::mutex> lock(mu);
    rejected.push_back(limit);
  }
  void AwaitWaiting(int model, int n) {
    std::unique_lock<std::mutex> lock(mu);
    changed.wait(lock, [this, model, n] { return waiting[model] >= n; });
  }
};

// A turn holds large (its first token's callback blocks until released);
// turns behind it wait in arrival order, and past the limit one is refused at
// once with nothing changed.
TEST_F(RouterTest, TurnsWaitForAModelInArrivalOrderAndPastTheLimitAreRefused) {
  QueueLog log;
  RoutingConfig routing = Explicit();
  routing.max_waiting_turns_per_model = 3;
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &log);
  std::mutex mu;
  std::condition_variable changed;
  bool released = false;
  std::vector<std::string> served;  // sessions in the order they took large
  auto run = [&](const std::string& session, bool hold) {
    TurnOptions o;
    o.user_message = "Hello from " + session;
    o.policy = Policy::kExplicit;
    o.explicit_model = 2;
    o.max_tokens = 2;
    TurnCallbacks callbacks;
    bool first = true;
    callbacks.on_routing = [&, session](const RoutingEvent&) {
      std::lock_guard<std::mutex> lock(mu);
      served.push_back(session);
      changed.notify_all();
    };
    callbacks.on_token = [&, hold](int64_t, std::string_view) {
      if (!hold || !first) return;
      first = false;
      std::unique_lock<std::mutex> lock(mu);
      changed.wait(lock, [&] { return released; });
    };
    return router_->RunTurn(session, o, callbacks);
  };
  for (const char* id : {"holder", "w1", "w2", "w3", "late"}) {
    ASSERT_TRUE(store_->Create(id, "", {}).ok());
  }
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<TurnResult>> results(4, absl::UnknownError("not run"));
  threads.emplace_back([&] { results[0] = run("holder", true); });
  {
    std::unique_lock<std::mutex> lock(mu);
    changed.wait(lock, [&] { return served.size() == 1; });
  }
  // Each waiter queues before the next starts: their arrival order is known.
  for (int i = 1; i <= 3; ++i) {
    threads.emplace_back([&, i] { results[i] = run("w" + std::to_string(i), false); });
    log.AwaitWaiting(2, i);
  }
  const SessionView before = *store_->View("late");
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<TurnResult> late = run("late", false);
  const auto refused_after = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(late.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(late.status().message(),
              HasSubstr("model large already has 3 turns waiting "
                        "(limits.max_waiting_turns_per_model = 3)"));
  const SessionView after = *store_->View("late");
  EXPECT_EQ(after.state.history, before.state.history);
  EXPECT_EQ(after.state.turns, 0);
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    changed.notify_all();
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(results[i].ok()) << i;
  // Refused while the holder still held large: without waiting for it.
  EXPECT_LT(refused_after, std::chrono::seconds(30));
  EXPECT_EQ(served, (std::vector<std::string>{"holder", "w1", "w2", "w3"}));
  std::lock_guard<std::mutex> lock(log.mu);
  EXPECT_EQ(log.rejected, std::vector<std::string>{"max_waiting_turns_per_model"});
  EXPECT_EQ(log.waiting[2], 0);
}

TEST_F(RouterTest, ATurnPastTheHistoryLimitIsRefusedAndChangesNothing) {
  RoutingConfig routing = Explicit();
  routing.max_history_tokens = 40;
  MakeRouter(routing);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  ASSERT_TRUE(Turn("s", "Hi.", 0).ok());
  const SessionView before = *store_->View("s");
  ASSERT_LT(before.state.history.size(), 40u);
  auto t = Turn("s", "A much longer message that takes the history well past its limit of forty "
                     "tokens, which this turn would cross on its own.", 0);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(t.status().message(), HasSubstr("past limits.max_history_tokens = 40"));
  const SessionView after = *store_->View("s");
  EXPECT_EQ(after.state.history, before.state.history);
  EXPECT_EQ(after.state.turns, before.state.turns);
  EXPECT_TRUE(Turn("s", "Ok.", 0).ok());  // a short one still fits
}

TEST(LoadGateRefusal, SaysWhyATranslatorFallsShortOfTheConfiguredMinimum) {
  TranslatorEvaluation e;
  e.recovered = 0.8;
  e.gap_nats = 0.03;
  e.data = "test.jsonl";
  e.windows = 64;
  // No minimum: every translator is used, measured or not.
  EXPECT_EQ(LoadGateRefusal(std::nullopt, std::nullopt, std::nullopt), "");
  EXPECT_EQ(LoadGateRefusal(e, std::nullopt, std::nullopt), "");
  // A minimum and no evaluation: refused, saying how to stamp one.
  EXPECT_THAT(LoadGateRefusal(std::nullopt, 0.5, std::nullopt), HasSubstr("no evaluation"));
  EXPECT_THAT(LoadGateRefusal(std::nullopt, std::nullopt, 0.1), HasSubstr("kvl stamp-translator"));
  // At or past the bound passes; short of it is refused with both numbers and the data.
  EXPECT_EQ(LoadGateRefusal(e, 0.8, 0.03), "");
  const std::string low = LoadGateRefusal(e, 0.9, std::nullopt);
  EXPECT_THAT(low, HasSubstr("recovers 0.8 "));
  EXPECT_THAT(low, HasSubstr("below the minimum 0.9"));
  EXPECT_THAT(low, HasSubstr("test.jsonl, 64 windows"));
  EXPECT_THAT(LoadGateRefusal(e, 0.5, 0.02), HasSubstr("gap is 0.03 nats/token"));
  EXPECT_THAT(LoadGateRefusal(e, 0.5, 0.02), HasSubstr("above the maximum 0.02"));
}

// spdlog's lines, kept while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string Text() const { return absl::StrJoin(sink_->last_formatted(), ""); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

TEST_F(RouterTest, ATranslatorStampedBelowTheMinimumIsRefusedAtLoadAndItsSwitchesRePrefill) {
  // Copies of the fixture's small <-> large translators: small -> large
  // stamped below the minimum, large -> small above it.
  const std::string gate_dir = dir_->path() + "/gate";
  std::filesystem::create_directories(gate_dir);
  const std::string weak = gate_dir + "/small__large.safetensors";
  const std::string good = gate_dir + "/large__small.safetensors";
  std::filesystem::copy_file(testing::TranslatorPath(dir_->path(), "small", "large"), weak,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(testing::TranslatorPath(dir_->path(), "large", "small"), good,
                             std::filesystem::copy_options::overwrite_existing);
  TranslatorEvaluation low;
  low.recovered = 0.42;
  low.gap_nats = 0.3;
  low.data = "held-out.jsonl";
  low.windows = 16;
  TranslatorEvaluation high = low;
  high.recovered = 0.97;
  high.gap_nats = 0.01;
  ASSERT_TRUE(StampTranslatorEvaluation(weak, low).ok());
  ASSERT_TRUE(StampTranslatorEvaluation(good, high).ok());

  std::vector<ModelSource> models;
  for (const auto& m : testing::FixtureModels()) {
    models.push_back({m.name, dir_->path() + "/" + m.name, DType::kFloat32});
  }
  RoutingConfig routing = Explicit();
  routing.gate_min_recovered = 0.9;
  GateLog log;
  store_ = std::make_unique<CacheStore>(CacheStoreOptions{3, int64_t{1} << 30, nullptr});
  LogCapture capture;
  auto loaded = LoadRouter(
      models,
      {{"small->large", 0, 2, weak, DType::kFloat32, {}, {}},
       {"large->small", 2, 0, good, DType::kFloat32, {}, {}}},
      routing, 2, store_.get(), &log);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  router_ = *std::move(loaded);
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls `log`

  // At load: a warning naming the translator, its figure and the minimum, and
  // the pair reported closed.
  const std::string logged = capture.Text();
  EXPECT_THAT(logged, HasSubstr("translator small->large (small -> large) refused by the "
                                "quality gate: its evaluation recovers 0.42 of the prefix "
                                "benefit (measured on held-out.jsonl, 16 windows), below the "
                                "minimum 0.9"));
  EXPECT_THAT(logged, Not(HasSubstr("large->small (large -> small) refused")));
  EXPECT_FALSE(router_->translators()[0].refused.empty());
  EXPECT_TRUE(router_->translators()[1].refused.empty());
  {
    std::lock_guard<std::mutex> lock(log.mu);
    EXPECT_EQ(log.events, (std::vector<std::pair<std::pair<int, int>, bool>>{{{0, 2}, false}}));
  }

  // small -> large re-prefills, and the routing decision says why; large ->
  // small translates.
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  ASSERT_TRUE(Turn("s", "Hello there, how are you?", 0).ok());
  auto to_large = Turn("s", "Tell me about caches.", 2);
  ASSERT_TRUE(to_large.ok()) << to_large.status();
  EXPECT_TRUE(to_large->routing.switched);
  EXPECT_EQ(to_large->routing.tokens_translated, 0);
  EXPECT_GT(to_large->routing.tokens_reprefilled, 0);
  EXPECT_THAT(to_large->routing.reason,
              HasSubstr("translator small->large refused at load by the quality gate"));
  auto to_small = Turn("s", "And back to small.", 0);
  ASSERT_TRUE(to_small.ok()) << to_small.status();
  EXPECT_GT(to_small->routing.tokens_translated, 0);
}

}  // namespace
}  // namespace kvl::router
