// TLS on the gRPC port (server.tls): a TLS server answers clients that trust
// its CA and refuses plaintext and clients that trust another CA; with
// client_ca_file it also refuses clients without a certificate or with one
// another CA signed (mTLS). Certificates are made by the openssl command line
// for each run; the server runs without models (sessions only), which is
// enough for the transport. With tls.metrics, GET /metrics is HTTPS too
// (read with cpp-httplib's TLS client).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/files.h"
#include "kvlingo/v1/session.grpc.pb.h"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Json = nlohmann::json;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A TLS client that the server refuses writes to a closed socket: an
    // error to handle, not a signal that ends the test (kvl-server ignores
    // SIGPIPE the same way).
    signal(SIGPIPE, SIG_IGN);
    dir_ = new testing::TempDir("tls");
    dir_->WriteFile("san.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    // Two CAs: "ca" signs the server's and the good client's certificates,
    // "rogue" signs a client certificate the server must not accept.
    for (const char* ca : {"ca", "rogue"}) {
      Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
               "-nodes", "-keyout", Path(std::string(ca) + ".key"), "-out",
               Path(std::string(ca) + ".pem"), "-days", "2", "-subj",
               std::string("/CN=kvl-test-") + ca});
    }
    Sign("server", "ca", "localhost");
    Sign("client", "ca", "kvl-client");
    Sign("rogue-client", "rogue", "kvl-client");
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string Path(const std::string& name) { return dir_->path() + "/" + name; }

  static void Openssl(std::vector<std::string> args) {
    args.insert(args.begin(), "openssl");
    auto run = testing::RunProcess(args, 60s, {dir_->path(), {}});
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->exit_code, 0) << run->err;
  }

  // name.key / name.pem, signed by `ca`.
  static void Sign(const std::string& name, const std::string& ca, const std::string& cn) {
    Openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", Path(name + ".key"), "-out", Path(name + ".csr"), "-subj", "/CN=" + cn});
    Openssl({"x509", "-req", "-in", Path(name + ".csr"), "-CA", Path(ca + ".pem"), "-CAkey",
             Path(ca + ".key"), "-CAcreateserial", "-out", Path(name + ".pem"), "-days", "2",
             "-extfile", Path("san.ext")});
  }

  static std::string Read(const std::string& name) { return *ReadTextFile(Path(name)); }

  struct Running {
    std::unique_ptr<testing::Subprocess> process;
    std::string address;
    int metrics_port = 0;
    int http_port = 0;  // the OpenAI API's, when started with it
  };

  // With `api`, the OpenAI API too, on kvl-small (an API needs a model).
  static Running Start(const Json& tls, bool api = false) {
    Json config = {{"server", {{"tls", tls}}}, {"models", Json::array()}};
    if (api) {
      config["server"]["http_address"] = "127.0.0.1:0";
      config["models"] = {
          {{"name", "kvl-small"}, {"path", std::string(KVL_SOURCE_DIR) + "/models/kvl-small"}}};
      config["routing"] = {{"default_model", "kvl-small"}};
    }
    const std::string file =
        dir_->WriteFile("server-" + std::to_string(++n_) + ".json", config.dump());
    auto port = testing::FindFreeLoopbackPort();
    EXPECT_TRUE(port.ok());
    Running r;
    r.address = "127.0.0.1:" + std::to_string(*port);
    auto process = testing::Subprocess::Start({KVL_SERVER_BIN, "--config", file, "--listen",
                                               r.address, "--metrics-address", "127.0.0.1:0"});
    EXPECT_TRUE(process.ok()) << process.status();
    auto line = (*process)->WaitForLine(testing::Stream::kStdout, "listening on", 30s);
    EXPECT_TRUE(line.ok()) << line.status();
    if (line.ok()) r.metrics_port = std::stoi(line->substr(line->rfind(':') + 1));
    if (api) {
      const std::string out = (*process)->stdout_text();
      const size_t at = out.find("OpenAI API on 127.0.0.1:");
      EXPECT_NE(at, std::string::npos) << out;
      if (at != std::string::npos) {
        r.http_port = std::stoi(out.substr(at + std::string("OpenAI API on 127.0.0.1:").size()));
      }
    }
    r.process = *std::move(process);
    return r;
  }

  // GET /metrics over HTTPS, trusting `ca`'s certificates, presenting
  // `client`'s certificate when given; the HTTP status, or -1 when the
  // connection or the handshake failed. *body gets the response's body.
  static int MetricsOverTls(const Running& r, const std::string& ca, const std::string& client = "",
                            std::string* body = nullptr) {
    std::unique_ptr<httplib::SSLClient> c =
        client.empty()
            ? std::make_unique<httplib::SSLClient>("127.0.0.1", r.metrics_port)
            : std::make_unique<httplib::SSLClient>("127.0.0.1", r.metrics_port,
                                                   Path(client + ".pem"), Path(client + ".key"));
    c->set_ca_cert_path(Path(ca + ".pem").c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(5);
    c->set_read_timeout(5);
    httplib::Result res = c->Get("/metrics");
    if (!res) return -1;
    if (body != nullptr) *body = res->body;
    return res->status;
  }

  // A channel of its own (no connection shared with other channels), so that
  // its first call makes a new TLS handshake.
  static std::shared_ptr<grpc::Channel> Channel(
      const Running& r, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(r.address, credentials, args);
  }

  // CreateSession on `channel`; its status.
  static grpc::Status CallOn(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    kvlingo::v1::CreateSessionRequest req;
    kvlingo::v1::Session out;
    return kvlingo::v1::SessionService::NewStub(channel)->CreateSession(&ctx, req, &out);
  }

  // CreateSession over a new connection with `credentials`; its status.
  static grpc::Status Call(const Running& r,
                           const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    return CallOn(Channel(r, credentials));
  }

  // Replaces `to` by `from` the way an operator rotating a certificate should:
  // a copy next to it, renamed over it.
  static void Replace(const std::string& from, const std::string& to) {
    dir_->WriteFile(to + ".tmp", Read(from));
    ASSERT_EQ(std::rename(Path(to + ".tmp").c_str(), Path(to).c_str()), 0);
  }

  static std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca,
                                                       const std::string& client = "") {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read(ca + ".pem");
    if (!client.empty()) {
      o.pem_cert_chain = Read(client + ".pem");
      o.pem_private_key = Read(client + ".key");
    }
    return grpc::SslCredentials(o);
  }

  static testing::TempDir* dir_;
  static int n_;
};
testing::TempDir* TlsTest::dir_ = nullptr;
int TlsTest::n_ = 0;

TEST_F(TlsTest, ATlsServerAnswersTlsClientsAndRefusesPlaintextAndStrangers) {
  Running server = Start({{"cert_file", "server.pem"}, {"key_file", "server.key"}});
  EXPECT_TRUE(Call(server, Tls("ca")).ok());
  const grpc::Status plain = Call(server, grpc::InsecureChannelCredentials());
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  // A client that trusts another CA does not accept the server.
  EXPECT_EQ(Call(server, Tls("rogue")).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MutualTlsRefusesClientsWithoutACertificateOrWithAStrangersOne) {
  Running server = Start(
      {{"cert_file", "server.pem"}, {"key_file", "server.key"}, {"client_ca_file", "ca.pem"}});
  EXPECT_TRUE(Call(server, Tls("ca", "client")).ok());
  EXPECT_EQ(Call(server, Tls("ca")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(server, Tls("ca", "rogue-client")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(server, grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MetricsOverHttpsWithTheSameCertificateAndPlainHttpRefused) {
  Running server =
      Start({{"cert_file", "server.pem"}, {"key_file", "server.key"}, {"metrics", true}});
  std::string body;
  EXPECT_EQ(MetricsOverTls(server, "ca", "", &body), 200);
  EXPECT_THAT(body, HasSubstr("kvlingo_up 1"));
  // Plain HTTP gets no exposition, and a client trusting another CA refuses
  // the server's certificate.
  absl::StatusOr<testing::HttpResponse> plain =
      testing::HttpGet("127.0.0.1", server.metrics_port, "/metrics", 5s);
  EXPECT_TRUE(!plain.ok() || plain->status != 200);
  EXPECT_EQ(MetricsOverTls(server, "rogue"), -1);
  // The gRPC port is TLS as before.
  EXPECT_TRUE(Call(server, Tls("ca")).ok());
}

// The OpenAI API serves HTTPS with server.tls's files, to clients trusting
// its CA; plain HTTP and a stranger's trust get nothing.
TEST_F(TlsTest, TheOpenAiApiIsHttpsWithTheSameCertificate) {
  Running server = Start({{"cert_file", "server.pem"}, {"key_file", "server.key"}}, true);
  ASSERT_GT(server.http_port, 0);
  auto models = [&](const std::string& ca) {
    httplib::SSLClient c("127.0.0.1", server.http_port);
    c.set_ca_cert_path(Path(ca + ".pem").c_str());
    c.enable_server_certificate_verification(true);
    c.set_connection_timeout(5);
    c.set_read_timeout(5);
    httplib::Result res = c.Get("/v1/models");
    return res ? res->status : -1;
  };
  EXPECT_EQ(models("ca"), 200);
  EXPECT_EQ(models("rogue"), -1);
  absl::StatusOr<testing::HttpResponse> plain =
      testing::HttpGet("127.0.0.1", server.http_port, "/v1/models", 5s);
  EXPECT_TRUE(!plain.ok() || plain->status != 200);
}

TEST_F(TlsTest, MetricsWithAClientCaServesOnlyClientsWithItsCertificates) {
  Running server = Start({{"cert_file", "server.pem"},
                          {"key_file", "server.key"},
                          {"client_ca_file", "ca.pem"},
                          {"metrics", true}});
  EXPECT_EQ(MetricsOverTls(server, "ca", "client"), 200);
  EXPECT_EQ(MetricsOverTls(server, "ca"), -1);
  EXPECT_EQ(MetricsOverTls(server, "ca", "rogue-client"), -1);
}

TEST_F(TlsTest, WithoutTheMetricsSwitchMetricsStayPlainHttp) {
  Running server = Start({{"cert_file", "server.pem"}, {"key_file", "server.key"}});
  absl::StatusOr<testing::HttpResponse> plain =
      testing::HttpGet("127.0.0.1", server.metrics_port, "/metrics", 5s);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->status, 200);
}

// Certificate rotation without a restart: the server re-reads its files every
// reload_interval_seconds; a new certificate (here from another CA) serves the
// handshakes after that, while a connection opened before keeps working.
TEST_F(TlsTest, ARotatedCertificateServesNewHandshakesAndOpenConnectionsStay) {
  Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", Path("ca2.key"), "-out", Path("ca2.pem"), "-days", "2", "-subj",
           "/CN=kvl-test-ca2"});
  Sign("server2", "ca2", "localhost");
  Replace("server.pem", "live.pem");
  Replace("server.key", "live.key");
  Running server =
      Start({{"cert_file", "live.pem"}, {"key_file", "live.key"}, {"reload_interval_seconds", 1}});
  const std::shared_ptr<grpc::Channel> before = Channel(server, Tls("ca"));
  ASSERT_TRUE(CallOn(before).ok());
  EXPECT_EQ(Call(server, Tls("ca2")).error_code(), grpc::StatusCode::UNAVAILABLE);

  Replace("server2.key", "live.key");
  Replace("server2.pem", "live.pem");
  // The watcher runs every second; give a loaded machine ample time.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  grpc::Status rotated;
  while (!(rotated = Call(server, Tls("ca2"))).ok() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(rotated.ok()) << "the new certificate was not served within 30 s: "
                            << rotated.error_message();
  EXPECT_EQ(Call(server, Tls("ca")).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "new handshakes still get the old certificate";
  // The connection made before the rotation is still up and answering.
  EXPECT_TRUE(CallOn(before).ok());
  EXPECT_EQ(before->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_READY);
}

// Readable files that are not usable PEM stop the start too, naming the key
// (gRPC's certificate watcher would start and fail every handshake).
TEST_F(TlsTest, AGarbageCertificateOrAStrangersKeyStopsTheStart) {
  dir_->WriteFile("garbage.pem", "not a certificate\n");
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"cert_file", "garbage.pem"}, {"key_file", "server.key"}},
       "server.tls.cert_file: " + Path("garbage.pem") + " holds no PEM certificate"},
      {{{"cert_file", "server.pem"}, {"key_file", "garbage.pem"}},
       "server.tls.key_file: " + Path("garbage.pem") + " holds no PEM private key"},
      {{{"cert_file", "server.pem"}, {"key_file", "client.key"}},
       "server.tls.key_file: " + Path("client.key") + " is not the private key of the certificate"},
      {{{"cert_file", "server.pem"}, {"key_file", "server.key"}, {"client_ca_file", "garbage.pem"}},
       "server.tls.client_ca_file: " + Path("garbage.pem") + " holds no PEM certificate"},
  };
  for (const auto& [plain_tls, message] : cases) {
    for (bool metrics : {false, true}) {  // /metrics on TLS too: the same message
      Json tls = plain_tls;
      if (metrics) tls["metrics"] = true;
      const Json config = {{"server", {{"tls", tls}}}, {"models", Json::array()}};
      const std::string file =
          dir_->WriteFile("bad-pem-" + std::to_string(++n_) + ".json", config.dump());
      auto run = testing::RunProcess({KVL_SERVER_BIN, "--config", file, "--listen", "127.0.0.1:0",
                                      "--metrics-address", "127.0.0.1:0"},
                                     30s);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_NE(run->exit_code, 0) << message;
      EXPECT_THAT(run->err, HasSubstr(message)) << (metrics ? "with tls.metrics" : "");
    }
  }
}

TEST_F(TlsTest, AMissingKeyFileStopsTheStartNamingTheKey) {
  const Json config = {
      {"server", {{"tls", {{"cert_file", "server.pem"}, {"key_file", "nope.key"}}}}},
      {"models", Json::array()}};
  const std::string file = dir_->WriteFile("missing.json", config.dump());
  auto run = testing::RunProcess({KVL_SERVER_BIN, "--config", file, "--listen", "127.0.0.1:0",
                                  "--metrics-address", "127.0.0.1:0"},
                                 30s);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(run->exit_code, 0);
  EXPECT_THAT(run->err, HasSubstr("server.tls.key_file"));
  // Half a pair is a config error.
  const Json half = {{"server", {{"tls", {{"cert_file", "server.pem"}}}}},
                     {"models", Json::array()}};
  auto bad = testing::RunProcess(
      {KVL_SERVER_BIN, "--config", dir_->WriteFile("half.json", half.dump())}, 30s);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->exit_code, 2);
  EXPECT_THAT(bad->err, HasSubstr("server.tls"));
}

}  // namespace
}  // namespace kvl
