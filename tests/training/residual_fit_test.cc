// The native-depth dial's residual maps fitted in closed form
// (training/residual_fit.h): checked by recomputing, from the fitted maps'
// own predictions over the fitting data, the R² the fit reports and the
// least-squares conditions (the residuals are orthogonal to every input and
// sum to zero), on two random models over the house tokenizer.
#include "training/residual_fit.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/engine.h"
#include "tests/training/translator_fixture.h"
#include "training/translator_data.h"

namespace kvl::training {
namespace {

// Two random models over the house tokenizer (2 source layers, 3 target
// layers, 2 KV heads of 8, width 32), a random translator between them and a
// short chat corpus; fits read 10 sequences of 48 tokens.
class ResidualFitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = testing::WriteRandomModel(dir_, "s", 2, 2, 1);
    target_ = testing::WriteRandomModel(dir_, "t", 3, 2, 2);
    corpus_ = dir_.WriteFile("corpus.txt", testing::TinyChatCorpus(1000, 30));
    RuntimeOptions runtime;
    runtime.n_threads = 1;
    runtime.prefill_chunk = 48;
    auto pair = LoadTranslatorPair(source_, target_, runtime);
    ASSERT_TRUE(pair.ok()) << pair.status();
    pair_ = std::make_unique<TranslatorPair>(*std::move(pair));
    translator_ = testing::MakeTranslator(source_, target_, false, 3);
    options_.data_path = corpus_;
    options_.seq_len = 48;
    options_.max_sequences = 10;
    options_.progress = false;
  }

  testing::TempDir dir_{"residual_fit"};
  std::string source_, target_, corpus_;
  std::unique_ptr<TranslatorPair> pair_;
  std::unique_ptr<Translator> translator_;
  ResidualFitOptions options_;
};

TEST_F(ResidualFitTest, TheFitIsTheLeastSquaresSolutionAndReportsItsR2) {
  TranslatorPair* pair = pair_.get();
  Translator* translator = translator_.get();
  const std::string& corpus = corpus_;
  ResidualFitOptions o = options_;
  o.ridge = 0;
  auto fit = FitResidualMaps(o, *pair, *translator);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_EQ(fit->maps.size(), 2u);  // layers 1 and 2 of 3
  EXPECT_EQ(fit->maps[0].layer, 1);
  EXPECT_EQ(fit->maps[1].layer, 2);
  EXPECT_EQ(fit->maps[0].source_layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(fit->n_sequences, 10);
  ASSERT_TRUE(translator->SetResidualMaps(fit->maps, 1, "test").ok());

  // The fitting data again, predicted by the maps.
  auto sequences = ReadSequences(corpus, *pair->source.tokenizer, 48, 10);
  ASSERT_TRUE(sequences.ok());
  c10::InferenceMode guard;
  for (size_t m = 0; m < 2; ++m) {
    const int64_t layer = fit->maps[m].layer;
    at::Tensor sse = at::zeros({}, at::kDouble), sum_y = at::zeros({32}, at::kDouble);
    at::Tensor sum_y2 = at::zeros({}, at::kDouble);
    at::Tensor gradient = at::zeros({2 * 2 * 16 + 1, 32}, at::kDouble);  // Xᵀ(Y - XW)
    int64_t count = 0;
    for (const std::vector<int64_t>& ids : *sequences) {
      const int64_t n = static_cast<int64_t>(ids.size());
      auto source_line = pair->source.engine->NewCache();
      auto target_line = pair->target.engine->NewCache();
      ASSERT_TRUE(pair->source.engine->Prefill(*source_line, ids).ok());
      auto residuals = pair->target.engine->PrefillResiduals(*target_line, ids);
      ASSERT_TRUE(residuals.ok());
      auto taps = source_line->Taps(0, n);
      ASSERT_TRUE(taps.ok());
      auto predicted = translator->PredictResidual(*taps, layer);
      ASSERT_TRUE(predicted.ok()) << predicted.status();
      const at::Tensor y = (*residuals)[layer].to(at::kDouble);
      const at::Tensor error = y - predicted->to(at::kDouble);
      // The inputs: keys of source layers 0 and 1, then their values, then 1.
      std::vector<at::Tensor> x;
      for (const at::Tensor* side : {&taps->keys, &taps->values}) {
        for (int64_t sl = 0; sl < 2; ++sl) {
          x.push_back((*side)[sl].transpose(0, 1).reshape({n, -1}).to(at::kDouble));
        }
      }
      x.push_back(at::ones({n, 1}, at::kDouble));
      gradient += at::mm(at::cat(x, 1).t(), error);
      sse += error.square().sum();
      sum_y += y.sum(0);
      sum_y2 += y.square().sum();
      count += n;
    }
    const double sst = (sum_y2 - sum_y.square().sum() / count).item<double>();
    EXPECT_NEAR(1.0 - sse.item<double>() / sst, fit->r2[m], 1e-4) << "layer " << layer;
    EXPECT_GT(fit->r2[m], 0.0);
    EXPECT_LT(fit->r2[m], 1.0);
    // Least squares: the errors are orthogonal to every input column.
    EXPECT_LT(gradient.abs().max().item<double>(), 1e-3 * std::sqrt(sum_y2.item<double>() * count))
        << "layer " << layer;
  }
}

TEST_F(ResidualFitTest, AnchorsAddInputsAndErrorsNameWhatIsWrong) {
  TranslatorPair* pair = pair_.get();
  const Translator* plain = translator_.get();
  const at::Tensor table =
      AnchorTable(pair->target.checkpoint.weights.embed_tokens, pair->target.config().rms_norm_eps);
  std::unique_ptr<Translator> anchored = testing::WithAnchors(*plain, table, 2, 0.0);

  ResidualFitOptions o = options_;
  o.ridge = 1e-6;
  o.layers = {2};
  o.source_layers = {1};
  auto without = FitResidualMaps(o, *pair, *plain);
  auto with = FitResidualMaps(o, *pair, *anchored);
  ASSERT_TRUE(without.ok() && with.ok());
  ASSERT_EQ(with->maps.size(), 1u);
  EXPECT_EQ(with->maps[0].source_layers, (std::vector<int64_t>{1}));
  EXPECT_EQ(with->maps[0].anchor.sizes(), (at::IntArrayRef{32, 2 * 32}));
  EXPECT_FALSE(without->maps[0].anchor.defined());
  // More inputs explain at least as much of the fitting data.
  EXPECT_GE(with->r2[0], without->r2[0] - 1e-6);
  ASSERT_TRUE(anchored->SetResidualMaps(with->maps, 1, "").ok());

  o.layers = {0};
  EXPECT_EQ(FitResidualMaps(o, *pair, *plain).status().code(), absl::StatusCode::kInvalidArgument);
  o.layers = {3};
  EXPECT_EQ(FitResidualMaps(o, *pair, *plain).status().code(), absl::StatusCode::kInvalidArgument);
  o.layers = {1};
  o.source_layers = {2};
  EXPECT_EQ(FitResidualMaps(o, *pair, *plain).status().code(), absl::StatusCode::kInvalidArgument);
  o.source_layers = {};
  // A translator built for other models.
  std::unique_ptr<Translator> reverse = testing::MakeTranslator(target_, source_, false, 3);
  EXPECT_EQ(FitResidualMaps(o, *pair, *reverse).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvl::training
