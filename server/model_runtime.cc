#include "server/model_runtime.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "model/device.h"
#include "router/loader.h"

namespace kvl::server {

absl::StatusOr<std::unique_ptr<ModelRuntime>> LoadModelRuntime(const ServerConfig& config,
                                                               router::TurnObserver* observer) {
  auto runtime = std::make_unique<ModelRuntime>();
  CacheStoreOptions store_options;
  store_options.n_models = static_cast<int>(config.models.size());
  store_options.memory_budget_bytes = config.sessions.memory_budget_bytes;
  store_options.max_sessions = config.limits.max_sessions;
  runtime->store = std::make_unique<CacheStore>(store_options);
  SessionStoreOptions durable = config.sessions.store;
  // A store kept in the process expires with the local sessions
  // (Sessions::RemoveIdle); a shared one by its own TTL.
  durable.ttl_seconds = durable.backend == "memory" ? 0 : config.sessions.idle_timeout_seconds;
  absl::StatusOr<std::unique_ptr<SessionStore>> opened = OpenSessionStore(durable);
  if (!opened.ok()) return opened.status();
  std::vector<std::string> names;
  for (const ModelEntry& m : config.models) names.push_back(m.name);
  runtime->sessions =
      std::make_unique<Sessions>(runtime->store.get(), *std::move(opened), std::move(names));
  if (config.models.empty()) return runtime;
  if (absl::Status s = CheckDeviceAvailable(config.runtime.device); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("runtime.", s.message()));  // "runtime.device cuda: ..."
  }
  std::vector<ModelEntry> models = config.models;
  for (ModelEntry& m : models) m.device = config.runtime.device;
  absl::StatusOr<std::unique_ptr<router::Router>> router =
      router::LoadRouter(models, config.translators, config.router, config.runtime.threads,
                         runtime->store.get(), observer);
  if (!router.ok()) return router.status();
  runtime->router = *std::move(router);
  // Restores and forks rebuild each tokenizer group's stream (router.h).
  std::vector<const Tokenizer*> tokenizers;
  for (int g = 0; g < runtime->router->n_groups(); ++g) {
    tokenizers.push_back(&runtime->router->group_tokenizer(g));
  }
  runtime->sessions->SetTokenizerGroups(runtime->router->model_groups(), std::move(tokenizers));
  return runtime;
}

}  // namespace kvl::server
