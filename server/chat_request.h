// A ChatRequest turned into native types and checked against the server's
// limits. This is the edge: nothing past it sees protobuf.
#ifndef KVLINGO_SERVER_CHAT_REQUEST_H_
#define KVLINGO_SERVER_CHAT_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvlingo/v1/chat.pb.h"
#include "server/config.h"

namespace kvl::server {

struct SamplingOptions {
  // Already defaulted: never 0, never above the server's limit.
  uint32_t max_tokens = 0;
  float temperature = 0;  // 0: greedy
  uint32_t top_k = 0;     // 0: disabled
  float top_p = 1;        // 1: disabled
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
};

struct TurnRequest {
  std::string session_id;
  std::string user_message;
  SamplingOptions sampling;
  // Per-turn overrides; unset means the configured routing.
  std::optional<RoutingPolicy> policy;
  std::string model;
  std::optional<SwitchStrategy> strategy;
};

struct TurnLimits {
  int64_t max_turn_bytes = 65536;
  int64_t max_new_tokens_limit = 4096;
};

inline constexpr size_t kMaxStopStrings = 16;

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF). On failure `*bad_offset` is the first bad byte.
bool IsValidUtf8(absl::string_view text, size_t* bad_offset = nullptr);

// InvalidArgument naming the field ("user_message: ...", "sampling.top_p: ...")
// for any value out of range. Whether the session exists is not checked here.
absl::StatusOr<TurnRequest> ParseChatRequest(const kvlingo::v1::ChatRequest& request,
                                             const TurnLimits& limits);

}  // namespace kvl::server

#endif  // KVLINGO_SERVER_CHAT_REQUEST_H_
