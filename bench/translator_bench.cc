// translator_bench: time to first token after a model switch, translated
// versus re-prefilled, for small->large and large->small at several context
// lengths, and the translation's FLOP rate next to the machine's square-GEMM
// rate measured in the same run. A plain driver (like model_bench): one run
// prints one table and writes it to --out.
//
// Models: random init with the shapes of models/configs/kvl-small.json and
// kvl-large.json (max_position_embeddings raised to 16384, or the longest context);
// translator: random maps, relative-depth assignment with --band source layers
// per map (default all, as the committed cross-layer translators), with bias.
// Timing depends on shapes only, not on trained weights.
//
// For a context of T tokens:
//   (a) translate: taps of the source's [0, T-1) -> Translate -> Accept into a
//       fresh target line, sized once for T tokens as the router sizes a line
//       for its whole turn -> target decodes token T-1 (next-token logits);
//   (b) re-prefill: the target prefills [0, T) into a fresh line;
//   (c) span: the target line already holds [0, T) natively; the source wrote
//       [T, T+256): translate [T, T+255) and decode token T+255;
//   (d) span prefill: the target prefills [T, T+256) onto its line of T.
// Each is the best of a few runs (the 2-core machine is shared). Taps,
// translation and Accept run on the calling thread alone
// (kvl::SerialIntraOpScope), the products handed over as views
// (Translator::Output::kProduct), as the router runs a switch; the target's
// prefill and decode use --threads.
//
//   (e) hybrid: as (a) for [0, T-W), then the target prefills [T-W, T)
//       itself on top of the translation, W = --native-tail (default 32, the
//       server's routing.native_tail_tokens; kvl eval-translator --native-tail
//       measures what that buys in quality).
// A second table per direction times (a) part by part (the source's taps, the
// translation, the target's Accept and its decode step, each alone) and gives
// (e). A third times the translation by what runs before it, min and median
// of the same number of runs each: back to back (what the translate columns
// time), inside (a)'s sequence, after writing 256 MiB elsewhere (its data
// evicted from the caches) and after a 5 ms sleep (the thread pool asleep).
// A fourth times each phase of (a) inside the same runs of (a) as a whole:
// the fresh line, taps, translation, Accept and the release of what the
// translation held, decode, the line's release; where the parts timed alone
// add up to less than (a), it shows which phase takes the difference.
//
//   translator_bench [--threads 2] [--configs models/configs] [--out FILE]
//                    [--contexts 64,256,1024,4096,8192] [--repeat K] [--band N|all]
//                    [--translate-dtype auto|float32|bfloat16] [--inputs I | I,I]
//                    [--native-tail W] [--anchor-window W] [--anchor-rank R]
//                    [--switch-only] [--direction both|small-large|large-small]
//                    [--device cpu|cuda[:N]] [--model-dtype float32|bfloat16]
//                    [--whole-spans]
// --switch-only: the first table alone, without (a)'s parts, the hybrid and the
// translation-by-what-runs-before tables (what real shapes at 4k-8k tokens
// have time for on this machine).
// --repeat multiplies the number of runs each time is the best of (a busy
// machine needs more to find a quiet moment). --translate-dtype: the
// translator's arithmetic (default auto: what the server's "auto" picks on this
// CPU, kvl::FastestTranslateDtype); the models run in float32 either way.
// --inputs: split or joint maps (joint: each reads the source's keys and values,
// twice the inputs; translator/README.md), one for both directions or one for
// small->large and one for large->small; the default, split,joint, is what the
// committed house translators have. --anchor-window: the maps' token anchors
// (translator/README.md; default 8, as the committed translators; 0: none);
// the ids they read are passed as the router passes them. --anchor-rank: the
// anchor table's width (default: the target's hidden size); a real
// vocabulary's anchors need a low rank (translator.h), and then they are a
// product per token rather than a lookup. --device cuda[:N] (with
// --switch-only) puts the models, their caches and the translator on a GPU,
// each time taken to the end of the device's work, the GEMM rate the
// device's; "auto" then translates in bfloat16, as the server does there.
// --model-dtype: the models' weights and caches (default float32).
// --whole-spans: a target with sliding layers gets every entry of a span
// translated and stored, as before thin spans (ModelConfig::UnreadTokens);
// by default only what its sliding layers will read, as the router does.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "bench/bench_timing.h"
#include "model/engine.h"
#include "model/omp_wait.h"
#include "translator/translator.h"

namespace {

constexpr int64_t kSpan = 256;
// The router's Translate: the products as views, read by Accept as they are.
constexpr int64_t kElsewhereBytes = int64_t{256} << 20;

// (a)'s phases inside one run (seconds): the target's fresh line (NewCache and
// Reserve), the source's taps, the translation, Accept with the release of
// the taps and products, the decode step, the line's release, and the whole.
struct Phases {
  double line = 0, taps = 0, translate = 0, accept = 0, decode = 0, release = 0, whole = 0;
};
constexpr kvl::Translator::Output kProduct = kvl::Translator::Output::kProduct;


void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "translator_bench: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}
template <typename T>
T Check(absl::StatusOr<T> v) {
  Check(v.status());
  return *std::move(v);
}

// band 0: every source layer.
std::unique_ptr<kvl::Translator> RandomTranslator(const kvl::ModelConfig& s,
                                                  const kvl::ModelConfig& t, int64_t band,
                                                  kvl::MapInputs inputs, kvl::DType compute,
                                                  int64_t anchor_window, int64_t anchor_rank) {
  if (band == 0) band = s.n_layer;
  kvl::TranslatorSpec spec;
  spec.source = kvl::EndpointOf(s, "bench-source", "bench");
  spec.target = kvl::EndpointOf(t, "bench-target", "bench");
  spec.assignment_kind = "relative_depth";
  spec.band = band;
  spec.assignment = Check(kvl::RelativeDepthAssignment(s.n_layer, t.n_layer, band));
  spec.inputs = inputs;
  spec.training.method = "random";
  spec.anchor_window = anchor_window;
  const int64_t blocks = inputs == kvl::MapInputs::kJoint ? 2 * band : band;
  const int64_t in = blocks * s.n_head_kv * s.head_dim, out = t.n_head_kv * t.head_dim;
  kvl::TranslatorMaps keys, values;
  for (kvl::TranslatorMaps* m : {&keys, &values}) {
    for (int64_t il = 0; il < t.n_layer; ++il) {
      m->weight.push_back(at::randn({out, in}) / std::sqrt(static_cast<double>(in)));
      m->bias.push_back(at::zeros({out}));
      if (anchor_window > 0) {
        const int64_t a = anchor_window * (anchor_rank > 0 ? anchor_rank : t.hidden_size);
        m->anchor.push_back(at::randn({out, a}) / std::sqrt(static_cast<double>(a)));
      }
    }
  }
  const at::Tensor table =
      anchor_window > 0
          ? at::randn({t.vocab_size, anchor_rank > 0 ? anchor_rank : t.hidden_size})
          : at::Tensor();
  return Check(kvl::Translator::Create(spec, keys, values, compute, table));
}

// FLOPs of translating T tokens: keys and values, 2 * in * out per map and
// token it computes (a target layer's unread tokens are not: `unread`, as
// Translate's), and 2 * W*E * out for its anchors when they are a product (a
// real vocabulary's); anchors that are a lookup (W rows summed per token)
// are not counted.
double TranslateFlops(const kvl::Translator& tr, int64_t t, const std::vector<int64_t>& unread) {
  double flops = 0;
  for (const kvl::TranslatorMaps* m : {&tr.key_maps(), &tr.value_maps()}) {
    for (size_t il = 0; il < m->weight.size(); ++il) {
      const double rows = static_cast<double>(t - (unread.empty() ? 0 : unread[il]));
      flops += rows * 2.0 * m->weight[il].size(0) * m->weight[il].size(1);
      if (!tr.anchor_lookup() && !m->anchor.empty()) {
        flops += rows * 2.0 * m->anchor[il].size(0) * m->anchor[il].size(1);
      }
    }
  }
  return flops;
}

}  // namespace

int main(int argc, char** argv) {
  kvl::ReexecWithPassiveOpenMpWait(argv);
  int n_threads = 2, repeat = 1;
  bool switch_only = false;
  bool whole_spans = false;
  std::string direction = "both";
  int64_t band = 0;  // all
  // small->large, large->small
  kvl::MapInputs inputs[2] = {kvl::MapInputs::kSplit, kvl::MapInputs::kJoint};
  kvl::DType compute = kvl::FastestTranslateDtype();
  bool compute_auto = true;
  std::string device_name = "cpu";
  kvl::DType model_dtype = kvl::DType::kFloat32;
  std::string out_path, save_dir, configs = "models/configs";
  std::vector<int64_t> contexts = {64, 256, 1024, 4096, 8192};
  std::vector<int64_t> native_layers;
  int64_t tail = 32;  // (e): the target's own share of the prefix
  int64_t anchor_window = 8;  // as the committed translators
  int64_t anchor_rank = 0;    // the table's width: the target's hidden size
  kvl::FlagSet flags("translator_bench",
                     "Times a switch (taps, translation, accept, first decode) against re-prefilling\n"
                     "the history, for the house shapes (docs/translators.md).");
  flags.Add("threads", &n_threads, "N", "intra-op threads");
  flags.Add("configs", &configs, "DIR", "where kvl-small.json and kvl-large.json are");
  flags.Add("out", &out_path, "FILE", "also write the report here");
  flags.Add("save", &save_dir, "DIR",
            "also save each direction's translator here, load it back and time both");
  flags.Custom("contexts", "T,T,...", "history lengths (default: 64,256,1024,4096,8192)",
               [&](const std::string& v) -> absl::Status {
                 contexts.clear();
                 for (absl::string_view x : absl::StrSplit(v, ',')) {
                   int64_t t = 0;
                   if (!absl::SimpleAtoi(x, &t) || t < 1) {
                     return absl::InvalidArgumentError("expected positive integers");
                   }
                   contexts.push_back(t);
                 }
                 return absl::OkStatus();
               });
  flags.Custom("native-layers", "K,K,...",
               "also time the native-depth dial's switch with each k (random residual maps)",
               [&](const std::string& v) -> absl::Status {
                 native_layers.clear();
                 for (absl::string_view x : absl::StrSplit(v, ',')) {
                   int64_t k = 0;
                   if (!absl::SimpleAtoi(x, &k) || k < 0) {
                     return absl::InvalidArgumentError("expected non-negative integers");
                   }
                   native_layers.push_back(k);
                 }
                 return absl::OkStatus();
               });
  flags.Choice("direction", &direction, {"both", "small-large", "large-small"},
               "the switch directions timed");
  flags.Switch("switch-only", &switch_only, "only the first table (real shapes, long contexts)");
  flags.Switch("whole-spans", &whole_spans,
               "translate every entry of a span, also those no sliding layer reads");
  flags.Add("repeat", &repeat, "K", "runs per cell, the best kept (>= 1)");
  flags.Custom("band", "N|all", "source layers per target layer (default: all)",
               [&](const std::string& v) -> absl::Status {
                 if (v == "all") {
                   band = 0;
                 } else if (!absl::SimpleAtoi(v, &band) || band < 1) {
                   return absl::InvalidArgumentError("expected an integer >= 1 or all");
                 }
                 return absl::OkStatus();
               });
  flags.Custom("inputs", "I|I,I", "map inputs, split or joint, for small->large[,large->small]",
               [&](const std::string& v) -> absl::Status {
                 std::vector<std::string> names = absl::StrSplit(v, ',');
                 if (names.size() == 1) names.push_back(names[0]);
                 if (names.size() != 2) return absl::InvalidArgumentError("split|joint[,split|joint]");
                 for (size_t d = 0; d < 2; ++d) {
                   absl::StatusOr<kvl::MapInputs> parsed = kvl::ParseMapInputs(names[d]);
                   if (!parsed.ok()) return parsed.status();
                   inputs[d] = *parsed;
                 }
                 return absl::OkStatus();
               });
  flags.Custom("translate-dtype", "auto|float32|bfloat16",
               "the translation's arithmetic (default: auto, the CPU's fastest)",
               [&](const std::string& v) -> absl::Status {
                 if (v == "auto") return absl::OkStatus();
                 absl::StatusOr<kvl::DType> d = kvl::ParseDType(v);
                 if (!d.ok() || *d == kvl::DType::kFloat16) {
                   return absl::InvalidArgumentError("expected auto, float32 or bfloat16");
                 }
                 compute = *d;
                 compute_auto = false;
                 return absl::OkStatus();
               });
  flags.Add("device", &device_name, "D",
            "cpu (default) or cuda[:N]: the models', caches' and translators' device (with "
            "--switch-only)");
  flags.Custom("model-dtype", "float32|bfloat16", "the models' weights and caches (default float32)",
               [&](const std::string& v) -> absl::Status {
                 absl::StatusOr<kvl::DType> d = kvl::ParseDType(v);
                 if (!d.ok() || *d == kvl::DType::kFloat16) {
                   return absl::InvalidArgumentError("expected float32 or bfloat16");
                 }
                 model_dtype = *d;
                 return absl::OkStatus();
               });
  flags.Add("native-tail", &tail, "W", "(e): the target's own last W tokens of the prefix");
  flags.Add("anchor-window", &anchor_window, "W",
            "token anchors of the random maps, tokens t..t-W+1 (0: none; the committed "
            "translators' 8)");
  flags.Add("anchor-rank", &anchor_rank, "R",
            "the anchor table's width (a low-rank table, translator.h; 0: the target's hidden "
            "size, as the committed translators)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  if (repeat < 1) return flags.UsageError("--repeat must be >= 1");
  const at::Device device(device_name);
  if (!device.is_cpu() && !switch_only) {
    return flags.UsageError("--device other than cpu times the first table only: add --switch-only");
  }
  if (!device.is_cpu() && !save_dir.empty()) return flags.UsageError("--save runs on the cpu only");
  // On a GPU, "auto" is what the server picks there (router/loader.cc).
  if (!device.is_cpu() && compute_auto) compute = kvl::DType::kBFloat16;
  // Each time is taken to the end of the device's work (bench_timing.h).
  auto best = [&device](int n, const std::function<void()>& f) {
    return kvl::bench::Best(n, f, device);
  };
  auto seconds = [&device](const std::function<void()>& f) {
    return kvl::bench::Seconds(f, device);
  };
  if (tail < 1) return flags.UsageError("--native-tail must be at least 1");
  if (anchor_window < 0) return flags.UsageError("--anchor-window must be >= 0");
  if (anchor_rank < 0) return flags.UsageError("--anchor-rank must be >= 0");
  for (int64_t t : contexts) {
    if (t <= tail) {
      return flags.UsageError(
          absl::StrCat("every context must exceed --native-tail (", tail, ")"));
    }
  }
  kvl::bench::Report emit;
  const kvl::bench::MachineShare share;
  char buf[512];

  kvl::Checkpoint small, large;
  small.config = Check(kvl::ModelConfig::FromFile(configs + "/kvl-small.json"));
  large.config = Check(kvl::ModelConfig::FromFile(configs + "/kvl-large.json"));
  for (kvl::Checkpoint* c : {&small, &large}) {
    // Room for the longest context and the span after it.
    c->config.max_position_embeddings =
        std::max<int64_t>(16384, *std::max_element(contexts.begin(), contexts.end()) + kSpan);
    c->weights = kvl::InitWeights(c->config, 1);
  }
  kvl::RuntimeOptions options;
  options.n_threads = n_threads;
  options.device = device_name;
  options.dtype = model_dtype;
  std::unique_ptr<kvl::Engine> small_engine = Check(kvl::Engine::Create(small, options));
  std::unique_ptr<kvl::Engine> large_engine = Check(kvl::Engine::Create(large, options));
  // The engines hold what they run with (the fused projections); the weights
  // as initialised would only take memory (5 GB at Qwen3-1.7B's shapes).
  small.weights = kvl::ModelWeights();
  large.weights = kvl::ModelWeights();
  c10::InferenceMode inference;
  std::snprintf(buf, sizeof buf,
                "translator_bench: kvl-small (L=%lld H=%lld D=%lld) and kvl-large (L=%lld H=%lld "
                "D=%lld) shapes, random init, %s models on %s, %d intra-op threads (taps, translation "
                "and Accept on one, as the router runs them), prefill chunk "
                "%lld, translator band %s, %s inputs small->large and %s large->small, "
                "token anchors W=%lld rank %s, computing in %s",
                (long long)small.config.n_layer, (long long)small.config.n_head_kv,
                (long long)small.config.head_dim, (long long)large.config.n_layer,
                (long long)large.config.n_head_kv, (long long)large.config.head_dim, kvl::DTypeName(model_dtype), device_name.c_str(), n_threads,
                (long long)options.prefill_chunk, band == 0 ? "all" : std::to_string(band).c_str(),
                kvl::MapInputsName(inputs[0]), kvl::MapInputsName(inputs[1]),
                (long long)anchor_window,
                anchor_rank > 0 ? std::to_string(anchor_rank).c_str() : "full",
                kvl::DTypeName(compute));
  emit(buf);

  // The rate the translation's own arithmetic could reach.
  const kvl::bench::GemmRate gemm(compute == kvl::DType::kBFloat16 ? at::kBFloat16 : at::kFloat,
                                  device);
  // On one thread, as the translation runs (bfloat16 through oneDNN's
  // OpenMP; float32 products keep OpenBLAS's own threads either way).
  auto gemm_rate = [&] {
    kvl::SerialIntraOpScope serial;
    return gemm.Measure();
  };

  const int64_t max_t = *std::max_element(contexts.begin(), contexts.end());
  std::vector<int64_t> ids(static_cast<size_t>(max_t + kSpan));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7919 + 13) % small.config.vocab_size);
  }
  auto slice = [&](int64_t a, int64_t b) {
    return std::vector<int64_t>(ids.begin() + a, ids.begin() + b);
  };
  // What Translate reads of the ids for the span [a, b): with anchors, the
  // span's and up to W-1 before it, as the router passes them.
  auto span_ids = [&](int64_t a, int64_t b) {
    return anchor_window > 0 ? slice(std::max<int64_t>(0, a - (anchor_window - 1)), b)
                             : std::vector<int64_t>();
  };

  struct Direction {
    const char* name;
    kvl::Engine* source;
    kvl::Engine* target;
    kvl::MapInputs inputs;
  };
  for (const Direction& dir :
       {Direction{"small->large", small_engine.get(), large_engine.get(), inputs[0]},
        Direction{"large->small", large_engine.get(), small_engine.get(), inputs[1]}}) {
    if (direction != "both" && direction != (dir.name[0] == 's' ? "small-large" : "large-small")) {
      continue;
    }
    const std::unique_ptr<kvl::Translator> tr =
        RandomTranslator(dir.source->config(), dir.target->config(), band, dir.inputs, compute,
                         anchor_window, anchor_rank);
    // Random residual maps for the dial's k (timing depends on shapes only):
    // each reads the keys and values of the source's last min(L_s, 6) layers.
    {
      const kvl::ModelConfig& sc = dir.source->config();
      const kvl::ModelConfig& tc = dir.target->config();
      std::vector<kvl::ResidualMap> maps;
      for (int64_t k : native_layers) {
        if (k <= 0 || k >= tc.n_layer) continue;
        kvl::ResidualMap m;
        m.layer = tc.n_layer - k;
        for (int64_t sl = std::max<int64_t>(0, sc.n_layer - 6); sl < sc.n_layer; ++sl) {
          m.source_layers.push_back(sl);
        }
        const int64_t in =
            2 * static_cast<int64_t>(m.source_layers.size()) * sc.n_head_kv * sc.head_dim;
        m.weight = at::randn({tc.hidden_size, in}) * 0.01;
        m.bias = at::zeros({tc.hidden_size});
        if (anchor_window > 0) {
          m.anchor = at::randn({tc.hidden_size, anchor_window * tr->anchor_table().size(1)}) * 0.01;
        }
        maps.push_back(std::move(m));
      }
      Check(tr->SetResidualMaps(std::move(maps), 0, "translator_bench: random"));
    }
    Check(tr->MoveTo(device_name));
    if (!save_dir.empty()) {
      // The file a real-shape translator makes: saved, loaded back, and the
      // loaded one must translate as the saved one.
      const std::string path =
          absl::StrCat(save_dir, "/", dir.name[0] == 's' ? "small-large" : "large-small",
                       ".safetensors");
      const auto t0 = std::chrono::steady_clock::now();
      if (absl::Status s = tr->Save(path); !s.ok()) {
        std::fprintf(stderr, "translator_bench: %s\n", s.ToString().c_str());
        return 1;
      }
      const auto t1 = std::chrono::steady_clock::now();
      const kvl::TranslatorSpec& spec = tr->spec();
      const std::unique_ptr<kvl::Translator> loaded = Check(kvl::Translator::Load(
          path,
          {spec.source.identity, spec.target.identity, spec.source.tokenizer_hash,
           spec.target.tokenizer_hash},
          compute));
      const auto t2 = std::chrono::steady_clock::now();
      const kvl::KvTaps probe{at::randn({dir.source->config().n_layer, dir.source->config().n_head_kv,
                                         16, dir.source->config().head_dim}),
                              at::randn({dir.source->config().n_layer, dir.source->config().n_head_kv,
                                         16, dir.source->config().head_dim})};
      const std::vector<int64_t> probe_ids = slice(0, 16);
      const kvl::KvTaps a = Check(tr->Translate(probe, kvl::Translator::Output::kFloat32,
                                                anchor_window > 0 ? probe_ids : std::vector<int64_t>()));
      const kvl::KvTaps b = Check(loaded->Translate(probe, kvl::Translator::Output::kFloat32,
                                                    anchor_window > 0 ? probe_ids : std::vector<int64_t>()));
      const bool same = a.keys.equal(b.keys) && a.values.equal(b.values);
      std::error_code ec;
      const double mb = static_cast<double>(std::filesystem::file_size(path, ec)) / 1e6;
      std::snprintf(buf, sizeof buf,
                    "%s: translator file %.1f MB, saved in %.2f s, loaded in %.2f s (anchors a %s); "
                    "the loaded one translates %s",
                    dir.name, mb, std::chrono::duration<double>(t1 - t0).count(),
                    std::chrono::duration<double>(t2 - t1).count(),
                    loaded->anchor_lookup() ? "lookup" : "product",
                    same ? "identically" : "DIFFERENTLY");
      emit(buf);
      if (!same) return 1;
    }
    emit("");
    std::snprintf(buf, sizeof buf, "%s: TTFT after a switch (ms, best of runs)", dir.name);
    emit(buf);
    emit("| context T | (a) translate T + decode | (b) re-prefill T | (b)/(a) | (c) translate 256 "
         "new + decode | (d) prefill 256 new | (d)/(c) | translate-only ms | translate / (a) | "
         "translate GFLOP/s | GEMM GFLOP/s | % of GEMM |");
    emit("|---|---|---|---|---|---|---|---|---|---|---|---|");
    std::vector<std::string> parts, caches, inside, dial;
    // Written before each "cold" translation: more than the translation's
    // own data, so that none of it is left in the caches.
    at::Tensor elsewhere = at::empty({kElsewhereBytes}, at::kByte);
    for (int64_t t : contexts) {
      const int runs = (t >= 4096 ? 2 : 3) * repeat;
      std::unique_ptr<kvl::KvCache> source_cache = dir.source->NewCache();
      Check(dir.source->Prefill(*source_cache, slice(0, t + kSpan)).status());

      // The source's [t0, t1) moved into `cache` as the router moves a span:
      // taps, Translate (the products as views) and Accept, on this thread
      // alone; the moments the taps and the translation ended into *marks if
      // given. Returns after the taps and products are released.
      using Clock = std::chrono::steady_clock;
      // A target with sliding layers computes and stores only what they
      // will read of the span (ModelConfig::UnreadTokens), as the router does.
      auto unread = [&](int64_t t0, int64_t t1) {
        return whole_spans ? std::vector<int64_t>{} : dir.target->config().UnreadTokens(t0, t1);
      };
      auto move_span = [&](int64_t t0, int64_t t1, kvl::KvCache& cache,
                           std::array<Clock::time_point, 2>* marks) {
        kvl::SerialIntraOpScope serial;
        kvl::KvTaps taps = Check(source_cache->Taps(t0, t1));
        if (marks != nullptr) (*marks)[0] = Clock::now();
        const std::vector<int64_t> skip = unread(t0, t1);
        kvl::KvTaps out = Check(tr->Translate(taps, kProduct, span_ids(t0, t1), skip));
        if (marks != nullptr) (*marks)[1] = Clock::now();
        Check(cache.Accept(out.keys, out.values, skip));
      };
      // (a), as move_span and a decode step, its phases timed inside the run
      // when `phases` is given.
      auto switch_a = [&](Phases* phases) {
        const Clock::time_point start = Clock::now();
        Clock::time_point sized, moved, decoded;
        std::array<Clock::time_point, 2> marks;
        {
          std::unique_ptr<kvl::KvCache> cache = dir.target->NewCache();
          Check(cache->Reserve(t));  // sized once for the turn, as the router does
          sized = Clock::now();
          move_span(0, t - 1, *cache, &marks);
          moved = Clock::now();
          Check(dir.target->Decode(*cache, ids[t - 1]).status());
          decoded = Clock::now();
        }  // the line released
        const Clock::time_point end = Clock::now();
        if (phases != nullptr) {
          auto s = [](Clock::time_point x, Clock::time_point y) {
            return std::chrono::duration<double>(y - x).count();
          };
          *phases = {s(start, sized), s(sized, marks[0]), s(marks[0], marks[1]),
                     s(marks[1], moved), s(moved, decoded), s(decoded, end), s(start, end)};
        }
      };
      const double a = best(runs, [&] { switch_a(nullptr); });
      const double b = best(runs, [&] {
        std::unique_ptr<kvl::KvCache> cache = dir.target->NewCache();
        Check(dir.target->Prefill(*cache, slice(0, t)).status());
      });
      std::unique_ptr<kvl::KvCache> line = dir.target->NewCache();
      Check(dir.target->Prefill(*line, slice(0, t)).status());
      Check(line->Reserve(t + kSpan));
      const double c = best(3 * repeat, [&] {
        move_span(t, t + kSpan - 1, *line, nullptr);
        Check(dir.target->Decode(*line, ids[t + kSpan - 1]).status());
        Check(line->Rollback(t));
      });
      const double d = best(3 * repeat, [&] {
        Check(dir.target->Prefill(*line, slice(t, t + kSpan)).status());
        Check(line->Rollback(t));
      });
      const kvl::KvTaps taps = Check(source_cache->Taps(0, t));
      const std::vector<int64_t> ids_t = span_ids(0, t), ids_a = span_ids(0, t - 1);
      // The translation-side parts run on one thread, as in move_span.
      auto serial = [](const std::function<void()>& f) {
        return [f] {
          kvl::SerialIntraOpScope scope;
          f();
        };
      };
      const std::vector<int64_t> unread_t = unread(0, t), unread_a = unread(0, t - 1);
      const double tr_s = best(
          runs + 2, serial([&] { (void)Check(tr->Translate(taps, kProduct, ids_t, unread_t)); }));
      if (!switch_only) {
        // (a) part by part, each the best of its own runs.
        const double taps_s =
            best(runs + 2, serial([&] { (void)Check(source_cache->Taps(0, t - 1)); }));
        const kvl::KvTaps taps_a = Check(source_cache->Taps(0, t - 1));
        const double translate_s = best(runs + 2, serial([&] {
          (void)Check(tr->Translate(taps_a, kProduct, ids_a, unread_a));
        }));
        const kvl::KvTaps out_a = Check(tr->Translate(taps_a, kProduct, ids_a, unread_a));
        const double accept_s = best(runs + 2, [&] {
          std::unique_ptr<kvl::KvCache> cache = dir.target->NewCache();
          Check(cache->Reserve(t));
          serial([&] { Check(cache->Accept(out_a.keys, out_a.values, unread_a)); })();
        });
        std::unique_ptr<kvl::KvCache> accepted = dir.target->NewCache();
        Check(accepted->Reserve(t));
        Check(accepted->Accept(out_a.keys, out_a.values, unread_a));
        const double decode_s = best(runs + 2, [&] {
          Check(dir.target->Decode(*accepted, ids[t - 1]).status());
          Check(accepted->Rollback(t - 1));
        });
        const double e = best(runs, [&] {
          std::unique_ptr<kvl::KvCache> cache = dir.target->NewCache();
          Check(cache->Reserve(t));
          move_span(0, t - tail, *cache, nullptr);
          Check(dir.target->Prefill(*cache, slice(t - tail, t)).status());
        });
        std::snprintf(buf, sizeof buf, "| %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.1fx |",
                      (long long)t, 1e3 * taps_s, 1e3 * translate_s, 1e3 * accept_s,
                      1e3 * decode_s, 1e3 * e, b / e);
        parts.push_back(buf);
        // The translation of T-1 tokens by what runs before it, each the same
        // number of times: min and median (ms).
        const int samples = 8 * repeat;
        auto min_median = [&](const std::function<double()>& one) {
          std::vector<double> v;
          for (int i = 0; i < samples; ++i) v.push_back(one());
          std::sort(v.begin(), v.end());
          char cell[64];
          std::snprintf(cell, sizeof cell, "%.2f / %.2f", 1e3 * v.front(), 1e3 * v[v.size() / 2]);
          return std::string(cell);
        };
        auto translate_after = [&](const std::function<void()>& before) {
          return min_median([&] {
            before();
            return seconds(
                serial([&] { (void)Check(tr->Translate(taps_a, kProduct, ids_a, unread_a)); }));
          });
        };
        // (a) run as a whole, each phase timed inside it.
        std::vector<Phases> in_runs(samples);
        for (Phases& p : in_runs) switch_a(&p);
        auto phase = [&](double Phases::*field) {
          return min_median([&, i = 0]() mutable { return in_runs[i++].*field; });
        };
        const std::string in_a = phase(&Phases::translate);
        inside.push_back(absl::StrCat("| ", t, " | ", phase(&Phases::line), " | ",
                                      phase(&Phases::taps), " | ", in_a, " | ",
                                      phase(&Phases::accept), " | ", phase(&Phases::decode), " | ",
                                      phase(&Phases::release), " | ", phase(&Phases::whole), " |"));
        const std::string warm = translate_after([] {});
        const std::string cold = translate_after([&] { elsewhere.fill_(static_cast<uint8_t>(t)); });
        const std::string slept =
            translate_after([] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
        caches.push_back(absl::StrCat("| ", t, " | ", warm, " | ", in_a, " | ", cold, " | ", slept,
                                      " |"));
      }
      for (int64_t k : native_layers) {
        // The dial's switch: (a) with the top k layers of [0, t-1) computed
        // by the target from the predicted residual (k >= L: from its
        // embeddings), as the router runs it.
        const int64_t n_layer = dir.target->config().n_layer;
        const int64_t first = std::max<int64_t>(0, n_layer - k);
        const std::vector<int64_t> span = slice(0, t - 1);
        const double ak = best(runs, [&] {
          std::unique_ptr<kvl::KvCache> cache = dir.target->NewCache();
          Check(cache->Reserve(t));
          // As the router: taps, translation, Accept and the residual map on
          // one intra-op thread, the layers' pass on the engine's threads.
          at::Tensor hidden;
          {
            kvl::SerialIntraOpScope serial;
            const kvl::KvTaps src = Check(source_cache->Taps(0, t - 1));
            const kvl::KvTaps out =
                Check(tr->Translate(src, kProduct, span_ids(0, t - 1), unread_a));
            Check(cache->Accept(out.keys, out.values, unread_a));
            if (k > 0 && first > 0) {
              hidden = Check(tr->PredictResidual(src, first, span_ids(0, t - 1)));
            }
          }
          if (k > 0) Check(dir.target->ForwardLayers(*cache, 0, span, hidden, first));
          Check(dir.target->Decode(*cache, ids[t - 1]).status());
        });
        dial.push_back(absl::StrFormat("| %lld | %lld | %.2f | %.2f | %.1fx | %.2f |", (long long)t,
                                       (long long)std::min(k, n_layer), 1e3 * ak, 1e3 * b, b / ak,
                                       static_cast<double>(std::min(k, n_layer)) / n_layer));
      }
      const double gemm = gemm_rate();
      const double tr_gflops = TranslateFlops(*tr, t, unread_t) / tr_s / 1e9;
      std::snprintf(
          buf, sizeof buf,
          "| %lld | %.2f | %.2f | %.1fx | %.2f | %.2f | %.1fx | %.2f | %.0f%% | %.1f | %.1f | %.1f%% |",
          (long long)t, 1e3 * a, 1e3 * b, b / a, 1e3 * c, 1e3 * d, d / c, 1e3 * tr_s,
          100.0 * tr_s / a, tr_gflops, gemm, 100.0 * tr_gflops / gemm);
      emit(buf);
    }
    // A secondary table: a blank line, its title, header, separator and rows.
    auto table = [&](const std::string& title, const std::string& header,
                     const std::vector<std::string>& rows) {
      emit("");
      emit(absl::StrCat(dir.name, ": ", title));
      emit(header);
      std::string rule = "|";
      for (size_t i = 1; i + 1 < header.size(); ++i) rule += header[i] == '|' ? "---|" : "";
      emit(rule + "---|");
      for (const std::string& row : rows) emit(row);
    };
    if (!dial.empty()) {
      table("the native-depth dial: (a) with the target's top k layers computed from a predicted "
            "residual (ms, best of runs)",
            "| context T | k | (a_k) switch + decode | (b) re-prefill | (b)/(a_k) | k / L |", dial);
    }
    if (switch_only) continue;
    const std::string runs_each = absl::StrCat("(ms, min / median of ", 8 * repeat, " runs each)");
    table("(a) part by part, and the hybrid (e) (ms, best of runs each)",
          absl::StrCat("| context T | source taps | translate | target accept | target decode | "
                       "(e) translate T-", tail, " + prefill ", tail, " | (b)/(e) |"),
          parts);
    table("the translation of T-1 tokens by what runs before it " + runs_each,
          "| context T | back to back | inside (a) | after writing 256 MiB elsewhere | after a 5 "
          "ms sleep |",
          caches);
    table("(a) phase by phase, each timed inside the same runs " + runs_each,
          "| context T | fresh line | source taps | translate | accept and release | decode | "
          "line release | whole (a) |",
          inside);
  }
  emit("");
  emit("(a) = Taps (inverting k-norm and RoPE) + Translate + Accept (target k-norm and RoPE) + one "
       "decode step; Translate returns the products as views in the compute dtype, which Accept "
       "reads as they are (Translator::Output::kProduct, as the router does); the translate "
       "columns time it back to back on one set of taps; inside (a) = the Translate call timed "
       "within (a)'s sequence, right after fresh taps; the phase-by-phase table times each "
       "part of (a) inside the same runs of (a) as a whole, its columns' minima and medians "
       "taken separately; translate FLOPs = 2 * sum over "
       "key and value maps of in*out times the tokens each computes (T, less a sliding "
       "target layer's unread ones; token anchors: 2 * T * W*E*out per map when they are a "
       "product, with a table too large for their lookup; a lookup of W rows per token is not "
       "counted: its time is in the translate columns, not in the FLOPs); GEMM = square 2048 torch::mm in the translation's dtype "
       "on one intra-op thread, as the translation runs, measured right after each row.");
  emit(share.Line());
  if (!out_path.empty() && !emit.WriteTo(out_path)) return 1;
  return 0;
}
