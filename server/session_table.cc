#include "server/session_table.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace kvl::server {
namespace {

// Page tokens are opaque to clients; inside they hold the creation sequence
// number to resume from, so that deletions between pages cannot shift them.
constexpr absl::string_view kPageTokenPrefix = "p1.";

int64_t WallClockSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool IsValidSessionId(absl::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
           c == '-';
  });
}

SessionTable::SessionTable(Clock clock)
    : clock_(clock ? std::move(clock) : Clock(WallClockSeconds)), rng_(std::random_device{}()) {}

absl::StatusOr<SessionInfo> SessionTable::Create(absl::string_view session_id,
                                                 std::string system_prompt) {
  if (!session_id.empty() && !IsValidSessionId(session_id)) {
    return absl::InvalidArgumentError(
        "session_id: expected 1-128 characters of [A-Za-z0-9._:-] (or empty to have one "
        "generated)");
  }
  const int64_t now = clock_();
  absl::MutexLock lock(&mu_);
  std::string id(session_id);
  if (id.empty()) {
    // 96 random bits: collisions are not a practical concern, but a taken id is
    // still never handed out twice.
    do {
      id = absl::StrFormat("s-%016x%08x", rng_(), static_cast<uint32_t>(rng_()));
    } while (by_id_.count(id) != 0);
  } else if (by_id_.count(id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("session '", id, "' already exists"));
  }
  Entry entry{next_seq_++, SessionInfo{}};
  entry.info.session_id = id;
  entry.info.system_prompt = std::move(system_prompt);
  entry.info.created_unix_seconds = now;
  entry.info.last_active_unix_seconds = now;
  by_seq_.emplace(entry.seq, id);
  SessionInfo result = entry.info;
  by_id_.emplace(std::move(id), std::move(entry));
  return result;
}

absl::StatusOr<SessionInfo> SessionTable::Get(absl::string_view session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(std::string(session_id));
  if (it == by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  return it->second.info;
}

absl::Status SessionTable::Delete(absl::string_view session_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(std::string(session_id));
  if (it == by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  by_seq_.erase(it->second.seq);
  by_id_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<SessionPage> SessionTable::List(uint32_t page_size,
                                               absl::string_view page_token) const {
  if (page_size == 0) page_size = kDefaultPageSize;
  page_size = std::min(page_size, kMaxPageSize);
  uint64_t start = 0;
  if (!page_token.empty()) {
    if (!absl::ConsumePrefix(&page_token, kPageTokenPrefix) ||
        !absl::SimpleAtoi(page_token, &start)) {
      return absl::InvalidArgumentError(
          "page_token: not a token returned by ListSessions (leave it empty for the first page)");
    }
  }
  SessionPage page;
  absl::MutexLock lock(&mu_);
  for (auto it = by_seq_.lower_bound(start); it != by_seq_.end(); ++it) {
    if (page.sessions.size() == page_size) {
      page.next_page_token = absl::StrCat(kPageTokenPrefix, it->first);
      break;
    }
    page.sessions.push_back(by_id_.at(it->second).info);
  }
  return page;
}

absl::Status SessionTable::Touch(absl::string_view session_id) {
  const int64_t now = clock_();
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(std::string(session_id));
  if (it == by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  it->second.info.last_active_unix_seconds = now;
  return absl::OkStatus();
}

std::vector<std::string> SessionTable::RemoveIdle(int64_t idle_seconds) {
  const int64_t now = clock_();
  std::vector<std::string> removed;
  absl::MutexLock lock(&mu_);
  for (auto it = by_seq_.begin(); it != by_seq_.end();) {
    const SessionInfo& info = by_id_.at(it->second).info;
    if (now - info.last_active_unix_seconds >= idle_seconds) {
      removed.push_back(it->second);
      by_id_.erase(it->second);
      it = by_seq_.erase(it);
    } else {
      ++it;
    }
  }
  return removed;
}

size_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return by_id_.size();
}

}  // namespace kvl::server
