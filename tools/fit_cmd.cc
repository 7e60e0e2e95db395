// kvl fit: stage-1 closed-form translator fit (training/translator_fit.h,
// translator/README.md) from a corpus, with a per-layer R² report.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/flags.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "training/translator_fit.h"
#include "translator/translator.h"

namespace kvl::tools {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvl fit: %s\n", message.c_str());
  return 1;
}

}  // namespace

int RunFit(const Args& args) {
  training::CorpusFitOptions o;
  std::string out_path;
  std::string band_text = "1", inputs_name = MapInputsName(o.inputs);
  bool quiet = false, no_bias = false;
  FlagSet flags(
      "kvl fit",
      "Prefills every sequence of the corpus with both models, accumulates float64\n"
      "second moments of their pre-norm keys and values, and solves each target\n"
      "layer's maps in closed form (ridge relative to\n"
      "the mean input second moment). .jsonl: one chat per line ({\"messages\": [...]}),\n"
      "rendered as ChatML and cut to --seq-len tokens; .txt: consecutive windows of\n"
      "--seq-len tokens. Writes the translator to --out and the per-layer R² (and the\n"
      "single-layer R² tables) to the same path with extension .r2.json.\n"
      "--assignment defaults to same_index when the depths match (and --band is not\n"
      "all), else relative_depth. --band all: every target layer reads every source\n"
      "layer (the band is the source's depth).\n"
      "Models with different tokenizers: each sequence (cut by the source's tokenizer)\n"
      "is decoded to text that both encode with their own tokenizers; each source token\n"
      "is regressed onto the mean target keys and values of its minimal matching group\n"
      "(KV-Lingo appendix K; uniform weights, no token anchors), and the share of\n"
      "groups that pair one token with one token is printed.\n"
      "--inputs joint: both maps of a target layer read the keys and the values of its\n"
      "assigned source layers (split: key maps read keys, value maps values; the\n"
      "assignment is chosen by split R² either way).\n"
      "--weighting attention: each sequence's last C tokens (--attention-queries; half\n"
      "the sequence when it is shorter than 2C) act as continuation queries; only the\n"
      "tokens before them are fitted, each weighted by the attention the target's\n"
      "continuation queries give it (summed over queries, averaged over layers and\n"
      "heads, normalised to mean 1 per sequence; KV-Lingo appendix O).");
  flags.Required("source", &o.source_dir, "DIR", "the source model");
  flags.Required("target", &o.target_dir, "DIR", "the target model");
  flags.Required("data", &o.data_path, "FILE.jsonl|FILE.txt", "the corpus");
  flags.Required("out", &out_path, "FILE", "the translator to write");
  flags.Choice("assignment", &o.assignment, {"same_index", "relative_depth", "top_r2", "greedy"},
               "which source layers each target layer reads");
  flags.Add("band", &band_text, "N|all", "source layers per target layer");
  flags.Choice("inputs", &inputs_name, {"split", "joint"}, "what each map reads");
  flags.Add("ridge", &o.ridge, "L", "ridge, relative to the mean input second moment, >= 0");
  flags.Choice("weighting", &o.weighting, {"uniform", "attention"}, "weight of each fitted token");
  flags.Add("attention-queries", &o.attention_queries, "C",
            "continuation queries per sequence (--weighting attention), >= 1");
  flags.Add("anchor-window", &o.anchor_window, "W",
            "token anchors: every map also reads the target's anchor rows of tokens "
            "t..t-W+1 (0: none)");
  flags.Add("anchor-rank", &o.anchor_rank, "R",
            "the anchor table at rank R, the embeddings' top R principal directions (for a "
            "real vocabulary; 0: full width)");
  flags.Switch("no-bias", &no_bias, "maps without a bias term");
  flags.Add("max-sequences", &o.max_sequences, "N", "sequences read from the corpus, 0: all");
  flags.Add("seq-len", &o.seq_len, "T", "tokens per sequence, >= 2");
  flags.Add("threads", &o.n_threads, "N", "intra-op threads, 0: all cores");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  o.band_all = band_text == "all";
  if (!o.band_all && (!absl::SimpleAtoi(band_text, &o.band) || o.band < 1)) {
    return flags.UsageError("--band must be an integer >= 1 or all, got '" + band_text + "'");
  }
  if (o.max_sequences < 0) {
    return flags.UsageError("--max-sequences must be a non-negative integer");
  }
  if (o.seq_len < 2) return flags.UsageError("--seq-len must be >= 2");
  if (o.n_threads < 0) return flags.UsageError("--threads must be a non-negative integer");
  if (o.ridge < 0) return flags.UsageError("--ridge must be a non-negative number");
  if (o.attention_queries < 1) return flags.UsageError("--attention-queries must be >= 1");
  if (o.anchor_window < 0) return flags.UsageError("--anchor-window must be >= 0");
  if (o.anchor_rank < 0) return flags.UsageError("--anchor-rank must be >= 0");
  o.inputs = *ParseMapInputs(inputs_name);  // a name the Choice admits
  o.bias = !no_bias;
  o.progress = !quiet;

  absl::StatusOr<training::CorpusFit> fit = training::FitFromCorpus(o);
  if (!fit.ok()) return Fail(std::string(fit.status().message()));
  if (absl::Status s = fit->fit.translator->Save(out_path); !s.ok()) {
    return Fail(std::string(s.message()));
  }

  std::printf("%-6s %-14s %-8s %-14s %-8s\n", "layer", "keys from", "R2 keys", "values from",
              "R2 values");
  auto list = [](const std::vector<int64_t>& l) {
    std::string s;
    for (int64_t x : l) absl::StrAppend(&s, s.empty() ? "" : ",", x);
    return s;
  };
  const nlohmann::json report = training::CorpusFitReport(o, *fit, out_path);
  const LayerAssignment& assignment = fit->spec.assignment;
  for (size_t il = 0; il < fit->fit.r2_keys.size(); ++il) {
    std::printf("%-6zu %-14s %-8.4f %-14s %-8.4f\n", il, list(assignment.keys[il]).c_str(),
                fit->fit.r2_keys[il], list(assignment.values[il]).c_str(),
                fit->fit.r2_values[il]);
  }
  std::printf("mean   %-14s %-8.4f %-14s %-8.4f\n", "", report["mean_r2_keys"].get<double>(), "",
              report["mean_r2_values"].get<double>());
  if (fit->n_groups > 0) {
    std::printf("across tokenizers: %lld minimal matching groups, %.1f%% one token to one token\n",
                static_cast<long long>(fit->n_groups),
                100.0 * static_cast<double>(fit->n_one_to_one) / static_cast<double>(fit->n_groups));
  }
  const std::string json_path =
      std::filesystem::path(out_path).replace_extension(".r2.json").string();
  if (absl::Status s = WriteTextFile(json_path, report.dump(2) + "\n"); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  std::printf("wrote %s and %s\n", out_path.c_str(), json_path.c_str());
  return 0;
}

}  // namespace kvl::tools
