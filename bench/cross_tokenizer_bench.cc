// cross_tokenizer_bench: what crossing tokenizers adds to a switch (issue 54).
// A plain driver (like translator_bench): one run prints one table and
// writes it to --out.
//
// Models: random init with the shapes of models/configs/kvl-small.json over
// the house tokenizer (the source) and kvl-small-t2.json over the second house
// tokenizer (models/tokenizer-t2, the target): the same shapes but for the
// vocabulary, so the translation costs the same both ways. Translator: random
// maps, every source layer per target layer, split inputs, no token anchors
// (a fit across tokenizers has none). Text: the conversations of --text (a
// kvl make-data .txt split), one segment per "<|im_start|>" message, each
// encoded by both tokenizers (router/streams.h), taken until the target's
// stream reaches the context.
//
// For a context of T target tokens, with the source's line holding its own
// tokens of the same text:
//   (b) re-prefill: the target prefills its T tokens into a fresh line;
//   (a) one tokenizer: what the same switch costs without crossing: the
//       source's taps of T-1 tokens, translated, accepted into a fresh target
//       line, and the target decodes token T-1;
//   (c) across: the target's T-1 tokens aligned with the source's stream
//       (AlignAcross), the source's taps of the aligned tokens resampled onto
//       the target's (ResampleTaps), translated, accepted; the target
//       prefills what did not align (up to the last group boundary) with
//       token T-1 and decodes.
// Taps, alignment, resampling, translation and Accept run on the calling
// thread alone (kvl::SerialIntraOpScope), as the router runs a switch; the
// prefill and decode use --threads. Each cell is the best of --repeat runs.
//
//   cross_tokenizer_bench [--threads 2] [--contexts 1024,4096] [--repeat 3]
//                         [--text build/house/data/test.txt] [--configs models/configs]
//                         [--out FILE]
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "base/flags.h"
#include "bench/bench_timing.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/omp_wait.h"
#include "model/tokenizer.h"
#include "router/streams.h"
#include "translator/resample.h"
#include "translator/translator.h"

namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "cross_tokenizer_bench: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}
template <typename T>
T Check(absl::StatusOr<T> v) {
  Check(v.status());
  return *std::move(v);
}

std::unique_ptr<kvl::Translator> RandomTranslator(const kvl::ModelConfig& s,
                                                  const kvl::ModelConfig& t, kvl::DType compute) {
  kvl::TranslatorSpec spec;
  spec.source = kvl::EndpointOf(s, "bench-source", "house");
  spec.target = kvl::EndpointOf(t, "bench-target", "t2");
  spec.assignment_kind = "relative_depth";
  spec.band = s.n_layer;
  spec.assignment = Check(kvl::RelativeDepthAssignment(s.n_layer, t.n_layer, s.n_layer));
  spec.training.method = "random";
  const int64_t in = s.n_layer * s.n_head_kv * s.head_dim, out = t.n_head_kv * t.head_dim;
  kvl::TranslatorMaps keys, values;
  for (kvl::TranslatorMaps* m : {&keys, &values}) {
    for (int64_t il = 0; il < t.n_layer; ++il) {
      m->weight.push_back(at::randn({out, in}) / std::sqrt(static_cast<double>(in)));
      m->bias.push_back(at::zeros({out}));
    }
  }
  return Check(kvl::Translator::Create(spec, keys, values, compute));
}

// One tokenizer's rendering of the segments.
struct Rendering {
  std::vector<int64_t> ids, bounds;
};

}  // namespace

int main(int argc, char** argv) {
  kvl::ReexecWithPassiveOpenMpWait(argv);
  int n_threads = 2, repeat = 3;
  std::string text_path = "build/house/data/test.txt", configs = "models/configs", out_path;
  std::vector<int64_t> contexts = {1024, 4096};
  kvl::FlagSet flags("cross_tokenizer_bench",
                     "Times a switch across tokenizers (house -> models/tokenizer-t2) against the\n"
                     "same switch within one tokenizer and a re-prefill (docs/translators.md).");
  flags.Add("threads", &n_threads, "N", "intra-op threads");
  flags.Add("repeat", &repeat, "K", "runs per cell, the best kept (>= 1)");
  flags.Add("text", &text_path, "FILE", "conversations (a kvl make-data .txt split)");
  flags.Add("configs", &configs, "DIR", "where kvl-small.json and kvl-small-t2.json are");
  flags.Add("out", &out_path, "FILE", "also write the report here");
  flags.Custom("contexts", "T,T,...", "history lengths in target tokens (default: 1024,4096)",
               [&](const std::string& v) -> absl::Status {
                 contexts.clear();
                 for (absl::string_view x : absl::StrSplit(v, ',')) {
                   int64_t t = 0;
                   if (!absl::SimpleAtoi(x, &t) || t < 2) {
                     return absl::InvalidArgumentError("expected integers >= 2");
                   }
                   contexts.push_back(t);
                 }
                 return absl::OkStatus();
               });
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  if (repeat < 1) return flags.UsageError("--repeat must be >= 1");
  const std::unique_ptr<kvl::Tokenizer> house =
      Check(kvl::Tokenizer::FromFile("models/tokenizer/tokenizer.json"));
  const std::unique_ptr<kvl::Tokenizer> t2 =
      Check(kvl::Tokenizer::FromFile("models/tokenizer-t2/tokenizer.json"));
  const std::string text = Check(kvl::ReadTextFile(text_path));
  const int64_t max_t = *std::max_element(contexts.begin(), contexts.end());

  // Segments: one per message, until both streams pass the longest context
  // ((a) taps as many source tokens as the target has).
  Rendering source, target;
  for (size_t at = 0; at < text.size() && static_cast<int64_t>(std::min(
                                              source.ids.size(), target.ids.size())) < max_t;) {
    size_t next = text.find("<|im_start|>", at + 1);
    if (next == std::string::npos) next = text.size();
    const std::string segment = text.substr(at, next - at);
    at = next;
    for (auto [tok, r] : {std::pair{house.get(), &source}, std::pair{t2.get(), &target}}) {
      r->bounds.push_back(static_cast<int64_t>(r->ids.size()));
      for (int32_t id : tok->Encode(segment)) r->ids.push_back(id);
    }
  }
  if (static_cast<int64_t>(std::min(source.ids.size(), target.ids.size())) < max_t) {
    Check(absl::InvalidArgumentError(absl::StrCat(text_path, " holds ", source.ids.size(), " and ",
                                                  target.ids.size(), " tokens, fewer than ",
                                                  max_t)));
  }

  kvl::Checkpoint small, small_t2;
  small.config = Check(kvl::ModelConfig::FromFile(configs + "/kvl-small.json"));
  small_t2.config = Check(kvl::ModelConfig::FromFile(configs + "/kvl-small-t2.json"));
  for (kvl::Checkpoint* c : {&small, &small_t2}) {
    c->config.max_position_embeddings = std::max<int64_t>(16384, 2 * max_t);
    c->weights = kvl::InitWeights(c->config, 1);
  }
  kvl::RuntimeOptions options;
  options.n_threads = n_threads;
  std::unique_ptr<kvl::Engine> se = Check(kvl::Engine::Create(small, options));
  std::unique_ptr<kvl::Engine> te = Check(kvl::Engine::Create(small_t2, options));
  small.weights = kvl::ModelWeights();
  small_t2.weights = kvl::ModelWeights();
  const kvl::DType compute = kvl::FastestTranslateDtype();
  const std::unique_ptr<kvl::Translator> tr = RandomTranslator(se->config(), te->config(), compute);
  c10::InferenceMode inference;

  kvl::bench::Report emit;
  const kvl::bench::MachineShare share;
  emit(absl::StrFormat(
      "cross_tokenizer_bench: kvl-small (house tokenizer, %d ids) -> kvl-small-t2 "
      "(models/tokenizer-t2, %d ids) shapes, random init, float32 models, %d intra-op threads "
      "(taps, alignment, resampling, translation and Accept on one), translating in %s, "
      "best of %d; text %s",
      house->vocab_size(), t2->vocab_size(), n_threads, kvl::DTypeName(compute), repeat,
      text_path));
  emit("");
  emit("| T (target tokens) | source tokens | (b) re-prefill ms | (a) one tokenizer ms | (c) across "
       "ms | align ms | taps + resample ms | translate + accept ms | prefilled after the cut | "
       "(b)/(a) | (b)/(c) |");
  emit("|---|---|---|---|---|---|---|---|---|---|---|");
  for (int64_t t : contexts) {
    const kvl::router::StreamView sv{house.get(), &source.ids, &source.bounds};
    const kvl::router::StreamView tv{t2.get(), &target.ids, &target.bounds};
    const std::vector<int64_t> target_ids(target.ids.begin(), target.ids.begin() + t);
    // The source's line: its own tokens of the text (c) translates, and at
    // least the T-1 tokens (a) taps.
    const int64_t n_all = static_cast<int64_t>(source.ids.size());
    const int64_t n_source = std::min(
        n_all, std::max(t - 1, Check(kvl::router::AlignAcross(sv, tv, 0, t - 1, n_all)).source_end));
    std::unique_ptr<kvl::KvCache> source_line = se->NewCache();
    Check(se->Prefill(*source_line,
                      std::vector<int64_t>(source.ids.begin(), source.ids.begin() + n_source))
              .status());

    const double reprefill = kvl::bench::Best(repeat, [&] {
      std::unique_ptr<kvl::KvCache> line = te->NewCache();
      Check(line->Reserve(t + 1));
      Check(te->Prefill(*line, target_ids).status());
    });
    const double one = kvl::bench::Best(repeat, [&] {
      std::unique_ptr<kvl::KvCache> line = te->NewCache();
      Check(line->Reserve(t + 1));
      {
        kvl::SerialIntraOpScope serial;
        kvl::KvTaps taps = Check(source_line->Taps(0, t - 1));
        kvl::KvTaps moved = Check(tr->Translate(taps, kvl::Translator::Output::kProduct));
        Check(line->Accept(moved.keys, moved.values));
      }
      Check(te->Prefill(*line, {target_ids.back()}).status());
    });
    double align_s = 1e9, resample_s = 1e9, translate_s = 1e9;
    int64_t cut_tokens = 0;
    const double across = kvl::bench::Best(repeat, [&] {
      std::unique_ptr<kvl::KvCache> line = te->NewCache();
      Check(line->Reserve(t + 1));
      kvl::router::AlignedSpan span;
      {
        kvl::SerialIntraOpScope serial;
        align_s = std::min(align_s, kvl::bench::Seconds([&] {
          span = Check(kvl::router::AlignAcross(sv, tv, 0, t - 1, n_source));
        }));
        kvl::KvTaps resampled;
        resample_s = std::min(resample_s, kvl::bench::Seconds([&] {
          kvl::KvTaps taps = Check(source_line->Taps(span.source_begin, span.source_end));
          resampled = Check(kvl::ResampleTaps(taps, span.runs));
        }));
        translate_s = std::min(translate_s, kvl::bench::Seconds([&] {
          kvl::KvTaps moved = Check(tr->Translate(resampled, kvl::Translator::Output::kProduct));
          Check(line->Accept(moved.keys, moved.values));
        }));
      }
      cut_tokens = t - span.target_end;
      Check(te->Prefill(*line, std::vector<int64_t>(target_ids.begin() + span.target_end,
                                                    target_ids.end()))
                .status());
    });
    emit(absl::StrFormat("| %d | %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %d | %.1fx | %.1fx |",
                         t, n_source, 1e3 * reprefill, 1e3 * one, 1e3 * across, 1e3 * align_s,
                         1e3 * resample_s, 1e3 * translate_s, cut_tokens, reprefill / one,
                         reprefill / across));
  }
  emit("");
  emit("prefilled after the cut: target tokens the switch across prefills with the last one (the "
       "group that T-1 ends inside, and token T-1)");
  emit(share.Line());
  if (!out_path.empty() && !emit.WriteTo(out_path)) return 1;
  return 0;
}
