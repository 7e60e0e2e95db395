// kvl ablate-translator: which target layers' translated keys and values cost
// the most (tools/translator_ablate.h).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/train_lm.h"
#include "tools/translator_ablate.h"
#include "tools/translator_distill.h"
#include "tools/translator_tools.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl ablate-translator --source DIR --target DIR --translator FILE\n"
    "                             --data TEST.jsonl|TEST.txt [--hand-over reply]\n"
    "                             [--prefix 255] [--continuation 16] [--windows 64]\n"
    "                             [--json FILE] [--threads N]\n"
    "On the first --windows non-overlapping windows of --data whose prefix ends at a\n"
    "--hand-over point (any|reply|turn|chat, as kvl distill), the source prefills\n"
    "the prefix and the translator maps its cache; the target then reads a cache\n"
    "in which some layers come from its own prefill instead. Printed: mean\n"
    "KL(target native || target on that cache) per continuation position and at\n"
    "the first position, with every layer translated, with all keys or all values\n"
    "native, and per target layer with that layer native (the rest translated) and\n"
    "with only that layer translated (the rest native). The layers whose 'only'\n"
    "KL is largest limit the translator.\n";

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl ablate-translator: %s\n", message.c_str());
  return code;
}

nlohmann::json Json(const AblationKl& k) { return {{"all", k.all}, {"first", k.first}}; }

}  // namespace

int RunAblateTranslator(const Args& args) {
  absl::StatusOr<ParsedFlags> flags = ParseFlags(
      args,
      {"source", "target", "translator", "data", "hand-over", "prefix", "continuation", "windows",
       "json", "threads"},
      {});
  if (!flags.ok()) return Fail(std::string(flags.status().message()) + " (see --help)", 2);
  if (flags->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (const char* required : {"source", "target", "translator", "data"}) {
    if (!flags->Has(required)) return Fail(std::string("--") + required + " is required", 2);
  }
  int64_t prefix = 255, continuation = 16, n_windows = 64, threads = 0;
  for (absl::Status s :
       {FlagInt(*flags, "prefix", &prefix), FlagInt(*flags, "continuation", &continuation),
        FlagInt(*flags, "windows", &n_windows), FlagInt(*flags, "threads", &threads)}) {
    if (!s.ok()) return Fail(std::string(s.message()), 2);
  }
  if (prefix < 1 || continuation < 1 || n_windows < 1 || threads < 0) {
    return Fail("--prefix, --continuation and --windows must be >= 1, --threads >= 0", 2);
  }
  absl::StatusOr<HandOver> hand_over =
      ParseHandOver(flags->Has("hand-over") ? flags->values.at("hand-over") : "reply");
  if (!hand_over.ok()) return Fail(std::string(hand_over.status().message()), 2);

  RuntimeOptions runtime;
  runtime.n_threads = static_cast<int>(threads);
  absl::StatusOr<TranslatorModel> source = LoadTranslatorModel(flags->values.at("source"), runtime);
  if (!source.ok()) return Fail(std::string(source.status().message()));
  absl::StatusOr<TranslatorModel> target = LoadTranslatorModel(flags->values.at("target"), runtime);
  if (!target.ok()) return Fail(std::string(target.status().message()));
  absl::StatusOr<std::unique_ptr<Translator>> translator =
      Translator::Load(flags->values.at("translator"), ExpectationFor(*source, *target));
  if (!translator.ok()) return Fail(std::string(translator.status().message()));
  SetIntraOpThreads(static_cast<int>(threads));
  absl::StatusOr<std::vector<int32_t>> stream =
      ReadTokenStream(flags->values.at("data"), *source->tokenizer);
  if (!stream.ok()) return Fail(std::string(stream.status().message()));

  const int64_t window = prefix + continuation;
  std::vector<std::vector<int64_t>> windows;
  for (int64_t off : FirstDisjointWindows(
           HandOverWindowStarts(*source->tokenizer, *stream, *hand_over, prefix, window), window,
           n_windows)) {
    windows.emplace_back(stream->begin() + off, stream->begin() + off + window);
  }
  if (windows.empty()) {
    return Fail(absl::StrFormat("%s: no window of %d tokens at a %s hand-over point",
                                flags->values.at("data"), window, HandOverName(*hand_over)));
  }
  absl::StatusOr<LayerAblation> r =
      AblateTranslator(*source, *target, **translator, windows, prefix);
  if (!r.ok()) return Fail(std::string(r.status().message()));

  std::printf("KL(native || cache) per position, %lld windows (%s hand-over), prefix %lld, "
              "continuation %lld: all positions / first position\n",
              static_cast<long long>(r->n_windows), HandOverName(*hand_over).c_str(),
              static_cast<long long>(prefix), static_cast<long long>(continuation));
  auto row = [](const std::string& name, const AblationKl& k) {
    std::printf("%-34s %8.4f %8.4f\n", name.c_str(), k.all, k.first);
  };
  row("every layer translated", r->translated);
  row("all keys native, values translated", r->keys_native);
  row("all values native, keys translated", r->values_native);
  for (size_t l = 0; l < r->layer_native.size(); ++l) {
    row(absl::StrFormat("layer %d native, rest translated", l), r->layer_native[l]);
  }
  for (size_t l = 0; l < r->only_layer.size(); ++l) {
    row(absl::StrFormat("only layer %d translated", l), r->only_layer[l]);
  }
  if (flags->Has("json")) {
    nlohmann::json j = {{"source", flags->values.at("source")},
                        {"target", flags->values.at("target")},
                        {"translator", flags->values.at("translator")},
                        {"data", flags->values.at("data")},
                        {"hand_over", HandOverName(*hand_over)},
                        {"prefix", prefix},
                        {"continuation", continuation},
                        {"windows", r->n_windows},
                        {"translated", Json(r->translated)},
                        {"keys_native", Json(r->keys_native)},
                        {"values_native", Json(r->values_native)},
                        {"layer_native", nlohmann::json::array()},
                        {"only_layer", nlohmann::json::array()}};
    for (const AblationKl& k : r->layer_native) j["layer_native"].push_back(Json(k));
    for (const AblationKl& k : r->only_layer) j["only_layer"].push_back(Json(k));
    std::ofstream out(flags->values.at("json"), std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out) return Fail("cannot write " + flags->values.at("json"));
  }
  return 0;
}

}  // namespace kvl::tools
