// kvl eval-switch: recall after a switch, through the router
// (training/switch_eval.h).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "base/flags.h"
#include "model/config.h"
#include "tools/commands.h"
#include "training/switch_eval.h"

namespace kvl::tools {

int RunEvalSwitch(const Args& args) {
  training::SwitchEvalOptions o;
  std::string tasks = "facts,kv,arith", tails = "0,32", translate_dtype = "auto", json_path;
  bool quiet = false;
  int64_t native_layers = -1;
  FlagSet flags(
      "kvl eval-switch",
      "Generated conversations (datagen's facts, kv, ... items, a seed of their own)\n"
      "run through the router as a server runs them: every turn before the question\n"
      "on --source (the item's replies given), then the question on --target, after\n"
      "a switch by re-prefill, by translation with each native tail W of --tails, and\n"
      "on --source itself for reference. Per task: greedy answer accuracy and the\n"
      "reference answer's NLL, with standard errors over the items, and each\n"
      "translation's recall as a fraction of re-prefill's. Prints a table; --json\n"
      "also writes the figures.");
  flags.Required("source", &o.source_dir, "DIR", "the model the conversation starts on");
  flags.Required("target", &o.target_dir, "DIR", "the model the question switches to");
  flags.Add("translator", &o.translator_path, "FILE", "source -> target translator");
  flags.Add("tasks", &tasks, "T,T,...", "datagen tasks: facts, kv, arith, lists, strings");
  flags.Add("items", &o.items_per_task, "N", "items per task");
  flags.Add("seed", &o.seed, "S", "the items' seed");
  flags.Add("difficulty", &o.difficulty, "D", "1..3; 0: the items cycle through 1, 2, 3");
  flags.Add("facts-distractors", &o.data.facts_max_distractors, "N",
            "difficulty knob as kvl make-data's (default: the house corpus's)");
  flags.Add("facts-filler", &o.data.facts_max_filler, "N", "difficulty knob");
  flags.Add("kv-max-bytes", &o.data.kv_max_bytes, "N", "difficulty knob");
  flags.Add("arith-steps", &o.data.arith_max_steps, "N", "difficulty knob");
  flags.Add("list-len", &o.data.list_max_len, "N", "difficulty knob");
  flags.Add("string-len", &o.data.string_max_len, "N", "difficulty knob");
  flags.Add("tails", &tails, "W,W,...", "native tails of the translate conditions ('' : none)");
  flags.Switch("hand-over-turn", &o.hand_over_turn,
               "switch one turn before the question (a given hand-over turn), so that the "
               "question is a turn after a switch turn");
  flags.Switch("repair", &o.repair,
               "with --hand-over-turn: also each translate condition with background repair "
               "(the question waits for it)");
  flags.Add("max-new-tokens", &o.max_new_tokens, "N", "greedy answer length limit");
  flags.Choice("translate-dtype", &translate_dtype, {"auto", "float32", "bfloat16"},
               "the translation's arithmetic (auto: the server's default)");
  flags.Add("native-layers", &native_layers, "K",
            "the translate conditions compute the target's top K layers natively from the "
            "translator's residual map (default: the file's own; 0: translate every layer)");
  flags.Add("threads", &o.n_threads, "N", "intra-op threads, 0: all cores");
  flags.Add("json", &json_path, "FILE", "also write the figures as JSON");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  o.tasks = absl::StrSplit(tasks, ',', absl::SkipWhitespace());
  o.native_tails.clear();
  for (absl::string_view w : absl::StrSplit(tails, ',', absl::SkipWhitespace())) {
    int64_t tail = 0;
    if (!absl::SimpleAtoi(w, &tail) || tail < 0) {
      return flags.UsageError("--tails takes non-negative integers, got '" + std::string(w) + "'");
    }
    o.native_tails.push_back(tail);
  }
  if (translate_dtype != "auto") o.translate_dtype = *ParseDType(translate_dtype);
  if (native_layers < -1) return flags.UsageError("--native-layers must be >= 0");
  if (native_layers >= 0) o.native_layers = native_layers;
  o.progress = !quiet;

  absl::StatusOr<training::SwitchEvalReport> report = training::RunSwitchEval(o);
  if (!report.ok()) {
    std::fprintf(stderr, "kvl eval-switch: %s\n", std::string(report.status().message()).c_str());
    return report.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::fputs(training::SwitchEvalTable(*report).c_str(), stdout);
  if (!json_path.empty()) {
    if (absl::Status s =
            WriteTextFile(json_path, training::SwitchEvalJson(o, *report).dump(2) + "\n");
        !s.ok()) {
      std::fprintf(stderr, "kvl eval-switch: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvl::tools
