// The OpenAI-compatible HTTP API (issue 53; for users: docs/openai-api.md),
// served on server.http_address beside gRPC, over the same router, sessions,
// API keys and limits:
//
//   POST /v1/chat/completions  streamed (server-sent events) or not
//   GET  /v1/models            the served models and the router model
//
// Clients are stateless: each request carries the whole conversation. The
// prefix cache (server/prefix_index.h) finds the session holding the longest
// prefix of it that ends at a turn boundary; the turns past that prefix are
// read by the answering model as given replies (prefilled), and the request's
// last user message is answered as a session turn. When another model
// answered the conversation's last turn, that is a switch, served as the
// configured strategy says (translated, by default), so a stateless client
// that alternates models gets the translated hand-over a session would. The
// session then holds the request's conversation and its reply, and the next
// request that continues it finds it.
//
// Threads: httplib's worker threads parse, authenticate and validate, then
// hand the request to the turn pool (server/services.h) and wait for its
// events; a streamed response writes them as they come. A client that closes
// its connection cancels its turn (the conversation's session is left as it
// was): a stream notices by its writes, a non-streamed request by checking
// the connection every 200 ms. Requests in flight hold a slot of the server's
// drain gate, so SIGTERM waits for them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/http_listener.h"
#include "server/prefix_index.h"
#include "server/services.h"

namespace kvl::server {

struct OpenAiOptions {
  std::string router_model = "kvlingo";  // server.http_router_model
  int64_t max_conversations = 1024;      // server.http_max_conversations
};

class OpenAiHttpServer {
 public:
  // Binds `address` and serves (HTTPS with `tls` when it is non-null and
  // enabled). deps.router must be set. Errors as HttpListener::Start.
  static absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> Start(const HostPort& address,
                                                                 const TlsSection* tls,
                                                                 const ServiceDeps& deps,
                                                                 OpenAiOptions options);
  ~OpenAiHttpServer();  // Stop()s

  const HostPort& address() const { return listener_->address(); }
  // Cancels the turns in flight (their conversations stay as they were),
  // stops accepting and joins. Idempotent.
  void Stop();

  struct Impl;

 private:
  OpenAiHttpServer() = default;

  std::unique_ptr<Impl> impl_;
  std::unique_ptr<HttpListener> listener_;
};

}  // namespace kvl::server
