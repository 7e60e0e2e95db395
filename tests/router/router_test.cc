// router/router.h: the orchestrator on three small random models with fitted
// translators, checked against engines driven by hand from the same state;
// admission and the load-time quality gate.
#include "tests/router/router_fixture.h"

namespace kvl::router {
namespace {

TEST_F(RouterTest, TranslateSwitchEqualsAnEngineDrivenByHandFromTheTranslatedState) {
  MakeRouter(Explicit());
  ExpectTranslateSwitchEqualsHandDriven(DType::kFloat32);
}

TEST_F(RouterTest, ABfloat16TranslatorTranslatesTheSwitchInBfloat16) {
  MakeRouter(Explicit(), int64_t{1} << 30, DType::kBFloat16);
  ExpectTranslateSwitchEqualsHandDriven(DType::kBFloat16);
}

// The native-depth dial on small -> large (6 layers): with k native layers
// the translated span's top k layers are what large computes from the
// translator's residual map of layer 6 - k (checked against the same steps
// by hand), the path is "hybrid", and at k = 6 every layer is large's own,
// so the reply is the re-prefilled twin's. A turn may override the pair's k;
// one the file has no map for fails naming routing.native_layers and leaves
// the session as it was.
TEST_F(RouterTest, NativeLayersComputeTheTopLayersFromThePredictedResidual) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
  ResidualMap map;
  map.layer = 4;
  map.source_layers = {0, 1, 2, 3};
  map.weight = at::randn({256, 2 * 4 * 2 * 32}, gen) * 0.05;
  map.bias = at::randn({256}, gen) * 0.1;
  MakeRouter(Explicit(), int64_t{1} << 30, DType::kFloat32, nullptr, [&](LoadedTranslator& t) {
    if (t.source != 0 || t.target != 2) return;
    ASSERT_TRUE(t.translator->SetResidualMaps({map}, 2, "test").ok());
    t.native_layers = 2;
  });
  // A session whose first turn ran on small.
  const auto start = [&](const std::string& session) {
    EXPECT_TRUE(store_->Create(session, "", router_->RenderPreamble("Be brief.")).ok());
    auto t1 = Turn(session, "Hello there, how are you?", 0);
    EXPECT_TRUE(t1.ok()) << t1.status();
  };
  // Its second turn, on large.
  const auto run = [&](const std::string& session, std::optional<int64_t> k,
                       Strategy strategy = Strategy::kTranslate) -> absl::StatusOr<TurnResult> {
    TurnOptions o;
    o.user_message = "Tell me about caches.";
    o.policy = Policy::kExplicit;
    o.explicit_model = 2;
    o.strategy = strategy;
    o.native_layers = k;
    o.max_tokens = 6;
    return router_->RunTurn(session, o, {});
  };

  // The pair's own k = 2.
  start("s");
  const ConversationState after1 = store_->View("s")->state;
  auto t2 = run("s", std::nullopt);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->routing.path, CachePath::kHybrid);
  EXPECT_EQ(t2->routing.native_layers, 2);
  const int64_t n_held = after1.tail_begin;
  EXPECT_EQ(t2->routing.tokens_translated, n_held);
  // By hand: translate, predict layer 4's input, run layers 4 and 5.
  Engine& small = *engines_[0];
  Engine& large = *engines_[2];
  auto small_line = small.NewCache();
  const std::vector<int64_t> held(after1.history.begin(), after1.history.begin() + n_held);
  ASSERT_TRUE(small.Prefill(*small_line, held).ok());
  auto taps = small_line->Taps(0, n_held);
  ASSERT_TRUE(taps.ok());
  const Translator& translator = *router_->FindTranslator(0, 2);
  auto moved = translator.Translate(*taps);
  ASSERT_TRUE(moved.ok());
  auto translated = large.NewCache();
  ASSERT_TRUE(translated->Accept(moved->keys, moved->values).ok());
  auto hybrid = large.NewCache();
  ASSERT_TRUE(hybrid->Accept(moved->keys, moved->values).ok());
  auto residual = translator.PredictResidual(*taps, 4);
  ASSERT_TRUE(residual.ok()) << residual.status();
  ASSERT_TRUE(large.ForwardLayers(*hybrid, 0, held, *residual, 4).ok());
  {
    auto lease = store_->Begin("s");
    ASSERT_TRUE(lease.ok()) << lease.status();
    const KvCache* routed = (*lease)->line(2);
    ASSERT_NE(routed, nullptr);
    auto rel = [](const at::Tensor& a, const at::Tensor& b) {
      return ((a - b).norm() / b.norm()).item<double>();
    };
    for (int64_t il = 0; il < 6; ++il) {
      const at::Tensor keys = routed->Keys(il).narrow(1, 0, n_held);
      EXPECT_LT(rel(keys, hybrid->Keys(il)), 1e-4) << il;
      EXPECT_LT(rel(routed->Values(il).narrow(1, 0, n_held), hybrid->Values(il)), 1e-4) << il;
      if (il >= 4) {
        EXPECT_GT(rel(keys, translated->Keys(il)), 1e-2) << il;
      }
    }
  }

  // k = 6: every layer computed; the reply is the re-prefilled twin's.
  for (const char* s : {"full", "twin", "plain", "none"}) start(s);
  auto full = run("full", 6);
  auto twin = run("twin", std::nullopt, Strategy::kReprefill);
  ASSERT_TRUE(full.ok() && twin.ok());
  EXPECT_EQ(full->routing.path, CachePath::kHybrid);
  EXPECT_EQ(full->routing.native_layers, 6);
  EXPECT_EQ(twin->routing.path, CachePath::kReprefill);
  EXPECT_EQ(full->tokens, twin->tokens);
  // k = 0: the plain translation.
  auto plain = run("plain", 0);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->routing.path, CachePath::kTranslated);
  EXPECT_EQ(plain->routing.native_layers, 0);
  // k = 1 needs layer 5's map, which the file lacks.
  const size_t before = store_->View("none")->state.history.size();
  auto missing = run("none", 1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SettingOf(missing.status()), Setting::kNativeLayers);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("residual map"));
  EXPECT_EQ(store_->View("none")->state.history.size(), before);
  EXPECT_EQ(run("none", -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RouterTest, ANativeTailIsPrefilledByTheTargetAfterTheTranslatedHead) {
  RouterConfig routing = Explicit();
  routing.switching.native_tail_tokens = 6;
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
  RouterConfig routing = Explicit();
  routing.switching.native_tail_tokens = 4;
  PrefillCalls prefills;
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &prefills);
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls the observer
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
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls the observer
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
  RouterConfig batched = Explicit();
  batched.batching.enabled = true;
  batched.batching.max_step_tokens = 16;  // prompts cut into chunks beside decoding turns
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
  RouterConfig r = Plain();  // fixed on model 0, no order, no rules
  MakeRouter(r);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  struct Case {
    std::optional<Policy> policy;
    int model;
    const char* message;
    Setting setting;
  };
  for (const Case& c :
       {Case{Policy::kExplicit, -1, "the 'explicit' policy needs the turn to name a model",
             Setting::kTurnModel},
        Case{Policy::kExplicit, 3, "the turn names model index 3; 3 models are loaded",
             Setting::kTurnModel},
        Case{Policy::kCascade, -1, "the 'cascade' policy needs an order of at least two models",
             Setting::kOrder},
        Case{Policy::kAlternate, -1, "the 'alternate' policy needs an order", Setting::kOrder},
        Case{Policy::kRules, -1, "the 'rules' policy needs rules", Setting::kRules}}) {
    TurnOptions o;
    o.user_message = "Hi.";
    o.policy = c.policy;
    o.explicit_model = c.model;
    const absl::Status v = router_->ValidateTurn(o);
    EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(v.message(), HasSubstr(c.message));
    EXPECT_EQ(SettingOf(v), c.setting) << c.message;
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
  RouterConfig r = Plain();
  r.policy.policy = Policy::kCascade;
  r.policy.order = {0, 2};
  r.policy.cascade_max_entropy = 0.0;  // every distribution has positive entropy: escalate
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
  RouterConfig r = Plain();
  r.policy.policy = Policy::kCascade;
  r.policy.order = {0, 2};
  r.policy.cascade_max_entropy = std::numeric_limits<double>::infinity();
  r.policy.cascade_min_mean_logprob = 0.0;  // every turn is "unsure"
  MakeRouter(r);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  auto t1 = Turn("s", "Something hard.", -1, Strategy::kTranslate, std::nullopt);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_EQ(t1->routing.model, 2);
  EXPECT_THAT(t1->routing.reason, HasSubstr("escalated to large"));
}

TEST_F(RouterTest, CascadeKeepsTheCheapModelWhenConfidentAndReportsItsEntropy) {
  RouterConfig r = Plain();
  r.policy.policy = Policy::kCascade;
  r.policy.order = {0, 2};
  r.policy.cascade_max_entropy = std::numeric_limits<double>::infinity();
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
  RouterConfig r = Plain();
  r.policy.policy = Policy::kCascade;
  r.policy.order = {0, 2};
  r.policy.cascade_max_entropy = 0.0;     // every level below the last escalates
  r.switching.repair = RepairMode::kOff;  // a repair's timing would change later turns' lines
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
  r.batching.enabled = true;
  MakeRouter(r, int64_t{1} << 30, DType::kFloat32, &steps);
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls the observer
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

// ---- admission ---------------------------------------------------------------

// Counts turns waiting for each model, as the router reports them.
struct QueueLog : TurnObserver {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<int> waiting ABSL_GUARDED_BY(mu) = std::vector<int>(3, 0);
  std::vector<int> running ABSL_GUARDED_BY(mu) = std::vector<int>(3, 0);
  std::vector<Setting> rejected ABSL_GUARDED_BY(mu);
  void OnModelQueue(int model, int r, int w) override {
    std::lock_guard<std::mutex> lock(mu);
    running[model] = r;
    waiting[model] = w;
    changed.notify_all();
  }
  void OnRejected(Setting limit) override {
    std::lock_guard<std::mutex> lock(mu);
    rejected.push_back(limit);
  }
  // n requests wait behind a running one. (A report from before the running
  // one was admitted, delivered late, says none runs.)
  void AwaitWaiting(int model, int n) {
    std::unique_lock<std::mutex> lock(mu);
    changed.wait(lock, [this, model, n] { return running[model] >= 1 && waiting[model] >= n; });
  }
};

// A turn holds large's engine loop (its first token's callback, which runs on
// the loop, blocks until released; without batching the loop runs one request
// at a time); turns behind it wait and are served in arrival order, and past
// the limit one is refused at once with nothing changed.
TEST_F(RouterTest, TurnsWaitForAModelInArrivalOrderAndPastTheLimitAreRefused) {
  QueueLog log;
  RouterConfig routing = Explicit();
  routing.limits.max_waiting_turns = 3;
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &log);
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls the observer
  std::mutex mu;
  std::condition_variable changed;
  bool released = false;
  std::vector<std::string> served;  // sessions in the order large gave them a first token
  auto run = [&](const std::string& session, bool hold) {
    TurnOptions o;
    o.user_message = "Hello from " + session;
    o.policy = Policy::kExplicit;
    o.explicit_model = 2;
    o.max_tokens = 2;
    TurnCallbacks callbacks;
    bool first = true;
    callbacks.on_token = [&, hold, session](int64_t, std::string_view) {
      if (!first) return;
      first = false;
      std::unique_lock<std::mutex> lock(mu);
      served.push_back(session);
      changed.notify_all();
      if (hold) changed.wait(lock, [&] { return released; });
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
              HasSubstr("model large already has 3 turns waiting (the limit is 3)"));
  EXPECT_EQ(SettingOf(late.status()), Setting::kMaxWaitingTurns);
  const SessionView after = *store_->View("late");
  EXPECT_EQ(after.state.history, before.state.history);
  EXPECT_EQ(after.state.turns, 0);
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    changed.notify_all();
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].status();
  // Refused while the holder still held large: without waiting for it.
  EXPECT_LT(refused_after, std::chrono::seconds(30));
  EXPECT_EQ(served, (std::vector<std::string>{"holder", "w1", "w2", "w3"}));
  std::lock_guard<std::mutex> lock(log.mu);
  EXPECT_EQ(log.rejected, std::vector<Setting>{Setting::kMaxWaitingTurns});
  EXPECT_EQ(log.waiting[2], 0);
}

TEST_F(RouterTest, ATurnPastTheHistoryLimitIsRefusedAndChangesNothing) {
  RouterConfig routing = Explicit();
  routing.limits.max_history_tokens = 40;
  MakeRouter(routing);
  ASSERT_TRUE(store_->Create("s", "", {}).ok());
  ASSERT_TRUE(Turn("s", "Hi.", 0).ok());
  const SessionView before = *store_->View("s");
  ASSERT_LT(before.state.history.size(), 40u);
  auto t = Turn("s", "A much longer message that takes the history well past its limit of forty "
                     "tokens, which this turn would cross on its own.", 0);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(t.status().message(), HasSubstr("past the history limit of 40"));
  EXPECT_EQ(SettingOf(t.status()), Setting::kMaxHistoryTokens);
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
  RouterConfig routing = Explicit();
  routing.load_gate.min_recovered = 0.9;
  GateLog log;
  store_ = std::make_unique<CacheStore>(CacheStoreOptions{3, int64_t{1} << 30, nullptr});
  LogCapture capture;
  auto loaded = LoadRouter(
      models,
      {{"small->large", 0, 2, weak, DType::kFloat32, {}, {}, {}},
       {"large->small", 2, 0, good, DType::kFloat32, {}, {}, {}}},
      routing, 2, store_.get(), &log);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // (Native layers the file has no residual map for stop the load, naming
  // the entry; a k of the target's depth or more needs none.)
  {
    CacheStore other(CacheStoreOptions{3, int64_t{1} << 30, nullptr});
    auto refused = LoadRouter(models, {{"small->large", 0, 2, weak, DType::kFloat32, {}, {}, 3}},
                              routing, 2, &other, nullptr);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("translators[0] (small->large): 3 native layers need the residual map"));
    auto all_native =
        LoadRouter(models, {{"small->large", 0, 2, weak, DType::kFloat32, {}, {}, 6}}, routing, 2,
                   &other, nullptr);
    EXPECT_TRUE(all_native.ok()) << all_native.status();
  }
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
