// The OpenAI Chat Completions API at the edge: a request body parsed into
// native types and checked against the server's limits, and the response
// objects (a completion, stream chunks, errors) written as JSON. Nothing past
// this file sees JSON. The endpoint itself: server/openai_http.h; the
// reference for users: docs/openai-api.md.
//
// Thread-safe: free functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/sampling.h"
#include "router/policy.h"
#include "server/chat_request.h"

namespace kvl::server {

// A request of POST /v1/chat/completions as kvlingo serves it: the leading
// system (or developer) messages joined into the system prompt, then
// completed turns (a user message and the assistant's reply), then the user
// message this request answers.
struct CompletionRequest {
  struct Turn {
    std::string user, assistant;
  };
  std::string model;
  std::string system_prompt;
  std::vector<Turn> history;
  std::string user_message;
  // Defaulted to the server's max_new_tokens_limit; never above it.
  int64_t max_tokens = 0;
  // OpenAI's defaults: temperature 1, top_p 1.
  SamplingParams sampling{1.0, 0, 1.0};
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;            // the `user` field (end-user id); empty when absent
  // The "kvlingo" extension object: {"strategy": "translate" | "reprefill" |
  // "reprefill-missing"} (router::ParseStrategy); unset: the server's
  // switching.strategy.
  std::optional<router::Strategy> strategy;
  // "kvlingo": {"prefix_cache": false}: the request finds no cached prefix
  // (its conversation is prefilled, then cached as any other).
  bool use_prefix_cache = true;
  // "kvlingo": {"native_layers": k}: the native-depth dial for this request's
  // translated spans (gRPC's RoutingHints.native_layers); unset: each
  // translator's own.
  std::optional<int64_t> native_layers;
};

// InvalidArgument naming the field as OpenAI's `param` does ("messages[2].role:
// ...", "temperature: ..."): malformed JSON, a field of the wrong type, a value
// out of range, a conversation kvlingo cannot render (roles that do not
// alternate user/assistant after the system messages, a last message that is
// not the user's, tool calls, non-text content parts), or a field kvlingo does
// not serve set to anything but its default (n > 1, tools, logprobs,
// frequency/presence penalties, logit_bias, response_format other than text).
// Fields that change nothing kvlingo serves (metadata, store, service_tier,
// parallel_tool_calls, ...) are ignored. Messages and replies are held to
// limits.max_turn_bytes each and to limits.max_import_bytes together.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                         const TurnLimits& limits);

// An error as OpenAI's clients read it.
struct ApiError {
  int http_status = 500;
  std::string type;   // "invalid_request_error", "authentication_error", ...
  std::string code;   // "model_not_found", "context_length_exceeded", ...; may be empty
  std::string param;  // the field the message names; may be empty
  std::string message;
};
// The HTTP status and OpenAI error of a status: InvalidArgument 400,
// Unauthenticated 401, PermissionDenied 403, NotFound 404, ResourceExhausted
// 429, OutOfRange 400 (context_length_exceeded), Unavailable 503,
// DeadlineExceeded 504, Cancelled 499, FailedPrecondition 400, anything else
// 500. `param` is the field a message begins with ("temperature: ...").
ApiError ApiErrorOf(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}}; null for empty param/code.
std::string ApiErrorJson(const ApiError& error);

// How the request's prompt was served, for `usage` and the "kvlingo" block.
struct ServedPrompt {
  std::string model;           // the model that answered
  std::string previous_model;  // the model that answered the conversation's last turn; may be empty
  std::string policy, reason, strategy, path;
  bool switched = false;
  int64_t prompt_tokens = 0;     // the whole rendered prompt
  int64_t own_cache_tokens = 0;  // already in the answering model's cache line
  int64_t translated_tokens = 0;
  int64_t prefilled_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reused_turns = 0;     // completed turns found in the prefix cache
  int64_t request_turns = 0;    // completed turns the request carried
  std::string conversation_id;  // the prefix cache's session (GetSession shows its lines)
  double time_to_first_token_seconds = 0;
  double translation_seconds = 0;
  int64_t native_layers = 0;  // RoutingEvent::native_layers
};

// "stop" for a stop token or string, "length" when max_tokens ran out.
std::string OpenAiFinishReason(FinishReason reason);

// A non-streamed response: object "chat.completion" with one choice, usage
// (prompt_tokens_details.cached_tokens: own cache and translated tokens), and
// the "kvlingo" block.
std::string CompletionJson(const std::string& id, int64_t created, const ServedPrompt& served,
                           const std::string& text, const std::string& finish_reason);

// One "chat.completion.chunk" with `delta` (a JSON object text: {"role":...},
// {"content":...} or {}) and `finish_reason` (empty: null); with `served`, the
// kvlingo block (the last chunk carries it).
std::string ChunkJson(const std::string& id, int64_t created, const std::string& model,
                      const std::string& delta, const std::string& finish_reason,
                      const ServedPrompt* served = nullptr);
// The delta of a chunk carrying `text` (role "assistant" too when `first`).
std::string DeltaJson(std::string_view text, bool first);
// The stream's usage chunk (stream_options.include_usage): no choices.
std::string UsageChunkJson(const std::string& id, int64_t created, const ServedPrompt& served);

// GET /v1/models: the served models, then the router model (the configured
// routing policy) when it is not empty.
std::string ModelsJson(const std::vector<std::string>& models, const std::string& router_model,
                       int64_t created);

}  // namespace kvl::server
