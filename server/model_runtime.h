// What the server serves with: the configured models and translators, loaded
// at start, the session cache store and the router over them.
#ifndef KVLINGO_SERVER_MODEL_RUNTIME_H_
#define KVLINGO_SERVER_MODEL_RUNTIME_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cache_store/cache_store.h"
#include "router/router.h"
#include "server/config.h"

namespace kvl::server {

struct ModelRuntime {
  std::unique_ptr<CacheStore> store;
  std::unique_ptr<router::Router> router;
};

// Loads every model (checkpoint, tokenizer, engine with the runtime's dtype
// and threads) and every translator (checked against the loaded models and
// tokenizer). The models must share one tokenizer. Errors name the config
// entry: "models[1] (large): ..." with the loader's code (NotFound,
// InvalidArgument, FailedPrecondition). Null runtime when no models are
// configured.
absl::StatusOr<std::unique_ptr<ModelRuntime>> LoadModelRuntime(const ServerConfig& config,
                                                               router::TurnObserver* observer);

// The config's routing section in the router's terms (model indices).
router::RoutingConfig ToRoutingConfig(const ServerConfig& config);
router::Policy ToRouterPolicy(RoutingPolicy policy);
router::Strategy ToRouterStrategy(SwitchStrategy strategy);

}  // namespace kvl::server

#endif  // KVLINGO_SERVER_MODEL_RUNTIME_H_
