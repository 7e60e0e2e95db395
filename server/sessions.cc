#include "server/sessions.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
                                                  const std::vector<std::string>& model_names) {
  ConversationState state;
  state.preamble = record.preamble;
  for (const TurnRecord& turn : record.turns) {
    if (turn.history_begin != static_cast<int64_t>(state.history.size())) {
      return absl::DataLossError(absl::StrCat(
          "session ", record.session_id, ": stored turn ", state.turns + 1, " begins at token ",
          turn.history_begin, ", the turns before it end at ", state.history.size()));
    }
    state.history.insert(state.history.end(), turn.tokens.begin(), turn.tokens.end());
    ++state.turns;
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
  if (state.ledger.empty() ? !state.history.empty()
                           : state.ledger.back().end != static_cast<int64_t>(state.history.size())) {
    return absl::DataLossError(
        absl::StrCat("session ", record.session_id, ": the stored ledger ends before the history"));
  }
  state.last_model = ModelIndex(model_names, last.model);
  state.tail_begin = std::clamp<int64_t>(last.tail_begin, 0, state.history.size());
  state.cascade_level = last.cascade_level;
  return state;
}

Sessions::Sessions(CacheStore* cache, std::unique_ptr<SessionStore> store,
                   std::vector<std::string> model_names)
    : cache_(cache), store_(std::move(store)), model_names_(std::move(model_names)) {}

absl::StatusOr<SessionView> Sessions::Create(std::string_view session_id,
                                             std::string system_prompt,
                                             std::vector<int64_t> preamble) {
  absl::StatusOr<SessionView> view = cache_->Create(session_id, system_prompt, preamble);
  if (absl::IsAlreadyExists(view.status()) && store_->shared()) {
    // This replica's copy may be of a session deleted through another
    // replica: the store decides.
    const std::string id(session_id);
    if (absl::IsNotFound(store_->Check(id, "").status())) {
      cache_->Remove(id).IgnoreError();
      ForgetGeneration(id);
      view = cache_->Create(session_id, system_prompt, preamble);
    }
  }
  if (!view.ok()) return view.status();
  SessionRecord record;
  record.session_id = view->session_id;
  record.system_prompt = std::move(system_prompt);
  record.preamble = std::move(preamble);
  record.created_unix_seconds = view->created_unix_seconds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record.generation = absl::StrCat(absl::Hex(rng_(), absl::kZeroPad16));
  }
  if (absl::Status s = store_->Create(record); !s.ok()) {
    cache_->Remove(view->session_id).IgnoreError();
    return s;
  }
  SetGeneration(record.session_id, record.generation);
  return view;
}

absl::Status Sessions::Remove(const std::string& session_id) {
  const absl::Status stored = store_->Remove(session_id);
  if (!stored.ok() && !absl::IsNotFound(stored)) return stored;
  const absl::Status local = cache_->Remove(session_id);
  ForgetGeneration(session_id);
  return stored.ok() ? absl::OkStatus() : local;
}

bool Sessions::LocalIsCurrent(const std::string& session_id, const TurnCheck& check) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = generations_.find(session_id);
    if (it == generations_.end() || it->second != check.generation) return false;
  }
  absl::StatusOr<SessionView> local = cache_->View(session_id);
  return local.ok() && local->state.turns == check.turns;
}

void Sessions::SetGeneration(const std::string& session_id, std::string generation) {
  std::lock_guard<std::mutex> lock(mu_);
  generations_[session_id] = std::move(generation);
}

void Sessions::ForgetGeneration(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  generations_.erase(session_id);
}

absl::StatusOr<SessionView> Sessions::View(const std::string& session_id) {
  absl::StatusOr<SessionView> local = cache_->View(session_id);
  if (!store_->shared()) return local;
  absl::StatusOr<SessionRecord> record = store_->Load(session_id);
  if (!record.ok()) return record.status();
  TurnCheck current;
  current.turns = static_cast<int64_t>(record->turns.size());
  current.generation = record->generation;
  if (local.ok() && LocalIsCurrent(session_id, current)) return local;
  absl::StatusOr<ConversationState> state = StateFromRecord(*record, model_names_);
  if (!state.ok()) return state.status();
  SessionView view;
  view.session_id = session_id;
  view.system_prompt = record->system_prompt;
  view.created_unix_seconds = record->created_unix_seconds;
  view.last_active_unix_seconds = record->last_active_unix_seconds;
  view.state = *std::move(state);
  return view;
}

absl::StatusOr<SessionRecord> Sessions::Transcript(const std::string& session_id) {
  return store_->Load(session_id);
}

absl::StatusOr<std::optional<TurnRecord>> Sessions::Prepare(const std::string& session_id,
                                                            const std::string& request_id) {
  absl::StatusOr<TurnCheck> check = store_->Check(session_id, request_id);
  if (absl::IsNotFound(check.status())) {
    // Deleted or expired in the store (by another replica): gone here too.
    cache_->Remove(session_id).IgnoreError();
    ForgetGeneration(session_id);
    return check.status();
  }
  if (!check.ok()) return check.status();
  if (check->replay) return std::move(check->replay);
  cache_->Touch(session_id).IgnoreError();
  if (LocalIsCurrent(session_id, *check)) return std::nullopt;
  const bool had_copy = cache_->View(session_id).ok();

  absl::StatusOr<SessionRecord> record = store_->Load(session_id);
  if (!record.ok()) return record.status();
  absl::StatusOr<ConversationState> state = StateFromRecord(*record, model_names_);
  if (!state.ok()) return state.status();
  absl::StatusOr<SessionView> adopted =
      cache_->Adopt(session_id, record->system_prompt, *std::move(state),
                    record->created_unix_seconds);
  if (!adopted.ok()) return adopted.status();
  SetGeneration(session_id, record->generation);
  spdlog::info("session {}: restored from the session store ({} turns, {} tokens){}", session_id,
               record->turns.size(), adopted->state.history.size(),
               had_copy ? ", replacing an older copy" : "");
  return std::nullopt;
}

absl::Status Sessions::Record(const std::string& session_id, const ConversationState& before,
                              const ConversationState& after, TurnRecord turn) {
  turn.unix_seconds = NowSeconds();
  turn.history_begin = static_cast<int64_t>(before.history.size());
  turn.tokens.assign(after.history.begin() + before.history.size(), after.history.end());
  turn.ledger.clear();
  for (const LedgerSpan& span : after.ledger) {
    turn.ledger.push_back({span.begin, span.end,
                           span.model >= 0 && span.model < static_cast<int>(model_names_.size())
                               ? model_names_[span.model]
                               : std::string()});
  }
  turn.tail_begin = after.tail_begin;
  turn.cascade_level = after.cascade_level;
  absl::Status s = store_->AppendTurn(session_id, before.turns, turn);
  if (absl::IsAlreadyExists(s)) {
    // A retry of this request committed while this one ran.
    return absl::AbortedError(absl::StrCat(
        "request_id: a turn with request id ", turn.request_id,
        " was committed by another call while this one ran; this one was not committed: retry "
        "it to receive the committed turn's answer"));
  }
  return s;
}

std::vector<std::string> Sessions::RemoveIdle(int64_t idle_seconds) {
  std::vector<std::string> removed = cache_->RemoveIdle(idle_seconds);
  for (const std::string& id : removed) {
    ForgetGeneration(id);
    if (!store_->shared()) store_->Remove(id).IgnoreError();
  }
  return removed;
}

}  // namespace kvl::server
