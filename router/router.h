// The turn orchestrator: runs one chat turn of one session end to end, in
// named stages (RunTurn):
//
//   1. Route: the policy picks the model (policy.h); "cascade" starts at the
//      session's cascade level.
//   2. Score ("cascade" only, below the last level): the level's model takes
//      over the history, reads the new turn (Engine::ScoreContinuation, in
//      the model's engine loop with batching) and
//      the policy judges its confidence (JudgeCascade); an unsure level hands
//      the turn to the next model, which takes over the history and the turn's
//      tokens (translated from the cheaper model where a translator exists) as
//      in stage 3. The session stays escalated for later turns.
//   3. Hand over: the answering model gets the history it lacks (planner.h):
//      spans translated from their native writers' lines or prefilled, per the
//      strategy.
//   4. Generate: the model prefills the rest of the turn and decodes,
//      streaming tokens.
//   5. Commit: the history, ledger and lines become the session's. On any
//      error or cancellation the session is left exactly as it was before the
//      turn (the TurnLease rolls back).
//
// History layout: the rendered conversation as one token stream, built
// incrementally (model/chat_template.h): [system preamble] then per turn
// RenderUserTurn(content) + generated tokens (+ the stop token) +
// CloseAssistantTurn. The ledger attributes a turn's tokens (template and
// user text included) to the model that ran them natively.
//
// Threads: Router is thread-safe. RunTurn blocks its calling thread for the
// whole turn (the server runs turns on its TurnPool, never in a gRPC
// reaction). With routing.batching each model has a BatchScheduler
// (model/scheduler.h): a turn's hand-over prefills, its prompt and its decoding
// run as requests in that model's engine loop, batched with every other turn
// on the model, and on_token is called on the loop's thread; translation runs
// on the turn's thread. The cascade's scoring and a given reply's reading are
// loop requests too, so no turn takes a model's mutex. Without batching each
// model's engine is driven by one turn at a time:
// the ModelLock is held for each stage that runs that model, and at most one
// is held at once, so turns cannot deadlock; turns on the same model queue on
// it, one after another.
//
// Background repair (routing.repair, router/repair.cc): after a turn that
// leaves a line with translated spans, one repair thread recomputes that
// line natively from its first translated token on a copy, a chunk of
// kRepairChunkTokens at a time under the model's mutex, giving way between
// chunks to any turn waiting for the model; when it has caught up with the
// line it swaps the copy in under a short lease (a turn boundary: never while
// a turn holds the session). A turn that starts before the swap reads the
// translated line, as without repair; the lines it grows are caught up before
// the swap.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache_store/cache_store.h"
#include "model/engine.h"
#include "model/scheduler.h"
#include "model/tokenizer.h"
#include "router/planner.h"
#include "router/policy.h"
#include "translator/translator.h"

namespace kvl::router {

// Metric sink; calls come from turn threads and must be cheap and thread-safe.
class TurnObserver {
 public:
  virtual ~TurnObserver() = default;
  virtual void OnSwitch(int from, int to, Strategy strategy) {}
  virtual void OnTranslation(int source, int target, double seconds, int64_t tokens) {}
  virtual void OnPrefillTokens(int model, int64_t n) {}
  virtual void OnGeneratedTokens(int model, int64_t n) {}
  virtual void OnTimeToFirstToken(int model, CachePath path, double seconds) {}
  virtual void OnInterTokenLatency(int model, double seconds) {}
  // A repaired line swapped in: `tokens` recomputed natively in `seconds` of
  // engine time (router/repair.cc).
  virtual void OnRepair(int model, int64_t tokens, double seconds) {}
  // Lines queued for repair or being repaired, after each change.
  virtual void OnRepairBacklog(int64_t lines) {}
  // Turns running on and waiting for a model changed (without batching at
  // most one runs).
  virtual void OnModelQueue(int model, int running, int waiting) {}
  // A batched engine step ran `rows` requests (`decode_rows` of them decoding
  // one token each), `tokens` tokens in all, in `seconds`.
  virtual void OnBatchStep(int model, int64_t rows, int64_t decode_rows, int64_t tokens,
                           double seconds) {}
  // A turn was refused by an admission limit (RoutingConfig::max_waiting_turns_per_model,
  // max_history_tokens): `limit` names it ("max_waiting_turns_per_model", ...).
  virtual void OnRejected(const std::string& limit) {}
  // The quality gate closed (open = false) or reopened a translator pair: the
  // live gate, or at load for a translator it refused (Router::Create).
  virtual void OnGate(int source, int target, bool open, const std::string& reason) {}
  // A repair recomputed the reply of a translated switch turn (source ->
  // target): nats_per_token is the mean over the reply's tokens (and stop
  // token) of log p_translated - log p_native, the log-probabilities the target
  // gave each token on the translated line while generating and on the
  // repaired (native) one; for sampled tokens, an estimate of
  // KL(translated || native) per token. first_token_differs: the native
  // line's most likely first token is not the translated line's.
  virtual void OnSwitchFidelity(int source, int target, double nats_per_token, int64_t tokens,
                                bool first_token_differs) {}
  // The repair thread finished a chunk: its copy of the model's line now
  // holds `done` of the `target` tokens it is catching up with. Called with no
  // lock held.
  virtual void OnRepairChunk(int model, int64_t done, int64_t target) {}
};

struct LoadedModel {
  std::string name;
  std::string path;
  std::unique_ptr<Engine> engine;
};

struct LoadedTranslator {
  std::string name;
  std::string path;
  int source = 0, target = 0;
  std::unique_ptr<Translator> translator;
  // Non-empty: the load-time quality gate refused it (router/loader.h) and
  // this says why; the pair's switches re-prefill, reported as a gate closed
  // until the translator is loaded again.
  std::string refused;
};

struct TurnResult;

struct TurnOptions {
  std::string user_message;
  std::optional<Policy> policy;    // unset: the configured policy
  int explicit_model = -1;         // the request's model, -1 when none
  std::optional<Strategy> strategy;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::optional<uint64_t> seed;  // unset: a fresh random seed
  std::vector<std::string> stop;
  // Set: the assistant's reply is given, not sampled. The model reads it
  // (teacher forcing) followed by the stop token, exactly as if it had
  // generated it, and TurnResult::reply_logprobs holds what it gave each of
  // those tokens. No tokens are streamed. For evaluations and for bringing in
  // a transcript.
  std::optional<std::string> reply;
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  // Polled between steps and after every token; true stops the turn, which
  // then fails with Cancelled and leaves the session unchanged.
  std::function<bool()> cancelled;
  // Called once the turn has run, before it becomes the session's, with the
  // session's state before and after it and the result (all but
  // total_seconds). An error fails the turn with that status and leaves the
  // session unchanged: the server's write-through to its durable session
  // store (server/sessions.h).
  std::function<absl::Status(const ConversationState& before, const ConversationState& after,
                             const TurnResult& result)>
      on_commit;
};

struct RoutingEvent {
  int model = 0;
  int previous_model = -1;
  Policy policy = Policy::kFixed;
  std::string reason;
  bool switched = false;
  Strategy strategy = Strategy::kTranslate;
  CachePath path = CachePath::kNative;
  int64_t spans_translated = 0, tokens_translated = 0, tokens_reprefilled = 0;
  double translation_seconds = 0;
};

struct TurnResult {
  RoutingEvent routing;
  FinishReason finish_reason = FinishReason::kLength;
  std::vector<int64_t> tokens;  // generated, without a stop token
  std::string text;
  double time_to_first_token_seconds = 0;
  int64_t prefill_tokens = 0, generated_tokens = 0;
  double queue_seconds = 0, switch_seconds = 0, prefill_seconds = 0, decode_seconds = 0,
         total_seconds = 0;
  int64_t history_tokens = 0;
  // TurnOptions::reply only: the answering model's log-probability (nats) of
  // each of the reply's tokens and then the stop token, given everything
  // before it.
  std::vector<double> reply_logprobs;
  // Aligned with reply_logprobs: whether each was the model's most likely
  // token. All true: greedy decoding would have written exactly the reply.
  std::vector<bool> reply_greedy;
};

struct TurnCallbacks {
  // Once, before the first token.
  std::function<void(const RoutingEvent&)> on_routing;
  // Each generated token with the text that became final with it; id -1 for
  // text held back until the end.
  std::function<void(int64_t id, std::string_view text)> on_token;
};

class Router {
 public:
  // Models must share one tokenizer (the session history is one token
  // stream); InvalidArgument otherwise. Translator indices must be valid.
  static absl::StatusOr<std::unique_ptr<Router>> Create(
      std::vector<LoadedModel> models, std::vector<LoadedTranslator> translators,
      std::unique_ptr<Tokenizer> tokenizer, RoutingConfig routing, CacheStore* store,
      TurnObserver* observer);
  ~Router();

  int n_models() const { return static_cast<int>(models_.size()); }
  const std::vector<std::string>& model_names() const { return names_; }
  // -1 for an unknown name.
  int ModelIndex(std::string_view name) const;
  const LoadedModel& model(int i) const { return models_[i]->loaded; }
  const std::vector<LoadedTranslator>& translators() const { return translators_; }
  const Translator* FindTranslator(int source, int target) const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const RoutingConfig& routing() const { return routing_; }
  int64_t BytesPerToken(int model) const { return models_[model]->bytes_per_token; }

  // The tokens a session's system prompt renders to (empty prompt: none).
  std::vector<int64_t> RenderPreamble(const std::string& system_prompt) const;

  // Whether the turn's policy can run on this router: InvalidArgument naming
  // routing.model (explicit without a model, or an index out of range) or
  // routing.policy (cascade or alternate with fewer than two models in
  // routing.models, rules without rules). RunTurn checks it first; the server
  // also calls it to refuse a turn before queueing it.
  absl::Status ValidateTurn(const TurnOptions& options) const;

  // Runs one turn. ValidateTurn's errors, NotFound (unknown session), Aborted
  // (a turn of the session is already running), ResourceExhausted (cache
  // budget), Cancelled, OutOfRange (the conversation would exceed a model's
  // context), or the engine's or translator's error; the session is unchanged
  // on any error.
  absl::StatusOr<TurnResult> RunTurn(const std::string& session_id, const TurnOptions& options,
                                     const TurnCallbacks& callbacks);

  // Repair: lines queued or being repaired now.
  int64_t RepairBacklog() const;
  // Blocks until no line is queued or being repaired (or `timeout` passes);
  // true when the backlog is empty. For tests, benchmarks and shutdown.
  bool WaitForRepairs(absl::Duration timeout);
  static constexpr int64_t kRepairChunkTokens = 256;

 private:
  struct Slot {
    LoadedModel loaded;
    int64_t bytes_per_token = 0;
    std::mutex mu;  // one thread drives the engine at a time
    std::atomic<int> turns_waiting{0};  // turns blocked on (or about to take) mu
    std::atomic<int> turns_running{0};  // 0 or 1: a turn holds mu
    // Turns take mu in arrival order: each draws a ticket and waits for it
    // to be served before it contends for mu (with the repair thread only).
    // served wakes the waiting turns when serving moves on.
    std::mutex queue_mu;
    std::condition_variable served;
    int64_t next_ticket ABSL_GUARDED_BY(queue_mu) = 0;
    int64_t serving ABSL_GUARDED_BY(queue_mu) = 0;
    // routing.batching: the model's engine loop (destroyed before the engine).
    std::unique_ptr<BatchScheduler> scheduler;
  };
  struct RepairJob {
    std::string session_id;
    int model = 0;
  };
  // The reply of a translated switch turn, kept until its line is repaired
  // (OnSwitchFidelity).
  struct FidelityProbe {
    std::string session_id;
    int source = -1, target = -1;
    int64_t begin = 0;                // history position of tokens[0]
    std::vector<int64_t> tokens;      // the reply's tokens, then its stop token
    std::vector<double> translated;   // their log-probabilities on the translated line
    int64_t first_greedy = -1;        // the translated line's most likely first token
    std::vector<double> native;       // filled by the repair (NaN until then)
    int64_t native_first = -1;
  };
  struct Work;      // one turn's working state
  class ModelLock;  // holds a model's engine for a stage; ends the queue time

  Router() = default;
  // Stage 2: the cascade from work.cascade_level up; returns the answering
  // model (work.cascade_level is then its level).
  absl::StatusOr<int> Escalate(Work& work);
  // Stages 3 and 4 on `model`, under its lock.
  absl::StatusOr<GenerateResult> HandOverAndGenerate(Work& work, int model,
                                                     const TurnCallbacks& callbacks);
  // Stage 4 for a given reply (TurnOptions::reply): the model reads to_run,
  // the reply and the stop token; the result as Generate's.
  absl::StatusOr<GenerateResult> ReadGivenReply(Work& work, int model,
                                                const std::vector<int64_t>& to_run,
                                                std::vector<int64_t> reply);
  // Stage 5; TurnOptions::on_commit's error, the session then unchanged.
  absl::Status Commit(Work& work, int model, GenerateResult generated);
  // Runs ids into the line: in the model's engine loop with batching, else
  // directly (the caller holds the model's lock).
  absl::Status RunPrefill(Work& work, int model, KvCache& line, const std::vector<int64_t>& ids);
  // Engine::ScoreContinuation of ids on the line, placed as RunPrefill.
  absl::StatusOr<Engine::ContinuationScore> RunScore(Work& work, int model, KvCache& line,
                                                     const std::vector<int64_t>& ids);
  // Takes `model` for a stage of a turn. Without batching: its lock, into
  // *lock, in arrival order. With batching nothing is held (the stage's
  // requests wait in the model's engine loop), but a loop whose queue is at
  // routing.max_waiting_turns_per_model refuses at once. QueueFull either way.
  absl::Status TakeModel(Work& work, int model, std::optional<ModelLock>* lock);
  // OnModelQueue with the model's ModelLock and scheduler counts.
  void ReportQueue(int model);
  // The refusal of a turn by routing.max_waiting_turns_per_model (counted by
  // OnRejected): `waiting` turns wait for the model (-1: as many as the limit).
  absl::Status QueueFull(int model, int64_t waiting);
  // Brings `model`'s line to hold work.history[0, upto) per work.strategy and
  // leaves the plan in work.plan; accumulates counts and timings into work.
  // Caller holds the model's lock.
  // extra_tokens: tokens the turn may add to the line, admitted against the
  // memory budget; line_tokens: the capacity the line gets before any step.
  // With run_from, a plan that ends by prefilling the history's last tokens
  // (the model's own unrun tail; with strategy translate, also the native tail
  // or a span that could not be translated) stops before them: *run_from is
  // where they begin (upto when nothing is left), and the caller runs them
  // together with the turn's prompt, in one pass over the line instead of two.
  absl::Status Handover(Work& work, int model, int64_t upto, int64_t extra_tokens,
                        int64_t line_tokens, int64_t* run_from = nullptr);

  // Repair (router/repair.cc).
  void StartRepairThread();
  void StopRepairThread();
  // Queues the session's lines that hold translated spans; called after a
  // turn's lease has ended.
  void QueueRepairs(const std::string& session_id, const std::vector<int>& models,
                    std::optional<FidelityProbe> probe);
  void RepairLoop();
  // Recomputes one line and swaps it in; OK also when there is nothing left
  // to do (the session or line is gone, or is already native).
  absl::Status RepairLine(const RepairJob& job);
  // Records the native log-probabilities of the probes' tokens predicted by a
  // repair chunk's logits [n, V] (the chunk starts at history position
  // chunk_begin).
  static void ScoreProbes(const at::Tensor& logits, int64_t chunk_begin,
                          const std::vector<int64_t>& history, std::vector<FidelityProbe>* probes);
  // OnSwitchFidelity for each probe the repair scored completely.
  void ReportFidelity(const std::vector<FidelityProbe>& probes);
  // Waits (between chunks) until the model may run a repair chunk; false when
  // the router is stopping.
  bool WaitForRepairTurn(Slot& slot);

  std::vector<std::unique_ptr<Slot>> models_;
  std::vector<std::string> names_;
  std::vector<LoadedTranslator> translators_;
  std::vector<std::vector<const LoadedTranslator*>> by_pair_;  // [source][target], in translators_
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int64_t> stop_ids_;
  RoutingConfig routing_;
  CacheStore* store_ = nullptr;
  TurnObserver* observer_ = nullptr;
  TurnObserver null_observer_;

  std::atomic<int> turns_running_{0};
  // Held while the repair thread holds a session's lease, so that a turn
  // refused as Aborted during that moment can wait for it and retry.
  std::mutex swap_mu_;
  // repair_mu_ guards the repair queue, probes and counters; repair_changed_
  // wakes the repair thread and WaitForRepairs when any of them changes.
  mutable std::mutex repair_mu_;
  std::condition_variable repair_changed_;
  std::deque<RepairJob> repair_queue_ ABSL_GUARDED_BY(repair_mu_);
  std::vector<FidelityProbe> probes_ ABSL_GUARDED_BY(repair_mu_);
  // The live quality gate, per (source, target) pair.
  struct Gate {
    std::deque<double> window;  // the last gate_window divergences
    std::chrono::steady_clock::time_point closed_until{};
    bool closed = false;
    std::string reason;
  };
  mutable std::mutex gate_mu_;
  // [source * n + target]; mutable: GateOpen reopens a pair whose cool-down is over.
  mutable std::vector<Gate> gates_ ABSL_GUARDED_BY(gate_mu_);
  // Whether the pair's translator may be used now (reopens it after its
  // cool-down); `why` says why not.
  bool GateOpen(int source, int target, std::string* why) const;
  void FeedGate(int source, int target, double nats_per_token);
  int64_t repairs_in_progress_ ABSL_GUARDED_BY(repair_mu_) = 0;
  bool repair_stop_ ABSL_GUARDED_BY(repair_mu_) = false;
  std::thread repair_thread_;
};

}  // namespace kvl::router
