// The turn orchestrator: runs one chat turn of one session end to end, in
// named stages (RunTurn):
//
//   1. Route: the policy picks the model (policy.h); "cascade" starts at the
//      session's cascade level.
//   2. Score ("cascade" only, below the last level): the level's model takes
//      over the history, reads the new turn (Engine::ScoreContinuation, in
//      the model's engine loop) and the policy judges its confidence (JudgeCascade); an unsure
//      level hands the turn to the next model, which takes over the history and the turn's tokens
//      (translated from the cheaper model where a translator exists) as in stage 3. The session
//      stays escalated for later turns.
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
// Models with different tokenizers (issue 54): the models are grouped by
// tokenizer, group 0 the router's own. The history is group 0's stream, and
// each other group keeps its rendering of the same segments
// (ConversationState::renderings); a model's line holds a prefix of its
// group's stream, and everything a turn runs on it is in its tokens. A
// switch into a model of another group than the span's writer aligns the two
// renderings segment by segment (router/streams.h), resamples the writer's
// taps onto the target's tokens (translator/resample.h) and translates;
// what does not align (the part of a group past the span's end, a segment a
// tokenizer does not spell back) is prefilled by the target. v1: one chat
// template family; the cascade needs one tokenizer.
//
// Threads: Router is thread-safe. RunTurn blocks its calling thread for the
// whole turn (the server runs turns on its TurnPool, never in a gRPC
// reaction). Each model has one engine loop (model/scheduler.h), the only
// thing that runs it: a turn's hand-over prefills, the cascade's scoring, a
// given reply's reading, its prompt and its decoding are requests in that
// loop, batched with every other turn's on the model (batching disabled: the
// loop runs one request at a time), and on_token
// is called on the loop's thread. Translation runs on the turn's thread.
// Admission: a model whose loop already has limits.max_waiting_turns requests
// waiting refuses a turn at once (ResourceExhausted). Configuration:
// router/config.h.
//
// Background repair (switching.repair, router/repair.h) runs on its own thread
// as background requests of the engine loops; the live quality gate
// (router/gate.h) closes translator pairs whose repaired switches diverge.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache_store/cache_store.h"
#include "model/engine.h"
#include "model/scheduler.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "router/config.h"
#include "router/gate.h"
#include "router/observer.h"
#include "router/planner.h"
#include "router/policy.h"
#include "router/repair.h"
#include "router/streams.h"
#include "translator/translator.h"

namespace kvl::router {

struct LoadedModel {
  std::string name;
  std::string path;
  std::unique_ptr<Engine> engine;
  // The family whose chat template renders its sessions
  // (ChatTemplateKindForModelDir); the models of one router share it.
  ChatTemplateKind chat_template = ChatTemplateKind::kQwen3;
  // The model's own tokenizer when it differs from the router's; null: the
  // router's.
  std::unique_ptr<Tokenizer> tokenizer = nullptr;
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
  // The native-depth dial's k for this pair (TranslatorSource::native_layers,
  // checked by CheckNativeLayers); a turn may override it.
  int64_t native_layers = 0;
};

// InvalidArgument unless `translator` can serve switches with k native
// layers: k >= 0, and for k in [1, L_t) a residual map of layer L_t - k.
absl::Status CheckNativeLayers(const Translator& translator, int64_t k);

struct TurnResult;

struct TurnOptions {
  std::string user_message;
  std::optional<Policy> policy;    // unset: the configured policy
  int explicit_model = -1;         // the request's model, -1 when none
  std::optional<Strategy> strategy;
  // The native-depth dial for this turn's translated spans (LoadedTranslator::
  // native_layers); unset: each pair's own.
  std::optional<int64_t> native_layers;
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
  // The most native layers any translated span used (0: translated only).
  int64_t native_layers = 0;
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
  // The turn's prompt: the history before it and the rendered user turn (with
  // the preamble on a first turn), i.e. everything the reply is conditioned on.
  int64_t prompt_tokens = 0;
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
  // Models must share one chat template family, and every id of a model's
  // tokenizer at or past its vocab_size must be a special token;
  // InvalidArgument otherwise. `tokenizer` is group 0's: the models without
  // their own (LoadedModel::tokenizer) and those whose own has the same
  // content read it; the others are grouped by tokenizer. Translator indices
  // must be valid.
  static absl::StatusOr<std::unique_ptr<Router>> Create(std::vector<LoadedModel> models,
                                                        std::vector<LoadedTranslator> translators,
                                                        std::unique_ptr<Tokenizer> tokenizer,
                                                        RouterConfig config, CacheStore* store,
                                                        TurnObserver* observer);
  ~Router();

  int n_models() const { return static_cast<int>(models_.size()); }
  const std::vector<std::string>& model_names() const { return names_; }
  // -1 for an unknown name.
  int ModelIndex(std::string_view name) const;
  const LoadedModel& model(int i) const { return models_[i]->loaded; }
  const std::vector<LoadedTranslator>& translators() const { return translators_; }
  const Translator* FindTranslator(int source, int target) const;
  // Group 0's tokenizer (the history's).
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The tokenizer groups (1 when the models share one tokenizer), and a
  // model's group and tokenizer.
  int n_groups() const { return static_cast<int>(groups_.size()); }
  int group_of(int model) const { return group_of_[model]; }
  const Tokenizer& tokenizer_of(int model) const { return *groups_[group_of_[model]].tokenizer; }
  const Tokenizer& group_tokenizer(int group) const { return *groups_[group].tokenizer; }
  const std::vector<int>& model_groups() const { return group_of_; }
  const RouterConfig& config() const { return config_; }
  int64_t BytesPerToken(int model) const { return models_[model]->bytes_per_token; }

  // The tokens a session's stream starts with: its system prompt and what the
  // models' chat template writes before the first user turn's content
  // (SessionPreamble; for Qwen3 with no system prompt: none).
  std::vector<int64_t> RenderPreamble(const std::string& system_prompt) const;
  ChatTemplateKind chat_template() const { return chat_template_; }
  // InvalidArgument naming `what` and the token when an id is at or past the
  // smallest vocabulary of the models of tokenizer group `group` (a special
  // token only the tokenizer has).
  absl::Status FirstOutsideVocabulary(const std::vector<int64_t>& ids, absl::string_view what,
                                      int group = 0) const;

  // Whether the turn's policy can run on this router: InvalidArgument with
  // the setting it is about (config.h, SettingOf): kTurnModel (explicit
  // without a model, or an index out of range), kOrder (cascade or
  // alternate with fewer than two models in the order) or kRules (rules
  // without rules). RunTurn checks it first; the server also calls it to
  // refuse a turn before queueing it.
  absl::Status ValidateTurn(const TurnOptions& options) const;

  // Runs one turn. ValidateTurn's errors, NotFound (unknown session), Aborted
  // (a turn of the session is already running), ResourceExhausted (cache
  // budget), Cancelled, OutOfRange (the conversation would exceed a model's
  // context), or the engine's or translator's error; the session is unchanged
  // on any error.
  absl::StatusOr<TurnResult> RunTurn(const std::string& session_id, const TurnOptions& options,
                                     const TurnCallbacks& callbacks);

  // Repair: lines queued or being repaired now.
  int64_t RepairBacklog() const { return repair_->Backlog(); }
  // Blocks until no line is queued or being repaired (or `timeout` passes);
  // true when the backlog is empty. For tests, benchmarks and shutdown.
  bool WaitForRepairs(absl::Duration timeout) { return repair_->WaitForIdle(timeout); }
  static constexpr int64_t kRepairChunkTokens = Repairer::kChunkTokens;

 private:
  struct Slot {
    LoadedModel loaded;
    int64_t bytes_per_token = 0;
    // The model's engine loop, the only driver of loaded.engine (destroyed
    // before the engine).
    std::unique_ptr<BatchScheduler> scheduler;
  };
  struct Work;  // one turn's working state

  Router() = default;
  // Stage 2: the cascade from work.cascade_level up; returns the answering
  // model (work.cascade_level is then its level).
  absl::StatusOr<int> Escalate(Work& work);
  // Stages 3 and 4 on `model`.
  absl::StatusOr<GenerateResult> HandOverAndGenerate(Work& work, int model,
                                                     const TurnCallbacks& callbacks);
  // Stage 4 for a given reply (TurnOptions::reply): the model reads to_run,
  // the reply and the stop token; the result as Generate's.
  absl::StatusOr<GenerateResult> ReadGivenReply(Work& work, int model,
                                                const std::vector<int64_t>& to_run,
                                                std::vector<int64_t> reply);
  // Stage 5; TurnOptions::on_commit's error, the session then unchanged.
  absl::Status Commit(Work& work, int model, GenerateResult generated);
  // Runs ids into the line, as a request of the model's engine loop.
  absl::Status RunPrefill(Work& work, int model, KvCache& line, const std::vector<int64_t>& ids);
  // Engine::ScoreContinuation of ids on the line, its prefills run as RunPrefill's.
  absl::StatusOr<Engine::ContinuationScore> RunScore(Work& work, int model, KvCache& line,
                                                     const std::vector<int64_t>& ids);
  // Admission for a stage of a turn on `model`: QueueFull at once when its
  // engine loop already has config.limits.max_waiting_turns requests
  // waiting. Nothing is held: the stage's requests wait in the loop.
  absl::Status Admit(int model);
  // OnModelQueue with the model's engine loop counts.
  void ReportQueue(int model);
  // The refusal of a turn by the waiting limit (counted by OnRejected):
  // `waiting` requests wait for the model (-1: as many as the limit).
  absl::Status QueueFull(int model, int64_t waiting);
  // Brings `model`'s line to hold work.history[0, upto) per work.strategy and
  // leaves the plan in work.plan; accumulates counts and timings into work.
  // extra_tokens: tokens the turn may add to the line, admitted against the
  // memory budget; line_tokens: the capacity the line gets before any step.
  // With run_from, a plan that ends by prefilling the history's last tokens
  // (the model's own unrun tail; with strategy translate, also the native tail
  // or a span that could not be translated) stops before them: *run_from is
  // where they begin (upto when nothing is left), and the caller runs them
  // together with the turn's prompt, in one pass over the line instead of two.
  absl::Status Handover(Work& work, int model, int64_t upto, int64_t extra_tokens,
                        int64_t line_tokens, int64_t* run_from = nullptr);
  // Translates `taps` (the writer's, on the target's tokens [begin, end)) into
  // `line`, which holds [0, begin): the pair's translator, the native-depth
  // dial, sets *hybrid when the dial ran.
  absl::Status TranslateInto(Work& work, int source, int model, KvCache& line, int64_t begin,
                             int64_t end, KvTaps& taps, bool* hybrid);
  // A translate step whose writer reads another tokenizer: the part of
  // [step.begin, step.end) of the target's stream that aligns with what the
  // writer's line holds natively (router/streams.h), and the writer's taps
  // resampled onto those target tokens (undefined when nothing aligns).
  struct CrossSpan {
    AlignedSpan aligned;
    KvTaps taps;
  };
  absl::StatusOr<CrossSpan> AlignWriter(Work& work, const PlanStep& step, int model);
  // Whether the pair's translator may be used now (QualityGate::Open,
  // reporting a reopened pair); `why` says why not.
  bool GateOpen(int source, int target, std::string* why) const;
  // A repaired switch's score: the metric, then the gate.
  void OnFidelity(int source, int target, double nats_per_token, int64_t tokens,
                  bool first_token_differs);

  std::vector<std::unique_ptr<Slot>> models_;
  std::vector<std::string> names_;
  std::vector<LoadedTranslator> translators_;
  std::vector<std::vector<const LoadedTranslator*>> by_pair_;  // [source][target], in translators_
  std::unique_ptr<Tokenizer> tokenizer_;  // group 0's
  ChatTemplateKind chat_template_ = ChatTemplateKind::kQwen3;
  // The models that read one tokenizer.
  struct Group {
    const Tokenizer* tokenizer = nullptr;  // tokenizer_ or an owned one in tokenizers_
    // The smallest embedding of the group's models: a turn's ids must stay
    // below it.
    int64_t min_vocab = 0;
    // What a reply may sample: below min_vocab and the tokenizer's ids
    // (GenerateOptions::vocab_limit).
    int64_t sample_vocab = 0;
    // The template's end-of-turn token (StopToken), when the tokenizer has it.
    std::optional<int64_t> turn_stop;
    std::vector<int64_t> stop_ids;
  };
  std::vector<Group> groups_;
  std::vector<int> group_of_;  // per model
  std::vector<std::unique_ptr<Tokenizer>> tokenizers_;  // groups 1.. own theirs
  RouterConfig config_;
  CacheStore* store_ = nullptr;
  TurnObserver* observer_ = nullptr;
  TurnObserver null_observer_;
  std::unique_ptr<QualityGate> gate_;
  // Declared after models_: destroyed first, so no repair chunk outlives an
  // engine loop.
  std::unique_ptr<Repairer> repair_;
};

}  // namespace kvl::router
