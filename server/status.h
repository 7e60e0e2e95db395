// The one place where an absl::Status becomes a grpc::Status. Every handler
// returns its result through ToGrpcStatus so that codes stay consistent, and
// router errors name the server's config key or request field.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "router/config.h"

namespace kvl::server {

// The server's name for a router setting: the config key that sets it
// ("limits.max_waiting_turns_per_model", "routing.models", ...) or, for the
// turn's model, the ChatRequest field ("routing.model").
absl::string_view ServerKey(router::Setting setting);

// Same code (absl and gRPC share the canonical code numbering), same message;
// a router error about a setting (router::SettingOf) is prefixed with its
// ServerKey ("limits.max_history_tokens: the session holds ..."). Codes
// outside the canonical set become UNKNOWN.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kvl::server
