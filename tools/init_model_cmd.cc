// kvl init-model: writes a randomly initialised checkpoint in the Hugging Face
// Hub layout, the starting point for models trained from scratch.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "tools/commands.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl init-model --config config.json --out DIR --seed N\n"
    "                      [--dtype float32|bfloat16|float16] [--tokenizer tokenizer.json]\n"
    "Writes DIR/config.json, model.safetensors and generation_config.json; with\n"
    "--tokenizer, also copies tokenizer.json and the tokenizer_config.json next to it.\n";

int UsageError(const std::string& message) {
  std::fprintf(stderr, "kvl init-model: %s (see kvl init-model --help)\n", message.c_str());
  return 2;
}

}  // namespace

int RunInitModel(const Args& args) {
  std::map<std::string, std::string> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) return UsageError("unexpected argument '" + arg + "'");
    std::string key = arg.substr(2), value;
    if (const size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key.resize(eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return UsageError("flag --" + key + " needs a value");
    }
    if (key != "config" && key != "out" && key != "seed" && key != "dtype" && key != "tokenizer") {
      return UsageError("unknown flag --" + key);
    }
    flags[key] = value;
  }
  for (const char* required : {"config", "out", "seed"}) {
    if (!flags.count(required)) return UsageError(std::string("--") + required + " is required");
  }
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(flags["seed"], &seed)) {
    return UsageError("--seed must be a non-negative integer, got '" + flags["seed"] + "'");
  }
  DType dtype = DType::kFloat32;
  if (flags.count("dtype")) {
    absl::StatusOr<DType> parsed = ParseDType(flags["dtype"]);
    if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
    dtype = *parsed;
  }

  absl::StatusOr<ModelConfig> config = ModelConfig::FromFile(flags["config"]);
  if (!config.ok()) {
    std::fprintf(stderr, "kvl init-model: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  std::string tokenizer_json, tokenizer_config_json;
  if (flags.count("tokenizer")) {
    tokenizer_json = flags["tokenizer"];
    const std::filesystem::path sibling =
        std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(sibling)) tokenizer_config_json = sibling.string();
  }
  const ModelWeights weights = InitWeights(*config, seed);
  if (absl::Status s = SaveCheckpoint(flags["out"], *config, weights, dtype, tokenizer_json,
                                      tokenizer_config_json);
      !s.ok()) {
    std::fprintf(stderr, "kvl init-model: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // Read back what was written: checks it, and the identity printed is the
  // one a server computes when it loads this directory.
  absl::StatusOr<Checkpoint> written = LoadCheckpoint(flags["out"]);
  if (!written.ok()) {
    std::fprintf(stderr, "kvl init-model: reading back: %s\n",
                 std::string(written.status().message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %s, %lld parameters, %s, identity %s\n", flags["out"].c_str(),
              config->architecture_name.c_str(), static_cast<long long>(config->ParameterCount()),
              DTypeName(dtype), ModelIdentity(written->config, written->weights).c_str());
  return 0;
}

}  // namespace kvl::tools
