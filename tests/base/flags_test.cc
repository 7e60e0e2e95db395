// The one flag parser (base/flags.h): forms, types, errors naming the flag,
// the generated help.
#include "base/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace kvl {
namespace {

using ::testing::HasSubstr;

struct Options {
  std::string model;
  std::optional<std::string> listen;
  int64_t steps = 100;
  uint32_t top_k = 0;
  double lr = 0.003;
  bool bf16 = false;
  std::string mode = "fast";
  std::vector<std::string> inputs;
};

FlagSet Declare(Options* o) {
  FlagSet flags("kvl demo", "Does a demo.");
  flags.Required("model", &o->model, "DIR", "the model");
  flags.Add("listen", &o->listen, "HOST:PORT", "where to listen");
  flags.Add("steps", &o->steps, "N", "optimizer steps");
  flags.Add("top-k", &o->top_k, "K", "top-k");
  flags.Add("lr", &o->lr, "LR", "learning rate");
  flags.Switch("bf16", &o->bf16, "bf16 autocast");
  flags.Choice("mode", &o->mode, {"fast", "exact"}, "how");
  flags.Add("input", &o->inputs, "FILE", "an input");
  return flags;
}

TEST(FlagSetTest, BothFormsSwitchesListsAndDefaults) {
  Options o;
  FlagSet flags = Declare(&o);
  ASSERT_TRUE(flags
                  .Parse({"--model", "m", "--steps=-3", "--lr", "1e-4", "--bf16", "--input", "a",
                          "--input=b", "--mode", "exact", "--listen", "127.0.0.1:1"})
                  .ok());
  EXPECT_EQ(o.model, "m");
  EXPECT_EQ(o.steps, -3);  // a value that starts with '-' is still the value
  EXPECT_DOUBLE_EQ(o.lr, 1e-4);
  EXPECT_TRUE(o.bf16);
  EXPECT_EQ(o.inputs, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o.mode, "exact");
  EXPECT_EQ(o.listen, "127.0.0.1:1");
  EXPECT_EQ(o.top_k, 0u);  // untouched default
  EXPECT_TRUE(flags.Given("steps"));
  EXPECT_FALSE(flags.Given("top-k"));
}

TEST(FlagSetTest, EachErrorNamesTheFlagAndChangesNothingElse) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--steps", "5"}, "--model is required"},
           {{"--model="}, "--model is required"},
           {{"--model", "m", "--steps", "x"}, "--steps: expected an integer"},
           {{"--model", "m", "--top-k", "-1"}, "--top-k: expected a non-negative integer"},
           {{"--model", "m", "--top-k", "4294967296"}, "fits 32 bits"},
           {{"--model", "m", "--lr", "fast"}, "--lr: expected a number"},
           {{"--model", "m", "--bf16=1"}, "--bf16 takes no value"},
           {{"--model", "m", "--mode", "slow"}, "--mode: expected one of fast, exact, got 'slow'"},
           {{"--model", "m", "--nope", "1"}, "unknown flag --nope"},
           {{"--model", "m", "--steps"}, "--steps needs a value"},
           {{"--model", "m", "stray"}, "unexpected argument 'stray'"}}) {
    Options o;
    FlagSet flags = Declare(&o);
    const absl::Status s = flags.Parse(c.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

TEST(FlagSetTest, HelpStopsParsingAndListsEveryFlagWithItsDefault) {
  Options o;
  FlagSet flags = Declare(&o);
  ASSERT_TRUE(flags.Parse({"--steps", "7", "--help", "--nope"}).ok());
  EXPECT_TRUE(flags.help_requested());
  const std::string help = flags.Help();
  EXPECT_THAT(help, HasSubstr("usage: kvl demo --model DIR [flags]"));
  EXPECT_THAT(help, HasSubstr("--model DIR"));
  EXPECT_THAT(help, HasSubstr("the model (required)"));
  EXPECT_THAT(help, HasSubstr("optimizer steps (default: 100)"));  // declared, not parsed
  EXPECT_THAT(help, HasSubstr("--mode fast|exact"));
  EXPECT_THAT(help, HasSubstr("an input (repeatable)"));
  EXPECT_THAT(help, HasSubstr("Does a demo."));
}

TEST(FlagSetTest, ParseOrExitReturnsTheExitCodes) {
  Options o;
  FlagSet help = Declare(&o);
  EXPECT_EQ(help.ParseOrExit({"-h"}), 0);
  FlagSet bad = Declare(&o);
  EXPECT_EQ(bad.ParseOrExit({"--nope"}), 2);
  FlagSet good = Declare(&o);
  EXPECT_EQ(good.ParseOrExit({"--model", "m"}), std::nullopt);
  EXPECT_EQ(good.UsageError("--steps must be >= 1"), 2);
}

TEST(FlagSetTest, PositionalArgumentsWhenDeclared) {
  std::vector<std::string> files;
  bool quiet = false;
  FlagSet flags("kvl cat", "");
  flags.Switch("quiet", &quiet, "no output");
  flags.Positional(&files, "FILE", "files to read");
  ASSERT_TRUE(flags.Parse({"a.txt", "--quiet", "-", "b.txt"}).ok());
  EXPECT_EQ(files, (std::vector<std::string>{"a.txt", "-", "b.txt"}));
  EXPECT_TRUE(quiet);
  EXPECT_FALSE(flags.Parse({"-x"}).ok());
}

}  // namespace
}  // namespace kvl
