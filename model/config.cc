#include "model/config.h"

#include <algorithm>
#include <cmath>
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

// The RoPE type and linear factor of one "rope_scaling" (or "rope_parameters")
// object. Only plain and linear RoPE are implemented; YaRN, dynamic NTK,
// LongRoPE and Llama-3 scaling change the rotary frequencies otherwise and
// are refused.
absl::Status ReadRopeScaling(const char* key, const json& r, double* factor) {
  if (!r.is_object()) return Refuse(key, r, "expected null or an object");
  std::string type;
  for (const char* name : {"rope_type", "type"}) {
    auto t = r.find(name);
    if (t != r.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") {
    *factor = 1.0;
    return absl::OkStatus();
  }
  if (type == "linear") {
    auto f = r.find("factor");
    if (f == r.end() || !f->is_number() || !(f->get<double>() > 0)) {
      return Refuse(key, r, "linear scaling needs a positive \"factor\"");
    }
    *factor = f->get<double>();
    return absl::OkStatus();
  }
  return Refuse(key, r,
                "unsupported RoPE type (only \"default\" and \"linear\" are supported)");
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
    {"Gemma3ForCausalLM", "gemma3_text", Architecture::kGemma3, true},
    {"Qwen3MoeForCausalLM", "qwen3_moe", Architecture::kQwen3Moe, true},
};

// Qwen3-MoE's expert keys: the three sizes are required, the layer pattern
// takes Qwen3MoeConfig's defaults.
absl::Status ReadMixtureOfExperts(const json& j, ModelConfig* c) {
  KVL_RETURN_IF_ERROR(ReadPositiveInt(j, "num_experts", &c->n_expert));
  KVL_RETURN_IF_ERROR(ReadPositiveInt(j, "num_experts_per_tok", &c->n_expert_used));
  if (c->n_expert_used > c->n_expert) {
    return Refuse("num_experts_per_tok", c->n_expert_used,
                  absl::StrCat("more than num_experts = ", c->n_expert));
  }
  KVL_RETURN_IF_ERROR(ReadPositiveInt(j, "moe_intermediate_size", &c->moe_intermediate_size));
  KVL_RETURN_IF_ERROR(ReadBool(j, "norm_topk_prob", &c->norm_topk_prob));
  KVL_RETURN_IF_ERROR(ReadInt(j, "decoder_sparse_step", false, &c->decoder_sparse_step));
  if (c->decoder_sparse_step <= 0) {
    return Refuse("decoder_sparse_step", c->decoder_sparse_step, "must be positive");
  }
  auto dense = j.find("mlp_only_layers");
  if (dense != j.end() && !dense->is_null()) {
    if (!dense->is_array()) return Refuse("mlp_only_layers", *dense, "expected a list of layers");
    for (const json& il : *dense) {
      if (!il.is_number_integer() || il.get<int64_t>() < 0 || il.get<int64_t>() >= c->n_layer) {
        return Refuse("mlp_only_layers", *dense,
                      absl::StrCat("expected layer indices below ", c->n_layer));
      }
      c->mlp_only_layers.push_back(il.get<int64_t>());
    }
  }
  return absl::OkStatus();
}

// A vision-language Gemma-3 checkpoint: its text model is read from
// "text_config".
constexpr const char* kGemma3Multimodal = "Gemma3ForConditionalGeneration";
constexpr const char* kGemma3MultimodalType = "gemma3";

// Gemma3TextConfig's defaults: configs rely on them (gemma-3-4b's
// text_config gives only six keys).
json Gemma3TextDefaults() {
  return json{{"vocab_size", 262208},
              {"hidden_size", 2304},
              {"intermediate_size", 9216},
              {"num_hidden_layers", 26},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-6},
              {"eos_token_id", 1},
              {"bos_token_id", 2},
              {"tie_word_embeddings", true},
              {"rope_theta", 1000000.0},
              {"attention_bias", false},
              {"query_pre_attn_scalar", 256},
              {"sliding_window", 4096},
              {"sliding_window_pattern", 6},
              {"rope_local_base_freq", 10000.0}};
}

// Gemma-3's text config with its defaults filled in. From a multimodal
// config, the text_config; the outer config's token ids and dtype apply
// where the text config has none.
absl::StatusOr<json> Gemma3TextConfig(const json& j, bool multimodal) {
  json text = Gemma3TextDefaults();
  const json* given = &j;
  if (multimodal) {
    auto t = j.find("text_config");
    if (t == j.end() || !t->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: ", kGemma3Multimodal, " needs a text_config object"));
    }
    for (const char* key : {"eos_token_id", "bos_token_id", "torch_dtype", "dtype",
                            "tie_word_embeddings"}) {
      auto outer = j.find(key);
      if (outer != j.end() && !outer->is_null()) text[key] = *outer;
    }
    given = &*t;
  }
  for (const auto& [key, value] : given->items()) {
    if (!value.is_null() || !text.contains(key)) text[key] = value;
  }
  text["model_type"] = "gemma3_text";
  text.erase("architectures");
  return text;
}

// Gemma-3's layer kinds and RoPE: "layer_types" or "sliding_window_pattern";
// "rope_local_base_freq", "rope_theta" and "rope_scaling", or the newer
// "rope_parameters" per layer kind.
absl::Status ReadGemma3Layers(const json& j, ModelConfig* c) {
  auto window = j.find("sliding_window");
  if (window == j.end() || !window->is_number_integer() || window->get<int64_t>() <= 0) {
    return Refuse("sliding_window", window == j.end() ? json(nullptr) : *window,
                  "must be a positive integer");
  }
  c->sliding_window = window->get<int64_t>();
  c->sliding_layers.assign(static_cast<size_t>(c->n_layer), false);
  auto types = j.find("layer_types");
  if (types != j.end() && !types->is_null()) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->n_layer) {
      return Refuse("layer_types", *types,
                    absl::StrCat("expected a list of num_hidden_layers = ", c->n_layer, " kinds"));
    }
    for (int64_t il = 0; il < c->n_layer; ++il) {
      const json& t = (*types)[il];
      if (t != "sliding_attention" && t != "full_attention") {
        return Refuse("layer_types", *types,
                      "kinds must be \"sliding_attention\" or \"full_attention\"");
      }
      c->sliding_layers[il] = t == "sliding_attention";
    }
  } else {
    int64_t pattern = 6;
    KVL_RETURN_IF_ERROR(ReadInt(j, "sliding_window_pattern", false, &pattern));
    if (pattern <= 0) return Refuse("sliding_window_pattern", pattern, "must be positive");
    for (int64_t il = 0; il < c->n_layer; ++il) c->sliding_layers[il] = (il + 1) % pattern != 0;
  }

  c->rope_local_theta = 10000.0;
  KVL_RETURN_IF_ERROR(ReadDouble(j, "rope_local_base_freq", &c->rope_local_theta));
  auto params = j.find("rope_parameters");
  if (params != j.end() && !params->is_null()) {
    if (!params->is_object()) return Refuse("rope_parameters", *params, "expected an object");
    for (const auto& [kind, local] : {std::pair{"full_attention", false},
                                      std::pair{"sliding_attention", true}}) {
      auto p = params->find(kind);
      if (p == params->end()) continue;
      double factor = 1.0;
      KVL_RETURN_IF_ERROR(ReadRopeScaling("rope_parameters", *p, &factor));
      double theta = local ? c->rope_local_theta : c->rope_theta;
      KVL_RETURN_IF_ERROR(ReadDouble(*p, "rope_theta", &theta));
      if (local) {
        if (factor != 1.0) {
          return Refuse("rope_parameters", *params, "scaled RoPE on sliding layers is not supported");
        }
        c->rope_local_theta = theta;
      } else {
        c->rope_theta = theta;
        c->rope_scaling_factor = factor;
      }
    }
  }
  if (!(c->rope_local_theta > 0)) {
    return Refuse("rope_local_base_freq", c->rope_local_theta, "must be positive");
  }
  return absl::OkStatus();
}

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

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const json& outer) {
  if (!outer.is_object()) return absl::InvalidArgumentError("config.json: expected a JSON object");
  // A multimodal Gemma-3 checkpoint: its text half.
  const auto outer_archs = outer.find("architectures");
  const bool multimodal =
      (outer_archs != outer.end() && outer_archs->is_array() && outer_archs->size() == 1 &&
       (*outer_archs)[0] == kGemma3Multimodal) ||
      outer.value("model_type", json()) == kGemma3MultimodalType;
  bool gemma3 = multimodal || outer.value("model_type", json()) == "gemma3_text" ||
                (outer_archs != outer.end() && outer_archs->is_array() &&
                 outer_archs->size() == 1 && (*outer_archs)[0] == "Gemma3ForCausalLM");
  json gemma3_text;
  if (gemma3) {
    absl::StatusOr<json> text = Gemma3TextConfig(outer, multimodal);
    if (!text.ok()) return text.status();
    gemma3_text = *std::move(text);
    if (!multimodal && outer_archs != outer.end()) gemma3_text["architectures"] = *outer_archs;
  }
  const json& j = gemma3 ? gemma3_text : outer;
  ModelConfig c;
  c.text_of_multimodal = multimodal;

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
                    "MistralForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, "
                    "Qwen3MoeForCausalLM)");
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
                    "unsupported model_type (supported: qwen3, llama, mistral, gemma3_text, "
                    "gemma3, qwen3_moe)");
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

  // Gemma names the key hidden_activation (and ignores hidden_act).
  const char* act_key = c.architecture == Architecture::kGemma3 ? "hidden_activation" : "hidden_act";
  auto act = j.find(act_key);
  if (act != j.end() && !act->is_null()) {
    if (*act == "silu") {
      c.hidden_act = Activation::kSilu;
    } else if (*act == "gelu_pytorch_tanh") {
      c.hidden_act = Activation::kGeluTanh;
    } else {
      return Refuse(act_key, *act, "only \"silu\" and \"gelu_pytorch_tanh\" are supported");
    }
  }
  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    return Refuse("quantization_config", *q, "quantized checkpoints are not supported");
  }
  if (auto r = j.find("rope_scaling"); r != j.end() && !r->is_null()) {
    KVL_RETURN_IF_ERROR(ReadRopeScaling("rope_scaling", *r, &c.rope_scaling_factor));
  }
  if (auto r = j.find("rope_parameters");
      r != j.end() && !r->is_null() && c.architecture != Architecture::kGemma3) {
    KVL_RETURN_IF_ERROR(ReadRopeScaling("rope_parameters", *r, &c.rope_scaling_factor));
    KVL_RETURN_IF_ERROR(ReadDouble(*r, "rope_theta", &c.rope_theta));
  }
  if (auto cap = j.find("attn_logit_softcapping"); cap != j.end() && !cap->is_null()) {
    return Refuse("attn_logit_softcapping", *cap,
                  "soft-capped attention scores (Gemma-2) are not supported");
  }
  KVL_RETURN_IF_ERROR(ReadDouble(j, "final_logit_softcapping", &c.final_logit_softcapping));
  if (c.final_logit_softcapping < 0) {
    return Refuse("final_logit_softcapping", c.final_logit_softcapping, "must be positive or null");
  }
  if (c.architecture == Architecture::kGemma3) {
    c.norm_weight_offset = true;
    c.sandwich_norms = true;
    c.scale_embeddings = true;
    KVL_RETURN_IF_ERROR(ReadDouble(j, "query_pre_attn_scalar", &c.query_pre_attn_scalar));
    if (!(c.query_pre_attn_scalar > 0)) {
      return Refuse("query_pre_attn_scalar", c.query_pre_attn_scalar, "must be positive");
    }
    KVL_RETURN_IF_ERROR(ReadGemma3Layers(j, &c));
    if (!(c.rope_theta > 0)) return Refuse("rope_parameters", c.rope_theta, "must be positive");
  } else if (c.architecture == Architecture::kMistral) {
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
  if (c.architecture == Architecture::kQwen3Moe) KVL_RETURN_IF_ERROR(ReadMixtureOfExperts(j, &c));

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
  const bool gemma3 = architecture == Architecture::kGemma3;
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
  if (final_logit_softcapping > 0) j["final_logit_softcapping"] = final_logit_softcapping;
  j["head_dim"] = head_dim;
  j[gemma3 ? "hidden_activation" : "hidden_act"] =
      hidden_act == Activation::kGeluTanh ? "gelu_pytorch_tanh" : "silu";
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  const bool qwen3 = architecture == Architecture::kQwen3 || architecture == Architecture::kQwen3Moe;
  if (qwen3) {
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
  j["rope_scaling"] = rope_scaling_factor == 1.0
                          ? json(nullptr)
                          : json{{"rope_type", "linear"}, {"factor", rope_scaling_factor}};
  j["rope_theta"] = rope_theta;
  if (qwen3) j["sliding_window"] = nullptr;
  if (architecture == Architecture::kQwen3Moe) {
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
    j["num_experts"] = n_expert;
    j["num_experts_per_tok"] = n_expert_used;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.001;
  }
  if (architecture == Architecture::kMistral) {
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  }
  if (gemma3) {
    j["attn_logit_softcapping"] = nullptr;
    if (final_logit_softcapping <= 0) j["final_logit_softcapping"] = nullptr;
    json types = json::array();
    for (int64_t il = 0; il < n_layer; ++il) {
      types.push_back(IsSlidingLayer(il) ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
    j["query_pre_attn_scalar"] = query_pre_attn_scalar;
    j["rope_local_base_freq"] = rope_local_theta;
    j["sliding_window"] = sliding_window;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  if (qwen3) j["use_sliding_window"] = false;
  j["vocab_size"] = vocab_size;
  return j;
}

std::vector<int64_t> ModelConfig::UnreadTokens(int64_t begin, int64_t end) const {
  if (sliding_window <= 0) return {};
  std::vector<int64_t> unread(static_cast<size_t>(n_layer), 0);
  const int64_t n = std::max<int64_t>(0, end - begin);
  for (int64_t il = 0; il < n_layer; ++il) {
    // The query at `end` sees keys end - W < k <= end: the span's last W - 1.
    if (const int64_t w = AttentionWindow(il); w > 0) {
      unread[static_cast<size_t>(il)] = std::max<int64_t>(0, n - (w - 1));
    }
  }
  return unread;
}

bool ModelConfig::IsMoeLayer(int64_t il) const {
  return n_expert > 0 && (il + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), il) == mlp_only_layers.end();
}

double ModelConfig::AttentionScale() const {
  const double scalar =
      query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim);
  return 1.0 / std::sqrt(scalar);
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t q_dim = n_head * head_dim;
  const int64_t kv_dim = n_head_kv * head_dim;
  int64_t attention = (sandwich_norms ? 4 : 2) * hidden_size          // the layer's norms
                      + (q_dim + 2 * kv_dim) * hidden_size            // q, k, v
                      + hidden_size * q_dim;                          // o
  if (attention_bias) attention += q_dim + 2 * kv_dim + hidden_size;  // q, k, v, o biases
  if (qk_norm) attention += 2 * head_dim;
  const int64_t dense_mlp = 3 * intermediate_size * hidden_size;     // gate, up, down
  const int64_t moe = n_expert * hidden_size                          // router
                      + n_expert * 3 * moe_intermediate_size * hidden_size;
  int64_t total = vocab_size * hidden_size + hidden_size;  // embedding, final norm
  for (int64_t il = 0; il < n_layer; ++il) total += attention + (IsMoeLayer(il) ? moe : dense_mlp);
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

}  // namespace kvl
