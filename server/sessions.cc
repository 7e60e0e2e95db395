#include "server/sessions.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"

namespace kvl::server {
namespace {

int ModelIndex(const std::vector<std::string>& names, const std::string& name) {
  auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? -1 : static_cast<int>(it - names.begin());
}

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<ConversationState> StateFromRecord(const SessionRecord& record,
                                                  const std::vector<std::string>& model_names,
                                                  const std::vector<const Tokenizer*>& tokenizers,
                                                  const std::vector<int>& model_groups) {
  ConversationState state;
  state.preamble = record.preamble;
  for (const TurnRecord& turn : record.turns) {
    if (turn.history_begin != static_cast<int64_t>(state.history.size())) {
      return absl::DataLossError(absl::StrCat(
          "session ", record.session_id, ": stored turn ", state.turns + 1, " begins at token ",
          turn.history_begin, ", the turns before it end at ", state.history.size()));
    }
    const int64_t end = turn.history_begin + static_cast<int64_t>(turn.tokens.size());
    if (turn.bounds.empty()) {
      state.bounds.push_back(turn.history_begin);  // one segment (an older record)
    }
    for (int64_t b : turn.bounds) {
      if (b < turn.history_begin || b > end || (!state.bounds.empty() && b < state.bounds.back())) {
        return absl::DataLossError(absl::StrCat("session ", record.session_id, ": stored turn ",
                                                state.turns + 1, " has a segment at token ", b,
                                                " outside its tokens"));
      }
      state.bounds.push_back(b);
    }
    state.history.insert(state.history.end(), turn.tokens.begin(), turn.tokens.end());
    ++state.turns;
  }
  // The other tokenizers' renderings, segment by segment from the text.
  for (size_t g = 1; g < tokenizers.size(); ++g) {
    Rendering r;
    for (size_t k = 0; k < state.bounds.size(); ++k) {
      const int64_t b = state.bounds[k];
      const int64_t e = k + 1 < state.bounds.size() ? state.bounds[k + 1]
                                                    : static_cast<int64_t>(state.history.size());
      r.bounds.push_back(static_cast<int64_t>(r.ids.size()));
      const std::string text = tokenizers[0]->Decode(
          std::vector<int32_t>(state.history.begin() + b, state.history.begin() + e));
      for (int32_t id : tokenizers[g]->Encode(text, /*parse_special=*/true)) r.ids.push_back(id);
    }
    state.renderings.push_back(std::move(r));
  }
  if (record.turns.empty()) return state;
  const TurnRecord& last = record.turns.back();
  for (const StoredSpan& span : last.ledger) {
    if (span.begin < 0 || span.end > static_cast<int64_t>(state.history.size()) ||
        (state.ledger.empty() ? span.begin != 0 : span.begin != state.ledger.back().end)) {
      return absl::DataLossError(
          absl::StrCat("session ", record.session_id, ": the stored ledger does not cover the "
                                                      "history in order"));
    }
    AppendLedgerSpan(&state.ledger, span.begin, span.end, ModelIndex(model_names, span.model));
  }
  if (state.ledger.empty()
          ? !state.history.empty()
          : state.ledger.back().end != static_cast<int64_t>(state.history.size())) {
    return absl::DataLossError(
        absl::StrCat("session ", record.session_id, ": the stored ledger ends before the history"));
  }
  state.last_model = ModelIndex(model_names, last.model);
  // In the last model's own tokens (its group's stream).
  const int last_group = state.last_model >= 0 && !model_groups.empty() &&
                                 model_groups[state.last_model] <
                                     static_cast<int>(state.renderings.size()) + 1
                             ? model_groups[state.last_model]
                             : 0;
  state.tail_begin = std::clamp<int64_t>(
      last.tail_begin, 0, static_cast<int64_t>(StreamIds(state, last_group).size()));
  state.cascade_level = last.cascade_level;
  return state;
}

Sessions::Sessions(CacheStore* cache, std::unique_ptr<SessionStore> store,
                   std::vector<std::string> model_names)
    : cache_(cache), store_(std::move(store)), model_names_(std::move(model_names)) {}

void Sessions::SetTokenizerGroups(std::vector<int> model_groups,
                                  std::vector<const Tokenizer*> tokenizers) {
  model_groups_ = std::move(model_groups);
  tokenizers_ = tokenizers.size() > 1 ? std::move(tokenizers) : std::vector<const Tokenizer*>{};
}

std::string Sessions::NewGeneration() {
  std::lock_guard<std::mutex> lock(mu_);
  return absl::StrCat(absl::Hex(rng_(), absl::kZeroPad16));
}

absl::StatusOr<SessionView> Sessions::Create(std::string_view session_id,
                                             std::string system_prompt,
                                             std::vector<int64_t> preamble,
                                             const Populate& populate) {
  // With a shared store, a local copy under the id may be of a session
  // deleted through another replica: the store decides, and only a copy of
  // nothing is replaced.
  bool replace = false;
  if (store_->shared() && !session_id.empty() && cache_->View(std::string(session_id)).ok()) {
    absl::Status in_store = store_->Check(std::string(session_id), "").status();
    if (in_store.ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("session_id: session ", std::string(session_id), " already exists"));
    }
    if (!absl::IsNotFound(in_store)) return in_store;
    replace = true;
  }
  SessionRecord record;
  record.system_prompt = system_prompt;
  record.preamble = preamble;
  absl::StatusOr<std::unique_ptr<SessionReservation>> reservation =
      cache_->Reserve(session_id, std::move(system_prompt), std::move(preamble), replace);
  if (!reservation.ok()) return reservation.status();
  record.session_id = (*reservation)->session_id();
  record.created_unix_seconds = (*reservation)->created_unix_seconds();
  record.generation = NewGeneration();
  if (populate) {
    KVL_RETURN_IF_ERROR(populate(record.session_id, &record.turns));
  }
  KVL_RETURN_IF_ERROR(store_->Create(record));
  return (*reservation)->Commit(std::move(record.generation));
}

Sessions::Populate Sessions::ForkOf(const std::string& source_id, int64_t turns) {
  return [this, source_id, turns](const std::string& session_id,
                                  std::vector<TurnRecord>* out) -> absl::Status {
    absl::StatusOr<SessionRecord> record = store_->Load(source_id);
    if (!record.ok()) return record.status();
    if (turns > static_cast<int64_t>(record->turns.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("session ", source_id, " has ", record->turns.size(),
                       " turns; a fork of its first ", turns, " was asked for"));
    }
    record->turns.resize(static_cast<size_t>(turns));
    absl::StatusOr<ConversationState> state = StateFromRecord(*record, model_names_, tokenizers_, model_groups_);
    if (!state.ok()) return state.status();
    absl::StatusOr<std::unique_ptr<TurnLease>> staged = cache_->Begin(session_id);
    if (!staged.ok()) return staged.status();
    absl::StatusOr<std::unique_ptr<TurnLease>> source =
        cache_->Begin(source_id, LeaseUse::kBackground);
    if (!source.ok() && !absl::IsNotFound(source.status())) return source.status();
    for (int m = 0; source.ok() && m < static_cast<int>(model_names_.size()); ++m) {
      // A model's line holds its group's stream: the source's line is the
      // fork's only if the source's stream begins with the fork's (a copy of
      // another generation does not; nor a rendering rebuilt from the text
      // where the model's reply was its own tokens).
      const int group = model_groups_.empty() ? 0 : model_groups_[m];
      const ConversationState& held_state = (*source)->state();
      if (group > static_cast<int>(held_state.renderings.size()) ||
          group > static_cast<int>(state->renderings.size())) {
        continue;
      }
      const std::vector<int64_t>& stream = StreamIds(*state, group);
      const std::vector<int64_t>& held = StreamIds(held_state, group);
      if (held.size() < stream.size() || !std::equal(stream.begin(), stream.end(), held.begin())) {
        continue;
      }
      const int64_t n = static_cast<int64_t>(stream.size());
      {
        const KvCache* line = (*source)->line(m);
        if (line == nullptr || line->Length() == 0) continue;
        // Not from inside a thin translated span: the fork's next turn
        // fills in what its copy lacks.
        const int64_t keep = line->ExtendablePrefix(std::min(line->Length(), n));
        absl::StatusOr<std::unique_ptr<KvCache>> copy = line->ClonePrefix(keep, keep);
        if (!copy.ok()) return copy.status();
        KVL_RETURN_IF_ERROR((*staged)->Reserve((*copy)->Bytes()));
        (*staged)->ReplaceLine(m, *std::move(copy));
      }
    }
    (*staged)->Commit(*std::move(state));
    *out = std::move(record->turns);
    return absl::OkStatus();
  };
}

absl::Status Sessions::Remove(const std::string& session_id) {
  const absl::Status stored = store_->Remove(session_id);
  if (!stored.ok() && !absl::IsNotFound(stored)) return stored;
  const absl::Status local = cache_->Remove(session_id);
  return stored.ok() ? absl::OkStatus() : local;
}

std::optional<SessionView> Sessions::CurrentLocal(const std::string& session_id,
                                                  const TurnCheck& check) {
  absl::StatusOr<SessionView> local = cache_->View(session_id);
  if (!local.ok() || local->generation != check.generation || local->state.turns != check.turns) {
    return std::nullopt;
  }
  return *std::move(local);
}

absl::StatusOr<SessionView> Sessions::View(const std::string& session_id) {
  if (!store_->shared()) return cache_->View(session_id);
  absl::StatusOr<SessionRecord> record = store_->Load(session_id);
  if (!record.ok()) return record.status();
  TurnCheck current;
  current.turns = static_cast<int64_t>(record->turns.size());
  current.generation = record->generation;
  if (std::optional<SessionView> local = CurrentLocal(session_id, current)) return *local;
  absl::StatusOr<ConversationState> state = StateFromRecord(*record, model_names_, tokenizers_, model_groups_);
  if (!state.ok()) return state.status();
  SessionView view;
  view.session_id = session_id;
  view.generation = record->generation;
  view.system_prompt = record->system_prompt;
  view.created_unix_seconds = record->created_unix_seconds;
  view.last_active_unix_seconds = record->last_active_unix_seconds;
  view.state = *std::move(state);
  return view;
}

namespace {
// Tokens of the shared-store listing: the last id of the page before.
constexpr absl::string_view kAfterToken = "after:";
}  // namespace

absl::StatusOr<SessionPage> Sessions::List(uint32_t page_size, std::string_view page_token,
                                           std::string_view id_prefix) {
  if (!store_->shared()) return cache_->List(page_size, page_token, id_prefix);
  if (page_size == 0) page_size = CacheStore::kDefaultPageSize;
  page_size = std::min(page_size, CacheStore::kMaxPageSize);
  absl::string_view after(page_token.data(), page_token.size());
  if (!after.empty() && (!absl::ConsumePrefix(&after, kAfterToken) ||
                         !IsValidStoreSessionId(std::string_view(after.data(), after.size())) ||
                         !absl::StartsWith(after, absl::string_view(id_prefix.data(),
                                                                    id_prefix.size())))) {
    return absl::InvalidArgumentError(
        "page_token: not a token returned by ListSessions (leave it empty for the first page)");
  }
  // One more than a page: whether another page follows.
  absl::StatusOr<std::vector<std::string>> ids =
      store_->ListIds(id_prefix, std::string_view(after.data(), after.size()), page_size + 1);
  if (!ids.ok()) return ids.status();
  SessionPage page;
  for (size_t i = 0; i < ids->size() && i < page_size; ++i) {
    absl::StatusOr<SessionView> view = View((*ids)[i]);
    if (absl::IsNotFound(view.status())) continue;  // deleted since it was listed
    if (!view.ok()) return view.status();
    page.sessions.push_back(*std::move(view));
  }
  if (ids->size() > page_size) {
    page.next_page_token = absl::StrCat(kAfterToken, (*ids)[page_size - 1]);
  }
  return page;
}

absl::StatusOr<int64_t> Sessions::Count(std::string_view id_prefix) {
  if (!store_->shared()) return cache_->CountWithPrefix(id_prefix);
  return store_->Count(id_prefix);
}

absl::StatusOr<SessionRecord> Sessions::Transcript(const std::string& session_id) {
  return store_->Load(session_id);
}

absl::StatusOr<std::optional<TurnRecord>> Sessions::Prepare(const std::string& session_id,
                                                            const std::string& request_id) {
  absl::StatusOr<TurnCheck> check = store_->Check(session_id, request_id);
  if (absl::IsNotFound(check.status())) {
    // Deleted or expired in the store (by another replica): the copy here is
    // of nothing.
    cache_->Remove(session_id).IgnoreError();
    return check.status();
  }
  if (!check.ok()) return check.status();
  if (check->replay) return std::move(check->replay);
  cache_->Touch(session_id).IgnoreError();
  if (CurrentLocal(session_id, *check)) return std::nullopt;
  const bool had_copy = cache_->View(session_id).ok();

  absl::StatusOr<SessionRecord> record = store_->Load(session_id);
  if (!record.ok()) return record.status();
  absl::StatusOr<ConversationState> state = StateFromRecord(*record, model_names_, tokenizers_, model_groups_);
  if (!state.ok()) return state.status();
  absl::StatusOr<SessionView> adopted =
      cache_->Adopt(session_id, record->system_prompt, *std::move(state),
                    record->created_unix_seconds, record->generation);
  if (!adopted.ok()) return adopted.status();
  spdlog::info("session {}: restored from the session store ({} turns, {} tokens){}", session_id,
               record->turns.size(), adopted->state.history.size(),
               had_copy ? ", replacing an older copy" : "");
  return std::nullopt;
}

TurnRecord Sessions::CompleteTurn(const ConversationState& before, const ConversationState& after,
                                  TurnRecord turn) const {
  turn.unix_seconds = NowSeconds();
  turn.history_begin = static_cast<int64_t>(before.history.size());
  turn.tokens.assign(after.history.begin() + before.history.size(), after.history.end());
  turn.bounds.assign(after.bounds.begin() + std::min(before.bounds.size(), after.bounds.size()),
                     after.bounds.end());
  turn.ledger.clear();
  for (const LedgerSpan& span : after.ledger) {
    turn.ledger.push_back({span.begin, span.end,
                           span.model >= 0 && span.model < static_cast<int>(model_names_.size())
                               ? model_names_[span.model]
                               : std::string()});
  }
  turn.tail_begin = after.tail_begin;
  turn.cascade_level = after.cascade_level;
  return turn;
}

absl::Status Sessions::Record(const std::string& session_id, const ConversationState& before,
                              const ConversationState& after, TurnRecord turn) {
  const std::string request_id = turn.request_id;
  absl::Status s =
      store_->AppendTurn(session_id, before.turns, CompleteTurn(before, after, std::move(turn)));
  if (absl::IsAlreadyExists(s)) {
    // A retry of this request committed while this one ran.
    return absl::AbortedError(absl::StrCat(
        "request_id: a turn with request id ", request_id,
        " was committed by another call while this one ran; this one was not committed: retry "
        "it to receive the committed turn's answer"));
  }
  return s;
}

std::vector<std::string> Sessions::RemoveIdle(int64_t idle_seconds) {
  std::vector<std::string> removed = cache_->RemoveIdle(idle_seconds);
  if (!store_->shared()) {
    // The in-process store's sessions live as long as this replica's copies.
    for (const std::string& id : removed) store_->Remove(id).IgnoreError();
  }
  return removed;
}

}  // namespace kvl::server
