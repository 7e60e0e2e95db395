#include "server/model_runtime.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/model_dir.h"
#include "spdlog/spdlog.h"
#include "translator/translator.h"

namespace kvl::server {
namespace {

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRuntime>> LoadModelRuntime(const ServerConfig& config,
                                                               router::TurnObserver* observer) {
  auto runtime = std::make_unique<ModelRuntime>();
  CacheStoreOptions store_options;
  store_options.n_models = static_cast<int>(config.models.size());
  store_options.memory_budget_bytes = config.sessions.memory_budget_bytes;
  runtime->store = std::make_unique<CacheStore>(store_options);
  if (config.models.empty()) return runtime;
  std::vector<router::LoadedModel> models;
  std::vector<std::string> identities, tokenizer_hashes;
  std::unique_ptr<Tokenizer> shared_tokenizer;
  for (size_t i = 0; i < config.models.size(); ++i) {
    const ModelEntry& e = config.models[i];
    const std::string where = absl::StrCat("models[", i, "] (", e.name, ")");
    RuntimeOptions options;
    options.dtype = e.dtype;
    options.n_threads = config.runtime.threads;
    absl::StatusOr<ModelDir> loaded = LoadModelDir(e.path, options);
    if (!loaded.ok()) return Annotate(loaded.status(), where);
    if (shared_tokenizer != nullptr &&
        loaded->tokenizer->content_hash() != shared_tokenizer->content_hash()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": its tokenizer.json differs from ", config.models[0].name,
          "'s; the models of one server share one tokenizer (a session is one token stream)"));
    }
    identities.push_back(loaded->identity);
    tokenizer_hashes.push_back(loaded->tokenizer->content_hash());
    spdlog::info("loaded model {} from {} ({} layers, hidden {}, {})", e.name, e.path,
                 loaded->config().n_layer, loaded->config().hidden_size, DTypeName(options.dtype));
    if (shared_tokenizer == nullptr) shared_tokenizer = std::move(loaded->tokenizer);
    models.push_back({e.name, e.path, std::move(loaded->engine)});
  }
  std::vector<router::LoadedTranslator> translators;
  for (size_t i = 0; i < config.translators.size(); ++i) {
    const TranslatorEntry& t = config.translators[i];
    const std::string where = absl::StrCat("translators[", i, "] (", t.name, ")");
    const int source = t.source, target = t.target;
    TranslatorExpectation expect;
    expect.source_identity = identities[source];
    expect.target_identity = identities[target];
    expect.source_tokenizer_hash = tokenizer_hashes[source];
    expect.target_tokenizer_hash = tokenizer_hashes[target];
    const DType compute = t.compute_dtype.value_or(FastestTranslateDtype());
    if (compute == DType::kBFloat16 && FastestTranslateDtype() != DType::kBFloat16) {
      spdlog::warn("translator {}: bfloat16 on a CPU without bfloat16 dot-product instructions "
                   "(AVX512-BF16, AMX-BF16) is emulated and may be slower than float32",
                   t.name);
    }
    absl::StatusOr<std::unique_ptr<Translator>> loaded = Translator::Load(t.path, expect, compute);
    if (!loaded.ok()) return Annotate(loaded.status(), where);
    spdlog::info("loaded translator {} ({} -> {}) from {}, {} maps, computing in {}{}", t.name,
                 config.models[source].name, config.models[target].name, t.path,
                 MapInputsName((*loaded)->spec().inputs), DTypeName(compute),
                 t.compute_dtype ? "" : " (auto)");
    translators.push_back({t.name, t.path, source, target, *std::move(loaded)});
  }
  absl::StatusOr<std::unique_ptr<router::Router>> router =
      router::Router::Create(std::move(models), std::move(translators), std::move(shared_tokenizer),
                             config.routing, runtime->store.get(), observer);
  if (!router.ok()) return router.status();
  runtime->router = *std::move(router);
  return runtime;
}

}  // namespace kvl::server
