// The rules policy's patterns (router/policy.h, RulePattern): PCRE2 syntax,
// checked at load, and a search bounded in work and stack. The oracle for the
// bounds is what std::regex, used before, did with the same inputs: a 64 KiB
// turn against (a|b)*c overflowed the stack of its recursive matcher
// (SIGSEGV), and the fuzzer's {5555555555555555555} overflowed a signed
// integer in its compiler (tests/fuzz/README.md, regex_quantifier_overflow).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "router/policy.h"

namespace kvl::router {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const RulePattern> Compiled(const std::string& pattern) {
  absl::StatusOr<std::shared_ptr<const RulePattern>> p = RulePattern::Compile(pattern);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : nullptr;
}

TEST(RulePatternTest, SearchesTheTurnWithPerlSyntaxAndUnicode) {
  auto thanks = Compiled("^(Thanks|Thank you)");
  EXPECT_TRUE(thanks->Search("Thank you for that"));
  EXPECT_FALSE(thanks->Search("No, thanks"));
  auto urgent = Compiled("(?i)\\burgent\\b");
  EXPECT_TRUE(urgent->Search("This is URGENT."));
  EXPECT_FALSE(urgent->Search("insurgents"));
  // UTF-8 code points, and Unicode letter classes (PCRE2_UCP).
  auto capital = Compiled("^\\p{Lu}.$");
  EXPECT_TRUE(capital->Search("\xc3\x89t"));  // "Ét"
  EXPECT_TRUE(Compiled("\\w+$")->Search("caf\xc3\xa9"));
  bool gave_up = true;
  EXPECT_FALSE(Compiled("z")->Search("abc", &gave_up));
  EXPECT_FALSE(gave_up);  // an ordinary miss
}

TEST(RulePatternTest, ABadPatternIsRefusedWithPcre2sMessage) {
  for (const std::string pattern : {"(unclosed", "a{5555555555555555555}", "[z-a]", "\\"}) {
    absl::StatusOr<std::shared_ptr<const RulePattern>> p = RulePattern::Compile(pattern);
    ASSERT_FALSE(p.ok()) << pattern;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr("not a valid PCRE2 regular expression"));
    EXPECT_THAT(p.status().message(), HasSubstr("at offset"));
  }
}

TEST(RulePatternTest, ALongTurnNeitherExhaustsTheStackNorRunsAway) {
  // std::regex_search crashed on this (64 KiB of 'a', pattern (a|b)*c).
  const std::string long_turn(64 * 1024, 'a');
  bool gave_up = false;
  EXPECT_FALSE(Compiled("(a|b)*c")->Search(long_turn, &gave_up));
  EXPECT_TRUE(Compiled("(a|b)*$")->Search(long_turn));
  // Exponential backtracking stops at the match limit, in well under a
  // minute, and counts as no match.
  const auto t0 = std::chrono::steady_clock::now();
  gave_up = false;
  EXPECT_FALSE(Compiled("^(a+)+$")->Search(std::string(40, 'a') + "!", &gave_up));
  EXPECT_TRUE(gave_up);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  // Bytes that are not UTF-8: no match, and said.
  gave_up = false;
  EXPECT_FALSE(Compiled("a")->Search("a\xff", &gave_up));
  EXPECT_TRUE(gave_up);
}

TEST(RulesPolicyTest, ARuleWithAPatternRoutesTheTurnsItMatches) {
  PolicyConfig config;
  config.policy = Policy::kRules;
  config.default_model = 0;
  Rule rule;
  rule.model = 1;
  rule.pattern = "(?i)prove|theorem";
  ASSERT_TRUE(CompileRule(&rule).ok());
  config.rules.push_back(rule);
  const std::vector<std::string> names = {"small", "large"};
  RouteChoice matched = ChooseModel(config, Policy::kRules, "Prove that it holds.", 1, -1, 0, names);
  EXPECT_EQ(matched.model, 1);
  EXPECT_THAT(matched.reason, HasSubstr("matches /(?i)prove|theorem/"));
  EXPECT_EQ(ChooseModel(config, Policy::kRules, "Hello there.", 1, -1, 0, names).model, 0);
  // A turn the pattern gives up on goes to the default model.
  config.rules[0].pattern = "^(a+)+$";
  ASSERT_TRUE(CompileRule(&config.rules[0]).ok());
  EXPECT_EQ(ChooseModel(config, Policy::kRules, std::string(40, 'a') + "!", 1, -1, 0, names).model,
            0);
}

}  // namespace
}  // namespace kvl::router
