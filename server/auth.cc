#include "server/auth.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"

namespace kvl::server {

absl::string_view RightName(Right right) {
  switch (right) {
    case Right::kChat: return "chat";
    case Right::kModels: return "models";
    case Right::kImport: return "import";
    case Right::kAdmin: return "admin";
  }
  return "?";
}

bool IsValidTenantName(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  return std::all_of(tenant.begin(), tenant.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool Caller::Has(Right right) const {
  return admin || std::find(rights.begin(), rights.end(), right) != rights.end();
}

std::string ScopedSessionId(const Caller& caller, absl::string_view session_id) {
  if (caller.tenant.empty()) return std::string(session_id);
  return absl::StrCat(caller.tenant, "/", session_id);
}

bool OwnsSession(const Caller& caller, absl::string_view scoped) {
  const size_t slash = scoped.find('/');
  if (caller.tenant.empty()) return slash == absl::string_view::npos;
  return slash != absl::string_view::npos && scoped.substr(0, slash) == caller.tenant;
}

std::string ClientSessionId(const Caller& caller, absl::string_view scoped) {
  if (!OwnsSession(caller, scoped)) return "";
  if (caller.tenant.empty()) return std::string(scoped);
  return std::string(scoped.substr(caller.tenant.size() + 1));
}

Authenticator::Authenticator(AuthSection config) : config_(std::move(config)) {
  creation_[""] = std::make_unique<std::mutex>();
  for (const ApiKeyEntry& key : config_.keys) {
    by_hash_[key.sha256] = &key;
    if (turns_.count(key.tenant) == 0) {
      turns_[key.tenant] = std::make_unique<std::atomic<int64_t>>(0);
      creation_[key.tenant] = std::make_unique<std::mutex>();
    }
  }
}

std::mutex& Authenticator::CreationMutex(const std::string& tenant) {
  auto it = creation_.find(tenant);
  return *(it != creation_.end() ? it : creation_.find(""))->second;
}

absl::StatusOr<Caller> Authenticator::Authenticate(
    const std::optional<std::string>& authorization) const {
  if (!enabled()) {
    return Caller{"", "", /*admin=*/true, {Right::kAdmin}};
  }
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "no credentials: send the API key as metadata 'authorization: Bearer <key>'");
  }
  absl::string_view value = *authorization;
  constexpr absl::string_view kScheme = "Bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: expected 'Bearer <key>'");
  }
  const absl::string_view presented = absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  const std::string hash = Sha256Hex(std::string_view(presented.data(), presented.size()));
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return absl::UnauthenticatedError("unknown API key");
  const ApiKeyEntry& key = *it->second;
  Caller caller;
  caller.tenant = key.tenant;
  caller.key_name = key.name;
  caller.rights = key.rights;
  caller.admin = std::find(key.rights.begin(), key.rights.end(), Right::kAdmin) != key.rights.end();
  return caller;
}

absl::Status Authenticator::Require(const Caller& caller, Right right, absl::string_view rpc) {
  if (caller.Has(right)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("API key '", caller.key_name, "' lacks the '",
                                                  RightName(right), "' right that ", rpc,
                                                  " needs"));
}

const TenantLimits& Authenticator::LimitsOf(const std::string& tenant) const {
  static const TenantLimits kNone;
  auto it = config_.tenants.find(tenant);
  return it == config_.tenants.end() ? kNone : it->second;
}

absl::Status Authenticator::BeginTurn(const std::string& tenant) {
  auto it = turns_.find(tenant);
  if (it == turns_.end()) return absl::OkStatus();
  const int64_t limit = LimitsOf(tenant).max_concurrent_turns;
  int64_t now = it->second->load();
  // Take a slot only while one is free, so that two racing calls at the limit
  // cannot both be refused.
  while (limit <= 0 || now < limit) {
    if (it->second->compare_exchange_weak(now, now + 1)) return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant '", tenant, "' has ", limit, " chat turns in progress (auth.tenants.", tenant,
      ".max_concurrent_turns); retry when one finishes"));
}

void Authenticator::EndTurn(const std::string& tenant) {
  auto it = turns_.find(tenant);
  if (it != turns_.end()) it->second->fetch_sub(1);
}

}  // namespace kvl::server
