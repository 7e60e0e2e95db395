// The session registry: every session this replica holds, with its system
// prompt and timestamps, its conversation state and its KV cache lines, under
// one memory budget. With a durable session store (cache_store/session_store.h)
// the registry is the replica's working copy of the sessions, and
// server/sessions.h is the one owner of a session's life over both: it alone
// creates, restores, deletes and expires sessions here.
//
// A session is one token stream (the rendered conversation), a span ledger
// saying which model wrote each span natively, and at most one cache line per
// model, each holding a prefix of the stream. Lines are evicted least recently
// used first when the byte budget is exceeded; the history and ledger never are,
// so an evicted line is rebuilt by prefill.
//
// Models are identified by their index in the server's model list
// (0 <= model < n_models); names live in router/ and server/.
//
// Legend: T=tokens.
//
// Thread-safety: CacheStore is thread-safe. A TurnLease gives one thread
// exclusive use of one session (its lines and state) until it is destroyed;
// the store never touches the lines of a leased session (no eviction, no
// reading), so the holder drives them without locks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/kv_cache.h"

namespace kvl {

// Tokens [begin, end) of the history, written natively by `model` (-1: not yet
// written by any model).
struct LedgerSpan {
  int64_t begin = 0, end = 0;
  int model = -1;
  bool operator==(const LedgerSpan& o) const {
    return begin == o.begin && end == o.end && model == o.model;
  }
};

// Appends [begin, end) written by `model` to a ledger that ends at `begin`,
// merging with the last span when it has the same writer. Empty ranges are
// ignored.
void AppendLedgerSpan(std::vector<LedgerSpan>* ledger, int64_t begin, int64_t end, int model);

// A conversation in the tokens of one tokenizer (issue 54: models with
// different tokenizers serve one session): its ids and where each segment
// starts in them (ConversationState::bounds).
struct Rendering {
  std::vector<int64_t> ids;
  std::vector<int64_t> bounds;
  bool operator==(const Rendering& o) const { return ids == o.ids && bounds == o.bounds; }
};

// The committed state of one conversation: what a turn reads and replaces.
//
// The history is in the tokens of the router's first tokenizer (group 0).
// Models on another tokenizer (group g >= 1) read renderings[g - 1]: the same
// conversation, cut into the same segments, each segment that tokenizer's own
// encoding of the segment's text (the generated reply: the answering
// model's own tokens in its group). Segments: each turn's prompt (with the
// preamble on a first turn), its reply with the stop token, its closing
// template; every ledger span starts a segment, so the ledger maps into each
// rendering (LedgerInRendering). With one tokenizer `renderings` is empty.
struct ConversationState {
  std::vector<int64_t> history;    // [T] token ids of the whole conversation so far
  std::vector<LedgerSpan> ledger;  // covers [0, history.size()) in order
  std::vector<int64_t> bounds;     // the segments' starts in history, ascending
  std::vector<Rendering> renderings;  // groups 1.., when the models read several tokenizers
  // Tokens rendered before the first user turn (the system prompt); the first
  // turn prefills them with its own tokens, so they are not yet in `history`.
  std::vector<int64_t> preamble;
  int64_t turns = 0;
  int last_model = -1;  // the model that answered the last turn; -1 before any
  // The last model's line held [0, tail_begin) right after its turn; the tokens
  // [tail_begin, history.size()) (its last sampled token and the turn's closing
  // template) it wrote but has not run yet.
  int64_t tail_begin = 0;
  int cascade_level = 0;  // index into the cascade's model list; never decreases
  // The session was rebuilt from the durable store (CacheStore::Adopt) and
  // has run no turn since: its lines, if any, were built from nothing.
  bool restored = false;
};

// The ids and segment starts of group `group`'s stream (0: history and
// bounds).
const std::vector<int64_t>& StreamIds(const ConversationState& state, int group);
const std::vector<int64_t>& StreamBounds(const ConversationState& state, int group);
// The ledger in group `group`'s tokens: each span's ends moved to the same
// segment boundaries of that rendering (group 0: the ledger itself).
std::vector<LedgerSpan> LedgerInRendering(const ConversationState& state, int group);

// Where a run of a cache line's tokens came from.
enum class SpanProvenance {
  kNative,      // computed by the line's own model as the conversation went
  kTranslated,  // translated from `source`'s cache at a switch
  kRepaired,    // computed by the line's own model, replacing a translation
};

struct LineSpanInfo {
  int64_t begin = 0, end = 0;  // [begin, end) of the history
  SpanProvenance provenance = SpanProvenance::kNative;
  int source = -1;  // kTranslated: the model whose cache was translated (the ledger's writer)
  bool operator==(const LineSpanInfo& o) const {
    return begin == o.begin && end == o.end && provenance == o.provenance && source == o.source;
  }
};

// A line's spans (KvCache::Spans) by provenance, translated runs split by
// their writer in `ledger`, adjacent runs of the same kind merged.
std::vector<LineSpanInfo> LineProvenance(const std::vector<KvSpan>& spans,
                                         const std::vector<LedgerSpan>& ledger);

struct CacheLineInfo {
  int model = -1;
  int64_t tokens = 0;  // the prefix of the history the line holds
  int64_t bytes = 0;   // KvCache::Bytes(), as counted against the budget
  bool evicted = false;
  // Tokens of the line that another model's cache was translated into (the
  // line's foreign spans), and how many tokens background repair has
  // recomputed natively in this model's lines of the session so far.
  int64_t translated_tokens = 0;
  int64_t repaired_tokens = 0;
  std::vector<LineSpanInfo> spans;  // as of the last turn or repair, in order
};

struct SessionView {
  std::string session_id;
  // The durable record's creation this copy belongs to
  // (SessionRecord::generation); empty when there is none.
  std::string generation;
  std::string system_prompt;
  int64_t created_unix_seconds = 0;
  int64_t last_active_unix_seconds = 0;
  ConversationState state;
  std::vector<CacheLineInfo> lines;  // models that served the session, by index
  bool in_turn = false;
};

struct SessionPage {
  std::vector<SessionView> sessions;
  std::string next_page_token;  // empty on the last page
};

// 1-128 characters of [A-Za-z0-9._:-].
bool IsValidSessionId(std::string_view id);
// An id as the store keeps it: a client's id (IsValidSessionId), or one scoped
// to a tenant, "<tenant>/<id>" with 1-64 characters of [A-Za-z0-9._-] before
// the slash (server/auth.h).
bool IsValidStoreSessionId(std::string_view id);
// A new random session id ("s-" and 24 hex digits: 96 bits); thread-safe.
std::string GenerateSessionId();

struct CacheStoreStats {
  int64_t budget_bytes = 0;
  int64_t total_bytes = 0;
  std::vector<int64_t> bytes_per_model;
  int64_t sessions = 0;
  int64_t sessions_with_evicted_lines = 0;
  int64_t lines_evicted_total = 0;  // since the store was created
};

struct CacheStoreOptions {
  int n_models = 0;
  int64_t memory_budget_bytes = int64_t{4} << 30;
  // Seconds since the Unix epoch, for the sessions' timestamps and expiry;
  // null: the system clock (tests inject their own).
  std::function<int64_t()> clock;
  // Create refuses a session past this many (ResourceExhausted); 0: no limit.
  int64_t max_sessions = 0;
  // Per model, the tokenizer group whose stream its line holds
  // (ConversationState); empty: all group 0.
  std::vector<int> model_groups = {};
};

class CacheStore;

// Cache memory held against the budget by something that is not a session's
// line yet (background repair's copy of a line), until destroyed. Must not
// outlive its store.
class ByteReservation {
 public:
  ByteReservation(const ByteReservation&) = delete;
  ByteReservation& operator=(const ByteReservation&) = delete;
  ~ByteReservation();
  int64_t bytes() const { return bytes_; }

 private:
  friend class TurnLease;
  ByteReservation(CacheStore* store, int64_t bytes) : store_(store), bytes_(bytes) {}
  CacheStore* store_;
  int64_t bytes_;
};

// What a lease is for: a turn, or background work (repair) that must not
// count as activity (the session's idle timer keeps running).
enum class LeaseUse { kTurn, kBackground };

// Exclusive use of one session for one turn. The lines may be grown, rolled
// back or replaced; Commit makes the new state final. Destroying an uncommitted
// lease restores the session exactly: lines rolled back to their lengths at
// Begin, replaced lines put back, lines created by the turn dropped.
class TurnLease {
 public:
  TurnLease(const TurnLease&) = delete;
  TurnLease& operator=(const TurnLease&) = delete;
  ~TurnLease();

  const std::string& session_id() const { return id_; }
  const ConversationState& state() const;
  // The line of `model`, or null when the session has none (never served, or
  // evicted). Marks the line used (for LRU).
  KvCache* line(int model);
  bool evicted(int model) const;
  // Installs `line` as the model's line for this turn (a fresh line to
  // re-prefill into, or the first line of a model). The previous line, if any,
  // is freed at Commit or put back on abandonment.
  void ReplaceLine(int model, std::unique_ptr<KvCache> line);
  // Admits `bytes` more cache memory for this turn, evicting idle lines of
  // other sessions, least recently used first. ResourceExhausted when even
  // evicting every idle line would not make room.
  absl::Status Reserve(int64_t bytes);
  // As Reserve, but the bytes stay held after the lease ends, until the
  // returned reservation is destroyed.
  absl::StatusOr<std::unique_ptr<ByteReservation>> ReserveDetached(int64_t bytes);
  // Whether the model's line holds foreign (translated) spans; does not mark
  // the line used.
  bool HasForeignSpans(int model) const;
  // Counts `tokens` as repaired in the model's line (CacheLineInfo), at Commit.
  void AddRepaired(int model, int64_t tokens);
  // Makes `next` the session's state and keeps the lines as they are.
  void Commit(ConversationState next);

 private:
  friend class CacheStore;
  friend class SessionReservation;
  struct Entry;
  TurnLease(CacheStore* store, std::string id, std::shared_ptr<Entry> entry, LeaseUse use);

  CacheStore* store_;
  std::string id_;
  std::shared_ptr<Entry> entry_;
  std::vector<int64_t> begin_lengths_;               // per model; -1: no line at Begin
  std::vector<std::unique_ptr<KvCache>> replaced_;  // per model: the line before ReplaceLine
  std::vector<bool> was_replaced_;
  int64_t reserved_ = 0;
  std::vector<int64_t> repaired_;  // per model, counted at Commit
  LeaseUse use_ = LeaseUse::kTurn;
  bool committed_ = false;
};

// A session being created (CacheStore::Reserve) while its creator records it
// elsewhere (the durable store) and, optionally, runs its first turns. Until
// Commit the session holds its id and its place under max_sessions, and is
// invisible to everyone but leases: View, List, CountWithPrefix, Touch,
// Remove and RemoveIdle do not see it, Begin does (so that the creator may run
// turns on it). Commit cannot fail; destroying an uncommitted reservation
// removes the session and its lines: failure leaves no trace. Must not
// outlive its store; not thread-safe (one creator).
class SessionReservation {
 public:
  SessionReservation(const SessionReservation&) = delete;
  SessionReservation& operator=(const SessionReservation&) = delete;
  ~SessionReservation();

  const std::string& session_id() const { return id_; }
  int64_t created_unix_seconds() const { return created_unix_seconds_; }
  // Makes the session visible, with `generation` (SessionView::generation).
  // Call at most once.
  SessionView Commit(std::string generation);

 private:
  friend class CacheStore;
  SessionReservation(CacheStore* store, std::string id, std::shared_ptr<TurnLease::Entry> entry,
                     int64_t created_unix_seconds)
      : store_(store), id_(std::move(id)), entry_(std::move(entry)),
        created_unix_seconds_(created_unix_seconds) {}

  CacheStore* store_;
  std::string id_;
  std::shared_ptr<TurnLease::Entry> entry_;  // the session it stages
  int64_t created_unix_seconds_;
  bool committed_ = false;
};

class CacheStore {
 public:
  explicit CacheStore(const CacheStoreOptions& options);
  ~CacheStore();
  CacheStore(const CacheStore&) = delete;
  CacheStore& operator=(const CacheStore&) = delete;

  int n_models() const { return options_.n_models; }
  int64_t budget_bytes() const { return options_.memory_budget_bytes; }
  // CacheStoreOptions::model_groups, once the models' tokenizers are known
  // (the router's loading); before any session is viewed.
  void SetModelGroups(std::vector<int> model_groups);

  static constexpr uint32_t kDefaultPageSize = 100;
  static constexpr uint32_t kMaxPageSize = 1000;

  // A new session. An empty `session_id` gets a fresh "s-" + 24 hex character
  // id; otherwise it must be valid (InvalidArgument naming session_id) and
  // free (AlreadyExists). `preamble`: the tokens the system prompt renders to.
  absl::StatusOr<SessionView> Create(std::string_view session_id, std::string system_prompt,
                                     std::vector<int64_t> preamble);
  // As Create, in two steps (SessionReservation). AlreadyExists also while
  // another reservation holds the id. With `replace`, a visible session of the
  // same id is dropped (its lines freed) and the reservation takes its id,
  // unless it is in a turn (Aborted): for a caller that knows the session to
  // be a stale copy.
  absl::StatusOr<std::unique_ptr<SessionReservation>> Reserve(std::string_view session_id,
                                                              std::string system_prompt,
                                                              std::vector<int64_t> preamble,
                                                              bool replace);
  // Installs a session rebuilt elsewhere (from the durable session store,
  // server/sessions.h): `state` with `restored` set, no cache lines. A local
  // session of the same id is replaced (its lines freed) and keeps its place
  // in List, unless a turn holds it (Aborted). A new id counts against
  // max_sessions (ResourceExhausted).
  absl::StatusOr<SessionView> Adopt(const std::string& session_id, std::string system_prompt,
                                    ConversationState state, int64_t created_unix_seconds,
                                    std::string generation);
  // Frees the session's lines. NotFound for an unknown id. A turn in progress
  // finishes on its own copy and its result is dropped.
  absl::Status Remove(const std::string& session_id);
  // NotFound for an unknown id. A session in a turn reports its state and
  // lines as they were committed last.
  absl::StatusOr<SessionView> View(const std::string& session_id) const;
  // Sessions in creation order. page_size 0 means kDefaultPageSize; larger
  // than kMaxPageSize is clamped. `page_token` is empty or a previous
  // next_page_token; anything else is InvalidArgument. Sessions removed
  // between pages are skipped, never repeated.
  // With `id_prefix`, only the sessions whose id begins with it (a tenant's).
  absl::StatusOr<SessionPage> List(uint32_t page_size, std::string_view page_token,
                                   std::string_view id_prefix = "") const;
  // How many sessions have an id beginning with `prefix` (a tenant's); O(sessions).
  int64_t CountWithPrefix(std::string_view prefix) const;
  // Marks the session used now (it does not expire); NotFound if unknown.
  // Begin and the end of a lease mark it too.
  absl::Status Touch(const std::string& session_id);
  // Removes the sessions idle for at least `idle_seconds` that are not in a
  // turn; returns their ids.
  std::vector<std::string> RemoveIdle(int64_t idle_seconds);
  // NotFound for an unknown id; Aborted when another turn holds the session.
  // A kTurn lease marks the session active at its start and end; a
  // kBackground one does not.
  absl::StatusOr<std::unique_ptr<TurnLease>> Begin(const std::string& session_id,
                                                   LeaseUse use = LeaseUse::kTurn);

  CacheStoreStats Stats() const;

 private:
  friend class TurnLease;
  friend class ByteReservation;
  friend class SessionReservation;
  using Entry = TurnLease::Entry;

  // Called by a lease as it ends: re-measures the session's lines, releases
  // the reservation and evicts idle lines while over budget.
  void Release(TurnLease* lease);
  // Adds `bytes` to the reserved bytes, evicting idle lines of sessions other
  // than `except` while over budget; ResourceExhausted naming `what` when
  // nothing is left to evict.
  absl::Status ReserveBytes(const Entry* except, int64_t bytes, const char* what);
  // Evicts the least recently used line of an idle session other than
  // `except`; false when there is none.
  bool EvictOne(const Entry* except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetLineBytes(Entry& e, int model, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SessionView ViewOf(const std::string& id, const Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new id for Create and Reserve, free in the registry.
  // A new session's entry (not yet registered); InvalidArgument for a bad
  // non-empty id. Create and Reserve share it.
  absl::StatusOr<std::shared_ptr<Entry>> NewEntry(std::string_view session_id,
                                                  std::string system_prompt,
                                                  std::vector<int64_t> preamble) const;
  std::string NewId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResourceExhausted when `n_more` sessions would be past max_sessions.
  absl::Status CheckRoom(int64_t n_more) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a session from the registry and its lines from the accounting; the
  // caller lets go of the returned entry (and so of the lines of a session
  // not in a turn) after releasing mu_, a busy session's lease frees them.
  std::shared_ptr<Entry> Erase(
      std::unordered_map<std::string, std::shared_ptr<Entry>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CacheStoreOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> by_seq_ ABSL_GUARDED_BY(mu_);  // creation order
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> bytes_per_model_ ABSL_GUARDED_BY(mu_);
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvl
