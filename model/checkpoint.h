// Model directories in the Hugging Face Hub layout: config.json,
// model.safetensors or model.safetensors.index.json with shards,
// tokenizer.json, tokenizer_config.json, generation_config.json (optional).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvl {

struct Checkpoint {
  std::string dir;
  ModelConfig config;
  GenerationDefaults generation;
  ModelWeights weights;  // in the file's dtype, on CPU
};

// Loads a model directory. Errors name the file and the problem: NotFound for a
// missing file, InvalidArgument for a malformed header, a truncated file, a
// missing tensor, a wrong shape or an unsupported dtype/architecture.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir);

// Writes config.json (torch_dtype = dtype), model.safetensors (dtype as given),
// generation_config.json (greedy, the config's bos/eos) and, when the tokenizer
// paths are non-empty, copies of tokenizer.json/tokenizer_config.json. Weights
// that do not match the config are refused before anything is written.
absl::Status SaveCheckpoint(const std::string& dir, const ModelConfig& config,
                            const ModelWeights& weights, DType dtype,
                            const std::string& tokenizer_json = "",
                            const std::string& tokenizer_config_json = "");

// Random initialisation as Hugging Face does it (normal(0, 0.02) for linear and
// embedding weights, ones for norms), deterministic for a seed.
ModelWeights InitWeights(const ModelConfig& config, uint64_t seed);

// A stable hex digest of config.json plus all weights, used to tie translators
// to the exact models they were trained for.
std::string ModelIdentity(const ModelConfig& config, const ModelWeights& weights);

}  // namespace kvl
