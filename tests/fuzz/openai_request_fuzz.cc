// The OpenAI API's request parser (server/openai_api.h) on raw bodies, as
// HTTP hands them over. Properties: a refusal is InvalidArgument, its OpenAI
// error (ApiErrorOf) names a field unless the body is not a JSON object, and
// its JSON (ApiErrorJson) parses; an accepted request is within the limits
// (a non-empty last user message, every message and the system prompt valid
// UTF-8 and within their byte limits, the messages together within
// max_import_bytes, max_tokens in [1, limit], temperature in [0, 2], top_p in
// (0, 1], at most 16 non-empty stop strings).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/utf8.h"
#include "server/openai_api.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const kvl::server::TurnLimits kLimits{/*max_turn_bytes=*/256, /*max_new_tokens_limit=*/64,
                                      /*max_system_prompt_bytes=*/512, /*max_import_bytes=*/1024};

void CheckText(const std::string& text, int64_t limit, const char* what) {
  KVL_FUZZ_CHECK(kvl::IsValidUtf8(text), std::string(what) + " accepted but not valid UTF-8");
  KVL_FUZZ_CHECK(static_cast<int64_t>(text.size()) <= limit,
                 std::string(what) + " accepted over its limit");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvl::server::CompletionRequest> r =
      kvl::server::ParseCompletionRequest(body, kLimits);
  if (!r.ok()) {
    kvl::fuzz::Note(r.status());
    KVL_FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument,
                   "a refusal is InvalidArgument: " + r.status().ToString());
    const kvl::server::ApiError e = kvl::server::ApiErrorOf(r.status());
    KVL_FUZZ_CHECK(e.http_status == 400, "a refusal is HTTP 400");
    const bool not_an_object =
        r.status().message().rfind("the request body is not valid JSON", 0) == 0 ||
        r.status().message().rfind("body: ", 0) == 0;
    KVL_FUZZ_CHECK(not_an_object || !e.param.empty(),
                   "a refusal names its field: " + r.status().ToString());
    KVL_FUZZ_CHECK(
        !nlohmann::json::parse(kvl::server::ApiErrorJson(e), nullptr, false).is_discarded(),
        "the error is not valid JSON");
    return 0;
  }
  KVL_FUZZ_CHECK(!r->user_message.empty(), "an empty last message accepted");
  CheckText(r->user_message, kLimits.max_turn_bytes, "the last message");
  CheckText(r->system_prompt, kLimits.max_system_prompt_bytes, "the system prompt");
  int64_t total = static_cast<int64_t>(r->user_message.size());
  for (const auto& turn : r->history) {
    CheckText(turn.user, kLimits.max_turn_bytes, "a user message");
    CheckText(turn.assistant, kLimits.max_turn_bytes, "an assistant message");
    KVL_FUZZ_CHECK(!turn.user.empty(), "an empty user message accepted");
    total += static_cast<int64_t>(turn.user.size() + turn.assistant.size());
  }
  KVL_FUZZ_CHECK(total <= kLimits.max_import_bytes, "messages over max_import_bytes accepted");
  KVL_FUZZ_CHECK(r->max_tokens >= 1 && r->max_tokens <= kLimits.max_new_tokens_limit,
                 "max_tokens out of [1, limit]: " + std::to_string(r->max_tokens));
  KVL_FUZZ_CHECK(r->sampling.temperature >= 0 && r->sampling.temperature <= 2 &&
                     r->sampling.top_p > 0 && r->sampling.top_p <= 1,
                 "sampling out of range");
  KVL_FUZZ_CHECK(r->stop.size() <= kvl::server::kMaxStopStrings, "too many stop strings");
  for (const std::string& s : r->stop) {
    KVL_FUZZ_CHECK(!s.empty(), "an empty stop string accepted");
    CheckText(s, kLimits.max_turn_bytes, "a stop string");
  }
  KVL_FUZZ_CHECK(!r->include_usage || r->stream, "include_usage without stream accepted");
  return 0;
}
