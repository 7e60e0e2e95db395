#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/notification.h"
#include "base/status_macros.h"
#include "model/engine.h"
#include "spdlog/spdlog.h"

#ifndef KVL_VERSION
#error "KVL_VERSION must be defined by the build"
#endif

namespace kvl::server {
namespace {

// The TLS files as PEM: a certificate (chain), a private key that matches it,
// and a CA certificate when one is set. gRPC's file watcher would start the
// server with unusable files and fail every handshake; this stops the start
// instead (FailedPrecondition naming the key).
absl::Status CheckTlsFiles(const TlsSection& tls, const std::string& cert_pem,
                           const std::string& key_pem, const std::string& ca_pem) {
  using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
  auto bio = [](const std::string& text) {
    return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), &BIO_free);
  };
  auto bad = [](const char* key, const std::string& file, const char* what) {
    ERR_clear_error();
    return absl::FailedPreconditionError(
        absl::StrCat("config: server.tls.", key, ": ", file, " ", what));
  };
  Bio cert_bio = bio(cert_pem);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (!cert) return bad("cert_file", tls.cert_file, "holds no PEM certificate");
  Bio key_bio = bio(key_pem);
  // No passphrase: OpenSSL's default callback would prompt on the terminal.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr), &EVP_PKEY_free);
  if (!key) return bad("key_file", tls.key_file, "holds no PEM private key (or one with a passphrase)");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return bad("key_file", tls.key_file,
               ("is not the private key of the certificate in " + tls.cert_file).c_str());
  }
  if (!tls.client_ca_file.empty()) {
    Bio ca_bio = bio(ca_pem);
    std::unique_ptr<X509, decltype(&X509_free)> ca(
        PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr), &X509_free);
    if (!ca) return bad("client_ca_file", tls.client_ca_file, "holds no PEM certificate");
  }
  return absl::OkStatus();
}

// The gRPC port's credentials: plaintext, TLS, or TLS requiring a client
// certificate signed by tls.client_ca_file. FailedPrecondition naming the key
// when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsSection& tls) {
  if (!tls.enabled()) {
    spdlog::warn("TLS is off: the gRPC port serves plaintext (set server.tls)");
    return grpc::InsecureServerCredentials();
  }
  auto read = [](const std::string& file, const char* key) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> text = ReadTextFile(file);
    if (!text.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("config: server.tls.", key, ": cannot read ", file, ": ",
                       text.status().message()));
    }
    return text;
  };
  absl::StatusOr<std::string> cert = read(tls.cert_file, "cert_file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = read(tls.key_file, "key_file");
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> ca = std::string();
  if (!tls.client_ca_file.empty()) {
    ca = read(tls.client_ca_file, "client_ca_file");
    if (!ca.ok()) return ca.status();
  }
  KVL_RETURN_IF_ERROR(CheckTlsFiles(tls, *cert, *key, *ca));
  // The files are valid now; gRPC's file watcher reads them again every
  // reload_interval_seconds and swaps in a changed certificate, key or CA for
  // the handshakes after it, without touching open connections (a rotated
  // certificate needs no restart; gRPC's C++ API offers no call to swap a
  // running server's credentials on a signal). Replace the files by rename,
  // so that no read sees half of a new file.
  const auto interval = static_cast<unsigned int>(tls.reload_interval_seconds);
  auto provider =
      tls.client_ca_file.empty()
          ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                tls.key_file, tls.cert_file, interval)
          : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                tls.key_file, tls.cert_file, tls.client_ca_file, interval);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  spdlog::info("TLS on the gRPC port ({}, re-read every {} s){}", tls.cert_file, interval,
               tls.client_ca_file.empty() ? "" : "; clients need a certificate signed by " +
                                                     tls.client_ca_file);
  return grpc::experimental::TlsServerCredentials(options);
}

constexpr const char* kServiceNames[] = {
    "kvlingo.v1.ChatService",
    "kvlingo.v1.SessionService",
    "kvlingo.v1.ModelService",
};

// Session calls wait on the session store one round trip at a time; four
// keep a slow Redis from serialising them without holding many threads.
constexpr int kSessionPoolThreads = 4;

// Head-room over the largest allowed turn for the rest of a ChatRequest.
constexpr int64_t kRequestOverheadBytes = 1 << 20;
// Head-room over twice server.max_metadata_bytes for gRPC's own headers.
constexpr int64_t kTransportMetadataSlackBytes = 4096;

// Removes the reflection plugin from one server's builder.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    const std::string reflection = grpc::reflection::ProtoServerReflectionPlugin().name();
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [&](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == reflection;
                                  }),
                   plugins->end());
  }
};

}  // namespace

const char* Version() { return KVL_VERSION; }

static std::vector<std::string> ModelNames(const ServerConfig& config) {
  std::vector<std::string> names;
  for (const ModelEntry& m : config.models) names.push_back(m.name);
  return names;
}

Server::Server(const ServerConfig& config)
    : config_(config), metrics_(Version(), ModelNames(config)) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerConfig& config) {
  absl::StatusOr<std::unique_ptr<Server>> server = Load(config);
  if (!server.ok()) return server.status();
  KVL_RETURN_IF_ERROR((*server)->Serve());
  return server;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Load(const ServerConfig& config) {
  std::unique_ptr<Server> self(new Server(config));
  absl::StatusOr<std::unique_ptr<ModelRuntime>> runtime = LoadModelRuntime(config, &self->metrics_);
  if (!runtime.ok()) return runtime.status();
  self->runtime_ = *std::move(runtime);
  return self;
}

absl::Status Server::Serve() {
  Server* self = this;
  const ServerConfig& config = config_;
  metrics_.SetCacheStats(runtime_->sessions->CacheStats());
  if (absl::Status reach = runtime_->sessions->PingStore(); reach.ok()) {
    spdlog::info("session store: {}", runtime_->sessions->DescribeStore());
  } else {
    spdlog::warn("session store: {} cannot be reached now ({}); session calls fail with "
                 "UNAVAILABLE until it can",
                 runtime_->sessions->DescribeStore(), std::string(reach.message()));
  }
  session_pool_ = std::make_unique<TurnPool>(kSessionPoolThreads);
  if (runtime_->router != nullptr) {
    // Turns block their thread on a model's engine; a few per model keep every
    // engine busy while others wait for theirs, and with batching as many more
    // as one model batches. Each thread does LibTorch's per-thread set-up
    // before the server takes requests.
    const int n_models = static_cast<int>(config.models.size());
    const router::BatchingConfig& batching = config.router.batching;
    const int n_threads =
        4 * n_models + (batching.enabled ? static_cast<int>(batching.max_running) : 0);
    turn_pool_ = std::make_unique<TurnPool>(std::max(4, n_threads), PrepareIntraOpThread);
  }
  auth_ = std::make_unique<Authenticator>(config.auth);
  if (auth_->enabled()) {
    std::set<std::string> tenants;
    for (const ApiKeyEntry& key : config.auth.keys) tenants.insert(key.tenant);
    spdlog::info("authentication on: {} API key(s) of {} tenant(s); each tenant sees only its "
                 "own sessions",
                 config.auth.keys.size(), tenants.size());
  } else {
    spdlog::warn("authentication is off: no auth.keys are configured, so any client that can "
                 "reach the port can use every session (server/README.md, \"auth\")");
  }
  ServiceDeps deps;
  deps.auth = auth_.get();
  deps.sessions = runtime_->sessions.get();
  deps.metrics = &self->metrics_;
  deps.chat_gate = &self->chat_gate_;
  deps.max_concurrent_streams = config.limits.max_concurrent_streams;
  deps.max_metadata_bytes = config.server.max_metadata_bytes;
  deps.limits.max_turn_bytes = config.server.max_turn_bytes;
  deps.limits.max_system_prompt_bytes = config.server.max_system_prompt_bytes;
  deps.limits.max_import_bytes = config.server.max_import_bytes;
  deps.limits.max_new_tokens_limit = config.server.max_new_tokens_limit;
  deps.router = runtime_->router.get();
  deps.pool = turn_pool_.get();
  deps.session_pool = session_pool_.get();
  self->session_service_ = std::make_unique<SessionServiceImpl>(deps);
  self->chat_service_ = std::make_unique<ChatServiceImpl>(deps);
  self->model_service_ = std::make_unique<ModelServiceImpl>(deps);

  // The TLS files are checked (each problem named) before /metrics, which
  // may serve them too, starts.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFor(config.server.tls);
  if (!credentials.ok()) return credentials.status();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
      config.server.metrics_address, [self] {
        self->metrics_.SetCacheStats(self->runtime_->sessions->CacheStats());
        return self->metrics_.RenderText();
      },
      config.server.tls.metrics ? &config.server.tls : nullptr);
  if (!http.ok()) return http.status();
  self->metrics_http_ = *std::move(http);
  if (config.server.tls.metrics) {
    spdlog::info("GET /metrics is served over HTTPS{} (server.tls.metrics)",
                 config.server.tls.client_ca_file.empty() ? "" : ", to clients with a certificate");
  } else if (config.server.tls.enabled()) {
    spdlog::info("GET /metrics is served over plain HTTP (set server.tls.metrics for HTTPS)");
  }

  if (config.server.http_address) {
    if (self->runtime_->router == nullptr) {
      return absl::InvalidArgumentError(
          "server.http_address: the OpenAI API needs models to serve (config 'models' is empty)");
    }
    OpenAiOptions options;
    options.router_model = config.server.http_router_model;
    options.max_conversations = config.server.http_max_conversations;
    absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> api = OpenAiHttpServer::Start(
        *config.server.http_address,
        config.server.tls.enabled() ? &config.server.tls : nullptr, deps, std::move(options));
    if (!api.ok()) return api.status();
    self->openai_http_ = *std::move(api);
    spdlog::info("serving the OpenAI API on {}{}", self->openai_http_->address().ToString(),
                 config.server.tls.enabled() ? " (HTTPS)" : "");
  }

  // Both must be called before the builder is created. Reflection is a
  // process-wide plugin (linking it registers it, too); a server without it
  // drops it from its own builder.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!config.server.reflection) {
    builder.SetOption(std::make_unique<WithoutReflection>());
    spdlog::info("gRPC reflection is off (server.reflection)");
  }
  // gRPC sets SO_REUSEPORT by default, which would let a second server bind an
  // address already in use without an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // gRPC's own limit on a call's headers sits above server.max_metadata_bytes
  // (with room for its own headers), so that a call over ours reaches the
  // service and is told which limit it broke; one far over it is refused by
  // the transport (RESOURCE_EXHAUSTED) before it is read.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_METADATA_SIZE,
      static_cast<int>(2 * config.server.max_metadata_bytes + kTransportMetadataSlackBytes));
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(
      std::max(config.server.max_turn_bytes, config.server.max_import_bytes) +
          kRequestOverheadBytes,
      INT32_MAX)));
  int port = 0;
  const std::string listen = config.server.listen_address.ToString();
  builder.AddListeningPort(listen, *credentials, &port);
  builder.RegisterService(self->session_service_.get());
  builder.RegisterService(self->chat_service_.get());
  builder.RegisterService(self->model_service_.get());
  self->grpc_server_ = builder.BuildAndStart();
  if (self->grpc_server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " (address in use?)"));
  }
  self->listen_address_ = HostPort{config.server.listen_address.host, port};

  grpc::HealthCheckServiceInterface* health = self->grpc_server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  for (const char* name : kServiceNames) health->SetServingStatus(name, true);
  self->metrics_.SetUp(true);

  if (config.sessions.idle_timeout_seconds > 0) {
    self->sweeper_ = std::thread([self] { self->SweepIdleSessions(); });
  }
  self->heartbeat_ = std::thread([self] { self->KeepCallbackThreadsPolling(); });
  return absl::OkStatus();
}

// gRPC 1.51 runs the callback API's completions (every reactor's OnWriteDone,
// among others) on two "nexting" threads that wait for events with a 1 s
// timeout and, when it expires, sleep 100 ms before waiting again
// (src/cpp/common/completion_queue_cc.cc, CallbackAlternativeCQ). A turn's
// first write after a second or more without any event, such as the routing
// decision after a long re-prefill, could complete up to 100 ms late, and the
// tokens queued behind it with it (docs/server-bench.md, "The 1.1 s window").
// A health check over the in-process channel every kHeartbeat gives those
// threads events more often than their timeout, so they never reach the sleep.
void Server::KeepCallbackThreadsPolling() {
  constexpr std::chrono::milliseconds kHeartbeat(250);
  std::shared_ptr<grpc::Channel> channel = grpc_server_->InProcessChannel(grpc::ChannelArguments());
  grpc::GenericStub stub(channel);
  grpc::Slice empty;  // HealthCheckRequest{} is empty on the wire
  const grpc::ByteBuffer request(&empty, 1);
  std::unique_lock<std::mutex> lock(sweeper_mu_);
  while (!stop_.wait_for(lock, kHeartbeat, [this] { return stopping_; })) {
    lock.unlock();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::ByteBuffer response;
    Notification done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&done](const grpc::Status&) { done.Notify(); });
    done.WaitForNotification();
    lock.lock();
  }
}

Server::~Server() { Shutdown(); }

void Server::SweepIdleSessions() {
  const int64_t idle = config_.sessions.idle_timeout_seconds;
  // Expiry is late by at most a tenth of the timeout (bounded to [1 s, 60 s]).
  const std::chrono::seconds period(std::clamp<int64_t>(idle / 10, 1, 60));
  std::unique_lock<std::mutex> lock(sweeper_mu_);
  while (!stop_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    std::vector<std::string> removed = runtime_->sessions->RemoveIdle(idle);
    if (!removed.empty()) {
      metrics_.SetCacheStats(runtime_->sessions->CacheStats());
      spdlog::info("expired {} idle session(s)", removed.size());
    }
    lock.lock();
  }
}

int64_t Server::Shutdown() {
  if (shut_down_) return 0;
  shut_down_ = true;
  chat_gate_.BeginDrain();
  metrics_.SetUp(false);
  if (grpc_server_ != nullptr) grpc_server_->GetHealthCheckService()->SetServingStatus(false);
  const auto drain = absl::Seconds(config_.server.drain_timeout_seconds);
  int64_t cut = 0;
  if (!chat_gate_.WaitIdle(drain)) {
    cut = chat_gate_.in_flight();
    spdlog::warn("drain timeout ({} s) expired with {} chat stream(s) in flight; cancelling them",
                 config_.server.drain_timeout_seconds, cut);
  }
  {
    std::lock_guard<std::mutex> lock(sweeper_mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Requests still running now are cancelled; their turns end on the pool.
  if (openai_http_ != nullptr) openai_http_->Stop();
  if (grpc_server_ != nullptr) {
    // Calls still running now are cancelled at once.
    grpc_server_->Shutdown(std::chrono::system_clock::now());
    grpc_server_->Wait();
  }
  turn_pool_.reset();  // runs what is queued (cancelled turns end at once)
  session_pool_.reset();
  {
    std::lock_guard<std::mutex> lock(sweeper_mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  if (metrics_http_ != nullptr) metrics_http_->Stop();
  return cut;
}

}  // namespace kvl::server
