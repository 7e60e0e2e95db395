#include "translator/translator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/engine.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/model/test_models.h"
#include "tests/testing/temp_dir.h"
#include "translator/resample.h"

namespace kvl {
namespace {

using Lists = std::vector<std::vector<int64_t>>;
using testing::MaxAbsDiff;

TEST(AssignmentTest, SameIndexIsTheDiagonalAndNeedsEqualDepth) {
  auto a = SameIndexAssignment(3, 3);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->keys, (Lists{{0}, {1}, {2}}));
  EXPECT_EQ(a->values, (Lists{{0}, {1}, {2}}));
  EXPECT_EQ(SameIndexAssignment(3, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AssignmentTest, RelativeDepthRoundsAndBandsStayInRange) {
  // round(il * 7 / 3): 0, 2.33, 4.67, 7.
  auto a = RelativeDepthAssignment(8, 4, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->keys, (Lists{{0}, {2}, {5}, {7}}));
  EXPECT_EQ(a->values, a->keys);
  auto b3 = RelativeDepthAssignment(8, 4, 3);
  ASSERT_TRUE(b3.ok());
  EXPECT_EQ(b3->keys, (Lists{{0, 1, 2}, {1, 2, 3}, {4, 5, 6}, {5, 6, 7}}));
  auto b2 = RelativeDepthAssignment(8, 4, 2);
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(b2->keys, (Lists{{0, 1}, {2, 3}, {5, 6}, {6, 7}}));
  // Halves round up: il=1 of 3 into 4 layers sits at 1.5.
  EXPECT_EQ(RelativeDepthAssignment(4, 3, 1)->keys, (Lists{{0}, {2}, {3}}));
  // Deeper target than source: layers repeat.
  EXPECT_EQ(RelativeDepthAssignment(2, 4, 1)->keys, (Lists{{0}, {0}, {1}, {1}}));
  EXPECT_EQ(RelativeDepthAssignment(5, 1, 1)->keys, (Lists{{0}}));
  EXPECT_EQ(RelativeDepthAssignment(8, 4, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RelativeDepthAssignment(8, 4, 9).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AssignmentTest, TopR2PicksTheBestLayersPerSide) {
  const at::Tensor keys = at::tensor({0.1, 0.9, 0.5, 0.8, 0.2, 0.8}).view({2, 3});
  const at::Tensor values = at::tensor({0.7, 0.1, 0.6, 0.0, 0.3, 0.2}).view({2, 3});
  auto a = TopR2Assignment(keys, values, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->keys, (Lists{{1, 2}, {0, 2}}));
  EXPECT_EQ(a->values, (Lists{{0, 2}, {1, 2}}));
  auto one = TopR2Assignment(keys, values, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->keys, (Lists{{1}, {0}}));  // tie 0.8/0.8: lower layer
  EXPECT_EQ(one->values, (Lists{{0}, {1}}));
  EXPECT_EQ(TopR2Assignment(keys, values.view({3, 2}), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TopR2Assignment(keys, values, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TranslatorEndpoint Endpoint(int64_t n_layer, int64_t n_head_kv, int64_t head_dim,
                            const std::string& name) {
  TranslatorEndpoint e;
  e.identity = "model-" + name;
  e.tokenizer_hash = "tok-" + name;
  e.n_layer = n_layer;
  e.n_head_kv = n_head_kv;
  e.head_dim = head_dim;
  return e;
}

TranslatorSpec WithoutAnchors(TranslatorSpec spec) {
  spec.anchor_window = 0;
  return spec;
}

// Random maps for spec's assignment (the value maps scaled differently from the keys').
std::unique_ptr<Translator> RandomTranslator(TranslatorSpec spec, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t out = spec.target.n_head_kv * spec.target.head_dim;
  const int64_t in = spec.source.n_head_kv * spec.source.head_dim;
  TranslatorMaps keys, values;
  for (const auto& [lists, maps] :
       {std::pair{&spec.assignment.keys, &keys}, {&spec.assignment.values, &values}}) {
    for (size_t il = 0; il < lists->size(); ++il) {
      // Joint maps read the key layers and the value layers of their target layer.
      const size_t blocks = spec.inputs == MapInputs::kJoint
                                ? spec.assignment.keys[il].size() + spec.assignment.values[il].size()
                                : (*lists)[il].size();
      maps->weight.push_back(at::randn({out, in * static_cast<int64_t>(blocks)}, gen));
      if (spec.bias) maps->bias.push_back(at::randn({out}, gen));
    }
  }
  auto t = Translator::Create(std::move(spec), std::move(keys), std::move(values));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TranslatorSpec MixedSpec(bool bias = true) {
  TranslatorSpec spec;
  spec.source = Endpoint(3, 2, 4, "s");
  spec.target = Endpoint(2, 3, 2, "t");
  spec.assignment_kind = "custom";
  spec.assignment.keys = {{2, 0}, {1, 2}};
  spec.assignment.values = {{1}, {0}};
  spec.bias = bias;
  return spec;
}

// Independent oracle: for every target layer and token, the explicit sum over
// assigned source layers and heads of W-block times the head vector, in float64.
at::Tensor OracleSide(const at::Tensor& source, const Lists& lists, const TranslatorMaps& maps,
                      const TranslatorEndpoint& target) {
  const int64_t n_tokens = source.size(2), h_s = source.size(1), d_s = source.size(3);
  at::Tensor out = at::zeros({target.n_layer, target.n_head_kv, n_tokens, target.head_dim},
                             at::kDouble);
  for (int64_t il = 0; il < target.n_layer; ++il) {
    const at::Tensor w = maps.weight[il].to(at::kDouble);
    for (int64_t t = 0; t < n_tokens; ++t) {
      at::Tensor y = maps.bias.empty() ? at::zeros({w.size(0)}, at::kDouble)
                                       : maps.bias[il].to(at::kDouble).clone();
      for (size_t j = 0; j < lists[il].size(); ++j) {
        for (int64_t h = 0; h < h_s; ++h) {
          const int64_t col = (static_cast<int64_t>(j) * h_s + h) * d_s;
          y += w.narrow(1, col, d_s).matmul(source[lists[il][j]][h][t].to(at::kDouble));
        }
      }
      out.select(0, il).select(1, t).copy_(y.view({target.n_head_kv, target.head_dim}));
    }
  }
  return out;
}

// Both sides of a translation within 1e-4 of the float64 oracle.
void ExpectMatchesOracle(const KvTaps& out, const KvTaps& src, const TranslatorSpec& spec,
                         const Translator& tr) {
  EXPECT_LT(MaxAbsDiff(out.keys, OracleSide(src.keys, spec.assignment.keys, tr.key_maps(),
                                            spec.target)),
            1e-4);
  EXPECT_LT(MaxAbsDiff(out.values, OracleSide(src.values, spec.assignment.values, tr.value_maps(),
                                              spec.target)),
            1e-4);
}

KvTaps RandomTaps(const TranslatorEndpoint& e, int64_t n_tokens, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randn({e.n_layer, e.n_head_kv, n_tokens, e.head_dim}, gen),
          at::randn({e.n_layer, e.n_head_kv, n_tokens, e.head_dim}, gen)};
}

TEST(TranslateTest, MatchesTheExplicitOracleOnBothApplyPaths) {
  // Keys: equal band widths (the batched path); values too. Then unequal
  // widths (the per-layer path).
  for (const Lists& key_lists : {Lists{{2, 0}, {1, 2}}, Lists{{2}, {0, 1, 2}}}) {
    for (bool bias : {true, false}) {
      TranslatorSpec spec = MixedSpec(bias);
      spec.assignment.keys = key_lists;
      auto tr = RandomTranslator(spec, 5);
      const KvTaps src = RandomTaps(spec.source, 6, 9);
      auto out = tr->Translate(src);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->keys.sizes(), at::IntArrayRef({2, 3, 6, 2}));
      EXPECT_EQ(out->keys.scalar_type(), at::kFloat);
      ExpectMatchesOracle(*out, src, spec, *tr);
    }
  }
}

// A token-anchored translator: MixedSpec's maps plus anchor weights over a
// window of 3 tokens of a random [10, 4] table.
std::unique_ptr<Translator> AnchoredTranslator(TranslatorSpec spec, DType compute,
                                               at::Tensor* table_out) {
  spec.anchor_window = 3;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(31);
  const at::Tensor table = at::randn({10, 4}, gen);
  const std::unique_ptr<Translator> plain = RandomTranslator(WithoutAnchors(spec), 5);
  TranslatorMaps keys = plain->key_maps(), values = plain->value_maps();
  const int64_t out = spec.target.n_head_kv * spec.target.head_dim;
  for (TranslatorMaps* maps : {&keys, &values}) {
    for (int64_t il = 0; il < spec.target.n_layer; ++il) {
      maps->anchor.push_back(at::randn({out, 3 * 4}, gen));
    }
  }
  *table_out = table;
  auto t = Translator::Create(std::move(spec), keys, values, compute, table);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

// A residual map of target layer 1 reading source layers 0 and 2 of
// MixedSpec (E_t = 6), with anchors when `anchored` (window 3, width 4).
ResidualMap RandomResidualMap(bool anchored, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  ResidualMap m;
  m.layer = 1;
  m.source_layers = {0, 2};
  m.weight = at::randn({6, 2 * 2 * 2 * 4}, gen);
  m.bias = at::randn({6}, gen);
  if (anchored) m.anchor = at::randn({6, 3 * 4}, gen);
  return m;
}

// The oracle of a residual map, float64, token by token: the bias, each
// source layer's keys then values head by head through its weight block, and
// each offset k's anchor block times the table row of token t-k (ids as
// Translate's, two before the span).
at::Tensor ResidualOracle(const ResidualMap& m, const KvTaps& src, const at::Tensor& table,
                          const std::vector<int64_t>& ids) {
  const int64_t n_tokens = src.keys.size(2), h_s = src.keys.size(1), d_s = src.keys.size(3);
  const int64_t nu = static_cast<int64_t>(m.source_layers.size());
  const at::Tensor w = m.weight.to(at::kDouble);
  at::Tensor out = at::zeros({n_tokens, w.size(0)}, at::kDouble);
  for (int64_t t = 0; t < n_tokens; ++t) {
    at::Tensor y = m.bias.to(at::kDouble).clone();
    for (int64_t side = 0; side < 2; ++side) {
      const at::Tensor& x = side == 0 ? src.keys : src.values;
      for (int64_t j = 0; j < nu; ++j) {
        for (int64_t h = 0; h < h_s; ++h) {
          const int64_t col = ((side * nu + j) * h_s + h) * d_s;
          y += w.narrow(1, col, d_s).matmul(x[m.source_layers[j]][h][t].to(at::kDouble));
        }
      }
    }
    if (m.anchor.defined()) {
      for (int64_t k = 0; k < 3; ++k) {
        y += m.anchor.to(at::kDouble).narrow(1, k * 4, 4).matmul(table[ids[2 + t - k]].to(at::kDouble));
      }
    }
    out[t].copy_(y);
  }
  return out;
}

TEST(TranslateTest, ResidualMapsPredictFromTheirSourceLayersAndAnchors) {
  const TranslatorSpec spec = MixedSpec();
  at::Tensor table;
  auto tr = AnchoredTranslator(spec, DType::kFloat32, &table);
  EXPECT_EQ(tr->ResidualFor(1), nullptr);
  const ResidualMap map = RandomResidualMap(/*anchored=*/true, 4);
  ASSERT_TRUE(tr->SetResidualMaps({map}, /*native_layers=*/1, "test").ok());
  EXPECT_EQ(tr->spec().native_layers, 1);
  ASSERT_NE(tr->ResidualFor(1), nullptr);
  const KvTaps src = RandomTaps(spec.source, 5, 9);
  const std::vector<int64_t> ids = {7, 1, 3, 3, 0, 9, 4};
  auto r = tr->PredictResidual(src, 1, ids);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(MaxAbsDiff(*r, ResidualOracle(map, src, table, ids)), 1e-4);
  EXPECT_EQ(tr->PredictResidual(src, 0, ids).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tr->PredictResidual(src, 1, {1, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // What SetResidualMaps refuses, leaving the translator as it was.
  auto plain = RandomTranslator(spec, 3);
  ResidualMap bad = RandomResidualMap(false, 5);
  bad.layer = 2;  // the target has layers 0 and 1
  EXPECT_EQ(plain->SetResidualMaps({bad}, 0, "").code(), absl::StatusCode::kInvalidArgument);
  bad = RandomResidualMap(false, 5);
  bad.source_layers = {2, 0};
  EXPECT_EQ(plain->SetResidualMaps({bad}, 0, "").code(), absl::StatusCode::kInvalidArgument);
  bad = RandomResidualMap(false, 5);
  bad.weight = bad.weight.narrow(1, 0, 31);
  EXPECT_EQ(plain->SetResidualMaps({bad}, 0, "").code(), absl::StatusCode::kInvalidArgument);
  // Anchors where the K/V maps have none, and none where they have.
  EXPECT_EQ(plain->SetResidualMaps({RandomResidualMap(true, 5)}, 0, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tr->SetResidualMaps({RandomResidualMap(false, 5)}, 1, "").code(),
            absl::StatusCode::kInvalidArgument);
  // A default k that needs a map the translator lacks.
  EXPECT_EQ(plain->SetResidualMaps({}, 1, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(plain->residual_maps().empty());
  EXPECT_EQ(plain->spec().native_layers, 0);
  // k = L needs no map.
  EXPECT_TRUE(plain->SetResidualMaps({}, 2, "all native").ok());
  // Without anchors the map reads the taps alone.
  const ResidualMap unanchored = RandomResidualMap(false, 6);
  ASSERT_TRUE(plain->SetResidualMaps({unanchored}, 1, "").ok());
  auto u = plain->PredictResidual(src, 1);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_LT(MaxAbsDiff(*u, ResidualOracle(unanchored, src, at::Tensor(), {})), 1e-4);
}

TEST(TranslateTest, TokenAnchorsAddTheTableRowsOfTheLastTokensThroughTheirMaps) {
  at::Tensor table;
  const TranslatorSpec spec = MixedSpec();
  auto tr = AnchoredTranslator(spec, DType::kFloat32, &table);
  const KvTaps src = RandomTaps(spec.source, 5, 9);
  // Two ids before the span, then its five.
  const std::vector<int64_t> ids = {7, 1, 3, 3, 0, 9, 4};
  auto out = tr->Translate(src, Translator::Output::kFloat32, ids);
  ASSERT_TRUE(out.ok()) << out.status();
  // The oracle: the plain maps' output plus, per layer and token, each offset
  // k's anchor block times the table row of token t-k, in float64.
  for (const auto& [side, lists, maps, result] :
       {std::tuple{"keys", &spec.assignment.keys, &tr->key_maps(), &out->keys},
        {"values", &spec.assignment.values, &tr->value_maps(), &out->values}}) {
    at::Tensor expected =
        OracleSide(std::string(side) == "keys" ? src.keys : src.values, *lists, *maps, spec.target);
    for (int64_t il = 0; il < spec.target.n_layer; ++il) {
      const at::Tensor a = maps->anchor[il].to(at::kDouble);
      for (int64_t t = 0; t < 5; ++t) {
        at::Tensor y = at::zeros({a.size(0)}, at::kDouble);
        for (int64_t k = 0; k < 3; ++k) {
          const int64_t id = ids[2 + t - k];
          y += a.narrow(1, k * 4, 4).matmul(table[id].to(at::kDouble));
        }
        expected.select(0, il).select(1, t) += y.view({spec.target.n_head_kv, spec.target.head_dim});
      }
    }
    EXPECT_LT(MaxAbsDiff(*result, expected), 1e-4) << side;
  }
  // At the conversation's start the missing tokens read zeros: a span given
  // without earlier ids equals one whose earlier ids have all-zero rows.
  auto first = tr->Translate(src, Translator::Output::kFloat32, {3, 3, 0, 9, 4});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->keys.equal(out->keys));
  // The router's product views hold the same values.
  auto product = tr->Translate(src, Translator::Output::kProduct, ids);
  ASSERT_TRUE(product.ok()) << product.status();
  EXPECT_LT(MaxAbsDiff(product->keys, out->keys), 1e-5);
  EXPECT_LT(MaxAbsDiff(product->values, out->values), 1e-5);
  // Computing in bfloat16 (the anchors' lookup rows rounded to it, summed in
  // float32) stays within bfloat16's rounding of the float32 result.
  at::Tensor table16;
  auto tr16 = AnchoredTranslator(spec, DType::kBFloat16, &table16);
  auto out16 = tr16->Translate(src, Translator::Output::kFloat32, ids);
  ASSERT_TRUE(out16.ok()) << out16.status();
  for (const auto& [got, want] : {std::pair{&out16->keys, &out->keys}, {&out16->values, &out->values}}) {
    const double scale = want->abs().max().item<double>();
    EXPECT_LT(MaxAbsDiff(*got, *want), 0.03 * scale);
    EXPECT_GT(MaxAbsDiff(*got, *want), 0.0);  // it did round
  }
  // The ids must cover the span and at most W-1 tokens before it, inside the table.
  for (const std::vector<int64_t>& bad :
       {std::vector<int64_t>{}, std::vector<int64_t>{3, 3, 0, 9},
        std::vector<int64_t>{1, 1, 7, 1, 3, 3, 0, 9, 4}, std::vector<int64_t>{3, 3, 0, 9, 10}}) {
    EXPECT_EQ(tr->Translate(src, Translator::Output::kFloat32, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(TranslateTest, LongSpansAddEveryAnchorAcrossTheSumsChunks) {
  // Translate sums the anchors a chunk of tokens at a time; a token's anchors
  // reach back W-1 tokens, across a chunk's start. Each token's result
  // depends only on its own taps and the ids of its window, so any sub-span,
  // given the W-1 ids before it, must equal the same rows of the whole span.
  at::Tensor table;
  const TranslatorSpec spec = MixedSpec();
  auto tr = AnchoredTranslator(spec, DType::kFloat32, &table);
  const int64_t n = 600;
  const KvTaps src = RandomTaps(spec.source, n, 11);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const at::Tensor random_ids = at::randint(0, 10, {n + 2}, gen);
  const std::vector<int64_t> ids(random_ids.data_ptr<int64_t>(),
                                 random_ids.data_ptr<int64_t>() + n + 2);
  auto whole = tr->Translate(src, Translator::Output::kFloat32, ids);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 300}, {250, 262}, {254, 600},
                                   {511, 514}}) {
    KvTaps part;
    part.keys = src.keys.narrow(2, begin, end - begin);
    part.values = src.values.narrow(2, begin, end - begin);
    // ids[i + 2] is token i's; the sub-span takes its two before it.
    const std::vector<int64_t> part_ids(ids.begin() + begin, ids.begin() + end + 2);
    auto got = tr->Translate(part, Translator::Output::kFloat32, part_ids);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LT(MaxAbsDiff(got->keys, whole->keys.narrow(2, begin, end - begin)), 1e-4)
        << begin << ".." << end;
    EXPECT_LT(MaxAbsDiff(got->values, whole->values.narrow(2, begin, end - begin)), 1e-4)
        << begin << ".." << end;
  }
}

TEST(TranslateTest, AnchorsNeedTheirTableAndWeights) {
  TranslatorSpec spec = MixedSpec();
  spec.anchor_window = 2;
  auto plain = RandomTranslator(MixedSpec(), 5);
  // A window without a table, and a table without a window.
  EXPECT_EQ(Translator::Create(spec, plain->key_maps(), plain->value_maps()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Translator::Create(MixedSpec(), plain->key_maps(), plain->value_maps(),
                               DType::kFloat32, at::zeros({10, 4}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A table but anchor weights of the wrong width.
  TranslatorMaps keys = plain->key_maps(), values = plain->value_maps();
  for (TranslatorMaps* maps : {&keys, &values}) {
    for (int il = 0; il < 2; ++il) maps->anchor.push_back(at::zeros({6, 3 * 4}));
  }
  EXPECT_EQ(Translator::Create(spec, keys, values, DType::kFloat32, at::zeros({10, 4}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TranslateTest, AnchorTableIsTheRmsNormalisedEmbedding) {
  const at::Tensor embed = at::tensor({3.0f, 4.0f, 0.0f, 0.0f, 1.0f, 1.0f}).view({3, 2});
  const at::Tensor table = AnchorTable(embed, 0.0);
  // Row [3, 4]: rms = sqrt(12.5).
  EXPECT_NEAR(table[0][0].item<double>(), 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(table[2][1].item<double>(), 1.0, 1e-6);
  EXPECT_EQ(table.scalar_type(), at::kFloat);
}

TEST(TranslateTest, AnchorsTooLargeForTheirLookupAreAProductWithTheSameResult) {
  at::Tensor table;
  const TranslatorSpec spec = MixedSpec();
  for (DType compute : {DType::kFloat32, DType::kBFloat16}) {
    auto looked_up = AnchoredTranslator(spec, compute, &table);
    ASSERT_TRUE(looked_up->anchor_lookup());
    // The same maps, with no room for the lookup.
    auto product = Translator::Create(looked_up->spec(), looked_up->key_maps(),
                                      looked_up->value_maps(), compute, table,
                                      /*max_anchor_lookup_bytes=*/0);
    ASSERT_TRUE(product.ok()) << product.status();
    EXPECT_FALSE((*product)->anchor_lookup());
    const KvTaps src = RandomTaps(spec.source, 300, 9);
    // Longer than one chunk of AddAnchors, with and without earlier ids.
    std::vector<int64_t> ids = {7, 1};
    for (int64_t i = 0; i < 300; ++i) ids.push_back((i * 7) % 10);
    for (const std::vector<int64_t>& read :
         {ids, std::vector<int64_t>(ids.begin() + 2, ids.end())}) {
      auto a = looked_up->Translate(src, Translator::Output::kFloat32, read);
      auto b = (*product)->Translate(src, Translator::Output::kFloat32, read);
      ASSERT_TRUE(a.ok() && b.ok());
      // bfloat16: the lookup rounds each row's product, the product path each
      // table row and weight; both within bfloat16's rounding of the values.
      const double tolerance = compute == DType::kFloat32 ? 1e-4 : 0.1;
      EXPECT_LT(MaxAbsDiff(a->keys, b->keys), tolerance) << DTypeName(compute);
      EXPECT_LT(MaxAbsDiff(a->values, b->values), tolerance) << DTypeName(compute);
    }
    // An id outside the table is refused on both paths.
    EXPECT_EQ((*product)->Translate(src, Translator::Output::kFloat32,
                                    std::vector<int64_t>(300, 10)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Every anchor block's output over the table, [V, layers * sides * W * out]:
// what a change of the table's basis must keep.
at::Tensor AnchorOutputs(const at::Tensor& table, const TranslatorMaps& keys,
                         const TranslatorMaps& values, int64_t window) {
  const int64_t e = table.size(1);
  std::vector<at::Tensor> outputs;
  for (const TranslatorMaps* maps : {&keys, &values}) {
    for (const at::Tensor& a : maps->anchor) {
      for (int64_t k = 0; k < window; ++k) {
        outputs.push_back(at::mm(table.to(at::kDouble), a.narrow(1, k * e, e).t().to(at::kDouble)));
      }
    }
  }
  return at::cat(outputs, 1);
}

// A translator moved to another device computes only there: LibTorch's meta
// device stands in for a GPU (its tensors have shapes, devices and dtypes but
// no data, and an operation mixing it with a CPU tensor throws), so every
// tensor Translate makes or reads must be on the translator's device for the
// call to succeed. Every Apply path, both anchor forms and both compute
// dtypes. (A meta tensor cannot come back: the values are checked on the CPU
// by the tests above, the anchors' product by AnchorsTooLargeForTheirLookup.)
TEST(TranslateTest, AMovedTranslatorReadsAndWritesOnlyOnItsDevice) {
  struct Variant {
    const char* name;
    Lists keys, values;
    bool anchored;
    DType compute;
  };
  const std::vector<Variant> variants = {
      {"per-layer", {{2}, {0, 1, 2}}, {{1}, {0}}, false, DType::kFloat32},
      {"stacked", {{2, 0}, {1, 2}}, {{1}, {0}}, false, DType::kFloat32},
      {"shared", {{0, 1, 2}, {0, 1, 2}}, {{2}, {2}}, false, DType::kBFloat16},
      {"anchors", {{2, 0}, {1, 2}}, {{1}, {0}}, true, DType::kFloat32},
      {"anchors-bf16", {{2, 0}, {1, 2}}, {{1}, {0}}, true, DType::kBFloat16}};
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    TranslatorSpec spec = MixedSpec();
    spec.assignment.keys = v.keys;
    spec.assignment.values = v.values;
    at::Tensor table;
    std::unique_ptr<Translator> tr;
    if (v.anchored) {
      tr = AnchoredTranslator(spec, v.compute, &table);
      ASSERT_TRUE(tr->anchor_lookup());
    } else {
      const std::unique_ptr<Translator> f32 = RandomTranslator(spec, 5);
      tr = *Translator::Create(f32->spec(), f32->key_maps(), f32->value_maps(), v.compute);
    }
    const KvTaps src = RandomTaps(spec.source, 300, 9);  // past one chunk of the anchors' sum
    std::vector<int64_t> ids = {7, 1};
    for (int64_t i = 0; i < 300; ++i) ids.push_back((i * 7) % 10);
    if (!v.anchored) ids.clear();
    // To the CPU, where it is (what LoadRouter does on a CPU server): nothing changes.
    auto before = tr->Translate(src, Translator::Output::kFloat32, ids);
    ASSERT_TRUE(before.ok()) << before.status();
    ASSERT_TRUE(tr->MoveTo("cpu").ok());
    EXPECT_EQ(tr->anchor_lookup(), v.anchored);
    auto after = tr->Translate(src, Translator::Output::kFloat32, ids);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(after->keys.equal(before->keys) && after->values.equal(before->values));

    ASSERT_TRUE(tr->MoveTo("meta").ok());
    EXPECT_EQ(tr->device(), at::Device("meta"));
    EXPECT_FALSE(tr->anchor_lookup());  // off the CPU the anchors are a product
    EXPECT_EQ(tr->key_maps().weight[0].device(), at::Device(at::kCPU));  // Save reads these
    const KvTaps on_meta{src.keys.to(at::Device("meta")), src.values.to(at::Device("meta"))};
    for (Translator::Output output : {Translator::Output::kProduct, Translator::Output::kFloat32}) {
      auto out = tr->Translate(on_meta, output, ids);
      ASSERT_TRUE(out.ok()) << out.status();
      const at::ScalarType dtype = output == Translator::Output::kFloat32 ||
                                           v.compute == DType::kFloat32
                                       ? at::kFloat
                                       : at::kBFloat16;
      for (const at::Tensor* x : {&out->keys, &out->values}) {
        EXPECT_EQ(x->device(), at::Device("meta"));
        EXPECT_EQ(x->sizes(), at::IntArrayRef({2, 3, 300, 2}));
        EXPECT_EQ(x->scalar_type(), dtype);
      }
    }
    // Taps on the CPU are refused, naming both devices, not copied over.
    auto refused = tr->Translate(src, Translator::Output::kProduct, ids);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("meta"), std::string::npos) << refused.status();

    // A device LibTorch cannot name or place leaves the translator where it was.
    EXPECT_EQ(tr->MoveTo("quantum:3").code(), absl::StatusCode::kInvalidArgument);
    if (!at::hasCUDA()) {
      EXPECT_EQ(tr->MoveTo("cuda").code(), absl::StatusCode::kInvalidArgument);
    }
    EXPECT_EQ(tr->device(), at::Device("meta"));

  }
}

TEST(TranslateTest, ReducingTheAnchorRankKeepsTheBestRankRApproximationOfTheAnchors) {
  at::Tensor table;
  const TranslatorSpec spec = MixedSpec();
  auto tr = AnchoredTranslator(spec, DType::kFloat32, &table);  // table [10, 4], W = 3
  const at::Tensor full = AnchorOutputs(table, tr->key_maps(), tr->value_maps(), 3);
  // The oracle (Eckart-Young): the best rank-r approximation of the outputs
  // is their SVD truncated to r; its error is the dropped singular values.
  const at::Tensor sv = std::get<1>(at::linalg_svd(full, /*full_matrices=*/false));
  for (int64_t rank : {4, 2, 1}) {
    at::Tensor reduced_table = table;
    TranslatorMaps keys = tr->key_maps(), values = tr->value_maps();
    absl::StatusOr<double> kept = ReduceAnchorRank(3, rank, &reduced_table, &keys, &values);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(reduced_table.sizes(), at::IntArrayRef({10, rank}));
    EXPECT_EQ(keys.anchor[0].sizes(), at::IntArrayRef({tr->key_maps().anchor[0].size(0), 3 * rank}));
    const at::Tensor approx = AnchorOutputs(reduced_table, keys, values, 3);
    const double error = (approx - full).pow(2).sum().item<double>();
    const double best = sv.narrow(0, rank, sv.size(0) - rank).pow(2).sum().item<double>();
    const double total = sv.pow(2).sum().item<double>();
    EXPECT_NEAR(error, best, 1e-3 * total) << rank;
    EXPECT_NEAR(*kept, 1 - best / total, 1e-4) << rank;
    // The reduced translator loads and translates as its outputs say.
    TranslatorSpec reduced_spec = spec;
    reduced_spec.anchor_window = 3;
    EXPECT_TRUE(Translator::Create(reduced_spec, keys, values, DType::kFloat32, reduced_table).ok());
  }
  at::Tensor t = table;
  TranslatorMaps keys = tr->key_maps(), values = tr->value_maps();
  EXPECT_EQ(ReduceAnchorRank(3, 5, &t, &keys, &values).status().code(),
            absl::StatusCode::kInvalidArgument);  // above the table's width
  EXPECT_EQ(ReduceAnchorRank(0, 2, &t, &keys, &values).status().code(),
            absl::StatusCode::kInvalidArgument);  // no anchors
}

TEST(TranslateTest, ALowRankAnchorTableIsTheTablesTopPrincipalDirections) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor embed = at::randn({40, 6}, gen);
  const at::Tensor full = AnchorTable(embed, 1e-6);
  EXPECT_EQ(AnchorTable(embed, 1e-6, 6).sizes(), full.sizes());  // rank >= E: the full table
  const at::Tensor low = AnchorTable(embed, 1e-6, 2);
  ASSERT_EQ(low.sizes(), at::IntArrayRef({40, 2}));
  // Oracle: with full = U S Vᵀ, the rank-2 table is U_2 S_2 (up to each
  // column's sign), so its Gram matrix is U_2 S_2² U_2ᵀ.
  const auto [u, s, vh] = at::linalg_svd(full.to(at::kDouble), /*full_matrices=*/false);
  const at::Tensor us = u.narrow(1, 0, 2) * s.narrow(0, 0, 2);
  const at::Tensor low64 = low.to(at::kDouble);
  EXPECT_LT((at::mm(low64, low64.t()) - at::mm(us, us.t())).abs().max().item<double>(), 1e-4);
}

TEST(TranslateTest, MatchesTheOracleWhenEveryLayerReadsTheSameSourceLayers) {
  // Every target layer reads all source layers (kvl fit --band all) for keys
  // and the same single layer for values: the one-product path, short and long.
  for (bool bias : {true, false}) {
    TranslatorSpec spec = MixedSpec(bias);
    spec.assignment.keys = {{0, 1, 2}, {0, 1, 2}};
    spec.assignment.values = {{2}, {2}};
    auto tr = RandomTranslator(spec, 11);
    for (int64_t n : {1, 7, 300}) {
      const KvTaps src = RandomTaps(spec.source, n, 12);
      auto out = tr->Translate(src);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->keys.sizes(), at::IntArrayRef({2, 3, n, 2}));
      ExpectMatchesOracle(*out, src, spec, *tr);
    }
  }
}

// Unread counts (a sliding target layer's tokens no later query reads):
// those rows are zeros (float32 output; the router's product views leave
// them unwritten), every other row as the whole translation's, on every
// Apply path, with anchors (lookup and product) and without, in both output
// forms; counts of another length or out of range are refused.
TEST(TranslateTest, UnreadRowsAreZerosAndTheRestAsTheWholeTranslation) {
  struct Case {
    Lists keys, values;
  };
  const Case cases[] = {
      {{{2, 0}, {1, 2}}, {{1}, {0}}},             // batched (short spans) / per layer
      {{{2}, {0, 1, 2}}, {{1}, {0}}},             // per layer
      {{{0, 1, 2}, {0, 1, 2}}, {{2}, {2}}},       // one product (keys)
  };
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(41);
  for (const Case& c : cases) {
    TranslatorSpec spec = MixedSpec();
    spec.assignment.keys = c.keys;
    spec.assignment.values = c.values;
    at::Tensor table;
    std::vector<std::unique_ptr<Translator>> translators;
    translators.push_back(RandomTranslator(spec, 42));
    translators.push_back(AnchoredTranslator(spec, DType::kFloat32, &table));
    auto product = Translator::Create(translators[1]->spec(), translators[1]->key_maps(),
                                      translators[1]->value_maps(), DType::kFloat32, table,
                                      /*max_anchor_lookup_bytes=*/0);
    ASSERT_TRUE(product.ok()) << product.status();
    ASSERT_FALSE((*product)->anchor_lookup());
    translators.push_back(*std::move(product));
    for (const auto& tr : translators) {
      for (int64_t n : {6, 300}) {
        const KvTaps src = RandomTaps(spec.source, n, 43);
        std::vector<int64_t> ids;
        if (tr->spec().anchor_window > 0) {
          const at::Tensor r = at::randint(10, {n + 2}, gen);
          ids.assign(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + n + 2);
        }
        auto whole = tr->Translate(src, Translator::Output::kFloat32, ids);
        ASSERT_TRUE(whole.ok()) << whole.status();
        const std::vector<std::vector<int64_t>> unreads = {
            {n - 2, 0}, {0, n - 3}, {n - 4, n - 2}, {n, 1}, {n, n}, {0, 0}};
        for (const std::vector<int64_t>& unread : unreads) {
          for (Translator::Output output :
               {Translator::Output::kFloat32, Translator::Output::kProduct}) {
            SCOPED_TRACE(::testing::Message()
                         << "anchors " << tr->spec().anchor_window << ", " << n
                         << " tokens, unread {" << unread[0] << ", " << unread[1] << "}");
            auto thin = tr->Translate(src, output, ids, unread);
            ASSERT_TRUE(thin.ok()) << thin.status();
            ASSERT_EQ(thin->keys.sizes(), whole->keys.sizes());
            for (const auto& [got, want] :
                 {std::pair{&thin->keys, &whole->keys}, {&thin->values, &whole->values}}) {
              for (int64_t il = 0; il < 2; ++il) {
                const int64_t u = unread[static_cast<size_t>(il)];
                if (u > 0 && output == Translator::Output::kFloat32) {
                  EXPECT_EQ((*got)[il].narrow(1, 0, u).abs().max().item<float>(), 0.0f);
                }
                if (u < n) {
                  EXPECT_LT(MaxAbsDiff((*got)[il].narrow(1, u, n - u),
                                       (*want)[il].narrow(1, u, n - u)),
                            1e-5);
                }
              }
            }
          }
        }
        for (const std::vector<int64_t>& bad :
             {std::vector<int64_t>{0}, std::vector<int64_t>{0, 0, 0},
              std::vector<int64_t>{-1, 0}, std::vector<int64_t>{0, n + 1}}) {
          EXPECT_EQ(tr->Translate(src, Translator::Output::kFloat32, ids, bad).status().code(),
                    absl::StatusCode::kInvalidArgument);
        }
      }
    }
  }
}

TEST(TranslateTest, JointMapsReadKeysThenValuesOnEveryApplyPath) {
  // Rows of the oracle's source: keys of layers 0-2, then values of layers 0-2.
  // The blocks each joint map reads, written out by hand from the assignment.
  struct Case {
    Lists keys, values, blocks;
  };
  const Case cases[] = {
      {{{2, 0}, {1, 2}}, {{1}, {0}}, {{2, 0, 4}, {1, 2, 3}}},  // batched / per layer
      {{{2}, {0, 1, 2}}, {{1}, {0}}, {{2, 4}, {0, 1, 2, 3}}},  // per layer
      {{{0, 1, 2}, {0, 1, 2}}, {{2}, {2}}, {{0, 1, 2, 5}, {0, 1, 2, 5}}},  // one product
  };
  for (const Case& c : cases) {
    for (bool bias : {true, false}) {
      TranslatorSpec spec = MixedSpec(bias);
      spec.inputs = MapInputs::kJoint;
      spec.assignment.keys = c.keys;
      spec.assignment.values = c.values;
      EXPECT_EQ(InputBlocksOf(spec.assignment, spec.inputs, 3).keys, c.blocks);
      EXPECT_EQ(InputBlocksOf(spec.assignment, spec.inputs, 3).values, c.blocks);
      auto tr = RandomTranslator(spec, 31);
      for (int64_t n : {1, 6, 300}) {
        const KvTaps src = RandomTaps(spec.source, n, 32);
        auto out = tr->Translate(src);
        ASSERT_TRUE(out.ok()) << out.status();
        EXPECT_EQ(out->keys.sizes(), at::IntArrayRef({2, 3, n, 2}));
        const at::Tensor rows = at::cat({src.keys, src.values}, 0);
        EXPECT_LT(MaxAbsDiff(out->keys, OracleSide(rows, c.blocks, tr->key_maps(), spec.target)),
                  1e-4)
            << n << " tokens, bias " << bias;
        EXPECT_LT(
            MaxAbsDiff(out->values, OracleSide(rows, c.blocks, tr->value_maps(), spec.target)),
            1e-4)
            << n << " tokens, bias " << bias;
      }
    }
  }
  // Maps sized for split inputs are refused for joint ones.
  TranslatorSpec split = MixedSpec();
  auto tr = RandomTranslator(split, 33);
  split.inputs = MapInputs::kJoint;
  auto wrong = Translator::Create(split, tr->key_maps(), tr->value_maps());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("keys.0.weight must be [6, 24]"), std::string::npos)
      << wrong.status();
  EXPECT_EQ(ParseMapInputs("joint").value(), MapInputs::kJoint);
  EXPECT_EQ(ParseMapInputs("both").status().code(), absl::StatusCode::kInvalidArgument);
}

// The same maps with every weight and bias rounded to bfloat16 (and back).
TranslatorMaps RoundedToBf16(const TranslatorMaps& maps) {
  TranslatorMaps r;
  for (const at::Tensor& w : maps.weight) r.weight.push_back(w.to(at::kBFloat16).to(at::kFloat));
  for (const at::Tensor& b : maps.bias) r.bias.push_back(b.to(at::kBFloat16).to(at::kFloat));
  return r;
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return ((got.to(at::kDouble) - w).norm() / w.norm()).item<double>();
}

TEST(TranslateTest, Bfloat16TranslatorsMatchTheOracleOnRoundedInputsOnEveryPath) {
  // Batched (short, equal bands), per-layer (long or unequal bands) and one
  // product (every layer reads the same source layers), with and without bias.
  const std::vector<std::pair<Lists, Lists>> assignments = {
      {{{2, 0}, {1, 2}}, {{1}, {0}}},
      {{{2}, {0, 1, 2}}, {{1}, {0}}},
      {{{0, 1, 2}, {0, 1, 2}}, {{2}, {2}}}};
  for (const auto& [key_lists, value_lists] : assignments) {
    for (bool bias : {true, false}) {
      TranslatorSpec spec = MixedSpec(bias);
      spec.assignment.keys = key_lists;
      spec.assignment.values = value_lists;
      auto tr = RandomTranslator(spec, 21);
      auto half = Translator::Create(spec, tr->key_maps(), tr->value_maps(), DType::kBFloat16);
      ASSERT_TRUE(half.ok()) << half.status();
      EXPECT_EQ((*half)->compute_dtype(), DType::kBFloat16);
      EXPECT_EQ(tr->compute_dtype(), DType::kFloat32);
      for (int64_t n : {5, 300}) {
        const KvTaps src = RandomTaps(spec.source, n, 22);
        auto out = (*half)->Translate(src);
        ASSERT_TRUE(out.ok()) << out.status();
        EXPECT_EQ(out->keys.scalar_type(), at::kFloat);
        EXPECT_EQ(out->keys.sizes(), at::IntArrayRef({2, 3, n, 2}));
        auto exact = tr->Translate(src);
        ASSERT_TRUE(exact.ok());
        for (const auto& [got, full, taps, lists, maps] :
             {std::tuple{&out->keys, &exact->keys, &src.keys, &spec.assignment.keys,
                         &tr->key_maps()},
              {&out->values, &exact->values, &src.values, &spec.assignment.values,
               &tr->value_maps()}}) {
          // The oracle on bfloat16-rounded taps and maps, in float64: what is
          // left is the rounding of the result to bfloat16, once or (small
          // products, where LibTorch adds the bias to the rounded product)
          // twice, at most 2^-8 relative per element; a layout error is ~1.
          const at::Tensor oracle =
              OracleSide(taps->to(at::kBFloat16).to(at::kFloat), *lists, RoundedToBf16(*maps),
                         spec.target);
          EXPECT_LT(RelativeError(*got, oracle), 1e-2) << n << " tokens, bias " << bias;
          // And the arithmetic really was bfloat16: float32 is 1e-6 away.
          EXPECT_GT(RelativeError(*got, *full), 5e-4) << n << " tokens, bias " << bias;
        }
      }
    }
  }
  auto tr = RandomTranslator(MixedSpec(), 24);
  EXPECT_EQ(Translator::Create(MixedSpec(), tr->key_maps(), tr->value_maps(), DType::kFloat16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TranslateTest, SpanEqualsTokenByToken) {
  auto tr = RandomTranslator(MixedSpec(), 3);
  // Long spans take the per-layer path, single tokens the batched one.
  const int64_t n = 300;
  const KvTaps src = RandomTaps(tr->spec().source, n, 4);
  auto whole = tr->Translate(src);
  ASSERT_TRUE(whole.ok());
  for (int64_t t = 0; t < n; ++t) {
    auto one = tr->Translate({src.keys.narrow(2, t, 1), src.values.narrow(2, t, 1)});
    ASSERT_TRUE(one.ok());
    EXPECT_LT(MaxAbsDiff(one->keys, whole->keys.narrow(2, t, 1)), 1e-5) << t;
    EXPECT_LT(MaxAbsDiff(one->values, whole->values.narrow(2, t, 1)), 1e-5) << t;
  }
  // bfloat16 taps are accepted (converted).
  EXPECT_TRUE(tr->Translate({src.keys.to(at::kBFloat16), src.values.to(at::kBFloat16)}).ok());
  EXPECT_EQ(tr->Translate({src.keys.narrow(0, 0, 2), src.values}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Across tokenizers (issue 54): resampling the source taps onto the target's
// tokens, then translating, gives each target token the mean of its source
// run's translated rows (the maps are affine), checked against translating
// every source token alone and averaging in float64.
TEST(TranslateTest, ResampledTapsTranslateToTheMeanOfTheirRunsTranslations) {
  auto tr = RandomTranslator(MixedSpec(), 5);
  const int64_t n_source = 9;
  const KvTaps src = RandomTaps(tr->spec().source, n_source, 6);
  // Groups 1:1, 3:1, 1:3, 2:2, 1:1 over 9 source tokens, 8 target tokens.
  const std::vector<TokenRun> runs = {{0, 1}, {1, 4}, {4, 5}, {4, 5}, {4, 5},
                                      {5, 6}, {6, 7}, {7, 9}};
  auto resampled = ResampleTaps(src, runs);
  ASSERT_TRUE(resampled.ok()) << resampled.status();
  ASSERT_EQ(resampled->keys.size(2), 8);
  // The resampled rows themselves, against a loop.
  for (size_t j = 0; j < runs.size(); ++j) {
    const at::Tensor mean = src.keys.narrow(2, runs[j].begin, runs[j].end - runs[j].begin)
                                .to(at::kDouble)
                                .mean(2);
    EXPECT_LT(MaxAbsDiff(resampled->keys.select(2, static_cast<int64_t>(j)), mean), 1e-6) << j;
  }
  auto translated = tr->Translate(*resampled);
  ASSERT_TRUE(translated.ok()) << translated.status();
  auto per_token = tr->Translate(src);
  ASSERT_TRUE(per_token.ok());
  for (const auto& [out, each] : {std::pair{&translated->keys, &per_token->keys},
                                  std::pair{&translated->values, &per_token->values}}) {
    for (size_t j = 0; j < runs.size(); ++j) {
      const at::Tensor mean =
          each->narrow(2, runs[j].begin, runs[j].end - runs[j].begin).to(at::kDouble).mean(2);
      EXPECT_LT(MaxAbsDiff(out->select(2, static_cast<int64_t>(j)), mean), 1e-4) << j;
    }
  }
  // One to one throughout is a gather: the same bits; bfloat16 stays bfloat16.
  auto same = ResampleTaps(src, {{2, 3}, {0, 1}});
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->values.select(2, 0).equal(src.values.select(2, 2)));
  auto bf16 = ResampleTaps({src.keys.to(at::kBFloat16), src.values.to(at::kBFloat16)}, runs);
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->keys.scalar_type(), at::kBFloat16);
  for (const std::vector<TokenRun>& bad : {std::vector<TokenRun>{{3, 3}},
                                           std::vector<TokenRun>{{8, 10}},
                                           std::vector<TokenRun>{{-1, 1}}}) {
    EXPECT_EQ(ResampleTaps(src, bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TranslateTest, CreateRejectsBadSpecsAndShapes) {
  TranslatorSpec spec = MixedSpec();
  spec.assignment.values = {{1}, {3}};  // source has 3 layers
  TranslatorMaps k, v;
  EXPECT_EQ(Translator::Create(spec, k, v).status().code(), absl::StatusCode::kInvalidArgument);
  spec = MixedSpec();
  auto good = RandomTranslator(spec, 1);
  TranslatorMaps keys = good->key_maps();
  keys.weight[1] = at::zeros({6, 7});
  EXPECT_EQ(Translator::Create(spec, keys, good->value_maps()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A model translated into itself through identity maps must decode exactly as
// if it had prefilled the prefix itself.
TEST(TranslateTest, ProductViewsFillATargetLineWithTheSameBitsAsFloat32Output) {
  // The router accepts Output::kProduct views (strided, in the compute dtype)
  // instead of contiguous float32 copies: on every Apply path, split and joint,
  // float32 and bfloat16, the target's line and its next logits must not change
  // by a bit.
  Checkpoint c;
  c.config = testing::TinyConfig({"qwen3", true, false, false, 4, 2}, 2, 32, 8);
  c.weights = testing::RandomWeights(c.config, 41);
  RuntimeOptions o;
  o.n_threads = 1;
  auto engine = Engine::Create(c, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<std::pair<Lists, Lists>> assignments = {
      {{{2, 0}, {1, 2}}, {{1}, {0}}},              // batched (short) / per layer (long)
      {{{2}, {0, 1, 2}}, {{1}, {0}}},              // per layer
      {{{0, 1, 2}, {0, 1, 2}}, {{0, 1, 2}, {0, 1, 2}}}};  // one product
  for (const auto& [key_lists, value_lists] : assignments) {
    for (MapInputs inputs : {MapInputs::kSplit, MapInputs::kJoint}) {
      TranslatorSpec spec = MixedSpec();
      spec.target = EndpointOf(c.config, "t", "tok");
      spec.assignment.keys = key_lists;
      spec.assignment.values = value_lists;
      spec.inputs = inputs;
      auto float32 = RandomTranslator(spec, 43);
      for (DType compute : {DType::kFloat32, DType::kBFloat16}) {
        auto tr = Translator::Create(spec, float32->key_maps(), float32->value_maps(), compute);
        ASSERT_TRUE(tr.ok()) << tr.status();
        for (int64_t n : {5, 300}) {
          const std::string where = absl::StrCat(key_lists.front().size(), " key blocks, ",
                                                 MapInputsName(inputs), ", ", DTypeName(compute),
                                                 ", ", n, " tokens");
          const KvTaps src = RandomTaps(spec.source, n, 44);
          auto copied = (*tr)->Translate(src);
          auto views = (*tr)->Translate(src, Translator::Output::kProduct);
          ASSERT_TRUE(copied.ok() && views.ok()) << where;
          const at::ScalarType dtype = compute == DType::kBFloat16 ? at::kBFloat16 : at::kFloat;
          EXPECT_EQ(views->keys.scalar_type(), dtype) << where;
          EXPECT_EQ(views->keys.sizes(), copied->keys.sizes()) << where;
          EXPECT_TRUE(at::equal(views->keys.to(at::kFloat), copied->keys)) << where;
          EXPECT_TRUE(at::equal(views->values.to(at::kFloat), copied->values)) << where;

          auto from_copies = (*engine)->NewCache();
          auto from_views = (*engine)->NewCache();
          ASSERT_TRUE(from_copies->Accept(copied->keys, copied->values).ok()) << where;
          ASSERT_TRUE(from_views->Accept(views->keys, views->values).ok()) << where;
          for (int64_t il = 0; il < c.config.n_layer; ++il) {
            EXPECT_TRUE(at::equal(from_views->Keys(il), from_copies->Keys(il))) << where;
            EXPECT_TRUE(at::equal(from_views->Values(il), from_copies->Values(il))) << where;
          }
          auto want = (*engine)->Prefill(*from_copies, {7, 3});
          auto got = (*engine)->Prefill(*from_views, {7, 3});
          ASSERT_TRUE(want.ok() && got.ok()) << where;
          EXPECT_TRUE(at::equal(*got, *want)) << where;
        }
      }
    }
  }
}

// The router's thin switch into a model with sliding layers (Gemma-3-style:
// layers 0, 1 and 3 see the last 3 tokens): product views of only what
// those layers read, accepted with the same unread counts, decode as the
// whole translation accepted whole, on every Apply path, with and without
// token anchors.
TEST(TranslateTest, AThinTranslationDecodesLikeTheWholeOne) {
  Checkpoint c;
  c.config = testing::GemmaConfig();
  c.weights = testing::RandomWeights(c.config, 45);
  RuntimeOptions o;
  o.n_threads = 1;
  auto engine = Engine::Create(c, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const LayerAssignment band1 = *RelativeDepthAssignment(3, 4, 1);
  const LayerAssignment band2 = *RelativeDepthAssignment(3, 4, 2);
  const Lists all = {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2}};
  const std::vector<std::pair<Lists, Lists>> assignments = {
      {band2.keys, band1.values},  // batched (short) / per layer (long)
      {all, all}};                 // one product
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(46);
  for (const auto& [key_lists, value_lists] : assignments) {
    for (bool anchored : {false, true}) {
      TranslatorSpec spec = MixedSpec();
      spec.target = EndpointOf(c.config, "t", "tok");
      spec.assignment.keys = key_lists;
      spec.assignment.values = value_lists;
      spec.inputs = MapInputs::kJoint;
      at::Tensor table;
      auto tr = anchored ? AnchoredTranslator(spec, DType::kFloat32, &table)
                         : RandomTranslator(spec, 47);
      for (int64_t n : {5, 300}) {
        const std::string where = absl::StrCat(key_lists.front().size(), " key blocks, anchors ",
                                               anchored, ", ", n, " tokens");
        const KvTaps src = RandomTaps(spec.source, n, 48);
        std::vector<int64_t> ids;
        if (anchored) {
          const at::Tensor r = at::randint(10, {n}, gen);
          ids.assign(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + n);
        }
        const std::vector<int64_t> unread = c.config.UnreadTokens(0, n);
        ASSERT_EQ(unread, (std::vector<int64_t>{n - 2, n - 2, 0, n - 2})) << where;
        auto whole = tr->Translate(src, Translator::Output::kFloat32, ids);
        auto thin = tr->Translate(src, Translator::Output::kProduct, ids, unread);
        ASSERT_TRUE(whole.ok() && thin.ok()) << where;
        auto from_whole = (*engine)->NewCache();
        auto from_thin = (*engine)->NewCache();
        ASSERT_TRUE(from_whole->Accept(whole->keys, whole->values).ok()) << where;
        ASSERT_TRUE(from_thin->Accept(thin->keys, thin->values, unread).ok()) << where;
        EXPECT_EQ(from_thin->Spans().back().thin, n > 2) << where;
        auto want = (*engine)->Prefill(*from_whole, {7, 3});
        auto got = (*engine)->Prefill(*from_thin, {7, 3});
        ASSERT_TRUE(want.ok() && got.ok()) << where;
        EXPECT_LT(MaxAbsDiff(*got, *want), 1e-5) << where;
      }
    }
  }
}

TEST(TranslateTest, IdentityTranslatorReproducesNativeLogits) {
  for (const testing::TinyModel& m : {testing::TinyModel{"qwen3", true, false, false, 4, 2},
                                      testing::TinyModel{"llama", false, true, true, 4, 4}}) {
    Checkpoint c;
    c.config = testing::TinyConfig(m, 3);
    c.weights = testing::RandomWeights(c.config, 17);
    RuntimeOptions o;
    o.n_threads = 1;
    auto engine = Engine::Create(c, o);
    ASSERT_TRUE(engine.ok()) << engine.status();

    TranslatorSpec spec;
    spec.source = EndpointOf(c.config, "self", "tok");
    spec.target = spec.source;
    spec.assignment_kind = "same_index";
    spec.assignment = *SameIndexAssignment(3, 3);
    spec.training.method = "identity";
    const int64_t width = c.config.n_head_kv * c.config.head_dim;
    TranslatorMaps keys;
    for (int il = 0; il < 3; ++il) {
      keys.weight.push_back(at::eye(width));
      keys.bias.push_back(at::zeros({width}));
    }
    auto tr = Translator::Create(spec, keys, keys);
    ASSERT_TRUE(tr.ok()) << tr.status();

    const std::vector<int64_t> prefix = {3, 14, 15, 9, 26, 5, 35, 8};
    const std::vector<int64_t> turn = {9, 7, 9, 3, 23};
    auto native = (*engine)->NewCache();
    ASSERT_TRUE((*engine)->Prefill(*native, prefix).ok());
    auto taps = native->Taps(0, 8);
    ASSERT_TRUE(taps.ok()) << taps.status();
    auto translated = (*tr)->Translate(*taps);
    ASSERT_TRUE(translated.ok()) << translated.status();
    auto foreign = (*engine)->NewCache();
    ASSERT_TRUE(foreign->Accept(translated->keys, translated->values).ok());

    auto want = (*engine)->Prefill(*native, turn, /*all_logits=*/true);
    auto got = (*engine)->Prefill(*foreign, turn, /*all_logits=*/true);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_LT(MaxAbsDiff(*got, *want), 1e-5) << m.name;
  }
}

class TranslatorFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TranslatorSpec spec = MixedSpec();
    spec.training.corpus = "corpus.jsonl";
    spec.training.ridge = 1e-4;
    spec.training.n_tokens = 1234;
    spec.training.method = "distilled";
    spec.training.steps = 70;
    TranslatorTraining fit;
    fit.ridge = 1e-3;
    fit.n_sequences = 256;
    spec.history = {fit, spec.training};
    spec.history[1].steps = 500;
    translator_ = RandomTranslator(spec, 11);
    path_ = dir_.Path("t.safetensors");
    ASSERT_TRUE(translator_->Save(path_).ok());
    expect_ = {"model-s", "model-t", "tok-s", "tok-t"};
  }
  // Rewrites the file with one tensor replaced (undefined: removed).
  void Rewrite(const std::string& name, const at::Tensor& t) {
    auto f = ReadSafetensors(path_);
    ASSERT_TRUE(f.ok());
    if (t.defined()) {
      f->tensors[name] = t;
    } else {
      f->tensors.erase(name);
    }
    ASSERT_TRUE(WriteSafetensors(path_, f->tensors, f->metadata).ok());
  }

  testing::TempDir dir_{"translator"};
  std::unique_ptr<Translator> translator_;
  std::string path_;
  TranslatorExpectation expect_;
};

TEST_F(TranslatorFileTest, RoundTripsMapsAndSpec) {
  auto t = Translator::Load(path_, expect_);
  ASSERT_TRUE(t.ok()) << t.status();
  const TranslatorSpec& s = (*t)->spec();
  EXPECT_EQ(s.assignment.keys, translator_->spec().assignment.keys);
  EXPECT_EQ(s.assignment.values, translator_->spec().assignment.values);
  EXPECT_EQ(s.assignment_kind, "custom");
  EXPECT_EQ(s.target.n_head_kv, 3);
  EXPECT_EQ(s.training.corpus, "corpus.jsonl");
  EXPECT_EQ(s.training.n_tokens, 1234);
  EXPECT_DOUBLE_EQ(s.training.ridge, 1e-4);
  EXPECT_EQ(s.training.steps, 70);
  // Every earlier stage comes back, oldest first.
  ASSERT_EQ(s.history.size(), 2u);
  EXPECT_EQ(s.history[0].method, "closed_form");
  EXPECT_DOUBLE_EQ(s.history[0].ridge, 1e-3);
  EXPECT_EQ(s.history[0].n_sequences, 256);
  EXPECT_EQ(s.history[1].method, "distilled");
  EXPECT_EQ(s.history[1].steps, 500);
  for (size_t il = 0; il < 2; ++il) {
    EXPECT_TRUE((*t)->key_maps().weight[il].equal(translator_->key_maps().weight[il]));
    EXPECT_TRUE((*t)->value_maps().bias[il].equal(translator_->value_maps().bias[il]));
  }
  EXPECT_EQ(s.inputs, MapInputs::kSplit);
  auto meta = ReadSafetensors(path_);
  ASSERT_TRUE(meta.ok());
  EXPECT_NE(meta->metadata["kvlingo_translator"].find("\"inputs\":\"split\""), std::string::npos);

  // Joint maps keep their inputs through the file.
  TranslatorSpec joint = translator_->spec();
  joint.inputs = MapInputs::kJoint;
  auto jt = RandomTranslator(joint, 12);
  ASSERT_TRUE(jt->Save(path_).ok());
  auto back = Translator::Load(path_, expect_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->spec().inputs, MapInputs::kJoint);
  EXPECT_TRUE((*back)->key_maps().weight[0].equal(jt->key_maps().weight[0]));
}

TEST_F(TranslatorFileTest, AStampedEvaluationRoundTripsAndLeavesTheMapsAsTheyWere) {
  // Never measured: no evaluation, and none written.
  auto before = Translator::Load(path_, expect_);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE((*before)->spec().evaluation.has_value());
  EXPECT_EQ(ReadSafetensors(path_)->metadata["kvlingo_translator"].find("evaluation"),
            std::string::npos);

  TranslatorEvaluation e;
  e.recovered = 0.9636;
  e.recovered_se = 0.0097;
  e.gap_nats = 0.0084;
  e.gap_se = 0.0026;
  e.data = "build/house/data/test.jsonl";
  e.windows = 64;
  e.prefix = 255;
  e.continuation = 128;
  e.native_tail = 32;
  e.translate_dtype = "float32";
  e.measured_by = "kvl eval-translator";
  ASSERT_TRUE(StampTranslatorEvaluation(path_, e).ok());
  // A second stamp replaces the first.
  e.recovered = 0.97;
  ASSERT_TRUE(StampTranslatorEvaluation(path_, e).ok());
  auto t = Translator::Load(path_, expect_);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->spec().evaluation.has_value());
  const TranslatorEvaluation& back = *(*t)->spec().evaluation;
  EXPECT_DOUBLE_EQ(back.recovered, 0.97);
  EXPECT_DOUBLE_EQ(back.recovered_se, 0.0097);
  EXPECT_DOUBLE_EQ(back.gap_nats, 0.0084);
  EXPECT_DOUBLE_EQ(back.gap_se, 0.0026);
  EXPECT_EQ(back.data, "build/house/data/test.jsonl");
  EXPECT_EQ(back.windows, 64);
  EXPECT_EQ(back.prefix, 255);
  EXPECT_EQ(back.continuation, 128);
  EXPECT_EQ(back.native_tail, 32);
  EXPECT_EQ(back.translate_dtype, "float32");
  EXPECT_EQ(back.measured_by, "kvl eval-translator");
  // The maps and the rest of the spec are untouched.
  EXPECT_EQ((*t)->spec().training.steps, 70);
  ASSERT_EQ((*t)->spec().history.size(), 2u);
  for (size_t il = 0; il < 2; ++il) {
    EXPECT_TRUE((*t)->key_maps().weight[il].equal(translator_->key_maps().weight[il]));
    EXPECT_TRUE((*t)->value_maps().weight[il].equal(translator_->value_maps().weight[il]));
    EXPECT_TRUE((*t)->key_maps().bias[il].equal(translator_->key_maps().bias[il]));
  }
  // Save writes a loaded translator's evaluation back out.
  const std::string copy = dir_.Path("copy.safetensors");
  ASSERT_TRUE((*t)->Save(copy).ok());
  auto again = Translator::Load(copy, expect_);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->spec().evaluation.has_value());
  EXPECT_DOUBLE_EQ((*again)->spec().evaluation->gap_nats, 0.0084);

  EXPECT_EQ(StampTranslatorEvaluation(dir_.Path("missing.safetensors"), e).code(),
            absl::StatusCode::kNotFound);
  const std::string other = dir_.Path("other.safetensors");
  ASSERT_TRUE(WriteSafetensors(other, {{"x", at::zeros({2})}}, {{"format", "pt"}}).ok());
  EXPECT_EQ(StampTranslatorEvaluation(other, e).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TranslatorFileTest, TokenAnchorsRoundTripAsFormatVersion2AndPlainFilesStayVersion1) {
  auto meta = ReadSafetensors(path_);
  ASSERT_TRUE(meta.ok());
  EXPECT_NE(meta->metadata["kvlingo_translator"].find("\"format_version\":1"), std::string::npos);
  EXPECT_EQ(meta->metadata["kvlingo_translator"].find("anchors"), std::string::npos);

  at::Tensor table;
  auto anchored = AnchoredTranslator(translator_->spec(), DType::kFloat32, &table);
  ASSERT_TRUE(anchored->Save(path_).ok());
  meta = ReadSafetensors(path_);
  ASSERT_TRUE(meta.ok());
  EXPECT_NE(meta->metadata["kvlingo_translator"].find("\"format_version\":2"), std::string::npos);
  auto back = Translator::Load(path_, expect_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->spec().anchor_window, 3);
  EXPECT_TRUE((*back)->anchor_table().equal(table));
  const KvTaps src = RandomTaps(anchored->spec().source, 4, 2);
  const std::vector<int64_t> ids = {5, 2, 8, 1, 1};
  auto a = anchored->Translate(src, Translator::Output::kFloat32, ids);
  auto b = (*back)->Translate(src, Translator::Output::kFloat32, ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->keys.equal(b->keys));
  EXPECT_TRUE(a->values.equal(b->values));
  // A file that lost its table is refused, naming it.
  Rewrite("anchor.table", at::Tensor());
  auto missing = Translator::Load(path_, expect_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("anchor.table"), std::string::npos);
}

TEST_F(TranslatorFileTest, FilesWithoutInputsHaveSplitMapsAndUnknownInputsAreRefused) {
  // Translators written before joint maps existed carry no "inputs" key.
  auto f = ReadSafetensors(path_);
  ASSERT_TRUE(f.ok());
  nlohmann::json meta = nlohmann::json::parse(f->metadata["kvlingo_translator"]);
  meta.erase("inputs");
  ASSERT_TRUE(WriteSafetensors(path_, f->tensors, {{"kvlingo_translator", meta.dump()}}).ok());
  auto old = Translator::Load(path_, expect_);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ((*old)->spec().inputs, MapInputs::kSplit);

  meta["inputs"] = "both";
  ASSERT_TRUE(WriteSafetensors(path_, f->tensors, {{"kvlingo_translator", meta.dump()}}).ok());
  auto bad = Translator::Load(path_, expect_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("split or joint"), std::string::npos) << bad.status();
}

TEST_F(TranslatorFileTest, ResidualMapsAndTheDefaultNativeLayersRoundTrip) {
  auto meta = ReadSafetensors(path_);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->metadata["kvlingo_translator"].find("residual"), std::string::npos);
  auto plain = Translator::Load(path_, expect_);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->residual_maps().empty());
  EXPECT_EQ((*plain)->spec().native_layers, 0);

  at::Tensor table;
  auto anchored = AnchoredTranslator(translator_->spec(), DType::kFloat32, &table);
  ASSERT_TRUE(anchored->SetResidualMaps({RandomResidualMap(true, 8)}, 1, "measured").ok());
  ASSERT_TRUE(anchored->Save(path_).ok());
  auto back = Translator::Load(path_, expect_, DType::kBFloat16);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->spec().native_layers, 1);
  EXPECT_EQ((*back)->spec().native_layers_basis, "measured");
  ASSERT_NE((*back)->ResidualFor(1), nullptr);
  EXPECT_TRUE((*back)->ResidualFor(1)->weight.equal(anchored->ResidualFor(1)->weight));
  EXPECT_TRUE((*back)->ResidualFor(1)->anchor.equal(anchored->ResidualFor(1)->anchor));
  EXPECT_EQ((*back)->ResidualFor(1)->source_layers, (std::vector<int64_t>{0, 2}));
  // In bfloat16 the prediction stays near float32's.
  const KvTaps src = RandomTaps(anchored->spec().source, 4, 2);
  const std::vector<int64_t> ids = {5, 2, 8, 1, 1};
  auto a = anchored->PredictResidual(src, 1, ids);
  auto b = (*back)->PredictResidual(src, 1, ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(MaxAbsDiff(*a, *b), 0.05 * a->abs().max().item<double>());
  // A file that lost a map's tensor is refused, naming it.
  Rewrite("residual.1.bias", at::Tensor());
  auto missing = Translator::Load(path_, expect_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("residual.1.bias"), std::string::npos);
}

TEST_F(TranslatorFileTest, RefusesOtherModelsAndTokenizers) {
  struct Case {
    std::string TranslatorExpectation::*field;
    const char* named;
  };
  for (const Case& c : {Case{&TranslatorExpectation::source_identity, "source model"},
                        Case{&TranslatorExpectation::target_identity, "target model"},
                        Case{&TranslatorExpectation::source_tokenizer_hash, "source tokenizer"},
                        Case{&TranslatorExpectation::target_tokenizer_hash, "target tokenizer"}}) {
    TranslatorExpectation e = expect_;
    e.*(c.field) = "something-else";
    auto t = Translator::Load(path_, e);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << c.named;
    EXPECT_NE(t.status().message().find(c.named), std::string::npos) << t.status();
  }
}

TEST_F(TranslatorFileTest, RefusesCorruptFiles) {
  EXPECT_EQ(Translator::Load(dir_.Path("absent"), expect_).status().code(),
            absl::StatusCode::kNotFound);
  const auto size = std::filesystem::file_size(path_);
  std::filesystem::resize_file(path_, size - 16);
  EXPECT_EQ(Translator::Load(path_, expect_).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::resize_file(path_, 5);
  EXPECT_EQ(Translator::Load(path_, expect_).status().code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(translator_->Save(path_).ok());
  Rewrite("values.1.bias", at::Tensor());
  auto missing = Translator::Load(path_, expect_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("values.1.bias"), std::string::npos);

  ASSERT_TRUE(translator_->Save(path_).ok());
  Rewrite("keys.0.weight", at::zeros({6, 15}));
  EXPECT_EQ(Translator::Load(path_, expect_).status().code(), absl::StatusCode::kInvalidArgument);

  // A plain safetensors file without the translator metadata.
  ASSERT_TRUE(WriteSafetensors(path_, {{"x", at::zeros({2})}}).ok());
  EXPECT_EQ(Translator::Load(path_, expect_).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteSafetensors(path_, {{"x", at::zeros({2})}}, {{"kvlingo_translator", "{"}}).ok());
  EXPECT_EQ(Translator::Load(path_, expect_).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl
