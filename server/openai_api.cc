#include "server/openai_api.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/utf8.h"

namespace kvl::server {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view param, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", problem));
}

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

absl::Status WrongType(absl::string_view param, absl::string_view expected, const Json& v) {
  return Bad(param, absl::StrCat("expected ", expected, ", got ", TypeName(v)));
}

// A number field; absent or null leaves *out as it is.
absl::Status ReadNumber(const Json& body, const char* key, double lo, double hi, double* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return WrongType(key, "a number", *it);
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return Bad(key, absl::StrCat("expected a value in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status CheckText(const std::string& param, const std::string& text, int64_t max_bytes) {
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return Bad(param, absl::StrCat(text.size(), " bytes is over the server's limit of ", max_bytes,
                                   " (server.max_turn_bytes)"));
  }
  size_t offset = 0;
  if (!IsValidUtf8(text, &offset)) {
    return Bad(param, absl::StrCat("not valid UTF-8 (first bad byte at offset ", offset, ")"));
  }
  return absl::OkStatus();
}

// A message's role; `at` names the message.
absl::StatusOr<std::string> RoleOf(const Json& message, const std::string& at) {
  if (!message.is_object()) return WrongType(at, "an object", message);
  auto role = message.find("role");
  if (role == message.end() || !role->is_string()) return Bad(at + ".role", "required, a string");
  return role->get<std::string>();
}

// A message's content: a string, or an array of {"type": "text", "text"}
// parts, joined.
absl::StatusOr<std::string> ContentOf(const Json& message, const std::string& at) {
  const std::string param = absl::StrCat(at, ".content");
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return Bad(param, "required");
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return WrongType(param, "a string or an array of text parts", *it);
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& part = (*it)[i];
    const std::string part_at = absl::StrCat(param, "[", i, "]");
    if (!part.is_object()) return WrongType(part_at, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text") {
      return Bad(part_at, "only text parts ({\"type\": \"text\", \"text\": ...}) are served");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return Bad(part_at + ".text", "required, a string");
    text += t->get<std::string>();
  }
  return text;
}

// A field kvlingo does not serve: absent, null, or `unset` is fine.
absl::Status RefuseUnlessDefault(const Json& body, const char* key, const Json& unset,
                                 absl::string_view why) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null() || *it == unset) return absl::OkStatus();
  if (unset.is_array() && it->is_array() && it->empty()) return absl::OkStatus();
  if (unset.is_object() && it->is_object() && it->empty()) return absl::OkStatus();
  return Bad(key, why);
}

std::string Str(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json NullIfEmpty(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

Json UsageOf(const ServedPrompt& s) {
  return Json{
      {"prompt_tokens", s.prompt_tokens},
      {"completion_tokens", s.completion_tokens},
      {"total_tokens", s.prompt_tokens + s.completion_tokens},
      {"prompt_tokens_details", {{"cached_tokens", s.own_cache_tokens + s.translated_tokens}}}};
}

Json ExtensionOf(const ServedPrompt& s) {
  return Json{{"model", s.model},
              {"previous_model", NullIfEmpty(s.previous_model)},
              {"switched", s.switched},
              {"policy", s.policy},
              {"reason", s.reason},
              {"strategy", s.strategy},
              {"path", s.path},
              {"prompt_tokens_own_cache", s.own_cache_tokens},
              {"prompt_tokens_translated", s.translated_tokens},
              {"prompt_tokens_prefilled", s.prefilled_tokens},
              {"reused_turns", s.reused_turns},
              {"request_turns", s.request_turns},
              {"conversation_id", s.conversation_id},
              {"time_to_first_token_seconds", s.time_to_first_token_seconds},
              {"translation_seconds", s.translation_seconds},
              {"native_layers", s.native_layers}};
}

}  // namespace

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body_text,
                                                         const TurnLimits& limits) {
  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return absl::InvalidArgumentError(
        "the request body is not valid JSON (expected a Chat Completions request object)");
  }
  if (!body.is_object()) return WrongType("body", "a JSON object", body);
  CompletionRequest out;

  auto model = body.find("model");
  if (model == body.end() || model->is_null()) return Bad("model", "required");
  if (!model->is_string()) return WrongType("model", "a string", *model);
  out.model = model->get<std::string>();

  // Fields kvlingo does not serve, unless they ask for the default.
  KVL_RETURN_IF_ERROR(RefuseUnlessDefault(body, "n", 1, "only n = 1 is served"));
  for (const char* key : {"tools", "functions"}) {
    KVL_RETURN_IF_ERROR(RefuseUnlessDefault(body, key, Json::array(), "tool calls are not served"));
  }
  // Without tools, "auto" and "none" both mean no tool calls.
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (*it != "none" && *it != "auto") return Bad("tool_choice", "tool calls are not served");
  }
  KVL_RETURN_IF_ERROR(
      RefuseUnlessDefault(body, "function_call", "none", "tool calls are not served"));
  KVL_RETURN_IF_ERROR(
      RefuseUnlessDefault(body, "logprobs", false, "log-probabilities are not served"));
  KVL_RETURN_IF_ERROR(
      RefuseUnlessDefault(body, "top_logprobs", 0, "log-probabilities are not served"));
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    KVL_RETURN_IF_ERROR(RefuseUnlessDefault(body, key, 0, "penalties are not served (only 0)"));
  }
  KVL_RETURN_IF_ERROR(
      RefuseUnlessDefault(body, "logit_bias", Json::object(), "logit_bias is not served"));
  KVL_RETURN_IF_ERROR(
      RefuseUnlessDefault(body, "audio", Json::object(), "audio output is not served"));
  KVL_RETURN_IF_ERROR(
      RefuseUnlessDefault(body, "prediction", Json::object(), "predicted outputs are not served"));
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || it->value("type", "") != "text") {
      return Bad("response_format", "only {\"type\": \"text\"} is served");
    }
  }
  if (auto it = body.find("modalities"); it != body.end() && !it->is_null()) {
    if (*it != Json::array({"text"})) return Bad("modalities", "only [\"text\"] is served");
  }

  // messages
  auto messages = body.find("messages");
  if (messages == body.end() || messages->is_null()) return Bad("messages", "required");
  if (!messages->is_array()) return WrongType("messages", "an array", *messages);
  if (messages->empty()) return Bad("messages", "must not be empty");
  int64_t total = 0;
  size_t i = 0;
  std::vector<std::string> system;
  for (; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    absl::StatusOr<std::string> role = RoleOf(m, at);
    if (!role.ok()) return role.status();
    if (*role != "system" && *role != "developer") break;
    absl::StatusOr<std::string> content = ContentOf(m, at);
    if (!content.ok()) return content.status();
    system.push_back(*std::move(content));
  }
  out.system_prompt = absl::StrJoin(system, "\n\n");
  if (static_cast<int64_t>(out.system_prompt.size()) > limits.max_system_prompt_bytes) {
    return Bad("messages",
               absl::StrCat("the system messages take ", out.system_prompt.size(),
                            " bytes, over the server's limit of ", limits.max_system_prompt_bytes,
                            " (server.max_system_prompt_bytes)"));
  }
  KVL_RETURN_IF_ERROR(
      CheckText("messages[0].content", out.system_prompt, limits.max_system_prompt_bytes));
  // Then user, assistant, user, ..., user.
  bool expect_user = true;
  CompletionRequest::Turn turn;
  for (; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    absl::StatusOr<std::string> role = RoleOf(m, at);
    if (!role.ok()) return role.status();
    const std::string& r = *role;
    if (r == "tool" || r == "function") return Bad(at + ".role", "tool calls are not served");
    if (r == "system" || r == "developer") {
      return Bad(at + ".role",
                 "system messages are served only at the start of the conversation (they become "
                 "its system prompt)");
    }
    if (r != "user" && r != "assistant") {
      return Bad(at + ".role", absl::StrCat("unknown role '", r,
                                            "' (expected system, developer, user or assistant)"));
    }
    if (r == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() &&
        !m["tool_calls"].empty()) {
      return Bad(at + ".tool_calls", "tool calls are not served");
    }
    if ((r == "user") != expect_user) {
      return Bad(at + ".role",
                 expect_user ? "expected a user message here: after the system messages, a "
                               "conversation alternates user and assistant messages"
                             : "expected an assistant message here: two user messages in a row "
                               "are not served (join them into one)");
    }
    absl::StatusOr<std::string> content = ContentOf(m, at);
    if (!content.ok()) return content.status();
    KVL_RETURN_IF_ERROR(CheckText(at + ".content", *content, limits.max_turn_bytes));
    if (r == "user" && content->empty()) return Bad(at + ".content", "must not be empty");
    total += static_cast<int64_t>(content->size());
    if (total > limits.max_import_bytes) {
      return Bad(at, absl::StrCat("the messages up to here take ", total,
                                  " bytes, over the server's limit of ", limits.max_import_bytes,
                                  " (server.max_import_bytes)"));
    }
    if (r == "user") {
      turn.user = *std::move(content);
    } else {
      turn.assistant = *std::move(content);
      out.history.push_back(std::move(turn));
      turn = {};
    }
    expect_user = !expect_user;
  }
  if (expect_user) {
    return Bad("messages", "the last message must be the user's (the one this request answers)");
  }
  out.user_message = std::move(turn.user);

  // Sampling.
  int64_t max_tokens = 0;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null() || max_tokens > 0) continue;
    if (!it->is_number_integer()) return WrongType(key, "an integer", *it);
    const int64_t v = it->get<int64_t>();
    if (v < 1) return Bad(key, absl::StrCat("expected at least 1, got ", v));
    if (v > limits.max_new_tokens_limit) {
      return Bad(key, absl::StrCat(v, " is over the server's limit of ",
                                   limits.max_new_tokens_limit, " (server.max_new_tokens_limit)"));
    }
    max_tokens = v;
  }
  out.max_tokens = max_tokens > 0 ? max_tokens : limits.max_new_tokens_limit;
  KVL_RETURN_IF_ERROR(ReadNumber(body, "temperature", 0, 2, &out.sampling.temperature));
  double top_p = 1.0;
  KVL_RETURN_IF_ERROR(ReadNumber(body, "top_p", 0, 1, &top_p));
  out.sampling.top_p = top_p == 0 ? 1.0 : top_p;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("seed", "an integer", *it);
    out.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      out.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > kMaxStopStrings) {
        return Bad("stop", absl::StrCat("at most ", kMaxStopStrings, " strings, got ", it->size()));
      }
      for (size_t s = 0; s < it->size(); ++s) {
        const std::string at = absl::StrCat("stop[", s, "]");
        if (!(*it)[s].is_string()) return WrongType(at, "a string", (*it)[s]);
        out.stop.push_back((*it)[s].get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *it);
    }
    for (size_t s = 0; s < out.stop.size(); ++s) {
      const std::string at = absl::StrCat("stop[", s, "]");
      if (out.stop[s].empty()) return Bad(at, "must not be empty");
      KVL_RETURN_IF_ERROR(CheckText(at, out.stop[s], limits.max_turn_bytes));
    }
  }

  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return WrongType("stream", "a boolean", *it);
    out.stream = it->get<bool>();
  }
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("stream_options", "an object", *it);
    if (!out.stream) return Bad("stream_options", "only allowed when stream is true");
    if (auto u = it->find("include_usage"); u != it->end() && !u->is_null()) {
      if (!u->is_boolean()) return WrongType("stream_options.include_usage", "a boolean", *u);
      out.include_usage = u->get<bool>();
    }
  }
  if (auto it = body.find("user"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return WrongType("user", "a string", *it);
    out.user = it->get<std::string>();
  }
  if (auto it = body.find("kvlingo"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("kvlingo", "an object", *it);
    for (const auto& [key, value] : it->items()) {
      if (key == "prefix_cache") {
        if (!value.is_boolean()) return WrongType("kvlingo.prefix_cache", "a boolean", value);
        out.use_prefix_cache = value.get<bool>();
        continue;
      }
      if (key == "native_layers") {
        if (!value.is_number_integer() || value.get<int64_t>() < 0) {
          return WrongType("kvlingo.native_layers", "a non-negative integer", value);
        }
        out.native_layers = value.get<int64_t>();
        continue;
      }
      if (key != "strategy") {
        // The key is the client's text: it goes in the message, not in param.
        return Bad("kvlingo",
                   absl::StrCat("unknown field '", key,
                                "' (kvlingo accepts: strategy, prefix_cache, native_layers)"));
      }
      if (!value.is_string()) return WrongType("kvlingo.strategy", "a string", value);
      absl::StatusOr<router::Strategy> strategy = router::ParseStrategy(value.get<std::string>());
      if (!strategy.ok()) return Bad("kvlingo.strategy", strategy.status().message());
      out.strategy = *strategy;
    }
  }
  return out;
}

ApiError ApiErrorOf(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  // The field a message names: "temperature: ...", "messages[2].role: ...".
  if (const size_t colon = e.message.find(": "); colon != std::string::npos && colon > 0) {
    const std::string head = e.message.substr(0, colon);
    if (head.find_first_of(" '\"") == std::string::npos) e.param = head;
  }
  struct Mapping {
    absl::StatusCode code;
    int http_status;
    const char* type;
    const char* error_code;
  };
  static constexpr Mapping kMappings[] = {
      {absl::StatusCode::kInvalidArgument, 400, "invalid_request_error", ""},
      {absl::StatusCode::kFailedPrecondition, 400, "invalid_request_error", ""},
      {absl::StatusCode::kOutOfRange, 400, "invalid_request_error", "context_length_exceeded"},
      {absl::StatusCode::kUnauthenticated, 401, "authentication_error", "invalid_api_key"},
      {absl::StatusCode::kPermissionDenied, 403, "permission_error", ""},
      {absl::StatusCode::kNotFound, 404, "invalid_request_error", ""},
      {absl::StatusCode::kAborted, 409, "conflict_error", ""},
      {absl::StatusCode::kResourceExhausted, 429, "rate_limit_error", "rate_limit_exceeded"},
      {absl::StatusCode::kCancelled, 499, "cancelled", ""},
      {absl::StatusCode::kUnavailable, 503, "service_unavailable", ""},
      {absl::StatusCode::kDeadlineExceeded, 504, "timeout", ""},
  };
  e.http_status = 500;
  e.type = "server_error";
  for (const Mapping& m : kMappings) {
    if (m.code != status.code()) continue;
    e.http_status = m.http_status;
    e.type = m.type;
    e.code = m.error_code;
  }
  if (status.code() == absl::StatusCode::kNotFound && e.param == "model") {
    e.code = "model_not_found";
  }
  return e;
}

std::string ApiErrorJson(const ApiError& e) {
  return Str(Json{{"error",
                   {{"message", e.message},
                    {"type", e.type},
                    {"param", NullIfEmpty(e.param)},
                    {"code", NullIfEmpty(e.code)}}}});
}

std::string OpenAiFinishReason(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

std::string CompletionJson(const std::string& id, int64_t created, const ServedPrompt& served,
                           const std::string& text, const std::string& finish_reason) {
  Json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}}},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason}};
  return Str(Json{{"id", id},
                  {"object", "chat.completion"},
                  {"created", created},
                  {"model", served.model},
                  {"system_fingerprint", nullptr},
                  {"choices", Json::array({choice})},
                  {"usage", UsageOf(served)},
                  {"kvlingo", ExtensionOf(served)}});
}

std::string DeltaJson(std::string_view text, bool first) {
  Json delta = Json::object();
  if (first) delta["role"] = "assistant";
  delta["content"] = std::string(text);
  return Str(delta);
}

std::string ChunkJson(const std::string& id, int64_t created, const std::string& model,
                      const std::string& delta, const std::string& finish_reason,
                      const ServedPrompt* served) {
  Json choice = {{"index", 0},
                 {"delta", Json::parse(delta)},
                 {"logprobs", nullptr},
                 {"finish_reason", NullIfEmpty(finish_reason)}};
  Json chunk = {
      {"id", id},       {"object", "chat.completion.chunk"}, {"created", created},
      {"model", model}, {"system_fingerprint", nullptr},     {"choices", Json::array({choice})}};
  if (served != nullptr) chunk["kvlingo"] = ExtensionOf(*served);
  return Str(chunk);
}

std::string UsageChunkJson(const std::string& id, int64_t created, const ServedPrompt& served) {
  return Str(Json{{"id", id},
                  {"object", "chat.completion.chunk"},
                  {"created", created},
                  {"model", served.model},
                  {"system_fingerprint", nullptr},
                  {"choices", Json::array()},
                  {"usage", UsageOf(served)}});
}

std::string ModelsJson(const std::vector<std::string>& models, const std::string& router_model,
                       int64_t created) {
  Json data = Json::array();
  auto add = [&](const std::string& name) {
    data.push_back(
        {{"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "kvlingo"}});
  };
  for (const std::string& m : models) add(m);
  if (!router_model.empty()) add(router_model);
  return Str(Json{{"object", "list"}, {"data", data}});
}

}  // namespace kvl::server
