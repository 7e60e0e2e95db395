// The turn orchestrator: runs one chat turn of one session end to end.
//
//   1. The policy picks the model (policy.h); "cascade" starts at the
//      session's cascade level.
//   2. The model gets the history it lacks (planner.h): spans translated from
//      their native writers' lines or prefilled, per the strategy.
//   3. "cascade" only, below the last level: the model prefills the new turn
//      and scores it: when the entropy of its next-token distribution (the
//      answer's first token) exceeds routing.cascade_max_entropy, or the mean
//      log-probability of the turn's tokens is below
//      routing.cascade_min_mean_logprob, the
//      turn escalates to the next model, which takes over the history and the
//      turn's tokens (translated from the cheaper model where a translator
//      exists) exactly as in step 2. The session stays escalated for later
//      turns (the level never decreases).
//   4. The model prefills the rest of the turn and decodes, streaming tokens.
//   5. The history, ledger and lines are committed. On any error or
//      cancellation the session is left exactly as it was before the turn.
//
// History layout: the rendered conversation as one token stream, built
// incrementally (model/chat_template.h): [system preamble] then per turn
// RenderUserTurn(content) + generated tokens (+ the stop token) +
// CloseAssistantTurn. The ledger attributes a turn's tokens (template and
// user text included) to the model that ran them natively.
//
// Thread-safety: Router is thread-safe. RunTurn blocks its calling thread for
// the whole turn (never call it from a gRPC reaction). Each model's engine is
// driven by one thread at a time (a per-model mutex, held for one model's part
// of a turn; at most one engine mutex is held at once, so turns cannot
// deadlock); turns of different sessions on different models run in parallel.
#pragma once

#include <atomic>
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
#include "absl/synchronization/mutex.h"
#include "cache_store/cache_store.h"
#include "model/engine.h"
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
};

struct TurnOptions {
  std::string user_message;
  std::optional<Policy> policy;    // unset: the configured policy
  int explicit_model = -1;         // the request's model, -1 when none
  std::optional<Strategy> strategy;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  // Polled between steps and after every token; true stops the turn, which
  // then fails with Cancelled and leaves the session unchanged.
  std::function<bool()> cancelled;
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

  // Runs one turn. NotFound (unknown session), Aborted (a turn of the session
  // is already running), ResourceExhausted (cache budget), Cancelled,
  // OutOfRange (the conversation would exceed a model's context), or the
  // engine's or translator's error; the session is unchanged on any error.
  absl::StatusOr<TurnResult> RunTurn(const std::string& session_id, const TurnOptions& options,
                                     const TurnCallbacks& callbacks);

 private:
  struct Slot {
    LoadedModel loaded;
    int64_t bytes_per_token = 0;
    absl::Mutex mu;  // one thread drives the engine at a time
  };
  struct Work;  // one turn's working state

  Router() = default;
  // Brings `model`'s line to hold work.history[0, upto) per `strategy`;
  // accumulates counts and timings into work. Caller holds the model's mutex.
  // extra_tokens: tokens the turn may add to the line, admitted against the
  // memory budget; line_tokens: the capacity the line gets before any step.
  // With run_from, a plan that ends by prefilling the history's last tokens
  // (the model's own unrun tail; with strategy translate, also the native tail
  // or a span that could not be translated) stops before them: *run_from is
  // where they begin (upto when nothing is left), and the caller runs them
  // together with the turn's prompt, in one pass over the line instead of two.
  absl::Status Handover(Work& work, int model, Strategy strategy, int64_t upto,
                        int64_t extra_tokens, int64_t line_tokens, HandoverPlan* plan_out,
                        int64_t* run_from = nullptr);

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
};

}  // namespace kvl::router
