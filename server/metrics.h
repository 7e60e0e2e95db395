// The server's Prometheus registry. Every family is built once here, with a
// unit suffix and help text (kvlingo_<what>_<unit>), and every series a handler
// touches is resolved up front, so that counting an RPC is an array index and
// an atomic add: no label lookup by string on a request path.
//
// Thread-safe: all methods may be called from any thread.
#ifndef KVLINGO_SERVER_METRICS_H_
#define KVLINGO_SERVER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace kvl::server {

// Every RPC the server implements; the label value is the full gRPC method name.
enum class RpcMethod {
  kChat,
  kCreateSession,
  kGetSession,
  kListSessions,
  kDeleteSession,
  kListModels,
  kListTranslators,
};
inline constexpr int kNumRpcMethods = 7;
// "kvlingo.v1.ChatService/Chat", ...
absl::string_view RpcMethodName(RpcMethod method);

// gRPC status codes 0..16 and their canonical names ("OK", "NOT_FOUND", ...).
inline constexpr int kNumGrpcCodes = 17;
absl::string_view GrpcCodeName(int code);

class ServerMetrics {
 public:
  // `version` becomes the label of kvlingo_build_info.
  explicit ServerMetrics(const std::string& version);

  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // kvlingo_grpc_requests_total{method, code}; `code` is a grpc::StatusCode
  // value. Codes outside [0, 16] count as UNKNOWN.
  void CountRpc(RpcMethod method, int code);
  // kvlingo_sessions_active.
  void SetSessionsActive(int64_t n);
  // kvlingo_up: 1 while serving, 0 while draining.
  void SetUp(bool up);

  // The registry in the Prometheus text exposition format (version 0.0.4).
  std::string RenderText() const;

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::array<std::array<prometheus::Counter*, kNumGrpcCodes>, kNumRpcMethods> rpc_requests_{};
  prometheus::Gauge* sessions_active_ = nullptr;
  prometheus::Gauge* up_ = nullptr;
};

}  // namespace kvl::server

#endif  // KVLINGO_SERVER_METRICS_H_
