// kvl health: asks a kvl-server's grpc.health.v1 service whether it serves.
// Exit 0 when it answers SERVING, 1 otherwise (NOT_SERVING while draining,
// unreachable, deadline exceeded), 2 for bad usage. The container images run
// it as their HEALTHCHECK.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>
#include <cstdio>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "base/flags.h"
#include "tools/client_credentials.h"
#include "tools/commands.h"

namespace kvl::tools {
namespace {

// grpc.health.v1 is two one-field messages; encoding them by hand saves the
// binary a generated copy of health.proto.
//   HealthCheckRequest  { string service = 1; }
//   HealthCheckResponse { ServingStatus status = 1; }  SERVING = 1, NOT_SERVING = 2
std::string EncodeHealthRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0A);  // field 1, length-delimited
  for (size_t n = service.size(); ; n >>= 7) {  // varint length
    if (n < 0x80) { out.push_back(static_cast<char>(n)); break; }
    out.push_back(static_cast<char>((n & 0x7F) | 0x80));
  }
  return out + service;
}

// The status field of a HealthCheckResponse, 0 (UNKNOWN) when absent; -1 when
// the bytes are not such a message.
int DecodeHealthStatus(const std::string& bytes) {
  if (bytes.empty()) return 0;
  if (bytes.size() < 2 || bytes[0] != 0x08) return -1;  // field 1, varint
  return static_cast<unsigned char>(bytes[1]) & 0x7F;   // the enum's values fit one byte
}

const char* StatusName(int status) {
  switch (status) {
    case 0: return "UNKNOWN";
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return "unreadable response";
  }
}

}  // namespace

int RunHealth(const Args& args) {
  std::string server = "127.0.0.1:50051", service;
  int timeout_ms = 3000;
  ClientTlsFiles tls;
  FlagSet flags("kvl health",
                "Checks a kvl-server through grpc.health.v1: exit 0 when it serves, 1 when it\n"
                "does not (draining, unreachable, no answer within --timeout-ms).");
  flags.Add("server", &server, "HOST:PORT", "the kvl-server's gRPC address");
  flags.Add("service", &service, "NAME",
            "the service to ask about, e.g. kvlingo.v1.ChatService; '' = the whole server");
  flags.Add("timeout-ms", &timeout_ms, "MS", "deadline of the check");
  flags.Add("ca", &tls.ca_file, "FILE", "connect with TLS, trusting this CA (PEM)");
  flags.Add("cert", &tls.cert_file, "FILE", "with --key: the client certificate (PEM) for mTLS");
  flags.Add("key", &tls.key_file, "FILE", "the client certificate's private key (PEM)");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (timeout_ms <= 0) {
    std::fprintf(stderr, "kvl health: --timeout-ms must be positive\n");
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeClientCredentials(tls);
  if (!credentials.ok()) {
    std::fprintf(stderr, "kvl health: %s\n", std::string(credentials.status().message()).c_str());
    return 2;
  }
  grpc::GenericStub stub(grpc::CreateChannel(server, *credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  const std::string request_bytes = EncodeHealthRequest(service);
  grpc::Slice slice(request_bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_one();
                 });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  if (!status.ok()) {
    std::fprintf(stderr, "kvl health: %s: %s (code %d)\n", server.c_str(),
                 status.error_message().c_str(), static_cast<int>(status.error_code()));
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const int serving = DecodeHealthStatus(bytes);
  std::printf("%s\n", StatusName(serving));
  return serving == 1 ? 0 : 1;
}

}  // namespace kvl::tools
