#include "router/repair.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/wait.h"
#include "spdlog/spdlog.h"

namespace kvl::router {

namespace {

using Clock = std::chrono::steady_clock;

// A session lease held by something other than a turn (a test, say) ends
// without TurnEnded: the repair looks again after this long.
constexpr auto kForeignLeaseRecheck = std::chrono::milliseconds(50);

}  // namespace

Repairer::Repairer(RepairMode mode, Context context) : mode_(mode), ctx_(std::move(context)) {
  if (mode_ != RepairMode::kOff) thread_ = std::thread([this] { Loop(); });
}

Repairer::~Repairer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stopping_.store(true);
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Repairer::TurnStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++turns_running_;
}

void Repairer::TurnEnded() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --turns_running_;
    ++turns_ended_;
  }
  changed_.notify_all();
}

absl::StatusOr<std::unique_ptr<TurnLease>> Repairer::BeginTurn(const std::string& session_id) {
  absl::StatusOr<std::unique_ptr<TurnLease>> lease = ctx_.store->Begin(session_id);
  if (!absl::IsAborted(lease.status())) return lease;
  // The repair may hold the session for its swap: wait for that to end and
  // try once more. Another turn of the session stays Aborted. (The repair
  // marks holding_ before it takes the lease and clears it after releasing
  // it, so once holding_ is not this session, the repair's lease is gone.)
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return holding_ != session_id; });
  }
  return ctx_.store->Begin(session_id);
}

void Repairer::Queue(const std::string& session_id, const std::vector<int>& models,
                     std::optional<FidelityProbe> probe) {
  if (mode_ == RepairMode::kOff) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    if (probe) {
      probe->session_id = session_id;
      probe->native.assign(probe->tokens.size(), std::numeric_limits<double>::quiet_NaN());
      probes_.push_back(*std::move(probe));
    }
    for (int m : models) {
      const bool queued = std::any_of(queue_.begin(), queue_.end(), [&](const Job& job) {
        return job.session_id == session_id && job.model == m;
      });
      if (!queued) queue_.push_back({session_id, m});
    }
  }
  changed_.notify_all();
  ReportBacklog();
}

int64_t Repairer::Backlog() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size()) + in_progress_;
}

bool Repairer::WaitForIdle(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, WaitForTimeout(timeout),
                           [this] { return queue_.empty() && in_progress_ == 0; });
}

void Repairer::ReportBacklog() { ctx_.observer->OnRepairBacklog(Backlog()); }

void Repairer::Loop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      ++in_progress_;
    }
    if (absl::Status s = Repair(job); !s.ok()) {
      spdlog::warn("repair of session {} model {}: {}", job.session_id,
                   ctx_.model_names[job.model], s.ToString());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_progress_;
      holding_.reset();
    }
    changed_.notify_all();
    ReportBacklog();
  }
}

bool Repairer::WaitForIdleTurns() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] {
    return stop_ || mode_ != RepairMode::kIdleOnly || turns_running_ == 0;
  });
  return !stop_;
}

bool Repairer::WaitForTurnEnd(uint64_t seen) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, kForeignLeaseRecheck, [&] { return stop_ || turns_ended_ != seen; });
  return !stop_;
}

void Repairer::ScoreProbes(const at::Tensor& logits, int64_t chunk_begin,
                           const std::vector<int64_t>& history,
                           std::vector<FidelityProbe>* probes) {
  c10::InferenceMode guard;
  const at::Tensor logprobs = at::log_softmax(logits.to(at::kFloat), -1);  // [n, V]
  const int64_t n = logprobs.size(0);
  for (FidelityProbe& probe : *probes) {
    for (size_t i = 0; i < probe.tokens.size(); ++i) {
      const int64_t pos = probe.begin + static_cast<int64_t>(i);
      const int64_t row = pos - 1 - chunk_begin;  // the logits that predict history[pos]
      if (row < 0 || row >= n) continue;
      if (pos >= static_cast<int64_t>(history.size()) || history[pos] != probe.tokens[i]) continue;
      probe.native[i] = logprobs[row][probe.tokens[i]].item<double>();
      if (i == 0) probe.native_first = logprobs[row].argmax().item<int64_t>();
    }
  }
}

void Repairer::ReportFidelity(const std::vector<FidelityProbe>& probes) {
  for (const FidelityProbe& probe : probes) {
    double sum = 0;
    bool complete = !probe.tokens.empty();
    for (size_t i = 0; i < probe.tokens.size(); ++i) {
      if (std::isnan(probe.native[i])) complete = false;
      sum += probe.translated[i] - probe.native[i];
    }
    if (!complete) continue;  // the line was cut or replaced before the reply
    const int64_t n = static_cast<int64_t>(probe.tokens.size());
    const bool differs = probe.first_greedy >= 0 && probe.native_first != probe.first_greedy;
    spdlog::debug("switch fidelity {} -> {} in session {}: {:.4f} nats/token over {} tokens{}",
                  ctx_.model_names[probe.source], ctx_.model_names[probe.target],
                  probe.session_id, sum / n, n, differs ? ", first token differs" : "");
    if (ctx_.on_fidelity) ctx_.on_fidelity(probe.source, probe.target, sum / n, n, differs);
  }
}

absl::Status Repairer::Repair(const Job& job) {
  BatchScheduler& scheduler = *ctx_.schedulers[job.model];
  std::unique_ptr<KvCache> copy;
  std::unique_ptr<ByteReservation> held;  // the copy's bytes, against the budget
  std::vector<int64_t> history;
  int64_t from = -1, done = 0, target = 0;
  double engine_seconds = 0;
  // The translated replies this line's repair will score.
  std::vector<FidelityProbe> probes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = probes_.begin(); it != probes_.end();) {
      if (it->session_id == job.session_id && it->target == job.model) {
        probes.push_back(std::move(*it));
        it = probes_.erase(it);
      } else {
        ++it;
      }
    }
  }
  while (true) {
    // Take the session for a moment: read what to repair, or swap the
    // repaired copy in once it has caught up with the line.
    uint64_t turns_seen = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      holding_ = job.session_id;
      turns_seen = turns_ended_;
    }
    bool busy = false;
    {
      // A background lease: the repair does not restart the session's idle timer.
      absl::StatusOr<std::unique_ptr<TurnLease>> lease =
          ctx_.store->Begin(job.session_id, LeaseUse::kBackground);
      if (absl::IsNotFound(lease.status())) return absl::OkStatus();  // deleted or expired
      if (absl::IsAborted(lease.status())) {
        busy = true;  // a turn holds the session: wait for a turn to end (below)
      } else if (!lease.ok()) {
        return lease.status();
      } else {
        TurnLease& l = **lease;
        if (!l.HasForeignSpans(job.model)) return absl::OkStatus();  // evicted or native again
        KvCache& line = *l.line(job.model);
        const int64_t first = line.FirstForeignToken();
        if (copy == nullptr || first != from || line.Length() < done) {
          // Start (again: the line was replaced since the copy was taken).
          // The copy's memory counts against the budget from here to the swap.
          from = first;
          held.reset();
          absl::StatusOr<std::unique_ptr<ByteReservation>> reserved =
              l.ReserveDetached(line.Bytes());
          if (!reserved.ok()) return reserved.status();
          held = *std::move(reserved);
          absl::StatusOr<std::unique_ptr<KvCache>> fresh = line.ClonePrefix(from, line.Capacity());
          if (!fresh.ok()) return fresh.status();
          copy = *std::move(fresh);
          done = from;
          for (FidelityProbe& probe : probes) {
            std::fill(probe.native.begin(), probe.native.end(),
                      std::numeric_limits<double>::quiet_NaN());
          }
        }
        target = line.Length();
        if (done == target) {
          // Caught up: the copy holds the line's tokens, all computed natively.
          // It becomes the line: its bytes are the line's from here (the
          // lease re-measures them), the old line's are freed.
          held.reset();
          KVL_RETURN_IF_ERROR(l.Reserve(std::max<int64_t>(0, copy->Bytes() - line.Bytes())));
          const int64_t repaired = done - from;
          copy->MarkRepaired(from);
          l.ReplaceLine(job.model, std::move(copy));
          l.AddRepaired(job.model, repaired);
          l.Commit(l.state());
          ctx_.observer->OnRepair(job.model, repaired, engine_seconds);
          ReportFidelity(probes);
          return absl::OkStatus();
        }
        // The line holds the first `target` tokens of its model's stream.
        history = StreamIds(l.state(), ctx_.model_groups.empty() ? 0 : ctx_.model_groups[job.model]);
      }
    }  // the lease ends here
    {
      std::lock_guard<std::mutex> lock(mu_);
      holding_.reset();
    }
    changed_.notify_all();  // a turn may be waiting for the lease
    if (busy) {
      if (!WaitForTurnEnd(turns_seen)) return absl::OkStatus();
      continue;
    }
    // Recompute [done, target) natively, a chunk at a time, as background
    // requests of the model's engine loop (turns on the model go first).
    while (done < target) {
      if (!WaitForIdleTurns()) return absl::OkStatus();
      const int64_t n = std::min(kChunkTokens, target - done);
      const std::vector<int64_t> ids(history.begin() + done, history.begin() + done + n);
      // Every position's logits when a probe's token is predicted in this chunk.
      const bool scoring = std::any_of(probes.begin(), probes.end(), [&](const FidelityProbe& p) {
        return p.begin - 1 < done + n && p.begin - 1 + static_cast<int64_t>(p.tokens.size()) > done;
      });
      const Clock::time_point t0 = Clock::now();
      BatchScheduler::Hooks hooks;
      hooks.cancelled = [this] { return stopping_.load(); };
      absl::StatusOr<at::Tensor> logits =
          scheduler.Prefill(*copy, ids, scoring, Priority::kBackground, hooks);
      if (absl::IsCancelled(logits.status())) return absl::OkStatus();
      if (!logits.ok()) return logits.status();
      if (scoring) ScoreProbes(*logits, done, history, &probes);
      engine_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      done += n;
      ctx_.observer->OnRepairChunk(job.model, done, target);
    }
  }
}

}  // namespace kvl::router
