// Model hyper-parameters (read from a checkpoint's config.json) and runtime
// settings (chosen by whoever runs the model). The two are kept apart: nothing
// in ModelConfig changes how a checkpoint is run, only what it is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace kvl {

enum class Architecture { kQwen3, kLlama, kMistral, kGemma3, kQwen3Moe };

// The MLP's gate activation ("hidden_act", Gemma: "hidden_activation").
enum class Activation { kSilu, kGeluTanh };

// Hyper-parameters of a Qwen3-family (dense or mixture-of-experts),
// Llama-style, Mistral or Gemma-3 text decoder, with the Hugging Face
// config.json key each field comes from.
struct ModelConfig {
  Architecture architecture = Architecture::kQwen3;  // "architectures"[0]
  std::string architecture_name = "Qwen3ForCausalLM";
  std::string model_type = "qwen3";                 // "model_type"
  int64_t vocab_size = 0;                           // "vocab_size"
  int64_t hidden_size = 0;                          // "hidden_size"
  int64_t intermediate_size = 0;                    // "intermediate_size"
  int64_t n_layer = 0;                              // "num_hidden_layers"
  int64_t n_head = 0;                               // "num_attention_heads"
  int64_t n_head_kv = 0;                            // "num_key_value_heads"
  int64_t head_dim = 0;                             // "head_dim" (default hidden/n_head)
  double rms_norm_eps = 1e-6;                       // "rms_norm_eps"
  double rope_theta = 10000.0;                      // "rope_theta"
  int64_t max_position_embeddings = 4096;           // "max_position_embeddings"
  bool tie_word_embeddings = false;                 // "tie_word_embeddings"
  bool attention_bias = false;                      // "attention_bias"
  // Per-head RMSNorm on queries and keys before RoPE (Qwen3: yes; Llama: no).
  bool qk_norm = true;
  std::string torch_dtype = "float32";              // "torch_dtype": dtype of the stored weights
  // A sliding layer's query at position q attends to keys k with
  // q - W < k <= q ("sliding_window"; 0: none, every earlier key).
  int64_t sliding_window = 0;
  // Which layers slide ("layer_types": "sliding_attention"; Gemma-3's older
  // "sliding_window_pattern" P: all but every P-th). Empty: every layer does
  // when sliding_window > 0 (Mistral).
  std::vector<bool> sliding_layers;
  // RoPE base of the sliding layers (Gemma-3's "rope_local_base_freq");
  // 0: they use rope_theta like the others.
  double rope_local_theta = 0;
  // Linear RoPE scaling ("rope_scaling": {"rope_type": "linear", "factor"}):
  // positions divided by the factor, on every layer that uses rope_theta.
  double rope_scaling_factor = 1.0;
  std::vector<int64_t> eos_token_ids;               // "eos_token_id" (int or list)
  int64_t bos_token_id = -1;                        // "bos_token_id", -1 when absent

  // Gemma-3 (false/defaults elsewhere):
  Activation hidden_act = Activation::kSilu;  // "hidden_act" / "hidden_activation"
  // RMSNorm weights hold w for a scale of (1 + w), applied in float32 before
  // the cast back (Gemma's RMSNorm; Llama's casts first, then scales by w).
  bool norm_weight_offset = false;
  // Four norms per layer: the attention's and the MLP's outputs are normed
  // before their residual adds (post_attention_layernorm and
  // post_feedforward_layernorm), the MLP's input by pre_feedforward_layernorm.
  bool sandwich_norms = false;
  // Token embeddings times sqrt(hidden_size), rounded to the weights' dtype.
  bool scale_embeddings = false;
  double query_pre_attn_scalar = 0;     // attention scale 1/sqrt(this); 0: head_dim
  double final_logit_softcapping = 0;   // logits = cap * tanh(logits / cap); 0: none
  // Qwen3-MoE: a sparse mixture of experts in place of the MLP on its MoE
  // layers (IsMoeLayer). Each token's router logits (a [X, E] linear) go
  // through a float32 softmax; the top n_expert_used experts (each a SwiGLU
  // MLP of moe_intermediate_size) run on it and their outputs add up weighted
  // by those probabilities, renormalized to sum to 1 when norm_topk_prob.
  int64_t n_expert = 0;               // "num_experts"; 0: a dense model
  int64_t n_expert_used = 0;          // "num_experts_per_tok"
  int64_t moe_intermediate_size = 0;  // "moe_intermediate_size"
  bool norm_topk_prob = false;        // "norm_topk_prob"
  int64_t decoder_sparse_step = 1;    // "decoder_sparse_step": every k-th layer is MoE
  std::vector<int64_t> mlp_only_layers;  // "mlp_only_layers": dense despite the step
  // Read from Gemma3ForConditionalGeneration: the text model of a
  // vision-language checkpoint ("text_config"; tensors under
  // "language_model.model." or "model.language_model.", vision tensors
  // skipped). Written back as the Gemma3ForCausalLM it is.
  bool text_of_multimodal = false;

  // Parses config.json. Unsupported architectures, rope_scaling types, hidden
  // activations, sliding windows (other than Mistral's) and inconsistent
  // shapes are refused with InvalidArgument naming the key.
  static absl::StatusOr<ModelConfig> FromJson(const nlohmann::json& j);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);
  // The config.json a Hugging Face Qwen3ForCausalLM / LlamaForCausalLM /
  // MistralForCausalLM / Gemma3ForCausalLM loads.
  nlohmann::json ToJson() const;

  bool IsSlidingLayer(int64_t il) const {
    return sliding_window > 0 && (sliding_layers.empty() || sliding_layers[il]);
  }
  // The window of layer il's attention: W when its queries see only the
  // last W keys (themselves included), 0 when they see every earlier key.
  int64_t AttentionWindow(int64_t il) const { return IsSlidingLayer(il) ? sliding_window : 0; }
  // Layer il's RoPE: its base, and the linear factor its positions are
  // divided by (1: none). Layers with the same pair share rotary tables.
  bool UsesLocalRope(int64_t il) const { return rope_local_theta > 0 && IsSlidingLayer(il); }
  double RopeTheta(int64_t il) const { return UsesLocalRope(il) ? rope_local_theta : rope_theta; }
  double RopeFactor(int64_t il) const { return UsesLocalRope(il) ? 1.0 : rope_scaling_factor; }
  // Per layer, how many leading tokens of a span [begin, end) no later query
  // reads, when every query after it is at `end` or later: a sliding layer's
  // first query there reads the span's last W - 1 tokens only; a global
  // layer reads them all (0). Empty when no layer has a window. What a
  // translation may leave uncomputed (KvCache::Accept's unread).
  std::vector<int64_t> UnreadTokens(int64_t begin, int64_t end) const;
  // Whether layer il's MLP is the mixture of experts.
  bool IsMoeLayer(int64_t il) const;
  // The factor scores are multiplied by: 1/sqrt(query_pre_attn_scalar or head_dim).
  double AttentionScale() const;

  // Parameters, counting a tied lm_head once.
  int64_t ParameterCount() const;
};

// Defaults from generation_config.json, when the checkpoint has one.
struct GenerationDefaults {
  std::vector<int64_t> eos_token_ids;
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;
  double top_p = 1.0;
};

enum class DType { kFloat32, kBFloat16, kFloat16 };
absl::StatusOr<DType> ParseDType(const std::string& name);  // "float32", "bfloat16", "float16"
const char* DTypeName(DType dtype);

// How to run a model: not part of the checkpoint.
struct RuntimeOptions {
  DType dtype = DType::kFloat32;
  std::string device = "cpu";  // "cpu" or "cuda[:N]" when LibTorch has CUDA
  int n_threads = 0;           // intra-op threads; 0 = number of cores
  int64_t prefill_chunk = 512; // tokens per prefill chunk
};

}  // namespace kvl
