// kvl eval: per-task accuracy on evaluation suites and held-out
// log-perplexity (training/eval_lm.h, docs/training.md).
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/flags.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "training/eval_lm.h"

namespace kvl::tools {

using training::EvalOptions;
using training::EvalReport;
using training::EvalReportTable;
using training::EvalReportToJson;
using training::RunEvaluation;
int RunEval(const Args& args) {
  EvalOptions o;
  std::string json_path;
  bool quiet = false;
  FlagSet flags(
      "kvl eval",
      "Greedy-decodes every suite item (prompt rendered as the training corpus is,\n"
      "then \"<|im_start|>assistant\\n\"), scores it by exact match after the item's\n"
      "normalisation, and with --text measures log-perplexity (nats/token, float32)\n"
      "over windows of --seq-len tokens. Give at least one --suite or a --text file.\n"
      "Prints a table and JSON; --json also writes the JSON, with every item's output,\n"
      "to OUT.");
  flags.Required("model", &o.model_dir, "DIR", "the model directory");
  flags.Add("suite", &o.suites, "FILE", "an evaluation suite (.jsonl)");
  flags.Add("text", &o.text_path, "FILE", "held-out text for log-perplexity");
  flags.Add("max-tokens", &o.max_text_tokens, "N", "tokens predicted on --text, 0: all");
  flags.Add("seq-len", &o.seq_len, "T", "perplexity window, in tokens");
  flags.Add("batch", &o.batch, "B", "perplexity windows per forward");
  flags.Add("limit", &o.limit, "K", "items per suite file, 0: all");
  flags.Add("max-new-tokens", &o.max_new_tokens, "N", "tokens generated per item");
  flags.Add("threads", &o.n_threads, "N", "intra-op threads, 0: all cores");
  flags.Add("json", &json_path, "OUT", "also write the JSON report, with every item, here");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  const std::pair<const char*, int64_t> non_negative[] = {
      {"max-tokens", o.max_text_tokens}, {"seq-len", o.seq_len}, {"batch", o.batch},
      {"limit", o.limit}, {"max-new-tokens", o.max_new_tokens}, {"threads", o.n_threads}};
  for (const auto& [name, value] : non_negative) {
    if (value < 0) {
      return flags.UsageError(
          absl::StrCat("--", name, " must be a non-negative integer, got '", value, "'"));
    }
  }
  if (o.suites.empty() && o.text_path.empty()) {
    return flags.UsageError("give at least one --suite or a --text file");
  }
  o.progress = !quiet;

  absl::StatusOr<EvalReport> report = RunEvaluation(o);
  if (!report.ok()) {
    std::fprintf(stderr, "kvl eval: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  std::fputs(EvalReportTable(*report).c_str(), stdout);
  std::printf("%s\n", EvalReportToJson(*report, /*with_items=*/false).dump().c_str());
  if (!json_path.empty()) {
    if (absl::Status s =
            WriteTextFile(json_path, EvalReportToJson(*report, /*with_items=*/true).dump(2) + "\n");
        !s.ok()) {
      std::fprintf(stderr, "kvl eval: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvl::tools
