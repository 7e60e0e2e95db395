// ChatRequest validation at the server's edge (server/chat_request.h).
#include "server/chat_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace kvl::server {
namespace {

using ::testing::HasSubstr;

kvlingo::v1::ChatRequest Valid() {
  kvlingo::v1::ChatRequest r;
  r.set_session_id("s1");
  r.set_user_message("héllo 世界 🙂");
  return r;
}

const std::vector<std::string> kModels = {"small", "large"};

absl::Status Error(const kvlingo::v1::ChatRequest& r, TurnLimits limits = {}) {
  return ParseChatRequest(r, limits, kModels).status();
}

void ExpectInvalid(const kvlingo::v1::ChatRequest& r, const std::string& field) {
  absl::Status s = Error(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(field + ": "));
}

TEST(ChatRequestTest, ValidRequestGetsServerDefaults) {
  absl::StatusOr<TurnRequest> t = ParseChatRequest(Valid(), TurnLimits{100, 77}, kModels);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->session_id, "s1");
  EXPECT_EQ(t->options.user_message, "héllo 世界 🙂");
  EXPECT_EQ(t->options.max_tokens, 77);
  EXPECT_EQ(t->options.sampling.temperature, 0.0f);
  EXPECT_EQ(t->options.sampling.top_p, 1.0f);
  EXPECT_FALSE(t->options.seed.has_value());
  EXPECT_FALSE(t->options.policy.has_value());
  EXPECT_EQ(t->options.explicit_model, -1);
  EXPECT_FALSE(t->options.strategy.has_value());
  EXPECT_FALSE(t->options.native_layers.has_value());
}

TEST(ChatRequestTest, OverridesAreCarriedOver) {
  kvlingo::v1::ChatRequest r = Valid();
  r.mutable_sampling()->set_max_tokens(5);
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_k(40);
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_seed(0);
  r.mutable_sampling()->add_stop("\n\n");
  r.mutable_routing()->set_policy("explicit");
  r.mutable_routing()->set_model("large");
  r.mutable_routing()->set_strategy(kvlingo::v1::SWITCH_STRATEGY_REPREFILL_MISSING);
  r.mutable_routing()->set_native_layers(0);  // set, even at 0
  absl::StatusOr<TurnRequest> t = ParseChatRequest(r, {}, kModels);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->options.max_tokens, 5);
  EXPECT_EQ(t->options.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(t->options.sampling.top_p, 0.9f);
  ASSERT_TRUE(t->options.seed.has_value());  // an explicit 0 seed is still a seed
  EXPECT_EQ(*t->options.seed, 0u);
  EXPECT_EQ(t->options.policy, router::Policy::kExplicit);
  EXPECT_EQ(t->options.explicit_model, 1);  // large
  EXPECT_EQ(t->options.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(t->options.strategy, router::Strategy::kReprefillMissing);
  EXPECT_EQ(t->options.native_layers, 0);
}

TEST(ChatRequestTest, ASystemPromptIsBoundedInBytesUtf8AndTokens) {
  TurnLimits limits;
  limits.max_system_prompt_bytes = 10;
  EXPECT_TRUE(ValidateSystemPrompt("", limits, 0, 4096).ok());
  EXPECT_TRUE(ValidateSystemPrompt("Be brief.", limits, 6, 4096).ok());
  const absl::Status long_prompt = ValidateSystemPrompt("Be very brief.", limits, 8, 4096);
  EXPECT_EQ(long_prompt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_prompt.message(),
              HasSubstr("system_prompt: 14 bytes is over the server's limit of 10 "
                        "(server.max_system_prompt_bytes)"));
  const absl::Status bad_utf8 = ValidateSystemPrompt("ab\xff", limits, 3, 4096);
  EXPECT_EQ(bad_utf8.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_utf8.message(), HasSubstr("system_prompt: not valid UTF-8"));
  // A preamble that fills the context leaves no room for a turn.
  limits.max_system_prompt_bytes = 1 << 20;
  const absl::Status no_room = ValidateSystemPrompt("x", limits, 4096, 4096);
  EXPECT_EQ(no_room.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_room.message(), HasSubstr("renders to 4096 tokens"));
  EXPECT_TRUE(ValidateSystemPrompt("x", limits, 4095, 4096).ok());
  EXPECT_TRUE(ValidateSystemPrompt("x", limits, 1 << 20, 0).ok());  // no models: not checked
}

TEST(ChatRequestTest, EachBadFieldIsNamed) {
  kvlingo::v1::ChatRequest r = Valid();
  r.clear_session_id();
  ExpectInvalid(r, "session_id");
  r = Valid();
  r.set_session_id("a b");
  ExpectInvalid(r, "session_id");
  r = Valid();
  r.clear_user_message();
  ExpectInvalid(r, "user_message");
  r = Valid();
  r.set_user_message(std::string(65537, 'x'));
  ExpectInvalid(r, "user_message");
  r = Valid();
  r.mutable_sampling()->set_max_tokens(4097);
  ExpectInvalid(r, "sampling.max_tokens");
  for (float bad : {-0.1f, 2.01f, std::numeric_limits<float>::quiet_NaN()}) {
    r = Valid();
    r.mutable_sampling()->set_temperature(bad);
    ExpectInvalid(r, "sampling.temperature");
  }
  for (float bad : {-0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    r = Valid();
    r.mutable_sampling()->set_top_p(bad);
    ExpectInvalid(r, "sampling.top_p");
  }
  r = Valid();
  r.mutable_sampling()->add_stop("");
  ExpectInvalid(r, "sampling.stop[0]");
  r = Valid();
  for (size_t i = 0; i <= kMaxStopStrings; ++i) r.mutable_sampling()->add_stop("x");
  ExpectInvalid(r, "sampling.stop");
  r = Valid();
  r.mutable_routing()->set_policy("random");
  ExpectInvalid(r, "routing.policy");
  r = Valid();
  r.mutable_routing()->set_strategy(static_cast<kvlingo::v1::SwitchStrategy>(9));
  ExpectInvalid(r, "routing.strategy");
}

TEST(ChatRequestTest, AModelThatIsNotLoadedIsNotFoundAndNamesTheLoadedOnes) {
  kvlingo::v1::ChatRequest r = Valid();
  r.mutable_routing()->set_model("huge");
  const absl::Status s = Error(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("routing.model: no model named 'huge' is loaded (loaded: small, large)"));
}

TEST(ChatRequestTest, MaxTurnBytesIsInclusive) {
  kvlingo::v1::ChatRequest r = Valid();
  r.set_user_message(std::string(10, 'x'));
  EXPECT_TRUE(ParseChatRequest(r, TurnLimits{10, 1}, kModels).ok());
  r.set_user_message(std::string(11, 'x'));
  EXPECT_THAT(Error(r, TurnLimits{10, 1}).message(),
              HasSubstr("11 bytes is over the server's limit of 10"));
}

// The validator itself is tested with the tokenizer (tests/model/tokenizer_test.cc,
// Utf8Test); here, that a request names the field and the offset.
TEST(ChatRequestTest, InvalidUtf8IsRejectedWithTheFieldAndOffset) {
  kvlingo::v1::ChatRequest r = Valid();
  r.set_user_message("bad \xFF byte");
  EXPECT_EQ(Error(r).message(), "user_message: not valid UTF-8 (first bad byte at offset 4)");
}

}  // namespace
}  // namespace kvl::server
