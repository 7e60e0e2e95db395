// The server's configuration file (server::ParseConfig) on arbitrary text,
// resolved against the source tree (so models/ and translators exist). Property:
// every refusal is InvalidArgument or NotFound with a "config: " message
// naming where; an accepted config satisfies the invariants the server relies
// on (limits positive, routing indices inside the models).
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "server/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvl::server::ServerConfig> config = kvl::server::ParseConfig(text, KVL_SOURCE_DIR);
  kvl::fuzz::Note(config.status());
  if (!config.ok()) {
    const absl::StatusCode code = config.status().code();
    KVL_FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound,
                   "a refused config is InvalidArgument or NotFound: " + config.status().ToString());
    KVL_FUZZ_CHECK(absl::StartsWith(config.status().message(), "config: "),
                   "a refusal names the config: " + config.status().ToString());
    return 0;
  }
  const kvl::server::ServerConfig& c = *config;
  KVL_FUZZ_CHECK(c.sessions.memory_budget_bytes > 0, "accepted a non-positive memory budget");
  KVL_FUZZ_CHECK(c.server.max_turn_bytes > 0 && c.server.max_new_tokens_limit > 0 &&
                     c.server.max_system_prompt_bytes > 0 && c.server.max_import_bytes > 0,
                 "accepted a non-positive server bound");
  KVL_FUZZ_CHECK(c.limits.max_concurrent_streams >= 0 && c.router.limits.max_waiting_turns >= 0 &&
                     c.limits.max_sessions >= 0 && c.router.limits.max_history_tokens >= 0,
                 "accepted a negative limit");
  KVL_FUZZ_CHECK(c.router.batching.max_step_tokens > 0 && c.router.batching.max_running > 0,
                 "accepted a non-positive batching bound");
  const int n = static_cast<int>(c.models.size());
  if (n > 0) {
    KVL_FUZZ_CHECK(c.router.policy.default_model >= 0 && c.router.policy.default_model < n,
                   "default model outside the models");
  }
  for (int m : c.router.policy.order) {
    KVL_FUZZ_CHECK(m >= 0 && m < n, "routing order names a model outside the models");
  }
  return 0;
}
