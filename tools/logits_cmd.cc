// kvl logits: runs a model directory on a list of token ids and prints the
// float32 logits of every position as JSON, {"logits": [[...], ...]} — the
// format golden tests compare against other implementations. With
// --prefix-from/--translator/--prefix-len the first N tokens are prefilled by
// another model and reach --model through a translator (translator/README.md);
// the rows are then those of the tokens --model processed itself. Without a
// translator the tokenizer is not read: a weights-only directory (config.json
// + model.safetensors) is enough.
#include <ATen/ATen.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/model_dir.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "training/translator_data.h"
#include "translator/translator.h"

namespace kvl::tools {

using training::ExpectationFor;
using training::TranslatedCache;
using training::TranslatorModel;

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvl logits: %s\n", message.c_str());
  return 1;
}


}  // namespace

int RunLogits(const Args& args) {
  std::string model_dir, ids_text, source_dir, translator_path;
  RuntimeOptions options;
  std::string dtype = DTypeName(options.dtype);
  std::string translate_dtype = DTypeName(DType::kFloat32);
  int64_t prefix_len = 0;
  FlagSet flags(
      "kvl logits",
      "Prints {\"logits\": [[...], ...]}: one row of float32 logits per position.\n"
      "With --prefix-from, SOURCE prefills the first N ids, its cache is translated\n"
      "into --model's cache by FILE (checked against both models), and --model\n"
      "processes the rest: the rows are positions N..end (1 <= N < number of ids),\n"
      "and the JSON adds \"first_position\": N. --prefix-from, --translator and\n"
      "--prefix-len go together; --translate-dtype needs them (auto: as the server's\n"
      "compute_dtype default).");
  flags.Required("model", &model_dir, "DIR", "the model directory whose logits are printed");
  flags.Required("ids", &ids_text, "ID,ID,...", "the token ids, comma-separated");
  flags.Choice("dtype", &dtype, {"float32", "bfloat16", "float16"},
               "the model's compute dtype (the logits are printed as float32)");
  flags.Add("threads", &options.n_threads, "N", "intra-op threads, >= 1 if given (0: all cores)");
  flags.Add("prefix-from", &source_dir, "SOURCE_DIR", "the model that prefills the first N ids");
  flags.Add("translator", &translator_path, "FILE",
            "translator file from SOURCE_DIR to --model (kvl fit, kvl distill)");
  flags.Add("prefix-len", &prefix_len, "N", "ids prefilled by SOURCE_DIR, 1 <= N < number of ids");
  flags.Choice("translate-dtype", &translate_dtype, {"auto", "float32", "bfloat16"},
               "the translator's arithmetic");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;

  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(ids_text, ',', absl::SkipWhitespace())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return flags.UsageError("--ids: '" + std::string(piece) + "' is not an integer");
    }
    ids.push_back(id);
  }
  options.dtype = *ParseDType(dtype);  // one of the names the Choice admits
  if (flags.Given("threads") && options.n_threads < 1) {
    return flags.UsageError("--threads must be a positive integer");
  }
  const int n_translation_flags = static_cast<int>(flags.Given("prefix-from")) +
                                  static_cast<int>(flags.Given("translator")) +
                                  static_cast<int>(flags.Given("prefix-len"));
  if (n_translation_flags != 0 && n_translation_flags != 3) {
    return flags.UsageError("--prefix-from, --translator and --prefix-len go together");
  }
  if (flags.Given("translate-dtype") && n_translation_flags != 3) {
    return flags.UsageError("--translate-dtype needs --translator");
  }
  const DType compute =
      translate_dtype == "auto" ? FastestTranslateDtype() : *ParseDType(translate_dtype);
  if (n_translation_flags == 3 &&
      (prefix_len < 1 || prefix_len >= static_cast<int64_t>(ids.size()))) {
    return flags.UsageError("--prefix-len must be an integer in [1, number of ids)");
  }

  absl::StatusOr<at::Tensor> logits;
  if (prefix_len == 0) {
    // Token ids in, logits out: no tokenizer.json needed.
    absl::StatusOr<ModelDir> model = LoadModelDir(model_dir, options, TokenizerUse::kSkip);
    if (!model.ok()) return Fail(std::string(model.status().message()));
    std::unique_ptr<KvCache> cache = model->engine->NewCache();
    logits = model->engine->Prefill(*cache, ids, /*all_logits=*/true);
  } else {
    // Translators work in float32 (LoadTranslatorModel forces it).
    absl::StatusOr<training::TranslatorPair> pair =
        training::LoadTranslatorPair(source_dir, model_dir, options);
    if (!pair.ok()) return Fail(std::string(pair.status().message()));
    TranslatorModel* source = &pair->source;
    TranslatorModel* target = &pair->target;
    absl::StatusOr<std::unique_ptr<Translator>> translator =
        Translator::Load(translator_path, ExpectationFor(*source, *target), compute);
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
