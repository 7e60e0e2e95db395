// Stage-2 distillation (tools/translator_distill.h): the differentiable
// translation equals the inference one, the KL objective is zero exactly when
// the translated cache is the native one, and a short run lowers the
// validation KL and keeps the best maps.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "tests/tools/translator_fixture.h"
#include "model/reference.h"
#include "tools/translator_attention.h"
#include "tools/translator_distill.h"
#include "tools/translator_tools.h"
#include "translator/fit.h"

namespace kvl {
namespace {

using testing::TempDir;

TEST(TranslateBatchTest, EqualsTranslatorTranslateForEveryBatchRow) {
  TranslatorSpec spec;
  spec.source = {"s", "t", 3, 2, 4};
  spec.target = {"t", "t", 2, 3, 2};
  spec.assignment_kind = "custom";
  spec.assignment.keys = {{2, 0}, {1}};
  spec.assignment.values = {{1, 2}, {0, 1}};
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  TranslatorMaps keys, values;
  for (const auto& [lists, maps] :
       {std::pair{&spec.assignment.keys, &keys}, std::pair{&spec.assignment.values, &values}}) {
    for (const auto& l : *lists) {
      maps->weight.push_back(at::randn({6, 8 * static_cast<int64_t>(l.size())}, gen));
      maps->bias.push_back(at::randn({6}, gen));
    }
  }
  auto tr = Translator::Create(spec, keys, values);
  ASSERT_TRUE(tr.ok()) << tr.status();
  const at::Tensor k = at::randn({3, 2, 2, 5, 4}, gen);  // [L_s, B, H_s, T, D_s]
  const at::Tensor v = at::randn({3, 2, 2, 5, 4}, gen);
  std::vector<at::Tensor> kl, vl;
  for (int64_t l = 0; l < 3; ++l) {
    kl.push_back(k[l]);
    vl.push_back(v[l]);
  }
  const std::vector<at::Tensor> got_k = tools::TranslateBatch(kl, spec.assignment.keys, keys, spec.target);
  const std::vector<at::Tensor> got_v =
      tools::TranslateBatch(vl, spec.assignment.values, values, spec.target);
  ASSERT_EQ(got_k.size(), 2u);
  for (int64_t b = 0; b < 2; ++b) {
    auto want = (*tr)->Translate({k.select(1, b), v.select(1, b)});  // [L_s, H_s, T, D_s]
    ASSERT_TRUE(want.ok()) << want.status();
    for (int64_t il = 0; il < 2; ++il) {
      EXPECT_LT(testing::MaxAbsDiff(got_k[il][b], want->keys[il]), 1e-5);
      EXPECT_LT(testing::MaxAbsDiff(got_v[il][b], want->values[il]), 1e-5);
    }
  }
}

TEST(DistillKlTest, ZeroForAnIdentitySelfTranslationAndPositiveOtherwise) {
  TempDir dir("distill-kl");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 9);
  auto model = tools::LoadTranslatorModel(a);
  ASSERT_TRUE(model.ok()) << model.status();
  const at::Tensor ids = testing::RandomIds(4096, {2, 20}, 4);
  c10::AutoGradMode no_grad(false);
  for (bool identity : {true, false}) {
    std::unique_ptr<Translator> tr = testing::MakeTranslator(a, a, identity, 8);
    const double kl = tools::DistillKl(model->config(), model->weights32, model->config(),
                                       model->weights32, tr->spec(), tr->key_maps(),
                                       tr->value_maps(), ids, 12)
                          .item<double>();
    if (identity) {
      EXPECT_LT(std::abs(kl), 1e-6);
    } else {
      EXPECT_GT(kl, 1e-3);
    }
  }
}

// The attention-weighted fit's forward is the reference model (same logits),
// and the mass it reports is a share of each continuation query's attention.
TEST(AttentionMassTest, ForwardIsTheReferenceModelAndMassIsBounded) {
  const testing::TinyModel shape{"qwen3", true, false, true, 4, 2};
  const ModelConfig config = testing::TinyConfig(shape, 3);
  const ModelWeights weights = testing::RandomWeights(config, 31);
  const at::Tensor ids = testing::RandomIds(config.vocab_size, {1, 24}, 32);
  const std::vector<int64_t> v(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 24);
  const tools::AttentionMass mass = tools::PrefixAttentionMass(config, weights, v, 16);
  c10::AutoGradMode no_grad(false);
  const at::Tensor want = ReferenceForward(config, weights, ids).logits[0];
  EXPECT_LT(testing::MaxAbsDiff(mass.logits, want), 1e-4);
  ASSERT_EQ(mass.received.size(0), 16);
  EXPECT_GE(mass.received.min().item<double>(), 0.0);
  const double total = mass.received.sum().item<double>();
  EXPECT_GT(total, 0.0);
  EXPECT_LE(total, 8.0 + 1e-9);  // 8 continuation queries, each distributing 1
  // One query: its attention over the prefix, averaged over layers and heads, is below 1.
  const tools::AttentionMass last = tools::PrefixAttentionMass(config, weights, v, 23);
  EXPECT_LE(last.received.sum().item<double>(), 1.0 + 1e-9);
  EXPECT_GT(last.received.sum().item<double>(), 0.5);  // the prefix is 23 of 24 keys
}

TEST(DistillTest, ShortRunLowersValidationKlAndKeepsTheBestMaps) {
  TempDir dir("distill");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 21, 0.12);
  const std::string b = testing::WriteRandomModel(dir, "b", 3, 1, 22, 0.12);
  const std::string train = dir.WriteFile("train.txt", testing::TinyChatCorpus(5000, 120));
  const std::string valid = dir.WriteFile("valid.txt", testing::TinyChatCorpus(905000, 20));
  // Stage 1 on the training text, as kvl fit does it.
  auto source = tools::LoadTranslatorModel(a);
  auto target = tools::LoadTranslatorModel(b);
  ASSERT_TRUE(source.ok() && target.ok());
  auto stream = tools::ReadTokenStream(train, *source->tokenizer);
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto moments = MomentAccumulator::Create(source->Endpoint(), target->Endpoint());
  ASSERT_TRUE(moments.ok());
  for (const std::vector<int64_t>& w : tools::ConsecutiveWindows(*stream, 64, 40)) {
    ASSERT_TRUE(AccumulateSequence(*source->engine, *target->engine, w, **moments).ok());
  }
  TranslatorSpec spec;
  spec.source = source->Endpoint();
  spec.target = target->Endpoint();
  spec.assignment_kind = "relative_depth";
  spec.assignment = *RelativeDepthAssignment(2, 3, 1);
  auto fit = (*moments)->Fit(spec, 1e-4);
  ASSERT_TRUE(fit.ok()) << fit.status();
  const std::string init = dir.Path("init.safetensors");
  ASSERT_TRUE(fit->translator->Save(init).ok());

  tools::DistillOptions o;
  o.source_dir = a;
  o.target_dir = b;
  o.init_path = init;
  o.train_path = train;
  o.valid_path = valid;
  o.out_path = dir.Path("distilled.safetensors");
  o.prefix = 32;
  o.continuation = 16;
  o.batch = 4;
  o.steps = 60;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup = 5;
  o.eval_every = 10;
  o.valid_windows = 8;
  o.n_threads = 1;
  o.progress = false;
  o.plot = false;
  auto r = tools::Distill(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->initial_valid_kl, 0.0);
  EXPECT_LT(r->best_valid_kl, 0.85 * r->initial_valid_kl)
      << "initial " << r->initial_valid_kl << " best " << r->best_valid_kl;
  EXPECT_GT(r->best_step, 0);
  ASSERT_EQ(r->log.size(), 60u);

  // The file holds the best maps: recomputing the validation KL with them
  // gives the best value, and it is marked as distilled for these models.
  auto saved = Translator::Load(o.out_path, tools::ExpectationFor(*source, *target));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ((*saved)->spec().training.method, "distilled");
  EXPECT_EQ((*saved)->spec().training.steps, r->best_step);
  auto vstream = tools::ReadTokenStream(valid, *source->tokenizer);
  std::vector<at::Tensor> rows;
  for (const auto& w : tools::ConsecutiveWindows(*vstream, 48, 8)) rows.push_back(at::tensor(w));
  c10::AutoGradMode no_grad(false);
  double kl = 0;
  for (size_t i = 0; i < rows.size(); i += 4) {
    kl += tools::DistillKl(source->config(), source->weights32, target->config(),
                           target->weights32, (*saved)->spec(), (*saved)->key_maps(),
                           (*saved)->value_maps(),
                           at::stack(std::vector<at::Tensor>(rows.begin() + i, rows.begin() + i + 4)),
                           32)
              .item<double>() /
          2;
  }
  EXPECT_NEAR(kl, r->best_valid_kl, 1e-5 * std::max(1.0, kl));

  // An init translator built for other models is refused.
  o.init_path = init;
  o.source_dir = b;
  o.target_dir = a;
  EXPECT_EQ(tools::Distill(o).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvl
