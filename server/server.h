// The kvl-server process minus main(): gRPC services, health, reflection, the
// /metrics endpoint and session expiry, started from a validated config.
//
// Lifetime: Start() -> (serving) -> Shutdown(). Shutdown() is called from one
// thread (main's signal loop); the rest of the class is driven by gRPC.
#pragma once

#include <grpcpp/server.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/drain_gate.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/model_runtime.h"
#include "server/openai_http.h"
#include "server/services.h"
#include "server/turn_pool.h"

namespace kvl::server {

// The version reported by kvlingo_build_info.
const char* Version();

class Server {
 public:
  // Loads every configured model and translator (errors as
  // LoadModelRuntime's: a bad file is NotFound/InvalidArgument/
  // FailedPrecondition naming the config entry). Binds nothing yet.
  static absl::StatusOr<std::unique_ptr<Server>> Load(const ServerConfig& config);
  // Binds both addresses and starts serving; health is SERVING for "" and every
  // kvlingo.v1 service once this returns. Unavailable if an address cannot be
  // bound. Call once.
  absl::Status Serve();
  // Load, then Serve.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerConfig& config);
  ~Server();  // Shutdown()s if still running

  // Bound addresses (real ports when 0 was configured).
  const HostPort& listen_address() const { return listen_address_; }
  const HostPort& metrics_address() const { return metrics_http_->address(); }
  // The OpenAI API's bound address; nullopt when server.http_address is unset.
  std::optional<HostPort> http_address() const {
    if (openai_http_ == nullptr) return std::nullopt;
    return openai_http_->address();
  }

  // Drains, then stops: health NOT_SERVING, new Chat calls and OpenAI API
  // requests UNAVAILABLE (503), waits up to server.drain_timeout_seconds for
  // in-flight Chat streams and API requests, then shuts gRPC, the API and
  // /metrics down. Returns the number of streams still running when the
  // drain timeout expired (they are cancelled). Idempotent.
  int64_t Shutdown();

 private:
  explicit Server(const ServerConfig& config);
  void SweepIdleSessions();
  void KeepCallbackThreadsPolling();

  ServerConfig config_;
  ServerMetrics metrics_;
  DrainGate chat_gate_;
  std::unique_ptr<ModelRuntime> runtime_;
  std::unique_ptr<TurnPool> turn_pool_;
  // The session calls' session-store work (server/services.h): a few threads,
  // since each waits on one store round trip at a time.
  std::unique_ptr<TurnPool> session_pool_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<SessionServiceImpl> session_service_;
  std::unique_ptr<ChatServiceImpl> chat_service_;
  std::unique_ptr<ModelServiceImpl> model_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  std::unique_ptr<OpenAiHttpServer> openai_http_;  // server.http_address
  HostPort listen_address_;

  // sweeper_mu_ guards stopping_; stop_ wakes the sweeper and the heartbeat.
  std::mutex sweeper_mu_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread sweeper_;
  std::thread heartbeat_;  // KeepCallbackThreadsPolling; stops with stopping_
  bool shut_down_ = false;
};

}  // namespace kvl::server
