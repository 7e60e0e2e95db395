// In-memory session table: ids, system prompts and bookkeeping of the
// conversations the server holds. It knows nothing of gRPC or of caches; a
// later stage moves session state into cache_store/ and router/, and this class
// shrinks to what they do not cover.
//
// Thread-safe: every method may be called concurrently.
#ifndef KVLINGO_SERVER_SESSION_TABLE_H_
#define KVLINGO_SERVER_SESSION_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvl::server {

struct SessionInfo {
  std::string session_id;
  std::string system_prompt;
  uint32_t turns = 0;
  uint32_t history_tokens = 0;
  std::string last_model;  // empty before the first turn
  int64_t created_unix_seconds = 0;
  int64_t last_active_unix_seconds = 0;
};

struct SessionPage {
  std::vector<SessionInfo> sessions;
  std::string next_page_token;  // empty on the last page
};

// 1-128 characters of [A-Za-z0-9._:-].
bool IsValidSessionId(absl::string_view id);

class SessionTable {
 public:
  // Seconds since the Unix epoch; injectable so that expiry is testable.
  using Clock = std::function<int64_t()>;

  static constexpr uint32_t kDefaultPageSize = 100;
  static constexpr uint32_t kMaxPageSize = 1000;

  explicit SessionTable(Clock clock = nullptr);

  // Empty `session_id`: a fresh "s-" + 24 hex character id. Otherwise the id
  // must be valid (InvalidArgument naming session_id) and free (AlreadyExists).
  absl::StatusOr<SessionInfo> Create(absl::string_view session_id, std::string system_prompt);
  // NotFound for an unknown id.
  absl::StatusOr<SessionInfo> Get(absl::string_view session_id) const;
  absl::Status Delete(absl::string_view session_id);
  // Sessions in creation order. page_size 0 means kDefaultPageSize; larger than
  // kMaxPageSize is clamped. `page_token` is empty or a previous
  // next_page_token; anything else is InvalidArgument. Sessions deleted between
  // pages are skipped, never repeated.
  absl::StatusOr<SessionPage> List(uint32_t page_size, absl::string_view page_token) const;
  // Marks the session used now (so that it does not expire); NotFound if unknown.
  absl::Status Touch(absl::string_view session_id);
  // Deletes sessions idle for at least `idle_seconds`; returns their ids.
  std::vector<std::string> RemoveIdle(int64_t idle_seconds);

  size_t size() const;

 private:
  struct Entry {
    uint64_t seq;  // creation order, never reused
    SessionInfo info;
  };

  Clock clock_;
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> by_id_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> by_seq_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvl::server

#endif  // KVLINGO_SERVER_SESSION_TABLE_H_
