// kvl ablate-translator: which target layers' translated keys and values cost
// the most (training/translator_ablate.h).
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/files.h"
#include "base/flags.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "training/train_lm.h"
#include "training/translator_ablate.h"
#include "training/translator_distill.h"
#include "training/translator_data.h"

namespace kvl::tools {

using training::AblateTranslator;
using training::AblationKl;
using training::ExpectationFor;
using training::FirstDisjointWindows;
using training::HandOver;
using training::HandOverName;
using training::HandOverWindowStarts;
using training::LayerAblation;
using training::ParseHandOver;
using training::ReadTokenStream;
using training::SetIntraOpThreads;
using training::TranslatorModel;

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvl ablate-translator: %s\n", message.c_str());
  return 1;
}


nlohmann::json Json(const AblationKl& k) { return {{"all", k.all}, {"first", k.first}}; }

}  // namespace

int RunAblateTranslator(const Args& args) {
  std::string source_dir, target_dir, translator_path, data_path, json_path;
  std::string hand_over_name = HandOverName(HandOver::kReply);
  int64_t prefix = 255, continuation = 16, n_windows = 64;
  int threads = 0;
  FlagSet flags(
      "kvl ablate-translator",
      "On the first --windows non-overlapping windows of --data whose prefix ends at a\n"
      "--hand-over point (as kvl distill), the source prefills the prefix and the\n"
      "translator maps its cache; the target then reads a cache in which some layers\n"
      "come from its own prefill instead. Printed: mean KL(target native || target on\n"
      "that cache) per continuation position and at the first position, with every\n"
      "layer translated, with all keys or all values native, and per target layer with\n"
      "that layer native (the rest translated) and with only that layer translated\n"
      "(the rest native). The layers whose 'only' KL is largest limit the translator.");
  flags.Required("source", &source_dir, "DIR", "the source model");
  flags.Required("target", &target_dir, "DIR", "the target model");
  flags.Required("translator", &translator_path, "FILE", "translator from --source to --target");
  flags.Required("data", &data_path, "TEST.jsonl|TEST.txt", "held-out chats or text");
  flags.Choice("hand-over", &hand_over_name, {"any", "reply", "turn", "chat"},
               "where each window's prefix ends");
  flags.Add("prefix", &prefix, "P", "tokens the source prefills, >= 1");
  flags.Add("continuation", &continuation, "C", "continuation positions scored, >= 1");
  flags.Add("windows", &n_windows, "N", "windows, >= 1");
  flags.Add("json", &json_path, "FILE", "also write the results as JSON here");
  flags.Add("threads", &threads, "N", "intra-op threads, 0: all cores");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  const std::pair<const char*, int64_t> positive[] = {
      {"prefix", prefix}, {"continuation", continuation}, {"windows", n_windows}};
  for (const auto& [name, value] : positive) {
    if (value < 1) return flags.UsageError(absl::StrCat("--", name, " must be >= 1"));
  }
  if (threads < 0) return flags.UsageError("--threads must be >= 0");
  const HandOver hand_over = *ParseHandOver(hand_over_name);  // a name the Choice admits

  RuntimeOptions runtime;
  runtime.n_threads = threads;
  absl::StatusOr<training::TranslatorPair> pair =
      training::LoadTranslatorPair(source_dir, target_dir, runtime);
  if (!pair.ok()) return Fail(std::string(pair.status().message()));
  TranslatorModel* source = &pair->source;
  TranslatorModel* target = &pair->target;
  absl::StatusOr<std::unique_ptr<Translator>> translator =
      Translator::Load(translator_path, ExpectationFor(*source, *target));
  if (!translator.ok()) return Fail(std::string(translator.status().message()));
  SetIntraOpThreads(threads);
  absl::StatusOr<std::vector<int32_t>> stream = ReadTokenStream(data_path, *source->tokenizer);
  if (!stream.ok()) return Fail(std::string(stream.status().message()));

  const int64_t window = prefix + continuation;
  std::vector<std::vector<int64_t>> windows;
  for (int64_t off : FirstDisjointWindows(
           HandOverWindowStarts(*source->tokenizer, *stream, hand_over, prefix, window), window,
           n_windows)) {
    windows.emplace_back(stream->begin() + off, stream->begin() + off + window);
  }
  if (windows.empty()) {
    return Fail(absl::StrFormat("%s: no window of %d tokens at a %s hand-over point",
                                data_path, window, HandOverName(hand_over)));
  }
  absl::StatusOr<LayerAblation> r =
      AblateTranslator(*source, *target, **translator, windows, prefix);
  if (!r.ok()) return Fail(std::string(r.status().message()));

  std::printf("KL(native || cache) per position, %lld windows (%s hand-over), prefix %lld, "
              "continuation %lld: all positions / first position\n",
              static_cast<long long>(r->n_windows), HandOverName(hand_over).c_str(),
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
  if (!json_path.empty()) {
    nlohmann::json j = {{"source", source_dir},
                        {"target", target_dir},
                        {"translator", translator_path},
                        {"data", data_path},
                        {"hand_over", HandOverName(hand_over)},
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
    if (absl::Status s = WriteTextFile(json_path, j.dump(2) + "\n"); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  return 0;
}

}  // namespace kvl::tools
