// kvl ablate-translator's core (training/translator_ablate.h): each condition
// mixes exactly the layers it names, checked with a translator whose layer 0
// is the identity between a model and itself and whose layer 1 is random.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "tests/training/translator_fixture.h"
#include "training/translator_ablate.h"
#include "training/translator_distill.h"
#include "training/translator_data.h"

namespace kvl::training {
namespace {

using testing::TempDir;

TEST(AblateTranslatorTest, ConditionsMixExactlyTheNamedLayers) {
  TempDir dir("ablate");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 41, 0.12);
  auto model = training::LoadTranslatorModel(a);
  ASSERT_TRUE(model.ok()) << model.status();
  // a -> a: layer 0 maps are the identity, layer 1's are random.
  const std::unique_ptr<Translator> identity = testing::MakeTranslator(a, a, /*identity=*/true);
  const std::unique_ptr<Translator> random = testing::MakeTranslator(a, a, /*identity=*/false, 7);
  TranslatorMaps keys, values;
  for (auto [maps, id, rnd] : {std::tuple{&keys, &identity->key_maps(), &random->key_maps()},
                               std::tuple{&values, &identity->value_maps(), &random->value_maps()}}) {
    maps->weight = {id->weight[0], rnd->weight[1]};
    maps->bias = {id->bias[0], rnd->bias[1]};
  }
  auto mixed = Translator::Create(identity->spec(), keys, values);
  ASSERT_TRUE(mixed.ok()) << mixed.status();

  std::vector<std::vector<int64_t>> windows;
  for (int w = 0; w < 3; ++w) {
    std::vector<int64_t> ids;
    for (int t = 0; t < 20; ++t) ids.push_back((w * 977 + t * 131 + 5) % 4096);
    windows.push_back(ids);
  }
  auto r = training::AblateTranslator(*model, *model, **mixed, windows, /*n_prefix=*/12, /*batch=*/2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n_windows, 3);
  ASSERT_EQ(r->only_layer.size(), 2u);
  ASSERT_EQ(r->layer_native.size(), 2u);
  // Layer 0 translated alone is the native cache; so is layer 1 native with
  // layer 0 translated.
  EXPECT_NEAR(r->only_layer[0].all, 0.0, 1e-6);
  EXPECT_NEAR(r->layer_native[1].all, 0.0, 1e-6);
  // The random layer is what every other condition pays for.
  EXPECT_GT(r->only_layer[1].all, 1e-3);
  EXPECT_NEAR(r->translated.all, r->only_layer[1].all, 1e-6);
  EXPECT_NEAR(r->layer_native[0].all, r->only_layer[1].all, 1e-6);
  EXPECT_NEAR(r->translated.first, r->only_layer[1].first, 1e-6);
  // Every layer translated is what kvl distill minimises.
  std::vector<at::Tensor> rows;
  for (const auto& w : windows) rows.push_back(at::tensor(w, at::kLong));
  const double distill_kl =
      training::DistillKl(model->config(), model->weights32, model->config(), model->weights32,
                       (*mixed)->spec(), keys, values, at::stack(rows), 12)
          .item<double>();
  EXPECT_NEAR(r->translated.all, distill_kl, 1e-5 * std::max(1.0, distill_kl));
  // Native keys with random-layer values (and the reverse) sit in between.
  EXPECT_GT(r->keys_native.all, 0.0);
  EXPECT_GT(r->values_native.all, 0.0);

  EXPECT_EQ(training::AblateTranslator(*model, *model, **mixed, {}, 12).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(training::AblateTranslator(*model, *model, **mixed, windows, 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Token-anchored maps: the ablation reads each window's anchor rows, as
// kvl distill does, so "every layer translated" is still the distillation KL.
TEST(AblateTranslatorTest, TokenAnchoredMapsReadTheWindowsAnchorRows) {
  TempDir dir("ablate-anchors");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 41, 0.12);
  auto model = training::LoadTranslatorModel(a);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::unique_ptr<Translator> plain = testing::MakeTranslator(a, a, /*identity=*/false, 7);
  const at::Tensor table = at::randn({4096, 32}, at::make_generator<at::CPUGeneratorImpl>(3));
  const std::unique_ptr<Translator> anchored =
      testing::WithAnchors(*plain, table, /*window=*/2, /*scale=*/0.05, /*seed=*/9);
  std::vector<std::vector<int64_t>> windows;
  std::vector<at::Tensor> rows;
  for (int w = 0; w < 3; ++w) {
    std::vector<int64_t> ids;
    for (int t = 0; t < 20; ++t) ids.push_back((w * 977 + t * 131 + 5) % 4096);
    windows.push_back(ids);
    rows.push_back(at::tensor(ids, at::kLong));
  }
  auto with = training::AblateTranslator(*model, *model, *anchored, windows, 12, 2);
  ASSERT_TRUE(with.ok()) << with.status();
  auto without = training::AblateTranslator(*model, *model, *plain, windows, 12, 2);
  ASSERT_TRUE(without.ok()) << without.status();
  const double distill_kl =
      training::DistillKl(model->config(), model->weights32, model->config(), model->weights32,
                          anchored->spec(), anchored->key_maps(), anchored->value_maps(),
                          at::stack(rows), 12, at::Tensor(), anchored->anchor_table())
          .item<double>();
  EXPECT_NEAR(with->translated.all, distill_kl, 1e-5 * std::max(1.0, distill_kl));
  EXPECT_GT(std::abs(with->translated.all - without->translated.all), 1e-4);
}

}  // namespace
}  // namespace kvl::training
