// The session registry of the cache store (cache_store/cache_store.h):
// ids, paging, expiry.
#include "cache_store/cache_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kvl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Ids(const std::vector<SessionView>& sessions) {
  std::vector<std::string> ids;
  for (const SessionView& s : sessions) ids.push_back(s.session_id);
  return ids;
}

CacheStoreOptions Options(std::function<int64_t()> clock = nullptr) {
  CacheStoreOptions o;
  o.clock = std::move(clock);
  return o;
}

size_t Size(const CacheStore& store) { return static_cast<size_t>(store.Stats().sessions); }

TEST(SessionRegistryTest, GeneratedIdsAreWellFormedAndDistinct) {
  CacheStore table(Options());
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<SessionView> s = table.Create("", "", {});
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(std::regex_match(s->session_id, std::regex("s-[0-9a-f]{24}"))) << s->session_id;
    EXPECT_TRUE(IsValidSessionId(s->session_id));
    ids.insert(s->session_id);
  }
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_EQ(Size(table), 1000u);
}

TEST(SessionRegistryTest, ClientIdsAreValidatedAndUnique) {
  int64_t now = 1000;
  CacheStore table(Options([&] { return now; }));
  absl::StatusOr<SessionView> s = table.Create("user-7:chat.1_a", "be brief", {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->session_id, "user-7:chat.1_a");
  EXPECT_EQ(s->system_prompt, "be brief");
  EXPECT_EQ(s->created_unix_seconds, 1000);
  EXPECT_EQ(s->state.turns, 0);

  EXPECT_EQ(table.Create("user-7:chat.1_a", "", {}).status().code(), absl::StatusCode::kAlreadyExists);
  for (const std::string& bad : std::vector<std::string>{
           "has space", "slash/", std::string(129, 'a'), std::string("nul\0", 4)}) {
    absl::Status status = table.Create(bad, "", {}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("session_id"));
  }
  EXPECT_TRUE(table.Create(std::string(128, 'a'), "", {}).ok());
}

TEST(SessionRegistryTest, GetAndDelete) {
  CacheStore table(Options());
  ASSERT_TRUE(table.Create("a", "prompt", {}).ok());
  absl::StatusOr<SessionView> got = table.View("a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->system_prompt, "prompt");
  EXPECT_EQ(table.View("b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(table.Remove("a").ok());
  EXPECT_EQ(table.View("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Remove("a").code(), absl::StatusCode::kNotFound);
  // A deleted id can be taken again.
  EXPECT_TRUE(table.Create("a", "", {}).ok());
}

TEST(SessionRegistryTest, AReservedSessionIsInvisibleUntilCommitted) {
  int64_t now = 1000;
  CacheStore table(Options([&] { return now; }));
  absl::StatusOr<std::unique_ptr<SessionReservation>> r =
      table.Reserve("a", "prompt", {1, 2}, /*replace=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->session_id(), "a");
  EXPECT_EQ((*r)->created_unix_seconds(), 1000);
  // Nobody sees it but a lease (its creator's turns)...
  EXPECT_EQ(table.View("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Touch("a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Remove("a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.CountWithPrefix(""), 0);
  EXPECT_EQ(Size(table), 0u);
  EXPECT_TRUE(table.List(0, "")->sessions.empty());
  EXPECT_TRUE(table.Begin("a").ok());
  // ...yet it holds its id.
  EXPECT_EQ(table.Create("a", "", {}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table.Reserve("a", "", {}, /*replace=*/true).status().code(),
            absl::StatusCode::kAlreadyExists);
  const SessionView view = (*r)->Commit("gen-1");
  EXPECT_EQ(view.session_id, "a");
  EXPECT_EQ(view.generation, "gen-1");
  EXPECT_EQ(view.state.preamble, (std::vector<int64_t>{1, 2}));
  r->reset();
  absl::StatusOr<SessionView> got = table.View("a");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->generation, "gen-1");
  EXPECT_EQ(table.CountWithPrefix(""), 1);
  EXPECT_THAT(Ids(table.List(0, "")->sessions), ElementsAre("a"));
}

TEST(SessionRegistryTest, AReservationDroppedUncommittedLeavesNothing) {
  CacheStoreOptions o = Options();
  o.max_sessions = 1;
  CacheStore table(o);
  {
    absl::StatusOr<std::unique_ptr<SessionReservation>> r = table.Reserve("", "", {}, false);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(std::regex_match((*r)->session_id(), std::regex("s-[0-9a-f]{24}")));
    // It takes the one place under max_sessions while held.
    EXPECT_EQ(table.Create("b", "", {}).status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(Size(table), 0u);
  EXPECT_TRUE(table.Create("b", "", {}).ok());
  EXPECT_EQ(table.Reserve("c", "", {}, false).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.Reserve("bad id", "", {}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SessionRegistryTest, AReservationWithReplaceTakesTheIdOfAnIdleCopy) {
  CacheStore table(Options());
  ASSERT_TRUE(table.Create("a", "old", {}).ok());
  EXPECT_EQ(table.Reserve("a", "new", {}, /*replace=*/false).status().code(),
            absl::StatusCode::kAlreadyExists);
  {
    absl::StatusOr<std::unique_ptr<TurnLease>> busy = table.Begin("a");
    ASSERT_TRUE(busy.ok());
    EXPECT_EQ(table.Reserve("a", "new", {}, /*replace=*/true).status().code(),
              absl::StatusCode::kAborted);
  }
  absl::StatusOr<std::unique_ptr<SessionReservation>> r = table.Reserve("a", "new", {}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  (*r)->Commit("gen-2");
  EXPECT_EQ(table.View("a")->system_prompt, "new");
  EXPECT_EQ(Size(table), 1u);
}

TEST(SessionRegistryTest, ListPagesInCreationOrderAcrossDeletions) {
  CacheStore table(Options());
  for (const char* id : {"e", "d", "c", "b", "a"}) ASSERT_TRUE(table.Create(id, "", {}).ok());
  absl::StatusOr<SessionPage> p1 = table.List(2, "");
  ASSERT_TRUE(p1.ok());
  EXPECT_THAT(Ids(p1->sessions), ElementsAre("e", "d"));
  ASSERT_FALSE(p1->next_page_token.empty());
  // Deleting an already listed and a not yet listed session between pages
  // neither repeats nor skips the others.
  ASSERT_TRUE(table.Remove("d").ok());
  ASSERT_TRUE(table.Remove("b").ok());
  absl::StatusOr<SessionPage> p2 = table.List(2, p1->next_page_token);
  ASSERT_TRUE(p2.ok());
  EXPECT_THAT(Ids(p2->sessions), ElementsAre("c", "a"));
  EXPECT_TRUE(p2->next_page_token.empty());

  absl::StatusOr<SessionPage> all = table.List(0, "");
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(Ids(all->sessions), ElementsAre("e", "c", "a"));
  EXPECT_TRUE(all->next_page_token.empty());
}

// Tenant-scoped ids (server/auth.h): a prefix lists only its own sessions,
// pages count only them, and a token is handed out only when another of its
// own follows, so the pages say nothing about other tenants' sessions.
TEST(SessionRegistryTest, ListWithAPrefixSeesOnlyItsOwnSessions) {
  CacheStore table(Options());
  for (const char* id : {"a/1", "b/1", "a/2", "b/2", "b/3"}) ASSERT_TRUE(table.Create(id, "", {}).ok());
  EXPECT_EQ(table.Create("a/../x", "", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.Create("a b/x", "", {}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<SessionPage> a = table.List(2, "", "a/");
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(Ids(a->sessions), ElementsAre("a/1", "a/2"));
  EXPECT_TRUE(a->next_page_token.empty());  // b's later sessions give no token
  absl::StatusOr<SessionPage> b1 = table.List(2, "", "b/");
  ASSERT_TRUE(b1.ok());
  EXPECT_THAT(Ids(b1->sessions), ElementsAre("b/1", "b/2"));
  ASSERT_FALSE(b1->next_page_token.empty());
  absl::StatusOr<SessionPage> b2 = table.List(2, b1->next_page_token, "b/");
  EXPECT_THAT(Ids(b2->sessions), ElementsAre("b/3"));
  EXPECT_EQ(table.CountWithPrefix("a/"), 2);
  EXPECT_EQ(table.CountWithPrefix("b/"), 3);
}

TEST(SessionRegistryTest, PageSizeDefaultsAndClamps) {
  CacheStore table(Options());
  for (int i = 0; i < 1005; ++i) ASSERT_TRUE(table.Create("", "", {}).ok());
  EXPECT_EQ(table.List(0, "")->sessions.size(), CacheStore::kDefaultPageSize);
  absl::StatusOr<SessionPage> big = table.List(5000, "");
  EXPECT_EQ(big->sessions.size(), CacheStore::kMaxPageSize);
  absl::StatusOr<SessionPage> rest = table.List(5000, big->next_page_token);
  EXPECT_EQ(rest->sessions.size(), 5u);
  EXPECT_TRUE(rest->next_page_token.empty());
}

TEST(SessionRegistryTest, BadPageTokenIsInvalidArgument) {
  CacheStore table(Options());
  for (const char* token : {"garbage", "p1.", "p1.x", "p2.5"}) {
    absl::Status s = table.List(10, token).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_THAT(s.message(), HasSubstr("page_token"));
  }
}

TEST(SessionRegistryTest, IdleSessionsExpireUnlessTouched) {
  int64_t now = 100;
  CacheStore table(Options([&] { return now; }));
  ASSERT_TRUE(table.Create("old", "", {}).ok());
  ASSERT_TRUE(table.Create("used", "", {}).ok());
  now = 150;
  ASSERT_TRUE(table.Create("new", "", {}).ok());
  ASSERT_TRUE(table.Touch("used").ok());
  EXPECT_EQ(table.Touch("nope").code(), absl::StatusCode::kNotFound);
  now = 200;
  EXPECT_THAT(table.RemoveIdle(100), ElementsAre("old"));
  EXPECT_EQ(table.View("used")->last_active_unix_seconds, 150);
  EXPECT_EQ(Size(table), 2u);
  now = 250;
  EXPECT_THAT(table.RemoveIdle(100), ElementsAre("used", "new"));
  EXPECT_EQ(Size(table), 0u);
}

TEST(SessionRegistryTest, ConcurrentCreatesAndDeletesKeepTheTableConsistent) {
  CacheStore table(Options());
  std::atomic<int> created{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (table.Create(id, "", {}).ok()) ++created;
        if (i % 2 == 0) {
          EXPECT_TRUE(table.Remove(id).ok());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(created.load(), 2000);
  EXPECT_EQ(Size(table), 1000u);
  absl::StatusOr<SessionPage> all = table.List(1000, "");
  EXPECT_EQ(all->sessions.size(), 1000u);
}

}  // namespace
}  // namespace kvl
