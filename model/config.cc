#include "model/config.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using nlohmann::json;

absl::Status Refuse(const std::string& key, const json& value, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: ", key, " = ", value.dump(), ": ", why));
}

// Reads an integer key. Absent (or null) keys keep `*out`, unless required.
absl::Status ReadInt(const json& j, const char* key, bool required, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("config.json: missing key ", key));
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) return Refuse(key, *it, "expected an integer");
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadPositiveInt(const json& j, const char* key, int64_t* out) {
  KVL_RETURN_IF_ERROR(ReadInt(j, key, /*required=*/true, out));
  if (*out <= 0) return Refuse(key, j.at(key), "must be positive");
  return absl::OkStatus();
}

absl::Status ReadDouble(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Refuse(key, *it, "expected a number");
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Refuse(key, *it, "expected true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

// rope_scaling: only plain RoPE is implemented; YaRN, linear, dynamic NTK and
// Llama-3 scaling change the rotary frequencies and are refused.
absl::Status CheckRopeScaling(const json& j) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return Refuse("rope_scaling", *it, "expected null or an object");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = it->find(key);
    if (t != it->end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") return absl::OkStatus();
  return Refuse("rope_scaling", *it,
                "unsupported rope_scaling type (only null or \"default\" is supported)");
}

absl::Status CheckSlidingWindow(const json& j) {
  bool use_sliding_window = false;
  KVL_RETURN_IF_ERROR(ReadBool(j, "use_sliding_window", &use_sliding_window));
  if (use_sliding_window) {
    return Refuse("use_sliding_window", j.at("use_sliding_window"),
                  "sliding-window attention is not supported");
  }
  // Newer transformers versions list the attention kind per layer.
  auto it = j.find("layer_types");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Refuse("layer_types", *it, "expected a list");
    for (const json& t : *it) {
      if (t != "full_attention") {
        return Refuse("layer_types", *it, "only \"full_attention\" layers are supported");
      }
    }
  }
  return absl::OkStatus();
}

struct ArchitectureInfo {
  const char* class_name;
  const char* model_type;
  Architecture architecture;
  bool qk_norm;
};

constexpr ArchitectureInfo kArchitectures[] = {
    {"Qwen3ForCausalLM", "qwen3", Architecture::kQwen3, true},
    {"LlamaForCausalLM", "llama", Architecture::kLlama, false},
    {"MistralForCausalLM", "mistral", Architecture::kMistral, false},
};

const ArchitectureInfo& InfoFor(Architecture a) {
  for (const ArchitectureInfo& info : kArchitectures) {
    if (info.architecture == a) return info;
  }
  return kArchitectures[0];
}

}  // namespace

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "bfloat16") return DType::kBFloat16;
  if (name == "float16") return DType::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", name, "\" (expected float32, bfloat16 or float16)"));
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "float32";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: expected a JSON object");
  ModelConfig c;

  // Architecture: "architectures"[0], or "model_type" when the list is absent.
  const ArchitectureInfo* info = nullptr;
  auto archs = j.find("architectures");
  if (archs != j.end() && !archs->is_null()) {
    if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
      return Refuse("architectures", *archs, "expected a list with one class name");
    }
    const std::string name = (*archs)[0].get<std::string>();
    for (const ArchitectureInfo& a : kArchitectures) {
      if (name == a.class_name) info = &a;
    }
    if (info == nullptr) {
      return Refuse("architectures", *archs,
                    "unsupported architecture (supported: Qwen3ForCausalLM, LlamaForCausalLM, "
                    "MistralForCausalLM)");
    }
  }
  auto model_type = j.find("model_type");
  if (model_type != j.end() && !model_type->is_null()) {
    if (!model_type->is_string()) return Refuse("model_type", *model_type, "expected a string");
    const std::string type = model_type->get<std::string>();
    const ArchitectureInfo* by_type = nullptr;
    for (const ArchitectureInfo& a : kArchitectures) {
      if (type == a.model_type) by_type = &a;
    }
    if (by_type == nullptr) {
      return Refuse("model_type", *model_type,
                    "unsupported model_type (supported: qwen3, llama, mistral)");
    }
    if (info != nullptr && info != by_type) {
      return Refuse("model_type", *model_type,
                    absl::StrCat("does not match architectures[0] = ", info->class_name));
    }
    info = by_type;
  }
  if (info == nullptr) {
    return absl::InvalidArgumentError("config.json: neither architectures nor model_type is set");
  }
  c.architecture = info->architecture;
  c.architecture_name = info->class_name;
  c.model_type = info->model_type;
  c.qk_norm = info->qk_norm;

  for (auto [key, out] : {std::pair<const char*, int64_t*>{"vocab_size", &c.vocab_size},
                          {"hidden_size", &c.hidden_size},
                          {"intermediate_size", &c.intermediate_size},
                          {"num_hidden_layers", &c.n_layer},
                          {"num_attention_heads", &c.n_head}}) {
    KVL_RETURN_IF_ERROR(ReadPositiveInt(j, key, out));
  }
  // Older configs omit num_key_value_heads for plain multi-head attention.
  c.n_head_kv = c.n_head;
  KVL_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &c.n_head_kv));
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0) {
    return Refuse("num_key_value_heads", c.n_head_kv,
                  absl::StrCat("must be positive and divide num_attention_heads = ", c.n_head));
  }
  c.head_dim = 0;
  KVL_RETURN_IF_ERROR(ReadInt(j, "head_dim", false, &c.head_dim));
  if (c.head_dim == 0) {
    if (c.hidden_size % c.n_head != 0) {
      return Refuse("hidden_size", c.hidden_size,
                    absl::StrCat("no head_dim given and hidden_size is not a multiple of "
                                 "num_attention_heads = ",
                                 c.n_head));
    }
    c.head_dim = c.hidden_size / c.n_head;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return Refuse("head_dim", c.head_dim, "must be positive and even (RoPE rotates pairs)");
  }

  KVL_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &c.rms_norm_eps));
  if (!(c.rms_norm_eps > 0)) return Refuse("rms_norm_eps", c.rms_norm_eps, "must be positive");
  KVL_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &c.rope_theta));
  if (!(c.rope_theta > 0)) return Refuse("rope_theta", c.rope_theta, "must be positive");
  KVL_RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", false, &c.max_position_embeddings));
  if (c.max_position_embeddings <= 0) {
    return Refuse("max_position_embeddings", c.max_position_embeddings, "must be positive");
  }
  KVL_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  KVL_RETURN_IF_ERROR(ReadBool(j, "attention_bias", &c.attention_bias));

  bool mlp_bias = false;
  KVL_RETURN_IF_ERROR(ReadBool(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return Refuse("mlp_bias", true, "biases in the MLP are not supported");

  auto act = j.find("hidden_act");
  if (act != j.end() && !act->is_null() && *act != "silu") {
    return Refuse("hidden_act", *act, "only \"silu\" is supported");
  }
  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    return Refuse("quantization_config", *q, "quantized checkpoints are not supported");
  }
  KVL_RETURN_IF_ERROR(CheckRopeScaling(j));
  if (c.architecture == Architecture::kMistral) {
    // Mistral's window is on when the key holds a number (v0.1: 4096;
    // v0.2 and v0.3 ship null, no window).
    auto window = j.find("sliding_window");
    if (window != j.end() && !window->is_null()) {
      if (!window->is_number_integer() || window->get<int64_t>() <= 0) {
        return Refuse("sliding_window", *window, "must be a positive integer or null");
      }
      c.sliding_window = window->get<int64_t>();
    }
  } else {
    KVL_RETURN_IF_ERROR(CheckSlidingWindow(j));
  }

  // "torch_dtype" (transformers < 4.56) or "dtype" (newer).
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string() || !ParseDType(it->get<std::string>()).ok()) {
      return Refuse(key, *it, "unsupported dtype (expected float32, bfloat16 or float16)");
    }
    c.torch_dtype = it->get<std::string>();
    break;
  }

  KVL_RETURN_IF_ERROR(ReadInt(j, "bos_token_id", false, &c.bos_token_id));
  auto eos = j.find("eos_token_id");
  if (eos != j.end() && !eos->is_null()) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int64_t>());
    } else if (eos->is_array()) {
      for (const json& id : *eos) {
        if (!id.is_number_integer()) return Refuse("eos_token_id", *eos, "expected integers");
        c.eos_token_ids.push_back(id.get<int64_t>());
      }
    } else {
      return Refuse("eos_token_id", *eos, "expected an integer or a list of integers");
    }
  }
  for (int64_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return Refuse("eos_token_id", *eos, absl::StrCat("outside the vocabulary of ", c.vocab_size));
    }
  }
  if (c.bos_token_id >= c.vocab_size) {
    return Refuse("bos_token_id", c.bos_token_id,
                  absl::StrCat("outside the vocabulary of ", c.vocab_size));
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  absl::StatusOr<json> j = ReadJsonFile(path);
  if (!j.ok()) return j.status();
  absl::StatusOr<ModelConfig> config = FromJson(*j);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

json ModelConfig::ToJson() const {
  // The keys and defaults of a config.json written by transformers for these
  // classes, so that AutoModelForCausalLM.from_pretrained() reads it unchanged.
  json j = json::object();
  j["architectures"] = json::array({InfoFor(architecture).class_name});
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  if (architecture == Architecture::kQwen3) {
    j["max_window_layers"] = n_layer;
  } else if (architecture == Architecture::kLlama) {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j["model_type"] = InfoFor(architecture).model_type;
  j["num_attention_heads"] = n_head;
  j["num_hidden_layers"] = n_layer;
  j["num_key_value_heads"] = n_head_kv;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_scaling"] = nullptr;
  j["rope_theta"] = rope_theta;
  if (architecture == Architecture::kQwen3) j["sliding_window"] = nullptr;
  if (architecture == Architecture::kMistral) {
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  if (architecture == Architecture::kQwen3) j["use_sliding_window"] = false;
  j["vocab_size"] = vocab_size;
  return j;
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t q_dim = n_head * head_dim;
  const int64_t kv_dim = n_head_kv * head_dim;
  int64_t per_layer = 2 * hidden_size                                 // input/post-attention norms
                      + (q_dim + 2 * kv_dim) * hidden_size            // q, k, v
                      + hidden_size * q_dim                           // o
                      + 3 * intermediate_size * hidden_size;          // gate, up, down
  if (attention_bias) per_layer += q_dim + 2 * kv_dim + hidden_size;  // q, k, v, o biases
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t total = vocab_size * hidden_size + n_layer * per_layer + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

}  // namespace kvl
