// The Redis backend of SessionStore (hiredis, synchronous).
//
// Keys of one session share a hash tag, so that a Redis Cluster keeps them on
// one shard and the scripts below may touch them together:
//   <prefix>{<id>}:meta   hash: system_prompt, preamble (JSON array), created,
//                         last_active, turns (the committed count)
//   <prefix>{<id>}:turns  list: one EncodeTurn JSON string per committed turn
//   <prefix>{<id>}:req    hash: request id -> index in :turns
// Every change is one Lua script (EVAL), so it is atomic; AppendTurn is a
// compare-and-set on `turns`. Listing and counting SCAN for the :meta keys. The TTL is set on all three keys at each change
// and each Check.
//
// Connections: a small pool; a connection that fails is dropped and the call
// answers Unavailable, the next call connects afresh, so the store recovers
// on its own when Redis comes back.
#include <hiredis/hiredis.h>

#include <sys/time.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache_store/session_store_backends.h"
#include "nlohmann/json.hpp"

namespace kvl::session_store_internal {
namespace {

// ARGV[6..]: the turns, as pairs of EncodeTurn JSON and request id.
constexpr char kCreateScript[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
local n = (#ARGV - 5) / 2
redis.call('HSET', KEYS[1], 'system_prompt', ARGV[1], 'preamble', ARGV[2], 'created', ARGV[3],
           'last_active', ARGV[3], 'turns', n, 'generation', ARGV[5])
for i = 0, n - 1 do
  redis.call('RPUSH', KEYS[2], ARGV[6 + 2 * i])
  if ARGV[7 + 2 * i] ~= '' then redis.call('HSET', KEYS[3], ARGV[7 + 2 * i], i) end
end
local ttl = tonumber(ARGV[4])
if ttl > 0 then for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end end
return 1
)lua";

constexpr char kLoadScript[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return {redis.call('HMGET', KEYS[1], 'system_prompt', 'preamble', 'created', 'last_active',
                   'turns', 'generation'),
        redis.call('LRANGE', KEYS[2], 0, -1)}
)lua";

constexpr char kCheckScript[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'last_active', ARGV[2])
local ttl = tonumber(ARGV[3])
if ttl > 0 then for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end end
local n = tonumber(redis.call('HGET', KEYS[1], 'turns'))
local generation = redis.call('HGET', KEYS[1], 'generation') or ''
local replay = false
if ARGV[1] ~= '' then
  local index = redis.call('HGET', KEYS[3], ARGV[1])
  if index then replay = redis.call('LINDEX', KEYS[2], tonumber(index)) end
end
return {n, generation, replay}
)lua";

// Returns {status, turns}: status 1 committed, -1 no session, -2 duplicate
// request id, -3 another turn committed first.
constexpr char kAppendScript[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
if ARGV[3] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[3]) == 1 then return {-2, 0} end
local n = tonumber(redis.call('HGET', KEYS[1], 'turns'))
if n ~= tonumber(ARGV[1]) then return {-3, n} end
redis.call('RPUSH', KEYS[2], ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[3], n) end
redis.call('HSET', KEYS[1], 'turns', n + 1, 'last_active', ARGV[4])
local ttl = tonumber(ARGV[5])
if ttl > 0 then for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end end
return {1, n + 1}
)lua";

constexpr char kRemoveScript[] = R"lua(
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return existed
)lua";

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

std::string ReplyString(const redisReply* r) {
  return r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
             ? std::string(r->str, r->len)
             : std::string();
}

absl::StatusOr<int64_t> ReplyInt(const redisReply* r, const char* what) {
  if (r != nullptr && r->type == REDIS_REPLY_INTEGER) return static_cast<int64_t>(r->integer);
  int64_t v = 0;
  if (r != nullptr && r->type == REDIS_REPLY_STRING && absl::SimpleAtoi(ReplyString(r), &v)) {
    return v;
  }
  return absl::DataLossError(absl::StrCat("redis session store: ", what, " is not an integer"));
}

class RedisSessionStore final : public SessionStore {
 public:
  RedisSessionStore(const SessionStoreOptions& options, std::string host, int port)
      : options_(options), host_(std::move(host)), port_(port) {
    if (!options_.clock) {
      options_.clock = [] {
        struct timeval tv;
        gettimeofday(&tv, nullptr);
        return static_cast<int64_t>(tv.tv_sec);
      };
    }
  }

  std::string Describe() const override { return absl::StrCat("redis ", host_, ":", port_); }
  bool shared() const override { return true; }

  absl::Status Ping() override {
    absl::StatusOr<Reply> r = Command({"PING"}, /*idempotent=*/true);
    return r.status();
  }

  absl::Status Create(const SessionRecord& session) override {
    std::vector<std::string> args = {session.system_prompt,
                                     nlohmann::json(session.preamble).dump(),
                                     absl::StrCat(options_.clock()),
                                     absl::StrCat(options_.ttl_seconds), session.generation};
    for (const TurnRecord& turn : session.turns) {
      args.push_back(EncodeTurn(turn));
      args.push_back(turn.request_id);
    }
    absl::StatusOr<Reply> r =
        Eval(kCreateScript, session.session_id, std::move(args), /*idempotent=*/false);
    if (!r.ok()) return r.status();
    absl::StatusOr<int64_t> created = ReplyInt(r->get(), "create's answer");
    if (!created.ok()) return created.status();
    if (*created == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("session_id: session ", session.session_id, " already exists"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<SessionRecord> Load(const std::string& session_id) override {
    absl::StatusOr<Reply> r = Eval(kLoadScript, session_id, {}, /*idempotent=*/true);
    if (!r.ok()) return r.status();
    const redisReply* top = r->get();
    if (top->type == REDIS_REPLY_NIL) return NotFound(session_id);
    if (top->type != REDIS_REPLY_ARRAY || top->elements != 2 ||
        top->element[0]->type != REDIS_REPLY_ARRAY || top->element[0]->elements != 6 ||
        top->element[1]->type != REDIS_REPLY_ARRAY) {
      return Corrupt(session_id, "unexpected reply shape");
    }
    const redisReply* meta = top->element[0];
    SessionRecord record;
    record.session_id = session_id;
    record.system_prompt = ReplyString(meta->element[0]);
    const nlohmann::json preamble =
        nlohmann::json::parse(ReplyString(meta->element[1]), nullptr, false);
    if (!preamble.is_array()) return Corrupt(session_id, "preamble");
    for (const nlohmann::json& id : preamble) {
      if (!id.is_number_integer()) return Corrupt(session_id, "preamble");
      record.preamble.push_back(id.get<int64_t>());
    }
    absl::StatusOr<int64_t> created = ReplyInt(meta->element[2], "created");
    absl::StatusOr<int64_t> active = ReplyInt(meta->element[3], "last_active");
    absl::StatusOr<int64_t> turns = ReplyInt(meta->element[4], "turns");
    if (!created.ok() || !active.ok() || !turns.ok()) return Corrupt(session_id, "meta");
    record.created_unix_seconds = *created;
    record.last_active_unix_seconds = *active;
    record.generation = ReplyString(meta->element[5]);
    const redisReply* list = top->element[1];
    if (static_cast<int64_t>(list->elements) != *turns) {
      return Corrupt(session_id, absl::StrCat(list->elements, " turns stored, ", *turns,
                                              " counted"));
    }
    for (size_t i = 0; i < list->elements; ++i) {
      absl::StatusOr<TurnRecord> turn = DecodeTurn(ReplyString(list->element[i]));
      if (!turn.ok()) return Corrupt(session_id, turn.status().message());
      record.turns.push_back(*std::move(turn));
    }
    return record;
  }

  absl::StatusOr<TurnCheck> Check(const std::string& session_id,
                                  const std::string& request_id) override {
    absl::StatusOr<Reply> r =
        Eval(kCheckScript, session_id,
             {request_id, absl::StrCat(options_.clock()), absl::StrCat(options_.ttl_seconds)},
             /*idempotent=*/true);
    if (!r.ok()) return r.status();
    const redisReply* top = r->get();
    if (top->type == REDIS_REPLY_NIL) return NotFound(session_id);
    if (top->type != REDIS_REPLY_ARRAY || top->elements < 1) {
      return Corrupt(session_id, "unexpected reply shape");
    }
    TurnCheck check;
    absl::StatusOr<int64_t> turns = ReplyInt(top->element[0], "turns");
    if (!turns.ok()) return turns.status();
    check.turns = *turns;
    if (top->elements > 1) check.generation = ReplyString(top->element[1]);
    if (top->elements > 2 && top->element[2]->type == REDIS_REPLY_STRING) {
      absl::StatusOr<TurnRecord> turn = DecodeTurn(ReplyString(top->element[2]));
      if (!turn.ok()) return Corrupt(session_id, turn.status().message());
      check.replay = *std::move(turn);
    }
    return check;
  }

  absl::Status AppendTurn(const std::string& session_id, int64_t expected_turns,
                          const TurnRecord& turn) override {
    absl::StatusOr<Reply> r =
        Eval(kAppendScript, session_id,
             {absl::StrCat(expected_turns), EncodeTurn(turn), turn.request_id,
              absl::StrCat(options_.clock()), absl::StrCat(options_.ttl_seconds)},
             /*idempotent=*/false);
    if (!r.ok()) return r.status();
    const redisReply* top = r->get();
    if (top->type != REDIS_REPLY_ARRAY || top->elements != 2) {
      return Corrupt(session_id, "unexpected reply shape");
    }
    absl::StatusOr<int64_t> code = ReplyInt(top->element[0], "append's answer");
    absl::StatusOr<int64_t> turns = ReplyInt(top->element[1], "turns");
    if (!code.ok() || !turns.ok()) return Corrupt(session_id, "append's answer");
    switch (*code) {
      case 1:
        return absl::OkStatus();
      case -1:
        return NotFound(session_id);
      case -2:
        return DuplicateRequest(turn.request_id);
      default:
        return Conflict(session_id, expected_turns, *turns);
    }
  }

  absl::Status Remove(const std::string& session_id) override {
    absl::StatusOr<Reply> r = Eval(kRemoveScript, session_id, {}, /*idempotent=*/false);
    if (!r.ok()) return r.status();
    absl::StatusOr<int64_t> existed = ReplyInt(r->get(), "remove's answer");
    if (!existed.ok()) return existed.status();
    return *existed == 1 ? absl::OkStatus() : NotFound(session_id);
  }

  absl::StatusOr<std::vector<std::string>> ListIds(std::string_view prefix, std::string_view after,
                                                   int64_t limit) override {
    absl::StatusOr<std::vector<std::string>> ids = Matching(prefix);
    if (!ids.ok()) return ids.status();
    std::vector<std::string> out;
    for (std::string& id : *ids) {
      if (id > after) out.push_back(std::move(id));
    }
    std::sort(out.begin(), out.end());
    if (limit > 0 && static_cast<int64_t>(out.size()) > limit) out.resize(limit);
    return out;
  }

  absl::StatusOr<int64_t> Count(std::string_view prefix) override {
    absl::StatusOr<std::vector<std::string>> ids = Matching(prefix);
    if (!ids.ok()) return ids.status();
    return static_cast<int64_t>(ids->size());
  }

 private:
  // The ids of the sessions whose id begins with `prefix`, unordered: a SCAN
  // of the whole keyspace for their :meta keys (Redis expires them by TTL, so
  // no index has to be kept in step).
  absl::StatusOr<std::vector<std::string>> Matching(std::string_view prefix) {
    const std::string head = absl::StrCat(options_.key_prefix, "{");
    const std::string pattern = absl::StrCat(GlobEscape(head), GlobEscape(prefix), "*}:meta");
    std::set<std::string> ids;  // SCAN may return a key more than once
    std::string cursor = "0";
    do {
      absl::StatusOr<Reply> r =
          Command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}, /*idempotent=*/true);
      if (!r.ok()) return r.status();
      const redisReply* top = r->get();
      if (top->type != REDIS_REPLY_ARRAY || top->elements != 2 ||
          top->element[1]->type != REDIS_REPLY_ARRAY) {
        return absl::DataLossError(
            absl::StrCat("session store ", Describe(), ": unexpected SCAN reply"));
      }
      cursor = ReplyString(top->element[0]);
      for (size_t i = 0; i < top->element[1]->elements; ++i) {
        const std::string text = ReplyString(top->element[1]->element[i]);
        absl::string_view key = text;
        // <prefix>{<id>}:meta
        if (absl::ConsumePrefix(&key, head) && absl::ConsumeSuffix(&key, "}:meta")) {
          ids.emplace(key);
        }
      }
    } while (cursor != "0" && !cursor.empty());
    return std::vector<std::string>(ids.begin(), ids.end());
  }

  static std::string GlobEscape(std::string_view text) {
    std::string out;
    for (char c : text) {
      if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    return out;
  }

  absl::Status Corrupt(const std::string& session_id, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("session store ", Describe(), ": session ",
                                            session_id, " is malformed (", what, ")"));
  }

  std::string Key(const std::string& session_id, const char* part) const {
    return absl::StrCat(options_.key_prefix, "{", session_id, "}:", part);
  }

  // `idempotent`: the command changes nothing, or nothing twice (it may be
  // sent again on a fresh connection when a pooled one turns out broken).
  absl::StatusOr<Reply> Eval(const char* script, const std::string& session_id,
                             std::vector<std::string> args, bool idempotent) {
    std::vector<std::string> argv = {"EVAL", script, "3", Key(session_id, "meta"),
                                     Key(session_id, "turns"), Key(session_id, "req")};
    for (std::string& a : args) argv.push_back(std::move(a));
    return Command(argv, idempotent);
  }

  // Runs one command on a pooled connection. Unavailable when Redis cannot be
  // reached or answers with an error (a broken connection is dropped). An
  // idempotent command that fails on a pooled connection (e.g. after Redis
  // restarted) is tried once more on a fresh one.
  absl::StatusOr<Reply> Command(const std::vector<std::string>& argv, bool idempotent) {
    bool reused = false;
    absl::StatusOr<Reply> reply = CommandOnce(argv, &reused);
    if (!reply.ok() && reused && idempotent) reply = CommandOnce(argv, &reused);
    return reply;
  }

  absl::StatusOr<Reply> CommandOnce(const std::vector<std::string>& argv, bool* reused) {
    absl::StatusOr<Context> c = Acquire(reused);
    if (!c.ok()) return c.status();
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& a : argv) {
      ptrs.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply reply(static_cast<redisReply*>(redisCommandArgv(
        c->get(), static_cast<int>(argv.size()), ptrs.data(), lens.data())));
    if (reply == nullptr) {
      // The connection is broken (and, after a Redis restart, so is every
      // idle one): drop them all, so that the next call connects afresh.
      {
        std::lock_guard<std::mutex> lock(mu_);
        idle_.clear();
      }
      return absl::UnavailableError(absl::StrCat("session store ", Describe(), ": ",
                                                 (*c)->errstr[0] ? (*c)->errstr : "no reply"));
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      // Redis answered (e.g. loading, out of memory, read-only replica): the
      // connection is fine, the command did not run.
      std::string error = ReplyString(reply.get());
      Release(*std::move(c));
      return absl::UnavailableError(absl::StrCat("session store ", Describe(), ": ", error));
    }
    Release(*std::move(c));
    return reply;
  }

  // A pooled connection (*reused = true) or a new one.
  absl::StatusOr<Context> Acquire(bool* reused) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        Context c = std::move(idle_.back());
        idle_.pop_back();
        *reused = true;
        return c;
      }
    }
    *reused = false;
    struct timeval tv;
    tv.tv_sec = options_.timeout_ms / 1000;
    tv.tv_usec = (options_.timeout_ms % 1000) * 1000;
    Context c(redisConnectWithTimeout(host_.c_str(), port_, tv));
    if (c == nullptr || c->err != 0) {
      return absl::UnavailableError(absl::StrCat("session store ", Describe(),
                                                 ": cannot connect: ",
                                                 c == nullptr ? "out of memory" : c->errstr));
    }
    if (redisSetTimeout(c.get(), tv) != REDIS_OK) {
      return absl::UnavailableError(
          absl::StrCat("session store ", Describe(), ": cannot set the timeout"));
    }
    return c;
  }

  void Release(Context c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(c));
  }

  static constexpr size_t kMaxIdle = 16;
  SessionStoreOptions options_;
  std::string host_;
  int port_;
  std::mutex mu_;
  std::vector<Context> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<SessionStore>> OpenRedisSessionStore(
    const SessionStoreOptions& options) {
  const std::vector<std::string> parts = absl::StrSplit(options.redis_address, ':');
  int port = 0;
  if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session store: redis address must be host:port (got \"", options.redis_address, "\")"));
  }
  if (options.timeout_ms <= 0) {
    return absl::InvalidArgumentError("session store: timeout_ms must be positive");
  }
  return std::make_unique<RedisSessionStore>(options, parts[0], port);
}

}  // namespace kvl::session_store_internal
