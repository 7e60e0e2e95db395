// kvl logits: runs a model directory on a list of token ids and prints the
// float32 logits of every position as JSON, {"logits": [[...], ...]} — the
// format golden tests compare against other implementations. With
// --prefix-from/--translator/--prefix-len the first N tokens are prefilled by
// another model and reach --model through a translator (translator/README.md);
// the rows are then those of the tokens --model processed itself.
#include <ATen/ATen.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "model/config.h"
#include "model/engine.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/translator_tools.h"
#include "translator/translator.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl logits --model DIR --ids 1,2,3 [--dtype float32|bfloat16] [--threads N]\n"
    "       [--prefix-from SOURCE_DIR --translator FILE --prefix-len N\n"
    "        [--translate-dtype auto|float32|bfloat16]]\n"
    "Prints {\"logits\": [[...], ...]}: one row of float32 logits per position.\n"
    "With --prefix-from, SOURCE prefills the first N ids, its cache is translated\n"
    "into --model's cache by FILE (checked against both models), and --model\n"
    "processes the rest: the rows are positions N..end (1 <= N < number of ids),\n"
    "and the JSON adds \"first_position\": N. --translate-dtype: the translator's\n"
    "arithmetic (default float32; auto as the server's compute_dtype default).\n";

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl logits: %s\n", message.c_str());
  return code;
}

}  // namespace

int RunLogits(const Args& args) {
  std::map<std::string, std::string> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
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
    if (key != "model" && key != "ids" && key != "dtype" && key != "threads" &&
        key != "prefix-from" && key != "translator" && key != "prefix-len" &&
        key != "translate-dtype") {
      return Fail("unknown flag --" + key, 2);
    }
    flags[key] = value;
  }
  if (!flags.count("model") || !flags.count("ids"))
    return Fail("--model and --ids are required", 2);

  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(flags["ids"], ',', absl::SkipWhitespace())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(piece, &id))
      return Fail("--ids: '" + std::string(piece) + "' is not an integer", 2);
    ids.push_back(id);
  }
  RuntimeOptions options;
  if (flags.count("dtype")) {
    absl::StatusOr<DType> dtype = ParseDType(flags["dtype"]);
    if (!dtype.ok()) return Fail(std::string(dtype.status().message()), 2);
    options.dtype = *dtype;
  }
  if (flags.count("threads") &&
      (!absl::SimpleAtoi(flags["threads"], &options.n_threads) || options.n_threads < 1)) {
    return Fail("--threads must be a positive integer", 2);
  }

  const int n_translation_flags = static_cast<int>(flags.count("prefix-from")) +
                                  static_cast<int>(flags.count("translator")) +
                                  static_cast<int>(flags.count("prefix-len"));
  if (n_translation_flags != 0 && n_translation_flags != 3) {
    return Fail("--prefix-from, --translator and --prefix-len go together", 2);
  }
  DType compute = DType::kFloat32;
  if (flags.count("translate-dtype")) {
    const std::string name = flags["translate-dtype"];
    absl::StatusOr<DType> d =
        name == "auto" ? absl::StatusOr<DType>(FastestTranslateDtype()) : ParseDType(name);
    if (n_translation_flags != 3) return Fail("--translate-dtype needs --translator", 2);
    if (!d.ok() || *d == DType::kFloat16) {
      return Fail("--translate-dtype takes auto, float32 or bfloat16", 2);
    }
    compute = *d;
  }
  int64_t prefix_len = 0;
  if (n_translation_flags == 3 &&
      (!absl::SimpleAtoi(flags["prefix-len"], &prefix_len) || prefix_len < 1 ||
       prefix_len >= static_cast<int64_t>(ids.size()))) {
    return Fail("--prefix-len must be an integer in [1, number of ids)", 2);
  }

  absl::StatusOr<at::Tensor> logits;
  if (prefix_len == 0) {
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::CreateFromDir(flags["model"], options);
    if (!engine.ok()) return Fail(std::string(engine.status().message()));
    std::unique_ptr<KvCache> cache = (*engine)->NewCache();
    logits = (*engine)->Prefill(*cache, ids, /*all_logits=*/true);
  } else {
    // Translators work in float32 (LoadTranslatorModel forces it).
    absl::StatusOr<TranslatorModel> source = LoadTranslatorModel(flags["prefix-from"], options);
    if (!source.ok()) return Fail(std::string(source.status().message()));
    absl::StatusOr<TranslatorModel> target = LoadTranslatorModel(flags["model"], options);
    if (!target.ok()) return Fail(std::string(target.status().message()));
    absl::StatusOr<std::unique_ptr<Translator>> translator =
        Translator::Load(flags["translator"], ExpectationFor(*source, *target), compute);
    if (!translator.ok()) return Fail(std::string(translator.status().message()));
    const std::vector<int64_t> prefix(ids.begin(), ids.begin() + prefix_len);
    const std::vector<int64_t> rest(ids.begin() + prefix_len, ids.end());
    absl::StatusOr<std::unique_ptr<KvCache>> cache =
        TranslatedCache(*source->engine, *target->engine, **translator, prefix);
    if (!cache.ok()) return Fail(std::string(cache.status().message()));
    logits = target->engine->Prefill(**cache, rest, /*all_logits=*/true);
  }
  if (!logits.ok()) return Fail(std::string(logits.status().message()));

  const at::Tensor rows = logits->contiguous();
  const float* data = rows.data_ptr<float>();
  const int64_t n_vocab = rows.size(1);
  nlohmann::json out = {{"logits", nlohmann::json::array()}};
  if (prefix_len > 0) out["first_position"] = prefix_len;
  for (int64_t t = 0; t < rows.size(0); ++t) {
    out["logits"].push_back(std::vector<float>(data + t * n_vocab, data + (t + 1) * n_vocab));
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace kvl::tools
