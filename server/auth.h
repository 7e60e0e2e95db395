// API keys and tenants ("auth" in the configuration, server/README.md).
//
// A client sends `authorization: Bearer <key>`; the configuration holds only
// each key's SHA-256 (`kvl hash-key` prints it), so neither the file nor a log
// line ever contains a key. Each key belongs to a tenant and carries rights.
// Sessions are scoped to their tenant: a tenant's session ids live in its own
// namespace (ScopedSessionId), so another tenant's session is NOT_FOUND, never
// "forbidden", and its ids cannot collide with or reveal another's.
// With no keys configured, authentication is off: every call is the "" tenant
// with every right, as before auth existed.
//
// Thread-safety: Authenticate and the scoping functions are const; the turn
// counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvl::server {

// What a key may do. kChat: sessions of its tenant (create, get, list,
// delete, transcript) and chat turns in them; kModels: ListModels and
// ListTranslators; kImport: ImportSession (it writes replies the models never
// produced into a session); kAdmin: every right.
enum class Right { kChat, kModels, kImport, kAdmin };
absl::string_view RightName(Right right);

struct ApiKeyEntry {
  std::string name;    // shown in logs instead of the key
  std::string tenant;  // 1-64 characters of [A-Za-z0-9._-]
  std::string sha256;  // lowercase hex of the key's SHA-256
  std::vector<Right> rights = {Right::kChat, Right::kModels};
};

// Per-tenant limits; 0: none (the server-wide limits still apply).
struct TenantLimits {
  int64_t max_sessions = 0;          // sessions the tenant holds on this replica
  int64_t max_concurrent_turns = 0;  // Chat streams in flight for the tenant
};

struct AuthSection {
  std::vector<ApiKeyEntry> keys;
  std::map<std::string, TenantLimits> tenants;
  bool enabled() const { return !keys.empty(); }
};

// 1-64 characters of [A-Za-z0-9._-].
bool IsValidTenantName(absl::string_view tenant);

// Who is calling: the tenant and the key's name ("" with auth off).
struct Caller {
  std::string tenant;
  std::string key_name;
  bool admin = false;
  std::vector<Right> rights;
  bool Has(Right right) const;
};

// The store's id of a client's session id: "<tenant>/<id>", or the id itself
// for the "" tenant. '/' is not allowed in client ids, so the namespaces
// cannot overlap.
std::string ScopedSessionId(const Caller& caller, absl::string_view session_id);
// The client's id back from a scoped one; "" when `scoped` is not the
// caller's (another tenant's).
std::string ClientSessionId(const Caller& caller, absl::string_view scoped);
// Whether a scoped id belongs to the caller's tenant.
bool OwnsSession(const Caller& caller, absl::string_view scoped);

class Authenticator {
 public:
  explicit Authenticator(AuthSection config);

  bool enabled() const { return config_.enabled(); }
  const AuthSection& config() const { return config_; }

  // The caller the value of a call's `authorization` metadata names (nullopt:
  // none sent). UNAUTHENTICATED for a missing or malformed value or an
  // unknown key (the message never repeats the key). With auth off: the ""
  // tenant with every right, whatever was sent.
  absl::StatusOr<Caller> Authenticate(const std::optional<std::string>& authorization) const;
  // PERMISSION_DENIED naming the right and the RPC unless the caller has it.
  static absl::Status Require(const Caller& caller, Right right, absl::string_view rpc);

  const TenantLimits& LimitsOf(const std::string& tenant) const;

  // A Chat stream of `tenant` starts; RESOURCE_EXHAUSTED naming the limit
  // when the tenant already has max_concurrent_turns in flight. Each OK must
  // be paired with EndTurn.
  absl::Status BeginTurn(const std::string& tenant);
  void EndTurn(const std::string& tenant);

  // Held while a session of `tenant` is counted and created, so that
  // concurrent creations cannot pass max_sessions together.
  std::mutex& CreationMutex(const std::string& tenant);

 private:
  AuthSection config_;
  std::map<std::string, const ApiKeyEntry*> by_hash_;
  // Turns in flight per configured tenant (the map is fixed after construction).
  std::map<std::string, std::unique_ptr<std::atomic<int64_t>>> turns_;
  std::map<std::string, std::unique_ptr<std::mutex>> creation_;  // same keys; "" for open mode
};

}  // namespace kvl::server
