// kvl eval-translator: continuation log-perplexity, suite accuracy and a
// multi-turn run through KV-cache translators (training/translator_eval.h).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "base/files.h"
#include "base/flags.h"
#include "model/config.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "training/translator_eval.h"
#include "translator/translator.h"

namespace kvl::tools {

using training::RunTranslatorEval;
using training::TranslatorEvalJson;
using training::TranslatorEvalOptions;
using training::TranslatorEvalReport;
using training::TranslatorEvalTable;

namespace {

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl eval-translator: %s\n", message.c_str());
  return code;
}


std::vector<std::string> List(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipWhitespace());
}

}  // namespace

int RunEvalTranslator(const Args& args) {
  TranslatorEvalOptions o;
  std::string translators, suites, multi_turn, json_path;
  std::string translate_dtype = DTypeName(o.translate_dtype);
  bool quiet = false, stamp = false;
  FlagSet flags(
      "kvl eval-translator",
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
      "(c) re-prefill. --translate-dtype auto: bfloat16 where the CPU has bfloat16\n"
      "dot products, as the server's default. --native-tail W: in the translated\n"
      "conditions and multi-turn (a) the target prefills the last W\n"
      "prefix/prompt/history tokens itself, attending to the translation of the rest\n"
      "(the server's routing.native_tail_tokens). Prints a table; --json also writes\n"
      "the JSON report.");
  flags.Required("source", &o.source_dir, "DIR", "the source model");
  flags.Required("target", &o.target_dir, "DIR", "the target model");
  flags.Required("translator", &translators, "FILE[,FILE2...]",
                 "translators from --source to --target, compared side by side");
  flags.Required("data", &o.data_path, "TEST.jsonl|TEST.txt", "held-out chats or text");
  flags.Add("prefix", &o.prefix, "P", "tokens of each window the source prefills");
  flags.Add("continuation", &o.continuation, "C", "continuation tokens scored per window");
  flags.Add("max-windows", &o.max_windows, "N", "windows, 0: all that fit");
  flags.Add("first-k", &o.first_k, "K", "the first-tokens statistics cover K positions");
  flags.Add("suites", &suites, "S1.jsonl,S2.jsonl,...", "evaluation suites for accuracy");
  flags.Add("limit", &o.suite_limit, "N", "items per suite file, 0: all");
  flags.Add("max-new-tokens", &o.max_new_tokens, "N", "tokens generated per suite item");
  flags.Add("multi-turn", &multi_turn, "FORWARD,REVERSE",
            "source->target and target->source translators for the multi-turn runs");
  flags.Add("switches", &o.n_switches, "N", "model switches per multi-turn run");
  flags.Add("turn-len", &o.turn_len, "T", "tokens per multi-turn turn");
  flags.Add("multi-turn-runs", &o.multi_turn_runs, "N", "multi-turn runs");
  flags.Choice("translate-dtype", &translate_dtype, {"auto", "float32", "bfloat16"},
               "the translators' arithmetic");
  flags.Add("native-tail", &o.native_tail, "W",
            "last prefix tokens the target prefills itself, 0: none");
  flags.Switch("prefill-uneven-groups", &o.prefill_uneven_groups,
               "across tokenizers: the target prefills every minimal matching group that is "
               "not one token to one token, in place, instead of translating it (a measurement: "
               "one forward pass per such group)");
  flags.Add("json", &json_path, "FILE", "also write the JSON report here");
  flags.Add("threads", &o.n_threads, "N", "intra-op threads, 0: all cores");
  flags.Switch("stamp", &stamp,
               "write each translator's recovered share and gap (all positions) into its "
               "file, for kvl-server's load-time quality gate");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (stamp && o.prefill_uneven_groups) {
    return flags.UsageError("--stamp records the translation the server does: not with --prefill-uneven-groups");
  }
  o.translators = List(translators);
  o.suites = List(suites);
  if (flags.Given("multi-turn")) {
    const std::vector<std::string> pair = List(multi_turn);
    if (pair.size() != 2) return flags.UsageError("--multi-turn takes FORWARD,REVERSE");
    o.multi_turn_forward = pair[0];
    o.multi_turn_reverse = pair[1];
  }
  // Not auto: one of the names the Choice admits.
  o.translate_dtype =
      translate_dtype == "auto" ? FastestTranslateDtype() : *ParseDType(translate_dtype);
  o.progress = !quiet;

  absl::StatusOr<TranslatorEvalReport> r = RunTranslatorEval(o);
  if (!r.ok()) {
    return Fail(std::string(r.status().message()),
                r.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  std::fputs(TranslatorEvalTable(*r).c_str(), stdout);
  if (!json_path.empty()) {
    if (absl::Status s = WriteTextFile(json_path, TranslatorEvalJson(o, *r).dump(2) + "\n");
        !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  if (stamp) {
    for (const training::TranslatedPpl& t : r->translated) {
      TranslatorEvaluation e;
      e.recovered = t.recovered;
      e.recovered_se = t.recovered_se;
      e.gap_nats = t.gap;
      e.gap_se = t.gap_se;
      e.data = o.data_path;
      e.windows = r->n_windows;
      e.prefix = r->prefix;
      e.continuation = r->continuation;
      e.native_tail = r->native_tail;
      e.translate_dtype = DTypeName(r->translate_dtype);
      e.measured_by = "kvl eval-translator";
      if (absl::Status s = StampTranslatorEvaluation(t.file, e); !s.ok()) {
        return Fail(std::string(s.message()));
      }
      std::fprintf(stderr, "stamped %s\n", t.file.c_str());
    }
  }
  return 0;
}

}  // namespace kvl::tools
