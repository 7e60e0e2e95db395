#include "router/gate.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvl::router {

QualityGate::QualityGate(int n_models, GateConfig config, Clock now)
    : n_models_(n_models),
      config_(config),
      now_(now ? std::move(now) : Clock([] { return std::chrono::steady_clock::now(); })),
      pairs_(static_cast<size_t>(n_models) * n_models) {}

QualityGate::Pair& QualityGate::At(int source, int target) {
  return pairs_[static_cast<size_t>(source) * n_models_ + target];
}

void QualityGate::Refuse(int source, int target, std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  Pair& pair = At(source, target);
  pair.closed = true;
  pair.closed_until = std::chrono::steady_clock::time_point::max();
  pair.reason = std::move(reason);
  pair.window.clear();
}

bool QualityGate::Open(int source, int target, std::string* why, bool* reopened) {
  if (reopened != nullptr) *reopened = false;
  std::lock_guard<std::mutex> lock(mu_);
  Pair& pair = At(source, target);
  if (!pair.closed) return true;
  if (now_() < pair.closed_until) {
    if (why != nullptr) *why = pair.reason;
    return false;
  }
  // The cool-down is over: used again, on probation (an empty window).
  pair.closed = false;
  pair.window.clear();
  if (reopened != nullptr) *reopened = true;
  return true;
}

std::optional<std::string> QualityGate::Feed(int source, int target, double nats_per_token) {
  if (!(config_.max_divergence < std::numeric_limits<double>::infinity())) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  Pair& pair = At(source, target);
  if (pair.closed) return std::nullopt;
  pair.window.push_back(nats_per_token);
  while (static_cast<int64_t>(pair.window.size()) > config_.window) pair.window.pop_front();
  if (static_cast<int64_t>(pair.window.size()) < config_.min_samples) return std::nullopt;
  double mean = 0;
  for (double x : pair.window) mean += x;
  mean /= static_cast<double>(pair.window.size());
  if (mean <= config_.max_divergence) return std::nullopt;
  const double cooldown_seconds = std::chrono::duration<double>(config_.cooldown).count();
  pair.closed = true;
  pair.closed_until = now_() + config_.cooldown;
  pair.reason = absl::StrCat("closed by the quality gate: mean switch divergence ",
                             absl::SixDigits(mean), " nats/token over the last ",
                             pair.window.size(), " repaired switches exceeds ",
                             absl::SixDigits(config_.max_divergence), " (for ",
                             absl::SixDigits(cooldown_seconds), " s)");
  pair.window.clear();
  return pair.reason;
}

}  // namespace kvl::router
