// kvl eval-conversation: lookups over conversations that alternate between
// two models, through the router (training/switch_eval.h).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "base/files.h"
#include "base/flags.h"
#include "model/config.h"
#include "tools/commands.h"
#include "training/switch_eval.h"

namespace kvl::tools {

int RunEvalConversation(const Args& args) {
  training::ConversationEvalOptions o;
  std::string translators, translate_dtype = "auto", json_path, plot_prefix;
  bool quiet = false, no_live = false;
  FlagSet flags(
      "kvl eval-conversation",
      "Conversations about one key-value document (datagen's kv records, a seed of\n"
      "their own) whose --turns alternate between --first and --second: turn 1 gives\n"
      "the document and a lookup, every later turn asks another key's value on the\n"
      "other model (a switch). Replies are the reference values (gold history). Per\n"
      "turn, under re-prefill, translation (native tail --native-tail) and translation\n"
      "with background repair between turns: greedy exact-match accuracy and the\n"
      "reference value's NLL, and how long the turn took to read. A fourth run with\n"
      "repair and the models' own answers reports each switch's live divergence (the\n"
      "server's kvlingo_switch_divergence_nats) beside the offline gap. Half the\n"
      "conversations start on each model. Prints a table; --json writes the figures,\n"
      "--plot PREFIX the PNG plots PREFIX-accuracy.png and PREFIX-nll.png.");
  flags.Required("first", &o.first_dir, "DIR", "one model");
  flags.Required("second", &o.second_dir, "DIR", "the other model");
  flags.Required("translators", &translators, "FORWARD,REVERSE",
                 "first -> second and second -> first translator files");
  flags.Add("conversations", &o.conversations, "N", "conversations per starting model");
  flags.Add("turns", &o.turns, "T", "turns per conversation");
  flags.Add("seed", &o.seed, "S", "the documents' seed");
  flags.Add("kv-max-bytes", &o.data.kv_max_bytes, "N",
            "largest document (difficulty 3; the house corpus's by default)");
  flags.Add("native-tail", &o.native_tail, "W", "the translate conditions' native tail");
  flags.Add("max-new-tokens", &o.max_new_tokens, "N", "the live run's answer length limit");
  flags.Switch("no-live", &no_live, "skip the live-fidelity run");
  flags.Choice("translate-dtype", &translate_dtype, {"auto", "float32", "bfloat16"},
               "the translation's arithmetic (auto: the server's default)");
  flags.Add("threads", &o.n_threads, "N", "intra-op threads, 0: all cores");
  flags.Add("json", &json_path, "FILE", "also write the figures as JSON");
  flags.Add("plot", &plot_prefix, "PREFIX", "also write PREFIX-accuracy.png and PREFIX-nll.png");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  const std::vector<std::string> pair = absl::StrSplit(translators, ',', absl::SkipWhitespace());
  if (pair.size() != 2) return flags.UsageError("--translators takes FORWARD,REVERSE");
  o.forward_translator = pair[0];
  o.reverse_translator = pair[1];
  o.live = !no_live;
  if (translate_dtype != "auto") o.translate_dtype = *ParseDType(translate_dtype);
  o.progress = !quiet;

  absl::StatusOr<training::ConversationEvalReport> report = training::RunConversationEval(o);
  if (!report.ok()) {
    std::fprintf(stderr, "kvl eval-conversation: %s\n",
                 std::string(report.status().message()).c_str());
    return report.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::fputs(training::ConversationEvalTable(*report).c_str(), stdout);
  absl::Status s;
  if (!json_path.empty()) {
    s = WriteTextFile(json_path, training::ConversationEvalJson(o, *report).dump(2) + "\n");
  }
  if (s.ok() && !plot_prefix.empty()) s = training::PlotConversationEval(*report, plot_prefix);
  if (!s.ok()) {
    std::fprintf(stderr, "kvl eval-conversation: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace kvl::tools
