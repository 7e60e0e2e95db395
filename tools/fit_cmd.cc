// kvl fit: stage-1 closed-form translator fit (training/translator_fit.h,
// translator/README.md) from a corpus, with a per-layer R² report.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/model_dir.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "datagen/chat_data.h"
#include "tools/commands.h"
#include "training/translator_data.h"
#include "training/progress.h"
#include "training/attention.h"
#include "training/translator_fit.h"
#include "translator/translator.h"

namespace kvl::tools {

using training::AccumulateSequence;
using training::AttentionMass;
using training::FitResult;
using training::FormatCount;
using training::MomentAccumulator;
using training::ParseChatLine;
using training::PrefixAttentionMass;
using training::ProgressBar;
using training::ProgressOptions;
using training::SingleLayerR2Table;
namespace {


int Fail(const std::string& message) {
  std::fprintf(stderr, "kvl fit: %s\n", message.c_str());
  return 1;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ReadSequences(const std::string& path,
                                                                const Tokenizer& tokenizer,
                                                                int64_t seq_len,
                                                                int64_t max_sequences) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<std::vector<int64_t>> out;
  auto full = [&] { return max_sequences > 0 && static_cast<int64_t>(out.size()) >= max_sequences; };
  if (path.size() >= 6 && path.substr(path.size() - 6) == ".jsonl") {
    std::string line;
    int64_t line_no = 0;
    while (!full() && std::getline(in, line)) {
      ++line_no;
      if (line.empty()) continue;
      absl::StatusOr<std::vector<ChatMessage>> messages = ParseChatLine(line, path, line_no);
      if (!messages.ok()) return messages.status();
      const std::vector<int32_t> ids = tokenizer.Encode(datagen::RenderChatMl(*messages));
      if (ids.size() < 2) continue;
      const size_t n = std::min<size_t>(ids.size(), seq_len);
      out.emplace_back(ids.begin(), ids.begin() + n);
    }
  } else {
    std::stringstream ss;
    ss << in.rdbuf();
    const std::vector<int32_t> ids = tokenizer.Encode(ss.str());
    for (size_t t = 0; !full() && t + seq_len <= ids.size(); t += seq_len) {
      out.emplace_back(ids.begin() + t, ids.begin() + t + seq_len);
    }
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no sequences"));
  return out;
}

// Moments are accumulated in float64 from float32 caches.
absl::StatusOr<ModelDir> Load(const std::string& dir, int n_threads, int64_t seq_len) {
  RuntimeOptions o;
  o.dtype = DType::kFloat32;
  o.n_threads = n_threads;
  o.prefill_chunk = std::max<int64_t>(seq_len, 1);
  return LoadModelDir(dir, o);
}

// The prefix of ids (all but its last C tokens; half when shorter than 2C),
// each token weighted by the attention the target's continuation queries give
// it, normalised to mean 1.
absl::Status AccumulateAttentionWeighted(Engine& source, Engine& target,
                                         const ModelConfig& target_config,
                                         const ModelWeights& target_weights,
                                         const std::vector<int64_t>& ids, int64_t n_queries,
                                         MomentAccumulator& moments) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t n_prefix = n > 2 * n_queries ? n - n_queries : std::max<int64_t>(n / 2, 1);
  const AttentionMass mass = PrefixAttentionMass(target_config, target_weights, ids, n_prefix);
  std::unique_ptr<KvCache> source_cache = source.NewCache();
  std::unique_ptr<KvCache> target_cache = target.NewCache();
  const std::vector<int64_t> prefix(ids.begin(), ids.begin() + n_prefix);
  if (absl::StatusOr<at::Tensor> r = source.Prefill(*source_cache, prefix); !r.ok()) {
    return r.status();
  }
  if (absl::StatusOr<at::Tensor> r = target.Prefill(*target_cache, prefix); !r.ok()) {
    return r.status();
  }
  absl::StatusOr<KvTaps> s = source_cache->Taps(0, n_prefix);
  if (!s.ok()) return s.status();
  absl::StatusOr<KvTaps> t = target_cache->Taps(0, n_prefix);
  if (!t.ok()) return t.status();
  const double mean = mass.received.mean().item<double>();
  if (!(mean > 0)) return absl::InternalError("attention mass is zero");
  return moments.Add(*s, *t, mass.received / mean);
}

nlohmann::json TableJson(const at::Tensor& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < t.size(0); ++i) {
    std::vector<double> row(t.size(1));
    for (int64_t j = 0; j < t.size(1); ++j) row[j] = t[i][j].item<double>();
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

int RunFit(const Args& args) {
  std::string source_dir, target_dir, data_path, out_path;
  // Empty: chosen once the depths are known (see --help).
  std::string kind;
  std::string band_text = "1", inputs_name = MapInputsName(MapInputs::kSplit);
  std::string weighting = "uniform";
  int64_t max_sequences = 512, seq_len = 256, attention_queries = 64;
  int n_threads = 0;
  double ridge = 1e-4;
  bool quiet = false, no_bias = false;
  FlagSet flags(
      "kvl fit",
      "Prefills every sequence of the corpus with both models (which must share a\n"
      "tokenizer), accumulates float64 second moments of their pre-norm keys and\n"
      "values, and solves each target layer's maps in closed form (ridge relative to\n"
      "the mean input second moment). .jsonl: one chat per line ({\"messages\": [...]}),\n"
      "rendered as ChatML and cut to --seq-len tokens; .txt: consecutive windows of\n"
      "--seq-len tokens. Writes the translator to --out and the per-layer R² (and the\n"
      "single-layer R² tables) to the same path with extension .r2.json.\n"
      "--assignment defaults to same_index when the depths match (and --band is not\n"
      "all), else relative_depth. --band all: every target layer reads every source\n"
      "layer (the band is the source's depth).\n"
      "--inputs joint: both maps of a target layer read the keys and the values of its\n"
      "assigned source layers (split: key maps read keys, value maps values; the\n"
      "assignment is chosen by split R² either way).\n"
      "--weighting attention: each sequence's last C tokens (--attention-queries; half\n"
      "the sequence when it is shorter than 2C) act as continuation queries; only the\n"
      "tokens before them are fitted, each weighted by the attention the target's\n"
      "continuation queries give it (summed over queries, averaged over layers and\n"
      "heads, normalised to mean 1 per sequence; KV-Lingo appendix O).");
  flags.Required("source", &source_dir, "DIR", "the source model");
  flags.Required("target", &target_dir, "DIR", "the target model");
  flags.Required("data", &data_path, "FILE.jsonl|FILE.txt", "the corpus");
  flags.Required("out", &out_path, "FILE", "the translator to write");
  flags.Choice("assignment", &kind, {"same_index", "relative_depth", "top_r2", "greedy"},
               "which source layers each target layer reads");
  flags.Add("band", &band_text, "N|all", "source layers per target layer");
  flags.Choice("inputs", &inputs_name, {"split", "joint"}, "what each map reads");
  flags.Add("ridge", &ridge, "L", "ridge, relative to the mean input second moment, >= 0");
  flags.Choice("weighting", &weighting, {"uniform", "attention"}, "weight of each fitted token");
  flags.Add("attention-queries", &attention_queries, "C",
            "continuation queries per sequence (--weighting attention), >= 1");
  flags.Switch("no-bias", &no_bias, "maps without a bias term");
  flags.Add("max-sequences", &max_sequences, "N", "sequences read from the corpus, 0: all");
  flags.Add("seq-len", &seq_len, "T", "tokens per sequence, >= 2");
  flags.Add("threads", &n_threads, "N", "intra-op threads, 0: all cores");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  const bool band_all = band_text == "all";  // the band is set once the source is loaded
  int64_t band = 1;
  if (!band_all && (!absl::SimpleAtoi(band_text, &band) || band < 1)) {
    return flags.UsageError("--band must be an integer >= 1 or all, got '" + band_text + "'");
  }
  if (max_sequences < 0) return flags.UsageError("--max-sequences must be a non-negative integer");
  if (seq_len < 2) return flags.UsageError("--seq-len must be >= 2");
  if (n_threads < 0) return flags.UsageError("--threads must be a non-negative integer");
  if (ridge < 0) return flags.UsageError("--ridge must be a non-negative number");
  if (attention_queries < 1) return flags.UsageError("--attention-queries must be >= 1");
  const MapInputs inputs = *ParseMapInputs(inputs_name);  // a name the Choice admits
  const bool bias = !no_bias;

  absl::StatusOr<ModelDir> source = Load(source_dir, n_threads, seq_len);
  if (!source.ok()) return Fail(std::string(source.status().message()));
  absl::StatusOr<ModelDir> target = Load(target_dir, n_threads, seq_len);
  if (!target.ok()) return Fail(std::string(target.status().message()));
  if (source->tokenizer->content_hash() != target->tokenizer->content_hash()) {
    return Fail("source and target tokenizers differ; cross-tokenizer fitting is not supported");
  }
  const ModelConfig& sc = source->checkpoint.config;
  const ModelConfig& tc = target->checkpoint.config;
  if (band_all) band = sc.n_layer;
  if (kind.empty()) kind = sc.n_layer == tc.n_layer && !band_all ? "same_index" : "relative_depth";

  absl::StatusOr<std::vector<std::vector<int64_t>>> sequences =
      ReadSequences(data_path, *source->tokenizer, seq_len, max_sequences);
  if (!sequences.ok()) return Fail(std::string(sequences.status().message()));

  TranslatorSpec spec;
  spec.source = EndpointOf(sc, source->identity, source->tokenizer->content_hash());
  spec.target = EndpointOf(tc, target->identity, target->tokenizer->content_hash());
  spec.assignment_kind = kind;
  spec.band = band;
  spec.bias = bias;
  spec.inputs = inputs;
  spec.training.method = "closed_form";
  spec.training.weighting = weighting;
  spec.training.corpus = data_path;

  absl::StatusOr<std::unique_ptr<MomentAccumulator>> moments =
      MomentAccumulator::Create(spec.source, spec.target);
  if (!moments.ok()) return Fail(std::string(moments.status().message()));
  {
    ProgressOptions po;
    po.label = "fit";
    po.total = static_cast<int64_t>(sequences->size());
    po.unit = "seq";
    std::unique_ptr<ProgressBar> bar = quiet ? nullptr : std::make_unique<ProgressBar>(po);
    const ModelWeights target_weights32 = target->checkpoint.weights.To(at::kFloat, "cpu");
    for (size_t i = 0; i < sequences->size(); ++i) {
      const std::vector<int64_t>& ids = (*sequences)[i];
      absl::Status s =
          weighting == "uniform"
              ? AccumulateSequence(*source->engine, *target->engine, ids, **moments)
              : AccumulateAttentionWeighted(*source->engine, *target->engine, tc,
                                            target_weights32, ids, attention_queries, **moments);
      if (!s.ok()) return Fail(absl::StrCat("sequence ", i, ": ", s.message()));
      if (bar) {
        bar->Update(static_cast<int64_t>(i) + 1,
                    absl::StrCat(FormatCount(static_cast<double>((*moments)->n_tokens())), " tok"));
      }
    }
    if (bar) bar->Finish();
  }

  absl::StatusOr<SingleLayerR2Table> single = (*moments)->SingleLayerR2(bias, ridge);
  if (!single.ok()) return Fail(std::string(single.status().message()));
  absl::StatusOr<LayerAssignment> assignment =
      kind == "same_index" ? (band == 1 ? SameIndexAssignment(sc.n_layer, tc.n_layer)
                                        : absl::InvalidArgumentError("same_index takes no band"))
      : kind == "relative_depth" ? RelativeDepthAssignment(sc.n_layer, tc.n_layer, band)
      : kind == "top_r2"         ? TopR2Assignment(single->keys, single->values, band)
                                 : (*moments)->GreedyAssignment(band, bias, ridge);
  if (!assignment.ok()) return Fail(std::string(assignment.status().message()));
  spec.assignment = *assignment;

  absl::StatusOr<FitResult> fit = (*moments)->Fit(spec, ridge);
  if (!fit.ok()) return Fail(std::string(fit.status().message()));
  if (absl::Status s = fit->translator->Save(out_path); !s.ok()) {
    return Fail(std::string(s.message()));
  }

  std::printf("%-6s %-14s %-8s %-14s %-8s\n", "layer", "keys from", "R2 keys", "values from",
              "R2 values");
  auto list = [](const std::vector<int64_t>& l) {
    std::string s;
    for (int64_t x : l) absl::StrAppend(&s, s.empty() ? "" : ",", x);
    return s;
  };
  double mean_k = 0, mean_v = 0;
  for (int64_t il = 0; il < tc.n_layer; ++il) {
    std::printf("%-6lld %-14s %-8.4f %-14s %-8.4f\n", static_cast<long long>(il),
                list(spec.assignment.keys[il]).c_str(), fit->r2_keys[il],
                list(spec.assignment.values[il]).c_str(), fit->r2_values[il]);
    mean_k += fit->r2_keys[il] / tc.n_layer;
    mean_v += fit->r2_values[il] / tc.n_layer;
  }
  std::printf("mean   %-14s %-8.4f %-14s %-8.4f\n", "", mean_k, "", mean_v);

  nlohmann::json report = {
      {"translator", out_path},
      {"source", source_dir},
      {"target", target_dir},
      {"data", data_path},
      {"assignment", kind},
      {"band", band},
      {"ridge", ridge},
      {"bias", bias},
      {"inputs", MapInputsName(inputs)},
      {"weighting", weighting},
      {"n_sequences", (*moments)->n_spans()},
      {"n_tokens", (*moments)->n_tokens()},
      {"r2_keys", fit->r2_keys},
      {"r2_values", fit->r2_values},
      {"mean_r2_keys", mean_k},
      {"mean_r2_values", mean_v},
      {"assignment_keys", spec.assignment.keys},
      {"assignment_values", spec.assignment.values},
      {"single_layer_r2_keys", TableJson(single->keys)},
      {"single_layer_r2_values", TableJson(single->values)},
  };
  const std::string json_path =
      std::filesystem::path(out_path).replace_extension(".r2.json").string();
  std::ofstream out(json_path, std::ios::trunc);
  out << report.dump(2) << "\n";
  if (!out) return Fail("cannot write " + json_path);
  std::printf("wrote %s and %s\n", out_path.c_str(), json_path.c_str());
  return 0;
}

}  // namespace kvl::tools
