// kvl eval: per-task accuracy on evaluation suites and held-out
// log-perplexity (tools/eval_lm.h, docs/training.md).
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/eval_lm.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl eval --model DIR [--suite FILE ...] [--text FILE] [--max-tokens N]\n"
    "                [--seq-len T] [--batch B] [--limit K] [--max-new-tokens N]\n"
    "                [--threads N] [--json OUT] [--quiet]\n"
    "Greedy-decodes every suite item (prompt rendered as the training corpus is,\n"
    "then \"<|im_start|>assistant\\n\"), scores it by exact match after the item's\n"
    "normalisation, and with --text measures log-perplexity (nats/token, float32)\n"
    "over windows of --seq-len tokens. Prints a table and JSON; --json also writes the\n"
    "JSON, with every item's output, to OUT. Defaults: max-tokens 65536 (0: all),\n"
    "seq-len 512, batch 8, limit 0 (all), max-new-tokens 64.\n";

const std::set<std::string> kValueFlags = {"model",   "suite",          "text",    "max-tokens",
                                           "seq-len", "batch",          "limit",   "threads",
                                           "json",    "max-new-tokens"};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "kvl eval: %s (see kvl eval --help)\n", message.c_str());
  return 2;
}

}  // namespace

int RunEval(const Args& args) {
  EvalOptions o;
  std::map<std::string, std::string> flags;
  bool quiet = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--quiet") {
      quiet = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) return UsageError("unexpected argument '" + arg + "'");
    std::string key = arg.substr(2), value;
    if (const size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key.resize(eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return UsageError("flag --" + key + " needs a value");
    }
    if (!kValueFlags.count(key)) return UsageError("unknown flag --" + key);
    if (key == "suite") {
      o.suites.push_back(value);
    } else {
      flags[key] = value;
    }
  }
  if (!flags.count("model")) return UsageError("--model is required");
  if (o.suites.empty() && !flags.count("text")) {
    return UsageError("give at least one --suite or a --text file");
  }
  o.model_dir = flags["model"];
  if (flags.count("text")) o.text_path = flags["text"];
  for (auto [name, out] : {std::pair{"max-tokens", &o.max_text_tokens}, {"seq-len", &o.seq_len},
                           {"batch", &o.batch}, {"limit", &o.limit},
                           {"max-new-tokens", &o.max_new_tokens}}) {
    if (!flags.count(name)) continue;
    if (!absl::SimpleAtoi(flags[name], out) || *out < 0) {
      return UsageError(std::string("--") + name + " must be a non-negative integer, got '" +
                        flags[name] + "'");
    }
  }
  if (flags.count("threads") && (!absl::SimpleAtoi(flags["threads"], &o.n_threads) ||
                                 o.n_threads < 0)) {
    return UsageError("--threads must be a non-negative integer");
  }
  o.progress = !quiet;

  absl::StatusOr<EvalReport> report = RunEvaluation(o);
  if (!report.ok()) {
    std::fprintf(stderr, "kvl eval: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  std::fputs(EvalReportTable(*report).c_str(), stdout);
  std::printf("%s\n", EvalReportToJson(*report, /*with_items=*/false).dump().c_str());
  if (flags.count("json")) {
    std::ofstream out(flags["json"], std::ios::trunc);
    out << EvalReportToJson(*report, /*with_items=*/true).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "kvl eval: cannot write %s\n", flags["json"].c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvl::tools
