// The cross-model prefix cache's index (issue 53): which session holds a
// conversation that a stateless request (OpenAI API, every request carrying
// the whole conversation) continues.
//
// A conversation held by the cache is an ordinary session (server/sessions.h)
// with an "oai-" id in its tenant's namespace: its cache lines, ledger, byte
// budget, LRU eviction of lines, repair and expiry are the sessions'. This
// index maps a digest of a conversation (tenant, system prompt, each completed
// turn's user message and reply text) to the session that has it: a session
// is indexed under every turn boundary it has passed, its latest one being its
// head. A request digests each prefix of its conversation that ends at a turn
// boundary and takes the longest one the index holds. At the session's head,
// the request's turns go on in that session; at an earlier boundary (a
// regenerated or edited reply), the session has gone on past it, and the
// caller forks it (Sessions::ForkOf: the turns up to there and the prefixes
// of the cache lines they cover).
//
// Holds: Take holds the session until Put or Release, so one request at a
// time uses a session (its turns, or a fork's copy); a second request that
// needs it meanwhile takes a shorter prefix of another session, or misses.
//
// Capacity: at most max_sessions sessions; past it, Put returns the least
// recently used ones not held, for the caller to remove. A key put for a
// session that another session has it as its head removes that other one too
// (two sessions holding one conversation: the newer wins).
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

  explicit PrefixIndex(int64_t max_sessions) : max_sessions_(max_sessions) {}

  struct Hit {
    std::string session_id;
    size_t index = 0;   // into the keys given to Take
    bool head = false;  // keys[index] is the session's latest conversation
  };
  // Holds and returns the session of the last key in `keys` that the index
  // has for a session no one holds; nullopt when there is none.
  std::optional<Hit> Take(const std::vector<Key>& keys);
  // The session has passed `keys` in order (its turns went through), the last
  // its head now, and is held no more. Returns the sessions to remove.
  std::vector<std::string> Put(const std::vector<Key>& keys, const std::string& session_id);
  // The session is held no more, unchanged.
  void Release(const std::string& session_id);
  // Forgets a session (removed elsewhere); false when it had no entry.
  bool Forget(const std::string& session_id);

  int64_t sessions() const;

 private:
  struct Session {
    std::vector<Key> keys;
    Key head;
    bool held = false;
    std::list<std::string>::iterator order;
  };
  void Erase(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_sessions_;
  mutable std::mutex mu_;
  std::unordered_map<Key, std::string> owner_ ABSL_GUARDED_BY(mu_);  // key -> session
  std::unordered_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // least recently put first
};

}  // namespace kvl::server
