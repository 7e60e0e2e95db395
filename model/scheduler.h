// Continuous batching for one model: one thread (the model's engine loop)
// runs steps, each one forward over every active request of that model
// (Engine::ForwardBatch): the next token of every decoding request and prefill
// chunks of new ones, under a per-step token budget. A long prompt is cut
// into chunks, so it delays the others' next token by at most one chunk; a
// request that arrives mid-generation joins at the next step.
//
// Requests are served in arrival order (admission is FIFO; a request waits
// only while the step's budget or max_running is spent). Background requests
// (the router's repair) run only in steps where no interactive request is
// waiting or prefilling, at most background_step_tokens per step.
//
// Per request the result is what Engine::Generate / Prefill give for the same
// line and ids, up to the summation order of the batched GEMMs and of the
// prefill's chunking (tests bound the logits' difference and check greedy
// tokens are identical): same sampling, stop tokens, stop strings, max_tokens,
// cancellation (on_token returning false, or GenerateOptions::cancelled) and
// roll-back of the line on error.
//
// Threads: Generate and Prefill block the calling thread until the request
// finishes; any number of threads may call them at once, each with its own
// cache line (a line must not be used elsewhere until the call returns).
// on_token, token_text, on_admitted and cancelled run on the engine loop's
// thread and must not block. While a scheduler runs, only it drives the
// engine's decoder for generation; Decoder::Forward on other lines from other
// threads stays safe (model/decoder.h) but competes for the cores.
//
// The scheduler synchronises with std::mutex / std::condition_variable, not
// absl::Mutex: ThreadSanitizer sees pthread, but not the uninstrumented
// shared libabsl (experiments/tsan_scheduler/README.md, scripts/ci/tsan_check.sh).
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/engine.h"
#include "model/kv_cache.h"

namespace kvl {

struct SchedulerOptions {
  // Tokens one step runs, all rows together (decode tokens first, then
  // prefill chunks). A prompt chunk is also bounded by the engine's
  // prefill_chunk.
  int64_t max_step_tokens = 256;
  // Requests active at once (decoding or prefilling); more wait.
  int64_t max_running = 64;
  // Requests waiting to start; past it a new one is refused at once with
  // ResourceExhausted. 0: unbounded.
  int64_t max_waiting = 0;
  // Tokens of background requests in one step.
  int64_t background_step_tokens = 64;
};

enum class Priority { kInteractive, kBackground };

// What one step ran, for metrics.
struct StepStats {
  int64_t rows = 0;         // requests in the forward
  int64_t decode_rows = 0;  // of them, one generated token each
  int64_t tokens = 0;       // tokens run, all rows
  double seconds = 0;       // the forward and sampling
};

class BatchScheduler {
 public:
  struct Callbacks {
    // After each step.
    std::function<void(const StepStats&)> on_step;
    // Requests active and waiting changed (from any thread).
    std::function<void(int running, int waiting)> on_queue;
  };

  // Starts the engine loop. The engine must outlive the scheduler.
  BatchScheduler(Engine& engine, SchedulerOptions options, Callbacks callbacks = {});
  // Stops the loop: requests still active or waiting fail with Unavailable.
  ~BatchScheduler();
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  // Whether `status` is a request's refusal because max_waiting requests
  // already wait (ResourceExhausted, marked with a payload), as opposed to any
  // other ResourceExhausted from the engine.
  static bool IsQueueFull(const absl::Status& status);

  // Engine::Generate's contract, run in the batch. ResourceExhausted at once
  // (nothing changed) when max_waiting requests already wait (IsQueueFull).
  absl::StatusOr<GenerateResult> Generate(KvCache& cache, const std::vector<int64_t>& prompt_ids,
                                          const GenerateOptions& options,
                                          Priority priority = Priority::kInteractive);
  // A prefill's counterparts of GenerateOptions::on_admitted and cancelled
  // (a cancelled prefill fails with Cancelled, its line rolled back).
  struct Hooks {
    std::function<void()> on_admitted;
    std::function<bool()> cancelled;
  };
  // Engine::Prefill's contract (logits [V], or [T, V] with all_logits), run in
  // the batch; chunked like any prompt.
  absl::StatusOr<at::Tensor> Prefill(KvCache& cache, const std::vector<int64_t>& ids,
                                     bool all_logits = false,
                                     Priority priority = Priority::kInteractive,
                                     const Hooks& hooks = {});

  // Runs `pass` on the engine loop's thread before its next step and blocks
  // until it has run: a model pass that is neither a prefill nor a
  // generation (the router's native-depth dial, Engine::ForwardLayers), so
  // that only the loop drives the engine. Passes run in arrival order, ahead
  // of the step being built. Unavailable when the scheduler is stopping;
  // Cancelled when hooks.cancelled says so before it runs; else the pass's
  // own status.
  absl::Status RunPass(const std::function<absl::Status(Engine&)>& pass, const Hooks& hooks = {});

  int running() const;
  int waiting() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Request;
  struct PassRequest;
  absl::Status Submit(Request& request);
  // Runs the passes queued so far (the loop's thread).
  void RunPasses();
  void Loop();
  // Builds the next step from active_ and the queue; false when there is
  // nothing to run (stopping, or everything waiting was cancelled).
  bool BuildStep(std::vector<Request*>* step_rows, std::vector<int64_t>* step_tokens);
  void RunStep(const std::vector<Request*>& rows, const std::vector<int64_t>& tokens);
  void Finish(Request* request, absl::Status status);
  void ReportQueue();

  Engine& engine_;
  const SchedulerOptions options_;
  const Callbacks callbacks_;

  // mu_ guards waiting_, passes_, n_active_ and stop_ (no ABSL_GUARDED_BY: clang's
  // thread-safety analysis rejects libstdc++'s unannotated std::mutex).
  // work_ wakes the idle loop when a request or pass queues or stop_ is set.
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::deque<Request*> waiting_;
  std::deque<PassRequest*> passes_;
  int n_active_ = 0;
  bool stop_ = false;
  // The loop thread's own (no lock): requests admitted, in admission order.
  std::vector<Request*> active_;
  std::thread thread_;
};

}  // namespace kvl
