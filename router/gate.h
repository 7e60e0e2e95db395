// The live quality gate: which translator pairs a switch may use now.
//
// Each repaired switch turn scores how far the translated cache's reply
// diverged from the native one (nats per token, router/repair.h). A pair
// whose mean divergence over its last `window` scores exceeds
// `max_divergence`, once at least `min_samples` are in, closes: its switches
// re-prefill for `cooldown`, then it opens again with an empty window (on
// probation: it closes again as soon as the bound is exceeded over
// `min_samples` scores). A pair refused at load (router/loader.h) stays
// closed.
//
// Time comes from an injected clock, so the cool-down is tested without
// sleeping. Thread-safe: every method takes the gate's own lock; none calls
// out while holding it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace kvl::router {

struct GateConfig {
  // Off at infinity: no score ever closes a pair.
  double max_divergence = std::numeric_limits<double>::infinity();
  int64_t window = 20;
  int64_t min_samples = 5;
  std::chrono::steady_clock::duration cooldown = std::chrono::minutes(10);
};

class QualityGate {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  // n_models x n_models pairs, all open. `now` null: the steady clock.
  QualityGate(int n_models, GateConfig config, Clock now = nullptr);

  // Closes (source, target) for good: the load-time gate refused its translator.
  void Refuse(int source, int target, std::string reason);

  // Whether (source, target) may translate now; when not, *why (if given)
  // says why. A pair whose cool-down is over opens here: *reopened (if given)
  // is then set, for the caller to report.
  bool Open(int source, int target, std::string* why = nullptr, bool* reopened = nullptr);

  // Adds a repaired switch's score; the reason when this closes the pair.
  std::optional<std::string> Feed(int source, int target, double nats_per_token);

 private:
  struct Pair {
    std::deque<double> window;  // the last config.window scores
    std::chrono::steady_clock::time_point closed_until{};
    bool closed = false;
    std::string reason;
  };
  Pair& At(int source, int target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int n_models_;
  const GateConfig config_;
  const Clock now_;
  std::mutex mu_;
  std::vector<Pair> pairs_ ABSL_GUARDED_BY(mu_);  // [source * n_models + target]
};

}  // namespace kvl::router
