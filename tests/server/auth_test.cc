// API keys and tenants (server/auth.h, config "auth"): the parts in
// isolation, and a kvl-server serving the house models to two tenants: every RPC without a key, with a wrong key
// and with a key lacking the right; every RPC of tenant B on tenant A's
// session; ListSessions per tenant; per-tenant session and turn limits;
// reflection switched off.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/sha256.h"
#include "kvlingo/v1/chat.grpc.pb.h"
#include "kvlingo/v1/model.grpc.pb.h"
#include "kvlingo/v1/session.grpc.pb.h"
#include "server/auth.h"
#include "server/config.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using Json = nlohmann::json;
using server::Authenticator;
using server::Caller;
using server::Right;
using Code = grpc::StatusCode;

server::AuthSection TwoTenants() {
  server::AuthSection auth;
  auth.keys.push_back({"a-app", "acme", Sha256Hex("key-a"), {Right::kChat, Right::kModels}});
  auth.keys.push_back({"b-app", "bolt", Sha256Hex("key-b"), {Right::kChat}});
  auth.keys.push_back({"ops", "acme", Sha256Hex("key-admin"), {Right::kAdmin}});
  auth.tenants["acme"] = {/*max_sessions=*/2, /*max_concurrent_turns=*/1};
  return auth;
}

TEST(AuthenticatorTest, NamesTheCallerOrSaysWhyNot) {
  Authenticator auth(TwoTenants());
  EXPECT_EQ(auth.Authenticate(std::nullopt).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authenticate("key-a").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authenticate("Basic key-a").status().code(), absl::StatusCode::kUnauthenticated);
  const absl::Status wrong = auth.Authenticate("Bearer key-c").status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.message(), Not(HasSubstr("key-c")));  // a key is never repeated
  absl::StatusOr<Caller> a = auth.Authenticate("Bearer key-a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tenant, "acme");
  EXPECT_EQ(a->key_name, "a-app");
  EXPECT_TRUE(Authenticator::Require(*a, Right::kChat, "Chat").ok());
  const absl::Status denied = Authenticator::Require(*a, Right::kImport, "ImportSession");
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.message(), HasSubstr("'import' right"));
  absl::StatusOr<Caller> admin = auth.Authenticate("bearer  key-admin ");
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_TRUE(Authenticator::Require(*admin, Right::kImport, "ImportSession").ok());
}

TEST(AuthenticatorTest, WithoutKeysEveryoneIsTheOpenTenantWithEveryRight) {
  Authenticator open{server::AuthSection{}};
  absl::StatusOr<Caller> c = open.Authenticate(std::nullopt);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tenant, "");
  EXPECT_TRUE(Authenticator::Require(*c, Right::kImport, "ImportSession").ok());
  EXPECT_EQ(server::ScopedSessionId(*c, "s1"), "s1");
}

TEST(AuthenticatorTest, ScopedIdsKeepTenantsApart) {
  const Caller a{"acme", "a-app", false, {Right::kChat}};
  const Caller b{"bolt", "b-app", false, {Right::kChat}};
  EXPECT_EQ(server::ScopedSessionId(a, "s1"), "acme/s1");
  EXPECT_EQ(server::ClientSessionId(a, "acme/s1"), "s1");
  EXPECT_EQ(server::ClientSessionId(b, "acme/s1"), "");
  EXPECT_FALSE(server::OwnsSession(b, "acme/s1"));
  EXPECT_FALSE(server::OwnsSession(a, "acmex/s1"));
}

TEST(AuthenticatorTest, ConcurrentTurnsPerTenantAreBounded) {
  Authenticator auth(TwoTenants());
  ASSERT_TRUE(auth.BeginTurn("acme").ok());
  const absl::Status full = auth.BeginTurn("acme");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("auth.tenants.acme.max_concurrent_turns"));
  EXPECT_TRUE(auth.BeginTurn("bolt").ok());  // no limit for bolt
  auth.EndTurn("acme");
  EXPECT_TRUE(auth.BeginTurn("acme").ok());
}

TEST(AuthConfigTest, BadEntriesNameTheKey) {
  auto error = [](const std::string& auth) {
    return std::string(server::ParseConfig(R"({"auth": )" + auth + "}", "/").status().message());
  };
  const std::string hash = Sha256Hex("k");
  EXPECT_THAT(error(R"({"keys": [{"name": "x", "tenant": "t", "sha256": "abc"}]})"),
              HasSubstr("auth.keys[0].sha256: expected the key's SHA-256 as 64 hex digits"));
  EXPECT_THAT(error(R"({"keys": [{"name": "x", "tenant": "a/b", "sha256": ")" + hash + R"("}]})"),
              HasSubstr("auth.keys[0].tenant: expected 1-64 characters"));
  EXPECT_THAT(error(R"({"keys": [{"name": "x", "tenant": "t", "sha256": ")" + hash +
                    R"(", "rights": ["root"]}]})"),
              HasSubstr("auth.keys[0].rights[0]: expected one of chat, models, import, admin"));
  EXPECT_THAT(error(R"({"keys": [{"name": "x", "tenant": "t", "sha256": ")" + hash +
                    R"("}, {"name": "y", "tenant": "u", "sha256": ")" + hash + R"("}]})"),
              HasSubstr("auth.keys[1].sha256: another key has the same hash"));
  EXPECT_THAT(error(R"({"keys": [{"name": "x", "tenant": "t", "sha256": ")" + hash +
                    R"("}], "tenants": {"v": {"max_sessions": 1}}})"),
              HasSubstr("auth.tenants.v: no key in auth.keys belongs to this tenant"));
  EXPECT_THAT(
      std::string(server::ParseConfig(R"({"server": {"reflection": "no"}})", "/").status().message()),
      HasSubstr("server.reflection: expected true or false"));
}

// A kvl-server with the house models and two tenants.
class AuthServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("auth");
    const std::string src = KVL_SOURCE_DIR;
    const Json config = {
        {"server", {{"reflection", false}, {"max_metadata_bytes", 1024}}},
        {"models",
         {{{"name", "kvl-small"}, {"path", src + "/models/kvl-small"}},
          {{"name", "kvl-large"}, {"path", src + "/models/kvl-large"}}}},
        {"routing", {{"policy", "fixed"}, {"default_model", "kvl-small"}}},
        {"auth",
         {{"keys",
           {{{"name", "a-app"}, {"tenant", "acme"}, {"sha256", Sha256Hex("key-a")}},
            {{"name", "a-models"}, {"tenant", "acme"}, {"sha256", Sha256Hex("key-a-models")},
             {"rights", {"models"}}},
            {{"name", "b-app"}, {"tenant", "bolt"}, {"sha256", Sha256Hex("key-b")},
             {"rights", {"chat", "import"}}}}},
          {"tenants", {{"acme", {{"max_sessions", 3}, {"max_concurrent_turns", 1}}}}}}}};
    const std::string file = dir_->WriteFile("server.json", config.dump());
    auto port = testing::FindFreeLoopbackPort();
    ASSERT_TRUE(port.ok());
    address_ = "127.0.0.1:" + std::to_string(*port);
    auto process = testing::Subprocess::Start({KVL_SERVER_BIN, "--config", file, "--listen",
                                               address_, "--metrics-address", "127.0.0.1:0"});
    ASSERT_TRUE(process.ok()) << process.status();
    auto line = (*process)->WaitForLine(testing::Stream::kStdout, "listening on", 60s);
    ASSERT_TRUE(line.ok()) << line.status();
    server_ = process->release();
    channel_ = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  static void TearDownTestSuite() {
    delete channel_;
    delete server_;
    delete dir_;
  }

  // A context carrying `key` ("" : none) and a deadline.
  static std::unique_ptr<grpc::ClientContext> As(const std::string& key) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
    ctx->set_deadline(std::chrono::system_clock::now() + 60s);
    return ctx;
  }
  static std::unique_ptr<kvlingo::v1::SessionService::Stub> Sessions() {
    return kvlingo::v1::SessionService::NewStub(*channel_);
  }

  static grpc::Status Create(const std::string& key, const std::string& id,
                             kvlingo::v1::Session* out = nullptr) {
    kvlingo::v1::CreateSessionRequest req;
    req.set_session_id(id);
    kvlingo::v1::Session session;
    return Sessions()->CreateSession(As(key).get(), req, out != nullptr ? out : &session);
  }
  static grpc::Status Get(const std::string& key, const std::string& id) {
    kvlingo::v1::GetSessionRequest req;
    req.set_session_id(id);
    kvlingo::v1::Session out;
    return Sessions()->GetSession(As(key).get(), req, &out);
  }
  static grpc::Status Delete(const std::string& key, const std::string& id) {
    kvlingo::v1::DeleteSessionRequest req;
    req.set_session_id(id);
    kvlingo::v1::DeleteSessionResponse out;
    return Sessions()->DeleteSession(As(key).get(), req, &out);
  }
  static grpc::Status Transcript(const std::string& key, const std::string& id) {
    kvlingo::v1::GetTranscriptRequest req;
    req.set_session_id(id);
    kvlingo::v1::Transcript out;
    return Sessions()->GetTranscript(As(key).get(), req, &out);
  }
  static grpc::Status List(const std::string& key, std::vector<std::string>* ids = nullptr) {
    kvlingo::v1::ListSessionsRequest req;
    req.set_page_size(1000);
    kvlingo::v1::ListSessionsResponse out;
    grpc::Status s = Sessions()->ListSessions(As(key).get(), req, &out);
    if (ids != nullptr) {
      for (const auto& session : out.sessions()) ids->push_back(session.session_id());
    }
    return s;
  }
  static grpc::Status Import(const std::string& key, const std::string& id) {
    kvlingo::v1::ImportSessionRequest req;
    req.set_session_id(id);
    kvlingo::v1::ImportedTurn* turn = req.add_turns();
    turn->set_user_message("Hello");
    turn->set_reply("Hi!");
    kvlingo::v1::Session out;
    return Sessions()->ImportSession(As(key).get(), req, &out);
  }
  static grpc::Status ListModels(const std::string& key) {
    kvlingo::v1::ListModelsResponse out;
    return kvlingo::v1::ModelService::NewStub(*channel_)->ListModels(
        As(key).get(), kvlingo::v1::ListModelsRequest(), &out);
  }
  static grpc::Status ListTranslators(const std::string& key) {
    kvlingo::v1::ListTranslatorsResponse out;
    return kvlingo::v1::ModelService::NewStub(*channel_)->ListTranslators(
        As(key).get(), kvlingo::v1::ListTranslatorsRequest(), &out);
  }
  // A chat turn; its final status and the text it streamed.
  static grpc::Status Chat(const std::string& key, const std::string& id, uint32_t max_tokens = 4,
                           std::string* text = nullptr) {
    kvlingo::v1::ChatRequest req;
    req.set_session_id(id);
    req.set_user_message("Hello there");
    req.mutable_sampling()->set_max_tokens(max_tokens);
    auto ctx = As(key);
    auto reader = kvlingo::v1::ChatService::NewStub(*channel_)->Chat(ctx.get(), req);
    kvlingo::v1::ChatResponse r;
    while (reader->Read(&r)) {
      if (text != nullptr && r.has_delta()) *text += r.delta().text();
    }
    return reader->Finish();
  }

  // A unary call of `method` with an empty request, through the generic stub.
  static grpc::Status CallRaw(const std::string& method) {
    grpc::GenericStub stub(*channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    grpc::Slice empty;  // an empty message on the wire
    const grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  }

  static testing::TempDir* dir_;
  static testing::Subprocess* server_;
  static std::string address_;
  static std::shared_ptr<grpc::Channel>* channel_;
};
testing::TempDir* AuthServerTest::dir_ = nullptr;
testing::Subprocess* AuthServerTest::server_ = nullptr;
std::string AuthServerTest::address_;
std::shared_ptr<grpc::Channel>* AuthServerTest::channel_ = nullptr;

TEST_F(AuthServerTest, EveryRpcWantsAKnownKeyAndTheRightForIt) {
  for (const std::string& key : {std::string(), std::string("wrong-key")}) {
    SCOPED_TRACE(key.empty() ? "no key" : "wrong key");
    EXPECT_EQ(Create(key, "").error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(Get(key, "x").error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(List(key).error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(Delete(key, "x").error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(Transcript(key, "x").error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(Import(key, "").error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(Chat(key, "x").error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(ListModels(key).error_code(), Code::UNAUTHENTICATED);
    EXPECT_EQ(ListTranslators(key).error_code(), Code::UNAUTHENTICATED);
  }
  // a-models may list models only; a-app may not import; b-app may not list models.
  EXPECT_TRUE(ListModels("key-a-models").ok());
  EXPECT_EQ(Create("key-a-models", "").error_code(), Code::PERMISSION_DENIED);
  EXPECT_EQ(Chat("key-a-models", "x").error_code(), Code::PERMISSION_DENIED);
  const grpc::Status no_import = Import("key-a", "");
  EXPECT_EQ(no_import.error_code(), Code::PERMISSION_DENIED);
  EXPECT_THAT(no_import.error_message(), HasSubstr("lacks the 'import' right"));
  EXPECT_EQ(ListTranslators("key-b").error_code(), Code::PERMISSION_DENIED);
  // Health stays open.
  const grpc::Status health = CallRaw("/grpc.health.v1.Health/Check");
  EXPECT_TRUE(health.ok()) << health.error_message();
}

TEST_F(AuthServerTest, AnotherTenantsSessionIsNotFoundInEveryRpc) {
  kvlingo::v1::Session created;
  ASSERT_TRUE(Create("key-a", "shared-name", &created).ok());
  EXPECT_EQ(created.session_id(), "shared-name");  // the client's own id
  ASSERT_TRUE(Chat("key-a", "shared-name").ok());

  EXPECT_EQ(Get("key-b", "shared-name").error_code(), Code::NOT_FOUND);
  // Naming the store's form of A's id does not reach it either.
  EXPECT_EQ(Get("key-b", "acme/shared-name").error_code(), Code::NOT_FOUND);
  EXPECT_EQ(Transcript("key-b", "acme/shared-name").error_code(), Code::NOT_FOUND);
  EXPECT_EQ(Delete("key-b", "acme/shared-name").error_code(), Code::NOT_FOUND);
  EXPECT_EQ(Create("key-b", "acme/other").error_code(), Code::INVALID_ARGUMENT);
  // Errors speak of the client's own ids, never the store's "<tenant>/<id>".
  const grpc::Status missing = Get("key-a", "no-such-session");
  EXPECT_EQ(missing.error_code(), Code::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("'no-such-session'"));
  EXPECT_THAT(missing.error_message(), Not(HasSubstr("acme/")));
  const grpc::Status taken = Create("key-a", "shared-name");
  EXPECT_EQ(taken.error_code(), Code::ALREADY_EXISTS);
  EXPECT_THAT(taken.error_message(), Not(HasSubstr("acme/")));
  EXPECT_EQ(Transcript("key-b", "shared-name").error_code(), Code::NOT_FOUND);
  EXPECT_EQ(Chat("key-b", "shared-name").error_code(), Code::NOT_FOUND);
  EXPECT_EQ(Delete("key-b", "shared-name").error_code(), Code::NOT_FOUND);
  std::vector<std::string> b_ids;
  ASSERT_TRUE(List("key-b", &b_ids).ok());
  EXPECT_THAT(b_ids, Not(::testing::Contains("shared-name")));
  // B's own session of the same name is B's, and A's is untouched by it.
  ASSERT_TRUE(Import("key-b", "shared-name").ok());
  b_ids.clear();
  ASSERT_TRUE(List("key-b", &b_ids).ok());
  EXPECT_THAT(b_ids, ::testing::Contains("shared-name"));
  ASSERT_TRUE(Delete("key-b", "shared-name").ok());

  kvlingo::v1::GetSessionRequest req;
  req.set_session_id("shared-name");
  kvlingo::v1::Session a_view;
  ASSERT_TRUE(Sessions()->GetSession(As("key-a").get(), req, &a_view).ok());
  EXPECT_EQ(a_view.turns(), 1u);
  EXPECT_EQ(a_view.session_id(), "shared-name");
  std::vector<std::string> a_ids;
  ASSERT_TRUE(List("key-a", &a_ids).ok());
  EXPECT_THAT(a_ids, ::testing::Contains("shared-name"));
  ASSERT_TRUE(Delete("key-a", "shared-name").ok());
}

TEST_F(AuthServerTest, TenantLimitsOnSessionsAndConcurrentTurns) {
  // acme: at most 3 sessions, 1 turn at a time.
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    kvlingo::v1::Session s;
    ASSERT_TRUE(Create("key-a", "", &s).ok());
    ids.push_back(s.session_id());
  }
  const grpc::Status full = Create("key-a", "");
  EXPECT_EQ(full.error_code(), Code::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("auth.tenants.acme.max_sessions"));
  EXPECT_TRUE(Create("key-b", "").ok());  // bolt is not limited by acme's limit

  // A turn in progress (sampled at temperature 2, so it does not stop soon)
  // holds acme's only turn: a second one is refused at once; bolt's run.
  kvlingo::v1::Session b_session;
  ASSERT_TRUE(Create("key-b", "", &b_session).ok());
  kvlingo::v1::ChatRequest req;
  req.set_session_id(ids[0]);
  req.set_user_message("Tell me a long story.");
  req.mutable_sampling()->set_max_tokens(2000);
  req.mutable_sampling()->set_temperature(2.0f);
  req.mutable_sampling()->set_seed(7);
  auto ctx = As("key-a");
  auto reader = kvlingo::v1::ChatService::NewStub(*channel_)->Chat(ctx.get(), req);
  kvlingo::v1::ChatResponse first;
  bool streaming = false;
  while (!streaming && reader->Read(&first)) streaming = first.has_delta();
  ASSERT_TRUE(streaming) << "the long turn ended before its first token";
  const grpc::Status second = Chat("key-a", ids[1]);
  EXPECT_EQ(second.error_code(), Code::RESOURCE_EXHAUSTED) << second.error_message();
  EXPECT_THAT(second.error_message(), HasSubstr("auth.tenants.acme.max_concurrent_turns"));
  EXPECT_TRUE(Chat("key-b", b_session.session_id()).ok());
  ctx->TryCancel();
  while (reader->Read(&first)) {
  }
  (void)reader->Finish();
  // The slot is free again once the stream is done.
  grpc::Status again;
  for (int attempt = 0; attempt < 100; ++attempt) {
    again = Chat("key-a", ids[1]);
    if (again.error_code() != Code::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  EXPECT_TRUE(Delete("key-b", b_session.session_id()).ok());
  for (const std::string& id : ids) EXPECT_TRUE(Delete("key-a", id).ok());
}

TEST_F(AuthServerTest, MetadataOverItsBoundIsRefusedNamingTheLimitAndChangesNothing) {
  std::vector<std::string> before;
  ASSERT_TRUE(List("key-a", &before).ok());
  // server.max_metadata_bytes = 1024: a 1000-byte header with the key is over.
  auto over = As("key-a");
  over->AddMetadata("x-note", std::string(1000, 'n'));
  kvlingo::v1::CreateSessionRequest req;
  req.set_session_id("metadata-probe");
  kvlingo::v1::Session session;
  const grpc::Status refused = Sessions()->CreateSession(over.get(), req, &session);
  EXPECT_EQ(refused.error_code(), Code::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("server.max_metadata_bytes = 1024"));
  std::vector<std::string> after;
  ASSERT_TRUE(List("key-a", &after).ok());
  EXPECT_EQ(after, before);  // no session created
  // A chat turn too, before it touches any session.
  kvlingo::v1::ChatRequest chat;
  chat.set_session_id("metadata-probe");
  chat.set_user_message("Hello");
  auto chat_ctx = As("key-a");
  chat_ctx->AddMetadata("x-note", std::string(1000, 'n'));
  auto reader = kvlingo::v1::ChatService::NewStub(*channel_)->Chat(chat_ctx.get(), chat);
  kvlingo::v1::ChatResponse r;
  while (reader->Read(&r)) {
  }
  const grpc::Status chat_refused = reader->Finish();
  EXPECT_EQ(chat_refused.error_code(), Code::INVALID_ARGUMENT) << chat_refused.error_message();
  EXPECT_THAT(chat_refused.error_message(), HasSubstr("metadata"));
  // Far over (past gRPC's own limit, twice ours and 4 KiB): refused by the
  // transport, and the server serves the next call. gRPC then closes the
  // connection that carried the header block, and a call already started on
  // it fails UNAVAILABLE ("Socket closed", 1 run in 30 when it shared the
  // suite's channel), so the far call gets a connection of its own: a local
  // subchannel pool, as channels with equal arguments share connections.
  grpc::ChannelArguments own_connection;
  own_connection.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  const auto far_channel = grpc::CreateCustomChannel(
      address_, grpc::InsecureChannelCredentials(), own_connection);
  auto far = As("key-a");
  far->AddMetadata("x-note", std::string(64 * 1024, 'n'));
  const grpc::Status far_refused =
      kvlingo::v1::SessionService::NewStub(far_channel)->CreateSession(far.get(), req, &session);
  EXPECT_EQ(far_refused.error_code(), Code::RESOURCE_EXHAUSTED) << far_refused.error_message();
  // Under the bound, on the suite's connection: served.
  auto under = As("key-a");
  under->AddMetadata("x-note", std::string(200, 'n'));
  kvlingo::v1::ListSessionsRequest list;
  kvlingo::v1::ListSessionsResponse listed;
  const grpc::Status served = Sessions()->ListSessions(under.get(), list, &listed);
  EXPECT_TRUE(served.ok()) << served.error_message();
}

TEST_F(AuthServerTest, ReflectionCanBeTurnedOff) {
  // server.reflection false: the reflection service is not registered.
  const grpc::Status status =
      CallRaw("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo");
  EXPECT_EQ(status.error_code(), Code::UNIMPLEMENTED) << status.error_message();
}

}  // namespace
}  // namespace kvl
