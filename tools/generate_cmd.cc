// kvl generate: streams a model's continuation of a prompt to stdout.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "base/flags.h"
#include "model/chat_template.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/model_dir.h"
#include "model/tokenizer.h"
#include "tools/commands.h"

namespace kvl::tools {
namespace {

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl generate: %s\n", message.c_str());
  return code;
}


// Setters for the sampling flags, declared with Custom because their default
// (the model's generation_config.json) is known only once the model is loaded.
absl::Status SetNumber(const std::string& text, double* out) {
  if (absl::SimpleAtod(text, out)) return absl::OkStatus();
  return absl::InvalidArgumentError("expected a number, got '" + text + "'");
}
absl::Status SetNumber(const std::string& text, int64_t* out) {
  if (absl::SimpleAtoi(text, out)) return absl::OkStatus();
  return absl::InvalidArgumentError("expected an integer, got '" + text + "'");
}

}  // namespace

int RunGenerate(const Args& args) {
  std::string model_dir, prompt;
  bool chat = false;
  RuntimeOptions runtime;
  std::string dtype = DTypeName(runtime.dtype);
  GenerateOptions gen;
  FlagSet flags(
      "kvl generate",
      "Streams the continuation to stdout; the finish reason goes to stderr.\n"
      "--chat renders the prompt as one user turn of the model family's chat template\n"
      "(Qwen3 with thinking off, Gemma-3, Llama-3 or Mistral: from tokenizer_config.json's\n"
      "template, else config.json's architecture).\n"
      "Sampling defaults come from the model's generation_config.json (greedy without one).");
  flags.Required("model", &model_dir, "DIR", "the model directory");
  flags.Required("prompt", &prompt, "TEXT", "the text to continue");
  flags.Switch("chat", &chat, "render the prompt as one user turn of the chat template");
  flags.Add("max-tokens", &gen.max_tokens, "N", "most tokens generated");
  flags.Custom("temperature", "T", "sampling temperature, 0: greedy (default: the model's)",
               [&gen](const std::string& v) { return SetNumber(v, &gen.sampling.temperature); });
  flags.Custom("top-k", "K", "sample among the K best tokens, 0: off (default: the model's)",
               [&gen](const std::string& v) { return SetNumber(v, &gen.sampling.top_k); });
  flags.Custom("top-p", "P", "nucleus sampling mass in (0, 1], 1: off (default: the model's)",
               [&gen](const std::string& v) { return SetNumber(v, &gen.sampling.top_p); });
  flags.Add("seed", &gen.seed, "S", "sampling seed");
  flags.Add("stop", &gen.stop_strings, "STR", "stop when the text produces STR");
  flags.Choice("dtype", &dtype, {"float32", "bfloat16", "float16"}, "the model's compute dtype");
  flags.Add("threads", &runtime.n_threads, "N", "intra-op threads, >= 1 if given (0: all cores)");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (gen.max_tokens < 0) return flags.UsageError("--max-tokens must be >= 0");
  if (flags.Given("threads") && runtime.n_threads < 1) {
    return flags.UsageError("--threads must be >= 1");
  }
  runtime.dtype = *ParseDType(dtype);  // one of the names the Choice admits

  absl::StatusOr<ModelDir> model = LoadModelDir(model_dir, runtime);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  Engine& engine = *model->engine;
  Tokenizer& tokenizer = *model->tokenizer;

  const GenerationDefaults& defaults = engine.generation_defaults();
  if (!flags.Given("temperature")) gen.sampling.temperature = defaults.temperature;
  if (!flags.Given("top-k")) gen.sampling.top_k = defaults.top_k;
  if (!flags.Given("top-p")) gen.sampling.top_p = defaults.top_p;
  gen.stop_token_ids = defaults.eos_token_ids;
  for (int64_t id : engine.config().eos_token_ids) gen.stop_token_ids.push_back(id);

  std::string text = prompt;
  if (chat) {
    ChatTemplateOptions options;
    options.add_generation_prompt = true;
    options.enable_thinking = false;
    absl::StatusOr<ChatTemplateKind> kind = ChatTemplateKindForModelDir(model_dir);
    if (!kind.ok()) return Fail(std::string(kind.status().message()));
    options.kind = *kind;
    absl::StatusOr<std::string> rendered = RenderChat({ChatMessage{"user", prompt}}, options);
    if (!rendered.ok()) return Fail(std::string(rendered.status().message()));
    text = *rendered;
  }
  std::vector<int64_t> ids;
  for (int32_t id : tokenizer.Encode(text)) ids.push_back(id);
  if (ids.empty()) return Fail("the prompt encodes to no tokens", 2);

  StreamDecoder stream(tokenizer);
  gen.token_text = [&](int64_t id) { return stream.Push(static_cast<int32_t>(id)); };
  gen.on_token = [](int64_t, std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  std::unique_ptr<KvCache> cache = engine.NewCache();
  absl::StatusOr<GenerateResult> result = engine.Generate(*cache, ids, gen);
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (result->finish_reason != FinishReason::kStopString)
    std::fputs(stream.Flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fprintf(stderr, "[%zu tokens, finish: %s]\n", result->tokens.size(),
               FinishReasonName(result->finish_reason));
  return 0;
}

}  // namespace kvl::tools
