// The OpenAI API end to end: kvl-server with the house models (kvl-small,
// kvl-large and their translators) and an API key, driven by the real
// `openai` npm client (tests/server/openai_client.cjs) and, for the wire
// format, by cpp-httplib's client.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "base/sha256.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;
using Json = nlohmann::json;

constexpr char kKey[] = "sk-test-openai-0123456789";

class OpenAiHttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("openai-http");
    const std::string models = std::string(KVL_SOURCE_DIR) + "/models";
    const Json config = {
        {"server", {{"http_address", "127.0.0.1:0"}, {"drain_timeout_seconds", 5}}},
        {"models",
         {{{"name", "kvl-small"}, {"path", models + "/kvl-small"}},
          {{"name", "kvl-large"}, {"path", models + "/kvl-large"}}}},
        {"translators",
         {{{"source", "kvl-small"},
           {"target", "kvl-large"},
           {"path", models + "/translators/kvl-small__kvl-large.safetensors"}},
          {{"source", "kvl-large"},
           {"target", "kvl-small"},
           {"path", models + "/translators/kvl-large__kvl-small.safetensors"}}}},
        {"routing",
         // No native tail: every span a switch's target lacks is translated.
         {{"policy", "fixed"}, {"default_model", "kvl-small"}, {"native_tail_tokens", 0}}},
        {"auth", {{"keys", {{{"name", "app"}, {"tenant", "acme"}, {"sha256", Sha256Hex(kKey)}}}}}}};
    const std::string path = dir_->WriteFile("server.json", config.dump(2));
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> process =
        testing::Subprocess::Start({KVL_SERVER_BIN, "--config", path, "--listen", "127.0.0.1:0",
                                    "--metrics-address", "127.0.0.1:0"});
    ASSERT_TRUE(process.ok()) << process.status();
    server_ = process->release();
    absl::StatusOr<std::string> ready =
        server_->WaitForLine(testing::Stream::kStdout, "kvl-server listening on", 120s);
    ASSERT_TRUE(ready.ok()) << ready.status() << server_->Describe();
    std::smatch m;
    const std::string out = server_->stdout_text();
    ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(OpenAI API on 127\.0\.0\.1:(\d+))")))
        << out;
    http_port_ = std::stoi(m[1]);
    ASSERT_TRUE(std::regex_search(*ready, m, std::regex(R"(metrics on \S+:(\d+)$)"))) << *ready;
    metrics_port_ = std::stoi(m[1]);
  }

  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      EXPECT_TRUE(server_->Signal(SIGTERM).ok());
      absl::StatusOr<int> code = server_->Wait(30s);
      EXPECT_TRUE(code.ok() && *code == 0) << server_->Describe();
      delete server_;
    }
    delete dir_;
  }

  static httplib::Client Client() {
    httplib::Client client("127.0.0.1", http_port_);
    client.set_read_timeout(60, 0);
    client.set_bearer_token_auth(kKey);
    return client;
  }

  static std::string Metrics() {
    absl::StatusOr<testing::HttpResponse> got =
        testing::HttpGet("127.0.0.1", metrics_port_, "/metrics");
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? got->body : "";
  }

  static testing::TempDir* dir_;
  static testing::Subprocess* server_;
  static int http_port_, metrics_port_;
};

testing::TempDir* OpenAiHttpTest::dir_ = nullptr;
testing::Subprocess* OpenAiHttpTest::server_ = nullptr;
int OpenAiHttpTest::http_port_ = 0;
int OpenAiHttpTest::metrics_port_ = 0;

// The npm `openai` client: completions streamed and not, a stateless
// conversation alternating kvl-small and kvl-large, the router model, errors.
TEST_F(OpenAiHttpTest, TheOpenAiClientIsServedAndSwitchesAreTranslated) {
  if (std::string(KVL_NODE).empty()) GTEST_FAIL() << "no node (scripts/setup.sh installs it)";
  const std::string base = "http://127.0.0.1:" + std::to_string(http_port_) + "/v1";
  const std::string metrics = "http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics";
  auto run = testing::RunProcess(
      {KVL_NODE, std::string(KVL_SOURCE_DIR) + "/tests/server/openai_client.cjs",
       std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules", base, kKey, metrics},
      240s);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err << server_->stderr_text();
  const Json out = Json::parse(run->out);

  EXPECT_EQ(out["models"], Json({"kvl-small", "kvl-large", "kvlingo"}));

  const Json& basic = out["basic"];
  EXPECT_EQ(basic["object"], "chat.completion");
  EXPECT_EQ(basic["model"], "kvl-small");
  EXPECT_EQ(basic["role"], "assistant");
  EXPECT_FALSE(basic["content"].get<std::string>().empty());
  EXPECT_EQ(
      basic["usage"]["total_tokens"].get<int>(),
      basic["usage"]["prompt_tokens"].get<int>() + basic["usage"]["completion_tokens"].get<int>());
  EXPECT_EQ(basic["kvlingo"]["reused_turns"], 0);
  EXPECT_EQ(basic["kvlingo"]["prompt_tokens_prefilled"], basic["usage"]["prompt_tokens"]);

  // Streamed, the same request gives the same text (greedy), the role first,
  // the usage chunk last with no choices.
  const Json& stream = out["stream"];
  EXPECT_EQ(stream["first_role"], "assistant");
  EXPECT_EQ(stream["content"], basic["content"]);
  EXPECT_EQ(stream["finish_reason"], basic["finish_reason"]);
  EXPECT_EQ(stream["last_has_choices"], 0);
  EXPECT_EQ(stream["usage"]["completion_tokens"], basic["usage"]["completion_tokens"]);
  EXPECT_EQ(stream["usage"]["prompt_tokens"], basic["usage"]["prompt_tokens"]);
  EXPECT_EQ(stream["kvlingo"]["model"], "kvl-small");

  // Every request after the first finds the conversation cached, and every
  // one is a switch, served translated: the first translates kvl-small's long
  // first turn, later ones the other model's last turn, while the answering
  // model's own earlier turns are in its line.
  const Json& turns = out["alternate"];
  ASSERT_EQ(turns.size(), 4u);
  for (size_t t = 0; t < turns.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t) + ": " + turns[t].dump());
    const Json& k = turns[t]["kvlingo"];
    EXPECT_EQ(turns[t]["model"], t % 2 == 0 ? "kvl-small" : "kvl-large");
    EXPECT_EQ(k["request_turns"], t);
    EXPECT_EQ(k["reused_turns"], t);
    EXPECT_EQ(turns[t]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
              k["prompt_tokens_own_cache"].get<int>() + k["prompt_tokens_translated"].get<int>());
    EXPECT_EQ(k["prompt_tokens_own_cache"].get<int>() + k["prompt_tokens_translated"].get<int>() +
                  k["prompt_tokens_prefilled"].get<int>(),
              turns[t]["usage"]["prompt_tokens"].get<int>());
    if (t == 0) {
      EXPECT_EQ(k["switched"], false);
      continue;
    }
    EXPECT_EQ(k["switched"], true);
    EXPECT_EQ(k["path"], "translated");
    EXPECT_GT(k["prompt_tokens_translated"].get<int>(), 0);
    // Prefilled: the new question and what the template adds around it.
    EXPECT_LT(k["prompt_tokens_prefilled"].get<int>(), 40);
    if (t == 1) {
      EXPECT_GT(k["prompt_tokens_translated"].get<int>(), 100);
    } else {
      EXPECT_GT(k["prompt_tokens_own_cache"].get<int>(), 100);
    }
  }

  // After repair, the next turn equals the reply of its twin, which kvl-large
  // prefilled from the text alone.
  EXPECT_EQ(out["repair_backlog"], 0);
  EXPECT_EQ(out["later"]["kvlingo"]["reused_turns"], 4);
  EXPECT_EQ(out["twin"]["kvlingo"]["reused_turns"], 0);
  EXPECT_EQ(out["twin"]["kvlingo"]["prompt_tokens_own_cache"], 0);
  EXPECT_EQ(out["later"]["content"], out["twin"]["content"]);

  EXPECT_EQ(out["routed"]["model"], "kvl-small");
  EXPECT_EQ(out["routed"]["kvlingo"]["policy"], "fixed");

  const Json& errors = out["errors"];
  EXPECT_EQ(errors["temperature"]["status"], 400);
  EXPECT_EQ(errors["temperature"]["param"], "temperature");
  EXPECT_EQ(errors["model"]["status"], 404);
  EXPECT_EQ(errors["model"]["code"], "model_not_found");
  EXPECT_EQ(errors["roles"]["status"], 400);
  EXPECT_EQ(errors["roles"]["param"], "messages[0].role");
  EXPECT_EQ(errors["n"]["status"], 400);
  EXPECT_EQ(errors["key"]["status"], 401);
  EXPECT_EQ(errors["key"]["class"], "AuthenticationError");

  const std::string text = Metrics();
  EXPECT_THAT(text, HasSubstr("kvlingo_prefix_cache_lookups_total{result=\"hit\"}"));
  EXPECT_THAT(text,
              ::testing::ContainsRegex(
                  "kvlingo_prompt_tokens_total\\{model=\"kvl-large\",source=\"translated\"\\} "
                  "[1-9]"));
  EXPECT_THAT(text,
              ::testing::ContainsRegex(
                  "kvlingo_http_requests_total\\{route=\"/v1/chat/completions\",status=\"401\"\\} "
                  "[1-9]"));
}

// The wire format as a plain HTTP client reads it.
TEST_F(OpenAiHttpTest, StreamsAreServerSentEventsEndingInDone) {
  httplib::Client client = Client();
  const Json body = {{"model", "kvl-small"},
                     {"stream", true},
                     {"max_tokens", 6},
                     {"temperature", 0},
                     {"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}}};
  httplib::Result r = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->get_header_value("Content-Type"), StartsWith("text/event-stream"));
  // Events are "data: <json>" separated by blank lines, comments aside.
  std::vector<std::string> events;
  size_t at = 0;
  const std::string& text = r->body;
  while (at < text.size()) {
    const size_t end = text.find("\n\n", at);
    ASSERT_NE(end, std::string::npos) << "an event without its blank line: " << text.substr(at);
    const std::string event = text.substr(at, end - at);
    at = end + 2;
    if (event.rfind(":", 0) == 0) continue;
    ASSERT_THAT(event, StartsWith("data: "));
    EXPECT_EQ(event.find('\n'), std::string::npos) << event;
    events.push_back(event.substr(6));
  }
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json first = Json::parse(events.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const Json last = Json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last.contains("kvlingo"));
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(Json::parse(events[i])["id"], first["id"]);
  }
}

// Errors are OpenAI's JSON objects with their HTTP statuses, httplib's own
// answers (an unknown route, a body over the limit) included.
TEST_F(OpenAiHttpTest, ErrorsAreOpenAiShaped) {
  httplib::Client client = Client();
  auto expect_error = [](const httplib::Result& r, int status, const std::string& param) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const Json e = Json::parse(r->body)["error"];
    EXPECT_TRUE(e["message"].is_string()) << r->body;
    EXPECT_TRUE(e["type"].is_string()) << r->body;
    if (param.empty()) {
      EXPECT_TRUE(e["param"].is_null()) << r->body;
    } else {
      EXPECT_EQ(e["param"], param) << r->body;
    }
  };
  expect_error(client.Post("/v1/chat/completions", "{not json", "application/json"), 400, "");
  expect_error(client.Post("/v1/chat/completions",
                           R"({"model": "kvl-small", "messages": [{"role": "user", "content": "a"},
                               {"role": "user", "content": "b"}]})",
                           "application/json"),
               400, "messages[1].role");
  expect_error(client.Post("/v1/chat/completions",
                           R"({"model": "kvl-small", "messages": [{"role": "user", "content": "a"}],
                               "max_tokens": 100000000})",
                           "application/json"),
               400, "max_tokens");
  expect_error(client.Get("/v1/nothing"), 404, "");
  expect_error(client.Post("/v1/chat/completions", std::string(32 << 20, 'x'), "application/json"),
               413, "");
  httplib::Client anonymous("127.0.0.1", http_port_);
  expect_error(anonymous.Get("/v1/models"), 401, "");
}

// The native-depth dial through the API: a switch with native_layers of the
// target's depth (6: every layer computed, no residual map needed) reports
// path "hybrid"; a k whose residual map the committed translator lacks is a
// 400 naming kvlingo.native_layers, and the conversation is left as it was.
TEST_F(OpenAiHttpTest, NativeLayersReachTheSwitch) {
  httplib::Client client = Client();
  const Json first_turn = {{"role", "user"},
                           {"content", "Remember this: the launch code is 4417. Reply ok."}};
  auto first = client.Post(
      "/v1/chat/completions",
      Json({{"model", "kvl-small"}, {"max_tokens", 4}, {"messages", {first_turn}}}).dump(),
      "application/json");
  ASSERT_TRUE(first && first->status == 200) << (first ? first->body : "no reply");
  const std::string reply =
      Json::parse(first->body)["choices"][0]["message"]["content"].get<std::string>();
  const Json messages = {first_turn,
                         {{"role", "assistant"}, {"content", reply}},
                         {{"role", "user"}, {"content", "What is the code?"}}};
  auto ask = [&](int64_t k) {
    return client.Post("/v1/chat/completions",
                       Json({{"model", "kvl-large"},
                             {"max_tokens", 4},
                             {"messages", messages},
                             {"kvlingo", {{"native_layers", k}}}})
                           .dump(),
                       "application/json");
  };
  auto refused = ask(2);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(Json::parse(refused->body)["error"]["param"], "kvlingo.native_layers")
      << refused->body;
  auto full = ask(6);
  ASSERT_TRUE(full && full->status == 200) << (full ? full->body : "no reply");
  const Json k = Json::parse(full->body)["kvlingo"];
  EXPECT_EQ(k["path"], "hybrid") << full->body;
  EXPECT_EQ(k["native_layers"], 6) << full->body;
  EXPECT_GT(k["prompt_tokens_translated"].get<int>(), 0) << full->body;
}

// A client that goes away stops its turn, streamed or not: the conversation is
// left as it was, so a retry of the same request finds the cached prefix.
TEST_F(OpenAiHttpTest, AClosedStreamCancelsItsTurn) {
  httplib::Client client = Client();
  const Json first = {{"model", "kvl-small"},
                      {"max_tokens", 8},
                      {"temperature", 0},
                      {"messages", {{{"role", "user"}, {"content", "Write a long poem."}}}}};
  httplib::Result r = client.Post("/v1/chat/completions", first.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
  const std::string reply = Json::parse(r->body)["choices"][0]["message"]["content"];
  Json next = {{"model", "kvl-small"},
               {"stream", true},
               {"max_tokens", 2000},
               {"temperature", 1.5},
               {"seed", 7},
               {"messages",
                {{{"role", "user"}, {"content", "Write a long poem."}},
                 {{"role", "assistant"}, {"content", reply}},
                 {{"role", "user"}, {"content", "Another, longer."}}}}};
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = next.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Authorization", std::string("Bearer ") + kKey);
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  httplib::Client streaming("127.0.0.1", http_port_);
  httplib::Response res;
  httplib::Error error;
  streaming.send(req, res, error);
  EXPECT_EQ(chunks, 2);
  // The cancelled turn committed nothing: the same request again reuses the
  // one completed turn (not the cancelled one's).
  next["stream"] = false;
  next["max_tokens"] = 4;
  r = client.Post("/v1/chat/completions", next.dump(), "application/json");
  for (int i = 0;
       i < 100 && r && r->status == 200 && Json::parse(r->body)["kvlingo"]["reused_turns"] != 1;
       ++i) {
    // The cancelled turn may still be unwinding and hold the conversation.
    std::this_thread::sleep_for(50ms);
    r = client.Post("/v1/chat/completions", next.dump(), "application/json");
  }
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
  EXPECT_EQ(Json::parse(r->body)["kvlingo"]["reused_turns"], 1) << r->body;

  // Not streamed: the client gives up after 150 ms and closes; the server
  // notices, cancels the turn and counts the request as 499.
  auto cancelled = [] {
    const std::string text = Metrics();
    std::smatch m;
    static const std::regex kLine(
        R"re(kvlingo_http_requests_total\{route="/v1/chat/completions",status="499"\} (\d+))re");
    return std::regex_search(text, m, kLine) ? std::stoi(m[1]) : 0;
  };
  const int before = cancelled();
  Json long_reply = {{"model", "kvl-large"},
                     {"max_tokens", 2000},
                     {"temperature", 2.0},
                     {"seed", 11},
                     {"messages", {{{"role", "user"}, {"content", "Write a very long story."}}}}};
  httplib::Client impatient = Client();
  impatient.set_read_timeout(0, 150000);
  httplib::Result gone =
      impatient.Post("/v1/chat/completions", long_reply.dump(), "application/json");
  EXPECT_FALSE(gone) << "the reply came within 150 ms: " << gone->body;
  int after = before;
  for (int i = 0; i < 100 && after == before; ++i) {
    std::this_thread::sleep_for(50ms);
    after = cancelled();
  }
  EXPECT_EQ(after, before + 1);
}

// X-Kvl-Timeout-Ms is the request's deadline, as gRPC's: a turn still running
// when it passes stops, and the client gets 504.
TEST_F(OpenAiHttpTest, ADeadlineStopsTheTurn) {
  httplib::Client client = Client();
  const Json body = {{"model", "kvl-large"},
                     {"max_tokens", 2000},
                     {"temperature", 2.0},
                     {"seed", 5},
                     {"messages", {{{"role", "user"}, {"content", "Tell a long tale."}}}}};
  httplib::Result r = client.Post("/v1/chat/completions", {{"X-Kvl-Timeout-Ms", "100"}},
                                  body.dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_EQ(Json::parse(r->body)["error"]["type"], "timeout") << r->body;
  // Streamed: once the stream has begun, the deadline comes as an error event
  // before [DONE] (or, if it passed before the first event, as the 504).
  Json streamed = body;
  streamed["stream"] = true;
  r = client.Post("/v1/chat/completions", {{"X-Kvl-Timeout-Ms", "400"}}, streamed.dump(),
                  "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  if (r->status == 200) {
    const size_t error = r->body.find("data: {\"error\":");
    ASSERT_NE(error, std::string::npos) << r->body;
    EXPECT_NE(r->body.find("\"type\":\"timeout\"", error), std::string::npos) << r->body;
    EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n") << r->body;
  } else {
    EXPECT_EQ(r->status, 504) << r->body;
  }
  r = client.Post("/v1/chat/completions", {{"X-Kvl-Timeout-Ms", "soon"}}, body.dump(),
                  "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(Json::parse(r->body)["error"]["param"], "X-Kvl-Timeout-Ms") << r->body;
}

// A request that regenerates a reply (the same request again) or edits the
// history finds the conversation's session gone on past its prefix: the
// session is forked at the longest prefix the request shares with it, and the
// original goes on untouched.
TEST_F(OpenAiHttpTest, RegeneratingAReplyForksTheCachedConversation) {
  httplib::Client client = Client();
  auto post = [&](const Json& messages, const std::string& model) {
    const Json body = {
        {"model", model}, {"max_tokens", 12}, {"temperature", 0}, {"messages", messages}};
    httplib::Result r = client.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
    return r && r->status == 200 ? Json::parse(r->body) : Json::object();
  };
  std::string facts;
  for (int i = 0; i < 12; ++i) {
    facts += "Box " + std::to_string(i) + " holds " + std::to_string(300 + 7 * i) + " marbles. ";
  }
  Json messages = {{{"role", "user"}, {"content", "Please remember. " + facts}}};
  const Json first = post(messages, "kvl-small");
  ASSERT_FALSE(first.empty());
  messages.push_back(
      {{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "How many marbles are in box 4?"}});
  const Json second = post(messages, "kvl-large");
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(second["kvlingo"]["reused_turns"], 1);
  EXPECT_EQ(second["kvlingo"]["path"], "translated");

  // The same request again: a fork of the conversation's first turn, with
  // kvl-large's line (translated at the switch, or repaired since) copied.
  const Json again = post(messages, "kvl-large");
  ASSERT_FALSE(again.empty());
  SCOPED_TRACE(again.dump());
  EXPECT_EQ(again["kvlingo"]["reused_turns"], 1);
  EXPECT_NE(again["kvlingo"]["conversation_id"], second["kvlingo"]["conversation_id"]);
  EXPECT_GT(again["kvlingo"]["prompt_tokens_own_cache"].get<int>(), 100);
  EXPECT_LT(again["kvlingo"]["prompt_tokens_prefilled"].get<int>(), 40);

  // The conversation goes on from the turn it reached (the original's, or the
  // fork's when the fork's reply was the same: the newer holds it).
  Json on = messages;
  on.push_back({{"role", "assistant"}, {"content", second["choices"][0]["message"]["content"]}});
  on.push_back({{"role", "user"}, {"content", "And in box 9?"}});
  const Json third = post(on, "kvl-small");
  ASSERT_FALSE(third.empty());
  EXPECT_EQ(third["kvlingo"]["reused_turns"], 2);
  EXPECT_EQ(third["kvlingo"]["prompt_tokens_translated"].get<int>() +
                third["kvlingo"]["prompt_tokens_own_cache"].get<int>(),
            third["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>());

  // An edited reply shares only the first user message: nothing to reuse at
  // a turn boundary, so it is prefilled.
  Json edited = messages;
  edited[1]["content"] = "I will remember the boxes.";
  const Json fresh = post(edited, "kvl-large");
  ASSERT_FALSE(fresh.empty());
  EXPECT_EQ(fresh["kvlingo"]["reused_turns"], 0);
  EXPECT_EQ(fresh["kvlingo"]["prompt_tokens_own_cache"], 0);
}

}  // namespace
}  // namespace kvl
