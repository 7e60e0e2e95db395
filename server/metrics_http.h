// Serves GET /metrics over HTTP, or HTTPS (server.tls.metrics), with cpp-httplib
// (server/http_listener.h).
//
// prometheus-cpp's own exposer (civetweb) is deliberately not used: it fails to
// start its threads in a process that also links LibTorch and OpenBLAS.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/http_listener.h"

namespace kvl::server {

class MetricsHttpServer {
 public:
  // Binds `address` (port 0: any free port) and starts serving on its own
  // thread; `render` produces the exposition text and must be thread-safe.
  // With `tls` (non-null and enabled), HTTPS with its certificate and key,
  // and its client_ca_file when set (clients without a certificate that CA
  // signed fail the handshake). Unavailable when the address cannot be bound;
  // InvalidArgument when the TLS files cannot be used.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const HostPort& address, std::function<std::string()> render,
      const TlsSection* tls = nullptr);

  // The bound address, with the real port when 0 was asked for.
  const HostPort& address() const { return listener_->address(); }

  // Stops accepting and joins the serving thread. Idempotent.
  void Stop() { listener_->Stop(); }

 private:
  explicit MetricsHttpServer(std::unique_ptr<HttpListener> listener)
      : listener_(std::move(listener)) {}

  std::unique_ptr<HttpListener> listener_;
};

}  // namespace kvl::server
