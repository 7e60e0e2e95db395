// kvl generate: streams a model's continuation of a prompt to stdout.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "model/chat_template.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/tokenizer.h"
#include "tools/commands.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl generate --model DIR --prompt TEXT [--chat] [--max-tokens N]\n"
    "                    [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                    [--stop STR]... [--dtype float32|bfloat16] [--threads N]\n"
    "Streams the continuation to stdout; the finish reason goes to stderr.\n"
    "--chat renders the prompt as one user turn of the chat template (thinking off).\n"
    "Sampling defaults come from the model's generation_config.json (greedy without one).\n";

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl generate: %s\n", message.c_str());
  return code;
}

}  // namespace

int RunGenerate(const Args& args) {
  std::string model_dir, prompt;
  bool chat = false;
  bool have_prompt = false;
  RuntimeOptions runtime;
  GenerateOptions gen;
  gen.max_tokens = 256;
  bool have_temperature = false, have_top_k = false, have_top_p = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--chat") {
      chat = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) return Fail("unexpected argument '" + arg + "'", 2);
    std::string key = arg.substr(2), value;
    if (const size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key.resize(eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return Fail("flag --" + key + " needs a value", 2);
    }
    bool ok = true;
    if (key == "model") {
      model_dir = value;
    } else if (key == "prompt") {
      prompt = value;
      have_prompt = true;
    } else if (key == "max-tokens") {
      ok = absl::SimpleAtoi(value, &gen.max_tokens) && gen.max_tokens >= 0;
    } else if (key == "temperature") {
      ok = have_temperature = absl::SimpleAtod(value, &gen.sampling.temperature);
    } else if (key == "top-k") {
      ok = have_top_k = absl::SimpleAtoi(value, &gen.sampling.top_k);
    } else if (key == "top-p") {
      ok = have_top_p = absl::SimpleAtod(value, &gen.sampling.top_p);
    } else if (key == "seed") {
      ok = absl::SimpleAtoi(value, &gen.seed);
    } else if (key == "stop") {
      gen.stop_strings.push_back(value);
    } else if (key == "threads") {
      ok = absl::SimpleAtoi(value, &runtime.n_threads) && runtime.n_threads >= 1;
    } else if (key == "dtype") {
      absl::StatusOr<DType> dtype = ParseDType(value);
      if (!dtype.ok()) return Fail(std::string(dtype.status().message()), 2);
      runtime.dtype = *dtype;
    } else {
      return Fail("unknown flag --" + key, 2);
    }
    if (!ok) return Fail("bad value '" + value + "' for --" + key, 2);
  }
  if (model_dir.empty() || !have_prompt) return Fail("--model and --prompt are required", 2);

  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateFromDir(model_dir, runtime);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(model_dir + "/tokenizer.json");
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));

  const GenerationDefaults& defaults = (*engine)->generation_defaults();
  if (!have_temperature) gen.sampling.temperature = defaults.temperature;
  if (!have_top_k) gen.sampling.top_k = defaults.top_k;
  if (!have_top_p) gen.sampling.top_p = defaults.top_p;
  gen.stop_token_ids = defaults.eos_token_ids;
  for (int64_t id : (*engine)->config().eos_token_ids) gen.stop_token_ids.push_back(id);

  std::string text = prompt;
  if (chat) {
    ChatTemplateOptions options;
    options.add_generation_prompt = true;
    options.enable_thinking = false;
    absl::StatusOr<std::string> rendered = RenderChat({ChatMessage{"user", prompt}}, options);
    if (!rendered.ok()) return Fail(std::string(rendered.status().message()));
    text = *rendered;
  }
  std::vector<int64_t> ids;
  for (int32_t id : (*tokenizer)->Encode(text)) ids.push_back(id);
  if (ids.empty()) return Fail("the prompt encodes to no tokens", 2);

  StreamDecoder stream(**tokenizer);
  gen.token_text = [&](int64_t id) { return stream.Push(static_cast<int32_t>(id)); };
  gen.on_token = [](int64_t, std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  std::unique_ptr<KvCache> cache = (*engine)->NewCache();
  absl::StatusOr<GenerateResult> result = (*engine)->Generate(*cache, ids, gen);
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (result->finish_reason != FinishReason::kStopString)
    std::fputs(stream.Flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fprintf(stderr, "[%zu tokens, finish: %s]\n", result->tokens.size(),
               FinishReasonName(result->finish_reason));
  return 0;
}

}  // namespace kvl::tools
