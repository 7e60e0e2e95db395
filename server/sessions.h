// The one owner of a session's life (issue 50): create, restore, commit with
// write-through, replay, list, count, delete and expire, over this replica's
// CacheStore (its working copy: conversation state and KV cache lines,
// cache_store.h) and the durable SessionStore (system prompt and committed
// turns, session_store.h). The services see only this class; the router
// leases sessions from the CacheStore for the length of a turn and commits
// through Record.
//
// The store is the truth; the CacheStore holds copies. Each copy carries the
// store's generation (SessionView::generation), so a copy is current when its
// generation and turn count are the store's; there is no second registry to
// keep in step.
//
// No step needs undoing: every operation writes the store first and then
// changes the CacheStore in a step that cannot fail, so a failure leaves
// nothing behind:
//   - Create reserves the id locally (invisible, SessionReservation), writes
//     the record (with the turns an import ran on the staged session), then
//     commits the reservation; any failure drops the reservation.
//   - Remove removes from the store, then drops the local copy.
//   - Prepare (before a turn) asks the store for the turn count (and whether
//     the request id has committed, to replay it); a replica lacking a current
//     copy rebuilds it from the store: state only, no lines, and the
//     answering model prefills (CachePath::kRestored).
//   - Record writes a turn through to the store, as a compare-and-set on the
//     turn count, before the router commits it locally; a turn that cannot be
//     written fails and the session stays as it was.
//
// With a shared store (Redis), View, List and Count read the store, so they
// are true across replicas; with the in-process store they read the
// CacheStore, which then holds every session.
//
// Threading: thread-safe. Every call but CacheStats and model_names may block
// on the store (a Redis round trip, up to its timeout): never call them on
// gRPC's callback threads (server/services.h runs them on the session pool or
// the turn pool).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_store/cache_store.h"
#include "cache_store/session_store.h"
#include "model/tokenizer.h"

namespace kvl::server {

// The conversation state a session's record describes. Models are mapped by
// name to indices in `model_names`; a model this server does not serve maps
// to -1 (its spans are prefilled). With `tokenizers` (group 0's first, then
// the other groups', router.h) the other groups' renderings are rebuilt
// from the text: each segment of the stored stream decoded by group 0's
// tokenizer and encoded by the group's (ConversationState), and
// `model_groups` (per model) places the last model's tail_begin in its
// group's stream. DataLoss when
// the turns' tokens do not continue one another.
absl::StatusOr<ConversationState> StateFromRecord(
    const SessionRecord& record, const std::vector<std::string>& model_names,
    const std::vector<const Tokenizer*>& tokenizers = {}, const std::vector<int>& model_groups = {});

class Sessions {
 public:
  Sessions(CacheStore* cache, std::unique_ptr<SessionStore> store,
           std::vector<std::string> model_names);
  // The models' tokenizer groups and the groups' tokenizers (router.h), once
  // the router is loaded: restores and forks rebuild each group's stream.
  // Before any session is restored; the tokenizers must outlive this.
  void SetTokenizerGroups(std::vector<int> model_groups,
                          std::vector<const Tokenizer*> tokenizers);

  // The store, for logs ("memory", "redis host:port"); whether it can be
  // reached now (Unavailable when not).
  std::string DescribeStore() const { return store_->Describe(); }
  absl::Status PingStore() { return store_->Ping(); }
  // This replica's cache accounting (for metrics); never blocks on the store.
  CacheStoreStats CacheStats() const { return cache_->Stats(); }

  // Runs a new session's first turns (ImportSession) on the session staged
  // under `session_id`, before it exists for anyone else; each turn the
  // router commits goes to *turns (CompleteTurn), not to the store.
  using Populate =
      std::function<absl::Status(const std::string& session_id, std::vector<TurnRecord>* turns)>;

  // A new session (an empty id gets a generated one), with the turns
  // `populate` runs when it is set. InvalidArgument for a malformed id;
  // AlreadyExists when the store (or, with the in-process store, this
  // replica) has the id; ResourceExhausted past limits.max_sessions;
  // Unavailable when the store cannot be reached; populate's error. On any
  // error nothing is created.
  absl::StatusOr<SessionView> Create(std::string_view session_id, std::string system_prompt,
                                     std::vector<int64_t> preamble,
                                     const Populate& populate = nullptr);
  // For Create: makes the staged session a copy of `source_id` as of its
  // first `turns` turns: their records (written with the new session), the
  // state they describe, and, from this replica's copy of the source when its
  // history begins with theirs, the prefix of each cache line they cover
  // (copied, admitted against the cache budget). The source is left as it
  // is. NotFound for an unknown source, FailedPrecondition when it has fewer
  // turns, Aborted while a turn holds it, ResourceExhausted when the copies
  // do not fit the budget; the store's errors.
  Populate ForkOf(const std::string& source_id, int64_t turns);
  // Removes the session from the store and this replica. NotFound when
  // neither has it; Unavailable (nothing removed) when the store cannot be
  // reached.
  absl::Status Remove(const std::string& session_id);
  // This replica's view when it holds the current session (with its lines);
  // otherwise the store's (no lines). NotFound for an unknown id.
  absl::StatusOr<SessionView> View(const std::string& session_id);
  // Sessions whose id begins with `id_prefix` (a tenant's), paged as
  // CacheStore::List: in creation order with the in-process store, in id
  // order with a shared one (each page reads the store). InvalidArgument for
  // a token this call did not hand out.
  absl::StatusOr<SessionPage> List(uint32_t page_size, std::string_view page_token,
                                   std::string_view id_prefix);
  // How many sessions have an id beginning with `id_prefix` (a tenant's).
  absl::StatusOr<int64_t> Count(std::string_view id_prefix);
  // The store's record. NotFound for an unknown id.
  absl::StatusOr<SessionRecord> Transcript(const std::string& session_id);

  // Before a turn: the committed turn with `request_id` when there is one
  // (replay it instead of running), else nullopt with this replica holding
  // the session as committed. NotFound for an unknown (or expired) session;
  // the store's errors (Unavailable).
  absl::StatusOr<std::optional<TurnRecord>> Prepare(const std::string& session_id,
                                                    const std::string& request_id);
  // `turn` with the history, ledger and counters of `after` filled in (what
  // the store keeps of a turn that took the session from `before`).
  TurnRecord CompleteTurn(const ConversationState& before, const ConversationState& after,
                          TurnRecord turn) const;
  // Writes a turn through to the store (CompleteTurn). Aborted when another
  // turn committed first (also one with the same request id: a retry then
  // gets its replay), Unavailable when the store cannot be reached.
  absl::Status Record(const std::string& session_id, const ConversationState& before,
                      const ConversationState& after, TurnRecord turn);
  // Removes this replica's sessions idle for `idle_seconds`; with a store
  // kept in the process they leave the store too (a shared store expires them
  // by its own TTL). Returns their ids.
  std::vector<std::string> RemoveIdle(int64_t idle_seconds);

 private:
  // The local copy when it is the store's current one: the same creation
  // (generation) and turn count.
  std::optional<SessionView> CurrentLocal(const std::string& session_id, const TurnCheck& check);
  std::string NewGeneration();

  CacheStore* cache_;
  std::unique_ptr<SessionStore> store_;
  std::vector<std::string> model_names_;
  std::vector<int> model_groups_;               // empty: all group 0
  std::vector<const Tokenizer*> tokenizers_;    // per group; empty: one group
  std::mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};  // generations
};

}  // namespace kvl::server
