// Parsing and validation of the server config file (server/config.h).
#include "server/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <sstream>

#include <string>

#include "tests/testing/temp_dir.h"

namespace kvl::server {
namespace {

using ::testing::HasSubstr;

// A checkpoint directory as the validator expects it: a config.json inside.
std::string MakeModelDir(const testing::TempDir& dir, const std::string& name) {
  dir.WriteFile(name + "/config.json", "{}");
  return dir.Path(name);
}

absl::Status ParseError(const std::string& text, const std::string& base_dir = "/") {
  return ParseConfig(text, base_dir).status();
}

TEST(ConfigTest, EmptyObjectGivesDocumentedDefaults) {
  absl::StatusOr<ServerConfig> c = ParseConfig("{}", "/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.listen_address.ToString(), "127.0.0.1:50051");
  EXPECT_EQ(c->server.metrics_address.ToString(), "127.0.0.1:9464");
  EXPECT_EQ(c->server.drain_timeout_seconds, 30.0);
  EXPECT_EQ(c->server.max_turn_bytes, 65536);
  EXPECT_EQ(c->server.max_new_tokens_limit, 4096);
  EXPECT_EQ(c->log.level, LogLevel::kInfo);
  EXPECT_EQ(c->runtime.threads, 0);
  EXPECT_EQ(c->runtime.dtype, DType::kFloat32);
  EXPECT_EQ(c->runtime.device, "cpu");
  EXPECT_TRUE(c->models.empty());
  EXPECT_TRUE(c->translators.empty());
  EXPECT_EQ(c->router.policy.policy, router::Policy::kFixed);
  EXPECT_EQ(c->router.switching.strategy, router::Strategy::kTranslate);
  EXPECT_EQ(c->router.switching.native_tail_tokens, 32);
  EXPECT_EQ(c->router.switching.repair, router::RepairMode::kAfterTurn);
  EXPECT_EQ(c->router.gate.max_divergence, std::numeric_limits<double>::infinity());
  EXPECT_EQ(c->limits.max_concurrent_streams, 256);
  EXPECT_EQ(c->router.limits.max_waiting_turns, 64);
  EXPECT_EQ(c->limits.max_sessions, 100000);
  EXPECT_EQ(c->router.limits.max_history_tokens, 0);
  EXPECT_FALSE(c->router.load_gate.min_recovered.has_value());  // no load-time minimum
  EXPECT_FALSE(c->router.load_gate.max_gap_nats.has_value());
  EXPECT_EQ(c->router.policy.cascade_max_entropy, 3.0);
  EXPECT_EQ(c->router.policy.cascade_min_mean_logprob, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(c->sessions.idle_timeout_seconds, 3600);
  EXPECT_EQ(c->sessions.memory_budget_bytes, int64_t{4} << 30);
  EXPECT_FALSE(c->server.http_address.has_value());  // the OpenAI API is off
  EXPECT_EQ(c->server.http_router_model, "kvlingo");
  EXPECT_EQ(c->server.http_max_conversations, 1024);
}

TEST(ConfigTest, TheOpenAiApiKeys) {
  testing::TempDir dir("config");
  MakeModelDir(dir, "kvlingo");
  absl::StatusOr<ServerConfig> c = ParseConfig(
      R"({"server": {"http_address": "0.0.0.0:8000", "http_router_model": "auto",
                     "http_max_conversations": 5}})",
      "/");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->server.http_address.has_value());
  EXPECT_EQ(c->server.http_address->ToString(), "0.0.0.0:8000");
  EXPECT_EQ(c->server.http_router_model, "auto");
  EXPECT_EQ(c->server.http_max_conversations, 5);
  EXPECT_THAT(ParseError(R"({"server": {"http_address": "nowhere"}})").message(),
              HasSubstr("config: server.http_address: expected host:port"));
  EXPECT_THAT(ParseError(R"({"server": {"http_max_conversations": 0}})").message(),
              HasSubstr("config: server.http_max_conversations: expected an integer in [1,"));
  // The router model may not shadow a model, when the API is on.
  const std::string model =
      R"("models": [{"name": "kvlingo", "path": "kvlingo"}], "routing": {"default_model": "kvlingo"})";
  EXPECT_THAT(ParseError(R"({"server": {"http_address": "127.0.0.1:0"}, )" + model + "}",
                         dir.path())
                  .message(),
              HasSubstr("config: server.http_router_model: 'kvlingo' is also a model's name"));
  EXPECT_TRUE(ParseError("{" + model + "}", dir.path()).ok())
      << ParseError("{" + model + "}", dir.path());
}

TEST(ConfigTest, FullConfigWithCommentsAndRelativePaths) {
  testing::TempDir dir("config");
  MakeModelDir(dir, "models/small");
  MakeModelDir(dir, "models/large");
  dir.WriteFile("translators/s2l.kvlt", "x");
  const std::string text = R"({
    // line comments and /* block comments */ are allowed
    "server": {"listen_address": "0.0.0.0:6000", "metrics_address": "[::1]:0",
               "drain_timeout_seconds": 2.5, "max_turn_bytes": 1000, "max_new_tokens_limit": 64},
    "log": {"level": "debug"},
    "runtime": {"threads": 4, "dtype": "bfloat16", "device": "cuda:1"},
    "models": [{"name": "small", "path": "models/small"},
               {"name": "large", "path": "models/large", "dtype": "float32"}],
    "translators": [{"source": "small", "target": "large", "path": "translators/s2l.kvlt",
                     "compute_dtype": "bfloat16", "min_recovered": 0.95, "native_layers": 2}],
    "routing": {"policy": "rules", "default_model": "small", "strategy": "reprefill-missing",
                "models": ["small", "large"],
                "rules": [{"model": "large", "contains": ["prove", "derive"], "min_bytes": 10}],
                "cascade_max_entropy": 2.5, "cascade_min_mean_logprob": -0.5,
                "native_tail_tokens": 16, "repair": "idle-only",
                "gate": {"max_divergence_nats": 0.05, "window": 10, "min_samples": 3,
                         "cooldown_seconds": 30, "min_recovered": 0.9, "max_gap_nats": 0.02}},
    "sessions": {"idle_timeout_seconds": 0, "memory_budget_bytes": 1048576},
    "limits": {"max_concurrent_streams": 8, "max_waiting_turns_per_model": 2,
               "max_sessions": 50, "max_history_tokens": 3000}
  })";
  absl::StatusOr<ServerConfig> c = ParseConfig(text, dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.listen_address.host, "0.0.0.0");
  EXPECT_EQ(c->server.listen_address.port, 6000);
  EXPECT_EQ(c->server.metrics_address.host, "[::1]");
  EXPECT_EQ(c->server.metrics_address.port, 0);
  EXPECT_EQ(c->server.drain_timeout_seconds, 2.5);
  EXPECT_EQ(c->server.max_turn_bytes, 1000);
  EXPECT_EQ(c->server.max_new_tokens_limit, 64);
  EXPECT_EQ(c->log.level, LogLevel::kDebug);
  EXPECT_EQ(c->runtime.threads, 4);
  EXPECT_EQ(c->runtime.device, "cuda:1");  // parsed; whether it exists is checked at load
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[0].path, dir.Path("models/small"));
  EXPECT_EQ(c->models[0].dtype, DType::kBFloat16);  // inherits runtime.dtype
  EXPECT_EQ(c->models[1].dtype, DType::kFloat32);
  ASSERT_EQ(c->translators.size(), 1u);
  EXPECT_EQ(c->translators[0].name, "small->large");
  EXPECT_EQ(c->translators[0].path, dir.Path("translators/s2l.kvlt"));
  EXPECT_EQ(c->translators[0].compute_dtype, DType::kBFloat16);
  EXPECT_EQ(c->router.policy.policy, router::Policy::kRules);
  EXPECT_EQ(c->router.switching.strategy, router::Strategy::kReprefillMissing);
  ASSERT_EQ(c->router.policy.rules.size(), 1u);
  EXPECT_EQ(c->router.policy.rules[0].model, 1);  // large
  EXPECT_THAT(c->router.policy.rules[0].contains, ::testing::ElementsAre("prove", "derive"));
  EXPECT_EQ(c->router.policy.rules[0].min_bytes, 10);
  EXPECT_EQ(c->router.policy.cascade_max_entropy, 2.5);
  EXPECT_EQ(c->router.policy.cascade_min_mean_logprob, -0.5);
  EXPECT_EQ(c->router.switching.native_tail_tokens, 16);
  EXPECT_EQ(c->router.switching.repair, router::RepairMode::kIdleOnly);
  EXPECT_EQ(c->router.gate.max_divergence, 0.05);
  EXPECT_EQ(c->router.gate.window, 10);
  EXPECT_EQ(c->router.gate.min_samples, 3);
  EXPECT_EQ(c->router.gate.cooldown, std::chrono::seconds(30));
  EXPECT_EQ(c->router.load_gate.min_recovered, 0.9);
  EXPECT_EQ(c->router.load_gate.max_gap_nats, 0.02);
  EXPECT_EQ(c->translators[0].min_recovered, 0.95);
  EXPECT_FALSE(c->translators[0].max_gap_nats.has_value());
  EXPECT_EQ(c->translators[0].native_layers, 2);
  EXPECT_EQ(c->sessions.idle_timeout_seconds, 0);
  EXPECT_EQ(c->sessions.memory_budget_bytes, 1048576);
  EXPECT_EQ(c->limits.max_concurrent_streams, 8);
  EXPECT_EQ(c->router.limits.max_waiting_turns, 2);
  EXPECT_EQ(c->limits.max_sessions, 50);
  EXPECT_EQ(c->router.limits.max_history_tokens, 3000);
}

TEST(ConfigTest, UnknownKeysAreRejectedAtEveryLevelWithTheirPath) {
  EXPECT_THAT(ParseError(R"({"sever": {}})").message(), HasSubstr("config: sever: unknown key"));
  EXPECT_THAT(ParseError(R"({"server": {"listen": "a:1"}})").message(),
              HasSubstr("config: server.listen: unknown key"));
  EXPECT_THAT(ParseError(R"({"routing": {"rules": [{"model": "m", "when": 1}]}})").message(),
              HasSubstr("unknown key"));
  testing::TempDir dir("config");
  MakeModelDir(dir, "m");
  absl::Status s = ParseError(R"({"models": [{"name": "m", "path": "m", "size": 3}]})", dir.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config: models[0].size: unknown key"));
}

TEST(ConfigTest, BadValuesNameTheKeyAndTheValue) {
  absl::Status s = ParseError(R"({"server": {"listen_address": "x"}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "config: server.listen_address: expected host:port, got 'x'");
  EXPECT_THAT(
      ParseError(R"({"server": {"metrics_address": "h:70000"}})").message(),
      HasSubstr("config: server.metrics_address: expected host:port with a port in [0, 65535]"));
  EXPECT_THAT(
      ParseError(R"({"server": {"drain_timeout_seconds": -1}})").message(),
      HasSubstr("config: server.drain_timeout_seconds: expected a number in [0, 3600], got -1"));
  EXPECT_THAT(ParseError(R"({"server": {"max_turn_bytes": "big"}})").message(),
              HasSubstr("config: server.max_turn_bytes: expected an integer, got 'big'"));
  EXPECT_THAT(ParseError(R"({"server": {"max_new_tokens_limit": 0}})").message(),
              HasSubstr("config: server.max_new_tokens_limit: expected an integer in [1,"));
  EXPECT_THAT(
      ParseError(R"({"log": {"level": "verbose"}})").message(),
      HasSubstr(
          "config: log.level: expected one of trace, debug, info, warn, error, got 'verbose'"));
  EXPECT_THAT(ParseError(R"({"runtime": {"threads": 1.5}})").message(),
              HasSubstr("config: runtime.threads: expected an integer, got 1.5"));
  EXPECT_THAT(ParseError(R"({"runtime": {"device": "cuda:x"}})").message(),
              HasSubstr("config: runtime.device: unknown device 'cuda:x'; expected cpu, cuda or cuda:N"));
  EXPECT_THAT(ParseError(R"({"runtime": {"device": 0}})").message(),
              HasSubstr("config: runtime.device: expected a string"));
  EXPECT_THAT(ParseError(R"({"runtime": {"dtype": "int8"}})").message(),
              HasSubstr("config: runtime.dtype: expected one of float32, bfloat16, float16"));
  EXPECT_THAT(
      ParseError(R"({"routing": {"policy": "random"}})").message(),
      HasSubstr(
          "config: routing.policy: expected one of fixed, explicit, rules, cascade, alternate"));
  EXPECT_THAT(ParseError(R"({"routing": {"strategy": "copy"}})").message(),
              HasSubstr("config: routing.strategy:"));
  EXPECT_THAT(ParseError(R"({"sessions": {"memory_budget_bytes": 0}})").message(),
              HasSubstr("config: sessions.memory_budget_bytes: expected an integer in [1,"));
  EXPECT_THAT(ParseError(R"({"server": []})").message(),
              HasSubstr("config: server: expected an object, got []"));
  EXPECT_THAT(ParseError(R"({"models": {}})").message(),
              HasSubstr("config: models: expected a list"));
}

TEST(ConfigTest, SyntaxErrorsAndNonObjectsAreInvalidArgument) {
  absl::Status s = ParseError("{\"server\": ");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config: invalid JSON"));
  EXPECT_THAT(ParseError("[1]").message(), HasSubstr("expected a JSON object at the top level"));
  // A number beyond a double's range used to escape as an exception and end
  // the process (found by tests/fuzz/server_config_fuzz.cc).
  s = ParseError(R"({"limits": {"max_sessions": 1E999999}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config: invalid JSON: number overflow"));
}

TEST(ConfigTest, HostPortForms) {
  EXPECT_TRUE(ParseHostPort("localhost:1").ok());
  EXPECT_TRUE(ParseHostPort("[::]:50051").ok());
  EXPECT_EQ(ParseHostPort("[::]:50051")->host, "[::]");
  EXPECT_FALSE(ParseHostPort(":1").ok());
  EXPECT_FALSE(ParseHostPort("host:").ok());
  EXPECT_FALSE(ParseHostPort("::1:80").ok());  // IPv6 needs brackets
  EXPECT_FALSE(ParseHostPort("host:8o").ok());
  EXPECT_FALSE(ParseHostPort("host:-1").ok());
}

TEST(ConfigTest, ModelPathMustBeACheckpointDirectory) {
  testing::TempDir dir("config");
  dir.MakeDir("empty");
  absl::Status s = ParseError(R"({"models": [{"name": "m", "path": "missing"}]})", dir.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("config: models[0].path: '" + dir.Path("missing") +
                                     "' is not a directory"));
  s = ParseError(R"({"models": [{"name": "m", "path": "empty"}]})", dir.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("has no config.json"));
  EXPECT_THAT(ParseError(R"({"models": [{"name": "m"}]})", dir.path()).message(),
              HasSubstr("config: models[0].path: required"));
}

TEST(ConfigTest, CrossReferencesAreChecked) {
  testing::TempDir dir("config");
  MakeModelDir(dir, "a");
  MakeModelDir(dir, "b");
  dir.WriteFile("t.kvlt", "x");
  const std::string models =
      R"("models": [{"name": "a", "path": "a"}, {"name": "b", "path": "b"}])";
  auto parse = [&](const std::string& rest) {
    return ParseError("{" + models + rest + "}", dir.path());
  };

  EXPECT_THAT(ParseError(R"({"models": [{"name": "a", "path": "a"}, {"name": "a", "path": "b"}]})",
                         dir.path())
                  .message(),
              HasSubstr("config: models[1].name: duplicate model name 'a'"));
  EXPECT_THAT(ParseError(R"({"models": [{"name": "a b", "path": "a"}]})", dir.path()).message(),
              HasSubstr("config: models[0].name: expected 1-64 characters"));
  EXPECT_THAT(
      parse(
          R"(, "routing": {"default_model": "a"}, "translators": [{"source": "a", "target": "c", "path": "t.kvlt"}])")
          .message(),
      HasSubstr("config: translators[0].target: 'c' is not a configured model (configured: a, b)"));
  EXPECT_THAT(
      parse(
          R"(, "routing": {"default_model": "a"}, "translators": [{"source": "a", "target": "a", "path": "t.kvlt"}])")
          .message(),
      HasSubstr("config: translators[0].target: equals source 'a'"));
  EXPECT_THAT(
      parse(
          R"(, "routing": {"default_model": "a"}, "translators": [{"source": "a", "target": "b", "path": "t.kvlt", "compute_dtype": "float16"}])")
          .message(),
      HasSubstr("config: translators[0].compute_dtype: expected one of auto, float32, bfloat16"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "a", "native_tail_tokens": -1})").message(),
              HasSubstr("config: routing.native_tail_tokens"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "a", "repair": "sometimes"})").message(),
              HasSubstr("config: routing.repair: expected one of off, after-turn, idle-only"));
  EXPECT_THAT(
      parse(R"(, "routing": {"default_model": "a", "repair": "off", "gate": {"max_divergence_nats": 0.1}})")
          .message(),
      HasSubstr("config: routing.gate: the live quality gate scores switches as their lines are "
                "repaired; it needs routing.repair other than \"off\""));
  EXPECT_THAT(
      parse(R"(, "routing": {"default_model": "a", "gate": {"window": 2, "min_samples": 3}})")
          .message(),
      HasSubstr("config: routing.gate.min_samples: 3 exceeds window 2"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "a", "gate": {"bound": 1}})").message(),
              HasSubstr("routing.gate"));
  EXPECT_THAT(parse(R"(, "limits": {"max_sessions": -1})").message(),
              HasSubstr("config: limits.max_sessions"));
  EXPECT_THAT(parse(R"(, "limits": {"max_streams": 4})").message(),
              HasSubstr("limits"));
  // The load-time gate needs no repair; its bounds are checked.
  EXPECT_THAT(
      parse(R"(, "routing": {"default_model": "a", "gate": {"min_recovered": 1.5}})").message(),
      HasSubstr("config: routing.gate.min_recovered: expected a number in [0, 1], got 1.5"));
  EXPECT_THAT(
      parse(R"(, "routing": {"default_model": "a", "gate": {"max_gap_nats": -0.1}})").message(),
      HasSubstr("config: routing.gate.max_gap_nats"));
  EXPECT_THAT(
      parse(
          R"(, "routing": {"default_model": "a"}, "translators": [{"source": "a", "target": "b", "path": "t.kvlt", "min_recovered": "high"}])")
          .message(),
      HasSubstr("config: translators[0].min_recovered: expected a number"));
  EXPECT_THAT(
      parse(
          R"(, "routing": {"default_model": "a"}, "translators": [{"source": "a", "target": "b", "path": "t.kvlt"}, {"name": "x", "source": "a", "target": "b", "path": "t.kvlt"}])")
          .message(),
      HasSubstr("config: translators[1]: a second translator from 'a' to 'b'"));
  EXPECT_EQ(
      parse(
          R"(, "routing": {"default_model": "a"}, "translators": [{"source": "a", "target": "b", "path": "nope"}])")
          .code(),
      absl::StatusCode::kNotFound);
  EXPECT_THAT(parse("").message(),
              HasSubstr("config: routing.default_model: required when models are configured"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "z"})").message(),
              HasSubstr("config: routing.default_model: 'z' is not a configured model"));
  EXPECT_THAT(
      parse(R"(, "routing": {"default_model": "a", "policy": "alternate", "models": ["a"]})")
          .message(),
      HasSubstr("config: routing.models: the 'alternate' policy needs at least 2 models"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "a", "cascade_max_entropy": -1})").message(),
              HasSubstr("config: routing.cascade_max_entropy: expected a number in [0,"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "a", "models": ["a", "a"]})").message(),
              HasSubstr("config: routing.models[1]: 'a' is listed twice"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "a", "policy": "rules"})").message(),
              HasSubstr("config: routing.rules: the 'rules' policy needs at least one rule"));
  EXPECT_THAT(parse(R"(, "routing": {"default_model": "a", "rules": [{"model": "q"}]})").message(),
              HasSubstr("config: routing.rules[0].model: 'q' is not a configured model"));
  EXPECT_TRUE(
      parse(R"(, "routing": {"default_model": "b", "policy": "cascade", "models": ["a", "b"]})")
          .ok());
  // Without models only the "fixed" policy, with no default model, makes sense.
  EXPECT_THAT(
      ParseError(R"({"routing": {"policy": "explicit"}})").message(),
      HasSubstr("config: routing.policy: 'explicit' needs configured models (there are none)"));
  EXPECT_THAT(ParseError(R"({"routing": {"default_model": "a"}})").message(),
              HasSubstr("'a' is not a configured model (configured: none)"));
}

TEST(ConfigTest, LoadConfigFileResolvesPathsAgainstTheFilesDirectory) {
  testing::TempDir dir("config");
  MakeModelDir(dir, "etc/models/m");
  const std::string file = dir.WriteFile(
      "etc/server.json",
      R"({"models": [{"name": "m", "path": "models/m"}], "routing": {"default_model": "m"}})");
  absl::StatusOr<ServerConfig> c = LoadConfigFile(file);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->models[0].path, dir.Path("etc/models/m"));
  absl::Status missing = LoadConfigFile(dir.Path("nope.json")).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("config: cannot read '" + dir.Path("nope.json") + "'"));
}

TEST(ConfigTest, TlsFilesAndTheirReloadInterval) {
  absl::StatusOr<ServerConfig> c = ParseConfig(
      R"({"server": {"tls": {"cert_file": "s.pem", "key_file": "s.key", "client_ca_file": "ca.pem",
                             "reload_interval_seconds": 5}}})",
      "/etc/kvl");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.tls.cert_file, "/etc/kvl/s.pem");
  EXPECT_EQ(c->server.tls.client_ca_file, "/etc/kvl/ca.pem");
  EXPECT_EQ(c->server.tls.reload_interval_seconds, 5);
  c = ParseConfig(R"({"server": {"tls": {"cert_file": "s.pem", "key_file": "s.key"}}})", "/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.tls.reload_interval_seconds, 60);
  EXPECT_THAT(ParseError(R"({"server": {"tls": {"cert_file": "a", "key_file": "b",
                                                 "reload_interval_seconds": 0}}})")
                  .message(),
              HasSubstr("config: server.tls.reload_interval_seconds: expected an integer in [1,"));
}

// The shipped config names the house models, which are trained separately;
// its schema is checked against a tree where those paths exist.
TEST(ConfigTest, TheShippedExampleConfigIsValid) {
  std::ifstream in(std::string(KVL_SOURCE_DIR) + "/configs/server.json");
  std::stringstream text;
  text << in.rdbuf();
  testing::TempDir dir("shipped");
  for (const char* m : {"kvl-small", "kvl-small-b", "kvl-large"}) {
    dir.WriteFile(std::string("models/") + m + "/config.json", "{}");
  }
  for (const char* t : {"kvl-small__kvl-large", "kvl-large__kvl-small", "kvl-small__kvl-small-b",
                        "kvl-small-b__kvl-small"}) {
    dir.WriteFile(std::string("models/translators/") + t + ".safetensors", "");
  }
  absl::StatusOr<ServerConfig> c = ParseConfig(text.str(), dir.MakeDir("configs"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->models.size(), 3u);
  EXPECT_EQ(c->router.policy.policy, router::Policy::kCascade);
  EXPECT_EQ(c->router.policy.rules[1].pattern, "^(Thanks|Thank you)");
  EXPECT_EQ(c->router.policy.rules[1].min_turn, 5);
  EXPECT_FALSE(c->translators[0].compute_dtype.has_value());  // auto
  EXPECT_FALSE(c->translators[1].compute_dtype.has_value());  // the default: auto
}

TEST(ConfigTest, RuleTurnBoundsAndPatternsAreValidated) {
  testing::TempDir dir("rules");
  const std::string base = R"({"models": [{"name": "m", "path": ")" + MakeModelDir(dir, "m") +
                           R"("}], "routing": {"default_model": "m", "rules": [)";
  EXPECT_TRUE(ParseConfig(base + R"({"model": "m", "min_turn": 2, "max_turn": 4, "pattern": "a+b"}]}})", ".").ok());
  absl::Status bad_turns = ParseConfig(base + R"({"model": "m", "min_turn": 5, "max_turn": 4}]}})", ".").status();
  EXPECT_EQ(bad_turns.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_turns.message(), HasSubstr("routing.rules[0].max_turn"));
  absl::Status bad_regex = ParseConfig(base + R"({"model": "m", "pattern": "(unclosed"}]}})", ".").status();
  EXPECT_EQ(bad_regex.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_regex.message(), HasSubstr("routing.rules[0].pattern"));
}

}  // namespace
}  // namespace kvl::server
