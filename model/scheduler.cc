#include "model/scheduler.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvl {
namespace {

// Marks BatchScheduler's refusal of a request for a full waiting queue.
constexpr char kQueueFullPayload[] = "type.kvlingo.dev/kvl.BatchScheduler.QueueFull";

// A request's end, signalled once by the loop to the thread waiting in
// Submit. Notify holds the lock while it signals, so the waiter cannot see
// `done_` and free the request before notify_all has returned.
class Completion {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
};

}  // namespace

struct BatchScheduler::Request {
  KvCache* cache = nullptr;
  const std::vector<int64_t>* ids = nullptr;  // the prompt
  int64_t n_start = 0;                        // the line's length before it
  Priority priority = Priority::kInteractive;
  // Generation; null for a prefill.
  const GenerateOptions* options = nullptr;
  std::optional<GenerationState> state;
  // Prefill: keep every position's logits, or only the last.
  bool all_logits = false;
  const Hooks* hooks = nullptr;  // prefill

  size_t fed = 0;         // prompt tokens run so far
  bool decoding = false;  // the prompt has run; `next` runs each step
  int64_t next = -1;
  bool admitted = false;
  std::vector<at::Tensor> logit_rows;  // prefill with all_logits
  at::Tensor last_logits;              // prefill: the last row's, [V]

  absl::Status status;
  std::optional<GenerateResult> result;
  Completion done;

  bool Cancelled() const {
    if (hooks != nullptr && hooks->cancelled && hooks->cancelled()) return true;
    return options != nullptr && options->cancelled && options->cancelled();
  }
  bool PromptDone() const { return fed >= ids->size(); }
};

struct BatchScheduler::PassRequest {
  const std::function<absl::Status(Engine&)>* pass = nullptr;
  const Hooks* hooks = nullptr;
  absl::Status status;
  Completion done;
};

BatchScheduler::BatchScheduler(Engine& engine, SchedulerOptions options, Callbacks callbacks)
    : engine_(engine), options_(options), callbacks_(std::move(callbacks)) {
  thread_ = std::thread([this] { Loop(); });
}

BatchScheduler::~BatchScheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_one();
  thread_.join();
}

int BatchScheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_active_;
}

int BatchScheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiting_.size());
}

void BatchScheduler::ReportQueue() {
  if (!callbacks_.on_queue) return;
  int running = 0, waiting = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = n_active_;
    waiting = static_cast<int>(waiting_.size());
  }
  callbacks_.on_queue(running, waiting);
}

bool BatchScheduler::IsQueueFull(const absl::Status& status) {
  return absl::IsResourceExhausted(status) && status.GetPayload(kQueueFullPayload).has_value();
}

absl::Status BatchScheduler::Submit(Request& request) {
  KVL_RETURN_IF_ERROR(engine_.CheckIds(*request.cache, *request.ids));
  request.n_start = request.cache->Length();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("the model's scheduler is shutting down");
    if (options_.max_waiting > 0 &&
        static_cast<int64_t>(waiting_.size()) >= options_.max_waiting) {
      absl::Status full = absl::ResourceExhaustedError(absl::StrCat(
          waiting_.size(), " requests already wait for this model (at most ",
          options_.max_waiting, ")"));
      full.SetPayload(kQueueFullPayload, absl::Cord("1"));
      return full;
    }
    waiting_.push_back(&request);
  }
  work_.notify_one();
  ReportQueue();
  request.done.Wait();
  return request.status;
}

absl::StatusOr<GenerateResult> BatchScheduler::Generate(KvCache& cache,
                                                        const std::vector<int64_t>& prompt_ids,
                                                        const GenerateOptions& options,
                                                        Priority priority) {
  KVL_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  Request request;
  request.cache = &cache;
  request.ids = &prompt_ids;
  request.priority = priority;
  request.options = &options;
  request.state.emplace(options);
  KVL_RETURN_IF_ERROR(Submit(request));
  return *std::move(request.result);
}

absl::StatusOr<at::Tensor> BatchScheduler::Prefill(KvCache& cache, const std::vector<int64_t>& ids,
                                                   bool all_logits, Priority priority,
                                                   const Hooks& hooks) {
  Request request;
  request.cache = &cache;
  request.ids = &ids;
  request.priority = priority;
  request.all_logits = all_logits;
  request.hooks = &hooks;
  KVL_RETURN_IF_ERROR(Submit(request));
  if (!all_logits) return request.last_logits;
  c10::InferenceMode guard;
  return at::cat(request.logit_rows, 0);
}

absl::Status BatchScheduler::RunPass(const std::function<absl::Status(Engine&)>& pass,
                                    const Hooks& hooks) {
  PassRequest request;
  request.pass = &pass;
  request.hooks = &hooks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("the model's scheduler is shutting down");
    passes_.push_back(&request);
  }
  work_.notify_one();
  request.done.Wait();
  return request.status;
}

void BatchScheduler::RunPasses() {
  std::deque<PassRequest*> passes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    passes.swap(passes_);
  }
  for (PassRequest* p : passes) {
    if (p->hooks->cancelled && p->hooks->cancelled()) {
      p->status = absl::CancelledError("the pass was cancelled");
    } else {
      if (p->hooks->on_admitted) p->hooks->on_admitted();
      p->status = (*p->pass)(engine_);
    }
    p->done.Notify();  // the caller may free the request from here on
  }
}

void BatchScheduler::Finish(Request* request, absl::Status status) {
  if (!status.ok()) {
    (void)request->cache->Rollback(request->n_start);
    request->result.reset();
  }
  request->status = std::move(status);
  active_.erase(std::find(active_.begin(), active_.end(), request));
  {
    std::lock_guard<std::mutex> lock(mu_);
    --n_active_;
  }
  request->done.Notify();  // the caller may free the request from here on
}

bool BatchScheduler::BuildStep(std::vector<Request*>* rows, std::vector<int64_t>* tokens) {
  rows->clear();
  tokens->clear();
  int64_t budget = options_.max_step_tokens;
  const int64_t chunk = engine_.options().prefill_chunk;
  const int64_t max_pos = engine_.config().max_position_embeddings;
  bool interactive_prefill = false;
  // Cancelled requests leave before the step; a copy, since Finish edits
  // active_.
  for (Request* r : std::vector<Request*>(active_)) {
    if (r->Cancelled()) {
      if (r->options != nullptr) {
        // As Engine::Generate: a cancelled generation ends with what it has.
        r->result = r->state->Finish();
        r->result->finish_reason = FinishReason::kCancelled;
        Finish(r, absl::OkStatus());
      } else {
        Finish(r, absl::CancelledError("the prefill was cancelled"));
      }
    } else if (r->decoding && r->cache->Length() + 1 > max_pos) {
      Finish(r, absl::OutOfRangeError(absl::StrCat(
                    "context of ", r->cache->Length() + 1,
                    " tokens exceeds max_position_embeddings ", max_pos)));
    }
  }
  // 1. The next token of every decoding request.
  for (Request* r : active_) {
    if (r->decoding && budget > 0) {
      rows->push_back(r);
      tokens->push_back(1);
      --budget;
    }
  }
  // 2. Prompts already started, then 3. new requests, in arrival order.
  int64_t background_budget = options_.background_step_tokens;
  const auto add_prefill = [&](Request* r) {
    int64_t n = std::min<int64_t>({static_cast<int64_t>(r->ids->size() - r->fed), chunk, budget});
    if (r->priority == Priority::kBackground) n = std::min(n, background_budget);
    if (n <= 0) return;
    rows->push_back(r);
    tokens->push_back(n);
    budget -= n;
    if (r->priority == Priority::kBackground) {
      background_budget -= n;
    } else {
      interactive_prefill = true;
    }
  };
  for (Request* r : active_) {
    if (!r->decoding && r->priority == Priority::kInteractive) add_prefill(r);
  }
  std::vector<Request*> cancelled;
  bool interactive_waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Request* r = *it;
      if (r->Cancelled()) {
        cancelled.push_back(r);
        it = waiting_.erase(it);
        continue;
      }
      if (r->priority == Priority::kBackground) {
        ++it;
        continue;
      }
      if (budget <= 0 || n_active_ >= options_.max_running) {
        interactive_waiting = true;
        break;
      }
      active_.push_back(r);
      ++n_active_;
      add_prefill(r);
      it = waiting_.erase(it);
    }
  }
  // Background work only when no interactive request waits or prefills.
  if (!interactive_waiting && !interactive_prefill) {
    for (Request* r : active_) {
      if (!r->decoding && r->priority == Priority::kBackground) add_prefill(r);
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Request* r = *it;
      if (r->priority != Priority::kBackground || budget <= 0 || background_budget <= 0 ||
          n_active_ >= options_.max_running) {
        ++it;
        continue;
      }
      active_.push_back(r);
      ++n_active_;
      add_prefill(r);
      it = waiting_.erase(it);
    }
  }
  // Background requests already admitted when nothing else can run (the
  // interactive ones wait for max_running): they free their places.
  if (rows->empty()) {
    for (Request* r : active_) {
      if (!r->decoding && r->priority == Priority::kBackground) {
        background_budget = options_.background_step_tokens;
        add_prefill(r);
      }
    }
  }
  for (Request* r : cancelled) {
    // Never admitted: nothing ran on its line.
    r->status = r->options != nullptr ? absl::OkStatus()
                                      : absl::CancelledError("the prefill was cancelled");
    if (r->options != nullptr) {
      r->result = r->state->Finish();
      r->result->finish_reason = FinishReason::kCancelled;
    }
    r->done.Notify();
  }
  if (!cancelled.empty()) ReportQueue();
  return !rows->empty();
}

void BatchScheduler::RunStep(const std::vector<Request*>& rows,
                             const std::vector<int64_t>& tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Engine::BatchRow> batch;
  batch.reserve(rows.size());
  StepStats stats;
  for (size_t i = 0; i < rows.size(); ++i) {
    Request* r = rows[i];
    if (!r->admitted) {
      r->admitted = true;
      if (r->options != nullptr && r->options->on_admitted) r->options->on_admitted();
      if (r->hooks != nullptr && r->hooks->on_admitted) r->hooks->on_admitted();
    }
    Engine::BatchRow row;
    row.cache = r->cache;
    if (r->decoding) {
      row.ids = &r->next;
      row.n_ids = 1;
      ++stats.decode_rows;
    } else {
      row.ids = r->ids->data() + r->fed;
      row.n_ids = tokens[i];
      row.all_logits = r->all_logits;
    }
    stats.tokens += row.n_ids;
    batch.push_back(row);
  }
  stats.rows = static_cast<int64_t>(rows.size());
  absl::StatusOr<std::vector<at::Tensor>> logits = engine_.ForwardBatch(batch);
  if (!logits.ok()) {
    for (Request* r : rows) Finish(r, logits.status());
    ReportQueue();
    return;
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    Request* r = rows[i];
    const at::Tensor& out = (*logits)[i];
    if (!r->decoding) {
      r->fed += static_cast<size_t>(tokens[i]);
      if (r->all_logits) r->logit_rows.push_back(out);
      if (!r->PromptDone()) continue;
      if (r->options == nullptr) {
        r->last_logits = out[out.size(0) - 1];
        Finish(r, absl::OkStatus());
        continue;
      }
      r->decoding = true;
      if (r->state->done()) {  // max_tokens 0
        r->result = r->state->Finish();
        Finish(r, absl::OkStatus());
        continue;
      }
    }
    absl::StatusOr<bool> more = r->state->Step(out[0]);
    if (!more.ok()) {
      Finish(r, more.status());
    } else if (*more) {
      r->next = r->state->last_token();
    } else {
      r->result = r->state->Finish();
      Finish(r, absl::OkStatus());
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (callbacks_.on_step) callbacks_.on_step(stats);
  ReportQueue();
}

void BatchScheduler::Loop() {
  PrepareIntraOpThread();
  std::vector<Request*> rows;
  std::vector<int64_t> tokens;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (active_.empty()) {
        work_.wait(lock, [this] { return stop_ || !waiting_.empty() || !passes_.empty(); });
      }
      if (stop_) break;
    }
    RunPasses();
    if (BuildStep(&rows, &tokens)) RunStep(rows, tokens);
  }
  // Shutting down: everything still here fails.
  const absl::Status gone = absl::UnavailableError("the model's scheduler is shutting down");
  for (Request* r : std::vector<Request*>(active_)) Finish(r, gone);
  std::deque<Request*> left;
  std::deque<PassRequest*> left_passes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(waiting_);
    left_passes.swap(passes_);
  }
  for (PassRequest* p : left_passes) {
    p->status = gone;
    p->done.Notify();
  }
  for (Request* r : left) {
    r->status = gone;
    r->done.Notify();
  }
}

}  // namespace kvl
