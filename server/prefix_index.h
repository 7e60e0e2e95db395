// The cross-model prefix cache's index (issue 53): which session holds a
// conversation that a stateless request (OpenAI API, every request carrying
// the whole conversation) continues.
//
// A conversation held by the cache is an ordinary session (server/sessions.h)
// with an "oai-" id in its tenant's namespace: its cache lines, ledger, byte
// budget, LRU eviction of lines, repair and expiry are the sessions'. This
// index maps a digest of the conversation a session has committed (tenant,
// system prompt, each completed turn's user message and reply text) to the
// session. A request digests each prefix of its conversation that ends at a
// turn boundary and takes the longest one the index holds; the models'
// lines in that session are then reused (the answering model's own, or
// another model's by translation, as a session switch does). Each session
// has at most one entry, for the conversation it has committed.
//
// Leases: Take removes the entry, so a conversation serves one request at a
// time; a second request for the same prefix meanwhile misses (and builds its
// own session). The taker Puts the session back under its new conversation
// (or the old one when the turn failed: the session is then unchanged).
//
// Capacity: at most max_entries sessions; Put returns the least recently put
// ones past it, for the caller to remove.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace kvl::server {

class PrefixIndex {
 public:
  // A conversation's digest (SHA-256, hex): collisions are not a concern.
  using Key = std::string;

  // The digest of a conversation with no completed turn yet.
  static Key Root(std::string_view tenant, std::string_view system_prompt);
  // The digest after one more completed turn.
  static Key Extend(const Key& key, std::string_view user, std::string_view assistant);

  explicit PrefixIndex(int64_t max_entries) : max_entries_(max_entries) {}

  struct Hit {
    std::string session_id;
    size_t index = 0;  // into the keys given to Take
  };
  // Removes and returns the entry of the last key in `keys` that the index
  // holds; nullopt when it holds none.
  std::optional<Hit> Take(const std::vector<Key>& keys);
  // Enters `session_id` under `key` (replacing what the key held: that
  // session is returned for removal too). Returns the sessions to remove.
  std::vector<std::string> Put(const Key& key, const std::string& session_id);
  // Forgets a session (removed elsewhere); false when it had no entry.
  bool Forget(const std::string& session_id);

  int64_t size() const;

 private:
  struct Entry {
    std::string session_id;
    std::list<Key>::iterator order;
  };
  const int64_t max_entries_;
  mutable std::mutex mu_;
  std::unordered_map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // least recently put first
};

}  // namespace kvl::server
