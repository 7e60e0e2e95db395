// Clients for gRPC's standard services, for tests of any gRPC server.
//
// Debian's gRPC ships neither the health nor the reflection .proto files (nor
// their generated C++), so the few messages used here are encoded and decoded
// by hand from their published field numbers. Calls go through
// grpc::GenericStub, on any channel.
#pragma once

#include <grpcpp/channel.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvl::testing {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// grpc.health.v1.Health/Check for `service` ("" for the whole server). A
// failed RPC comes back as an error with the same code (NOT_FOUND for a
// service the server does not know).
absl::StatusOr<HealthStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    std::chrono::milliseconds timeout = std::chrono::seconds(5));

// Full names of the services the server lists through
// grpc.reflection.v1alpha.ServerReflection (list_services).
absl::StatusOr<std::vector<std::string>> ListServicesByReflection(
    const std::shared_ptr<grpc::Channel>& channel,
    std::chrono::milliseconds timeout = std::chrono::seconds(5));

// A channel to host:port, without TLS.
std::shared_ptr<grpc::Channel> InsecureChannel(const std::string& address);

}  // namespace kvl::testing
