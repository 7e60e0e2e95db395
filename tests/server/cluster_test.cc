// The local cluster of deploy/cluster/run.sh (Redis, two kvl-server replicas,
// nginx in front), with small random models: a replica killed with SIGKILL in
// the middle of turns loses no acknowledged turn and commits none twice (the
// clients retry with their request ids; nginx sends the retries to the other
// replica, which restores the sessions from Redis), and a restart of the whole
// cluster (Redis' append-only file kept) loses nothing either. Through
// nginx's OpenAI API front, stateless conversations with an affinity header
// stay with the replica whose prefix cache holds them.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kvlingo/v1/chat.grpc.pb.h"
#include "kvlingo/v1/session.grpc.pb.h"
#include "tests/router/model_fixture.h"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
namespace v1 = kvlingo::v1;

const std::vector<std::pair<std::string, std::string>> kPairs = {{"small", "large"},
                                                                 {"large", "small"}};

std::map<std::string, std::string> ReadEnv(const std::string& path) {
  std::map<std::string, std::string> env;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("cluster");
    ASSERT_TRUE(testing::WriteFixtureModels(dir_->path()).ok());
    ASSERT_TRUE(testing::WriteFixtureTranslators(dir_->path(), kPairs, {}).ok());
    Json models = Json::array(), translators = Json::array();
    for (const auto& m : testing::FixtureModels()) {
      models.push_back({{"name", m.name}, {"path", dir_->path() + "/" + m.name}});
    }
    for (const auto& [s, t] : kPairs) {
      translators.push_back(
          {{"source", s}, {"target", t}, {"path", testing::TranslatorPath(dir_->path(), s, t)}});
    }
    const Json config = {{"server", {{"drain_timeout_seconds", 10}}},
                         {"runtime", {{"threads", 1}}},
                         {"models", models},
                         {"translators", translators},
                         {"routing",
                          {{"policy", "explicit"},
                           {"default_model", "small"},
                           {"strategy", "translate"},
                           {"native_tail_tokens", 4},
                           {"repair", "off"}}},
                         {"sessions", {{"store", {{"timeout_ms", 1000}}}}}};
    config_ = dir_->WriteFile("cluster.json", config.dump(2));
  }
  static void TearDownTestSuite() { delete dir_; }

  // A failed test leaves its cluster up: stop it (the directory is removed
  // after TearDown).
  void TearDown() override {
    if (!cluster_dir_.empty() && std::ifstream(cluster_dir_ + "/cluster.env").good()) {
      Cluster("down", cluster_dir_);
    }
  }

  // Runs deploy/cluster/run.sh; returns its exit code.
  static int Cluster(const std::string& command, const std::string& dir) {
    std::vector<std::string> argv = {std::string(KVL_SOURCE_DIR) + "/deploy/cluster/run.sh",
                                     command, "--dir", dir};
    if (command == "up") {
      for (const char* a : {"--replicas", "2", "--config"}) argv.push_back(a);
      argv.push_back(config_);
    }
    auto run = testing::RunProcess(argv, 180s, {"", {{"KVL_SERVER_BIN", KVL_SERVER_BIN}}});
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return -1;
    EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
    return run->exit_code;
  }

  static std::unique_ptr<grpc::ClientContext> Context(const std::string& session,
                                                      std::chrono::seconds timeout) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    ctx->AddMetadata("x-kvl-session-id", session);
    return ctx;
  }

  static testing::TempDir* dir_;
  static std::string config_;
  std::unique_ptr<testing::TempDir> cluster_tmp_;
  std::string cluster_dir_;
};
testing::TempDir* ClusterTest::dir_ = nullptr;
std::string ClusterTest::config_;

// What one client saw.
struct SessionLog {
  std::vector<std::string> acknowledged;  // request ids whose TurnSummary arrived
  int retries = 0;
  int replays = 0;
  std::string failure;  // a turn that never succeeded
};

// A conversation of `turns` turns alternating small and large (so that every
// turn after the first is a translated switch), each turn retried with its
// request id until it succeeds (at most 8 attempts).
void Converse(const std::shared_ptr<grpc::Channel>& channel, const std::string& session, int first,
              int turns, SessionLog* log, std::atomic<int>* turns_done) {
  auto chat = v1::ChatService::NewStub(channel);
  for (int t = first; t < first + turns; ++t) {
    const std::string request_id = absl::StrCat(session, "-t", t);
    bool done = false;
    for (int attempt = 0; attempt < 8 && !done; ++attempt) {
      if (attempt > 0) {
        ++log->retries;
        std::this_thread::sleep_for(std::chrono::milliseconds(200 * attempt));
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 60s);
      ctx.AddMetadata("x-kvl-session-id", session);
      v1::ChatRequest req;
      req.set_session_id(session);
      req.set_request_id(request_id);
      req.set_user_message(absl::StrCat("Turn ", t, " of ", session, ": tell me more"));
      req.mutable_routing()->set_model(t % 2 == 0 ? "small" : "large");
      req.mutable_sampling()->set_max_tokens(8);
      auto reader = chat->Chat(&ctx, req);
      v1::ChatResponse e;
      bool summary = false, replayed = false;
      while (reader->Read(&e)) {
        if (e.has_summary()) {
          summary = true;
          replayed = e.summary().replayed();
        }
      }
      const grpc::Status status = reader->Finish();
      if (status.ok() && summary) {
        log->acknowledged.push_back(request_id);
        if (replayed) ++log->replays;
        done = true;
        ++*turns_done;
      }
    }
    if (!done) {
      log->failure = absl::StrCat("turn ", t, " never succeeded");
      return;
    }
  }
}

TEST_F(ClusterTest, AKilledReplicaLosesNoAcknowledgedTurnAndARestartLosesNothing) {
  constexpr int kSessions = 16, kTurns = 6;
  cluster_tmp_ = std::make_unique<testing::TempDir>("cluster-run");
  cluster_dir_ = cluster_tmp_->path() + "/c";
  ASSERT_EQ(Cluster("up", cluster_dir_), 0);
  std::map<std::string, std::string> env = ReadEnv(cluster_dir_ + "/cluster.env");
  for (const char* key : {"GRPC_ADDR", "REDIS_ADDR", "REPLICA_1_ADDR", "REPLICA_1_PID",
                          "REPLICA_2_ADDR", "REPLICA_2_PID", "METRICS_1_ADDR", "METRICS_2_ADDR"}) {
    ASSERT_FALSE(env[key].empty()) << key;
  }
  auto channel = testing::InsecureChannel(env["GRPC_ADDR"]);
  auto sessions = v1::SessionService::NewStub(channel);
  for (int s = 0; s < kSessions; ++s) {
    const std::string id = absl::StrCat("c", s);
    auto ctx = Context(id, 10s);
    v1::CreateSessionRequest req;
    req.set_session_id(id);
    v1::Session out;
    ASSERT_TRUE(sessions->CreateSession(ctx.get(), req, &out).ok()) << id;
  }

  // The conversations run; replica 1 is killed once a third of the turns are
  // done, with others in flight.
  std::vector<SessionLog> logs(kSessions);
  std::atomic<int> turns_done{0};
  std::vector<std::thread> clients;
  for (int s = 0; s < kSessions; ++s) {
    clients.emplace_back(Converse, channel, absl::StrCat("c", s), 0, kTurns, &logs[s], &turns_done);
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (turns_done.load() < kSessions * kTurns / 3 &&
         std::chrono::steady_clock::now() - t0 < 120s) {
    std::this_thread::sleep_for(5ms);
  }
  const int done_at_kill = turns_done.load();
  ASSERT_EQ(kill(std::stoi(env["REPLICA_1_PID"]), SIGKILL), 0);
  for (std::thread& c : clients) c.join();

  int acknowledged = 0, retries = 0, replays = 0;
  for (int s = 0; s < kSessions; ++s) {
    EXPECT_EQ(logs[s].failure, "") << "session c" << s;
    acknowledged += static_cast<int>(logs[s].acknowledged.size());
    retries += logs[s].retries;
    replays += logs[s].replays;
  }
  EXPECT_EQ(acknowledged, kSessions * kTurns);

  // Every session's transcript in the store: every acknowledged turn, once.
  auto check = [&](const char* when) {
    int found = 0, duplicates = 0;
    for (int s = 0; s < kSessions; ++s) {
      const std::string id = absl::StrCat("c", s);
      auto ctx = Context(id, 10s);
      v1::GetTranscriptRequest req;
      req.set_session_id(id);
      v1::Transcript t;
      const grpc::Status status = sessions->GetTranscript(ctx.get(), req, &t);
      ASSERT_TRUE(status.ok()) << when << " " << id << ": " << status.error_message();
      std::set<std::string> ids;
      for (const v1::TranscriptTurn& turn : t.turns()) {
        if (!ids.insert(turn.request_id()).second) ++duplicates;
      }
      for (const std::string& r : logs[s].acknowledged) found += ids.count(r) > 0 ? 1 : 0;
      EXPECT_EQ(t.turns_size(), static_cast<int>(logs[s].acknowledged.size())) << when << " " << id;
    }
    std::printf(
        "[ cluster  ] %s: %d sessions, %d turns acknowledged, %d found in the store, "
        "%d duplicates (killed replica 1 after %d turns; %d retries, %d replays)\n",
        when, kSessions, acknowledged, found, duplicates, done_at_kill, retries, replays);
    EXPECT_EQ(found, acknowledged) << when;
    EXPECT_EQ(duplicates, 0) << when;
  };
  check("after the kill");
  // Replica 2 took over replica 1's sessions by restoring them from Redis.
  {
    const std::string metrics = env["METRICS_2_ADDR"];
    const size_t colon = metrics.rfind(':');
    auto page = testing::HttpGet(metrics.substr(0, colon), std::stoi(metrics.substr(colon + 1)),
                                 "/metrics");
    ASSERT_TRUE(page.ok()) << page.status();
    double restored = 0;
    for (absl::string_view line : absl::StrSplit(page->body, '\n')) {
      if (absl::StartsWith(line, "kvlingo_time_to_first_token_seconds_count{") &&
          absl::StrContains(line, "path=\"restored\"")) {
        restored += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
      }
    }
    std::printf("[ cluster  ] replica 2 served %.0f turns on restored sessions\n", restored);
    EXPECT_GT(restored, 0);
  }

  // The whole cluster restarts on the same directory: Redis reloads its
  // append-only file, the replicas start empty. The client hangs up first:
  // nginx's graceful stop waits for open client connections to close.
  sessions.reset();
  channel.reset();
  ASSERT_EQ(Cluster("down", cluster_dir_), 0);
  ASSERT_EQ(Cluster("up", cluster_dir_), 0);
  env = ReadEnv(cluster_dir_ + "/cluster.env");
  channel = testing::InsecureChannel(env["GRPC_ADDR"]);
  sessions = v1::SessionService::NewStub(channel);
  check("after a restart");
  // And the conversations go on (restored on whichever replica serves them).
  SessionLog more;
  std::atomic<int> more_done{0};
  Converse(channel, "c0", kTurns, 1, &more, &more_done);
  EXPECT_EQ(more.failure, "");
  EXPECT_EQ(more.replays, 0);
  sessions.reset();
  channel.reset();
  EXPECT_EQ(Cluster("down", cluster_dir_), 0);
}

// Stateless conversations through nginx's OpenAI API front: each client's
// X-Kvl-Affinity keeps its conversation on one replica, so every request after
// the first finds the conversation in that replica's prefix cache, switches
// models by translation included; a request without the header is served too.
TEST_F(ClusterTest, StatelessConversationsStayWithTheirReplicaByTheirAffinityHeader) {
  constexpr int kConversations = 6, kTurns = 3;
  cluster_tmp_ = std::make_unique<testing::TempDir>("cluster-http");
  cluster_dir_ = cluster_tmp_->path() + "/c";
  ASSERT_EQ(Cluster("up", cluster_dir_), 0);
  std::map<std::string, std::string> env = ReadEnv(cluster_dir_ + "/cluster.env");
  ASSERT_FALSE(env["HTTP_ADDR"].empty());
  const std::string host = env["HTTP_ADDR"].substr(0, env["HTTP_ADDR"].rfind(':'));
  const int port = std::stoi(env["HTTP_ADDR"].substr(env["HTTP_ADDR"].rfind(':') + 1));
  for (int c = 0; c < kConversations; ++c) {
    SCOPED_TRACE(absl::StrCat("conversation ", c));
    httplib::Client client(host, port);
    client.set_read_timeout(60, 0);
    Json messages = {{{"role", "user"}, {"content", absl::StrCat("Conversation ", c, " begins.")}}};
    for (int t = 0; t < kTurns; ++t) {
      const Json body = {{"model", t % 2 == 0 ? "small" : "large"},
                         {"max_tokens", 6},
                         {"temperature", 0},
                         {"messages", messages}};
      httplib::Result r =
          client.Post("/v1/chat/completions", {{"X-Kvl-Affinity", absl::StrCat("user-", c)}},
                      body.dump(), "application/json");
      ASSERT_TRUE(r) << httplib::to_string(r.error());
      ASSERT_EQ(r->status, 200) << r->body;
      const Json out = Json::parse(r->body);
      EXPECT_EQ(out["kvlingo"]["reused_turns"], t) << r->body;
      if (t > 0) {
        EXPECT_EQ(out["kvlingo"]["switched"], true) << r->body;
      }
      messages.push_back(
          {{"role", "assistant"}, {"content", out["choices"][0]["message"]["content"]}});
      messages.push_back({{"role", "user"}, {"content", absl::StrCat("Turn ", t + 1, ".")}});
    }
  }
  httplib::Client anyone(host, port);
  httplib::Result r = anyone.Post("/v1/chat/completions",
                                  Json({{"model", "small"},
                                        {"max_tokens", 4},
                                        {"messages", {{{"role", "user"}, {"content", "Hi."}}}}})
                                      .dump(),
                                  "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Cluster("down", cluster_dir_), 0);
}

}  // namespace
}  // namespace kvl
