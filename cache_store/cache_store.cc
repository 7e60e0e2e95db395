#include "cache_store/cache_store.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace kvl {
namespace {

// Page tokens are opaque to clients; inside they hold the creation sequence
// number to resume from, so that removals between pages cannot shift them.
constexpr absl::string_view kPageTokenPrefix = "p1.";

int64_t WallClockSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

namespace {

// A group's rendering; an empty one for a session that has none yet (no
// turn since the router grouped its models).
const Rendering& RenderingOf(const ConversationState& state, int group) {
  static const Rendering* const kNone = new Rendering();
  const size_t i = static_cast<size_t>(group - 1);
  return i < state.renderings.size() ? state.renderings[i] : *kNone;
}

}  // namespace

const std::vector<int64_t>& StreamIds(const ConversationState& state, int group) {
  return group == 0 ? state.history : RenderingOf(state, group).ids;
}

const std::vector<int64_t>& StreamBounds(const ConversationState& state, int group) {
  return group == 0 ? state.bounds : RenderingOf(state, group).bounds;
}

std::vector<LedgerSpan> LedgerInRendering(const ConversationState& state, int group) {
  if (group == 0) return state.ledger;
  const std::vector<int64_t>& from = state.bounds;
  const Rendering& r = RenderingOf(state, group);
  const int64_t n = static_cast<int64_t>(r.ids.size());
  if (r.bounds.size() != from.size()) return {};  // no rendering (yet)
  // A boundary of the history: the start of its segment in the rendering
  // (the end of the history: the rendering's end). A boundary inside a
  // segment (a record from before segments were kept) maps to the start of
  // the segment it is in.
  auto map = [&](int64_t pos) {
    if (pos >= static_cast<int64_t>(state.history.size())) return n;
    const auto it = std::upper_bound(from.begin(), from.end(), pos);
    if (it == from.begin()) return int64_t{0};
    size_t k = static_cast<size_t>(it - from.begin()) - 1;
    while (k > 0 && from[k - 1] == from[k]) --k;  // the first of equal starts
    return r.bounds[k];
  };
  std::vector<LedgerSpan> out;
  for (const LedgerSpan& span : state.ledger) {
    const int64_t b = map(span.begin), e = map(span.end);
    if (e > b) out.push_back({b, e, span.model});
  }
  return out;
}

void AppendLedgerSpan(std::vector<LedgerSpan>* ledger, int64_t begin, int64_t end, int model) {
  if (end <= begin) return;
  TORCH_CHECK(ledger->empty() ? begin == 0 : ledger->back().end == begin, "ledger span [", begin,
              ", ", end, ") does not continue the ledger");
  if (!ledger->empty() && ledger->back().model == model) {
    ledger->back().end = end;
  } else {
    ledger->push_back({begin, end, model});
  }
}

std::vector<LineSpanInfo> LineProvenance(const std::vector<KvSpan>& spans,
                                         const std::vector<LedgerSpan>& ledger) {
  std::vector<LineSpanInfo> out;
  auto add = [&out](int64_t begin, int64_t end, SpanProvenance provenance, int source) {
    if (begin >= end) return;
    if (!out.empty() && out.back().end == begin && out.back().provenance == provenance &&
        out.back().source == source) {
      out.back().end = end;
    } else {
      out.push_back({begin, end, provenance, source});
    }
  };
  for (const KvSpan& span : spans) {
    if (span.native) {
      add(span.t0, span.t1, span.repaired ? SpanProvenance::kRepaired : SpanProvenance::kNative,
          -1);
      continue;
    }
    for (const LedgerSpan& l : ledger) {
      add(std::max(span.t0, l.begin), std::min(span.t1, l.end), SpanProvenance::kTranslated,
          l.model);
    }
  }
  return out;
}

// Lines and state of one session. `lines`, `state` are touched by the lease
// holder while `busy`; the accounting fields only under the store's mutex.
struct TurnLease::Entry {
  explicit Entry(int n_models)
      : lines(n_models), evicted(n_models, false), line_bytes(n_models, 0),
        line_tokens(n_models, 0), line_translated(n_models, 0), line_spans(n_models),
        repaired(n_models, 0),
        last_use(n_models, 0), served(n_models, false) {}

  uint64_t seq = 0;  // creation order, never reused; 0 while staged
  std::string generation;  // SessionView::generation
  std::string system_prompt;
  int64_t created_unix_seconds = 0;
  int64_t last_active_unix_seconds = 0;
  ConversationState state;
  std::vector<std::unique_ptr<KvCache>> lines;
  std::vector<bool> evicted;
  // Accounting as of the last release (what View reports while busy).
  std::vector<int64_t> line_bytes, line_tokens, line_translated;
  std::vector<std::vector<LineSpanInfo>> line_spans;
  std::vector<int64_t> repaired;  // tokens recomputed by repair, per model
  std::vector<uint64_t> last_use;
  std::vector<bool> served;  // has ever had a line
  bool busy = false;
  bool removed = false;
  // Held by a SessionReservation: seen by Begin only, not in by_seq_.
  bool staged = false;
};

TurnLease::TurnLease(CacheStore* store, std::string id, std::shared_ptr<Entry> entry,
                     LeaseUse use)
    : store_(store), id_(std::move(id)), entry_(std::move(entry)), use_(use) {
  const int n = store_->n_models();
  begin_lengths_.assign(n, -1);
  replaced_.resize(n);
  was_replaced_.assign(n, false);
  repaired_.assign(n, 0);
  for (int m = 0; m < n; ++m) {
    if (entry_->lines[m] != nullptr) begin_lengths_[m] = entry_->lines[m]->Length();
  }
}

TurnLease::~TurnLease() {
  if (!committed_) {
    for (int m = 0; m < store_->n_models(); ++m) {
      if (was_replaced_[m]) entry_->lines[m] = std::move(replaced_[m]);
      if (entry_->lines[m] == nullptr) continue;
      if (begin_lengths_[m] < 0) {
        entry_->lines[m].reset();  // created by this turn
      } else if (entry_->lines[m]->Length() > begin_lengths_[m]) {
        TORCH_CHECK(entry_->lines[m]->Rollback(begin_lengths_[m]).ok());
      }
    }
  }
  store_->Release(this);
}

const ConversationState& TurnLease::state() const { return entry_->state; }

KvCache* TurnLease::line(int model) {
  TORCH_CHECK(model >= 0 && model < store_->n_models());
  return entry_->lines[model].get();
}

bool TurnLease::evicted(int model) const {
  TORCH_CHECK(model >= 0 && model < store_->n_models());
  return entry_->evicted[model] && entry_->lines[model] == nullptr;
}

void TurnLease::ReplaceLine(int model, std::unique_ptr<KvCache> line) {
  TORCH_CHECK(model >= 0 && model < store_->n_models());
  if (!was_replaced_[model]) {
    replaced_[model] = std::move(entry_->lines[model]);
    was_replaced_[model] = true;
  }
  entry_->lines[model] = std::move(line);
}

absl::Status TurnLease::Reserve(int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  KVL_RETURN_IF_ERROR(store_->ReserveBytes(entry_.get(), bytes, "this turn"));
  reserved_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ByteReservation>> TurnLease::ReserveDetached(int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 0);
  KVL_RETURN_IF_ERROR(store_->ReserveBytes(entry_.get(), bytes, "a repair copy"));
  return std::unique_ptr<ByteReservation>(new ByteReservation(store_, bytes));
}

ByteReservation::~ByteReservation() {
  std::lock_guard<std::mutex> lock(store_->mu_);
  store_->reserved_bytes_ -= bytes_;
}

absl::Status CacheStore::ReserveBytes(const Entry* except, int64_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t budget = budget_bytes();
  while (total_bytes_ + reserved_bytes_ + bytes > budget) {
    if (!EvictOne(except)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache memory budget exhausted: ", what, " needs ", bytes, " more bytes; ",
          total_bytes_ + reserved_bytes_, " of ", budget,
          " bytes are held by sessions in use (sessions.memory_budget_bytes) and nothing idle "
          "is left to evict"));
    }
  }
  reserved_bytes_ += bytes;
  return absl::OkStatus();
}

bool TurnLease::HasForeignSpans(int model) const {
  const KvCache* line = entry_->lines[model].get();
  return line != nullptr && line->FirstForeignToken() >= 0;
}

void TurnLease::AddRepaired(int model, int64_t tokens) { repaired_[model] += tokens; }

void TurnLease::Commit(ConversationState next) {
  TORCH_CHECK(!committed_);
  {
    // View and List copy the state of a session in a turn under the mutex.
    std::lock_guard<std::mutex> lock(store_->mu_);
    std::swap(entry_->state, next);  // the old state is freed after unlocking
    for (size_t m = 0; m < repaired_.size(); ++m) entry_->repaired[m] += repaired_[m];
  }
  for (auto& line : replaced_) line.reset();  // superseded lines are freed
  committed_ = true;
}

bool IsValidSessionId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
           c == '-';
  });
}

bool IsValidStoreSessionId(std::string_view id) {
  const size_t slash = id.find('/');
  if (slash == std::string_view::npos) return IsValidSessionId(id);
  const std::string_view tenant = id.substr(0, slash);
  return !tenant.empty() && tenant.size() <= 64 &&
         std::all_of(tenant.begin(), tenant.end(),
                     [](char c) {
                       return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                              c == '_' || c == '-';
                     }) &&
         IsValidSessionId(id.substr(slash + 1));
}

std::string GenerateSessionId() {
  thread_local absl::BitGen bits;
  return absl::StrFormat("s-%016x%08x", absl::Uniform<uint64_t>(bits),
                         absl::Uniform<uint32_t>(bits));
}

CacheStore::CacheStore(const CacheStoreOptions& options)
    : options_(options), rng_(std::random_device{}()), bytes_per_model_(options.n_models, 0) {
  TORCH_CHECK(options.n_models >= 0);
  if (!options_.clock) options_.clock = WallClockSeconds;
}

CacheStore::~CacheStore() = default;

void CacheStore::SetModelGroups(std::vector<int> model_groups) {
  TORCH_CHECK(model_groups.empty() || static_cast<int>(model_groups.size()) == options_.n_models,
              "model groups for ", model_groups.size(), " models, the store has ",
              options_.n_models);
  std::lock_guard<std::mutex> lock(mu_);
  options_.model_groups = std::move(model_groups);
}

absl::StatusOr<SessionView> CacheStore::Create(std::string_view session_id,
                                               std::string system_prompt,
                                               std::vector<int64_t> preamble) {
  absl::StatusOr<std::shared_ptr<Entry>> made =
      NewEntry(session_id, std::move(system_prompt), std::move(preamble));
  if (!made.ok()) return made.status();
  std::shared_ptr<Entry> entry = *std::move(made);
  std::lock_guard<std::mutex> lock(mu_);
  std::string id(session_id);
  if (id.empty()) {
    id = NewId();
  } else if (sessions_.count(id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("session '", id, "' already exists"));
  }
  KVL_RETURN_IF_ERROR(CheckRoom(1));
  entry->seq = next_seq_++;
  by_seq_.emplace(entry->seq, id);
  SessionView view = ViewOf(id, *entry);
  sessions_.emplace(std::move(id), std::move(entry));
  return view;
}

absl::StatusOr<std::shared_ptr<CacheStore::Entry>> CacheStore::NewEntry(
    std::string_view session_id, std::string system_prompt, std::vector<int64_t> preamble) const {
  if (!session_id.empty() && !IsValidStoreSessionId(session_id)) {
    return absl::InvalidArgumentError(
        "session_id: expected 1-128 characters of [A-Za-z0-9._:-] (or empty to have one "
        "generated)");
  }
  auto entry = std::make_shared<Entry>(options_.n_models);
  entry->state.preamble = std::move(preamble);
  entry->system_prompt = std::move(system_prompt);
  entry->created_unix_seconds = entry->last_active_unix_seconds = options_.clock();
  return entry;
}

std::string CacheStore::NewId() {
  // 96 random bits: collisions are not a practical concern, but a taken id is
  // still never handed out twice.
  std::string id;
  do {
    id = absl::StrFormat("s-%016x%08x", rng_(), static_cast<uint32_t>(rng_()));
  } while (sessions_.count(id) != 0);
  return id;
}

absl::Status CacheStore::CheckRoom(int64_t n_more) const {
  const int64_t held = static_cast<int64_t>(sessions_.size());
  if (options_.max_sessions <= 0 || held + n_more <= options_.max_sessions) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the server holds ", held, " sessions (limits.max_sessions = ", options_.max_sessions,
      "); delete sessions or wait for idle ones to expire"));
}

absl::StatusOr<std::unique_ptr<SessionReservation>> CacheStore::Reserve(
    std::string_view session_id, std::string system_prompt, std::vector<int64_t> preamble,
    bool replace) {
  absl::StatusOr<std::shared_ptr<Entry>> made =
      NewEntry(session_id, std::move(system_prompt), std::move(preamble));
  if (!made.ok()) return made.status();
  std::shared_ptr<Entry> entry = *std::move(made);
  entry->staged = true;
  std::shared_ptr<Entry> replaced;  // its lines are freed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  std::string id(session_id);
  if (id.empty()) id = NewId();
  auto it = sessions_.find(id);
  if (it != sessions_.end()) {
    if (!replace || it->second->staged) {
      return absl::AlreadyExistsError(absl::StrCat("session '", id, "' already exists"));
    }
    if (it->second->busy) {
      return absl::AbortedError(
          absl::StrCat("session '", id, "' has a turn in progress; retry when it ends"));
    }
    // The staged session takes the id now (one entry per id); the copy it
    // replaces holds no turn and is only a copy.
    replaced = Erase(it);
  }
  KVL_RETURN_IF_ERROR(CheckRoom(1));
  const int64_t created = entry->created_unix_seconds;
  sessions_.emplace(id, entry);
  return std::unique_ptr<SessionReservation>(
      new SessionReservation(this, std::move(id), std::move(entry), created));
}

SessionView SessionReservation::Commit(std::string generation) {
  TORCH_CHECK(!committed_, "SessionReservation::Commit called twice");
  committed_ = true;
  std::lock_guard<std::mutex> lock(store_->mu_);
  TurnLease::Entry& e = *entry_;
  e.staged = false;
  e.generation = std::move(generation);
  e.seq = store_->next_seq_++;
  store_->by_seq_.emplace(e.seq, id_);
  return store_->ViewOf(id_, e);
}

SessionReservation::~SessionReservation() {
  if (committed_) return;
  std::shared_ptr<TurnLease::Entry> erased;  // its lines are freed after the lock is released
  std::lock_guard<std::mutex> lock(store_->mu_);
  auto it = store_->sessions_.find(id_);
  if (it != store_->sessions_.end() && it->second == entry_) erased = store_->Erase(it);
}

absl::StatusOr<SessionView> CacheStore::Adopt(const std::string& session_id,
                                              std::string system_prompt,
                                              ConversationState state,
                                              int64_t created_unix_seconds,
                                              std::string generation) {
  if (!IsValidStoreSessionId(session_id)) {
    return absl::InvalidArgumentError("session_id: expected 1-128 characters of [A-Za-z0-9._:-]");
  }
  auto entry = std::make_shared<Entry>(options_.n_models);
  state.restored = true;
  entry->state = std::move(state);
  entry->system_prompt = std::move(system_prompt);
  entry->created_unix_seconds = created_unix_seconds;
  entry->last_active_unix_seconds = options_.clock();
  entry->generation = std::move(generation);
  std::shared_ptr<Entry> replaced;  // its lines are freed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) {
    if (it->second->busy || it->second->staged) {
      return absl::AbortedError(
          absl::StrCat("session '", session_id, "' has a turn in progress; retry when it ends"));
    }
    const uint64_t seq = it->second->seq;
    replaced = Erase(it);
    entry->seq = seq;  // it keeps its place in List
  } else {
    KVL_RETURN_IF_ERROR(CheckRoom(1));
    entry->seq = next_seq_++;
  }
  by_seq_.emplace(entry->seq, session_id);
  SessionView view = ViewOf(session_id, *entry);
  sessions_.emplace(session_id, std::move(entry));
  return view;
}

std::shared_ptr<TurnLease::Entry> CacheStore::Erase(
    std::unordered_map<std::string, std::shared_ptr<Entry>>::iterator it) {
  std::shared_ptr<Entry> entry = std::move(it->second);
  by_seq_.erase(entry->seq);
  sessions_.erase(it);
  for (int m = 0; m < options_.n_models; ++m) SetLineBytes(*entry, m, 0);
  entry->removed = true;  // a busy session's lease frees its lines when it ends
  return entry;
}

absl::Status CacheStore::Remove(const std::string& session_id) {
  std::shared_ptr<Entry> erased;  // its lines are freed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second->staged) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  erased = Erase(it);
  return absl::OkStatus();
}

SessionView CacheStore::ViewOf(const std::string& id, const Entry& e) const {
  SessionView view;
  view.session_id = id;
  view.generation = e.generation;
  view.system_prompt = e.system_prompt;
  view.created_unix_seconds = e.created_unix_seconds;
  view.last_active_unix_seconds = e.last_active_unix_seconds;
  view.in_turn = e.busy;
  view.state = e.state;
  for (int m = 0; m < options_.n_models; ++m) {
    if (!e.served[m]) continue;
    view.lines.push_back({m, e.line_tokens[m], e.line_bytes[m], static_cast<bool>(e.evicted[m]),
                          e.line_translated[m], e.repaired[m], e.line_spans[m]});
  }
  return view;
}

absl::StatusOr<SessionView> CacheStore::View(const std::string& session_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second->staged) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  return ViewOf(it->first, *it->second);
}

absl::StatusOr<SessionPage> CacheStore::List(uint32_t page_size, std::string_view page_token,
                                             std::string_view id_prefix) const {
  if (page_size == 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  uint64_t start = 0;
  if (!page_token.empty()) {
    absl::string_view token(page_token.data(), page_token.size());
    if (!absl::ConsumePrefix(&token, kPageTokenPrefix) || !absl::SimpleAtoi(token, &start)) {
      return absl::InvalidArgumentError(
          "page_token: not a token returned by ListSessions (leave it empty for the first page)");
    }
  }
  SessionPage page;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = by_seq_.lower_bound(start); it != by_seq_.end(); ++it) {
    // Others' sessions are skipped before the page-full check, so that a
    // token is handed out only when one of the prefix's own follows.
    if (!absl::StartsWith(it->second, absl::string_view(id_prefix.data(), id_prefix.size()))) {
      continue;
    }
    if (page.sessions.size() == page_size) {
      page.next_page_token = absl::StrCat(kPageTokenPrefix, it->first);
      break;
    }
    page.sessions.push_back(ViewOf(it->second, *sessions_.at(it->second)));
  }
  return page;
}

int64_t CacheStore::CountWithPrefix(std::string_view prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [id, entry] : sessions_) {
    if (!entry->staged && absl::StartsWith(id, absl::string_view(prefix.data(), prefix.size())))
      ++n;
  }
  return n;
}

absl::Status CacheStore::Touch(const std::string& session_id) {
  const int64_t now = options_.clock();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second->staged) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  it->second->last_active_unix_seconds = now;
  return absl::OkStatus();
}

std::vector<std::string> CacheStore::RemoveIdle(int64_t idle_seconds) {
  const int64_t now = options_.clock();
  std::vector<std::string> removed;
  std::vector<std::shared_ptr<Entry>> erased;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  for (auto seq = by_seq_.begin(); seq != by_seq_.end();) {
    auto it = sessions_.find(seq->second);
    ++seq;  // Erase drops this entry of by_seq_
    const Entry& e = *it->second;
    if (!e.busy && now - e.last_active_unix_seconds >= idle_seconds) {
      removed.push_back(it->first);
      erased.push_back(Erase(it));
    }
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<TurnLease>> CacheStore::Begin(const std::string& session_id,
                                                             LeaseUse use) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
    }
    if (it->second->busy) {
      return absl::AbortedError(absl::StrCat(
          "session '", session_id, "' is already running a turn; retry when it has finished"));
    }
    entry = it->second;
    entry->busy = true;
    if (use == LeaseUse::kTurn) entry->last_active_unix_seconds = options_.clock();
  }
  return std::unique_ptr<TurnLease>(new TurnLease(this, session_id, std::move(entry), use));
}

void CacheStore::SetLineBytes(Entry& e, int model, int64_t bytes) {
  const int64_t delta = bytes - e.line_bytes[model];
  e.line_bytes[model] = bytes;
  bytes_per_model_[model] += delta;
  total_bytes_ += delta;
}

void CacheStore::Release(TurnLease* lease) {
  Entry& e = *lease->entry_;
  // Measured by the lease holder's thread, which still owns the lines.
  std::vector<int64_t> bytes(options_.n_models, 0), tokens(options_.n_models, 0),
      translated(options_.n_models, 0);
  std::vector<std::vector<LineSpanInfo>> spans(options_.n_models);
  for (int m = 0; m < options_.n_models; ++m) {
    if (e.lines[m] == nullptr) continue;
    bytes[m] = e.lines[m]->Bytes();
    tokens[m] = e.lines[m]->Length();
    for (const KvSpan& span : e.lines[m]->Spans()) {
      if (!span.native) translated[m] += span.t1 - span.t0;
    }
    // In the tokens of the model's own stream.
    const int group = options_.model_groups.empty() ? 0 : options_.model_groups[m];
    spans[m] = LineProvenance(e.lines[m]->Spans(), LedgerInRendering(e.state, group));
  }
  std::lock_guard<std::mutex> lock(mu_);
  reserved_bytes_ -= lease->reserved_;
  const uint64_t now = ++tick_;
  for (int m = 0; m < options_.n_models; ++m) {
    if (!e.removed) SetLineBytes(e, m, bytes[m]);
    e.line_tokens[m] = tokens[m];
    e.line_translated[m] = translated[m];
    e.line_spans[m] = std::move(spans[m]);
    if (e.lines[m] != nullptr) {
      e.served[m] = true;
      e.evicted[m] = false;
      e.last_use[m] = now;
    }
  }
  e.busy = false;
  if (lease->use_ == LeaseUse::kTurn) e.last_active_unix_seconds = options_.clock();
  if (e.removed) {
    for (auto& line : e.lines) line.reset();
  }
  while (total_bytes_ > options_.memory_budget_bytes && EvictOne(nullptr)) {
  }
}

bool CacheStore::EvictOne(const Entry* except) {
  Entry* victim = nullptr;
  int victim_model = -1;
  uint64_t oldest = UINT64_MAX;
  for (auto& [id, entry] : sessions_) {
    if (entry.get() == except || entry->busy) continue;
    for (int m = 0; m < options_.n_models; ++m) {
      if (entry->lines[m] != nullptr && entry->last_use[m] < oldest) {
        oldest = entry->last_use[m];
        victim = entry.get();
        victim_model = m;
      }
    }
  }
  if (victim == nullptr) return false;
  victim->lines[victim_model].reset();
  victim->evicted[victim_model] = true;
  victim->line_tokens[victim_model] = 0;
  victim->line_translated[victim_model] = 0;
  victim->line_spans[victim_model].clear();
  SetLineBytes(*victim, victim_model, 0);
  ++evictions_;
  return true;
}

CacheStoreStats CacheStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheStoreStats s;
  s.budget_bytes = options_.memory_budget_bytes;
  s.total_bytes = total_bytes_;
  s.bytes_per_model = bytes_per_model_;
  for (const auto& [id, e] : sessions_) {
    if (e->staged) continue;  // not a session yet
    ++s.sessions;
    for (int m = 0; m < options_.n_models; ++m) {
      if (e->evicted[m]) {
        ++s.sessions_with_evicted_lines;
        break;
      }
    }
  }
  s.lines_evicted_total = evictions_;
  return s;
}

}  // namespace kvl
