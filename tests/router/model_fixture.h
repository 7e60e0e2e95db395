// Three small random models sharing the committed tokenizer, and fitted
// translators between them, written to a directory in the Hugging Face layout
// (what kvl-server loads). Used by the router and server tests.
//
//   small    models/configs/kvl-small.json, seed 1
//   small-b  the same shape, seed 2
//   large    models/configs/kvl-large.json, seed 3
//
// Weights are normal(0, 0.25) (norms around 1) rather than Hugging Face's
// 0.02, so that logits are peaked and greedy decoding is decided by clear
// margins. Translators are stage-1 closed-form fits on random token sequences.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/model_dir.h"
#include "model/tokenizer.h"
#include "training/translator_fit.h"
#include "translator/translator.h"

namespace kvl::testing {

struct FixtureModel {
  const char* name;
  const char* config;  // under models/configs/
  uint64_t seed;
};

inline const std::vector<FixtureModel>& FixtureModels() {
  static const std::vector<FixtureModel> kModels = {
      {"small", "kvl-small.json", 1}, {"small-b", "kvl-small.json", 2}, {"large", "kvl-large.json", 3}};
  return kModels;
}

inline std::string TokenizerJsonPath() {
  return std::string(KVL_SOURCE_DIR) + "/models/tokenizer/tokenizer.json";
}

inline std::string TranslatorPath(const std::string& dir, const std::string& source,
                                  const std::string& target) {
  return dir + "/translators/" + source + "__" + target + ".safetensors";
}

// Writes dir/<name> for each fixture model.
inline absl::Status WriteFixtureModels(const std::string& dir) {
  for (const FixtureModel& m : FixtureModels()) {
    absl::StatusOr<ModelConfig> config =
        ModelConfig::FromFile(std::string(KVL_SOURCE_DIR) + "/models/configs/" + m.config);
    if (!config.ok()) return config.status();
    config->max_position_embeddings = 2048;
    ModelWeights w = InitWeights(*config, m.seed);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(m.seed + 100);
    for (auto& [name, t] : w.Named(*config)) {
      if (name.find("norm") != std::string::npos) {
        t.normal_(1.0, 0.1, gen);
      } else {
        t.normal_(0.0, 0.25, gen);
      }
    }
    KVL_RETURN_IF_ERROR(
        SaveCheckpoint(dir + "/" + m.name, *config, w, DType::kFloat32, TokenizerJsonPath(),
                       std::string(KVL_SOURCE_DIR) + "/models/tokenizer/tokenizer_config.json"));
  }
  return absl::OkStatus();
}

// Fits and saves a translator for every ordered pair of fixture models listed
// in `pairs` ({source, target} names), from a few random token sequences; the
// pairs also listed in `joint` get joint-input maps (MapInputs::kJoint).
inline absl::Status WriteFixtureTranslators(
    const std::string& dir, const std::vector<std::pair<std::string, std::string>>& pairs,
    const std::vector<std::pair<std::string, std::string>>& joint = {}) {
  std::filesystem::create_directories(dir + "/translators");
  std::vector<std::pair<std::string, ModelDir>> loaded;
  RuntimeOptions options;
  options.n_threads = 2;
  for (const FixtureModel& m : FixtureModels()) {
    absl::StatusOr<ModelDir> model = LoadModelDir(dir + "/" + m.name, options);
    if (!model.ok()) return model.status();
    loaded.emplace_back(m.name, *std::move(model));
  }
  auto find = [&](const std::string& name) -> ModelDir* {
    for (auto& [n, model] : loaded) {
      if (n == name) return &model;
    }
    return nullptr;
  };
  for (const auto& [s_name, t_name] : pairs) {
    ModelDir* s = find(s_name);
    ModelDir* t = find(t_name);
    if (s == nullptr || t == nullptr) return absl::NotFoundError(s_name + "->" + t_name);
    TranslatorSpec spec;
    spec.source = EndpointOf(s->config(), s->identity, s->tokenizer->content_hash());
    spec.target = EndpointOf(t->config(), t->identity, t->tokenizer->content_hash());
    const int64_t ls = s->config().n_layer, lt = t->config().n_layer;
    absl::StatusOr<LayerAssignment> assignment =
        ls == lt ? SameIndexAssignment(ls, lt) : RelativeDepthAssignment(ls, lt, 1);
    if (!assignment.ok()) return assignment.status();
    spec.assignment = *assignment;
    spec.assignment_kind = ls == lt ? "same_index" : "relative_depth";
    if (std::find(joint.begin(), joint.end(), std::pair{s_name, t_name}) != joint.end()) {
      spec.inputs = MapInputs::kJoint;
    }
    absl::StatusOr<std::unique_ptr<training::MomentAccumulator>> acc =
        training::MomentAccumulator::Create(spec.source, spec.target);
    if (!acc.ok()) return acc.status();
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(77);
    for (int i = 0; i < 4; ++i) {
      const at::Tensor ids = at::randint(4000, {192}, gen, at::TensorOptions().dtype(at::kLong));
      std::vector<int64_t> v(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
      KVL_RETURN_IF_ERROR(training::AccumulateSequence(*s->engine, *t->engine, v, **acc));
    }
    absl::StatusOr<training::FitResult> fit = (*acc)->Fit(spec, 1e-3);
    if (!fit.ok()) return fit.status();
    KVL_RETURN_IF_ERROR(fit->translator->Save(TranslatorPath(dir, s_name, t_name)));
  }
  return absl::OkStatus();
}

}  // namespace kvl::testing
