// One cpp-httplib server on its own thread: plain HTTP, or HTTPS with a
// server.tls section's files. /metrics (server/metrics_http.h) and the
// OpenAI API (server/openai_http.h) each run one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/config.h"

namespace httplib {
class Server;
}

namespace kvl::server {

class HttpListener {
 public:
  // Builds the server (HTTPS when `tls` is non-null and enabled, asking for
  // client certificates when it has a client_ca_file), lets `routes` register
  // its handlers and settings, binds `address` (port 0: any free port) and
  // starts serving. `what` names the listener in errors ("metrics",
  // "server.http_address"). Unavailable when the address cannot be bound;
  // InvalidArgument when the TLS files cannot be used.
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(
      const HostPort& address, const TlsSection* tls, const std::string& what,
      const std::function<void(httplib::Server&)>& routes);
  ~HttpListener();  // Stop()s

  // The bound address, with the real port when 0 was asked for.
  const HostPort& address() const { return bound_; }
  // Stops accepting, lets the requests in progress finish, joins. Idempotent.
  void Stop();

 private:
  HttpListener() = default;

  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  HostPort bound_;
};

}  // namespace kvl::server
