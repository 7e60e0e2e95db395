// kvl fit-residual: closed-form residual maps for the native-depth dial
// (training/residual_fit.h), added to a translator file.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "tools/commands.h"
#include "training/residual_fit.h"
#include "training/translator_data.h"
#include "translator/translator.h"

namespace kvl::tools {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvl fit-residual: %s\n", message.c_str());
  return 1;
}

// "1,2,5" -> {1, 2, 5}; false for anything else.
bool ParseList(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(piece, &v)) return false;
    out->push_back(v);
  }
  return true;
}

}  // namespace

int RunFitResidual(const Args& args) {
  training::ResidualFitOptions o;
  std::string translator_path, out_path, layers_text, source_layers_text, basis;
  std::string source_dir, target_dir;
  int n_threads = 0;
  int64_t native_layers = -1;
  bool quiet = false;
  FlagSet flags(
      "kvl fit-residual",
      "Fits residual maps for the native-depth dial (docs/translators.md, \"Native\n"
      "layers\"): for each target layer j of --layers, a ridge regression of the target's\n"
      "residual stream at the input of layer j on the source's keys and values of\n"
      "--source-layers (and, for a token-anchored translator, its anchor rows), over the\n"
      "corpus prefilled by both models. Writes --translator with the maps added (and the\n"
      "stamped default --native-layers) to --out. A switch with k native layers computes\n"
      "the target's top k layers from the map of layer L-k.");
  flags.Required("translator", &translator_path, "FILE",
                 "the translator from --source to --target");
  flags.Required("source", &source_dir, "DIR", "the source model");
  flags.Required("target", &target_dir, "DIR", "the target model");
  flags.Required("data", &o.data_path, "FILE.jsonl|FILE.txt", "the corpus");
  flags.Required("out", &out_path, "FILE", "the translator to write");
  flags.Add("layers", &layers_text, "J,J,...",
            "target layers whose input to predict (default: all of 1..L-1)");
  flags.Add("source-layers", &source_layers_text, "S,S,...",
            "source layers the maps read (default: all)");
  flags.Add("native-layers", &native_layers, "K",
            "the default k stamped into the file (default: the file's own, else 0)");
  flags.Add("basis", &basis, "TEXT", "what the default was chosen on (recorded in the file)");
  flags.Add("ridge", &o.ridge, "L", "ridge, relative to the mean input second moment, >= 0");
  flags.Add("max-sequences", &o.max_sequences, "N", "sequences read from the corpus, 0: all");
  flags.Add("seq-len", &o.seq_len, "T", "tokens per sequence, >= 2");
  flags.Add("threads", &n_threads, "N", "intra-op threads, 0: all cores");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (!ParseList(layers_text, &o.layers)) {
    return flags.UsageError("--layers must be a comma-separated list of integers");
  }
  if (!ParseList(source_layers_text, &o.source_layers)) {
    return flags.UsageError("--source-layers must be a comma-separated list of integers");
  }
  if (o.max_sequences < 0) return flags.UsageError("--max-sequences must be >= 0");
  if (o.seq_len < 2) return flags.UsageError("--seq-len must be >= 2");
  if (n_threads < 0) return flags.UsageError("--threads must be >= 0");
  if (o.ridge < 0) return flags.UsageError("--ridge must be >= 0");
  if (native_layers < -1) return flags.UsageError("--native-layers must be >= 0");
  o.progress = !quiet;

  RuntimeOptions runtime;
  runtime.n_threads = n_threads;
  runtime.prefill_chunk = o.seq_len;
  absl::StatusOr<training::TranslatorPair> pair =
      training::LoadTranslatorPair(source_dir, target_dir, runtime);
  if (!pair.ok()) return Fail(std::string(pair.status().message()));
  absl::StatusOr<std::unique_ptr<Translator>> translator =
      Translator::Load(translator_path, training::ExpectationFor(pair->source, pair->target));
  if (!translator.ok()) return Fail(std::string(translator.status().message()));
  absl::StatusOr<training::ResidualFit> fit = training::FitResidualMaps(o, *pair, **translator);
  if (!fit.ok()) return Fail(std::string(fit.status().message()));
  const TranslatorSpec& spec = (*translator)->spec();
  const int64_t k = native_layers >= 0 ? native_layers : spec.native_layers;
  if (basis.empty() && native_layers < 0) basis = spec.native_layers_basis;
  if (absl::Status s = (*translator)->SetResidualMaps(fit->maps, k, basis); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (absl::Status s = (*translator)->Save(out_path); !s.ok())
    return Fail(std::string(s.message()));
  std::printf("%-6s %-8s %s\n", "layer", "R2", "native layers it serves");
  for (size_t m = 0; m < fit->maps.size(); ++m) {
    std::printf("%-6lld %-8.4f k = %lld\n", static_cast<long long>(fit->maps[m].layer), fit->r2[m],
                static_cast<long long>(spec.target.n_layer - fit->maps[m].layer));
  }
  std::printf("wrote %s (%lld sequences, %lld tokens; default native layers %lld)\n",
              out_path.c_str(), static_cast<long long>(fit->n_sequences),
              static_cast<long long>(fit->n_tokens), static_cast<long long>(k));
  return 0;
}

}  // namespace kvl::tools
