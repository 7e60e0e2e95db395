// Background repair of translated lines (router.h, "Background repair"): a
// line that holds translated spans is recomputed natively from its first
// translated token, on a copy, and swapped in at a turn boundary. After the
// swap the line holds what a native prefill of the same history would (the
// decoder's chunked prefill, as a re-prefill computes it), so every later turn
// reads the same cache as after a re-prefill.
#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
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

void Router::StartRepairThread() {
  repair_thread_ = std::thread([this] { RepairLoop(); });
}

void Router::StopRepairThread() {
  {
    absl::MutexLock lock(&repair_mu_);
    repair_stop_ = true;
  }
  if (repair_thread_.joinable()) repair_thread_.join();
}

void Router::QueueRepairs(const std::string& session_id, const std::vector<int>& models) {
  int64_t backlog = 0;
  {
    absl::MutexLock lock(&repair_mu_);
    if (repair_stop_) return;
    for (int m : models) {
      const bool queued = std::any_of(repair_queue_.begin(), repair_queue_.end(),
                                      [&](const RepairJob& job) {
                                        return job.session_id == session_id && job.model == m;
                                      });
      if (!queued) repair_queue_.push_back({session_id, m});
    }
    backlog = static_cast<int64_t>(repair_queue_.size()) + repairs_in_progress_;
  }
  observer_->OnRepairBacklog(backlog);
}

int64_t Router::RepairBacklog() const {
  absl::MutexLock lock(&repair_mu_);
  return static_cast<int64_t>(repair_queue_.size()) + repairs_in_progress_;
}

bool Router::WaitForRepairs(absl::Duration timeout) {
  absl::MutexLock lock(&repair_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(repair_mu_) {
    return repair_queue_.empty() && repairs_in_progress_ == 0;
  };
  return repair_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void Router::RepairLoop() {
  while (true) {
    RepairJob job;
    {
      absl::MutexLock lock(&repair_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(repair_mu_) {
        return repair_stop_ || !repair_queue_.empty();
      };
      repair_mu_.Await(absl::Condition(&ready));
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
      absl::MutexLock lock(&repair_mu_);
      --repairs_in_progress_;
      backlog = static_cast<int64_t>(repair_queue_.size()) + repairs_in_progress_;
    }
    observer_->OnRepairBacklog(backlog);
  }
}

bool Router::WaitForRepairTurn(Slot& slot) {
  while (true) {
    {
      absl::MutexLock lock(&repair_mu_);
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
  std::vector<int64_t> history;
  int64_t from = -1, done = 0, target = 0;
  double engine_seconds = 0;
  while (true) {
    // Take the session for a moment: read what to repair, or swap the repaired
    // copy in once it has caught up with the line.
    {
      absl::MutexLock swap(&swap_mu_);
      absl::StatusOr<std::unique_ptr<TurnLease>> lease = store_->Begin(job.session_id);
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
          from = first;
          absl::StatusOr<std::unique_ptr<KvCache>> fresh =
              line.ClonePrefix(from, line.Capacity());
          if (!fresh.ok()) return fresh.status();
          copy = *std::move(fresh);
          done = from;
        }
        target = line.Length();
        if (done == target) {
          // Caught up: the copy holds the line's tokens, all computed natively.
          if (absl::Status s = l.Reserve(std::max<int64_t>(0, copy->Bytes() - line.Bytes()));
              !s.ok()) {
            return s;
          }
          const int64_t repaired = done - from;
          l.ReplaceLine(job.model, std::move(copy));
          l.AddRepaired(job.model, repaired);
          l.Commit(l.state());
          observer_->OnRepair(job.model, repaired, engine_seconds);
          return absl::OkStatus();
        }
        history.assign(l.state().history.begin(), l.state().history.begin() + target);
      }
    }
    if (copy == nullptr || done == target) {
      // The session was busy before anything was copied, or at the swap.
      {
        absl::MutexLock lock(&repair_mu_);
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
      const Clock::time_point t0 = Clock::now();
      {
        absl::MutexLock lock(&slot.mu);
        if (absl::StatusOr<at::Tensor> logits = engine.Prefill(*copy, ids); !logits.ok()) {
          return logits.status();
        }
      }
      engine_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      done += n;
      observer_->OnRepairChunk(job.model, done, target);
    }
  }
}

}  // namespace kvl::router
