#include "server/model_runtime.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/tokenizer.h"
#include "spdlog/spdlog.h"
#include "translator/translator.h"

namespace kvl::server {
namespace {

DType ToModelDtype(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32:
      return DType::kFloat32;
    case Dtype::kBFloat16:
      return DType::kBFloat16;
    case Dtype::kFloat16:
      return DType::kFloat16;
  }
  return DType::kFloat32;
}

int IndexOf(const ServerConfig& config, const std::string& name) {
  for (size_t i = 0; i < config.models.size(); ++i) {
    if (config.models[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::Status Annotate(const absl::Status& s, const std::string& where) {
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace

router::Policy ToRouterPolicy(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kFixed:
      return router::Policy::kFixed;
    case RoutingPolicy::kExplicit:
      return router::Policy::kExplicit;
    case RoutingPolicy::kRules:
      return router::Policy::kRules;
    case RoutingPolicy::kCascade:
      return router::Policy::kCascade;
    case RoutingPolicy::kAlternate:
      return router::Policy::kAlternate;
  }
  return router::Policy::kFixed;
}

router::Strategy ToRouterStrategy(SwitchStrategy strategy) {
  switch (strategy) {
    case SwitchStrategy::kTranslate:
      return router::Strategy::kTranslate;
    case SwitchStrategy::kReprefill:
      return router::Strategy::kReprefill;
    case SwitchStrategy::kReprefillMissing:
      return router::Strategy::kReprefillMissing;
  }
  return router::Strategy::kTranslate;
}

router::RoutingConfig ToRoutingConfig(const ServerConfig& config) {
  router::RoutingConfig r;
  const RoutingSection& s = config.routing;
  r.policy = ToRouterPolicy(s.policy);
  r.default_model = std::max(0, IndexOf(config, s.default_model));
  r.strategy = ToRouterStrategy(s.strategy);
  for (const std::string& name : s.models) r.order.push_back(IndexOf(config, name));
  for (const RoutingRule& rule : s.rules) {
    router::Rule out;
    out.model = IndexOf(config, rule.model);
    out.contains = rule.contains;
    out.min_bytes = rule.min_bytes;
    out.max_bytes = rule.max_bytes;
    out.min_turn = rule.min_turn;
    out.max_turn = rule.max_turn;
    out.pattern = rule.pattern;
    (void)router::CompileRule(&out);  // validated when the config was parsed
    r.rules.push_back(std::move(out));
  }
  r.cascade_max_entropy = s.cascade_max_entropy;
  r.cascade_min_mean_logprob = s.cascade_min_mean_logprob;
  r.native_tail_tokens = s.native_tail_tokens;
  return r;
}

absl::StatusOr<std::unique_ptr<ModelRuntime>> LoadModelRuntime(const ServerConfig& config,
                                                               router::TurnObserver* observer) {
  if (config.models.empty()) return std::unique_ptr<ModelRuntime>();
  std::vector<router::LoadedModel> models;
  std::vector<std::string> identities, tokenizer_hashes;
  std::unique_ptr<Tokenizer> shared_tokenizer;
  for (size_t i = 0; i < config.models.size(); ++i) {
    const ModelEntry& e = config.models[i];
    const std::string where = absl::StrCat("models[", i, "] (", e.name, ")");
    absl::StatusOr<Checkpoint> checkpoint = LoadCheckpoint(e.path);
    if (!checkpoint.ok()) return Annotate(checkpoint.status(), where);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        Tokenizer::FromFile(e.path + "/tokenizer.json");
    if (!tokenizer.ok()) return Annotate(tokenizer.status(), where);
    if (shared_tokenizer != nullptr &&
        (*tokenizer)->content_hash() != shared_tokenizer->content_hash()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": its tokenizer.json differs from ", config.models[0].name,
          "'s; the models of one server share one tokenizer (a session is one token stream)"));
    }
    identities.push_back(ModelIdentity(checkpoint->config, checkpoint->weights));
    tokenizer_hashes.push_back((*tokenizer)->content_hash());
    RuntimeOptions options;
    options.dtype = ToModelDtype(e.dtype);
    options.n_threads = config.runtime.threads;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*checkpoint, options);
    if (!engine.ok()) return Annotate(engine.status(), where);
    spdlog::info("loaded model {} from {} ({} layers, hidden {}, {})", e.name, e.path,
                 checkpoint->config.n_layer, checkpoint->config.hidden_size,
                 DTypeName(options.dtype));
    if (shared_tokenizer == nullptr) shared_tokenizer = *std::move(tokenizer);
    models.push_back({e.name, e.path, *std::move(engine)});
  }
  std::vector<router::LoadedTranslator> translators;
  for (size_t i = 0; i < config.translators.size(); ++i) {
    const TranslatorEntry& t = config.translators[i];
    const std::string where = absl::StrCat("translators[", i, "] (", t.name, ")");
    const int source = IndexOf(config, t.source), target = IndexOf(config, t.target);
    TranslatorExpectation expect;
    expect.source_identity = identities[source];
    expect.target_identity = identities[target];
    expect.source_tokenizer_hash = tokenizer_hashes[source];
    expect.target_tokenizer_hash = tokenizer_hashes[target];
    const DType compute = t.compute_dtype == TranslateDtype::kFloat32    ? DType::kFloat32
                          : t.compute_dtype == TranslateDtype::kBFloat16 ? DType::kBFloat16
                                                                         : FastestTranslateDtype();
    if (compute == DType::kBFloat16 && FastestTranslateDtype() != DType::kBFloat16) {
      spdlog::warn("translator {}: bfloat16 on a CPU without bfloat16 dot-product instructions "
                   "(AVX512-BF16, AMX-BF16) is emulated and may be slower than float32",
                   t.name);
    }
    absl::StatusOr<std::unique_ptr<Translator>> loaded = Translator::Load(t.path, expect, compute);
    if (!loaded.ok()) return Annotate(loaded.status(), where);
    spdlog::info("loaded translator {} ({} -> {}) from {}, {} maps, computing in {}{}", t.name,
                 t.source, t.target, t.path, MapInputsName((*loaded)->spec().inputs),
                 DTypeName(compute), t.compute_dtype == TranslateDtype::kAuto ? " (auto)" : "");
    translators.push_back({t.name, t.path, source, target, *std::move(loaded)});
  }
  auto runtime = std::make_unique<ModelRuntime>();
  CacheStoreOptions store_options;
  store_options.n_models = static_cast<int>(models.size());
  store_options.memory_budget_bytes = config.sessions.memory_budget_bytes;
  runtime->store = std::make_unique<CacheStore>(store_options);
  absl::StatusOr<std::unique_ptr<router::Router>> router =
      router::Router::Create(std::move(models), std::move(translators), std::move(shared_tokenizer),
                             ToRoutingConfig(config), runtime->store.get(), observer);
  if (!router.ok()) return router.status();
  runtime->router = *std::move(router);
  return runtime;
}

}  // namespace kvl::server
