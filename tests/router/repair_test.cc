// router/repair.h: background repair of translated lines through the router,
// checked against native prefills and re-prefilled twins; the fidelity score
// and the live quality gate it feeds.
#include "tests/router/router_fixture.h"

namespace kvl::router {
namespace {

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

  RouterConfig routing = Explicit();
  routing.switching.repair = RepairMode::kAfterTurn;
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

  RouterConfig routing = Explicit();
  routing.switching.repair = RepairMode::kAfterTurn;
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
  RouterConfig routing = Explicit();
  routing.switching.repair = RepairMode::kAfterTurn;
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
  RouterConfig routing = Explicit();
  routing.switching.repair = RepairMode::kAfterTurn;
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

struct ChunkCount : TurnObserver {
  std::mutex mu;
  int64_t chunks ABSL_GUARDED_BY(mu) = 0;
  void OnRepairChunk(int model, int64_t done, int64_t target) override {
    std::lock_guard<std::mutex> lock(mu);
    ++chunks;
  }
  int64_t Chunks() {
    std::lock_guard<std::mutex> lock(mu);
    return chunks;
  }
};

// routing.switching.repair idle-only: a queued repair starts no chunk while any turn
// runs, on any model, and runs as soon as the last one ends (it waits for
// that turn's end, not for a timer).
TEST_F(RepairTest, IdleOnlyRepairWaitsForTheLastRunningTurnToEnd) {
  ChunkCount count;
  RouterConfig routing = Explicit();
  routing.switching.repair = RepairMode::kIdleOnly;
  MakeRouter(routing, int64_t{1} << 30, DType::kFloat32, &count);
  absl::Cleanup done = [&] { router_.reset(); };  // the router calls `count`
  ASSERT_TRUE(store_->Create("a", "", {}).ok());
  ASSERT_TRUE(store_->Create("b", "", {}).ok());
  ASSERT_TRUE(Given("a", repair_test::kLongTurn, 0, "Noted.", Strategy::kTranslate).ok());

  // A turn of session b on small holds its first token until released.
  std::mutex mu;
  std::condition_variable changed;
  bool holding = false, released = false;
  std::thread b([&] {
    TurnOptions o;
    o.user_message = "Hello from b.";
    o.policy = Policy::kExplicit;
    o.explicit_model = 0;
    o.max_tokens = 3;
    TurnCallbacks callbacks;
    callbacks.on_token = [&](int64_t, std::string_view) {
      std::unique_lock<std::mutex> lock(mu);
      if (holding) return;
      holding = true;
      changed.notify_all();
      changed.wait(lock, [&] { return released; });
    };
    EXPECT_TRUE(router_->RunTurn("b", o, callbacks).ok());
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    changed.wait(lock, [&] { return holding; });
  }
  // Session a switches to large and leaves a translated line: queued, and
  // not started while b runs.
  auto t2 = Given("a", "Where does my sister live?", 2, "In Lisbon.", Strategy::kTranslate);
  ASSERT_TRUE(t2.ok()) << t2.status();
  ASSERT_GT(t2->routing.tokens_translated, 0);
  EXPECT_EQ(router_->RepairBacklog(), 1);
  EXPECT_EQ(count.Chunks(), 0);
  EXPECT_GT(LineOf("a", 2).translated_tokens, 0);
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    changed.notify_all();
  }
  b.join();
  ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
  EXPECT_GE(count.Chunks(), 2);  // the long turn is more than one chunk
  EXPECT_EQ(LineOf("a", 2).translated_tokens, 0);
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
  RouterConfig routing = Explicit();
  routing.switching.repair = RepairMode::kAfterTurn;
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


// The gate through the router: the first repaired switch above the bound
// closes its pair, whose next switch re-prefills and says why. (Reopening
// after the cool-down is QualityGate's, tested with its clock in gate_test.cc.)
TEST_F(RepairTest, TheLiveGateClosesAPairAboveItsBoundAndItsSwitchesRePrefill) {
  GateLog log;
  RouterConfig routing = Explicit();
  routing.switching.repair = RepairMode::kAfterTurn;
  // Every score exceeds this bound: the first repaired switch closes its pair.
  routing.gate.max_divergence = -1e9;
  routing.gate.window = 1;
  routing.gate.min_samples = 1;
  routing.gate.cooldown = std::chrono::hours(1);  // closed for the rest of the test
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
    ASSERT_EQ(log.events.size(), 1u);
    EXPECT_EQ(log.events[0], (std::pair<std::pair<int, int>, bool>{{0, 2}, false}));
  }
  turn("Back to small.", 0);
  // small -> large is closed: small's new span is prefilled, and the routing
  // decision says why.
  const TurnResult gated = turn("And large again?", 2);
  EXPECT_EQ(gated.routing.tokens_translated, 0);
  EXPECT_THAT(gated.routing.reason,
              HasSubstr("translator small->large closed by the quality gate"));
}

}  // namespace
}  // namespace kvl::router
