// A ChatRequest turned into native types and checked against the server's
// limits. This is the edge: nothing past it sees protobuf.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvlingo/v1/chat.pb.h"
#include "kvlingo/v1/session.pb.h"
#include "router/router.h"

namespace kvl::server {

struct TurnRequest {
  std::string session_id;
  std::string request_id;  // empty when the request has none
  // max_tokens already defaulted (never 0, never above the server's limit);
  // policy, strategy and seed unset where the request leaves them unset;
  // explicit_model -1 when the request names no model. `received` and
  // `cancelled` are the caller's to set.
  router::TurnOptions options;
};

struct TurnLimits {
  int64_t max_turn_bytes = 65536;
  int64_t max_new_tokens_limit = 4096;
  int64_t max_system_prompt_bytes = 65536;
  int64_t max_import_bytes = int64_t{4} << 20;
};

// One turn of an ImportSessionRequest, validated.
struct ImportTurn {
  std::string user_message;
  std::string reply;
  int model = -1;  // index into the loaded models
};

inline constexpr size_t kMaxStopStrings = 16;

// InvalidArgument naming the field ("user_message: ...", "sampling.top_p: ...")
// for any value out of range; NotFound naming routing.model when it is not one
// of `model_names` (the loaded models, in the router's order; none loaded:
// routing.model is not resolved). Whether the
// session exists, and whether the turn fits the policy, the router checks.
// InvalidArgument naming system_prompt when it is over
// limits.max_system_prompt_bytes or not valid UTF-8; when it renders to
// `preamble_tokens` that leave no room in `context_tokens` (the smallest
// context of the loaded models; 0: not checked).
absl::Status ValidateSystemPrompt(absl::string_view prompt, const TurnLimits& limits,
                                  int64_t preamble_tokens, int64_t context_tokens);

// The turns of an import: InvalidArgument naming the field
// ("turns[3].reply: ...") for an empty or over-long user message (the
// max_turn_bytes bound of Chat, which applies to replies too), invalid UTF-8,
// or messages and replies over limits.max_import_bytes together; NotFound
// naming turns[i].model for a model not loaded (empty: `default_model`).
absl::StatusOr<std::vector<ImportTurn>> ParseImportTurns(
    const kvlingo::v1::ImportSessionRequest& request, const TurnLimits& limits,
    const std::vector<std::string>& model_names, int default_model);

absl::StatusOr<TurnRequest> ParseChatRequest(const kvlingo::v1::ChatRequest& request,
                                             const TurnLimits& limits,
                                             const std::vector<std::string>& model_names);

}  // namespace kvl::server
