// What the server serves with: the session registry (always) and, when models
// are configured, the models and translators loaded at start and the router
// over them.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "cache_store/cache_store.h"
#include "router/router.h"
#include "server/config.h"
#include "server/sessions.h"

namespace kvl::server {

struct ModelRuntime {
  std::unique_ptr<CacheStore> store;       // never null
  std::unique_ptr<Sessions> sessions;      // over `store` and the session store; never null
  std::unique_ptr<router::Router> router;  // null without models
};

// Loads every model (checkpoint, tokenizer, engine with the runtime's dtype
// and threads) and every translator (checked against the loaded models and
// tokenizer). The models must share one tokenizer. Errors name the config
// entry: "models[1] (large): ..." with the loader's code (NotFound,
// InvalidArgument, FailedPrecondition). Without models the runtime holds the
// session registry only. The session store (sessions.store) is opened, not
// reached: a Redis that is down at start makes turns UNAVAILABLE until it is up.
absl::StatusOr<std::unique_ptr<ModelRuntime>> LoadModelRuntime(const ServerConfig& config,
                                                               router::TurnObserver* observer);

}  // namespace kvl::server
