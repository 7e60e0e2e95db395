// Server configuration: one JSON file (comments allowed), parsed into native
// types here so that nothing else in the server sees JSON. The schema, with
// every key, type and default, is documented in server/README.md; keep the two
// in step.
//
// Errors name the key path and what was wrong, e.g.
//   config: server.listen_address: expected host:port, got 'x'
// Unknown keys at any level are errors, so that a typo never silently falls
// back to a default.
#ifndef KVLINGO_SERVER_CONFIG_H_
#define KVLINGO_SERVER_CONFIG_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvl::server {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };

// Runtime dtype of a model's weights and KV cache.
enum class Dtype { kFloat32, kBFloat16, kFloat16 };

enum class RoutingPolicy { kFixed, kExplicit, kRules, kCascade, kAlternate };

// The arithmetic of a translator's products (Translator::Translate). kAuto:
// bfloat16 where the CPU has bfloat16 dot-product instructions, else float32
// (kvl::FastestTranslateDtype).
enum class TranslateDtype { kAuto, kFloat32, kBFloat16 };

// How a conversation is handed over when the chosen model lacks some history.
enum class SwitchStrategy { kTranslate, kReprefill, kReprefillMissing };

// "trace", "float32", "fixed", "reprefill-missing", ...: the spelling used in
// the config file (and, for policies, in RoutingHints.policy).
absl::string_view LogLevelName(LogLevel level);
absl::string_view DtypeName(Dtype dtype);
absl::string_view TranslateDtypeName(TranslateDtype dtype);
absl::string_view RoutingPolicyName(RoutingPolicy policy);
absl::string_view SwitchStrategyName(SwitchStrategy strategy);
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(absl::string_view name);

// host:port with a numeric port in [0, 65535]; host is a name, an IPv4 address
// or a bracketed IPv6 address ("[::1]:50051"). Port 0 asks the OS for a free
// port; the server logs the port it bound.
struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;  // host:port, as it was written
};
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

struct ServerSection {
  HostPort listen_address{"127.0.0.1", 50051};
  HostPort metrics_address{"127.0.0.1", 9464};
  // How long SIGTERM waits for in-flight Chat streams before shutting down.
  double drain_timeout_seconds = 30.0;
  // Upper bound on ChatRequest.user_message, in UTF-8 bytes.
  int64_t max_turn_bytes = 65536;
  // Upper bound on SamplingParams.max_tokens; also the default when it is 0.
  int64_t max_new_tokens_limit = 4096;
};

struct LogSection {
  LogLevel level = LogLevel::kInfo;
};

struct RuntimeSection {
  // LibTorch intra-op threads; 0 means one per hardware thread.
  int threads = 0;
  Dtype dtype = Dtype::kFloat32;
};

struct ModelEntry {
  std::string name;
  // Absolute (relative paths in the file are resolved against the directory of
  // the config file). A directory holding a Hugging Face config.json.
  std::string path;
  // runtime.dtype unless the entry sets its own.
  Dtype dtype = Dtype::kFloat32;
};

struct TranslatorEntry {
  // "<source>-><target>" unless the entry names it.
  std::string name;
  std::string source;
  std::string target;
  std::string path;  // absolute, resolved like ModelEntry::path
  TranslateDtype compute_dtype = TranslateDtype::kAuto;
};

// One rule of the "rules" policy: the first rule whose conditions all hold for
// the user's turn picks its model; no match picks routing.default_model.
struct RoutingRule {
  std::string model;
  // Any of these substrings (case-sensitive) appears in the turn; empty: no
  // condition.
  std::vector<std::string> contains;
  // The turn's length in bytes is within [min_bytes, max_bytes]; max_bytes 0
  // means no upper bound.
  int64_t min_bytes = 0;
  int64_t max_bytes = 0;
  // The turn number (1-based) is within [min_turn, max_turn]; max_turn 0 means
  // no upper bound.
  int64_t min_turn = 0;
  int64_t max_turn = 0;
  // An ECMAScript regular expression searched for in the turn; empty: no
  // condition.
  std::string pattern;
};

struct RoutingSection {
  RoutingPolicy policy = RoutingPolicy::kFixed;
  // The model for "fixed", and the fallback of every other policy. Empty only
  // when no models are configured.
  std::string default_model;
  SwitchStrategy strategy = SwitchStrategy::kTranslate;
  // Ordered model list of the "alternate" (round robin per turn) and "cascade"
  // (cheapest first, escalate on low confidence) policies.
  std::vector<std::string> models;
  std::vector<RoutingRule> rules;
  // "cascade": the current model prefills the new user turn; when the entropy
  // of its distribution for the answer's first token exceeds
  // cascade_max_entropy (nats), or the mean log-probability it assigns to the
  // turn's tokens is below cascade_min_mean_logprob, the turn escalates to the
  // next model in `models`; the session then stays escalated. Either test is
  // off at its default infinity (the mean test unless configured).
  double cascade_max_entropy = 3.0;
  double cascade_min_mean_logprob = -std::numeric_limits<double>::infinity();
  // Strategy "translate": at a switch, the last this many tokens of the
  // history are prefilled by the target instead of translated (0: translate
  // all). 32 cut the per-turn loss of alternating switches against
  // re-prefill by 51-56% on the house models and their whole-continuation
  // gap from 0.032-0.038 to 0.015-0.016 over the 64-window table (0.022-0.026 over 512, docs/results/translator_precision.txt) nats/token, for a few milliseconds
  // more per switch (docs/translators.md, "Deployment choices").
  int64_t native_tail_tokens = 32;
};

struct SessionsSection {
  // Sessions untouched for this long are deleted; 0 disables expiry.
  int64_t idle_timeout_seconds = 3600;
  // Bytes of KV cache all sessions together may hold.
  int64_t memory_budget_bytes = int64_t{4} << 30;
};

struct ServerConfig {
  ServerSection server;
  LogSection log;
  RuntimeSection runtime;
  std::vector<ModelEntry> models;
  std::vector<TranslatorEntry> translators;
  RoutingSection routing;
  SessionsSection sessions;
};

// Parses and validates `text`. Relative paths are resolved against `base_dir`.
// InvalidArgument (syntax, unknown key, bad value, dangling reference) or
// NotFound (a model or translator path that does not exist), with the message
// "config: <key path>: <problem>".
absl::StatusOr<ServerConfig> ParseConfig(absl::string_view text, const std::string& base_dir);

// Reads `path` and parses it; NotFound when the file cannot be read.
absl::StatusOr<ServerConfig> LoadConfigFile(const std::string& path);

}  // namespace kvl::server

#endif  // KVLINGO_SERVER_CONFIG_H_
