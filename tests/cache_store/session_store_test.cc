// cache_store/session_store.h: both backends (in the process, and a private
// redis-server on loopback) keep what a replica needs to rebuild a session,
// commit each turn exactly once (compare-and-set on the turn count, request
// ids), expire idle sessions, and report an unreachable Redis as Unavailable
// and recover when it comes back.
#include "cache_store/session_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/redis.h"

namespace kvl {
namespace {

TurnRecord Turn(int64_t begin, int n, const std::string& model, const std::string& request_id) {
  TurnRecord t;
  t.request_id = request_id;
  t.user_message = absl::StrCat("question at ", begin, " \xC3\xA9");
  t.reply = "answer \xF0\x9F\x98\x80";
  t.model = model;
  t.finish_reason = "stop";
  t.unix_seconds = 1000 + begin;
  t.history_begin = begin;
  for (int i = 0; i < n; ++i) t.tokens.push_back(begin + i);
  t.ledger = {{0, begin + n, model}};
  t.tail_begin = begin + n - 2;
  t.cascade_level = 1;
  t.events = std::string("\x00\x01\xFF binary", 10);
  return t;
}

SessionRecord Session(const std::string& id) {
  SessionRecord s;
  s.session_id = id;
  s.system_prompt = "You are terse.";
  s.preamble = {7, 8, 9};
  s.created_unix_seconds = 1000;
  s.generation = "gen-" + id;
  return s;
}

TEST(SessionStoreEncoding, TurnRoundTripsThroughItsJson) {
  const TurnRecord t = Turn(12, 5, "kvl-large", "req-1");
  absl::StatusOr<TurnRecord> back = DecodeTurn(EncodeTurn(t));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, t);
  EXPECT_EQ(DecodeTurn("{").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeTurn(R"({"model": 3})").status().code(), absl::StatusCode::kDataLoss);
}

TEST(SessionStoreOptions, UnknownBackendAndBadAddressAreRefused) {
  SessionStoreOptions o;
  o.backend = "etcd";
  EXPECT_EQ(OpenSessionStore(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.backend = "redis";
  for (const char* address : {"localhost", "localhost:0", ":6379", "host:port", "h:70000"}) {
    o.redis_address = address;
    EXPECT_EQ(OpenSessionStore(o).status().code(), absl::StatusCode::kInvalidArgument) << address;
  }
}

// The same behaviour from both backends.
class SessionStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { store_ = Open(0); }

  std::unique_ptr<SessionStore> Open(int64_t ttl_seconds) {
    SessionStoreOptions o;
    o.backend = GetParam();
    o.ttl_seconds = ttl_seconds;
    o.clock = [this] { return now_.load(); };
    if (GetParam() == "redis") {
      if (redis_ == nullptr) {
        absl::StatusOr<std::unique_ptr<testing::RedisServer>> r = testing::RedisServer::Start();
        EXPECT_TRUE(r.ok()) << r.status();
        if (!r.ok()) return nullptr;
        redis_ = *std::move(r);
      }
      o.redis_address = redis_->address();
      o.timeout_ms = 500;
    }
    absl::StatusOr<std::unique_ptr<SessionStore>> s = OpenSessionStore(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  std::atomic<int64_t> now_{5000};
  std::unique_ptr<testing::RedisServer> redis_;
  std::unique_ptr<SessionStore> store_;
};

TEST_P(SessionStoreTest, KeepsEverythingNeededToRebuildASession) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Ping().ok());
  ASSERT_TRUE(store_->Create(Session("s1")).ok());
  EXPECT_EQ(store_->Create(Session("s1")).code(), absl::StatusCode::kAlreadyExists);
  const TurnRecord t1 = Turn(0, 10, "kvl-small", "a");
  const TurnRecord t2 = Turn(10, 7, "kvl-large", "");
  ASSERT_TRUE(store_->AppendTurn("s1", 0, t1).ok());
  now_ = 5007;
  ASSERT_TRUE(store_->AppendTurn("s1", 1, t2).ok());

  absl::StatusOr<SessionRecord> r = store_->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->session_id, "s1");
  EXPECT_EQ(r->system_prompt, "You are terse.");
  EXPECT_EQ(r->preamble, (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(r->generation, "gen-s1");
  EXPECT_EQ(store_->Check("s1", "")->generation, "gen-s1");
  EXPECT_EQ(r->last_active_unix_seconds, 5007);
  ASSERT_EQ(r->turns.size(), 2u);
  EXPECT_EQ(r->turns[0], t1);
  EXPECT_EQ(r->turns[1], t2);
  EXPECT_EQ(store_->Load("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(SessionStoreTest, ATurnCommitsOnlyOnTheTurnCountItRanOn) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Create(Session("s")).ok());
  ASSERT_TRUE(store_->AppendTurn("s", 0, Turn(0, 4, "m", "")).ok());
  // A second replica that ran its turn on the same 0 turns loses.
  absl::Status late = store_->AppendTurn("s", 0, Turn(0, 5, "m", ""));
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_EQ(store_->AppendTurn("s", 5, Turn(4, 5, "m", "")).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_->AppendTurn("gone", 0, Turn(0, 5, "m", "")).code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<SessionRecord> r = store_->Load("s");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->turns.size(), 1u);
}

TEST_P(SessionStoreTest, ConcurrentCommitsOfOneTurnNumberHaveExactlyOneWinner) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Create(Session("race")).ok());
  constexpr int kThreads = 8;
  std::atomic<int> won{0}, aborted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      absl::Status s = store_->AppendTurn("race", 0, Turn(0, 3 + i, "m", ""));
      if (s.ok()) ++won;
      if (absl::IsAborted(s)) ++aborted;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(aborted.load(), kThreads - 1);
  EXPECT_EQ(store_->Load("race")->turns.size(), 1u);
}

TEST_P(SessionStoreTest, ARequestIdCommitsOnceAndItsTurnIsFoundForReplay) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Create(Session("s")).ok());
  absl::StatusOr<TurnCheck> before = store_->Check("s", "r1");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->turns, 0);
  EXPECT_FALSE(before->replay.has_value());

  const TurnRecord t = Turn(0, 6, "m", "r1");
  ASSERT_TRUE(store_->AppendTurn("s", 0, t).ok());
  // The retry of r1, after its commit, is refused even on the new turn count.
  EXPECT_EQ(store_->AppendTurn("s", 1, Turn(6, 2, "m", "r1")).code(),
            absl::StatusCode::kAlreadyExists);
  absl::StatusOr<TurnCheck> after = store_->Check("s", "r1");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->turns, 1);
  ASSERT_TRUE(after->replay.has_value());
  EXPECT_EQ(*after->replay, t);
  EXPECT_FALSE(store_->Check("s", "r2")->replay.has_value());
  EXPECT_FALSE(store_->Check("s", "")->replay.has_value());
  EXPECT_EQ(store_->Check("other", "r1").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(SessionStoreTest, RemoveForgetsTheSessionAndItsRequestIds) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Create(Session("s")).ok());
  ASSERT_TRUE(store_->AppendTurn("s", 0, Turn(0, 6, "m", "r1")).ok());
  ASSERT_TRUE(store_->Remove("s").ok());
  EXPECT_EQ(store_->Remove("s").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Load("s").status().code(), absl::StatusCode::kNotFound);
  // The id is free again, with no turns and no memory of r1.
  ASSERT_TRUE(store_->Create(Session("s")).ok());
  absl::StatusOr<TurnCheck> check = store_->Check("s", "r1");
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(check->turns, 0);
  EXPECT_FALSE(check->replay.has_value());
}

TEST_P(SessionStoreTest, AnIdleSessionExpiresAfterItsTtlAndUseKeepsItAlive) {
  if (GetParam() == "redis") {
    // Redis expires keys on its own clock, in whole seconds: a 1 s TTL, and
    // Check renewing it, on the real clock.
    store_ = Open(1);
    ASSERT_NE(store_, nullptr);
    ASSERT_TRUE(store_->Create(Session("s")).ok());
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ASSERT_TRUE(store_->Check("s", "").ok()) << "renewed at " << i;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));
    EXPECT_EQ(store_->Load("s").status().code(), absl::StatusCode::kNotFound);
    return;
  }
  store_ = Open(60);
  ASSERT_TRUE(store_->Create(Session("s")).ok());
  now_ += 59;
  ASSERT_TRUE(store_->Check("s", "").ok());
  now_ += 59;
  ASSERT_TRUE(store_->Load("s").ok());
  now_ += 60;
  EXPECT_EQ(store_->Load("s").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(SessionStoreTest, ASessionIsCreatedWithItsTurnsAllAtOnce) {
  ASSERT_NE(store_, nullptr);
  SessionRecord imported = Session("imp");
  imported.turns = {Turn(0, 4, "kvl-small", ""), Turn(4, 3, "kvl-large", "r9")};
  ASSERT_TRUE(store_->Create(imported).ok());
  absl::StatusOr<SessionRecord> r = store_->Load("imp");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->turns.size(), 2u);
  EXPECT_EQ(r->turns[0], imported.turns[0]);
  EXPECT_EQ(r->turns[1], imported.turns[1]);
  // The turn count and the request ids are the appended turns' would be.
  absl::StatusOr<TurnCheck> check = store_->Check("imp", "r9");
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(check->turns, 2);
  ASSERT_TRUE(check->replay.has_value());
  EXPECT_EQ(*check->replay, imported.turns[1]);
  EXPECT_TRUE(store_->AppendTurn("imp", 2, Turn(7, 2, "kvl-small", "")).ok());
}

TEST_P(SessionStoreTest, ListsAndCountsTheIdsOfAPrefixInByteOrder) {
  ASSERT_NE(store_, nullptr);
  for (const char* id : {"acme/b", "acme/a", "bolt/a", "acme/c", "plain"}) {
    ASSERT_TRUE(store_->Create(Session(id)).ok()) << id;
  }
  EXPECT_EQ(*store_->Count("acme/"), 3);
  EXPECT_EQ(*store_->Count("bolt/"), 1);
  EXPECT_EQ(*store_->Count(""), 5);
  EXPECT_EQ(*store_->Count("zed/"), 0);
  using Ids = std::vector<std::string>;
  EXPECT_EQ(*store_->ListIds("acme/", "", 0), (Ids{"acme/a", "acme/b", "acme/c"}));
  EXPECT_EQ(*store_->ListIds("acme/", "", 2), (Ids{"acme/a", "acme/b"}));
  EXPECT_EQ(*store_->ListIds("acme/", "acme/b", 2), (Ids{"acme/c"}));
  EXPECT_EQ(*store_->ListIds("", "bolt/a", 0), (Ids{"plain"}));
  ASSERT_TRUE(store_->Remove("acme/b").ok());
  EXPECT_EQ(*store_->Count("acme/"), 2);
  EXPECT_EQ(*store_->ListIds("acme/", "", 0), (Ids{"acme/a", "acme/c"}));
}

INSTANTIATE_TEST_SUITE_P(Backends, SessionStoreTest, ::testing::Values("memory", "redis"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(RedisSessionStore, AnOutageIsUnavailableAndTheStoreRecoversWhenRedisReturns) {
  absl::StatusOr<std::unique_ptr<testing::RedisServer>> redis = testing::RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  SessionStoreOptions o;
  o.backend = "redis";
  o.redis_address = (*redis)->address();
  o.timeout_ms = 500;
  std::unique_ptr<SessionStore> store = *OpenSessionStore(o);
  ASSERT_TRUE(store->Create(Session("s")).ok());

  ASSERT_TRUE((*redis)->Kill().ok());
  for (absl::Status s : {store->Ping(), store->Create(Session("t")),
                         store->AppendTurn("s", 0, Turn(0, 3, "m", "")),
                         store->Load("s").status(), store->Check("s", "").status(),
                         store->Remove("s")}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  }
  ASSERT_TRUE((*redis)->Restart().ok());
  // An in-memory Redis came back empty: the store answers again.
  EXPECT_TRUE(store->Ping().ok());
  EXPECT_EQ(store->Load("s").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->Create(Session("s")).ok());
}

TEST(RedisSessionStore, AStoreThatCannotBeReachedAtStartConnectsLater) {
  absl::StatusOr<std::unique_ptr<testing::RedisServer>> redis = testing::RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  ASSERT_TRUE((*redis)->Kill().ok());
  SessionStoreOptions o;
  o.backend = "redis";
  o.redis_address = (*redis)->address();
  o.timeout_ms = 300;
  absl::StatusOr<std::unique_ptr<SessionStore>> store = OpenSessionStore(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Ping().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE((*redis)->Restart().ok());
  EXPECT_TRUE((*store)->Ping().ok());
}

}  // namespace
}  // namespace kvl
