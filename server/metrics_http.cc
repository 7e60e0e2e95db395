#include "server/metrics_http.h"

#include <httplib.h>

#include <utility>

namespace kvl::server {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const HostPort& address, std::function<std::string()> render, const TlsSection* tls) {
  absl::StatusOr<std::unique_ptr<HttpListener>> listener = HttpListener::Start(
      address, tls, tls != nullptr && tls->enabled() ? "server.tls.metrics" : "metrics",
      [&render](httplib::Server& http) {
        http.Get("/metrics",
                 [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
                   res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
                 });
      });
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(*std::move(listener)));
}

}  // namespace kvl::server
