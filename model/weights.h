// The tensors of a Qwen3-family / Llama-style / Gemma-3 decoder, named as in
// Hugging Face checkpoints ("model.layers.{il}.self_attn.q_proj.weight", ...).
//
// Legend: V=vocab_size, E=hidden_size, F=intermediate_size, Hq=n_head,
// H=n_head_kv, D=head_dim, X=n_expert, Fm=moe_intermediate_size. Linear
// weights are [out, in] as in torch.nn.Linear.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/config.h"

namespace kvl {

struct LayerWeights {
  at::Tensor input_layernorm;           // [E]
  at::Tensor q_proj, k_proj, v_proj;    // [Hq*D, E], [H*D, E], [H*D, E]
  at::Tensor q_bias, k_bias, v_bias;    // [Hq*D], [H*D], [H*D]; undefined unless attention_bias
  at::Tensor o_proj;                    // [E, Hq*D]
  // Hugging Face's Qwen3 and Llama give o_proj a bias too when attention_bias.
  at::Tensor o_bias;                    // [E]; undefined unless attention_bias
  at::Tensor q_norm, k_norm;            // [D] each; undefined without qk_norm
  // Without sandwich norms the MLP's input norm; with them (Gemma-3) the
  // attention output's, and the MLP has its own two.
  at::Tensor post_attention_layernorm;  // [E]
  at::Tensor pre_feedforward_layernorm, post_feedforward_layernorm;  // [E]; sandwich norms only
  // The dense MLP (undefined on a mixture-of-experts layer).
  at::Tensor gate_proj, up_proj;        // [F, E]
  at::Tensor down_proj;                 // [E, F]
  // A mixture-of-experts layer (ModelConfig::IsMoeLayer): "mlp.gate.weight"
  // and "mlp.experts.{x}.{gate,up,down}_proj.weight".
  at::Tensor router;                            // [X, E]
  std::vector<at::Tensor> expert_gate, expert_up;  // X x [Fm, E]
  std::vector<at::Tensor> expert_down;          // X x [E, Fm]
};

struct ModelWeights {
  at::Tensor embed_tokens;  // [V, E]
  std::vector<LayerWeights> layers;
  at::Tensor norm;          // [E]
  at::Tensor lm_head;       // [V, E]; aliases embed_tokens when tied

  // Hugging Face tensor name -> tensor (lm_head omitted when tied).
  std::map<std::string, at::Tensor> Named(const ModelConfig& config) const;
  // Fills the weights from named tensors; a missing tensor or a wrong shape is
  // InvalidArgument naming the tensor and both shapes. For the text model of a
  // multimodal checkpoint (config.text_of_multimodal) the language model's
  // tensors may carry either prefix transformers has written
  // ("language_model.model." or "model.language_model."), and the vision
  // tower's and projector's tensors are skipped.
  static absl::StatusOr<ModelWeights> FromNamed(const ModelConfig& config,
                                                std::map<std::string, at::Tensor> named);
  // All tensors, e.g. for an optimiser.
  std::vector<at::Tensor> All() const;
  // A copy converted to dtype/device.
  ModelWeights To(at::ScalarType dtype, const std::string& device) const;
};

}  // namespace kvl
