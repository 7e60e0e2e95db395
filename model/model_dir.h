// A model directory loaded whole: the one loader of every binary and tool.
// A model directory is Hugging Face's layout: config.json, model.safetensors
// (or an index and shards), generation_config.json (optional) and
// tokenizer.json (which a command that takes token ids only may skip).
//
// Thread-safety: LoadModelDir is a free function; the engine it returns is
// driven by one thread at a time (model/engine.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/tokenizer.h"

namespace kvl {

struct ModelDir {
  std::string path;
  Checkpoint checkpoint;  // as stored; the engine holds its own (converted) copy
  std::unique_ptr<Tokenizer> tokenizer;  // null when loaded with TokenizerUse::kSkip
  std::unique_ptr<Engine> engine;  // with the RuntimeOptions given to LoadModelDir
  // ModelIdentity(config, weights as stored): what a translator file names.
  std::string identity;

  const ModelConfig& config() const { return checkpoint.config; }
};

// Whether LoadModelDir reads <dir>/tokenizer.json: a caller that works on
// token ids only (kvl logits --ids) skips it, so that a weights-only directory
// (config.json + model.safetensors) loads.
enum class TokenizerUse { kLoad, kSkip };

// Errors: LoadCheckpoint's (NotFound for a missing directory or file,
// InvalidArgument for a malformed one), Tokenizer::FromFile's for
// <dir>/tokenizer.json (with kLoad), Engine::Create's.
absl::StatusOr<ModelDir> LoadModelDir(const std::string& dir, const RuntimeOptions& options,
                                      TokenizerUse tokenizer = TokenizerUse::kLoad);

}  // namespace kvl
