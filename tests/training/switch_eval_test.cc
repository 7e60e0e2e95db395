// The recall evaluation (training/switch_eval.h) on the router tests' small
// random models: its shape, and two invariants a correct harness keeps.
#include "training/switch_eval.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tests/router/model_fixture.h"
#include "tests/testing/temp_dir.h"

namespace kvl::training {
namespace {

class SwitchEvalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new kvl::testing::TempDir("switch_eval");
    ASSERT_TRUE(kvl::testing::WriteFixtureModels(dir_->path()).ok());
    ASSERT_TRUE(kvl::testing::WriteFixtureTranslators(dir_->path(),
                                                      {{"small", "large"}, {"large", "small"}})
                    .ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  static SwitchEvalOptions Options() {
    SwitchEvalOptions o;
    o.source_dir = dir_->path() + "/small";
    o.target_dir = dir_->path() + "/large";
    o.translator_path = kvl::testing::TranslatorPath(dir_->path(), "small", "large");
    o.tasks = {"facts", "arith"};
    o.items_per_task = 2;
    o.difficulty = 1;
    o.max_new_tokens = 4;
    o.n_threads = 2;
    o.translate_dtype = DType::kFloat32;
    o.progress = false;
    return o;
  }

  static kvl::testing::TempDir* dir_;
};

kvl::testing::TempDir* SwitchEvalTest::dir_ = nullptr;

TEST_F(SwitchEvalTest, EveryTaskHasEveryConditionOverTheSameItems) {
  SwitchEvalOptions o = Options();
  o.native_tails = {0, 4};
  absl::StatusOr<SwitchEvalReport> r = RunSwitchEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->conditions, (std::vector<std::string>{"source", "reprefill", "translate W=0",
                                                      "translate W=4"}));
  EXPECT_EQ(r->source_name, "small");
  EXPECT_EQ(r->target_name, "large");
  for (const std::string task : {"facts", "arith"}) {
    ASSERT_EQ(r->cells.count(task), 1u) << task;
    for (const std::string& c : r->conditions) {
      const SwitchEvalCell& cell = r->cells.at(task).at(c);
      EXPECT_EQ(cell.n_items + r->n_skipped.at(task), 2) << task << " " << c;
      ASSERT_EQ(cell.answer_nll.size(), static_cast<size_t>(cell.n_items));
      for (double nll : cell.answer_nll) EXPECT_TRUE(std::isfinite(nll) && nll > 0) << nll;
      EXPECT_GE(cell.Accuracy(), 0.0);
      EXPECT_LE(cell.Accuracy(), 1.0);
    }
  }
  const std::string table = SwitchEvalTable(*r);
  EXPECT_THAT(table, ::testing::HasSubstr("| translate W=0 |"));
  EXPECT_THAT(table, ::testing::HasSubstr("recall / reprefill's"));
}

// A native tail longer than any history translates nothing: the target then
// reads what re-prefill gives it (to float32 rounding: the two prefill the
// history in different chunks). And translation changes the target's cache,
// so with no tail the answers of items with a history are scored differently.
TEST_F(SwitchEvalTest, ATailOverTheWholeHistoryIsRePrefillAndNoTailIsNot) {
  SwitchEvalOptions o = Options();
  o.native_tails = {0, 1 << 20};
  absl::StatusOr<SwitchEvalReport> r = RunSwitchEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  double max_translated_difference = 0;
  for (const auto& [task, cells] : r->cells) {
    const SwitchEvalCell& base = cells.at("reprefill");
    const SwitchEvalCell& whole = cells.at("translate W=1048576");
    const SwitchEvalCell& none = cells.at("translate W=0");
    ASSERT_EQ(whole.answer_nll.size(), base.answer_nll.size());
    for (size_t i = 0; i < base.answer_nll.size(); ++i) {
      EXPECT_NEAR(whole.answer_nll[i], base.answer_nll[i], 1e-4) << task << " " << i;
      max_translated_difference =
          std::max(max_translated_difference, std::abs(none.answer_nll[i] - base.answer_nll[i]));
    }
    EXPECT_EQ(whole.correct, base.correct) << task;
  }
  EXPECT_GT(max_translated_difference, 1e-3);
}

// With the switch a turn before the question and background repair, the
// question reads a repaired (native) cache: its answer scores as re-prefill's
// (to float32 rounding: different prefill chunks), where the translated cache
// without repair does not.
TEST_F(SwitchEvalTest, AfterAHandOverTurnTheRepairedConditionScoresAsRePrefill) {
  SwitchEvalOptions o = Options();
  o.native_tails = {0};
  o.hand_over_turn = true;
  o.repair = true;
  absl::StatusOr<SwitchEvalReport> r = RunSwitchEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->conditions, (std::vector<std::string>{"source", "reprefill", "translate W=0",
                                                      "translate W=0 +repair"}));
  double max_translated_difference = 0;
  for (const auto& [task, cells] : r->cells) {
    const SwitchEvalCell& base = cells.at("reprefill");
    const SwitchEvalCell& repaired = cells.at("translate W=0 +repair");
    const SwitchEvalCell& translated = cells.at("translate W=0");
    ASSERT_EQ(repaired.answer_nll.size(), base.answer_nll.size());
    for (size_t i = 0; i < base.answer_nll.size(); ++i) {
      EXPECT_NEAR(repaired.answer_nll[i], base.answer_nll[i], 1e-4) << task << " " << i;
      max_translated_difference = std::max(
          max_translated_difference, std::abs(translated.answer_nll[i] - base.answer_nll[i]));
    }
    EXPECT_EQ(repaired.correct, base.correct) << task;
  }
  EXPECT_GT(max_translated_difference, 1e-3);
}

TEST_F(SwitchEvalTest, BadOptionsAreInvalidArgument) {
  SwitchEvalOptions o = Options();
  o.tasks = {"poetry"};
  EXPECT_EQ(RunSwitchEval(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.translator_path.clear();
  EXPECT_EQ(RunSwitchEval(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.native_tails = {-1};
  EXPECT_EQ(RunSwitchEval(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.repair = true;  // without the hand-over turn there is no turn for it to help
  EXPECT_EQ(RunSwitchEval(o).status().code(), absl::StatusCode::kInvalidArgument);
}

ConversationEvalOptions ConversationOptions(const std::string& dir) {
  ConversationEvalOptions o;
  o.first_dir = dir + "/small";
  o.second_dir = dir + "/large";
  o.forward_translator = kvl::testing::TranslatorPath(dir, "small", "large");
  o.reverse_translator = kvl::testing::TranslatorPath(dir, "large", "small");
  o.conversations = 2;
  o.turns = 4;
  // Longer than any later turn's new tokens (its question, the reply before
  // it, the template), shorter than the document.
  o.native_tail = 40;
  o.max_new_tokens = 4;
  o.n_threads = 2;
  o.translate_dtype = DType::kFloat32;
  o.progress = false;
  return o;
}

// The multi-turn evaluation: turn 1 is native under every strategy; the
// first switch reads the translated document with or without repair; after
// it, the repaired line is what re-prefill computes (to float32 rounding:
// different prefill chunks) while translation alone keeps its error. The
// live run reports a divergence for each first switch, which translates.
TEST_F(SwitchEvalTest, InAConversationRepairMakesEveryTurnAfterTheFirstSwitchScoreAsRePrefill) {
  const ConversationEvalOptions o = ConversationOptions(dir_->path());
  absl::StatusOr<ConversationEvalReport> r = RunConversationEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->strategies,
            (std::vector<std::string>{"reprefill", "translate", "translate +repair"}));
  EXPECT_EQ(r->model_names[0], "small");
  EXPECT_EQ(r->model_names[1], "large");
  double max_translated_difference = 0;
  for (int start = 0; start < 2; ++start) {
    const auto& cells = r->cells.at(start);
    const auto& base = cells.at("reprefill");
    const auto& translated = cells.at("translate");
    const auto& repaired = cells.at("translate +repair");
    ASSERT_EQ(base.size(), 4u);
    for (size_t t = 0; t < 4; ++t) {
      ASSERT_EQ(base[t].answer_nll.size(), 2u);
      for (size_t c = 0; c < 2; ++c) {
        const double nll = base[t].answer_nll[c];
        EXPECT_TRUE(std::isfinite(nll) && nll > 0) << nll;
        if (t == 0) {
          EXPECT_NEAR(translated[t].answer_nll[c], nll, 1e-6) << start << " " << c;
        } else if (t == 1) {
          EXPECT_NEAR(repaired[t].answer_nll[c], translated[t].answer_nll[c], 1e-6);
        } else {
          EXPECT_NEAR(repaired[t].answer_nll[c], nll, 1e-4) << start << " " << t << " " << c;
          max_translated_difference =
              std::max(max_translated_difference, std::abs(translated[t].answer_nll[c] - nll));
        }
      }
      if (t >= 2) {
        EXPECT_EQ(repaired[t].correct, base[t].correct);
      }
    }
    // Every first switch translated the document: its repair measured it.
    for (double d : r->live_divergence.at(start)[1]) EXPECT_TRUE(std::isfinite(d));
    EXPECT_EQ(r->live_correct.at(start)[0].size(), 2u);
  }
  EXPECT_GT(max_translated_difference, 1e-3);
  const std::string table = ConversationEvalTable(*r);
  EXPECT_THAT(table, ::testing::HasSubstr("### Starting on small (2 conversations)"));
  EXPECT_THAT(table, ::testing::HasSubstr("| 3–4 | both |"));
  EXPECT_THAT(table, ::testing::HasSubstr("| small -> large | 2 |"));
  const nlohmann::json j = ConversationEvalJson(o, *r);
  EXPECT_EQ(j["starting_on"]["large"]["translate +repair"].size(), 4u);
}

TEST_F(SwitchEvalTest, AConversationNeedsBothTranslatorsAndTwoTurns) {
  ConversationEvalOptions o = ConversationOptions(dir_->path());
  o.reverse_translator.clear();
  EXPECT_EQ(RunConversationEval(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = ConversationOptions(dir_->path());
  o.turns = 1;
  EXPECT_EQ(RunConversationEval(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl::training
