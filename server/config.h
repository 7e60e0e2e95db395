// Server configuration: one JSON file (comments allowed), parsed into native
// types here so that nothing else in the server sees JSON. The schema, with
// every key, type and default, is documented in server/README.md; keep the two
// in step.
//
// Errors name the key path and what was wrong, e.g.
//   config: server.listen_address: expected host:port, got 'x'
// Unknown keys at any level are errors, so that a typo never silently falls
// back to a default.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache_store/session_store.h"
#include "model/config.h"
#include "router/loader.h"
#include "router/policy.h"
#include "server/auth.h"

namespace kvl::server {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };

// "trace", ..., "error": the spelling used in the config file and --log-level.
absl::string_view LogLevelName(LogLevel level);
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);

// host:port with a numeric port in [0, 65535]; host is a name, an IPv4 address
// or a bracketed IPv6 address ("[::1]:50051"). Port 0 asks the OS for a free
// port; the server logs the port it bound.
struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;  // host:port, as it was written
};
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

// server.tls: the gRPC port serves TLS with this certificate; with
// client_ca_file, clients must present a certificate that CA signed (mTLS).
// Paths are resolved against the config file's directory; empty cert_file:
// plaintext. The files are read again every reload_interval_seconds and a
// changed certificate, key or CA serves new handshakes from then on;
// connections already open keep theirs (server/README.md, "tls").
struct TlsSection {
  std::string cert_file;       // PEM certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM; empty: no client certificates asked
  int64_t reload_interval_seconds = 60;
  // Also serve GET /metrics over HTTPS with the same files (and with
  // client_ca_file, only to clients with a certificate that CA signed). Read
  // once at start: a rotated certificate reaches /metrics on a restart.
  bool metrics = false;
  bool enabled() const { return !cert_file.empty(); }
};

struct ServerSection {
  HostPort listen_address{"127.0.0.1", 50051};
  HostPort metrics_address{"127.0.0.1", 9464};
  // The OpenAI-compatible HTTP API (server/openai_http.h, docs/openai-api.md);
  // off when unset. It serves TLS with server.tls's files when they are set,
  // and the same API keys (Authorization: Bearer).
  std::optional<HostPort> http_address;
  // The `model` name in OpenAI requests that asks the configured routing
  // policy to pick the model; empty: requests must name a served model.
  std::string http_router_model = "kvlingo";
  // How many conversations the OpenAI API's prefix cache indexes (each is a
  // session, "oai-..."); past it the least recently used is removed.
  int64_t http_max_conversations = 1024;
  // How long SIGTERM waits for in-flight Chat streams before shutting down.
  double drain_timeout_seconds = 30.0;
  // Upper bound on ChatRequest.user_message, in UTF-8 bytes.
  int64_t max_turn_bytes = 65536;
  // Upper bound on SamplingParams.max_tokens; also the default when it is 0.
  int64_t max_new_tokens_limit = 4096;
  // Upper bound on CreateSessionRequest.system_prompt, in UTF-8 bytes.
  int64_t max_system_prompt_bytes = 65536;
  // Upper bound on an ImportSessionRequest's messages and replies together.
  int64_t max_import_bytes = int64_t{4} << 20;
  // Upper bound on a call's metadata (its headers but gRPC's own), in bytes:
  // each entry counts its name, its value and 32 (HTTP/2's accounting).
  int64_t max_metadata_bytes = 8192;
  TlsSection tls;
  // gRPC server reflection (grpcurl, Postman list the API). It reveals only
  // the API's schema; turn it off where that is unwanted.
  bool reflection = true;
};

// The server's admission limits ("limits"): past one, a request fails at once
// with RESOURCE_EXHAUSTED naming it, and nothing changes. 0: no limit. The
// section's other two keys, max_waiting_turns_per_model and
// max_history_tokens, are the router's (RouterConfig::limits).
struct LimitsSection {
  int64_t max_concurrent_streams = 256;  // Chat streams in flight
  int64_t max_sessions = 100000;         // sessions held
};

struct LogSection {
  LogLevel level = LogLevel::kInfo;
};

struct RuntimeSection {
  // LibTorch intra-op threads; 0 means one per hardware thread.
  int threads = 0;
  DType dtype = DType::kFloat32;
  // Where the models, their KV caches and the translated spans live: "cpu",
  // "cuda" or "cuda:N" (model/device.h). Checked at load: a CUDA device on a
  // CPU-only build, or one the machine lacks, stops the start.
  std::string device = "cpu";
};

// Relative paths in the file are resolved against the directory of the config
// file, so ModelEntry::path and TranslatorEntry::path are absolute.
using ModelEntry = router::ModelSource;
using TranslatorEntry = router::TranslatorSource;

struct SessionsSection {
  // Sessions untouched for this long are deleted; 0 disables expiry.
  int64_t idle_timeout_seconds = 3600;
  // Bytes of KV cache all sessions together may hold.
  int64_t memory_budget_bytes = int64_t{4} << 30;
  // sessions.store: where sessions are kept beyond this process
  // (server/sessions.h): backend "memory" (default) or "redis" with
  // redis_address, key_prefix and timeout_ms. A Redis store's TTL is
  // idle_timeout_seconds (0: none).
  SessionStoreOptions store;
};

struct ServerConfig {
  ServerSection server;
  LimitsSection limits;
  LogSection log;
  RuntimeSection runtime;
  std::vector<ModelEntry> models;
  std::vector<TranslatorEntry> translators;
  // The router's configuration (router/config.h, its defaults the file's):
  // the "routing" section (policy with model names resolved to indices into
  // `models`, switching, gates), "batching", and the router's share of
  // "limits".
  router::RouterConfig router;
  SessionsSection sessions;
  // API keys and tenants; no keys: the server is open (server/auth.h).
  AuthSection auth;
};

// Parses and validates `text`. Relative paths are resolved against `base_dir`.
// InvalidArgument (syntax, unknown key, bad value, dangling reference) or
// NotFound (a model or translator path that does not exist), with the message
// "config: <key path>: <problem>".
absl::StatusOr<ServerConfig> ParseConfig(absl::string_view text, const std::string& base_dir);

// Reads `path` and parses it; NotFound when the file cannot be read.
absl::StatusOr<ServerConfig> LoadConfigFile(const std::string& path);

}  // namespace kvl::server
