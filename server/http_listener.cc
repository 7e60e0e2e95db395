#include "server/http_listener.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvl::server {

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const HostPort& address, const TlsSection* tls, const std::string& what,
    const std::function<void(httplib::Server&)>& routes) {
  std::unique_ptr<HttpListener> self(new HttpListener());
  if (tls != nullptr && tls->enabled()) {
    auto https = std::make_unique<httplib::SSLServer>(
        tls->cert_file.c_str(), tls->key_file.c_str(),
        tls->client_ca_file.empty() ? nullptr : tls->client_ca_file.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": cannot serve HTTPS with cert_file '", tls->cert_file,
                       "', key_file '", tls->key_file, "'",
                       tls->client_ca_file.empty()
                           ? ""
                           : absl::StrCat(", client_ca_file '", tls->client_ca_file, "'")));
    }
    self->http_ = std::move(https);
  } else {
    self->http_ = std::make_unique<httplib::Server>();
  }
  // httplib's default also sets SO_REUSEPORT, which would let a second process
  // bind the same port silently; SO_REUSEADDR alone still allows a quick restart.
  self->http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  routes(*self->http_);
  // httplib takes the host without IPv6 brackets.
  std::string host = address.host;
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  int port = address.port;
  if (port == 0) {
    port = self->http_->bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!self->http_->bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot listen on ", address.ToString(),
                                               " (address in use or not local?)"));
  }
  self->bound_ = HostPort{address.host, port};
  httplib::Server* http = self->http_.get();
  self->thread_ = std::thread([http] { http->listen_after_bind(); });
  // stop() is a no-op until the listen loop runs, so wait for it here: a Stop()
  // right after Start() must not leave the thread blocked in accept.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!http->is_running() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return self;
}

HttpListener::~HttpListener() { Stop(); }

void HttpListener::Stop() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvl::server
