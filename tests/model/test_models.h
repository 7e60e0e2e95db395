// Small random models for the model/ runtime tests (decoder, KV cache, engine).
#pragma once

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvl::testing {

struct TinyModel {
  const char* name;
  bool qk_norm;
  bool attention_bias;
  bool tied;
  int64_t n_head, n_head_kv;
};

inline ModelConfig TinyConfig(const TinyModel& m, int64_t n_layer = 2, int64_t hidden = 32,
                              int64_t head_dim = 8, int64_t vocab = 61) {
  ModelConfig c;
  c.architecture = m.qk_norm ? Architecture::kQwen3 : Architecture::kLlama;
  c.architecture_name = m.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  c.model_type = m.qk_norm ? "qwen3" : "llama";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = hidden * 3 / 2;
  c.n_layer = n_layer;
  c.n_head = m.n_head;
  c.n_head_kv = m.n_head_kv;
  c.head_dim = head_dim;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = m.tied;
  c.attention_bias = m.attention_bias;
  c.qk_norm = m.qk_norm;
  return c;
}

// A Gemma-3-style tiny model: four norms per layer scaling by (1 + w),
// embeddings times sqrt(E), GELU-tanh, sliding layers 0, 1 and 3 (window 3,
// RoPE base 10000) around a global layer 2 (base 500, positions scaled down
// 2x), attention scale 1/sqrt(12) with head_dim 8, logits soft-capped at 5.
inline ModelConfig GemmaConfig(int64_t n_layer = 4, int64_t hidden = 32, int64_t head_dim = 8,
                        int64_t vocab = 61) {
  ModelConfig c = TinyConfig({"gemma3", true, false, true, 4, 2}, n_layer, hidden, head_dim, vocab);
  c.architecture = Architecture::kGemma3;
  c.architecture_name = "Gemma3ForCausalLM";
  c.model_type = "gemma3_text";
  c.hidden_act = Activation::kGeluTanh;
  c.norm_weight_offset = true;
  c.sandwich_norms = true;
  c.scale_embeddings = true;
  c.query_pre_attn_scalar = 12;
  c.final_logit_softcapping = 5.0;
  c.sliding_window = 3;
  c.sliding_layers.assign(static_cast<size_t>(n_layer), true);
  c.sliding_layers[2] = false;
  c.rope_local_theta = 10000.0;
  c.rope_theta = 500.0;
  c.rope_scaling_factor = 2.0;
  return c;
}

// A Qwen3-MoE-style tiny model: layers 0 and 2 route each token to the top
// 2 of 6 experts (renormalized), layer 1 keeps a dense MLP (mlp_only_layers).
inline ModelConfig MoeConfig(int64_t n_layer = 3, int64_t hidden = 32, int64_t head_dim = 8,
                      int64_t vocab = 61) {
  ModelConfig c = TinyConfig({"qwen3_moe", true, false, false, 4, 2}, n_layer, hidden, head_dim,
                             vocab);
  c.architecture = Architecture::kQwen3Moe;
  c.architecture_name = "Qwen3MoeForCausalLM";
  c.model_type = "qwen3_moe";
  c.n_expert = 6;
  c.n_expert_used = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  return c;
}

// Hugging Face's initialisation (std 0.02, unit norms) makes attention nearly
// uniform and logits tiny, which would let errors hide; these weights have
// O(1) activations, non-trivial attention and non-unit norm weights.
inline ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed, double std = 0.25) {
  ModelWeights w = InitWeights(config, seed);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  for (auto& [name, t] : w.Named(config)) {
    if (name.find("norm") != std::string::npos) {
      t.normal_(1.0, 0.2, gen);
    } else {
      t.normal_(0.0, std, gen);
    }
  }
  return w;
}

// Token ids [shape] drawn uniformly from [0, vocab), fixed by seed.
inline at::Tensor RandomIds(int64_t vocab, at::IntArrayRef shape, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, shape, gen, at::TensorOptions().dtype(at::kLong));
}

inline double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The engine and scheduler tests' model: a tiny Qwen3-style checkpoint
// (4 heads over 2 KV heads, q/k-norm) with random weights, `context` tokens
// of context.
inline Checkpoint TinyCheckpoint(int64_t context = 64) {
  Checkpoint c;
  c.config = TinyConfig({"qwen3", true, false, false, 4, 2});
  c.config.max_position_embeddings = context;
  c.weights = RandomWeights(c.config, 21);
  return c;
}

// An engine over `c` that prefills `chunk` tokens at a time.
inline std::unique_ptr<Engine> MakeEngine(const Checkpoint& c, int64_t chunk = 5,
                                          int n_threads = 2) {
  RuntimeOptions o;
  o.n_threads = n_threads;
  o.prefill_chunk = chunk;
  auto e = Engine::Create(c, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return *std::move(e);
}

}  // namespace kvl::testing
