// End-to-end (issue 35): kvl-server processes with small random models and
// fitted translators, over a private redis-server, driven by a C++ gRPC
// client. A retried request id is replayed, not run again; a session lives on
// after its replica (another replica, or a restarted one, continues it from
// Redis, rebuilding its cache: path RESTORED); a Redis outage fails calls with
// UNAVAILABLE and the server recovers when Redis is back; bad input to the
// new API gets its code and changes nothing.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "kvlingo/v1/chat.grpc.pb.h"
#include "kvlingo/v1/model.grpc.pb.h"
#include "kvlingo/v1/session.grpc.pb.h"
#include "tests/router/model_fixture.h"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/net.h"
#include "tests/testing/redis.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Json = nlohmann::json;
namespace v1 = kvlingo::v1;

const std::vector<std::pair<std::string, std::string>> kPairs = {{"small", "large"},
                                                                 {"large", "small"}};

struct Replica {
  std::unique_ptr<testing::Subprocess> process;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
};

struct Turn {
  grpc::Status status;
  std::vector<v1::ChatResponse> events;
  std::string text;
  const v1::RoutingDecision& routing() const { return events.front().routing(); }
  const v1::TurnSummary& summary() const { return events.back().summary(); }
};

struct TurnArgs {
  std::string model = "small";
  std::string request_id;
  std::string header;  // x-kvl-session-id; empty: the session's own
  bool no_header = false;
  TurnArgs& Model(std::string m) { model = std::move(m); return *this; }
  TurnArgs& Id(std::string id) { request_id = std::move(id); return *this; }
  TurnArgs& Header(std::string h) { header = std::move(h); return *this; }
  TurnArgs& NoHeader() { no_header = true; return *this; }
};

class DurableSessionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("durable");
    ASSERT_TRUE(testing::WriteFixtureModels(dir_->path()).ok());
    ASSERT_TRUE(testing::WriteFixtureTranslators(dir_->path(), kPairs, {}).ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::RedisServer>> r = testing::RedisServer::Start();
    ASSERT_TRUE(r.ok()) << r.status();
    redis_ = *std::move(r);
  }

  // backend "memory" or "redis" (this test's Redis).
  Replica Start(const std::string& backend) {
    Json models = Json::array(), translators = Json::array();
    for (const auto& m : testing::FixtureModels()) {
      models.push_back({{"name", m.name}, {"path", dir_->path() + "/" + m.name}});
    }
    for (const auto& [s, t] : kPairs) {
      translators.push_back(
          {{"source", s}, {"target", t}, {"path", testing::TranslatorPath(dir_->path(), s, t)}});
    }
    Json store = {{"backend", backend}};
    if (backend == "redis") {
      store["redis_address"] = redis_->address();
      store["timeout_ms"] = 500;
    }
    const Json config = {
        {"server", {{"drain_timeout_seconds", 5}, {"max_import_bytes", 3000}}},
        {"runtime", {{"threads", 1}}},
        {"models", models},
        {"translators", translators},
        {"routing",
         {{"policy", "explicit"},
          {"default_model", "small"},
          {"strategy", "translate"},
          {"native_tail_tokens", 4},
          {"repair", "off"}}},
        {"sessions", {{"store", store}}}};
    const std::string path =
        dir_->WriteFile("server-" + std::to_string(++n_started_) + ".json", config.dump(2));
    Replica r;
    absl::StatusOr<int> port = testing::FindFreeLoopbackPort();
    EXPECT_TRUE(port.ok());
    auto process = testing::Subprocess::Start({KVL_SERVER_BIN, "--config", path, "--listen",
                                               "127.0.0.1:" + std::to_string(*port),
                                               "--metrics-address", "127.0.0.1:0"});
    EXPECT_TRUE(process.ok()) << process.status();
    auto line = (*process)->WaitForLine(testing::Stream::kStdout, "listening on", 60s);
    EXPECT_TRUE(line.ok()) << line.status();
    r.address = "127.0.0.1:" + std::to_string(*port);
    r.process = *std::move(process);
    r.channel = testing::InsecureChannel(r.address);
    return r;
  }

  static grpc::Status Create(const Replica& r, const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::CreateSessionRequest req;
    req.set_session_id(id);
    req.set_system_prompt("Be brief.");
    v1::Session out;
    return v1::SessionService::NewStub(r.channel)->CreateSession(&ctx, req, &out);
  }

  static Turn Chat(const Replica& r, const std::string& session, const std::string& message,
                   const TurnArgs& args = {}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    if (!args.no_header) {
      ctx.AddMetadata("x-kvl-session-id", args.header.empty() ? session : args.header);
    }
    v1::ChatRequest req;
    req.set_session_id(session);
    req.set_user_message(message);
    req.set_request_id(args.request_id);
    req.mutable_routing()->set_model(args.model);
    req.mutable_sampling()->set_max_tokens(6);
    Turn t;
    auto reader = v1::ChatService::NewStub(r.channel)->Chat(&ctx, req);
    v1::ChatResponse e;
    while (reader->Read(&e)) {
      if (e.has_delta()) t.text += e.delta().text();
      t.events.push_back(e);
    }
    t.status = reader->Finish();
    return t;
  }

  static absl::StatusOr<v1::Transcript> Transcript(const Replica& r, const std::string& id,
                                                   const std::string& header = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    if (!header.empty()) ctx.AddMetadata("x-kvl-session-id", header);
    v1::GetTranscriptRequest req;
    req.set_session_id(id);
    v1::Transcript out;
    grpc::Status s = v1::SessionService::NewStub(r.channel)->GetTranscript(&ctx, req, &out);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return out;
  }

  static grpc::Status Import(const Replica& r, const v1::ImportSessionRequest& req,
                             v1::Session* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 60s);
    return v1::SessionService::NewStub(r.channel)->ImportSession(&ctx, req, out);
  }

  static absl::StatusOr<v1::Session> Get(const Replica& r, const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::Session out;
    grpc::Status s = v1::SessionService::NewStub(r.channel)->GetSession(&ctx, req, &out);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return out;
  }

  static void ExpectOk(const Turn& t, const std::string& what) {
    ASSERT_TRUE(t.status.ok()) << what << ": " << t.status.error_message();
    ASSERT_GE(t.events.size(), 2u) << what;
    ASSERT_TRUE(t.events.front().has_routing()) << what;
    ASSERT_TRUE(t.events.back().has_summary()) << what;
  }

  static testing::TempDir* dir_;
  static int n_started_;
  std::unique_ptr<testing::RedisServer> redis_;
};
testing::TempDir* DurableSessionsTest::dir_ = nullptr;
int DurableSessionsTest::n_started_ = 0;

TEST_F(DurableSessionsTest, ARetriedRequestIdIsReplayedNotRunAgain) {
  for (const std::string backend : {"memory", "redis"}) {
    SCOPED_TRACE(backend);
    Replica a = Start(backend);
    ASSERT_TRUE(Create(a, "s").ok());
    const Turn first = Chat(a, "s", "Hello there", TurnArgs().Id("r-1"));
    ExpectOk(first, "first");
    EXPECT_FALSE(first.routing().replayed());
    EXPECT_FALSE(first.summary().replayed());

    const Turn retry = Chat(a, "s", "Hello there", TurnArgs().Id("r-1"));
    ExpectOk(retry, "retry");
    ASSERT_EQ(retry.events.size(), first.events.size());
    EXPECT_TRUE(retry.routing().replayed());
    EXPECT_TRUE(retry.summary().replayed());
    for (size_t i = 0; i < first.events.size(); ++i) {
      v1::ChatResponse e = retry.events[i];
      if (e.has_routing()) e.mutable_routing()->set_replayed(false);
      if (e.has_summary()) e.mutable_summary()->set_replayed(false);
      EXPECT_EQ(e.SerializeAsString(), first.events[i].SerializeAsString()) << "event " << i;
    }
    // The replay ran nothing: still one turn, and a new id runs a new one.
    EXPECT_EQ(Get(a, "s")->turns(), 1u);
    ExpectOk(Chat(a, "s", "And then?", TurnArgs().Id("r-2")), "second");
    EXPECT_EQ(Get(a, "s")->turns(), 2u);

    absl::StatusOr<v1::Transcript> t = Transcript(a, "s");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->system_prompt(), "Be brief.");
    ASSERT_EQ(t->turns_size(), 2);
    EXPECT_EQ(t->turns(0).request_id(), "r-1");
    EXPECT_EQ(t->turns(0).user_message(), "Hello there");
    EXPECT_EQ(t->turns(0).reply(), first.text);
    EXPECT_EQ(t->turns(0).model(), "small");
    EXPECT_EQ(t->turns(0).finish_reason(), first.summary().finish_reason());
    EXPECT_EQ(t->turns(0).history_tokens(), first.summary().history_tokens());
    EXPECT_EQ(t->turns(1).request_id(), "r-2");
  }
}

TEST_F(DurableSessionsTest, AnotherReplicaContinuesASessionFromRedisAndTranslatesLater) {
  Replica a = Start("redis");
  Replica b = Start("redis");
  ASSERT_TRUE(Create(a, "s").ok());
  ExpectOk(Chat(a, "s", "Hello there", TurnArgs().Model("small")), "a1");
  const Turn a2 = Chat(a, "s", "Tell me more", TurnArgs().Model("large"));
  ExpectOk(a2, "a2");
  EXPECT_EQ(a2.routing().path(), v1::CACHE_PATH_TRANSLATED);

  // B has never seen the session: it rebuilds it from Redis and prefills.
  const Turn b1 = Chat(b, "s", "Go on", TurnArgs().Model("large"));
  ExpectOk(b1, "b1");
  EXPECT_EQ(b1.routing().path(), v1::CACHE_PATH_RESTORED);
  EXPECT_EQ(b1.routing().previous_model(), "large");
  // It prefilled the whole history (and the new turn).
  EXPECT_GT(b1.summary().prefill_tokens(), a2.summary().history_tokens());
  // A switch on B translates from the line B built.
  const Turn b2 = Chat(b, "s", "Briefly?", TurnArgs().Model("small"));
  ExpectOk(b2, "b2");
  EXPECT_TRUE(b2.routing().switched());
  EXPECT_EQ(b2.routing().path(), v1::CACHE_PATH_TRANSLATED);
  EXPECT_GT(b2.routing().tokens_translated(), 0u);

  // A's copy is two turns old: it restores the current one first.
  const Turn a3 = Chat(a, "s", "Thanks", TurnArgs().Model("small"));
  ExpectOk(a3, "a3");
  EXPECT_EQ(a3.routing().path(), v1::CACHE_PATH_RESTORED);
  absl::StatusOr<v1::Transcript> t = Transcript(b, "s");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->turns_size(), 5);
  const std::vector<std::string> models = {"small", "large", "large", "small", "small"};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t->turns(i).model(), models[i]) << i;
  EXPECT_EQ(t->turns(4).history_tokens(), a3.summary().history_tokens());
  EXPECT_EQ(Get(b, "s")->turns(), 5u);
}

TEST_F(DurableSessionsTest, ARestartedReplicaLosesNoAcknowledgedTurn) {
  std::vector<std::string> replies;
  {
    Replica a = Start("redis");
    ASSERT_TRUE(Create(a, "s").ok());
    for (const char* text : {"One", "Two", "Three"}) {
      const Turn t = Chat(a, "s", text, TurnArgs().Model(text[0] == 'T' ? "large" : "small"));
      ExpectOk(t, text);
      replies.push_back(t.text);
    }
    ASSERT_TRUE(a.process->Signal(SIGKILL).ok());
    ASSERT_TRUE(a.process->Wait(10s).ok());
  }
  Replica again = Start("redis");
  absl::StatusOr<v1::Transcript> t = Transcript(again, "s");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->turns_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(t->turns(i).reply(), replies[i]) << i;
  const Turn next = Chat(again, "s", "Four", TurnArgs().Model("large"));
  ExpectOk(next, "after restart");
  EXPECT_EQ(next.routing().path(), v1::CACHE_PATH_RESTORED);
  EXPECT_EQ(Transcript(again, "s")->turns_size(), 4);
}

TEST_F(DurableSessionsTest, ARedisOutageIsUnavailableChangesNothingAndTheServerRecovers) {
  Replica a = Start("redis");
  ASSERT_TRUE(Create(a, "s").ok());
  ExpectOk(Chat(a, "s", "Hello"), "before");

  ASSERT_TRUE(redis_->Pause().ok());
  const auto t0 = std::chrono::steady_clock::now();
  const Turn during = Chat(a, "s", "Hello again", TurnArgs().Id("r-9"));
  EXPECT_EQ(during.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << during.status.error_message();
  EXPECT_THAT(during.status.error_message(), HasSubstr("session store"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(Create(a, "t").error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(redis_->Resume().ok());

  // Back: the session is as it was (one turn), and the retry runs the turn.
  EXPECT_EQ(Transcript(a, "s")->turns_size(), 1);
  ExpectOk(Chat(a, "s", "Hello again", TurnArgs().Id("r-9")), "after");
  EXPECT_EQ(Transcript(a, "s")->turns_size(), 2);
  // The create that timed out may have reached Redis once it woke (a timeout
  // does not say): a retry either creates the session or finds it created.
  const grpc::Status retried = Create(a, "t");
  EXPECT_TRUE(retried.ok() || retried.error_code() == grpc::StatusCode::ALREADY_EXISTS)
      << retried.error_message();
  EXPECT_TRUE(Get(a, "t").ok());
}

// Session calls wait on the store off gRPC's callback threads
// (server/services.h): while many of them wait on a Redis that does not
// answer, a call that needs no store is answered at once.
TEST_F(DurableSessionsTest, CallsWaitingOnAStalledStoreHoldUpNoOtherCall) {
  Replica a = Start("redis");
  ASSERT_TRUE(Create(a, "s").ok());
  ASSERT_TRUE(redis_->Pause().ok());
  std::vector<std::thread> waiting;
  for (int i = 0; i < 8; ++i) {
    waiting.emplace_back([&] {
      EXPECT_EQ(Get(a, "s").status().code(), absl::StatusCode::kUnavailable);
    });
  }
  std::this_thread::sleep_for(100ms);  // let them reach the server: a head start, not a wait
  auto models = v1::ModelService::NewStub(a.channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::ListModelsResponse listed;
  const auto t0 = std::chrono::steady_clock::now();
  const grpc::Status status = models->ListModels(&ctx, v1::ListModelsRequest(), &listed);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(status.ok()) << status.error_message();
  // Eight store calls of up to 500 ms each (timeout_ms) on gRPC's two
  // callback threads would hold it up about 2 s.
  EXPECT_LT(took, 1s);
  for (std::thread& t : waiting) t.join();
  ASSERT_TRUE(redis_->Resume().ok());
}

TEST_F(DurableSessionsTest, BadInputToTheNewApiGetsItsCodeAndChangesNothing) {
  Replica a = Start("redis");
  ASSERT_TRUE(Create(a, "s").ok());
  ExpectOk(Chat(a, "s", "Hello"), "first");

  EXPECT_EQ(Transcript(a, "nope").status().code(), absl::StatusCode::kNotFound);
  // A session header that names another session: refused, nothing runs.
  const Turn mismatched = Chat(a, "s", "Hi", TurnArgs().Header("other"));
  EXPECT_EQ(mismatched.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(mismatched.status.error_message(), HasSubstr("x-kvl-session-id"));
  EXPECT_EQ(Transcript(a, "s", "other").status().code(), absl::StatusCode::kInvalidArgument);
  // A malformed request id.
  const Turn bad_id = Chat(a, "s", "Hi", TurnArgs().Id("no spaces allowed"));
  EXPECT_EQ(bad_id.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_id.status.error_message(), HasSubstr("request_id"));
  // No header at all is fine (clients without a load balancer).
  ExpectOk(Chat(a, "s", "Hi", TurnArgs().NoHeader()), "no header");
  EXPECT_EQ(Transcript(a, "s")->turns_size(), 2);
}

TEST_F(DurableSessionsTest, AReplicasCopyOfADeletedAndRecreatedSessionIsNotUsed) {
  Replica a = Start("redis");
  Replica b = Start("redis");
  auto remove = [](const Replica& r, const std::string& id) {
    grpc::ClientContext ctx;
    v1::DeleteSessionRequest del;
    del.set_session_id(id);
    v1::DeleteSessionResponse out;
    return v1::SessionService::NewStub(r.channel)->DeleteSession(&ctx, del, &out);
  };
  ASSERT_TRUE(Create(a, "s").ok());
  ExpectOk(Chat(a, "s", "Hello"), "a1");  // A holds a copy with one turn
  // Through B: deleted, created again with another system prompt, one turn.
  ASSERT_TRUE(remove(b, "s").ok());
  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    req.set_session_id("s");
    req.set_system_prompt("Another prompt, a longer one than before.");
    v1::Session out;
    ASSERT_TRUE(v1::SessionService::NewStub(b.channel)->CreateSession(&ctx, req, &out).ok());
  }
  ExpectOk(Chat(b, "s", "Hello"), "b1");
  // A's copy also has one turn, of the old session: it must not be used.
  const Turn a2 = Chat(a, "s", "Again");
  ExpectOk(a2, "a2");
  EXPECT_EQ(a2.routing().path(), v1::CACHE_PATH_RESTORED);
  EXPECT_EQ(Get(a, "s")->system_prompt(), "Another prompt, a longer one than before.");
  EXPECT_EQ(Transcript(a, "s")->turns_size(), 2);
  // Deleted through B again: A's copy does not block creating the id on A.
  ASSERT_TRUE(remove(b, "s").ok());
  EXPECT_TRUE(Create(a, "s").ok());
  EXPECT_EQ(Get(a, "s")->turns(), 0u);
}

TEST_F(DurableSessionsTest, AnImportedTranscriptBecomesASessionThatGoesOn) {
  Replica a = Start("redis");
  ASSERT_TRUE(Create(a, "orig").ok());
  ExpectOk(Chat(a, "orig", "Hello there", TurnArgs().Model("small")), "1");
  ExpectOk(Chat(a, "orig", "Tell me more", TurnArgs().Model("large")), "2");
  absl::StatusOr<v1::Transcript> t = Transcript(a, "orig");
  ASSERT_TRUE(t.ok()) << t.status();

  v1::ImportSessionRequest req;
  req.set_session_id("copy");
  req.set_system_prompt(t->system_prompt());
  for (const v1::TranscriptTurn& turn : t->turns()) {
    v1::ImportedTurn* in = req.add_turns();
    in->set_user_message(turn.user_message());
    in->set_reply(turn.reply());
    in->set_model(turn.model());
  }
  v1::Session session;
  const grpc::Status imported = Import(a, req, &session);
  ASSERT_TRUE(imported.ok()) << imported.error_message();
  EXPECT_EQ(session.session_id(), "copy");
  EXPECT_EQ(session.turns(), 2u);
  EXPECT_EQ(session.last_model(), "large");
  absl::StatusOr<v1::Transcript> copy = Transcript(a, "copy");
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_EQ(copy->turns_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(copy->turns(i).user_message(), t->turns(i).user_message()) << i;
    EXPECT_EQ(copy->turns(i).reply(), t->turns(i).reply()) << i;
    EXPECT_EQ(copy->turns(i).model(), t->turns(i).model()) << i;
  }
  // It goes on like any session, on any replica.
  Replica b = Start("redis");
  const Turn next = Chat(b, "copy", "And then?", TurnArgs().Model("small"));
  ExpectOk(next, "after import");
  EXPECT_EQ(next.routing().previous_model(), "large");
  EXPECT_EQ(Get(b, "copy")->turns(), 3u);
}

TEST_F(DurableSessionsTest, AMalformedOrOversizedImportIsRefusedAndCreatesNothing) {
  Replica a = Start("redis");
  auto refused = [&](const v1::ImportSessionRequest& req, grpc::StatusCode code,
                     const std::string& names) {
    v1::Session out;
    const grpc::Status s = Import(a, req, &out);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(names));
    EXPECT_EQ(Get(a, req.session_id()).status().code(), absl::StatusCode::kNotFound) << names;
  };
  auto request = [](int turns) {
    v1::ImportSessionRequest req;
    req.set_session_id("imp");
    for (int i = 0; i < turns; ++i) {
      v1::ImportedTurn* t = req.add_turns();
      t->set_user_message("Hello " + std::to_string(i));
      t->set_reply("Hi.");
    }
    return req;
  };
  v1::ImportSessionRequest empty_message = request(2);
  empty_message.mutable_turns(1)->clear_user_message();
  refused(empty_message, grpc::StatusCode::INVALID_ARGUMENT, "turns[1].user_message");
  v1::ImportSessionRequest bad_utf8 = request(2);
  bad_utf8.mutable_turns(0)->set_reply("\xC3\x28");
  refused(bad_utf8, grpc::StatusCode::INVALID_ARGUMENT, "turns[0].reply: not valid UTF-8");
  v1::ImportSessionRequest unknown_model = request(1);
  unknown_model.mutable_turns(0)->set_model("huge");
  refused(unknown_model, grpc::StatusCode::NOT_FOUND, "turns[0].model");
  v1::ImportSessionRequest oversized = request(1);
  oversized.mutable_turns(0)->set_reply(std::string(1500, 'a'));
  oversized.add_turns()->CopyFrom(oversized.turns(0));
  refused(oversized, grpc::StatusCode::INVALID_ARGUMENT, "server.max_import_bytes");
  v1::ImportSessionRequest bad_id = request(1);
  bad_id.set_session_id("no spaces");
  refused(bad_id, grpc::StatusCode::INVALID_ARGUMENT, "session_id");

  // A taken id: ALREADY_EXISTS, and the existing session is untouched.
  ASSERT_TRUE(Create(a, "imp").ok());
  v1::Session out;
  EXPECT_EQ(Import(a, request(1), &out).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Get(a, "imp")->turns(), 0u);
  EXPECT_EQ(Transcript(a, "imp")->turns_size(), 0);
}

}  // namespace
}  // namespace kvl
