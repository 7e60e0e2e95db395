// Builds a Router from model directories and translator files: the one place
// that loads what a router serves (kvl-server's configuration, `kvl
// eval-switch`).
//
// Thread-safety: LoadRouter is a free function; see router.h for the Router.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache_store/cache_store.h"
#include "model/config.h"
#include "router/config.h"
#include "router/router.h"
#include "translator/translator.h"

namespace kvl::router {

struct ModelSource {
  std::string name;
  // A model directory (Hugging Face layout, model/model_dir.h).
  std::string path;
  DType dtype = DType::kFloat32;  // of the weights and KV cache
  std::string device = "cpu";     // of the weights and KV cache (model/device.h)
};

struct TranslatorSource {
  // "<source>-><target>" unless the entry names it.
  std::string name;
  int source = 0, target = 0;  // indices into the models
  std::string path;            // a translator file (translator/translator.h)
  // The arithmetic of the translator's products (Translator::Translate);
  // unset: on the CPU, bfloat16 where it has bfloat16 dot-product
  // instructions, else float32 (kvl::FastestTranslateDtype); on a GPU,
  // bfloat16. The translator is placed on the target model's device.
  std::optional<DType> compute_dtype;
  // The load-time quality gate's minimum for this pair; unset: the routing
  // configuration's (RouterConfig::load_gate).
  std::optional<double> min_recovered, max_gap_nats;
  // The native-depth dial's k for this pair's switches (Translator's
  // ResidualMap; 0: translate every layer, >= the target's depth: compute
  // every layer); unset: what the translator file stamps. A k in [1, L_t)
  // needs the file's residual map of layer L_t - k (else InvalidArgument).
  std::optional<int64_t> native_layers;
};

// Why the load-time quality gate refuses a translator with `evaluation`
// (empty: it does not). Refused: no evaluation while a minimum is set, a
// recovered share below min_recovered, a gap above max_gap_nats.
std::string LoadGateRefusal(const std::optional<TranslatorEvaluation>& evaluation,
                            std::optional<double> min_recovered,
                            std::optional<double> max_gap_nats);

// Loads every model (LoadModelDir with `dtype` and n_threads) and every
// translator (checked against the loaded models and their tokenizer), then
// creates the Router over `store` (sized for the models). The first model's
// tokenizer is the router's; a model with another keeps its own (router.h:
// tokenizer groups). Errors name the entry, "models[1] (large): ..." or
// "translators[0] (a->b): ...", with the loader's code (NotFound,
// InvalidArgument, FailedPrecondition); Router::Create's. A translator the
// load-time quality gate refuses (LoadGateRefusal) is not an error: it is
// logged and passed on as refused (LoadedTranslator::refused), and the router
// re-prefills its pair's switches.
absl::StatusOr<std::unique_ptr<Router>> LoadRouter(const std::vector<ModelSource>& models,
                                                   const std::vector<TranslatorSource>& translators,
                                                   RouterConfig config, int n_threads,
                                                   CacheStore* store, TurnObserver* observer);

}  // namespace kvl::router
