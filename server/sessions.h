// The server's sessions, kept in two places (issue 35): the replica's
// CacheStore (conversation state and KV cache lines, cache_store.h) and the
// durable SessionStore (system prompt and committed turns, session_store.h).
// The store is the truth; the CacheStore is this replica's working copy.
//
//   - Create writes both; Remove removes from both.
//   - Before a turn, Prepare asks the store how many turns the session has
//     committed (and whether the request id has committed already, to
//     replay it). A replica that lacks the session, or holds an older copy
//     (another replica continued it), rebuilds it from the store: state
//     only, no lines, and the answering model prefills (CachePath::kRestored).
//   - A turn is written through to the store (Record) before it becomes the
//     local session's, as a compare-and-set on the turn count; a turn that
//     cannot be written fails and the session stays as it was.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_store/cache_store.h"
#include "cache_store/session_store.h"

namespace kvl::server {

// The conversation state a session's record describes. Models are mapped by
// name to indices in `model_names`; a model this server does not serve maps
// to -1 (its spans are prefilled). DataLoss when the turns' tokens do not
// continue one another.
absl::StatusOr<ConversationState> StateFromRecord(const SessionRecord& record,
                                                  const std::vector<std::string>& model_names);

class Sessions {
 public:
  Sessions(CacheStore* cache, std::unique_ptr<SessionStore> store,
           std::vector<std::string> model_names);

  SessionStore& store() { return *store_; }
  CacheStore& cache() { return *cache_; }

  // As CacheStore::Create, and recorded in the store first: AlreadyExists
  // when the store has the id (from another replica), Unavailable when it
  // cannot be reached (nothing created then).
  absl::StatusOr<SessionView> Create(std::string_view session_id, std::string system_prompt,
                                     std::vector<int64_t> preamble);
  // Removes the session from the store and this replica. NotFound when
  // neither has it; Unavailable (nothing removed) when the store cannot be
  // reached.
  absl::Status Remove(const std::string& session_id);
  // This replica's view when it holds the current session (with its lines);
  // otherwise the store's (no lines). NotFound for an unknown id.
  absl::StatusOr<SessionView> View(const std::string& session_id);
  // The store's record. NotFound for an unknown id.
  absl::StatusOr<SessionRecord> Transcript(const std::string& session_id);

  // Before a turn: the committed turn with `request_id` when there is one
  // (replay it instead of running), else nullopt with this replica holding
  // the session as committed. NotFound for an unknown (or expired) session;
  // the store's errors (Unavailable).
  absl::StatusOr<std::optional<TurnRecord>> Prepare(const std::string& session_id,
                                                    const std::string& request_id);
  // Writes a turn through to the store: `turn` with the history, ledger and
  // counters of `after` filled in. Aborted when another turn committed first
  // (also one with the same request id: a retry then gets its replay),
  // Unavailable when the store cannot be reached.
  absl::Status Record(const std::string& session_id, const ConversationState& before,
                      const ConversationState& after, TurnRecord turn);
  // Removes this replica's sessions idle for `idle_seconds`; with a store
  // kept in the process they leave the store too (a shared store expires them
  // by its own TTL). Returns their ids.
  std::vector<std::string> RemoveIdle(int64_t idle_seconds);

 private:
  // Whether this replica's copy of the session is the store's current one:
  // the same creation (generation) and turn count.
  bool LocalIsCurrent(const std::string& session_id, const TurnCheck& check);
  void SetGeneration(const std::string& session_id, std::string generation);
  void ForgetGeneration(const std::string& session_id);

  CacheStore* cache_;
  std::unique_ptr<SessionStore> store_;
  std::vector<std::string> model_names_;
  std::mutex mu_;
  // The generation of each session this replica holds a copy of.
  std::unordered_map<std::string, std::string> generations_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
};

}  // namespace kvl::server
