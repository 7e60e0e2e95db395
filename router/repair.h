// Background repair of translated cache lines.
//
// After a turn that leaves a line with translated spans, the repair thread
// recomputes that line natively from its first translated token, on a copy,
// a chunk of kChunkTokens at a time, as background requests of the model's
// engine loop (model/scheduler.h: they run only in steps where no turn waits
// or prefills on that model). When the copy has caught up with the line it is
// swapped in under a short background lease (a turn boundary: never while a
// turn holds the session). After the swap the line holds what a native
// prefill of the same history would, so every later turn reads the same cache
// as after a re-prefill. A turn that starts before the swap reads the
// translated line; the tokens it adds are caught up before the swap.
//
// The repair also scores a translated switch turn's reply on the native line
// (FidelityProbe): the mean of log p_translated - log p_native over its
// tokens goes to Context::on_fidelity (the router's metric and quality gate).
//
// Waiting is on completions only: for a chunk, the scheduler's request; for a
// session a turn holds, the end of a turn (TurnEnded); in idle-only mode, the
// last running turn's end; for a turn that finds the repair holding its
// session, the end of that swap (BeginTurn).
//
// Threads: one repair thread (none with RepairMode::kOff). Every public
// method is thread-safe. Destruction stops the thread: a chunk in flight is
// cancelled, queued lines are dropped (they stay translated, as without
// repair). The schedulers and the store must outlive the Repairer.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache_store/cache_store.h"
#include "model/scheduler.h"
#include "router/observer.h"
#include "router/policy.h"

namespace kvl::router {

// The reply of a translated switch turn, kept until its line is repaired.
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

class Repairer {
 public:
  static constexpr int64_t kChunkTokens = 256;

  struct Context {
    CacheStore* store = nullptr;
    // Per model, its engine loop; the repair's chunks run there.
    std::vector<BatchScheduler*> schedulers;
    std::vector<std::string> model_names;  // for logs
    // Per model, the tokenizer group whose stream its line holds
    // (ConversationState); empty: all group 0.
    std::vector<int> model_groups;
    TurnObserver* observer = nullptr;      // never null
    // A probe scored completely: the reply's mean divergence (nats/token)
    // over `tokens` tokens, and whether the native line's most likely first
    // token differs from the translated line's. Called on the repair thread.
    std::function<void(int source, int target, double nats_per_token, int64_t tokens,
                       bool first_token_differs)>
        on_fidelity;
  };

  // Starts the repair thread unless `mode` is kOff.
  Repairer(RepairMode mode, Context context);
  ~Repairer();
  Repairer(const Repairer&) = delete;
  Repairer& operator=(const Repairer&) = delete;

  // A turn's bookkeeping, around its whole run: TurnStarted before it takes
  // its session, TurnEnded after its lease is released (whatever the outcome).
  void TurnStarted();
  void TurnEnded();
  // The turn's lease on the session (CacheStore::Begin). When the repair
  // holds the session for a moment (its swap), waits for that to end and
  // tries again; Aborted when another turn of the session holds it.
  absl::StatusOr<std::unique_ptr<TurnLease>> BeginTurn(const std::string& session_id);

  // Queues the session's lines of `models` (those holding translated spans)
  // and the switch's probe; called after the turn's lease has ended. No-op
  // with RepairMode::kOff.
  void Queue(const std::string& session_id, const std::vector<int>& models,
             std::optional<FidelityProbe> probe);

  // Lines queued or being repaired now.
  int64_t Backlog() const;
  // Blocks until no line is queued or being repaired (or `timeout` passes);
  // true when the backlog is empty. For tests, benchmarks and shutdown.
  bool WaitForIdle(absl::Duration timeout);

 private:
  struct Job {
    std::string session_id;
    int model = 0;
  };
  void Loop();
  // Recomputes one line and swaps it in; OK also when there is nothing left
  // to do (the session or line is gone, or is already native).
  absl::Status Repair(const Job& job);
  // In idle-only mode, waits until no turn runs; false when stopping.
  bool WaitForIdleTurns();
  // Waits until a turn ends after `seen` (turns_ended_) or the Repairer
  // stops; false when stopping.
  bool WaitForTurnEnd(uint64_t seen);
  // Records the native log-probabilities of the probes' tokens predicted by a
  // chunk's logits [n, V] (the chunk starts at history position chunk_begin).
  static void ScoreProbes(const at::Tensor& logits, int64_t chunk_begin,
                          const std::vector<int64_t>& history, std::vector<FidelityProbe>* probes);
  // on_fidelity for each probe the repair scored completely.
  void ReportFidelity(const std::vector<FidelityProbe>& probes);
  void ReportBacklog();

  const RepairMode mode_;
  const Context ctx_;
  // Also read by the scheduler's cancellation hook, on the engine loop.
  std::atomic<bool> stopping_{false};

  // mu_ guards everything below; changed_ wakes every waiter on any change.
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<FidelityProbe> probes_ ABSL_GUARDED_BY(mu_);
  int64_t in_progress_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t turns_running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t turns_ended_ ABSL_GUARDED_BY(mu_) = 0;
  // The session the repair thread holds, or is about to take, a lease on.
  std::optional<std::string> holding_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvl::router
