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
#include "router/policy.h"
#include "router/router.h"

namespace kvl::router {

struct ModelSource {
  std::string name;
  // A model directory (Hugging Face layout, model/model_dir.h).
  std::string path;
  DType dtype = DType::kFloat32;  // of the weights and KV cache
};

struct TranslatorSource {
  // "<source>-><target>" unless the entry names it.
  std::string name;
  int source = 0, target = 0;  // indices into the models
  std::string path;            // a translator file (translator/translator.h)
  // The arithmetic of the translator's products (Translator::Translate);
  // unset: bfloat16 where the CPU has bfloat16 dot-product instructions,
  // else float32 (kvl::FastestTranslateDtype).
  std::optional<DType> compute_dtype;
};

// Loads every model (LoadModelDir with `dtype` and n_threads) and every
// translator (checked against the loaded models and their tokenizer), then
// creates the Router over `store` (sized for the models). The models must
// share one tokenizer. Errors name the entry, "models[1] (large): ..." or
// "translators[0] (a->b): ...", with the loader's code (NotFound,
// InvalidArgument, FailedPrecondition); Router::Create's.
absl::StatusOr<std::unique_ptr<Router>> LoadRouter(const std::vector<ModelSource>& models,
                                                   const std::vector<TranslatorSource>& translators,
                                                   RoutingConfig routing, int n_threads,
                                                   CacheStore* store, TurnObserver* observer);

}  // namespace kvl::router
