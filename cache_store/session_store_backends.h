// What session_store.cc's backends share; not part of the public interface
// (session_store.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_store/session_store.h"

namespace kvl::session_store_internal {

// NotFound naming the session.
absl::Status NotFound(const std::string& session_id);
// Aborted: the session has `turns` committed turns, not `expected_turns`.
absl::Status Conflict(const std::string& session_id, int64_t expected_turns, int64_t turns);
// AlreadyExists: a turn with `request_id` is committed.
absl::Status DuplicateRequest(const std::string& request_id);

// redis_session_store.cc. InvalidArgument for a malformed address.
absl::StatusOr<std::unique_ptr<SessionStore>> OpenRedisSessionStore(
    const SessionStoreOptions& options);

}  // namespace kvl::session_store_internal
