#include "router/policy.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace kvl::router {

const char* PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kFixed:
      return "fixed";
    case Policy::kExplicit:
      return "explicit";
    case Policy::kRules:
      return "rules";
    case Policy::kCascade:
      return "cascade";
    case Policy::kAlternate:
      return "alternate";
  }
  return "?";
}

const char* RepairModeName(RepairMode mode) {
  switch (mode) {
    case RepairMode::kOff:
      return "off";
    case RepairMode::kAfterTurn:
      return "after-turn";
    case RepairMode::kIdleOnly:
      return "idle-only";
  }
  return "?";
}

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kTranslate:
      return "translate";
    case Strategy::kReprefill:
      return "reprefill";
    case Strategy::kReprefillMissing:
      return "reprefill-missing";
  }
  return "?";
}

const char* CachePathName(CachePath path) {
  switch (path) {
    case CachePath::kNative:
      return "native";
    case CachePath::kTranslated:
      return "translated";
    case CachePath::kReprefill:
      return "reprefill";
    case CachePath::kRestored:
      return "restored";
    case CachePath::kNativeTail:
      return "native-tail";
    case CachePath::kHybrid:
      return "hybrid";
  }
  return "?";
}

namespace {

template <typename Enum, int N>
absl::StatusOr<Enum> ParseName(absl::string_view name, const char* (*name_of)(Enum)) {
  std::string known;
  for (int i = 0; i < N; ++i) {
    const Enum e = static_cast<Enum>(i);
    if (name == name_of(e)) return e;
    absl::StrAppend(&known, i == 0 ? "" : ", ", name_of(e));
  }
  return absl::InvalidArgumentError(absl::StrCat("expected one of ", known, ", got '", name, "'"));
}

}  // namespace

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  return ParseName<Policy, kNumPolicies>(name, PolicyName);
}

absl::StatusOr<Strategy> ParseStrategy(absl::string_view name) {
  return ParseName<Strategy, kNumStrategies>(name, StrategyName);
}

CascadeVerdict JudgeCascade(const PolicyConfig& config, double next_entropy, double mean_logprob,
                            int64_t n_scored, const std::string& model_name,
                            const std::string& next_model_name) {
  const bool unsure_entropy = next_entropy > config.cascade_max_entropy;
  const bool unsure_mean = mean_logprob < config.cascade_min_mean_logprob;
  // The measurements the decision used; a test that is off is omitted.
  std::string measured = absl::StrFormat("next-token entropy %.3f nats", next_entropy);
  if (std::isfinite(config.cascade_max_entropy)) {
    absl::StrAppendFormat(&measured, " (max %.3f)", config.cascade_max_entropy);
  }
  if (std::isfinite(config.cascade_min_mean_logprob)) {
    absl::StrAppendFormat(&measured, ", mean log-probability %.3f (min %.3f) over %d turn tokens",
                          mean_logprob, config.cascade_min_mean_logprob, n_scored);
  }
  CascadeVerdict verdict;
  verdict.confident = !unsure_entropy && !unsure_mean;
  verdict.reason = verdict.confident
                       ? absl::StrCat("cascade: ", model_name, " is confident (", measured, ")")
                       : absl::StrCat("cascade: ", model_name, " is unsure (", measured,
                                      "); escalated to ", next_model_name);
  return verdict;
}

absl::StatusOr<std::shared_ptr<const RulePattern>> RulePattern::Compile(
    const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    return absl::InvalidArgumentError(
        absl::StrCat("'", pattern, "' is not a valid PCRE2 regular expression: ",
                     reinterpret_cast<const char*>(message), " at offset ", offset));
  }
  // JIT is an optimisation only; without it pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::shared_ptr<const RulePattern>(new RulePattern(code));
}

RulePattern::~RulePattern() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool RulePattern::Search(absl::string_view text, bool* gave_up) const {
  if (gave_up != nullptr) *gave_up = false;
  // Bounds on one search: backtracking steps, and the interpreter's heap (in
  // KiB). A 64 KiB turn against an ordinary pattern stays far below.
  constexpr uint32_t kMatchLimit = 10'000'000;
  constexpr uint32_t kHeapLimitKiB = 16 * 1024;
  // The JIT's stack, one per thread: 8 MiB reserved, pages taken as used
  // (a repetition costs tens of bytes a character: 64 KiB turns fit).
  struct JitStack {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    ~JitStack() { pcre2_jit_stack_free(stack); }
  };
  thread_local JitStack jit;
  const auto* code = static_cast<const pcre2_code*>(code_);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack_assign(context, nullptr, jit.stack);
  pcre2_set_match_limit(context, kMatchLimit);
  pcre2_set_heap_limit(context, kHeapLimitKiB);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = pcre2_match(code, subject, text.size(), 0, 0, data, context);
  // Past the JIT's stack, the interpreter keeps its backtracking frames on
  // the heap, within its limit.
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code, subject, text.size(), 0, PCRE2_NO_JIT, data, context);
  }
  pcre2_match_context_free(context);
  pcre2_match_data_free(data);
  if (rc >= 0) return true;
  if (rc != PCRE2_ERROR_NOMATCH && gave_up != nullptr) *gave_up = true;
  return false;
}

absl::Status CompileRule(Rule* rule) {
  rule->compiled = nullptr;
  if (rule->pattern.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const RulePattern>> compiled = RulePattern::Compile(rule->pattern);
  if (!compiled.ok()) return compiled.status();
  rule->compiled = *std::move(compiled);
  return absl::OkStatus();
}

namespace {

// Why the rule matched, or "" when it does not.
std::string Matches(const Rule& r, absl::string_view turn, int64_t turn_number) {
  const int64_t n = static_cast<int64_t>(turn.size());
  if (n < r.min_bytes || (r.max_bytes > 0 && n > r.max_bytes)) return "";
  if (turn_number < r.min_turn || (r.max_turn > 0 && turn_number > r.max_turn)) return "";
  std::string why = absl::StrCat(n, " bytes, turn ", turn_number);
  if (!r.contains.empty()) {
    auto hit = std::find_if(r.contains.begin(), r.contains.end(),
                            [&](const std::string& s) { return absl::StrContains(turn, s); });
    if (hit == r.contains.end()) return "";
    absl::StrAppend(&why, ", contains '", *hit, "'");
  }
  if (!r.pattern.empty()) {
    bool gave_up = false;
    if (r.compiled == nullptr) return "";  // not compiled (CompileRule): never matches
    if (!r.compiled->Search(turn, &gave_up)) {
      if (gave_up) {
        spdlog::warn("routing rule /{}/ gave up on a {}-byte turn (PCRE2's match limits, or not "
                     "UTF-8): taken as no match",
                     r.pattern, n);
      }
      return "";
    }
    absl::StrAppend(&why, ", matches /", r.pattern, "/");
  }
  return why;
}

}  // namespace

RouteChoice ChooseModel(const PolicyConfig& config, Policy policy, absl::string_view user_turn,
                        int64_t turn_number, int explicit_model, int cascade_level,
                        const std::vector<std::string>& model_names) {
  const std::string& fallback = model_names[config.default_model];
  switch (policy) {
    case Policy::kFixed:
      return {config.default_model, absl::StrCat("fixed policy: always ", fallback)};
    case Policy::kExplicit:
      return {explicit_model, absl::StrCat("the client asked for ", model_names[explicit_model])};
    case Policy::kRules:
      for (size_t i = 0; i < config.rules.size(); ++i) {
        const std::string why = Matches(config.rules[i], user_turn, turn_number);
        if (!why.empty()) {
          return {config.rules[i].model, absl::StrCat("rule ", i, " matched (", why, ")")};
        }
      }
      return {config.default_model,
              absl::StrCat("no rule matched (", user_turn.size(), " bytes, turn ", turn_number,
                           "); default model ", fallback)};
    case Policy::kAlternate: {
      if (config.order.empty()) {
        return {config.default_model, "alternate: no model list; default model"};
      }
      const int64_t k = (turn_number - 1) % static_cast<int64_t>(config.order.size());
      return {config.order[k], absl::StrCat("alternate: turn ", turn_number, " goes to model ",
                                            k + 1, " of ", config.order.size())};
    }
    case Policy::kCascade: {
      if (config.order.empty()) {
        return {config.default_model, "cascade: no model list; default model"};
      }
      const int level = std::min<int>(cascade_level, static_cast<int>(config.order.size()) - 1);
      return {config.order[level],
              level == 0 ? std::string("cascade: starts with the cheapest model")
                         : absl::StrCat("cascade: the session escalated to level ", level + 1,
                                        " earlier and stays there")};
    }
  }
  return {config.default_model, "default model"};
}

}  // namespace kvl::router
