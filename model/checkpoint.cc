#include "model/checkpoint.h"

#include <ATen/ATen.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kConfigFile[] = "config.json";
constexpr char kGenerationConfigFile[] = "generation_config.json";
constexpr char kWeightsFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// generation_config.json: transformers samples only when do_sample is true,
// so a file without it (or with false) means greedy decoding.
absl::StatusOr<GenerationDefaults> ParseGenerationConfig(const std::string& path,
                                                         const ModelConfig& config) {
  GenerationDefaults g;
  g.eos_token_ids = config.eos_token_ids;
  if (!fs::exists(path)) return g;
  absl::StatusOr<json> j = ReadJsonFile(path);
  if (!j.ok()) return j.status();
  auto bad = [&](const char* key) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", key, " = ", (*j)[key].dump(), " has the wrong type"));
  };
  if (!j->is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not an object"));
  if (j->contains("eos_token_id") && !(*j)["eos_token_id"].is_null()) {
    const json& eos = (*j)["eos_token_id"];
    g.eos_token_ids.clear();
    if (eos.is_number_integer()) {
      g.eos_token_ids.push_back(eos.get<int64_t>());
    } else if (eos.is_array()) {
      for (const json& id : eos) {
        if (!id.is_number_integer()) return bad("eos_token_id");
        g.eos_token_ids.push_back(id.get<int64_t>());
      }
    } else {
      return bad("eos_token_id");
    }
  }
  bool do_sample = false;
  if (j->contains("do_sample")) {
    if (!(*j)["do_sample"].is_boolean()) return bad("do_sample");
    do_sample = (*j)["do_sample"].get<bool>();
  }
  if (do_sample) {
    g.temperature = 1.0;  // transformers' default when sampling
    if (j->contains("temperature")) {
      if (!(*j)["temperature"].is_number()) return bad("temperature");
      g.temperature = (*j)["temperature"].get<double>();
    }
    if (j->contains("top_k")) {
      if (!(*j)["top_k"].is_number_integer()) return bad("top_k");
      g.top_k = (*j)["top_k"].get<int64_t>();
    } else {
      g.top_k = 50;  // transformers' default
    }
    if (j->contains("top_p")) {
      if (!(*j)["top_p"].is_number()) return bad("top_p");
      g.top_p = (*j)["top_p"].get<double>();
    }
  }
  return g;
}

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name != "." && name != "..";
}

absl::StatusOr<std::map<std::string, at::Tensor>> LoadShards(const std::string& dir) {
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  absl::StatusOr<json> index = ReadJsonFile(index_path);
  if (!index.ok()) return index.status();
  if (!index->is_object() || !index->contains("weight_map") ||
      !(*index)["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": no \"weight_map\" object"));
  }
  std::map<std::string, std::set<std::string>> names_by_shard;
  for (const auto& [name, shard] : (*index)["weight_map"].items()) {
    if (!shard.is_string() || !IsPlainFileName(shard.get<std::string>())) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map[\"", name, "\"] = ", shard.dump(),
                       " is not a file name in the checkpoint directory"));
    }
    names_by_shard[shard.get<std::string>()].insert(name);
  }
  for (const auto& [shard, names] : names_by_shard) {
    if (!fs::exists(fs::path(dir) / shard)) {
      return absl::NotFoundError(absl::StrCat(index_path, ": shard ", shard, " (holding ",
                                              *names.begin(), ") does not exist"));
    }
  }
  std::map<std::string, at::Tensor> named;
  for (auto& [shard, names] : names_by_shard) {
    const std::string shard_path = (fs::path(dir) / shard).string();
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(shard_path);
    if (!file.ok()) return file.status();
    for (auto& [name, tensor] : file->tensors) {
      if (names.erase(name) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            shard_path, ": holds tensor ", name, " which ", kIndexFile, " does not assign to it"));
      }
      named.emplace(name, std::move(tensor));
    }
    if (!names.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(shard_path, ": lacks tensor ", *names.begin(),
                                                     " which ", kIndexFile, " assigns to it"));
    }
  }
  return named;
}

// A fast non-cryptographic 128-bit hash: four independent multiply-rotate
// lanes over 8-byte words (so that the CPU overlaps them), folded at the end
// with a strong 64-bit finaliser. It identifies models, it does not defend
// against someone forging a collision.
class LaneHasher {
 public:
  void Update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (pending_ > 0) {
      const size_t take = std::min(n, sizeof(block_) - pending_);
      std::memcpy(block_ + pending_, p, take);
      pending_ += take;
      p += take;
      n -= take;
      if (pending_ < sizeof(block_)) return;
      Block(block_);
      pending_ = 0;
    }
    for (; n >= sizeof(block_); p += sizeof(block_), n -= sizeof(block_)) Block(p);
    std::memcpy(block_, p, n);
    pending_ = n;
  }

  void UpdateString(const std::string& s) {
    const uint64_t n = s.size();
    Update(&n, sizeof(n));  // length prefix: "ab"+"c" and "a"+"bc" differ
    Update(s.data(), s.size());
  }

  std::string HexDigest() {
    unsigned char tail[sizeof(block_)] = {};
    std::memcpy(tail, block_, pending_);
    tail[pending_] = 0x80;
    Block(tail);
    uint64_t a = Mix(lanes_[0] ^ Rotl(lanes_[2], 17) ^ total_);
    uint64_t b = Mix(lanes_[1] ^ Rotl(lanes_[3], 29) ^ (total_ * kK1));
    a = Mix(a ^ b);
    b = Mix(b + a);
    return absl::StrFormat("%016x%016x", a, b);
  }

 private:
  static constexpr uint64_t kK1 = 0x9E3779B97F4A7C15ull;
  static constexpr uint64_t kK2 = 0xC2B2AE3D27D4EB4Full;

  static uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  void Block(const unsigned char* p) {
    for (int i = 0; i < 4; ++i) {
      uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);
      lanes_[i] = Rotl(lanes_[i] ^ (w * kK1), 31) * kK2;
    }
  }

  uint64_t lanes_[4] = {kK1, kK2, kK1 ^ kK2, kK1 + kK2};
  unsigned char block_[32] = {};
  size_t pending_ = 0;
  uint64_t total_ = 0;
};

}  // namespace

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir) {
  Checkpoint ckpt;
  ckpt.dir = dir;
  absl::StatusOr<ModelConfig> config =
      ModelConfig::FromFile((fs::path(dir) / kConfigFile).string());
  if (!config.ok()) return config.status();
  ckpt.config = *std::move(config);

  absl::StatusOr<GenerationDefaults> generation =
      ParseGenerationConfig((fs::path(dir) / kGenerationConfigFile).string(), ckpt.config);
  if (!generation.ok()) return generation.status();
  ckpt.generation = *std::move(generation);

  std::map<std::string, at::Tensor> named;
  if (fs::exists(fs::path(dir) / kIndexFile)) {
    absl::StatusOr<std::map<std::string, at::Tensor>> shards = LoadShards(dir);
    if (!shards.ok()) return shards.status();
    named = *std::move(shards);
  } else if (fs::exists(fs::path(dir) / kWeightsFile)) {
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors((fs::path(dir) / kWeightsFile).string());
    if (!file.ok()) return file.status();
    named = std::move(file->tensors);
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither ", kWeightsFile, " nor ", kIndexFile, " exists"));
  }

  absl::StatusOr<ModelWeights> weights = ModelWeights::FromNamed(ckpt.config, std::move(named));
  if (!weights.ok()) {
    return absl::Status(weights.status().code(),
                        absl::StrCat(dir, ": ", weights.status().message()));
  }
  ckpt.weights = *std::move(weights);
  return ckpt;
}

absl::Status SaveCheckpoint(const std::string& dir, const ModelConfig& config,
                            const ModelWeights& weights, DType dtype,
                            const std::string& tokenizer_json,
                            const std::string& tokenizer_config_json) {
  // Refuse weights that do not match the config before writing anything.
  absl::StatusOr<ModelWeights> checked = ModelWeights::FromNamed(config, weights.Named(config));
  if (!checked.ok()) return checked.status();

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": ", ec.message()));

  ModelConfig stored = config;
  stored.torch_dtype = DTypeName(dtype);
  KVL_RETURN_IF_ERROR(
      WriteTextFile((fs::path(dir) / kConfigFile).string(), stored.ToJson().dump(2) + "\n"));

  json generation = {{"do_sample", false}};
  if (config.bos_token_id >= 0) generation["bos_token_id"] = config.bos_token_id;
  if (config.eos_token_ids.size() == 1) {
    generation["eos_token_id"] = config.eos_token_ids[0];
  } else if (!config.eos_token_ids.empty()) {
    generation["eos_token_id"] = config.eos_token_ids;
  }
  KVL_RETURN_IF_ERROR(
      WriteTextFile((fs::path(dir) / kGenerationConfigFile).string(), generation.dump(2) + "\n"));

  at::ScalarType scalar_type = at::kFloat;
  if (dtype == DType::kBFloat16) scalar_type = at::kBFloat16;
  if (dtype == DType::kFloat16) scalar_type = at::kHalf;
  std::map<std::string, at::Tensor> named = weights.Named(config);
  for (auto& [name, tensor] : named) tensor = tensor.to(at::kCPU, scalar_type);
  // transformers refuses safetensors files without format metadata.
  KVL_RETURN_IF_ERROR(
      WriteSafetensors((fs::path(dir) / kWeightsFile).string(), named, {{"format", "pt"}}));

  for (const auto& [source, name] : {std::pair{tokenizer_json, "tokenizer.json"},
                                     std::pair{tokenizer_config_json, "tokenizer_config.json"}}) {
    if (source.empty()) continue;
    if (!fs::exists(source)) return absl::NotFoundError(absl::StrCat(source, ": no such file"));
    fs::copy_file(source, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("copying ", source, " to ", dir, ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

std::string ModelIdentity(const ModelConfig& config, const ModelWeights& weights) {
  LaneHasher hasher;
  hasher.UpdateString(config.ToJson().dump());  // keys sorted: canonical
  for (const auto& [name, tensor] : weights.Named(config)) {
    const at::Tensor t = tensor.to(at::kCPU).contiguous();
    hasher.UpdateString(name);
    hasher.UpdateString(c10::toString(t.scalar_type()));
    const int64_t n_dim = t.dim();
    hasher.Update(&n_dim, sizeof(n_dim));
    for (int64_t size : t.sizes()) hasher.Update(&size, sizeof(size));
    hasher.Update(t.data_ptr(), t.numel() * t.element_size());
  }
  return hasher.HexDigest();
}

}  // namespace kvl
