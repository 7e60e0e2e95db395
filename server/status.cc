#include "server/status.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvl::server {
namespace {

// Spelled out rather than cast so that a code added to either enum cannot
// silently map to a wrong one.
grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return grpc::StatusCode::OK;
    case absl::StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kUnknown:
      return grpc::StatusCode::UNKNOWN;
    case absl::StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted:
      return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kOutOfRange:
      return grpc::StatusCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case absl::StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case absl::StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss:
      return grpc::StatusCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
    default:
      return grpc::StatusCode::UNKNOWN;
  }
}

}  // namespace

absl::string_view ServerKey(router::Setting setting) {
  switch (setting) {
    case router::Setting::kTurnModel:
      return "routing.model";
    case router::Setting::kOrder:
      return "routing.models";
    case router::Setting::kRules:
      return "routing.rules";
    case router::Setting::kMaxWaitingTurns:
      return "limits.max_waiting_turns_per_model";
    case router::Setting::kMaxHistoryTokens:
      return "limits.max_history_tokens";
    case router::Setting::kNativeLayers:
      return "routing.native_layers";
  }
  return "routing";
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (std::optional<router::Setting> setting = router::SettingOf(status)) {
    message = absl::StrCat(ServerKey(*setting), ": ", message);
  }
  return grpc::Status(ToGrpcCode(status.code()), std::move(message));
}

}  // namespace kvl::server
