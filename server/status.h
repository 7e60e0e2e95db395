// The one place where an absl::Status becomes a grpc::Status. Every handler
// returns its result through ToGrpcStatus so that codes stay consistent.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvl::server {

// Same code (absl and gRPC share the canonical code numbering), same message.
// Codes outside the canonical set become UNKNOWN.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kvl::server
