// Small model pairs for the translator command tests: random-weight Qwen3
// models (O(1) activations, tests/model/test_models.h) over the house
// tokenizer, written as model directories, identity translators, and a short
// ChatML corpus.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/tokenizer.h"
#include "tests/model/test_models.h"
#include "tests/testing/temp_dir.h"
#include "tests/training/tiny_lm_fixture.h"
#include "translator/translator.h"

namespace kvl::testing {

inline std::string HouseTokenizerDir() { return std::string(KVL_SOURCE_DIR) + "/models/tokenizer"; }

// A random Qwen3 model of n_layer layers and n_head_kv KV heads (head_dim 8)
// over the house tokenizer's 4096 ids, written to dir/name. `std`: of the
// random matrices (smaller: smoother models, easier to translate).
inline std::string WriteRandomModel(const TempDir& dir, const std::string& name, int64_t n_layer,
                                    int64_t n_head_kv, uint64_t seed, double std = 0.25) {
  const TinyModel shape{"qwen3", true, false, true, 4, n_head_kv};
  ModelConfig config = TinyConfig(shape, n_layer, /*hidden=*/32, /*head_dim=*/8, /*vocab=*/4096);
  const ModelWeights weights = RandomWeights(config, seed, std);
  const std::string path = dir.Path(name);
  const absl::Status s = SaveCheckpoint(path, config, weights, DType::kFloat32,
                                        HouseTokenizerDir() + "/tokenizer.json",
                                        HouseTokenizerDir() + "/tokenizer_config.json");
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// Endpoint of a model directory as translator files record it.
inline TranslatorEndpoint EndpointOfDir(const std::string& dir) {
  absl::StatusOr<Checkpoint> c = LoadCheckpoint(dir);
  EXPECT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromFile(dir + "/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return EndpointOf(c->config, ModelIdentity(c->config, c->weights), (*t)->content_hash());
}

// Translator with the given maps from source to target (same_index when the
// depths match, else relative_depth band 1); maps: identity when `identity`,
// else random with the given seed.
inline std::unique_ptr<Translator> MakeTranslator(const std::string& source_dir,
                                                  const std::string& target_dir, bool identity,
                                                  uint64_t seed = 0) {
  TranslatorSpec spec;
  spec.source = EndpointOfDir(source_dir);
  spec.target = EndpointOfDir(target_dir);
  spec.assignment_kind = "relative_depth";
  spec.assignment = *RelativeDepthAssignment(spec.source.n_layer, spec.target.n_layer, 1);
  spec.training.method = identity ? "identity" : "random";
  const int64_t in = spec.source.n_head_kv * spec.source.head_dim;
  const int64_t out = spec.target.n_head_kv * spec.target.head_dim;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  TranslatorMaps keys, values;
  for (TranslatorMaps* m : {&keys, &values}) {
    for (int64_t il = 0; il < spec.target.n_layer; ++il) {
      m->weight.push_back(identity ? at::eye(out, in) : at::randn({out, in}, gen) * 0.3);
      m->bias.push_back(identity ? at::zeros({out}) : at::randn({out}, gen) * 0.1);
    }
  }
  absl::StatusOr<std::unique_ptr<Translator>> t = Translator::Create(spec, keys, values);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

// A token-anchored copy of `t` (window W, anchor table `table` [V, E]): the
// same maps plus anchor weights, random * `scale` with the given seed, or
// zeros when `scale` is 0 (then it translates exactly as `t` does).
inline std::unique_ptr<Translator> WithAnchors(const Translator& t, const at::Tensor& table,
                                               int64_t window, double scale, uint64_t seed = 0) {
  TranslatorSpec spec = t.spec();
  spec.anchor_window = window;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  TranslatorMaps keys = t.key_maps(), values = t.value_maps();
  for (TranslatorMaps* m : {&keys, &values}) {
    for (const at::Tensor& w : m->weight) {
      const at::Tensor a = at::randn({w.size(0), window * table.size(1)}, gen) * scale;
      m->anchor.push_back(a);
    }
  }
  absl::StatusOr<std::unique_ptr<Translator>> out =
      Translator::Create(spec, keys, values, DType::kFloat32, table);
  EXPECT_TRUE(out.ok()) << out.status();
  return std::move(*out);
}

}  // namespace kvl::testing
