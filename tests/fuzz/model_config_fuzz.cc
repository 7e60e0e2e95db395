// A checkpoint's config.json (ModelConfig::FromJson). Property: malformed JSON
// or a refused config is an error, never a crash; an accepted config has
// consistent positive shapes and survives ToJson -> FromJson unchanged.
#include <cstdint>
#include <string>

#include "model/config.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  absl::StatusOr<kvl::ModelConfig> config = kvl::ModelConfig::FromJson(j);
  kvl::fuzz::Note(config.status());
  if (!config.ok()) {
    KVL_FUZZ_CHECK(config.status().code() == absl::StatusCode::kInvalidArgument,
                   "a refused config is InvalidArgument: " + config.status().ToString());
    return 0;
  }
  const kvl::ModelConfig& c = *config;
  KVL_FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
                     c.n_layer > 0 && c.n_head > 0 && c.n_head_kv > 0 && c.head_dim > 0,
                 "accepted config with a non-positive size: " + j.dump());
  KVL_FUZZ_CHECK(c.n_head % c.n_head_kv == 0, "query heads not a multiple of key heads");
  absl::StatusOr<kvl::ModelConfig> again = kvl::ModelConfig::FromJson(c.ToJson());
  KVL_FUZZ_CHECK(again.ok(), "ToJson of an accepted config is refused: " + again.status().ToString());
  KVL_FUZZ_CHECK(again->ToJson() == c.ToJson(), "config changed in the ToJson round trip");
  return 0;
}
