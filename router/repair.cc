// Background repair of translated lines (router.h, "Background repair"): a
// line that holds translated spans is recomputed natively from its first
// translated token, on a copy, and swapped in at a turn boundary. After the
// swap the line holds what a native prefill of the same history would (the
// decoder's chunked prefill, as a re-prefill computes it), so every later turn
// reads the same cache as after a re-prefill.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/wait.h"
#include "router/router.h"
#include "spdlog/spdlog.h"

namespace kvl::router {

namespace {

using Clock = std::chrono::steady_clock;

// How long the repair thread sleeps while it gives way to turns, and between
// attempts to take a session that a turn holds.
constexpr absl::Duration kYield = absl::Milliseconds(1);
constexpr absl::Duration kSessionBusyRetry = absl::Milliseconds(5);

}  // namespace

void Router::ScoreProbes(const at::Tensor& logits, int64_t chunk_begin,
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

void Router::ReportFidelity(const std::vector<FidelityProbe>& probes) {
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
    observer_->OnSwitchFidelity(probe.source, probe.target, sum / n, n, differs);
    FeedGate(probe.source, probe.target, sum / n);
    spdlog::debug("switch fidelity {} -> {} in session {}: {:.4f} nats/token over {} tokens{}",
                  names_[probe.source], names_[probe.target], probe.session_id, sum / n, n,
                  differs ? ", first token differs" : "");
  }
}

bool Router::GateOpen(int source, int target, std::string* why) const {
  bool reopened = false;
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    Gate& gate = gates_[static_cast<size_t>(source) * n_models() + target];
    if (!gate.closed) return true;
    if (Clock::now() < gate.closed_until) {
      if (why != nullptr) *why = gate.reason;
      return false;
    }
    // The cool-down is over: used again, on probation (an empty window).
    gate.closed = false;
    gate.window.clear();
    reopened = true;
  }
  if (reopened) {
    spdlog::info("quality gate: translator {} -> {} is used again after its cool-down, on "
                 "probation", names_[source], names_[target]);
    observer_->OnGate(source, target, true, "cool-down over");
  }
  return true;
}

void Router::FeedGate(int source, int target, double nats_per_token) {
  if (!(routing_.gate_max_divergence < std::numeric_limits<double>::infinity())) return;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(gate_mu_);
    Gate& gate = gates_[static_cast<size_t>(source) * n_models() + target];
    if (gate.closed) return;
    gate.window.push_back(nats_per_token);
    while (static_cast<int64_t>(gate.window.size()) > routing_.gate_window) gate.window.pop_front();
    if (static_cast<int64_t>(gate.window.size()) < routing_.gate_min_samples) return;
    double mean = 0;
    for (double x : gate.window) mean += x;
    mean /= static_cast<double>(gate.window.size());
    if (mean <= routing_.gate_max_divergence) return;
    gate.closed = true;
    gate.closed_until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(routing_.gate_cooldown_seconds));
    gate.reason = absl::StrCat("closed by the quality gate: mean switch divergence ",
                               absl::SixDigits(mean), " nats/token over the last ",
                               gate.window.size(), " repaired switches exceeds ",
                               absl::SixDigits(routing_.gate_max_divergence), " (for ",
                               absl::SixDigits(routing_.gate_cooldown_seconds), " s)");
    gate.window.clear();
    reason = gate.reason;
  }
  spdlog::warn("quality gate: translator {} -> {} {}; its switches re-prefill", names_[source],
               names_[target], reason);
  observer_->OnGate(source, target, false, reason);
}

void Router::StartRepairThread() {
  repair_thread_ = std::thread([this] { RepairLoop(); });
}

void Router::StopRepairThread() {
  {
    std::lock_guard<std::mutex> lock(repair_mu_);
    repair_stop_ = true;
  }
  repair_changed_.notify_all();
  if (repair_thread_.joinable()) repair_thread_.join();
}

void Router::QueueRepairs(const std::string& session_id, const std::vector<int>& models,
                          std::optional<FidelityProbe> probe) {
  int64_t backlog = 0;
  {
    std::lock_guard<std::mutex> lock(repair_mu_);
    if (repair_stop_) return;
    if (probe) {
      probe->session_id = session_id;
      probe->native.assign(probe->tokens.size(), std::numeric_limits<double>::quiet_NaN());
      probes_.push_back(*std::move(probe));
    }
    for (int m : models) {
      const bool queued = std::any_of(repair_queue_.begin(), repair_queue_.end(),
                                      [&](const RepairJob& job) {
                                        return job.session_id == session_id && job.model == m;
                                      });
      if (!queued) repair_queue_.push_back({session_id, m});
    }
    backlog = static_cast<int64_t>(repair_queue_.size()) + repairs_in_progress_;
  }
  repair_changed_.notify_all();
  observer_->OnRepairBacklog(backlog);
}

int64_t Router::RepairBacklog() const {
  std::lock_guard<std::mutex> lock(repair_mu_);
  return static_cast<int64_t>(repair_queue_.size()) + repairs_in_progress_;
}

bool Router::WaitForRepairs(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(repair_mu_);
  return repair_changed_.wait_for(lock, WaitForTimeout(timeout), [this] {
    return repair_queue_.empty() && repairs_in_progress_ == 0;
  });
}

void Router::RepairLoop() {
  while (true) {
    RepairJob job;
    {
      std::unique_lock<std::mutex> lock(repair_mu_);
      repair_changed_.wait(lock, [this] { return repair_stop_ || !repair_queue_.empty(); });
      if (repair_stop_) return;
      job = std::move(repair_queue_.front());
      repair_queue_.pop_front();
      ++repairs_in_progress_;
    }
    if (absl::Status s = RepairLine(job); !s.ok()) {
      spdlog::warn("repair of session {} model {}: {}", job.session_id, names_[job.model],
                   s.ToString());
    }
    int64_t backlog = 0;
    {
      std::lock_guard<std::mutex> lock(repair_mu_);
      --repairs_in_progress_;
      backlog = static_cast<int64_t>(repair_queue_.size()) + repairs_in_progress_;
    }
    repair_changed_.notify_all();
    observer_->OnRepairBacklog(backlog);
  }
}

bool Router::WaitForRepairTurn(Slot& slot) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(repair_mu_);
      if (repair_stop_) return false;
    }
    const bool model_wanted = slot.turns_waiting.load() > 0;
    const bool busy = routing_.repair == RepairMode::kIdleOnly && turns_running_.load() > 0;
    if (!model_wanted && !busy) return true;
    absl::SleepFor(kYield);
  }
}

absl::Status Router::RepairLine(const RepairJob& job) {
  Slot& slot = *models_[job.model];
  Engine& engine = *slot.loaded.engine;
  std::unique_ptr<KvCache> copy;
  std::unique_ptr<ByteReservation> held;  // the copy's bytes, against the budget
  std::vector<int64_t> history;
  int64_t from = -1, done = 0, target = 0;
  double engine_seconds = 0;
  // The translated replies this line's repair will score.
  std::vector<FidelityProbe> probes;
  {
    std::lock_guard<std::mutex> lock(repair_mu_);
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
    // Take the session for a moment: read what to repair, or swap the repaired
    // copy in once it has caught up with the line.
    {
      std::lock_guard<std::mutex> swap(swap_mu_);
      // A background lease: the repair does not restart the session's idle timer.
      absl::StatusOr<std::unique_ptr<TurnLease>> lease =
          store_->Begin(job.session_id, LeaseUse::kBackground);
      if (absl::IsNotFound(lease.status())) return absl::OkStatus();  // deleted or expired
      if (absl::IsAborted(lease.status())) {
        // A turn holds the session: retry after it (below).
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
          absl::StatusOr<std::unique_ptr<KvCache>> fresh =
              line.ClonePrefix(from, line.Capacity());
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
          if (absl::Status s = l.Reserve(std::max<int64_t>(0, copy->Bytes() - line.Bytes()));
              !s.ok()) {
            return s;
          }
          const int64_t repaired = done - from;
          copy->MarkRepaired(from);
          l.ReplaceLine(job.model, std::move(copy));
          l.AddRepaired(job.model, repaired);
          l.Commit(l.state());
          observer_->OnRepair(job.model, repaired, engine_seconds);
          ReportFidelity(probes);
          return absl::OkStatus();
        }
        history = l.state().history;  // the line holds its first `target` tokens
      }
    }
    if (copy == nullptr || done == target) {
      // The session was busy before anything was copied, or at the swap.
      {
        std::lock_guard<std::mutex> lock(repair_mu_);
        if (repair_stop_) return absl::OkStatus();
      }
      absl::SleepFor(kSessionBusyRetry);
      continue;
    }
    // Recompute [done, target) natively, a chunk at a time, giving way to turns.
    while (done < target) {
      if (!WaitForRepairTurn(slot)) return absl::OkStatus();
      const int64_t n = std::min(kRepairChunkTokens, target - done);
      const std::vector<int64_t> ids(history.begin() + done, history.begin() + done + n);
      // Every position's logits when a probe's token is predicted in this chunk.
      const bool scoring = std::any_of(probes.begin(), probes.end(), [&](const FidelityProbe& p) {
        return p.begin - 1 < done + n && p.begin - 1 + static_cast<int64_t>(p.tokens.size()) > done;
      });
      const Clock::time_point t0 = Clock::now();
      if (slot.scheduler != nullptr) {
        // Batched: a background request, run only in steps where no turn
        // waits or prefills on the model.
        BatchScheduler::Hooks hooks;
        hooks.cancelled = [this] {
          std::lock_guard<std::mutex> lock(repair_mu_);
          return repair_stop_;
        };
        absl::StatusOr<at::Tensor> logits =
            slot.scheduler->Prefill(*copy, ids, scoring, Priority::kBackground, hooks);
        if (absl::IsCancelled(logits.status())) return absl::OkStatus();
        if (!logits.ok()) return logits.status();
        if (scoring) ScoreProbes(*logits, done, history, &probes);
      } else {
        std::lock_guard<std::mutex> lock(slot.mu);
        absl::StatusOr<at::Tensor> logits = engine.Prefill(*copy, ids, scoring);
        if (!logits.ok()) return logits.status();
        if (scoring) ScoreProbes(*logits, done, history, &probes);
      }
      engine_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      done += n;
      observer_->OnRepairChunk(job.model, done, target);
    }
  }
}

}  // namespace kvl::router
