// End-to-end: the real kvl-server with three small random models and fitted
// translators, driven by a Python gRPC client (Debian's python3-grpcio):
// every policy and strategy, bad inputs, 16 concurrent sessions, eviction
// under a tiny budget, and /metrics. Outputs are checked against an
// in-process router over the same files (which router_test checks against
// engines driven by hand).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cache_store/cache_store.h"
#include "router/router.h"
#include "server/config.h"
#include "server/model_runtime.h"
#include "tests/router/model_fixture.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Json = nlohmann::json;

const std::vector<std::pair<std::string, std::string>> kPairs = {
    {"small", "large"},   {"large", "small"},   {"small", "small-b"},
    {"small-b", "small"}, {"small-b", "large"}, {"large", "small-b"}};

struct Running {
  std::unique_ptr<testing::Subprocess> process;
  std::string address;
  int metrics_port = 0;
};

class RouterE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("router-e2e");
    ASSERT_TRUE(testing::WriteFixtureModels(dir_->path()).ok());
    // One shape-changing pair with joint-input maps: the server translates
    // with them as with split ones.
    ASSERT_TRUE(testing::WriteFixtureTranslators(dir_->path(), kPairs, {{"small", "large"}}).ok());
    stubs_ = dir_->MakeDir("stubs");
    auto protoc = testing::RunProcess(
        {"protoc", "--proto_path=" + std::string(KVL_SOURCE_DIR) + "/proto",
         "--python_out=" + stubs_, "kvlingo/v1/chat.proto", "kvlingo/v1/session.proto",
         "kvlingo/v1/model.proto"},
        30s, {std::string(KVL_SOURCE_DIR) + "/proto", {}});
    ASSERT_TRUE(protoc.ok() && protoc->exit_code == 0);
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    if (std::string(KVL_SYSTEM_PYTHON).empty()) GTEST_FAIL() << "no system python3 (scripts/setup.sh installs it)";
    auto has_grpc = testing::RunProcess({KVL_SYSTEM_PYTHON, "-c", "import grpc"}, 30s);
    if (!has_grpc.ok() || has_grpc->exit_code != 0) GTEST_FAIL() << "python3-grpcio is not installed (scripts/setup.sh installs it)";
  }

  static std::string Config(int64_t budget) {
    Json models = Json::array(), translators = Json::array();
    for (const auto& m : testing::FixtureModels()) {
      models.push_back({{"name", m.name}, {"path", dir_->path() + "/" + m.name}});
    }
    for (const auto& [s, t] : kPairs) {
      translators.push_back(
          {{"source", s}, {"target", t}, {"path", testing::TranslatorPath(dir_->path(), s, t)}});
    }
    translators[0]["compute_dtype"] = "float32";  // the others: "auto"
    Json config = {
        {"server", {{"max_turn_bytes", 2000}, {"max_new_tokens_limit", 2000},
                    {"max_system_prompt_bytes", 2000},
                    {"drain_timeout_seconds", 5}}},
        {"runtime", {{"threads", 1}}},
        {"models", models},
        {"translators", translators},
        {"routing",
         {{"policy", "fixed"},
          {"default_model", "small"},
          {"strategy", "translate"},
          {"models", {"small", "small-b", "large"}},
          {"rules",
           {{{"model", "large"}, {"contains", {"explain"}}},
            {{"model", "small-b"}, {"min_turn", 3}, {"pattern", "^Thanks"}}}},
          {"cascade_min_mean_logprob", -5.0},
          // The clients' turns are a few words: a tail shorter than a turn,
          // so that switches translate (the default, 32, would re-read them).
          {"native_tail_tokens", 4},
          // Greedy outputs are compared with an in-process router's: with
          // background repair a later switch's translation would read a
          // line repaired or not depending on timing (repair has its own
          // tests, router_test.cc RepairTest, and the demo).
          {"repair", "off"}}},
        {"sessions", {{"memory_budget_bytes", budget}}}};
    return config.dump(2);
  }

  static Running Start(const std::string& config_text) {
    Running r;
    const std::string config = dir_->WriteFile("server-" + std::to_string(++n_started_) + ".json",
                                               config_text);
    auto port = testing::FindFreeLoopbackPort();
    EXPECT_TRUE(port.ok());
    auto process = testing::Subprocess::Start(
        {KVL_SERVER_BIN, "--config", config, "--listen", "127.0.0.1:" + std::to_string(*port),
         "--metrics-address", "127.0.0.1:0"});
    EXPECT_TRUE(process.ok()) << process.status();
    auto line = (*process)->WaitForLine(testing::Stream::kStdout, "listening on", 60s);
    EXPECT_TRUE(line.ok()) << line.status();
    std::smatch m;
    static const std::regex kReady(R"(listening on (\S+), metrics on \S+:(\d+)$)");
    EXPECT_TRUE(std::regex_search(*line, m, kReady));
    r.address = m[1];
    r.metrics_port = std::stoi(m[2]);
    r.process = *std::move(process);
    return r;
  }

  static void Stop(Running& r) {
    ASSERT_TRUE(r.process->Signal(SIGTERM).ok());
    auto code = r.process->Wait(20s);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0) << r.process->Describe();
  }

  static Json Client(const Running& r, const std::string& scenario,
                     std::chrono::seconds timeout = 120s) {
    auto run = testing::RunProcess(
        {KVL_SYSTEM_PYTHON, std::string(KVL_SOURCE_DIR) + "/tests/server/router_client.py",
         r.address, stubs_, scenario, std::to_string(r.process->pid())},
        timeout);
    EXPECT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 0) << run->err;
    return Json::parse(run->out);
  }

  // The same turns run in-process: generated ids per turn.
  static std::vector<std::vector<int64_t>> InProcess(const std::vector<std::string>& models,
                                                     const std::vector<std::string>& texts,
                                                     router::Strategy strategy) {
    auto config = server::ParseConfig(Config(int64_t{1} << 30), dir_->path());
    EXPECT_TRUE(config.ok()) << config.status();
    auto runtime = server::LoadModelRuntime(*config, nullptr);
    EXPECT_TRUE(runtime.ok()) << runtime.status();
    router::Router& router = *(*runtime)->router;
    EXPECT_TRUE((*runtime)->store->Create("s", "Be brief.", router.RenderPreamble("Be brief.")).ok());
    std::vector<std::vector<int64_t>> out;
    for (size_t i = 0; i < models.size(); ++i) {
      router::TurnOptions o;
      o.user_message = texts[i];
      o.policy = router::Policy::kExplicit;
      o.explicit_model = router.ModelIndex(models[i]);
      o.strategy = strategy;
      o.max_tokens = 6;
      auto t = router.RunTurn("s", o, {});
      EXPECT_TRUE(t.ok()) << t.status();
      out.push_back(t.ok() ? t->tokens : std::vector<int64_t>{});
    }
    return out;
  }

  static testing::TempDir* dir_;
  static std::string stubs_;
  static int n_started_;
};
testing::TempDir* RouterE2eTest::dir_ = nullptr;
std::string RouterE2eTest::stubs_;
int RouterE2eTest::n_started_ = 0;

std::vector<int64_t> Ids(const Json& turn) { return turn["ids"].get<std::vector<int64_t>>(); }

TEST_F(RouterE2eTest, EveryPolicyAndStrategyAcrossThreeModelsThenMetrics) {
  Running server = Start(Config(int64_t{1} << 30));
  const Json seen = Client(server, "policies");
  EXPECT_EQ(seen["models"], Json({"small", "small-b", "large"}));
  // ListTranslators reports each translator's arithmetic, "auto" resolved.
  const std::string automatic = kvl::DTypeName(kvl::FastestTranslateDtype());
  ASSERT_EQ(seen["translators"].size(), std::size(kPairs));
  for (size_t i = 0; i < std::size(kPairs); ++i) {
    const std::string name = std::string(kPairs[i].first) + "->" + kPairs[i].second;
    EXPECT_EQ(seen["translators"][name], i == 0 ? "float32" : automatic) << name;
    EXPECT_EQ(seen["translator_inputs"][name], i == 0 ? "joint" : "split") << name;
  }
  const Json& runs = seen["runs"];
  for (const auto& [name, turns] : runs.items()) {
    if (name.find(':') != std::string::npos) continue;
    for (const Json& t : turns) {
      ASSERT_EQ(t["code"], "OK") << name << ": " << t.dump();
      EXPECT_THAT(t["order"].get<std::string>(), ::testing::MatchesRegex("RD*S")) << name;
      EXPECT_FALSE(t["routing"]["reason"].get<std::string>().empty()) << name;
      EXPECT_EQ(t["summary"]["generated_tokens"].get<size_t>(), t["ids"].size()) << name;
    }
  }
  // fixed: always small, native.
  for (const Json& t : runs["fixed"]) EXPECT_EQ(t["routing"]["model"], "small");
  // alternate: small, small-b, large; each later turn a translated switch.
  EXPECT_EQ(runs["alternate"][0]["routing"]["model"], "small");
  EXPECT_EQ(runs["alternate"][1]["routing"]["model"], "small-b");
  EXPECT_EQ(runs["alternate"][2]["routing"]["model"], "large");
  EXPECT_EQ(runs["alternate"][2]["routing"]["path"], "CACHE_PATH_TRANSLATED");
  // rules: turn 2 says "explain" -> large; turn 3 starts with "Thanks" -> small-b.
  EXPECT_EQ(runs["rules"][0]["routing"]["model"], "small");
  EXPECT_EQ(runs["rules"][1]["routing"]["model"], "large");
  EXPECT_EQ(runs["rules"][2]["routing"]["model"], "small-b");
  EXPECT_THAT(runs["rules"][2]["routing"]["reason"].get<std::string>(), HasSubstr("rule 1"));
  // cascade: escalates from small (random models are never confident at -5).
  EXPECT_THAT(runs["cascade"][0]["routing"]["reason"].get<std::string>(), HasSubstr("escalated"));
  EXPECT_EQ(runs["cascade"][2]["routing"]["model"], "large");
  // Strategies, A -> B -> C -> A. B and C hold nothing when they switch in;
  // A holds turn 1, so "reprefill-missing" prefills only the rest on its
  // return (a native tail) where "reprefill" starts it over.
  for (const char* s : {"translate", "reprefill", "reprefill-missing"}) {
    const Json& t = runs[std::string("explicit-") + s];
    for (int i = 1; i < 4; ++i) {
      const std::string want = std::string(s) == "translate"   ? "CACHE_PATH_TRANSLATED"
                               : std::string(s) == "reprefill" ? "CACHE_PATH_REPREFILL"
                               : i == 3                        ? "CACHE_PATH_NATIVE_TAIL"
                                                               : "CACHE_PATH_REPREFILL";
      EXPECT_TRUE(t[i]["routing"]["switched"].get<bool>()) << s << i;
      EXPECT_EQ(t[i]["routing"]["path"], want) << s << i;
    }
    const Json& state = runs[std::string("explicit-") + s + ":state"];
    EXPECT_EQ(state["turns"], 4);
    EXPECT_EQ(state["lines"].size(), 3u) << s;
    // Each line's spans cover it in order; a re-prefilled line is all native,
    // a translated one holds translated spans naming their writer (or, once
    // background repair has run, repaired ones).
    for (const Json& line : state["lines"]) {
      const Json& spans = state["spans"][line[0].get<std::string>()];
      int64_t end = 0;
      bool foreign = false;
      for (const Json& sp : spans) {
        EXPECT_EQ(sp[0].get<int64_t>(), end) << s;
        end = sp[1].get<int64_t>();
        const std::string provenance = sp[2].get<std::string>();
        if (provenance == "SPAN_PROVENANCE_TRANSLATED") {
          EXPECT_THAT(sp[3].get<std::string>(), ::testing::AnyOf("small", "small-b", "large"));
          EXPECT_NE(sp[3].get<std::string>(), line[0].get<std::string>());
        } else {
          EXPECT_EQ(sp[3].get<std::string>(), "") << s;
        }
        foreign = foreign || provenance != "SPAN_PROVENANCE_NATIVE";
      }
      EXPECT_EQ(end, line[1].get<int64_t>()) << s;
      if (std::string(s) != "translate") {
        EXPECT_FALSE(foreign) << s << " " << line[0];
      }
    }
    if (std::string(s) == "translate") {
      bool any_foreign = false;
      for (const auto& [model, spans] : state["spans"].items()) {
        for (const Json& sp : spans) any_foreign = any_foreign || sp[2] != "SPAN_PROVENANCE_NATIVE";
      }
      EXPECT_TRUE(any_foreign);
    }
  }
  // Translate keeps A's first line and adds only the missing spans; reprefill
  // re-reads everything.
  EXPECT_LT(runs["explicit-translate"][3]["summary"]["prefill_tokens"].get<int64_t>(),
            runs["explicit-reprefill"][3]["summary"]["prefill_tokens"].get<int64_t>());

  // Greedy outputs equal the in-process router's on the same files.
  const std::vector<std::string> order = {"small", "small-b", "large", "small"};
  const std::vector<std::string> texts = {"Hello, who are you?", "Please explain caches in detail.",
                                          "Thanks! And why?", "One more question."};
  const auto translate = InProcess(order, texts, router::Strategy::kTranslate);
  const auto reprefill = InProcess(order, texts, router::Strategy::kReprefill);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Ids(runs["explicit-translate"][i]), translate[i]) << i;
    EXPECT_EQ(Ids(runs["explicit-reprefill"][i]), reprefill[i]) << i;
  }

  auto metrics = testing::HttpGet("127.0.0.1", server.metrics_port, "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_TRUE(std::regex_search(
      metrics->body,
      std::regex(R"(kvlingo_request_success_total\{finished_reason="[a-z_]+",model="large"\} [1-9])")));
  EXPECT_TRUE(std::regex_search(
      metrics->body, std::regex(R"(kvlingo_e2e_request_latency_seconds_count\{model="small"\} [1-9])")));
  for (const char* path : {"native", "translated", "reprefill", "native-tail"}) {
    const std::regex count(std::string(R"(kvlingo_time_to_first_token_seconds_count\{model="[^"]+",path=")") +
                           path + R"("\} [1-9])");
    EXPECT_TRUE(std::regex_search(metrics->body, count)) << path;
  }
  EXPECT_THAT(metrics->body, HasSubstr("kvlingo_time_to_first_token_seconds_bucket{model=\"large\",path=\"translated\",le=\"2560\"}"));
  EXPECT_TRUE(std::regex_search(
      metrics->body,
      std::regex(R"(kvlingo_switches_total\{from="small",strategy="translate",to="small-b"\} [1-9])")));
  EXPECT_TRUE(std::regex_search(
      metrics->body,
      std::regex(R"(kvlingo_translated_tokens_total\{source="small",target="large"\} [1-9])")));
  EXPECT_TRUE(std::regex_search(metrics->body,
                                std::regex(R"(kvlingo_cache_bytes\{model="large"\} [1-9])")));
  EXPECT_THAT(metrics->body, HasSubstr("kvlingo_inter_token_latency_seconds_bucket"));
  if (!std::string(KVL_PROMTOOL).empty()) {
    const std::string file = dir_->WriteFile("metrics.txt", metrics->body);
    auto check = testing::RunProcess(
        {"/bin/sh", "-c", std::string(KVL_PROMTOOL) + " check metrics < " + file}, 30s);
    ASSERT_TRUE(check.ok());
    EXPECT_EQ(check->exit_code, 0) << check->out << check->err;
  }
  Stop(server);
}

TEST_F(RouterE2eTest, BadInputsGetTheirCodeAndChangeNothing) {
  Running server = Start(Config(int64_t{1} << 30));
  const Json seen = Client(server, "bad_inputs");
  ASSERT_EQ(seen["first"]["code"], "OK") << seen.dump();
  const std::map<std::string, std::pair<std::string, std::string>> want = {
      {"unknown_session", {"NOT_FOUND", "session"}},
      {"unknown_model", {"NOT_FOUND", "routing.model"}},
      {"empty_turn", {"INVALID_ARGUMENT", "user_message"}},
      {"invalid_utf8", {"INVALID_ARGUMENT", "user_message"}},
      {"turn_too_long", {"INVALID_ARGUMENT", "user_message"}},
      {"max_tokens_over_limit", {"INVALID_ARGUMENT", "sampling.max_tokens"}},
      {"temperature_out_of_range", {"INVALID_ARGUMENT", "sampling.temperature"}},
      {"top_p_out_of_range", {"INVALID_ARGUMENT", "sampling.top_p"}},
      {"unknown_policy", {"INVALID_ARGUMENT", "routing.policy"}},
      {"unknown_strategy", {"INVALID_ARGUMENT", "routing.strategy"}},
      {"explicit_without_model", {"INVALID_ARGUMENT", "routing.model"}},
  };
  for (const auto& [name, code_field] : want) {
    const Json& got = seen[name];
    EXPECT_EQ(got["code"], code_field.first) << name << ": " << got.dump();
    EXPECT_THAT(got["details"].get<std::string>(), HasSubstr(code_field.second)) << name;
    EXPECT_TRUE(got["unchanged"].get<bool>()) << name;
  }
  EXPECT_EQ(seen["deadline"]["code"], "DEADLINE_EXCEEDED") << seen["deadline"].dump();
  EXPECT_TRUE(seen["deadline"]["unchanged"].get<bool>());
  EXPECT_EQ(seen["after"]["code"], "OK");
  EXPECT_EQ(seen["after"]["turns"], 2);
  EXPECT_EQ(seen["long_system_prompt"]["code"], "INVALID_ARGUMENT") << seen.dump();
  EXPECT_THAT(seen["long_system_prompt"]["details"].get<std::string>(),
              HasSubstr("system_prompt: 3000 bytes is over the server's limit of 2000"));
  EXPECT_FALSE(seen["long_system_prompt"]["created"].get<bool>());
  // The server counts the expired deadline as such, not as a cancellation
  // (gRPC reports both through OnCancel).
  auto metrics = testing::HttpGet("127.0.0.1", server.metrics_port, "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(metrics->body, HasSubstr(
      R"(kvlingo_grpc_requests_total{code="DEADLINE_EXCEEDED",method="kvlingo.v1.ChatService/Chat"} 1)"
      "\n"));
  Stop(server);
}

TEST_F(RouterE2eTest, SixteenConcurrentSessionsWithSwitches) {
  Running server = Start(Config(int64_t{1} << 30));
  const Json seen = Client(server, "concurrent");
  ASSERT_EQ(seen["outcomes"].size(), 16u);
  for (const auto& [i, codes] : seen["outcomes"].items()) {
    for (size_t t = 0; t < codes.size(); ++t) {
      EXPECT_EQ(codes[t][0], "OK") << "session " << i << " turn " << t;
      EXPECT_EQ(codes[t][1].get<bool>(), t > 0) << "session " << i << " turn " << t;
    }
  }
  Stop(server);
}

// A burst above the admission limits: the excess is refused with
// RESOURCE_EXHAUSTED naming the limit, without waiting for the running
// turns; every admitted turn completes; no refused session changes.
TEST_F(RouterE2eTest, ABurstAboveTheLimitsIsRefusedAtOnceAndChangesNothing) {
  Json config = Json::parse(Config(int64_t{1} << 30));
  config["limits"] = {{"max_concurrent_streams", 4},
                      {"max_waiting_turns_per_model", 1},
                      {"max_sessions", 13},
                      {"max_history_tokens", 300}};
  Running server = Start(config.dump());
  const Json seen = Client(server, "burst");
  auto scraped = testing::HttpGet("127.0.0.1", server.metrics_port, "/metrics");
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  const std::string metrics = scraped->body;
  Stop(server);
  EXPECT_EQ(seen["session_limit"]["code"], "RESOURCE_EXHAUSTED") << seen.dump();
  EXPECT_THAT(seen["session_limit"]["details"].get<std::string>(),
              HasSubstr("limits.max_sessions = 13"));
  int admitted = 0, refused = 0;
  double slowest_admitted = 0, slowest_refusal = 0;
  for (const auto& [sid, o] : seen["burst"].items()) {
    const std::string code = o["code"];
    if (code == "OK") {
      ++admitted;
      slowest_admitted = std::max(slowest_admitted, o["seconds"].get<double>());
      EXPECT_EQ(o["state"]["turns"], 1) << sid;
    } else {
      ASSERT_EQ(code, "RESOURCE_EXHAUSTED") << sid << " " << o.dump();
      ++refused;
      slowest_refusal = std::max(slowest_refusal, o["seconds"].get<double>());
      EXPECT_THAT(o["details"].get<std::string>(),
                  ::testing::AnyOf(HasSubstr("limits.max_concurrent_streams"),
                                   ::testing::StartsWith("limits.max_waiting_turns_per_model: ")));
      EXPECT_EQ(o["state"]["turns"], 0) << sid;
      EXPECT_EQ(o["state"]["history_tokens"], 0) << sid;
    }
  }
  EXPECT_GE(admitted, 1);
  EXPECT_GE(refused, 12 - 4);  // at most 4 streams at once
  // Refusals do not wait for the turns that run.
  EXPECT_LT(slowest_refusal, slowest_admitted) << seen.dump();
  EXPECT_EQ(seen["history_limit"]["first"], "OK");
  EXPECT_EQ(seen["history_limit"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_THAT(seen["history_limit"]["details"].get<std::string>(),
              ::testing::StartsWith("limits.max_history_tokens: the session holds "));
  EXPECT_THAT(seen["history_limit"]["details"].get<std::string>(),
              HasSubstr("is past the history limit of 300"));
  EXPECT_TRUE(seen["history_limit"]["unchanged"].get<bool>());
  EXPECT_THAT(metrics, ::testing::ContainsRegex(
                           R"(kvlingo_requests_rejected_total\{limit="max_concurrent_streams"\} [1-9])"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex(
                           R"(kvlingo_requests_rejected_total\{limit="max_sessions"\} 1)"));
  EXPECT_THAT(metrics, HasSubstr("kvlingo_requests_waiting{model=\"large\"} 0"));
}

TEST_F(RouterE2eTest, EvictionUnderATinyBudgetRebuildsSessionsCorrectly) {
  // small: 2080 bytes per token, lines of at least 64 tokens.
  Running tiny = Start(Config(100 * 2080));
  const Json seen = Client(tiny, "eviction");
  Stop(tiny);
  Running roomy = Start(Config(int64_t{1} << 30));
  const Json reference = Client(roomy, "eviction");
  Stop(roomy);
  const Json& turns = seen["turns"];
  ASSERT_EQ(turns.size(), 6u);
  int rebuilt = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    ASSERT_EQ(turns[i]["code"], "OK") << turns[i].dump();
    // Same greedy answers as with room for everything.
    EXPECT_EQ(turns[i]["ids"], reference["turns"][i]["ids"]) << i;
    // After each turn the other session's line is evicted (its history stays).
    const Json& other_lines = turns[i]["other"]["lines"];
    if (i > 0) {
      ASSERT_EQ(other_lines.size(), 1u);
      EXPECT_TRUE(other_lines[0][3].get<bool>()) << i;
    }
    if (i >= 2) {
      EXPECT_EQ(turns[i]["path"], "CACHE_PATH_REPREFILL") << i;
      ++rebuilt;
    }
  }
  EXPECT_EQ(rebuilt, 4);
  EXPECT_EQ(seen["budget_exhausted"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_THAT(seen["budget_exhausted"]["details"].get<std::string>(), HasSubstr("budget"));
  EXPECT_TRUE(seen["budget_exhausted"]["unchanged"].get<bool>());
}

// The drain needs the models and the Python stubs but no translators: its
// turns never switch models, and fitting the suite's six translators took
// most of this test's time.
class DrainE2eTest : public RouterE2eTest {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("drain-e2e");
    ASSERT_TRUE(testing::WriteFixtureModels(dir_->path()).ok());
    stubs_ = dir_->MakeDir("stubs");
    auto protoc = testing::RunProcess(
        {"protoc", "--proto_path=" + std::string(KVL_SOURCE_DIR) + "/proto",
         "--python_out=" + stubs_, "kvlingo/v1/chat.proto", "kvlingo/v1/session.proto",
         "kvlingo/v1/model.proto"},
        30s, {std::string(KVL_SOURCE_DIR) + "/proto", {}});
    ASSERT_TRUE(protoc.ok() && protoc->exit_code == 0);
  }
};

TEST_F(DrainE2eTest, DrainingRefusesNewChatsWithUnavailableAndFinishesRunningOnes) {
  Json config = Json::parse(Config(int64_t{1} << 30));
  config["translators"] = Json::array();
  // The long answer (router_client.py's DRAIN_LONG_TOKENS) takes a few
  // seconds; the drain waits for it with room to spare on a loaded machine.
  config["server"]["drain_timeout_seconds"] = 300;
  Running server = Start(config.dump());
  const Json seen = Client(server, "drain", 300s);  // the client sends SIGTERM itself
  auto code = server.process->Wait(300s);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << server.process->Describe();
  EXPECT_EQ(seen["refused"]["code"], "UNAVAILABLE") << seen.dump();
  EXPECT_TRUE(seen["refused"]["long_still_streaming"].get<bool>()) << seen.dump();
  // The answer that was streaming when the drain began ran to its end.
  const Json& long_turn = seen["long"];
  EXPECT_TRUE(long_turn["in_flight_at_sigterm"].get<bool>()) << seen.dump();
  EXPECT_EQ(long_turn["code"], "OK") << seen.dump();
  EXPECT_TRUE(long_turn.contains("finish")) << seen.dump();
  EXPECT_GT(long_turn["generated_tokens"].get<int64_t>(), 0);
}

TEST_F(RouterE2eTest, ABadModelFileIsABadConfig) {
  const std::string broken = dir_->MakeDir("broken");
  dir_->WriteFile("broken/config.json", "{}");
  Json config = Json::parse(Config(int64_t{1} << 30));
  config["models"][1]["path"] = broken;
  const std::string file = dir_->WriteFile("bad.json", config.dump());
  auto run = testing::RunProcess({KVL_SERVER_BIN, "--config", file, "--listen", "127.0.0.1:0",
                                  "--metrics-address", "127.0.0.1:0"},
                                 60s);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->exit_code, 2);
  EXPECT_THAT(run->err, HasSubstr("models[1] (small-b)"));
}

}  // namespace
}  // namespace kvl
