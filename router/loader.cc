#include "router/loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/chat_template.h"
#include "model/model_dir.h"
#include "spdlog/spdlog.h"
#include "translator/translator.h"

namespace kvl::router {
namespace {

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace

std::string LoadGateRefusal(const std::optional<TranslatorEvaluation>& evaluation,
                            std::optional<double> min_recovered,
                            std::optional<double> max_gap_nats) {
  if (!min_recovered && !max_gap_nats) return "";
  if (!evaluation) {
    return "the file carries no evaluation to check against the configured minimum (stamp it "
           "with `kvl eval-translator --stamp` or `kvl stamp-translator`)";
  }
  const TranslatorEvaluation& e = *evaluation;
  const std::string measured =
      absl::StrCat(" (measured on ", e.data.empty() ? "unnamed data" : e.data, ", ", e.windows,
                   " windows)");
  if (min_recovered && !(e.recovered >= *min_recovered)) {
    return absl::StrCat("its evaluation recovers ", absl::SixDigits(e.recovered),
                        " of the prefix benefit", measured, ", below the minimum ",
                        absl::SixDigits(*min_recovered));
  }
  if (max_gap_nats && !(e.gap_nats <= *max_gap_nats)) {
    return absl::StrCat("its evaluation's gap is ", absl::SixDigits(e.gap_nats), " nats/token",
                        measured, ", above the maximum ", absl::SixDigits(*max_gap_nats));
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Router>> LoadRouter(const std::vector<ModelSource>& sources,
                                                   const std::vector<TranslatorSource>& translators,
                                                   RouterConfig config, int n_threads,
                                                   CacheStore* store, TurnObserver* observer) {
  std::vector<LoadedModel> models;
  std::vector<std::string> identities, tokenizer_hashes;
  std::unique_ptr<Tokenizer> shared_tokenizer;
  for (size_t i = 0; i < sources.size(); ++i) {
    const ModelSource& e = sources[i];
    const std::string where = absl::StrCat("models[", i, "] (", e.name, ")");
    RuntimeOptions options;
    options.dtype = e.dtype;
    options.device = e.device;
    options.n_threads = n_threads;
    absl::StatusOr<ModelDir> loaded = LoadModelDir(e.path, options);
    if (!loaded.ok()) return Annotate(loaded.status(), where);
    identities.push_back(loaded->identity);
    tokenizer_hashes.push_back(loaded->tokenizer->content_hash());
    spdlog::info("loaded model {} from {} ({} layers, hidden {}, {})", e.name, e.path,
                 loaded->config().n_layer, loaded->config().hidden_size,
                 absl::StrCat(DTypeName(options.dtype), " on ", options.device));
    absl::StatusOr<ChatTemplateKind> chat_template = ChatTemplateKindForModelDir(e.path);
    if (!chat_template.ok()) return Annotate(chat_template.status(), where);
    // The first model's tokenizer is the router's (group 0); a model with
    // another keeps its own (switches across tokenizers, router.h).
    std::unique_ptr<Tokenizer> own;
    if (shared_tokenizer == nullptr) {
      shared_tokenizer = std::move(loaded->tokenizer);
    } else if (loaded->tokenizer->content_hash() != shared_tokenizer->content_hash()) {
      spdlog::info("model {} reads its own tokenizer (not {}'s): switches to and from it align "
                   "the two tokenizations",
                   e.name, sources[0].name);
      own = std::move(loaded->tokenizer);
    }
    models.push_back({e.name, e.path, std::move(loaded->engine), *chat_template, std::move(own)});
  }
  std::vector<LoadedTranslator> loaded_translators;
  const int n = static_cast<int>(sources.size());
  for (size_t i = 0; i < translators.size(); ++i) {
    const TranslatorSource& t = translators[i];
    const std::string where = absl::StrCat("translators[", i, "] (", t.name, ")");
    if (t.source < 0 || t.source >= n || t.target < 0 || t.target >= n) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": model index out of range"));
    }
    TranslatorExpectation expect;
    expect.source_identity = identities[t.source];
    expect.target_identity = identities[t.target];
    expect.source_tokenizer_hash = tokenizer_hashes[t.source];
    expect.target_tokenizer_hash = tokenizer_hashes[t.target];
    // "auto" on a GPU: bfloat16, which its tensor cores multiply fastest.
    const bool on_cpu = sources[t.target].device == "cpu";
    const DType compute =
        t.compute_dtype.value_or(on_cpu ? FastestTranslateDtype() : DType::kBFloat16);
    if (on_cpu && compute == DType::kBFloat16 && FastestTranslateDtype() != DType::kBFloat16) {
      spdlog::warn("translator {}: bfloat16 on a CPU without bfloat16 dot-product instructions "
                   "(AVX512-BF16, AMX-BF16) is emulated and may be slower than float32",
                   t.name);
    }
    absl::StatusOr<std::unique_ptr<Translator>> loaded = Translator::Load(t.path, expect, compute);
    if (!loaded.ok()) return Annotate(loaded.status(), where);
    // Next to the target's cache, which its products are written into.
    if (absl::Status s = (*loaded)->MoveTo(sources[t.target].device); !s.ok()) {
      return Annotate(s, where);
    }
    spdlog::info("loaded translator {} ({} -> {}) from {}, {} maps, computing in {}{}", t.name,
                 sources[t.source].name, sources[t.target].name, t.path,
                 MapInputsName((*loaded)->spec().inputs), DTypeName(compute),
                 t.compute_dtype ? "" : " (auto)");
    std::string refused =
        LoadGateRefusal((*loaded)->spec().evaluation,
                        t.min_recovered ? t.min_recovered : config.load_gate.min_recovered,
                        t.max_gap_nats ? t.max_gap_nats : config.load_gate.max_gap_nats);
    if (!refused.empty()) {
      spdlog::warn("translator {} ({} -> {}) refused by the quality gate: {}; switches from {} "
                   "to {} re-prefill",
                   t.name, sources[t.source].name, sources[t.target].name, refused,
                   sources[t.source].name, sources[t.target].name);
    } else if (const std::optional<TranslatorEvaluation>& e = (*loaded)->spec().evaluation) {
      spdlog::info("translator {}: evaluated on {} ({} windows): recovers {:.4f}, gap {:.4f} "
                   "nats/token",
                   t.name, e->data, e->windows, e->recovered, e->gap_nats);
    }
    const int64_t native_layers = t.native_layers.value_or((*loaded)->spec().native_layers);
    if (absl::Status s = CheckNativeLayers(**loaded, native_layers); !s.ok()) {
      return Annotate(s, where);
    }
    if (native_layers > 0) {
      spdlog::info("translator {}: switches compute the top {} of {} target layers natively",
                   t.name, native_layers, (*loaded)->spec().target.n_layer);
    }
    loaded_translators.push_back({t.name, t.path, t.source, t.target, *std::move(loaded),
                                  std::move(refused), native_layers});
  }
  return Router::Create(std::move(models), std::move(loaded_translators),
                        std::move(shared_tokenizer), std::move(config), store, observer);
}

}  // namespace kvl::router
