// kvl init-model: writes a randomly initialised checkpoint in the Hugging Face
// Hub layout, the starting point for models trained from scratch.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "base/flags.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "tools/commands.h"

namespace kvl::tools {
int RunInitModel(const Args& args) {
  std::string config_path, out_dir, seed_text, tokenizer_json;
  std::string dtype_name = DTypeName(DType::kFloat32);
  FlagSet flags(
      "kvl init-model",
      "Writes DIR/config.json, model.safetensors and generation_config.json; with\n"
      "--tokenizer, also copies tokenizer.json and the tokenizer_config.json next to it.");
  flags.Required("config", &config_path, "config.json", "the model's Hugging Face config.json");
  flags.Required("out", &out_dir, "DIR", "the model directory to write");
  // Only string flags can be Required, and the seed has no default: parsed below.
  flags.Required("seed", &seed_text, "N", "initialisation seed, a non-negative integer");
  flags.Choice("dtype", &dtype_name, {"float32", "bfloat16", "float16"},
               "dtype of the written weights");
  flags.Add("tokenizer", &tokenizer_json, "tokenizer.json",
            "copied into DIR (with tokenizer_config.json from the same directory, if present); "
            "a directory stands for its tokenizer.json");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(seed_text, &seed)) {
    return flags.UsageError("--seed must be a non-negative integer, got '" + seed_text + "'");
  }
  const DType dtype = *ParseDType(dtype_name);  // one of the names the Choice admits

  absl::StatusOr<ModelConfig> config = ModelConfig::FromFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "kvl init-model: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  std::string tokenizer_config_json;
  // A directory (a model's, or models/tokenizer) stands for its tokenizer.json.
  if (!tokenizer_json.empty() && std::filesystem::is_directory(tokenizer_json)) {
    tokenizer_json = (std::filesystem::path(tokenizer_json) / "tokenizer.json").string();
  }
  if (!tokenizer_json.empty()) {
    const std::filesystem::path sibling =
        std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(sibling)) tokenizer_config_json = sibling.string();
  }
  const ModelWeights weights = InitWeights(*config, seed);
  if (absl::Status s = SaveCheckpoint(out_dir, *config, weights, dtype, tokenizer_json,
                                      tokenizer_config_json);
      !s.ok()) {
    std::fprintf(stderr, "kvl init-model: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // Read back what was written: checks it, and the identity printed is the
  // one a server computes when it loads this directory.
  absl::StatusOr<Checkpoint> written = LoadCheckpoint(out_dir);
  if (!written.ok()) {
    std::fprintf(stderr, "kvl init-model: reading back: %s\n",
                 std::string(written.status().message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %s, %lld parameters, %s, identity %s\n", out_dir.c_str(),
              config->architecture_name.c_str(), static_cast<long long>(config->ParameterCount()),
              DTypeName(dtype), ModelIdentity(written->config, written->weights).c_str());
  return 0;
}

}  // namespace kvl::tools
