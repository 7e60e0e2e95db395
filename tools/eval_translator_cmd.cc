// kvl eval-translator: continuation log-perplexity, suite accuracy and a
// multi-turn run through KV-cache translators (tools/translator_eval.h).
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/translator_eval.h"
#include "tools/translator_tools.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl eval-translator --source DIR --target DIR --translator FILE[,FILE2...]\n"
    "                           --data TEST.jsonl|TEST.txt [--prefix 255] [--continuation 128]\n"
    "                           [--max-windows 64] [--first-k 32]\n"
    "                           [--suites S1.jsonl,S2.jsonl,...] [--limit 50] [--max-new-tokens 64]\n"
    "                           [--multi-turn FORWARD,REVERSE] [--switches 8] [--turn-len 64]\n"
    "                           [--multi-turn-runs 16] [--translate-dtype auto|float32|bfloat16]\n"
    "                           [--native-tail 0]\n"
    "                           [--json FILE] [--threads N] [--quiet]\n"
    "Translators go from --source to --target (closed-form and distilled side by\n"
    "side). On windows of prefix + continuation + 1 tokens of --data, the target\n"
    "predicts the continuation after processing the held-back last prefix token:\n"
    "natively, from each translated cache, with no prefix, and the source natively\n"
    "for reference; gap = translated - native, recovered = (no_prefix - translated)\n"
    "/ (no_prefix - native), over all positions and the first --first-k. Suites:\n"
    "greedy accuracy, scored as kvl eval, for target, source and each translator.\n"
    "--multi-turn (source->target and target->source files): runs of switches + 1\n"
    "turns of --turn-len tokens, the models alternating from the source; the NLL of\n"
    "each turn under (a) span-wise translation, (b) whole-prefix re-translation,\n"
    "(c) re-prefill. --translate-dtype: the translators' arithmetic (default\n"
    "float32; auto: bfloat16 where the CPU has bfloat16 dot products, as the\n"
    "server's default). --native-tail W: in the translated conditions and multi-turn (a)\n"
    "the target prefills the last W prefix/prompt/history tokens itself,\n"
    "attending to the translation of the rest (the server's\n"
    "routing.native_tail_tokens). Prints a table; --json also writes the JSON\n"
    "report.\n";

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl eval-translator: %s\n", message.c_str());
  return code;
}

std::vector<std::string> List(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipWhitespace());
}

}  // namespace

int RunEvalTranslator(const Args& args) {
  absl::StatusOr<ParsedFlags> flags = ParseFlags(
      args,
      {"source", "target", "translator", "data", "prefix", "continuation", "max-windows",
       "first-k", "suites", "limit", "max-new-tokens", "multi-turn", "switches", "turn-len",
       "multi-turn-runs", "json", "threads", "translate-dtype", "native-tail"},
      {"quiet"});
  if (!flags.ok()) return Fail(std::string(flags.status().message()) + " (see --help)", 2);
  if (flags->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (const char* required : {"source", "target", "translator", "data"}) {
    if (!flags->Has(required)) return Fail(std::string("--") + required + " is required", 2);
  }
  TranslatorEvalOptions o;
  o.source_dir = flags->values.at("source");
  o.target_dir = flags->values.at("target");
  o.translators = List(flags->values.at("translator"));
  o.data_path = flags->values.at("data");
  if (flags->Has("suites")) o.suites = List(flags->values.at("suites"));
  if (flags->Has("multi-turn")) {
    const std::vector<std::string> pair = List(flags->values.at("multi-turn"));
    if (pair.size() != 2) return Fail("--multi-turn takes FORWARD,REVERSE", 2);
    o.multi_turn_forward = pair[0];
    o.multi_turn_reverse = pair[1];
  }
  if (flags->Has("translate-dtype")) {
    const std::string& name = flags->values.at("translate-dtype");
    absl::StatusOr<DType> dtype =
        name == "auto" ? absl::StatusOr<DType>(FastestTranslateDtype()) : ParseDType(name);
    if (!dtype.ok() || *dtype == DType::kFloat16) {
      return Fail("--translate-dtype takes auto, float32 or bfloat16, got '" + name + "'", 2);
    }
    o.translate_dtype = *dtype;
  }
  int64_t threads = 0;
  for (absl::Status s :
       {FlagInt(*flags, "prefix", &o.prefix), FlagInt(*flags, "continuation", &o.continuation),
        FlagInt(*flags, "max-windows", &o.max_windows), FlagInt(*flags, "first-k", &o.first_k),
        FlagInt(*flags, "limit", &o.suite_limit),
        FlagInt(*flags, "max-new-tokens", &o.max_new_tokens),
        FlagInt(*flags, "switches", &o.n_switches), FlagInt(*flags, "turn-len", &o.turn_len),
        FlagInt(*flags, "multi-turn-runs", &o.multi_turn_runs),
        FlagInt(*flags, "threads", &threads), FlagInt(*flags, "native-tail", &o.native_tail)}) {
    if (!s.ok()) return Fail(std::string(s.message()), 2);
  }
  o.n_threads = static_cast<int>(threads);
  o.progress = !flags->switches.count("quiet");

  absl::StatusOr<TranslatorEvalReport> r = RunTranslatorEval(o);
  if (!r.ok()) {
    return Fail(std::string(r.status().message()),
                r.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  std::fputs(TranslatorEvalTable(*r).c_str(), stdout);
  if (flags->Has("json")) {
    std::ofstream out(flags->values.at("json"), std::ios::trunc);
    out << TranslatorEvalJson(o, *r).dump(2) << "\n";
    if (!out) return Fail("cannot write " + flags->values.at("json"));
  }
  return 0;
}

}  // namespace kvl::tools
