// Routing policies: which model answers a turn. Pure functions over the
// session's state and the turn; the cascade's confidence test runs in the
// orchestrator (router.h), which needs a model for it.
//
// Thread-safe: free functions; PolicyConfig is immutable once built.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvl::router {

enum class Policy { kFixed, kExplicit, kRules, kCascade, kAlternate };
// How a model that lacks part of the history gets it (see planner.h).
enum class Strategy { kTranslate, kReprefill, kReprefillMissing };
// Which path produced the answering model's cache of the history:
//   kNative      the model held all of it (its own unrun tail aside);
//   kTranslated  at least one missing span was translated;
//   kReprefill   the model prefilled the whole history (it held none of it,
//                or strategy "reprefill" dropped its line);
//   kRestored    the session came from the durable store (server/sessions.h)
//                without cache lines, and the model prefilled the history;
//   kNativeTail  the model kept its line's start and prefilled only the tail
//                it lacked (strategy "reprefill-missing", or a span nothing
//                could translate), nothing translated;
//   kHybrid      a missing span was translated in the lower layers and its top
//                layers computed natively (the native-depth dial: k native
//                layers, RoutingEvent::native_layers).
enum class CachePath { kNative, kTranslated, kReprefill, kRestored, kNativeTail, kHybrid };
// Background repair of translated lines (router/repair.h): off; after-turn
// (each line a turn left with translated spans is recomputed natively as soon
// as the turn ends, giving way to turns waiting for its model between chunks);
// idle-only (the same, but a chunk runs only while no turn is running on any
// model).
enum class RepairMode { kOff, kAfterTurn, kIdleOnly };
inline constexpr int kNumPolicies = 5;
inline constexpr int kNumCachePaths = 6;
inline constexpr int kNumStrategies = 3;

const char* PolicyName(Policy policy);        // "fixed", "explicit", ..., as configured
const char* StrategyName(Strategy strategy);  // "translate", "reprefill", "reprefill-missing"
// "native", "translated", "reprefill", "restored", "native-tail", "hybrid"
const char* CachePathName(CachePath path);
const char* RepairModeName(RepairMode mode);  // "off", "after-turn", "idle-only"
// The inverses of PolicyName and StrategyName; InvalidArgument listing the
// names otherwise ("expected one of fixed, explicit, ..., got 'x'").
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
absl::StatusOr<Strategy> ParseStrategy(absl::string_view name);

// A rule's compiled pattern: a PCRE2 regular expression (UTF-8, Unicode
// properties) searched with bounded work, so that no turn can make the search
// run away or exhaust a stack (std::regex's recursive matcher does on long
// turns). Immutable; thread-safe.
class RulePattern {
 public:
  // InvalidArgument with PCRE2's message and the offset when it is bad.
  static absl::StatusOr<std::shared_ptr<const RulePattern>> Compile(const std::string& pattern);
  ~RulePattern();
  RulePattern(const RulePattern&) = delete;
  RulePattern& operator=(const RulePattern&) = delete;

  // Whether the pattern matches somewhere in `text`. A search that reaches
  // PCRE2's match, heap or JIT stack limits, or a `text` that is not UTF-8,
  // does not match; `gave_up` (when given) says so.
  bool Search(absl::string_view text, bool* gave_up = nullptr) const;

 private:
  explicit RulePattern(void* code) : code_(code) {}
  void* code_;  // pcre2_code*
};

// One rule of the "rules" policy; every condition set must hold.
struct Rule {
  int model = 0;
  std::vector<std::string> contains;  // any of them is a substring of the turn
  int64_t min_bytes = 0, max_bytes = 0;  // max_bytes 0: unbounded
  int64_t min_turn = 0, max_turn = 0;    // 1-based turn number; max_turn 0: unbounded
  std::string pattern;                   // PCRE2 regex searched in the turn; empty: none
  std::shared_ptr<const RulePattern> compiled;  // of pattern (CompileRule)
};

// Builds a Rule's regex; InvalidArgument naming the pattern when it is bad.
absl::Status CompileRule(Rule* rule);

// Which model answers a turn (config.h holds the rest of the router's
// configuration).
struct PolicyConfig {
  Policy policy = Policy::kFixed;
  int default_model = 0;
  std::vector<int> order;  // "alternate" round robin and "cascade" (cheapest first)
  std::vector<Rule> rules;
  // "cascade": the current model prefills the turn and hands it to the next one
  // in `order` when the entropy of its distribution for the answer's first
  // token exceeds cascade_max_entropy (nats), or when the mean log-probability
  // it assigns to the turn's tokens is below cascade_min_mean_logprob. Either
  // test is off at its default infinity.
  double cascade_max_entropy = 3.0;
  double cascade_min_mean_logprob = -std::numeric_limits<double>::infinity();
};

struct RouteChoice {
  int model = 0;
  std::string reason;
};

// The cascade's decision at one level, from how that level's model read the
// turn (Engine::ScoreContinuation): confident unless the next-token entropy
// exceeds config.cascade_max_entropy or the mean log-probability is below
// config.cascade_min_mean_logprob. The reason names the measurements it used.
struct CascadeVerdict {
  bool confident = true;
  std::string reason;  // "cascade: <model> is confident (...)" or "... is unsure (...); escalated to <next>"
};
CascadeVerdict JudgeCascade(const PolicyConfig& config, double next_entropy, double mean_logprob,
                            int64_t n_scored, const std::string& model_name,
                            const std::string& next_model_name);

// The model of a turn under every policy but cascade (whose first model is
// order[cascade_level]; the orchestrator escalates from there).
// `turn_number` is 1-based; `explicit_model` is the request's model (>= 0) or
// -1. `model_names` are used in the reasons.
RouteChoice ChooseModel(const PolicyConfig& config, Policy policy, absl::string_view user_turn,
                        int64_t turn_number, int explicit_model, int cascade_level,
                        const std::vector<std::string>& model_names);

}  // namespace kvl::router
