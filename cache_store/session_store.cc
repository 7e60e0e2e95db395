#include "cache_store/session_store.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache_store/session_store_backends.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using nlohmann::json;
using session_store_internal::Conflict;
using session_store_internal::DuplicateRequest;
using session_store_internal::NotFound;

int64_t WallClockSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// In the process: one map under one mutex.
class MemorySessionStore final : public SessionStore {
 public:
  explicit MemorySessionStore(const SessionStoreOptions& options) : options_(options) {
    if (!options_.clock) options_.clock = WallClockSeconds;
  }

  std::string Describe() const override { return "memory"; }
  absl::Status Ping() override { return absl::OkStatus(); }
  bool shared() const override { return false; }

  absl::Status Create(const SessionRecord& session) override {
    std::lock_guard<std::mutex> lock(mu_);
    Expire(session.session_id);
    if (sessions_.count(session.session_id) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("session_id: session ", session.session_id, " already exists"));
    }
    Entry& e = sessions_[session.session_id];
    e.record = session;
    e.record.last_active_unix_seconds = options_.clock();
    for (size_t i = 0; i < e.record.turns.size(); ++i) {
      if (!e.record.turns[i].request_id.empty()) e.requests[e.record.turns[i].request_id] = i;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<SessionRecord> Load(const std::string& session_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = Find(session_id);
    if (e == nullptr) return NotFound(session_id);
    return e->record;
  }

  absl::StatusOr<TurnCheck> Check(const std::string& session_id,
                                  const std::string& request_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = Find(session_id);
    if (e == nullptr) return NotFound(session_id);
    e->record.last_active_unix_seconds = options_.clock();
    TurnCheck check;
    check.turns = static_cast<int64_t>(e->record.turns.size());
    check.generation = e->record.generation;
    if (!request_id.empty()) {
      auto it = e->requests.find(request_id);
      if (it != e->requests.end()) check.replay = e->record.turns[it->second];
    }
    return check;
  }

  absl::Status AppendTurn(const std::string& session_id, int64_t expected_turns,
                          const TurnRecord& turn) override {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = Find(session_id);
    if (e == nullptr) return NotFound(session_id);
    if (!turn.request_id.empty() && e->requests.count(turn.request_id) > 0) {
      return DuplicateRequest(turn.request_id);
    }
    const int64_t turns = static_cast<int64_t>(e->record.turns.size());
    if (turns != expected_turns) return Conflict(session_id, expected_turns, turns);
    if (!turn.request_id.empty()) e->requests[turn.request_id] = e->record.turns.size();
    e->record.turns.push_back(turn);
    e->record.last_active_unix_seconds = options_.clock();
    return absl::OkStatus();
  }

  absl::Status Remove(const std::string& session_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (Find(session_id) == nullptr) return NotFound(session_id);
    sessions_.erase(session_id);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListIds(std::string_view prefix, std::string_view after,
                                                   int64_t limit) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> ids;
    for (const std::string& id : Matching(prefix)) {
      if (id > after) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    if (limit > 0 && static_cast<int64_t>(ids.size()) > limit) ids.resize(limit);
    return ids;
  }

  absl::StatusOr<int64_t> Count(std::string_view prefix) override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(Matching(prefix).size());
  }

 private:
  struct Entry {
    SessionRecord record;
    std::unordered_map<std::string, size_t> requests;  // request id -> index in turns
  };

  // Drops the session if its TTL has passed.
  void Expire(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.ttl_seconds <= 0) return;
    auto it = sessions_.find(session_id);
    if (it != sessions_.end() &&
        options_.clock() - it->second.record.last_active_unix_seconds >= options_.ttl_seconds) {
      sessions_.erase(it);
    }
  }
  // The unexpired ids beginning with `prefix` (expired ones are dropped).
  std::vector<std::string> Matching(std::string_view prefix) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> ids;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (options_.ttl_seconds > 0 &&
          options_.clock() - it->second.record.last_active_unix_seconds >= options_.ttl_seconds) {
        it = sessions_.erase(it);
        continue;
      }
      if (absl::StartsWith(it->first, absl::string_view(prefix.data(), prefix.size()))) {
        ids.push_back(it->first);
      }
      ++it;
    }
    return ids;
  }
  Entry* Find(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Expire(session_id);
    auto it = sessions_.find(session_id);
    return it == sessions_.end() ? nullptr : &it->second;
  }

  SessionStoreOptions options_;
  std::mutex mu_;
  std::unordered_map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

namespace session_store_internal {

absl::Status NotFound(const std::string& session_id) {
  return absl::NotFoundError(absl::StrCat("session_id: no session ", session_id));
}

absl::Status Conflict(const std::string& session_id, int64_t expected_turns, int64_t turns) {
  return absl::AbortedError(absl::StrCat(
      "session ", session_id, " committed turn ", turns, " while this turn ran on its ",
      expected_turns, " turns (another replica or call continued it); this turn was not "
      "committed: retry it"));
}

absl::Status DuplicateRequest(const std::string& request_id) {
  return absl::AlreadyExistsError(
      absl::StrCat("request_id: a turn with request id ", request_id, " is already committed"));
}

}  // namespace session_store_internal

bool TurnRecord::operator==(const TurnRecord& o) const {
  return request_id == o.request_id && user_message == o.user_message && reply == o.reply &&
         model == o.model && finish_reason == o.finish_reason &&
         unix_seconds == o.unix_seconds && history_begin == o.history_begin &&
         tokens == o.tokens && bounds == o.bounds && ledger == o.ledger &&
         tail_begin == o.tail_begin &&
         cascade_level == o.cascade_level && events == o.events;
}

std::string EncodeTurn(const TurnRecord& turn) {
  json ledger = json::array();
  for (const StoredSpan& s : turn.ledger) ledger.push_back({s.begin, s.end, s.model});
  const json j = {
      {"request_id", turn.request_id},
      {"user_message", absl::Base64Escape(turn.user_message)},
      {"reply", absl::Base64Escape(turn.reply)},
      {"model", turn.model},
      {"finish_reason", turn.finish_reason},
      {"unix_seconds", turn.unix_seconds},
      {"history_begin", turn.history_begin},
      {"tokens", turn.tokens},
      {"bounds", turn.bounds},
      {"ledger", std::move(ledger)},
      {"tail_begin", turn.tail_begin},
      {"cascade_level", turn.cascade_level},
      {"events", absl::Base64Escape(turn.events)},
  };
  return j.dump();
}

absl::StatusOr<TurnRecord> DecodeTurn(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError("stored turn: not a JSON object");
  }
  TurnRecord t;
  try {
    t.request_id = j.at("request_id").get<std::string>();
    t.model = j.at("model").get<std::string>();
    t.finish_reason = j.at("finish_reason").get<std::string>();
    t.unix_seconds = j.at("unix_seconds").get<int64_t>();
    t.history_begin = j.at("history_begin").get<int64_t>();
    t.tokens = j.at("tokens").get<std::vector<int64_t>>();
    if (j.contains("bounds")) t.bounds = j.at("bounds").get<std::vector<int64_t>>();
    for (const json& s : j.at("ledger")) {
      t.ledger.push_back(
          {s.at(0).get<int64_t>(), s.at(1).get<int64_t>(), s.at(2).get<std::string>()});
    }
    t.tail_begin = j.at("tail_begin").get<int64_t>();
    t.cascade_level = j.at("cascade_level").get<int>();
    if (!absl::Base64Unescape(j.at("user_message").get<std::string>(), &t.user_message) ||
        !absl::Base64Unescape(j.at("reply").get<std::string>(), &t.reply) ||
        !absl::Base64Unescape(j.at("events").get<std::string>(), &t.events)) {
      return absl::DataLossError("stored turn: malformed base64");
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("stored turn: ", e.what()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<SessionStore>> OpenSessionStore(
    const SessionStoreOptions& options) {
  if (options.backend == "memory") return std::make_unique<MemorySessionStore>(options);
  if (options.backend == "redis") return session_store_internal::OpenRedisSessionStore(options);
  return absl::InvalidArgumentError(absl::StrCat(
      "session store backend must be \"memory\" or \"redis\" (got \"", options.backend, "\")"));
}

}  // namespace kvl
