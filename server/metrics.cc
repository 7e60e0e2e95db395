#include "server/metrics.h"

#include <prometheus/text_serializer.h>

namespace kvl::server {
namespace {

constexpr std::array<absl::string_view, kNumRpcMethods> kMethodNames = {
    "kvlingo.v1.ChatService/Chat",
    "kvlingo.v1.SessionService/CreateSession",
    "kvlingo.v1.SessionService/GetSession",
    "kvlingo.v1.SessionService/ListSessions",
    "kvlingo.v1.SessionService/DeleteSession",
    "kvlingo.v1.ModelService/ListModels",
    "kvlingo.v1.ModelService/ListTranslators",
};

// Indexed by grpc::StatusCode value.
constexpr std::array<absl::string_view, kNumGrpcCodes> kCodeNames = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

constexpr int kUnknownCode = 2;

}  // namespace

absl::string_view RpcMethodName(RpcMethod method) { return kMethodNames[static_cast<int>(method)]; }

absl::string_view GrpcCodeName(int code) {
  return kCodeNames[code >= 0 && code < kNumGrpcCodes ? code : kUnknownCode];
}

ServerMetrics::ServerMetrics(const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& requests = prometheus::BuildCounter()
                       .Name("kvlingo_grpc_requests_total")
                       .Help("gRPC requests handled, by full method name and final status code.")
                       .Register(*registry_);
  // Every (method, code) series exists from the start, so that rate() and
  // ratios over codes never see a series appear mid-way.
  for (int m = 0; m < kNumRpcMethods; ++m) {
    for (int c = 0; c < kNumGrpcCodes; ++c) {
      rpc_requests_[m][c] = &requests.Add(
          {{"method", std::string(kMethodNames[m])}, {"code", std::string(kCodeNames[c])}});
    }
  }
  sessions_active_ = &prometheus::BuildGauge()
                          .Name("kvlingo_sessions_active")
                          .Help("Sessions currently held by the server.")
                          .Register(*registry_)
                          .Add({});
  prometheus::BuildGauge()
      .Name("kvlingo_build_info")
      .Help("Always 1; the labels describe the running build.")
      .Register(*registry_)
      .Add({{"version", version}})
      .Set(1);
  up_ = &prometheus::BuildGauge()
             .Name("kvlingo_up")
             .Help("1 while the server accepts new chat turns, 0 while it drains for shutdown.")
             .Register(*registry_)
             .Add({});
  up_->Set(1);
}

void ServerMetrics::CountRpc(RpcMethod method, int code) {
  rpc_requests_[static_cast<int>(method)][code >= 0 && code < kNumGrpcCodes ? code : kUnknownCode]
      ->Increment();
}

void ServerMetrics::SetSessionsActive(int64_t n) { sessions_active_->Set(static_cast<double>(n)); }

void ServerMetrics::SetUp(bool up) { up_->Set(up ? 1 : 0); }

std::string ServerMetrics::RenderText() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace kvl::server
