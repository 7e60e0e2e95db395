// The translator commands as users run them: `kvl logits` through a
// translator, and `kvl eval-translator`'s report (training/translator_eval.h),
// checked against the eager reference forward computed here (the oracle) and
// against what an identity translation must give.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "model/checkpoint.h"
#include "model/reference.h"
#include "model/token_alignment.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/training/translator_fixture.h"
#include "training/translator_eval.h"
#include "training/translator_data.h"
#include "translator/translator.h"

namespace kvl::training {
namespace {

using testing::RunProcess;
using testing::RunResult;
using testing::TempDir;

constexpr auto kTimeout = std::chrono::seconds(120);

class TranslatorToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = testing::WriteRandomModel(dir_, "a", 2, 2, 5);
    b_ = testing::WriteRandomModel(dir_, "b", 3, 1, 6);
    identity_ = dir_.Path("a_to_a.safetensors");
    ASSERT_TRUE(testing::MakeTranslator(a_, a_, true)->Save(identity_).ok());
    a_to_b_ = dir_.Path("a_to_b.safetensors");
    ASSERT_TRUE(testing::MakeTranslator(a_, b_, false, 1)->Save(a_to_b_).ok());
    b_to_a_ = dir_.Path("b_to_a.safetensors");
    ASSERT_TRUE(testing::MakeTranslator(b_, a_, false, 2)->Save(b_to_a_).ok());
    data_ = dir_.WriteFile("test.txt", testing::TinyChatCorpus(77000, 40));
  }

  nlohmann::json Logits(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {KVL_CLI_BIN, "logits", "--model", a_, "--ids",
                                     absl::StrJoin(ids_, ","), "--threads", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<RunResult> run = RunProcess(argv, kTimeout);
    EXPECT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 0) << run->err;
    return nlohmann::json::parse(run->out);
  }

  // A random model over the second house tokenizer (models/tokenizer-t2) in
  // *dir, and a translator from `a` to it in *a_to_c.
  void TargetOnSecondTokenizer(std::string* dir, std::string* a_to_c) {
    const std::string t2 = std::string(KVL_SOURCE_DIR) + "/models/tokenizer-t2";
    ModelConfig config = testing::TinyConfig({"qwen3", true, false, true, 4, 2}, 2, 32, 8, 3072);
    *dir = dir_.Path("c");
    ASSERT_TRUE(SaveCheckpoint(*dir, config, testing::RandomWeights(config, 8, 0.25),
                               DType::kFloat32, t2 + "/tokenizer.json",
                               t2 + "/tokenizer_config.json")
                    .ok());
    *a_to_c = dir_.Path("a_to_c.safetensors");
    ASSERT_TRUE(testing::MakeTranslator(a_, *dir, false, 4)->Save(*a_to_c).ok());
  }

  // Mean NLL over the continuation of the windows eval-translator uses, by the
  // reference forward: native (whole window) or without the prefix.
  double ReferenceContinuationNll(const std::string& dir, bool with_prefix, int64_t p, int64_t c,
                                  int64_t n_windows) {
    c10::InferenceMode guard;
    auto ckpt = LoadCheckpoint(dir);
    auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
    std::ifstream in(data_);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::vector<int32_t> stream = (*tok)->Encode(text, true);
    double sum = 0;
    for (int64_t w = 0; w < n_windows; ++w) {
      const int64_t start = w * (p + c + 1);
      std::vector<int64_t> ids(stream.begin() + start, stream.begin() + start + p + c + 1);
      const int64_t first = with_prefix ? 0 : p;
      at::Tensor input = at::tensor(std::vector<int64_t>(ids.begin() + first, ids.end() - 1))
                             .unsqueeze(0);
      at::Tensor logits = ReferenceForward(ckpt->config, ckpt->weights, input).logits[0];
      logits = logits.narrow(0, logits.size(0) - c, c);
      const at::Tensor labels = at::tensor(std::vector<int64_t>(ids.end() - c, ids.end()));
      sum += at::cross_entropy_loss(logits, labels).item<double>();
    }
    return sum / static_cast<double>(n_windows);
  }

  // a -> b with both translators for a short multi-turn run (4 switches of
  // 8-token turns, 2 runs) and one 16 + 8 perplexity window.
  // a -> a through `translator` (both ways for the multi-turn runs): 24-token
  // prefixes, 16-token continuations, 3 switches of 10 tokens, 2 runs.
  training::TranslatorEvalOptions SelfEvalOptions(const std::string& translator,
                                                  int64_t windows) const {
    training::TranslatorEvalOptions o;
    o.source_dir = o.target_dir = a_;
    o.translators = {translator};
    o.data_path = data_;
    o.prefix = 24;
    o.continuation = 16;
    o.first_k = 4;
    o.max_windows = windows;
    o.multi_turn_forward = o.multi_turn_reverse = translator;
    o.n_switches = 3;
    o.turn_len = 10;
    o.multi_turn_runs = 2;
    o.n_threads = 1;
    o.progress = false;
    return o;
  }

  training::TranslatorEvalOptions AToBWithMultiTurn() const {
    training::TranslatorEvalOptions o;
    o.source_dir = a_;
    o.target_dir = b_;
    o.translators = {a_to_b_};
    o.data_path = data_;
    o.prefix = 16;
    o.continuation = 8;
    o.max_windows = 1;
    o.multi_turn_forward = a_to_b_;
    o.multi_turn_reverse = b_to_a_;
    o.n_switches = 4;
    o.turn_len = 8;
    o.multi_turn_runs = 2;
    o.n_threads = 1;
    o.progress = false;
    return o;
  }

  TempDir dir_{"translator-tools"};
  std::string a_, b_, identity_, a_to_b_, b_to_a_, data_;
  const std::vector<int64_t> ids_ = {5, 300, 17, 4000, 42, 9, 1234, 77, 2048, 3, 611, 90};
};

TEST_F(TranslatorToolsTest, FitWithGreedyAssignmentWritesALoadableTranslatorAndItsR2) {
  // b (3 layers) -> a (2 layers), two source layers per target layer chosen
  // by greedy match; the assignment and per-layer R² land in <out>.r2.json.
  const std::string out = dir_.Path("b_to_a.greedy.safetensors");
  absl::StatusOr<RunResult> run =
      RunProcess({KVL_CLI_BIN, "fit", "--source", b_, "--target", a_, "--data", data_, "--out",
                  out, "--assignment", "greedy", "--band", "2", "--seq-len", "64",
                  "--max-sequences", "8", "--threads", "1", "--quiet"},
                 kTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;
  std::ifstream in(dir_.Path("b_to_a.greedy.r2.json"));
  const nlohmann::json r2 = nlohmann::json::parse(in);
  EXPECT_EQ(r2["assignment"], "greedy");
  ASSERT_EQ(r2["assignment_keys"].size(), 2u);
  for (const auto& side : {r2["assignment_keys"], r2["assignment_values"]}) {
    for (const auto& layers : side) {
      ASSERT_EQ(layers.size(), 2u);
      EXPECT_LT(layers[0].get<int>(), layers[1].get<int>());
      EXPECT_LT(layers[1].get<int>(), 3);
    }
  }
  // The server-side loader accepts it for these two models: kvl logits through it.
  const nlohmann::json through =
      Logits({"--prefix-from", b_, "--translator", out, "--prefix-len", "4"});
  EXPECT_EQ(through["logits"].size(), ids_.size() - 4);

  absl::StatusOr<RunResult> bad = RunProcess(
      {KVL_CLI_BIN, "fit", "--source", b_, "--target", a_, "--data", data_, "--out", out,
       "--assignment", "greedy", "--band", "4", "--quiet"},
      kTimeout);
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(bad->exit_code, 0);
  EXPECT_NE(bad->err.find("band must be in [1, 3]"), std::string::npos) << bad->err;

  // --band all: each target layer reads all three source layers.
  const std::string all = dir_.Path("b_to_a.all.safetensors");
  run = RunProcess({KVL_CLI_BIN, "fit", "--source", b_, "--target", a_, "--data", data_, "--out",
                    all, "--assignment", "relative_depth", "--band", "all", "--seq-len", "64",
                    "--max-sequences", "8", "--threads", "1", "--quiet"},
                   kTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;
  std::ifstream all_in(dir_.Path("b_to_a.all.r2.json"));
  const nlohmann::json all_r2 = nlohmann::json::parse(all_in);
  EXPECT_EQ(all_r2["band"], 3);
  for (const auto& side : {all_r2["assignment_keys"], all_r2["assignment_values"]}) {
    ASSERT_EQ(side.size(), 2u);
    for (const auto& layers : side) EXPECT_EQ(layers, nlohmann::json({0, 1, 2}));
  }
}

TEST_F(TranslatorToolsTest, LogitsThroughAnIdentityTranslatorMatchNativeLogits) {
  const nlohmann::json native = Logits({});
  const nlohmann::json translated =
      Logits({"--prefix-from", a_, "--translator", identity_, "--prefix-len", "5"});
  ASSERT_EQ(translated["first_position"].get<int64_t>(), 5);
  ASSERT_EQ(translated["logits"].size(), ids_.size() - 5);
  // Same model, same arithmetic except the k-norm/RoPE inversion of the taps
  // and their re-application: float32 round-off only.
  for (size_t t = 5; t < ids_.size(); ++t) {
    const at::Tensor want = at::tensor(native["logits"][t].get<std::vector<float>>());
    const at::Tensor got = at::tensor(translated["logits"][t - 5].get<std::vector<float>>());
    EXPECT_LT((got - want).abs().max().item<float>(), 1e-4) << "position " << t;
  }
  // A real translation changes them.
  const nlohmann::json other = Logits({"--prefix-from", b_, "--translator", b_to_a_,
                                       "--prefix-len", "5"});
  const at::Tensor want = at::tensor(native["logits"][5].get<std::vector<float>>());
  const at::Tensor got = at::tensor(other["logits"][0].get<std::vector<float>>());
  EXPECT_GT((got - want).abs().max().item<float>(), 1e-2);
}

TEST_F(TranslatorToolsTest, LogitsRefuseATranslatorForOtherModelsAndBadPrefixLengths) {
  absl::StatusOr<RunResult> run = RunProcess(
      {KVL_CLI_BIN, "logits", "--model", a_, "--ids", "1,2,3,4", "--prefix-from", a_,
       "--translator", a_to_b_, "--prefix-len", "2"},
      kTimeout);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->exit_code, 1);
  EXPECT_NE(run->err.find("target model"), std::string::npos) << run->err;
  run = RunProcess({KVL_CLI_BIN, "logits", "--model", a_, "--ids", "1,2,3,4", "--prefix-from", a_,
                    "--translator", identity_, "--prefix-len", "4"},
                   kTimeout);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->exit_code, 2) << run->err;
}

TEST_F(TranslatorToolsTest, EvalOfAnIdentityTranslatorMatchesNativeAndTheReference) {
  const training::TranslatorEvalOptions o = SelfEvalOptions(identity_, 3);
  absl::StatusOr<training::TranslatorEvalReport> r = training::RunTranslatorEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->n_windows, 3);
  ASSERT_EQ(r->conditions.size(), 4u);
  EXPECT_NEAR(r->conditions[0].log_ppl, ReferenceContinuationNll(a_, true, 24, 16, 3), 1e-4);
  EXPECT_NEAR(r->conditions[1].log_ppl, ReferenceContinuationNll(a_, false, 24, 16, 3), 1e-4);
  EXPECT_NEAR(r->conditions[2].log_ppl, r->conditions[0].log_ppl, 1e-6);  // source == target
  ASSERT_EQ(r->translated.size(), 1u);
  EXPECT_NEAR(r->translated[0].gap, 0.0, 1e-5);
  EXPECT_NEAR(r->translated[0].gap_first, 0.0, 1e-5);
  EXPECT_NEAR(r->translated[0].recovered, 1.0, 1e-3);
  // Identical per window, so the paired standard errors vanish.
  EXPECT_NEAR(r->translated[0].gap_se, 0.0, 1e-5);
  EXPECT_NEAR(r->translated[0].recovered_se, 0.0, 1e-3);
  ASSERT_EQ(r->multi_turn.size(), 3u);
  for (const training::MultiTurnRow& row : r->multi_turn) {
    EXPECT_NEAR(row.span_wise, row.reprefill, 1e-4) << "turn " << row.turn;
    EXPECT_NEAR(row.whole_prefix, row.reprefill, 1e-4) << "turn " << row.turn;
  }
  EXPECT_EQ(r->multi_turn[0].model, "target");
  EXPECT_EQ(r->multi_turn[1].model, "source");
}

// A token-anchored translator needs each span's ids: with zero anchor weights
// it must evaluate exactly as its unanchored maps, multi-turn spans included.
TEST_F(TranslatorToolsTest, TokenAnchoredTranslatorsGetTheirSpansIds) {
  const at::Tensor table = at::randn({4096, 32}, at::make_generator<at::CPUGeneratorImpl>(3));
  const std::string anchored = dir_.Path("a_to_a_anchored.safetensors");
  ASSERT_TRUE(testing::WithAnchors(*testing::MakeTranslator(a_, a_, true), table, 3, 0.0)
                  ->Save(anchored)
                  .ok());
  const training::TranslatorEvalOptions o = SelfEvalOptions(anchored, 2);
  absl::StatusOr<training::TranslatorEvalReport> r = training::RunTranslatorEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->translated.size(), 1u);
  EXPECT_NEAR(r->translated[0].gap, 0.0, 1e-5);
  ASSERT_EQ(r->multi_turn.size(), 3u);
  for (const training::MultiTurnRow& row : r->multi_turn) {
    EXPECT_NEAR(row.span_wise, row.reprefill, 1e-4) << "turn " << row.turn;
    EXPECT_NEAR(row.whole_prefix, row.reprefill, 1e-4) << "turn " << row.turn;
  }
}

TEST_F(TranslatorToolsTest, MultiTurnStrategiesAgreeAtTheFirstSwitchOnly) {
  training::TranslatorEvalOptions o = AToBWithMultiTurn();
  absl::StatusOr<training::TranslatorEvalReport> r = training::RunTranslatorEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->multi_turn.size(), 4u);
  // At the first switch only the source's native span exists: (a) == (b).
  EXPECT_NEAR(r->multi_turn[0].span_wise, r->multi_turn[0].whole_prefix, 1e-6);
  // From the third turn on, (b) re-translates translations and (a) does not.
  EXPECT_GT(std::abs(r->multi_turn[2].span_wise - r->multi_turn[2].whole_prefix), 1e-4);
  // A translator that is not the identity changes the continuation's NLL.
  EXPECT_GT(std::abs(r->translated[0].gap), 1e-4);

  // And a translator for the other direction is refused with the model named.
  o.translators = {b_to_a_};
  absl::StatusOr<training::TranslatorEvalReport> bad = training::RunTranslatorEval(o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(TranslatorToolsTest, EvalWithANativeTailMatchesTheReferenceOnTheTranslatedHead) {
  // a -> b, prefix 16 of which the target reads the last 5 itself: per window,
  // the reference forward of a captures the taps of tokens [0, 11), the
  // translator moves them, and the reference forward of b runs [11, 24) on
  // that prefix; its NLL over the 8 continuation tokens is the oracle.
  constexpr int64_t kPrefix = 16, kContinuation = 8, kTail = 5, kWindows = 2;
  training::TranslatorEvalOptions o;
  o.source_dir = a_;
  o.target_dir = b_;
  o.translators = {a_to_b_};
  o.data_path = data_;
  o.prefix = kPrefix;
  o.continuation = kContinuation;
  o.max_windows = kWindows;
  o.native_tail = kTail;
  o.n_threads = 1;
  o.progress = false;
  absl::StatusOr<training::TranslatorEvalReport> r = training::RunTranslatorEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->translated.size(), 1u);

  c10::InferenceMode guard;
  auto a = LoadCheckpoint(a_);
  auto b = LoadCheckpoint(b_);
  ASSERT_TRUE(a.ok() && b.ok());
  auto tok = Tokenizer::FromFile(a_ + "/tokenizer.json");
  auto translator = Translator::Load(a_to_b_, {ModelIdentity(a->config, a->weights),
                                               ModelIdentity(b->config, b->weights),
                                               (*tok)->content_hash(), (*tok)->content_hash()});
  ASSERT_TRUE(translator.ok()) << translator.status();
  std::ifstream in(data_);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> stream = (*tok)->Encode(text, true);
  const int64_t window = kPrefix + kContinuation + 1, cut = kPrefix - kTail;
  double sum = 0;
  for (int64_t w = 0; w < kWindows; ++w) {
    const std::vector<int64_t> ids(stream.begin() + w * window, stream.begin() + (w + 1) * window);
    auto ids_of = [&](int64_t from, int64_t to) {
      return at::tensor(std::vector<int64_t>(ids.begin() + from, ids.begin() + to)).unsqueeze(0);
    };
    ReferenceOptions capture;
    capture.capture_kv = true;
    const ReferenceOutput head = ReferenceForward(a->config, a->weights, ids_of(0, cut), capture);
    auto moved = (*translator)->Translate(
        {at::stack(head.keys_prenorm).squeeze(1), at::stack(head.values).squeeze(1)});
    ASSERT_TRUE(moved.ok()) << moved.status();
    ReferenceOptions on_prefix;
    for (int64_t il = 0; il < b->config.n_layer; ++il) {
      on_prefix.prefix_keys.push_back(moved->keys[il].unsqueeze(0));
      on_prefix.prefix_values.push_back(moved->values[il].unsqueeze(0));
    }
    const at::Tensor logits =
        ReferenceForward(b->config, b->weights, ids_of(cut, window - 1), on_prefix).logits[0];
    const at::Tensor labels =
        at::tensor(std::vector<int64_t>(ids.end() - kContinuation, ids.end()));
    sum += at::cross_entropy_loss(logits.narrow(0, kTail, kContinuation), labels).item<double>();
  }
  EXPECT_NEAR(r->translated[0].log_ppl, sum / kWindows, 1e-4);
  EXPECT_EQ(r->native_tail, kTail);

  // Without the tail the same translator reads differently (the oracle above
  // is not the plain switch), and a tail as long as the prefix is refused.
  o.native_tail = 0;
  absl::StatusOr<training::TranslatorEvalReport> plain = training::RunTranslatorEval(o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_GT(std::abs(plain->translated[0].log_ppl - r->translated[0].log_ppl), 1e-4);
  o.native_tail = kPrefix;
  EXPECT_EQ(training::RunTranslatorEval(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TranslatorToolsTest, MultiTurnWithANativeTailAsLongAsATurnTranslatesNothing) {
  // With a tail of a whole turn, each model reads the other's last turn
  // itself, on top of its own native cache: span-wise equals re-prefill. A
  // shorter tail translates the rest of the span, so it does not.
  training::TranslatorEvalOptions o = AToBWithMultiTurn();
  std::vector<std::vector<training::MultiTurnRow>> by_tail;
  for (int64_t tail : {0, 3, 8}) {
    o.native_tail = tail;
    absl::StatusOr<training::TranslatorEvalReport> r = training::RunTranslatorEval(o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->multi_turn.size(), 4u);
    by_tail.push_back(r->multi_turn);
  }
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_NEAR(by_tail[2][k].span_wise, by_tail[2][k].reprefill, 1e-4) << "turn " << k + 1;
    EXPECT_GT(std::abs(by_tail[1][k].span_wise - by_tail[1][k].reprefill), 1e-4) << k + 1;
    EXPECT_GT(std::abs(by_tail[1][k].span_wise - by_tail[0][k].span_wise), 1e-4) << k + 1;
    // (b) and (c) do not depend on the tail.
    EXPECT_EQ(by_tail[1][k].whole_prefix, by_tail[0][k].whole_prefix);
    EXPECT_EQ(by_tail[1][k].reprefill, by_tail[0][k].reprefill);
  }
}

// Across tokenizers (issue 54): a random model over the second house
// tokenizer (models/tokenizer-t2) as the target of `a`. The windows are the
// target's tokens; the translated condition is checked against the switch
// recomputed here (TranslatedCacheAcross on the window's prefix, the target
// reading the rest itself), the source answers the suite in its own tokens,
// and the multi-turn run is refused.
TEST_F(TranslatorToolsTest, EvalAcrossTokenizersRunsInTheTargetsTokens) {
  std::string c_dir, a_to_c;
  ASSERT_NO_FATAL_FAILURE(TargetOnSecondTokenizer(&c_dir, &a_to_c));
  const std::string suite = dir_.WriteFile(
      "suite.jsonl",
      R"({"id":"s-0","task":"facts","difficulty":1,"messages":[{"role":"user","content":)"
      R"("My cat Muffin lives in Nairobi, at 12345 Long Road."},{"role":"assistant","content":)"
      R"("Noted."},{"role":"user","content":"Where does Muffin live?"}],"answer":"Nairobi","scoring":"exact_ci"})"
      "\n");
  training::TranslatorEvalOptions o;
  o.source_dir = a_;
  o.target_dir = c_dir;
  o.translators = {a_to_c};
  o.data_path = data_;
  o.prefix = 40;
  o.continuation = 8;
  o.first_k = 4;
  o.max_windows = 2;
  o.suites = {suite};
  o.max_new_tokens = 4;
  o.n_threads = 1;
  o.progress = false;
  absl::StatusOr<training::TranslatorEvalReport> r = training::RunTranslatorEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->conditions.size(), 3u);  // no source_native
  EXPECT_EQ(r->conditions[0].name, "target_native");
  EXPECT_EQ(r->conditions[1].name, "no_prefix");
  EXPECT_GT(r->align_groups, 0);
  EXPECT_LT(r->align_one_to_one, r->align_groups);
  ASSERT_EQ(r->translated.size(), 1u);

  // The translated condition, recomputed.
  auto source = LoadTranslatorModel(a_);
  auto target = LoadTranslatorModel(c_dir);
  ASSERT_TRUE(source.ok() && target.ok());
  auto translator = Translator::Load(a_to_c, ExpectationFor(*source, *target));
  ASSERT_TRUE(translator.ok()) << translator.status();
  auto stream = ReadTokenStream(data_, *target->tokenizer);
  ASSERT_TRUE(stream.ok());
  const auto windows = ConsecutiveWindows(*stream, 49, 2);
  ASSERT_EQ(windows.size(), 2u);
  double sum = 0;
  for (const std::vector<int64_t>& ids : windows) {
    const std::vector<int64_t> prefix(ids.begin(), ids.begin() + 40);
    auto x = TranslatedCacheAcross(*source, *target, **translator, prefix, 40);
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_GT(x->n_translated, 30);
    const std::vector<int64_t> rest(ids.begin() + x->n_translated, ids.end() - 1);
    auto logits = target->engine->Prefill(*x->cache, rest, true);
    ASSERT_TRUE(logits.ok());
    const std::vector<double> nll = TokenNll(logits->narrow(0, 40 - x->n_translated, 8),
                                             std::vector<int64_t>(ids.end() - 8, ids.end()));
    for (double v : nll) sum += v / 16;
  }
  EXPECT_NEAR(r->translated[0].log_ppl, sum, 1e-4);

  // The suite: the target, the source in its own tokens, the translation.
  ASSERT_EQ(r->accuracy_conditions.size(), 3u);
  for (const std::string& c : r->accuracy_conditions) {
    EXPECT_EQ(r->accuracy.at(c).at("all").n_items, 1) << c;
  }

  o.multi_turn_forward = a_to_c;
  o.multi_turn_reverse = a_to_c;
  EXPECT_EQ(training::RunTranslatorEval(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// UnevenGroups::kPrefill: the entries of a group that is not one token to
// one token are the target's own prefill of the group's tokens after what
// precedes them; everything else is the plain translation. Checked against
// the plain translation's entries and a prefill on top of its prefix; the
// evaluation's translated condition moves, and is refused with one tokenizer.
TEST_F(TranslatorToolsTest, PrefillUnevenGroupsFillsThemWithTheTargetsOwnEntries) {
  std::string c_dir, a_to_c;
  ASSERT_NO_FATAL_FAILURE(TargetOnSecondTokenizer(&c_dir, &a_to_c));
  auto source = LoadTranslatorModel(a_);
  auto target = LoadTranslatorModel(c_dir);
  ASSERT_TRUE(source.ok() && target.ok());
  auto translator = Translator::Load(a_to_c, ExpectationFor(*source, *target));
  ASSERT_TRUE(translator.ok()) << translator.status();
  auto stream = ReadTokenStream(data_, *target->tokenizer);
  ASSERT_TRUE(stream.ok());
  const std::vector<int64_t> ids(stream->begin(), stream->begin() + 60);
  auto plain = TranslatedCacheAcross(*source, *target, **translator, ids, 60);
  auto mixed =
      TranslatedCacheAcross(*source, *target, **translator, ids, 60, UnevenGroups::kPrefill);
  ASSERT_TRUE(plain.ok() && mixed.ok());
  ASSERT_EQ(mixed->n_translated, plain->n_translated);
  ASSERT_EQ(mixed->cache->Length(), plain->cache->Length());

  // The groups, as TranslatedCacheAcross forms them.
  const std::vector<int32_t> t32(ids.begin(), ids.end());
  const std::string text = target->tokenizer->Decode(t32);
  auto groups = AlignSpellings(*source->tokenizer, source->tokenizer->Encode(text),
                               *target->tokenizer, t32, text);
  ASSERT_TRUE(groups.ok()) << groups.status();
  const AlignedGroup* first_uneven = nullptr;
  const AlignedGroup* last_even = nullptr;
  for (const AlignedGroup& g : *groups) {
    if (g.b_end > plain->n_translated) break;
    if (!g.one_to_one() && first_uneven == nullptr) first_uneven = &g;
    if (g.one_to_one() && first_uneven != nullptr) last_even = &g;
  }
  ASSERT_NE(first_uneven, nullptr);
  ASSERT_NE(last_even, nullptr);
  // Every layer's attention keys and values of entries [begin, end).
  auto entries = [](const KvCache& c, int64_t begin, int64_t end) {
    std::vector<at::Tensor> kv;
    for (int64_t il = 0; il < c.n_layer(); ++il) {
      kv.push_back(c.Keys(il).narrow(1, begin, end - begin));
      kv.push_back(c.Values(il).narrow(1, begin, end - begin));
    }
    return at::stack(kv);
  };
  const int64_t b = first_uneven->b_begin, e = first_uneven->b_end;
  // Before the first uneven group: the translation.
  if (b > 0) {
    EXPECT_TRUE(at::equal(entries(*mixed->cache, 0, b), entries(*plain->cache, 0, b)));
  }
  // The group: the target's prefill after the translation of what precedes
  // it (the translation of the groups before b alone: b is a group boundary).
  auto before = TranslatedCacheAcross(*source, *target, **translator, ids, b);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->cache->Length(), b);
  ASSERT_TRUE(target->engine
                  ->Prefill(*before->cache, std::vector<int64_t>(ids.begin() + b, ids.begin() + e))
                  .ok());
  const at::Tensor got = entries(*mixed->cache, b, e);
  EXPECT_TRUE(at::allclose(got, entries(*before->cache, b, e), 1e-5, 1e-6));
  EXPECT_FALSE(at::allclose(got, entries(*plain->cache, b, e), 1e-3, 1e-3));
  // A one-to-one group after it: still the translation.
  EXPECT_TRUE(at::equal(entries(*mixed->cache, last_even->b_begin, last_even->b_end),
                        entries(*plain->cache, last_even->b_begin, last_even->b_end)));

  training::TranslatorEvalOptions o;
  o.source_dir = a_;
  o.target_dir = c_dir;
  o.translators = {a_to_c};
  o.data_path = data_;
  o.prefix = 40;
  o.continuation = 8;
  o.max_windows = 2;
  o.n_threads = 1;
  o.progress = false;
  auto translated = training::RunTranslatorEval(o);
  o.prefill_uneven_groups = true;
  auto prefilled = training::RunTranslatorEval(o);
  ASSERT_TRUE(translated.ok() && prefilled.ok());
  EXPECT_GT(std::abs(prefilled->translated[0].log_ppl - translated->translated[0].log_ppl), 1e-6);
  EXPECT_TRUE(training::TranslatorEvalJson(o, *prefilled)["prefill_uneven_groups"].get<bool>());
  o.target_dir = a_;
  o.translators = {identity_};
  EXPECT_EQ(training::RunTranslatorEval(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EvalStandardErrorTest, PairedDifferenceIsTheStandardErrorOfTheMeanDifference) {
  // Differences 0, 1, 2, 3: sample variance 5/3, standard error sqrt(5/3 / 4).
  EXPECT_NEAR(training::PairedDifferenceStandardError({1, 3, 5, 7}, {1, 2, 3, 4}),
              std::sqrt(5.0 / 12.0), 1e-12);
  EXPECT_EQ(training::PairedDifferenceStandardError({1}, {0}), 0.0);
  // Proportional pairs have an exact ratio: no error.
  EXPECT_NEAR(training::RatioOfMeansStandardError({2, 4, 1}, {1, 2, 0.5}), 0.0, 1e-12);
}

// The delta-method error of a ratio of means against the spread of the ratio
// over many independent samples of 64 windows shaped like eval-translator's
// (a prefix benefit of about 0.24 nats/token, 85% of it recovered, noisy windows).
TEST(EvalStandardErrorTest, RatioOfMeansErrorMatchesTheSpreadOverRepeatedSamples) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> benefit(0.24, 0.12), noise(0.0, 0.05);
  std::vector<double> ratios, errors;
  for (int rep = 0; rep < 4000; ++rep) {
    std::vector<double> gained, total;
    for (int w = 0; w < 64; ++w) {
      total.push_back(benefit(rng));
      gained.push_back(0.85 * total.back() + noise(rng));
    }
    double ga = 0, tb = 0;
    for (int w = 0; w < 64; ++w) {
      ga += gained[w];
      tb += total[w];
    }
    ratios.push_back(ga / tb);
    errors.push_back(training::RatioOfMeansStandardError(gained, total));
  }
  double mean = 0, mean_error = 0;
  for (size_t i = 0; i < ratios.size(); ++i) {
    mean += ratios[i] / ratios.size();
    mean_error += errors[i] / errors.size();
  }
  double var = 0;
  for (double r : ratios) var += (r - mean) * (r - mean) / (ratios.size() - 1);
  EXPECT_NEAR(mean, 0.85, 0.005);
  EXPECT_NEAR(mean_error / std::sqrt(var), 1.0, 0.1)
      << "delta-method " << mean_error << " against spread " << std::sqrt(var);
}

}  // namespace
}  // namespace kvl::training
