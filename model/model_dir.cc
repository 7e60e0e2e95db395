#include "model/model_dir.h"

#include <utility>

namespace kvl {

absl::StatusOr<ModelDir> LoadModelDir(const std::string& dir, const RuntimeOptions& options,
                                      TokenizerUse tokenizer_use) {
  ModelDir m;
  m.path = dir;
  absl::StatusOr<Checkpoint> checkpoint = LoadCheckpoint(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  m.checkpoint = *std::move(checkpoint);
  if (tokenizer_use == TokenizerUse::kLoad) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        Tokenizer::FromFile(dir + "/tokenizer.json");
    if (!tokenizer.ok()) return tokenizer.status();
    m.tokenizer = *std::move(tokenizer);
  }
  m.identity = ModelIdentity(m.checkpoint.config, m.checkpoint.weights);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(m.checkpoint, options);
  if (!engine.ok()) return engine.status();
  m.engine = *std::move(engine);
  return m;
}

}  // namespace kvl
