// End-to-end tests of the real kvl-server binary: started as a child process
// on loopback ports, driven through real gRPC clients (C++ and Python) and
// plain HTTP, and stopped with signals.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
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
#include "tests/testing/grpc_probe.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using namespace std::chrono_literals;
namespace v1 = ::kvlingo::v1;

constexpr auto kStartTimeout = 20s;

struct RunningServer {
  std::unique_ptr<testing::Subprocess> process;
  std::string grpc_address;
  std::string metrics_host;
  int metrics_port = 0;
  std::shared_ptr<grpc::Channel> channel;
};

// Starts kvl-server with `config_text` as its config file and waits for its
// "listening" line. The gRPC port comes from FindFreeLoopbackPort (exercising
// --listen); the metrics port is chosen by the server (port 0) and read back.
absl::StatusOr<RunningServer> StartServer(const testing::TempDir& dir,
                                          const std::string& config_text,
                                          std::vector<std::string> extra_args = {}) {
  const std::string config = dir.WriteFile("server.json", config_text);
  absl::StatusOr<int> port = testing::FindFreeLoopbackPort();
  if (!port.ok()) return port.status();
  std::vector<std::string> argv = {
      KVL_SERVER_BIN,      "--config",   config, "--listen", "127.0.0.1:" + std::to_string(*port),
      "--metrics-address", "127.0.0.1:0"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> process = testing::Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line =
      (*process)->WaitForLine(testing::Stream::kStdout, "kvl-server listening on", kStartTimeout);
  if (!line.ok()) return line.status();
  std::smatch m;
  static const std::regex kReady(R"(kvl-server listening on (\S+), metrics on (\S+):(\d+)$)");
  if (!std::regex_search(*line, m, kReady)) {
    return absl::InternalError("unexpected ready line: " + *line);
  }
  RunningServer server;
  server.process = *std::move(process);
  server.grpc_address = m[1];
  server.metrics_host = m[2];
  server.metrics_port = std::stoi(m[3]);
  server.channel = testing::InsecureChannel(server.grpc_address);
  return server;
}

class ServerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<RunningServer> started = StartServer(dir_, R"({
      // the shipped defaults, with a small turn limit to test against
      "server": {"max_turn_bytes": 64, "drain_timeout_seconds": 5},
      "log": {"level": "debug"}
    })");
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    sessions_ = v1::SessionService::NewStub(server_.channel);
    chat_ = v1::ChatService::NewStub(server_.channel);
    models_ = v1::ModelService::NewStub(server_.channel);
  }

  void TearDown() override {
    if (server_.process == nullptr) return;
    ASSERT_TRUE(server_.process->Signal(SIGTERM).ok());
    absl::StatusOr<int> code = server_.process->Wait(10s);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << server_.process->Describe();
  }

  static void WithDeadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + 10s);
  }

  grpc::Status Create(const std::string& id, v1::Session* out, const std::string& prompt = "") {
    grpc::ClientContext context;
    WithDeadline(&context);
    v1::CreateSessionRequest request;
    request.set_session_id(id);
    request.set_system_prompt(prompt);
    return sessions_->CreateSession(&context, request, out);
  }

  // Reads the whole Chat stream; returns its final status.
  grpc::Status Chat(const v1::ChatRequest& request, int* n_messages = nullptr) {
    grpc::ClientContext context;
    WithDeadline(&context);
    auto reader = chat_->Chat(&context, request);
    v1::ChatResponse response;
    int n = 0;
    while (reader->Read(&response)) ++n;
    if (n_messages != nullptr) *n_messages = n;
    return reader->Finish();
  }

  std::string Metrics() {
    absl::StatusOr<testing::HttpResponse> got =
        testing::HttpGet(server_.metrics_host, server_.metrics_port, "/metrics");
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return "";
    EXPECT_EQ(got->status, 200);
    return got->body;
  }

  testing::TempDir dir_{"server"};
  RunningServer server_;
  std::unique_ptr<v1::SessionService::Stub> sessions_;
  std::unique_ptr<v1::ChatService::Stub> chat_;
  std::unique_ptr<v1::ModelService::Stub> models_;
};

TEST_F(ServerProcessTest, HealthIsServingForTheServerAndEachService) {
  for (const std::string service :
       {"", "kvlingo.v1.ChatService", "kvlingo.v1.SessionService", "kvlingo.v1.ModelService"}) {
    absl::StatusOr<testing::HealthStatus> health = testing::CheckHealth(server_.channel, service);
    ASSERT_TRUE(health.ok()) << service << ": " << health.status();
    EXPECT_EQ(*health, testing::HealthStatus::kServing) << service;
  }
  EXPECT_EQ(testing::CheckHealth(server_.channel, "no.such.Service").status().code(),
            absl::StatusCode::kNotFound);
}

// gRPC 1.51's callback threads wait 1 s for an event, then sleep 100 ms: a
// call arriving 1.0-1.1 s after the server's last event used to wait until
// the sleep ended (server/server.cc, KeepCallbackThreadsPolling). Each try
// idles 1020-1070 ms after a call, inside that window, and times the next
// call; before the fix each took 30-80 ms, now about 1 ms. The minimum over
// three tries is compared, so that one slow try on a busy machine does not
// fail the test.
TEST_F(ServerProcessTest, ACallAfterASecondOfIdlenessIsAnsweredPromptly) {
  auto get = [&] {
    grpc::ClientContext context;
    WithDeadline(&context);
    v1::GetSessionRequest request;
    request.set_session_id("no-such-session");
    v1::Session got;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(sessions_->GetSession(&context, request, &got).error_code(),
              grpc::StatusCode::NOT_FOUND);
    return std::chrono::steady_clock::now() - start;
  };
  std::vector<double> ms;
  for (const auto idle : {1020ms, 1045ms, 1070ms}) {
    get();
    std::this_thread::sleep_for(idle);
    ms.push_back(std::chrono::duration<double, std::milli>(get()).count());
  }
  EXPECT_LT(*std::min_element(ms.begin(), ms.end()), 20.0)
      << "after 1020, 1045 and 1070 ms of idleness: " << ms[0] << ", " << ms[1] << ", " << ms[2]
      << " ms";
}

TEST_F(ServerProcessTest, ReflectionListsTheKvlingoServices) {
  absl::StatusOr<std::vector<std::string>> services =
      testing::ListServicesByReflection(server_.channel);
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_THAT(*services, IsSupersetOf({"kvlingo.v1.ChatService", "kvlingo.v1.SessionService",
                                       "kvlingo.v1.ModelService", "grpc.health.v1.Health"}));
}

TEST_F(ServerProcessTest, SessionLifecycleAndErrorCodes) {
  v1::Session generated;
  ASSERT_TRUE(Create("", &generated).ok());
  EXPECT_TRUE(std::regex_match(generated.session_id(), std::regex("s-[0-9a-f]{24}")));
  EXPECT_GT(generated.created_unix_seconds(), 0);

  v1::Session mine;
  grpc::Status s = Create("client-7", &mine, "You are terse.");
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(mine.session_id(), "client-7");
  EXPECT_EQ(Create("client-7", &mine).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  s = Create("no spaces allowed", &mine);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("session_id"));

  {
    grpc::ClientContext context;
    WithDeadline(&context);
    v1::GetSessionRequest request;
    request.set_session_id("client-7");
    v1::Session got;
    ASSERT_TRUE(sessions_->GetSession(&context, request, &got).ok());
    EXPECT_EQ(got.system_prompt(), "You are terse.");
    EXPECT_EQ(got.turns(), 0u);
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Create("page-" + std::to_string(i), &mine).ok());
  // Paging through 5 sessions two at a time returns them all, in creation order.
  std::vector<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    grpc::ClientContext context;
    WithDeadline(&context);
    v1::ListSessionsRequest request;
    request.set_page_size(2);
    request.set_page_token(token);
    v1::ListSessionsResponse page;
    ASSERT_TRUE(sessions_->ListSessions(&context, request, &page).ok());
    for (const v1::Session& session : page.sessions()) listed.push_back(session.session_id());
    token = page.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(listed, ::testing::ElementsAre(generated.session_id(), "client-7", "page-0", "page-1",
                                             "page-2"));
  {
    grpc::ClientContext context;
    WithDeadline(&context);
    v1::ListSessionsRequest request;
    request.set_page_token("forged");
    v1::ListSessionsResponse page;
    EXPECT_EQ(sessions_->ListSessions(&context, request, &page).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext context;
    WithDeadline(&context);
    v1::DeleteSessionRequest request;
    request.set_session_id("client-7");
    v1::DeleteSessionResponse response;
    EXPECT_EQ(sessions_->DeleteSession(&context, request, &response).error_code(),
              attempt == 0 ? grpc::StatusCode::OK : grpc::StatusCode::NOT_FOUND);
  }
  grpc::ClientContext context;
  WithDeadline(&context);
  v1::GetSessionRequest request;
  request.set_session_id("client-7");
  v1::Session got;
  EXPECT_EQ(sessions_->GetSession(&context, request, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(Metrics(), HasSubstr("kvlingo_sessions_active 4\n"));
}

TEST_F(ServerProcessTest, ChatValidatesThenSaysWhyItCannotAnswer) {
  v1::Session session;
  ASSERT_TRUE(Create("chat-1", &session).ok());
  v1::ChatRequest request;
  request.set_session_id("missing");
  request.set_user_message("hello");
  grpc::Status s = Chat(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("missing"));

  request.set_session_id("chat-1");
  request.clear_user_message();
  s = Chat(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("user_message"));

  request.set_user_message(std::string(65, 'x'));  // the config's limit is 64
  s = Chat(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("server.max_turn_bytes"));

  request.set_user_message("hello");
  request.mutable_sampling()->set_temperature(3);
  s = Chat(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("sampling.temperature"));

  request.clear_sampling();
  int n_messages = -1;
  s = Chat(request, &n_messages);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(s.error_message(), HasSubstr("no models are loaded"));
  EXPECT_EQ(n_messages, 0);
  // Naming a model changes nothing: there is none to resolve it against.
  request.mutable_routing()->set_model("large");
  s = Chat(request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  request.clear_routing();

  grpc::ClientContext context;
  WithDeadline(&context);
  v1::ListModelsResponse models;
  s = models_->ListModels(&context, v1::ListModelsRequest(), &models);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(models.models_size(), 0);

  const std::string metrics = Metrics();
  EXPECT_THAT(
      metrics,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="NOT_FOUND",method="kvlingo.v1.ChatService/Chat"} 1)"));
  EXPECT_THAT(
      metrics,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="INVALID_ARGUMENT",method="kvlingo.v1.ChatService/Chat"} 3)"));
  EXPECT_THAT(
      metrics,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="UNIMPLEMENTED",method="kvlingo.v1.ChatService/Chat"} 2)"));
  EXPECT_THAT(
      metrics,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="OK",method="kvlingo.v1.SessionService/CreateSession"} 1)"));
  EXPECT_THAT(
      metrics,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="OK",method="kvlingo.v1.ModelService/ListModels"} 1)"));
}

TEST_F(ServerProcessTest, InvalidUtf8TurnIsRejectedNamingTheField) {
  v1::Session session;
  ASSERT_TRUE(Create("utf8", &session).ok());
  // Sent as raw bytes: the C++ protobuf runtime would refuse to serialise an
  // invalid proto3 string itself, but other clients can send one.
  grpc::GenericStub stub(server_.channel);
  v1::ChatRequest request;
  request.set_session_id("utf8");
  request.set_user_message("ok");
  std::string bytes = request.SerializeAsString();
  bytes.back() = '\xff';  // "o\xff"
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  grpc::ClientContext context;
  WithDeadline(&context);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, "/kvlingo.v1.ChatService/Chat", &cq);
  int tag = 0;
  void* got = nullptr;
  bool ok = false;
  call->StartCall(&tag);
  cq.Next(&got, &ok);
  call->WriteLast(buffer, grpc::WriteOptions(), &tag);
  cq.Next(&got, &ok);
  grpc::Status status;
  call->Finish(&status, &tag);
  cq.Next(&got, &ok);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("user_message"));
}

// One unary call of `method` with `bytes` as its request message, whatever
// they are.
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::CompletionQueue cq;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  int tag = 0;
  call->Finish(&response, &status, &tag);
  void* got = nullptr;
  bool ok = false;
  cq.Next(&got, &ok);
  return status;
}

// One server-streaming call of `method` with `bytes` as its request message;
// its final status.
grpc::Status RawStreamingCall(const std::shared_ptr<grpc::Channel>& channel,
                              const std::string& method, const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, method, &cq);
  int tag = 0;
  void* got = nullptr;
  bool ok = false;
  call->StartCall(&tag);
  cq.Next(&got, &ok);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  call->WriteLast(buffer, grpc::WriteOptions(), &tag);
  cq.Next(&got, &ok);
  grpc::Status status;
  call->Finish(&status, &tag);
  cq.Next(&got, &ok);
  return status;
}

TEST_F(ServerProcessTest, BytesThatAreNotTheRequestMessageAreInvalidArgumentNamingIt) {
  // Field 1 as a varint, then a length that runs past the end.
  const std::string garbage("\x08\x01\x12\x7f\xff\xff", 6);
  const std::vector<std::pair<std::string, std::string>> unary = {
      {"/kvlingo.v1.SessionService/CreateSession", "kvlingo.v1.CreateSessionRequest"},
      {"/kvlingo.v1.SessionService/GetSession", "kvlingo.v1.GetSessionRequest"},
      {"/kvlingo.v1.SessionService/ListSessions", "kvlingo.v1.ListSessionsRequest"},
      {"/kvlingo.v1.SessionService/DeleteSession", "kvlingo.v1.DeleteSessionRequest"},
      {"/kvlingo.v1.SessionService/GetTranscript", "kvlingo.v1.GetTranscriptRequest"},
      {"/kvlingo.v1.SessionService/ImportSession", "kvlingo.v1.ImportSessionRequest"},
      {"/kvlingo.v1.ModelService/ListModels", "kvlingo.v1.ListModelsRequest"},
      {"/kvlingo.v1.ModelService/ListTranslators", "kvlingo.v1.ListTranslatorsRequest"},
  };
  for (const auto& [method, type] : unary) {
    const grpc::Status status = RawUnaryCall(server_.channel, method, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(), HasSubstr(type)) << method;
  }
  const grpc::Status chat =
      RawStreamingCall(server_.channel, "/kvlingo.v1.ChatService/Chat", garbage);
  EXPECT_EQ(chat.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(chat.error_message(), HasSubstr("kvlingo.v1.ChatRequest"));
  // Well-formed calls still work, raw or not.
  v1::Session session;
  EXPECT_TRUE(Create("after-garbage", &session).ok());
  EXPECT_EQ(session.session_id(), "after-garbage");
}

TEST_F(ServerProcessTest, InvalidUtf8InStringFieldsLogsABoundedNumberOfLines) {
  // CreateSessionRequest.session_id (field 1, a proto3 string) = "\xff": the
  // parser refuses it and libprotobuf logs one line per call; the server
  // routes those through its log, rate-limited (server/protobuf_log.h).
  const std::string bad("\x0a\x01\xff", 3);
  constexpr int kCalls = 300;
  for (int i = 0; i < kCalls; ++i) {
    const grpc::Status status =
        RawUnaryCall(server_.channel, "/kvlingo.v1.SessionService/CreateSession", bad);
    ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // The calls are answered after the parser logged: the lines are written.
  ASSERT_TRUE(server_.process->WaitForLine(testing::Stream::kStderr, "protobuf:", 10s).ok())
      << server_.process->Describe();
  const std::string err = server_.process->stderr_text();
  int64_t lines = 0, protobuf_lines = 0;
  for (size_t at = 0; (at = err.find("UTF-8", at)) != std::string::npos; ++at) ++lines;
  for (size_t at = 0; (at = err.find("protobuf:", at)) != std::string::npos; ++at) ++protobuf_lines;
  EXPECT_LE(lines, 10) << "of " << kCalls << " calls";
  EXPECT_EQ(lines, protobuf_lines) << "every parser line goes through the server's log";
}

TEST_F(ServerProcessTest, MetricsEndpointPassesPromtool) {
  if (std::string(KVL_PROMTOOL).empty()) GTEST_FAIL() << "promtool not found at configure time (scripts/setup.sh installs it)";
  v1::Session session;
  ASSERT_TRUE(Create("", &session).ok());
  const std::string text = Metrics();
  EXPECT_THAT(text, HasSubstr("kvlingo_up 1\n"));
  EXPECT_THAT(text, HasSubstr("kvlingo_build_info{version=\""));
  EXPECT_THAT(text, HasSubstr("kvlingo_sessions_active 1\n"));
  const std::string file = dir_.WriteFile("metrics.txt", text);
  absl::StatusOr<testing::RunResult> run = testing::RunProcess(
      {"/bin/sh", "-c", std::string(KVL_PROMTOOL) + " check metrics < " + file}, 30s);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
}

TEST_F(ServerProcessTest, PythonClientWithGrpcioAndProtocMessages) {
  const std::string python = KVL_SYSTEM_PYTHON;
  if (python.empty()) GTEST_FAIL() << "no system python3 (scripts/setup.sh installs it)";
  absl::StatusOr<testing::RunResult> has_grpc =
      testing::RunProcess({python, "-c", "import grpc"}, 30s);
  if (!has_grpc.ok() || has_grpc->exit_code != 0) GTEST_FAIL() << "python3-grpcio is not installed (scripts/setup.sh installs it)";
  const std::string stubs = dir_.MakeDir("py");
  const std::string proto_root = std::string(KVL_SOURCE_DIR) + "/proto";
  absl::StatusOr<testing::RunResult> protoc = testing::RunProcess(
      {"protoc", "--proto_path=" + proto_root, "--python_out=" + stubs,
       proto_root + "/kvlingo/v1/chat.proto", proto_root + "/kvlingo/v1/session.proto",
       proto_root + "/kvlingo/v1/model.proto"},
      60s);
  ASSERT_TRUE(protoc.ok()) << protoc.status();
  ASSERT_EQ(protoc->exit_code, 0) << protoc->err;
  absl::StatusOr<testing::RunResult> run =
      testing::RunProcess({python, std::string(KVL_SOURCE_DIR) + "/tests/server/python_client.py",
                           server_.grpc_address, stubs},
                          60s);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->out << run->err;
  const nlohmann::json seen = nlohmann::json::parse(run->out);
  EXPECT_EQ(seen["created_id"], "py-1");
  EXPECT_EQ(seen["fetched_prompt"], "Be brief.");
  EXPECT_EQ(seen["duplicate"], "ALREADY_EXISTS");
  EXPECT_EQ(seen["chat"][0], "UNIMPLEMENTED");
  EXPECT_THAT(seen["chat"][1].get<std::string>(), HasSubstr("no models are loaded"));
  EXPECT_EQ(seen["list_models"], "OK");
}

TEST(ServerLifecycleTest, SigtermAndSigintExitZeroWithinSeconds) {
  for (int signal : {SIGTERM, SIGINT}) {
    testing::TempDir dir("lifecycle");
    absl::StatusOr<RunningServer> server = StartServer(dir, "{}");
    ASSERT_TRUE(server.ok()) << server.status();
    ASSERT_TRUE(testing::CheckHealth(server->channel, "").ok());
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(server->process->Signal(signal).ok());
    absl::StatusOr<int> code = server->process->Wait(5s);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << server->process->Describe();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    EXPECT_THAT(server->process->stderr_text(), HasSubstr("draining"));
  }
}

TEST(ServerLifecycleTest, AnAddressInUseFailsToStartWithExitCode1) {
  testing::TempDir dir("lifecycle");
  absl::StatusOr<RunningServer> first = StartServer(dir, "{}");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<testing::RunResult> second =
      testing::RunProcess({KVL_SERVER_BIN, "--config", dir.Path("server.json"), "--listen",
                           first->grpc_address, "--metrics-address", "127.0.0.1:0"},
                          20s);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->exit_code, 1);
  EXPECT_THAT(second->err, HasSubstr("cannot listen on " + first->grpc_address));
}

struct BadConfigCase {
  const char* name;
  std::string config;  // file contents; empty: no file at all
  std::vector<std::string> extra_args;
  std::string expected_message;
};

class BadConfigTest : public ::testing::TestWithParam<BadConfigCase> {};

TEST_P(BadConfigTest, ExitsWithCode2AndNamesTheProblem) {
  const BadConfigCase& c = GetParam();
  testing::TempDir dir("badconfig");
  const std::string path =
      c.config.empty() ? dir.Path("absent.json") : dir.WriteFile("server.json", c.config);
  std::vector<std::string> argv = {KVL_SERVER_BIN, "--config",          path,         "--listen",
                                   "127.0.0.1:0",  "--metrics-address", "127.0.0.1:0"};
  argv.insert(argv.end(), c.extra_args.begin(), c.extra_args.end());
  absl::StatusOr<testing::RunResult> run = testing::RunProcess(argv, 20s);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 2) << run->out << run->err;
  EXPECT_THAT(run->err, HasSubstr(c.expected_message));
  EXPECT_EQ(run->out, "");  // never got as far as listening
  // One message, on one line.
  EXPECT_EQ(std::count(run->err.begin(), run->err.end(), '\n'), 1) << run->err;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadConfigTest,
    ::testing::Values(
        BadConfigCase{"UnknownKey",
                      R"({"server": {"listen_adress": "127.0.0.1:1"}})",
                      {},
                      "kvl-server: config: server.listen_adress: unknown key"},
        BadConfigCase{"BadValue",
                      R"({"log": {"level": "loud"}})",
                      {},
                      "kvl-server: config: log.level: expected one of trace, debug, info, warn, "
                      "error, got 'loud'"},
        BadConfigCase{"MissingFile", "", {}, "kvl-server: config: cannot read '"},
        BadConfigCase{
            "ModelPathMissing",
            R"({"models": [{"name": "m", "path": "/nonexistent/kvlingo-model"}],
                          "routing": {"default_model": "m"}})",
            {},
            "kvl-server: config: models[0].path: '/nonexistent/kvlingo-model' is not a directory"},
        BadConfigCase{"SyntaxError", "{\"server\": {", {}, "kvl-server: config: invalid JSON"},
        BadConfigCase{"UnknownDevice",
                      R"({"runtime": {"device": "tpu"}})",
                      {},
                      "kvl-server: config: runtime.device: unknown device 'tpu'; expected cpu, "
                      "cuda or cuda:N"},
        // Debian's LibTorch is CPU-only: a CUDA device stops the start, before
        // any model loads, saying why and what to do.
        BadConfigCase{"CudaDeviceOnACpuOnlyBuild",
                      std::string(R"({"runtime": {"device": "cuda:0"},
                          "models": [{"name": "m", "path": ")") +
                          KVL_SOURCE_DIR + R"(/models/kvl-small"}],
                          "routing": {"default_model": "m"}})",
                      {},
                      "kvl-server: config: runtime.device cuda:0: this binary's LibTorch has no "
                      "CUDA (a CPU-only build, such as Debian's); build against a CUDA LibTorch"},
        BadConfigCase{"BadListenFlag",
                      "{}",
                      {"--listen", "nowhere"},
                      "kvl-server: --listen: expected host:port, got 'nowhere'"},
        BadConfigCase{"BadDeviceFlag",
                      "{}",
                      {"--device", "gpu"},
                      "kvl-server: --device: unknown device 'gpu'; expected cpu, cuda or cuda:N"},
        BadConfigCase{"BadLogLevelFlag",
                      "{}",
                      {"--log-level", "chatty"},
                      "kvl-server: --log-level: expected one of"}),
    [](const ::testing::TestParamInfo<BadConfigCase>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace kvl
