// What the router reports as it works: the metric sink the server implements
// (server/metrics.h). Calls come from turn threads, the models' engine loops
// and the repair thread; implementations must be cheap, thread-safe and must
// not call back into the router. The observer must outlive the Router: an
// engine loop reports a step after the requests in it have finished, so a
// call can come after RunTurn has returned.
#pragma once

#include <cstdint>
#include <string>

#include "router/config.h"
#include "router/policy.h"

namespace kvl::router {

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
  // engine time (router/repair.h).
  virtual void OnRepair(int model, int64_t tokens, double seconds) {}
  // Lines queued for repair or being repaired, after each change.
  virtual void OnRepairBacklog(int64_t lines) {}
  // Requests running in and waiting for a model's engine loop changed
  // (batching.max_running bounds the running ones; 1 without batching).
  virtual void OnModelQueue(int model, int running, int waiting) {}
  // A batched engine step ran `rows` requests (`decode_rows` of them decoding
  // one token each), `tokens` tokens in all, in `seconds`.
  virtual void OnBatchStep(int model, int64_t rows, int64_t decode_rows, int64_t tokens,
                           double seconds) {}
  // A turn was refused by an admission limit (config.h, AdmissionLimits):
  // Setting::kMaxWaitingTurns or kMaxHistoryTokens.
  virtual void OnRejected(Setting limit) {}
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
  // holds `done` of the `target` tokens it is catching up with. Called on the
  // repair thread with no lock held (it may block: tests pause the repair here).
  virtual void OnRepairChunk(int model, int64_t done, int64_t target) {}
};

}  // namespace kvl::router
