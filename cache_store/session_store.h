// The durable record of sessions: what is needed to rebuild a session on any
// replica, kept outside the process (issue 35). CacheStore (cache_store.h) is
// the replica's working copy, with KV cache lines, and server/sessions.h owns
// a session's life over both; a SessionStore holds the
// system prompt and every committed turn (its messages, the tokens it added
// to the session's stream, the span ledger after it, which model answered),
// and never a KV cache: a replica that lacks a session rebuilds its lines by
// prefill.
//
// Two backends behind one interface:
//   - MemorySessionStore: in the process (the default). Sessions survive the
//     loss of their cache lines and a local idle expiry shorter than the
//     store's, not a restart.
//   - RedisSessionStore: a Redis server (hiredis). Every replica pointed at
//     the same Redis sees the same sessions; a restart or the loss of a
//     replica loses no committed turn.
//
// Exactly once: AppendTurn is a compare-and-set on the session's turn count,
// so of two replicas running a turn of one session at once only one commits
// (the other gets Aborted); a turn carries an optional client-chosen request
// id, and a second turn with the id of a committed one is refused, while
// Check finds the committed one to replay.
//
// Models are named, not indexed: replicas may list their models in different
// orders.
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvl {

// Tokens [begin, end) of the stream written natively by `model` (empty: none).
struct StoredSpan {
  int64_t begin = 0, end = 0;
  std::string model;
  bool operator==(const StoredSpan& o) const {
    return begin == o.begin && end == o.end && model == o.model;
  }
};

// One committed turn.
struct TurnRecord {
  std::string request_id;  // the client's; may be empty
  std::string user_message;
  std::string reply;  // the assistant's text as streamed
  std::string model;  // the model that answered
  std::string finish_reason;  // the API's name, e.g. "FINISH_REASON_STOP"
  int64_t unix_seconds = 0;   // when it committed
  // The session's token stream grew from history_begin by `tokens`.
  int64_t history_begin = 0;
  std::vector<int64_t> tokens;
  // Where the turn's segments start in the stream (ConversationState::bounds;
  // absolute positions). Records written before segments were kept have
  // none: the turn is then one segment from history_begin.
  std::vector<int64_t> bounds;
  // The whole span ledger after the turn (it is short: one span per switch).
  std::vector<StoredSpan> ledger;
  // ConversationState::tail_begin and cascade_level after the turn.
  int64_t tail_begin = 0;
  int cascade_level = 0;
  // The turn's response events as they were streamed, encoded by the server
  // (opaque here); replayed for a retry with the same request_id.
  std::string events;
  bool operator==(const TurnRecord& o) const;
};

struct SessionRecord {
  std::string session_id;
  // Set at Create, unique per creation: a session deleted and created again
  // under the same id has another generation, so a replica can tell its old
  // copy from the new session.
  std::string generation;
  std::string system_prompt;
  std::vector<int64_t> preamble;  // the tokens the system prompt renders to
  int64_t created_unix_seconds = 0;
  int64_t last_active_unix_seconds = 0;
  std::vector<TurnRecord> turns;  // in order
};

// The result of SessionStore::Check.
struct TurnCheck {
  int64_t turns = 0;  // committed turns
  std::string generation;  // SessionRecord::generation
  // The committed turn with the asked request_id, if any.
  std::optional<TurnRecord> replay;
};

// Encoding of records (JSON, one object per turn); the Redis backend stores
// these strings, tests and tools read them.
std::string EncodeTurn(const TurnRecord& turn);
absl::StatusOr<TurnRecord> DecodeTurn(std::string_view text);

class SessionStore {
 public:
  virtual ~SessionStore() = default;

  // "memory" or "redis host:port", for logs.
  virtual std::string Describe() const = 0;

  // Records a new session with its turns (usually none; an imported session
  // has its turns at once), in one step: all or nothing. AlreadyExists if the
  // id is taken; Unavailable when the store cannot be reached.
  virtual absl::Status Create(const SessionRecord& session) = 0;
  // The whole record. NotFound for an unknown (or expired) id.
  virtual absl::StatusOr<SessionRecord> Load(const std::string& session_id) = 0;
  // How many turns the session has committed, and the committed turn with
  // `request_id` (when not empty); marks the session active (its TTL starts
  // again). NotFound for an unknown id.
  virtual absl::StatusOr<TurnCheck> Check(const std::string& session_id,
                                          const std::string& request_id) = 0;
  // Commits `turn` as the session's turn number expected_turns + 1. Aborted
  // when the session has committed another turn since (it no longer has
  // expected_turns turns); AlreadyExists when a turn with the same non-empty
  // request_id is committed; NotFound when the session is gone; Unavailable
  // when the store cannot be reached (then nothing is known to be written, and
  // a retry with the same request_id tells).
  virtual absl::Status AppendTurn(const std::string& session_id, int64_t expected_turns,
                                  const TurnRecord& turn) = 0;
  // NotFound for an unknown id.
  virtual absl::Status Remove(const std::string& session_id) = 0;
  // The ids that begin with `prefix` (a tenant's: "<tenant>/"), in byte
  // order, from the first after `after` (empty: from the first), at most
  // `limit` of them (0: all). O(sessions in the store) per call.
  virtual absl::StatusOr<std::vector<std::string>> ListIds(std::string_view prefix,
                                                           std::string_view after,
                                                           int64_t limit) = 0;
  // How many ids begin with `prefix`. O(sessions in the store).
  virtual absl::StatusOr<int64_t> Count(std::string_view prefix) = 0;
  // Unavailable when the store cannot be reached now.
  virtual absl::Status Ping() = 0;
  // Whether the store keeps sessions beyond this process (a replica restoring
  // a session it does not hold may find it there).
  virtual bool shared() const = 0;
};

struct SessionStoreOptions {
  std::string backend = "memory";  // "memory" or "redis"
  std::string redis_address = "127.0.0.1:6379";  // host:port
  std::string key_prefix = "kvl:";
  // A session untouched for this long is dropped by the store; 0: never.
  int64_t ttl_seconds = 0;
  // Redis: connecting and each command give up after this long (Unavailable).
  int64_t timeout_ms = 2000;
  // Seconds since the Unix epoch; null: the system clock (tests inject theirs).
  std::function<int64_t()> clock;
};

// InvalidArgument for an unknown backend or a malformed address. A Redis
// store that cannot be reached yet is returned anyway (it connects on first
// use, and reconnects after a failure), so that a server may start before its
// Redis; Ping says whether it can be reached now.
absl::StatusOr<std::unique_ptr<SessionStore>> OpenSessionStore(const SessionStoreOptions& options);

}  // namespace kvl
