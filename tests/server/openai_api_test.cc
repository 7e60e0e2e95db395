// The OpenAI API's edge on its own: requests parsed and refused field by
// field, errors mapped to HTTP statuses, responses' shapes, and the prefix
// cache's index.
#include "server/openai_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/prefix_index.h"

namespace kvl::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::json;

TurnLimits Limits() {
  TurnLimits limits;
  limits.max_turn_bytes = 100;
  limits.max_new_tokens_limit = 64;
  limits.max_system_prompt_bytes = 50;
  limits.max_import_bytes = 250;
  return limits;
}

absl::StatusOr<CompletionRequest> Parse(const Json& body) {
  return ParseCompletionRequest(body.dump(), Limits());
}

Json Minimal() { return {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}; }

TEST(OpenAiApiTest, AConversationBecomesSystemPromptTurnsAndTheLastMessage) {
  Json body = Minimal();
  body["messages"] = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "developer"}, {"content", "Be kind."}},
      {{"role", "user"}, {"content", "a"}},
      {{"role", "assistant"}, {"content", "b"}},
      {{"role", "user"},
       {"content", {{{"type", "text"}, {"text", "c"}}, {{"type", "text"}, {"text", "d"}}}}}};
  absl::StatusOr<CompletionRequest> r = Parse(body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->system_prompt, "Be brief.\n\nBe kind.");
  ASSERT_EQ(r->history.size(), 1u);
  EXPECT_EQ(r->history[0].user, "a");
  EXPECT_EQ(r->history[0].assistant, "b");
  EXPECT_EQ(r->user_message, "cd");
  // OpenAI's defaults, and the server's token limit.
  EXPECT_EQ(r->sampling.temperature, 1.0);
  EXPECT_EQ(r->sampling.top_p, 1.0);
  EXPECT_EQ(r->max_tokens, 64);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->seed.has_value());
}

TEST(OpenAiApiTest, SamplingFieldsAreRead) {
  Json body = Minimal();
  body.update({{"temperature", 0},
               {"top_p", 0.5},
               {"seed", 42},
               {"max_completion_tokens", 10},
               {"max_tokens", 20},
               {"stop", "END"},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"user", "u-1"},
               {"kvlingo", {{"strategy", "reprefill"}, {"prefix_cache", false}, {"native_layers", 2}}},
               {"metadata", {{"ignored", "yes"}}},
               {"frequency_penalty", 0},
               {"tool_choice", "auto"}});
  absl::StatusOr<CompletionRequest> r = Parse(body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.temperature, 0.0);
  EXPECT_EQ(r->sampling.top_p, 0.5);
  EXPECT_EQ(r->seed, 42u);
  EXPECT_EQ(r->max_tokens, 10);  // max_completion_tokens wins
  EXPECT_EQ(r->stop, std::vector<std::string>({"END"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->user, "u-1");
  EXPECT_EQ(r->strategy, router::Strategy::kReprefill);
  EXPECT_FALSE(r->use_prefix_cache);
  EXPECT_EQ(r->native_layers, 2);
  EXPECT_TRUE(Parse(Minimal())->use_prefix_cache);
  EXPECT_FALSE(Parse(Minimal())->native_layers.has_value());
}

// Each refusal names the field in OpenAI's `param`.
TEST(OpenAiApiTest, RefusalsNameTheirField) {
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"messages", Minimal()["messages"]}}, "model"},
      {{{"model", 3}, {"messages", Minimal()["messages"]}}, "model"},
      {{{"model", "m"}}, "messages"},
      {{{"model", "m"}, {"messages", Json::array()}}, "messages"},
      {{{"model", "m"}, {"messages", {{{"role", "assistant"}, {"content", "x"}}}}},
       "messages[0].role"},
      {{{"model", "m"},
        {"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "user"}, {"content", "y"}}}}},
       "messages[1].role"},
      {{{"model", "m"},
        {"messages",
         {{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", "y"}}}}},
       "messages"},
      {{{"model", "m"},
        {"messages",
         {{{"role", "user"}, {"content", "x"}}, {{"role", "system"}, {"content", "y"}}}}},
       "messages[1].role"},
      {{{"model", "m"}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}}, "messages[0].role"},
      {{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", ""}}}}},
       "messages[0].content"},
      {{{"model", "m"},
        {"messages",
         {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}},
       "messages[0].content[0]"},
      {{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", std::string(101, 'a')}}}}},
       "messages[0].content"},
      {{{"model", "m"},
        {"messages",
         {{{"role", "system"}, {"content", std::string(51, 'a')}},
          {{"role", "user"}, {"content", "x"}}}}},
       "messages"},
  };
  for (const auto& [body, param] : cases) {
    absl::StatusOr<CompletionRequest> r = Parse(body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ApiErrorOf(r.status()).param, param) << r.status() << " for " << body.dump();
  }
  const std::vector<std::pair<Json, std::string>> fields = {
      {{{"temperature", 2.5}}, "temperature"},
      {{{"temperature", "hot"}}, "temperature"},
      {{{"top_p", 1.5}}, "top_p"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_tokens", 65}}, "max_tokens"},
      {{{"max_completion_tokens", 1.5}}, "max_completion_tokens"},
      {{{"n", 2}}, "n"},
      {{{"tools", {{{"type", "function"}}}}}, "tools"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"logprobs", true}}, "logprobs"},
      {{{"presence_penalty", 0.5}}, "presence_penalty"},
      {{{"logit_bias", {{"1", 5}}}}, "logit_bias"},
      {{{"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"stop", {"a", ""}}}, "stop[1]"},
      {{{"stop", 3}}, "stop"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"seed", "x"}}, "seed"},
      {{{"kvlingo", {{"strategy", "guess"}}}}, "kvlingo.strategy"},
      {{{"kvlingo", {{"other", 1}}}}, "kvlingo"},
      {{{"kvlingo", {{"a b: c", 1}}}}, "kvlingo"},
      {{{"kvlingo", {{"prefix_cache", "no"}}}}, "kvlingo.prefix_cache"},
      {{{"kvlingo", {{"native_layers", -1}}}}, "kvlingo.native_layers"},
      {{{"kvlingo", {{"native_layers", 1.5}}}}, "kvlingo.native_layers"},
  };
  for (const auto& [extra, param] : fields) {
    Json body = Minimal();
    body.update(extra);
    absl::StatusOr<CompletionRequest> r = Parse(body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ApiErrorOf(r.status()).param, param) << r.status() << " for " << body.dump();
  }
  // Not JSON, not an object.
  EXPECT_EQ(ParseCompletionRequest("{", Limits()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCompletionRequest("[]", Limits()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OpenAiApiTest, TheMessagesTogetherAreBounded) {
  Json body = Minimal();
  Json messages = Json::array();
  for (int i = 0; i < 3; ++i) {
    messages.push_back({{"role", "user"}, {"content", std::string(60, 'u')}});
    messages.push_back({{"role", "assistant"}, {"content", std::string(60, 'a')}});
  }
  messages.push_back({{"role", "user"}, {"content", "x"}});
  body["messages"] = messages;
  absl::StatusOr<CompletionRequest> r = Parse(body);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("server.max_import_bytes"));
  EXPECT_EQ(ApiErrorOf(r.status()).param, "messages[4]");
}

TEST(OpenAiApiTest, StatusesMapToHttpStatusesAndOpenAiTypes) {
  struct Case {
    absl::Status status;
    int http;
    std::string type, code;
  };
  const std::vector<Case> cases = {
      {absl::InvalidArgumentError("x: bad"), 400, "invalid_request_error", ""},
      {absl::OutOfRangeError("too long"), 400, "invalid_request_error", "context_length_exceeded"},
      {absl::UnauthenticatedError("no key"), 401, "authentication_error", "invalid_api_key"},
      {absl::PermissionDeniedError("no right"), 403, "permission_error", ""},
      {absl::NotFoundError("model: no such model"), 404, "invalid_request_error",
       "model_not_found"},
      {absl::ResourceExhaustedError("busy"), 429, "rate_limit_error", "rate_limit_exceeded"},
      {absl::UnavailableError("draining"), 503, "service_unavailable", ""},
      {absl::DeadlineExceededError("late"), 504, "timeout", ""},
      {absl::InternalError("bug"), 500, "server_error", ""},
  };
  for (const Case& c : cases) {
    const ApiError e = ApiErrorOf(c.status);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.type, c.type) << c.status;
    EXPECT_EQ(e.code, c.code) << c.status;
  }
  // A message that does not begin with a field names none.
  EXPECT_EQ(ApiErrorOf(absl::InvalidArgumentError("the session 'x' is busy: retry")).param, "");
  const Json json = Json::parse(ApiErrorJson(ApiErrorOf(absl::InvalidArgumentError("top_p: no"))));
  EXPECT_EQ(json["error"]["param"], "top_p");
  EXPECT_EQ(json["error"]["message"], "top_p: no");
  EXPECT_TRUE(json["error"]["code"].is_null());
}

TEST(OpenAiApiTest, ResponsesHaveOpenAisShape) {
  ServedPrompt served;
  served.model = "kvl-large";
  served.previous_model = "kvl-small";
  served.switched = true;
  served.prompt_tokens = 100;
  served.own_cache_tokens = 10;
  served.translated_tokens = 80;
  served.prefilled_tokens = 10;
  served.completion_tokens = 5;
  const Json c = Json::parse(CompletionJson("chatcmpl-1", 7, served, "hello", "stop"));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["model"], "kvl-large");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 105);
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 90);
  EXPECT_EQ(c["kvlingo"]["prompt_tokens_translated"], 80);
  EXPECT_EQ(c["kvlingo"]["previous_model"], "kvl-small");

  const Json first = Json::parse(ChunkJson("chatcmpl-1", 7, "kvl-large", DeltaJson("", true), ""));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("kvlingo"));
  const Json usage = Json::parse(UsageChunkJson("chatcmpl-1", 7, served));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 100);
  EXPECT_EQ(OpenAiFinishReason(FinishReason::kLength), "length");
  EXPECT_EQ(OpenAiFinishReason(FinishReason::kStopString), "stop");

  const Json models = Json::parse(ModelsJson({"a", "b"}, "kvlingo", 1));
  ASSERT_EQ(models["data"].size(), 3u);
  EXPECT_EQ(models["data"][2]["id"], "kvlingo");
  EXPECT_EQ(Json::parse(ModelsJson({"a"}, "", 1))["data"].size(), 1u);
}

TEST(PrefixIndexTest, TakesTheLongestHeldPrefixAndHoldsItsSession) {
  const PrefixIndex::Key root = PrefixIndex::Root("acme", "sys");
  const PrefixIndex::Key one = PrefixIndex::Extend(root, "u1", "a1");
  const PrefixIndex::Key two = PrefixIndex::Extend(one, "u2", "a2");
  // Digests tell tenants, prompts and field boundaries apart.
  EXPECT_NE(PrefixIndex::Root("", "sys"), root);
  EXPECT_NE(PrefixIndex::Root("acme", "sys2"), root);
  EXPECT_NE(PrefixIndex::Extend(root, "u1a", "1"), one);
  EXPECT_EQ(PrefixIndex::Extend(root, "u1", "a1"), one);

  PrefixIndex index(10);
  EXPECT_TRUE(index.Put({root, one}, "s1").empty());
  EXPECT_TRUE(index.Put({root}, "s0").empty());  // the newer session takes the root
  std::optional<PrefixIndex::Hit> hit = index.Take({root, one, two});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->session_id, "s1");
  EXPECT_EQ(hit->index, 1u);
  EXPECT_TRUE(hit->head);
  // Held: the next request for the same conversation gets the other session.
  hit = index.Take({root, one, two});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->session_id, "s0");
  EXPECT_EQ(hit->index, 0u);
  EXPECT_FALSE(index.Take({root, one, two}).has_value());
  // s1 goes on to `two`; `one` is still its own, no longer its head.
  EXPECT_TRUE(index.Put({one, two}, "s1").empty());
  index.Release("s0");
  hit = index.Take({root, one});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->session_id, "s1");
  EXPECT_EQ(hit->index, 1u);
  EXPECT_FALSE(hit->head);  // a fork's source
  index.Release("s1");
  EXPECT_EQ(index.sessions(), 2);
}

TEST(PrefixIndexTest, PastItsCapacityTheLeastRecentlyPutGoes) {
  PrefixIndex index(2);
  const PrefixIndex::Key a = PrefixIndex::Root("", "a"), b = PrefixIndex::Root("", "b"),
                         c = PrefixIndex::Root("", "c");
  EXPECT_TRUE(index.Put({a}, "sa").empty());
  EXPECT_TRUE(index.Put({b}, "sb").empty());
  // A held session is not pushed out: the next least recent goes.
  ASSERT_TRUE(index.Take({a}).has_value());
  EXPECT_EQ(index.Put({c}, "sc"), std::vector<std::string>({"sb"}));
  index.Release("sa");
  EXPECT_EQ(index.Put({b}, "sb2"), std::vector<std::string>({"sa"}));
  // Another session put under a session's head replaces it.
  EXPECT_EQ(index.Put({c}, "sc2"), std::vector<std::string>({"sc"}));
  EXPECT_TRUE(index.Forget("sc2"));
  EXPECT_FALSE(index.Forget("sc2"));
  EXPECT_EQ(index.sessions(), 1);
  EXPECT_FALSE(index.Take({c}).has_value());
}

}  // namespace
}  // namespace kvl::server
