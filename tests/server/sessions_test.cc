// server/sessions.h, the one owner of a session's life, over a CacheStore
// and a durable store: an operation that fails leaves nothing behind, and
// with a shared store (a private redis-server) two replicas list and count
// the same sessions.
#include "server/sessions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/decoder.h"
#include "tests/model/test_models.h"
#include "tests/testing/redis.h"

namespace kvl::server {
namespace {

using ::testing::ElementsAre;

// A store kept in the process that can be told to refuse creations.
class RefusingStore final : public SessionStore {
 public:
  RefusingStore() : inner_(*OpenSessionStore({})) {}
  bool refuse_create = false;

  std::string Describe() const override { return "refusing"; }
  absl::Status Create(const SessionRecord& session) override {
    if (refuse_create) return absl::UnavailableError("session store refusing: down");
    return inner_->Create(session);
  }
  absl::StatusOr<SessionRecord> Load(const std::string& id) override { return inner_->Load(id); }
  absl::StatusOr<TurnCheck> Check(const std::string& id, const std::string& request) override {
    return inner_->Check(id, request);
  }
  absl::Status AppendTurn(const std::string& id, int64_t expected,
                          const TurnRecord& turn) override {
    return inner_->AppendTurn(id, expected, turn);
  }
  absl::Status Remove(const std::string& id) override { return inner_->Remove(id); }
  absl::Status Ping() override { return absl::OkStatus(); }
  bool shared() const override { return false; }
  absl::StatusOr<std::vector<std::string>> ListIds(std::string_view prefix, std::string_view after,
                                                   int64_t limit) override {
    return inner_->ListIds(prefix, after, limit);
  }
  absl::StatusOr<int64_t> Count(std::string_view prefix) override {
    return inner_->Count(prefix);
  }

 private:
  std::unique_ptr<SessionStore> inner_;
};

std::vector<std::string> Ids(const SessionPage& page) {
  std::vector<std::string> ids;
  for (const SessionView& s : page.sessions) ids.push_back(s.session_id);
  return ids;
}

// Across tokenizers (issue 54): a record's stream rebuilt in another
// tokenizer's tokens, segment by segment from the text; a record written
// without segments is one segment per turn; the last model's tail is placed
// in its own group's stream.
TEST(SessionsTest, ARestoreRendersTheStoredStreamInEachTokenizer) {
  auto house = Tokenizer::FromFile(std::string(KVL_SOURCE_DIR) + "/models/tokenizer/tokenizer.json");
  auto t2 =
      Tokenizer::FromFile(std::string(KVL_SOURCE_DIR) + "/models/tokenizer-t2/tokenizer.json");
  ASSERT_TRUE(house.ok() && t2.ok());
  const std::vector<std::string> segments = {
      "<|im_start|>user\nMy cat Muffin lives at 12345 Long Road.<|im_end|>\n<|im_start|>assistant\n",
      "Noted: 12345 Long Road.<|im_end|>", "\n"};
  SessionRecord record;
  record.session_id = "s";
  TurnRecord turn;
  turn.model = "b";
  for (const std::string& text : segments) {
    turn.bounds.push_back(static_cast<int64_t>(turn.tokens.size()));
    for (int32_t id : (*house)->Encode(text)) turn.tokens.push_back(id);
  }
  turn.ledger = {{0, static_cast<int64_t>(turn.tokens.size()), "b"}};
  turn.tail_begin = 1000;  // past both streams: clamped to the t2 model's own
  record.turns = {turn};
  const std::vector<const Tokenizer*> tokenizers = {house->get(), t2->get()};
  auto state = StateFromRecord(record, {"a", "b"}, tokenizers, {0, 1});
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->bounds, turn.bounds);
  ASSERT_EQ(state->renderings.size(), 1u);
  Rendering want;
  for (const std::string& text : segments) {
    want.bounds.push_back(static_cast<int64_t>(want.ids.size()));
    for (int32_t id : (*t2)->Encode(text)) want.ids.push_back(id);
  }
  EXPECT_EQ(state->renderings[0], want);
  EXPECT_NE(state->renderings[0].ids, state->history);
  EXPECT_EQ(state->tail_begin, static_cast<int64_t>(want.ids.size()));
  // One tokenizer: no renderings. No stored segments: one per turn.
  auto one = StateFromRecord(record, {"a", "b"});
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->renderings.empty());
  record.turns[0].bounds.clear();
  auto older = StateFromRecord(record, {"a", "b"}, tokenizers, {0, 1});
  ASSERT_TRUE(older.ok());
  EXPECT_THAT(older->bounds, ElementsAre(0));
  EXPECT_EQ(older->renderings[0].ids, want.ids);
  // A segment outside its turn's tokens is data loss.
  record.turns[0].bounds = {0, 9999};
  EXPECT_EQ(StateFromRecord(record, {"a", "b"}, tokenizers, {0, 1}).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(SessionsTest, ACreationTheStoreRefusesLeavesNothing) {
  CacheStore cache(CacheStoreOptions{});
  auto owned = std::make_unique<RefusingStore>();
  RefusingStore* store = owned.get();
  Sessions sessions(&cache, std::move(owned), {});
  store->refuse_create = true;
  EXPECT_EQ(sessions.Create("a", "p", {}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cache.View("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*sessions.Count(""), 0);
  EXPECT_EQ(cache.Stats().sessions, 0);
  // Nothing to undo: the same id is created once the store takes it.
  store->refuse_create = false;
  absl::StatusOr<SessionView> created = sessions.Create("a", "p", {});
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(created->generation.empty());
  EXPECT_EQ(sessions.View("a")->generation, created->generation);
  EXPECT_EQ(sessions.Transcript("a")->generation, created->generation);
}

TEST(SessionsTest, AFailedPopulateLeavesNothingAndASuccessfulOneIsRecordedWhole) {
  CacheStore cache(CacheStoreOptions{});
  Sessions sessions(&cache, *OpenSessionStore({}), {});
  std::string staged;
  auto fail = [&](const std::string& id, std::vector<TurnRecord>* turns) {
    staged = id;
    // The staged session is there for the populating turns only.
    EXPECT_TRUE(cache.Begin(id).ok());
    EXPECT_EQ(cache.View(id).status().code(), absl::StatusCode::kNotFound);
    turns->push_back(TurnRecord{});
    return absl::InvalidArgumentError("turns[1]: no");
  };
  EXPECT_EQ(sessions.Create("imp", "", {}, fail).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(staged, "imp");
  EXPECT_EQ(sessions.Transcript("imp").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache.Begin("imp").status().code(), absl::StatusCode::kNotFound);

  auto two_turns = [](const std::string&, std::vector<TurnRecord>* turns) {
    turns->resize(2);
    (*turns)[0].user_message = "one";
    (*turns)[1].user_message = "two";
    return absl::OkStatus();
  };
  ASSERT_TRUE(sessions.Create("imp", "", {}, two_turns).ok());
  absl::StatusOr<SessionRecord> record = sessions.Transcript("imp");
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_EQ(record->turns.size(), 2u);
  EXPECT_EQ(record->turns[1].user_message, "two");
}

// A session's two turns "one" and "two" on model "m", of these tokens; the
// first's unrun tail is its last token.
Sessions::Populate TwoTurns(std::vector<int64_t> first, std::vector<int64_t> second) {
  return [first, second](const std::string&, std::vector<TurnRecord>* turns) {
    const int64_t n1 = static_cast<int64_t>(first.size());
    turns->resize(2);
    (*turns)[0].user_message = "one";
    (*turns)[0].model = "m";
    (*turns)[0].tokens = first;
    (*turns)[0].ledger = {{0, n1, "m"}};
    (*turns)[0].tail_begin = n1 - 1;
    (*turns)[1].user_message = "two";
    (*turns)[1].model = "m";
    (*turns)[1].history_begin = n1;
    (*turns)[1].tokens = second;
    (*turns)[1].ledger = {{0, n1 + static_cast<int64_t>(second.size()), "m"}};
    return absl::OkStatus();
  };
}

// A fork holds the source's first turns, in the store and here; the source
// is left as it was. (Its cache lines are copied too: the OpenAI API test,
// RegeneratingAReplyForksTheCachedConversation, checks that end to end.)
TEST(SessionsTest, AForkHoldsTheSourcesFirstTurnsAndLeavesTheSource) {
  CacheStoreOptions options;
  options.n_models = 1;
  CacheStore cache(options);
  Sessions sessions(&cache, *OpenSessionStore({}), {"m"});
  ASSERT_TRUE(sessions.Create("src", "p", {9}, TwoTurns({1, 2, 3}, {4, 5})).ok());
  absl::StatusOr<SessionView> fork = sessions.Create("fork", "p", {9}, sessions.ForkOf("src", 1));
  ASSERT_TRUE(fork.ok()) << fork.status();
  EXPECT_EQ(fork->state.turns, 1);
  EXPECT_THAT(fork->state.history, ElementsAre(1, 2, 3));
  EXPECT_EQ(fork->state.tail_begin, 2);
  EXPECT_EQ(fork->state.last_model, 0);
  absl::StatusOr<SessionRecord> record = sessions.Transcript("fork");
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_EQ(record->turns.size(), 1u);
  EXPECT_EQ(record->turns[0].user_message, "one");
  EXPECT_EQ(sessions.Transcript("src")->turns.size(), 2u);

  EXPECT_EQ(sessions.Create("f2", "p", {9}, sessions.ForkOf("src", 3)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sessions.Create("f3", "p", {9}, sessions.ForkOf("nothing", 1)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(sessions.View("f2").status().code(), absl::StatusCode::kNotFound);
}

// A fork never copies a line up to a point inside a thin translated span
// (its sliding layers hold only the span's last entries): the copy stops at
// the span's start, and the fork's next turn on that model fills in the rest.
TEST(SessionsTest, AForkStopsItsLineCopyBeforeAThinSpanItWouldCut) {
  CacheStoreOptions options;
  options.n_models = 1;
  CacheStore cache(options);
  Sessions sessions(&cache, *OpenSessionStore({}), {"m"});
  ASSERT_TRUE(sessions.Create("src", "p", {9}, TwoTurns({1, 2, 3}, {4, 5, 6, 7})).ok());
  // The source's line: token 0 native, tokens 1..6 accepted thin (window 3:
  // the sliding layers keep the last two).
  const ModelConfig config = kvl::testing::GemmaConfig();
  absl::StatusOr<std::unique_ptr<Decoder>> decoder =
      Decoder::Create(config, kvl::testing::RandomWeights(config, 3), {});
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  std::unique_ptr<KvCache> line = (*decoder)->NewCache();
  {
    c10::InferenceMode guard;
    (*decoder)->Forward(*line, at::tensor({1, 2, 3, 4, 5, 6, 7}, at::kLong), false);
  }
  absl::StatusOr<KvTaps> taps = line->Taps(1, 7);
  ASSERT_TRUE(taps.ok()) << taps.status();
  ASSERT_TRUE(line->Rollback(1).ok());
  ASSERT_TRUE(line->Accept(taps->keys, taps->values, config.UnreadTokens(1, 7)).ok());
  ASSERT_TRUE(line->Spans().back().thin);
  {
    absl::StatusOr<std::unique_ptr<TurnLease>> lease = cache.Begin("src");
    ASSERT_TRUE(lease.ok()) << lease.status();
    (*lease)->ReplaceLine(0, std::move(line));
    ConversationState state = (*lease)->state();
    state.history = {1, 2, 3, 4, 5, 6, 7};  // what the line holds
    (*lease)->Commit(std::move(state));
  }
  // The first turn ends at 3, inside the thin span [1, 7): one token copied.
  absl::StatusOr<SessionView> fork = sessions.Create("fork", "p", {9}, sessions.ForkOf("src", 1));
  ASSERT_TRUE(fork.ok()) << fork.status();
  EXPECT_THAT(fork->state.history, ElementsAre(1, 2, 3));
  absl::StatusOr<std::unique_ptr<TurnLease>> forked = cache.Begin("fork");
  ASSERT_TRUE(forked.ok()) << forked.status();
  ASSERT_NE((*forked)->line(0), nullptr);
  EXPECT_EQ((*forked)->line(0)->Length(), 1);
}

// Two replicas: two registries, one Redis.
class SharedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::RedisServer>> r = testing::RedisServer::Start();
    ASSERT_TRUE(r.ok()) << r.status();
    redis_ = *std::move(r);
    a_ = Replica(&cache_a_);
    b_ = Replica(&cache_b_);
  }

  std::unique_ptr<Sessions> Replica(CacheStore* cache) {
    SessionStoreOptions o;
    o.backend = "redis";
    o.redis_address = redis_->address();
    o.timeout_ms = 1000;
    absl::StatusOr<std::unique_ptr<SessionStore>> store = OpenSessionStore(o);
    EXPECT_TRUE(store.ok()) << store.status();
    return std::make_unique<Sessions>(cache, *std::move(store), std::vector<std::string>{});
  }

  std::unique_ptr<testing::RedisServer> redis_;
  CacheStore cache_a_{CacheStoreOptions{}}, cache_b_{CacheStoreOptions{}};
  std::unique_ptr<Sessions> a_, b_;
};

TEST_F(SharedStoreTest, BothReplicasListAndCountEverySessionOfATenant) {
  ASSERT_TRUE(a_->Create("acme/1", "", {}).ok());
  ASSERT_TRUE(a_->Create("acme/2", "", {}).ok());
  ASSERT_TRUE(b_->Create("acme/3", "", {}).ok());
  ASSERT_TRUE(b_->Create("bolt/1", "", {}).ok());
  for (Sessions* replica : {a_.get(), b_.get()}) {
    EXPECT_EQ(*replica->Count("acme/"), 3);
    EXPECT_EQ(*replica->Count("bolt/"), 1);
    absl::StatusOr<SessionPage> first = replica->List(2, "", "acme/");
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_THAT(Ids(*first), ElementsAre("acme/1", "acme/2"));
    ASSERT_FALSE(first->next_page_token.empty());
    absl::StatusOr<SessionPage> second = replica->List(2, first->next_page_token, "acme/");
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_THAT(Ids(*second), ElementsAre("acme/3"));
    EXPECT_TRUE(second->next_page_token.empty());
    // Another tenant's token is no token of this listing.
    EXPECT_EQ(replica->List(2, first->next_page_token, "bolt/").status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // A deletion through one replica is seen by the other at once.
  ASSERT_TRUE(a_->Remove("acme/3").ok());
  EXPECT_EQ(*b_->Count("acme/"), 2);
  EXPECT_EQ(b_->View("acme/3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b_->Create("acme/1", "", {}).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(SharedStoreTest, AStaleCopyOfADeletedSessionGivesWayToTheNewOne) {
  absl::StatusOr<SessionView> first = a_->Create("s", "old", {});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(b_->Prepare("s", "").ok());  // b now holds a copy
  EXPECT_EQ(cache_b_.View("s")->generation, first->generation);
  ASSERT_TRUE(a_->Remove("s").ok());
  absl::StatusOr<SessionView> again = b_->Create("s", "new", {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->generation, first->generation);
  EXPECT_EQ(cache_b_.View("s")->system_prompt, "new");
  EXPECT_EQ(a_->View("s")->system_prompt, "new");
}

}  // namespace
}  // namespace kvl::server
