// ModelWeights <-> Hugging Face tensor names, dtype/device conversion and the
// random initialisation used for models trained from scratch.
#include "model/weights.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/checkpoint.h"

namespace kvl {
namespace {

enum class InitKind { kNormal, kOnes, kZeros };

// One named tensor of the model: where it lives in ModelWeights, its shape,
// and how Hugging Face initialises it. `W` is ModelWeights or const ModelWeights.
template <typename W>
struct Slot {
  std::string name;
  std::conditional_t<std::is_const_v<W>, const at::Tensor*, at::Tensor*> tensor;
  std::vector<int64_t> shape;
  InitKind init;
};

// Every tensor of a checkpoint in a fixed order (the order InitWeights draws
// random numbers in), lm_head excluded: it is handled apart because of tying.
// `w->layers` must already be sized by SizeLayers.
template <typename W>
std::vector<Slot<W>> Slots(const ModelConfig& c, W* w) {
  const int64_t e = c.hidden_size, f = c.intermediate_size, d = c.head_dim;
  const int64_t q_dim = c.n_head * d, kv_dim = c.n_head_kv * d;
  // Gemma's norms scale by (1 + w): they start at zero.
  const InitKind norm_init = c.norm_weight_offset ? InitKind::kZeros : InitKind::kOnes;
  std::vector<Slot<W>> slots;
  slots.push_back(
      {"model.embed_tokens.weight", &w->embed_tokens, {c.vocab_size, e}, InitKind::kNormal});
  for (int64_t il = 0; il < c.n_layer; ++il) {
    auto& l = w->layers[il];
    const std::string p = absl::StrCat("model.layers.", il, ".");
    slots.push_back({p + "input_layernorm.weight", &l.input_layernorm, {e}, norm_init});
    slots.push_back({p + "self_attn.q_proj.weight", &l.q_proj, {q_dim, e}, InitKind::kNormal});
    slots.push_back({p + "self_attn.k_proj.weight", &l.k_proj, {kv_dim, e}, InitKind::kNormal});
    slots.push_back({p + "self_attn.v_proj.weight", &l.v_proj, {kv_dim, e}, InitKind::kNormal});
    slots.push_back({p + "self_attn.o_proj.weight", &l.o_proj, {e, q_dim}, InitKind::kNormal});
    if (c.attention_bias) {
      slots.push_back({p + "self_attn.q_proj.bias", &l.q_bias, {q_dim}, InitKind::kZeros});
      slots.push_back({p + "self_attn.k_proj.bias", &l.k_bias, {kv_dim}, InitKind::kZeros});
      slots.push_back({p + "self_attn.v_proj.bias", &l.v_bias, {kv_dim}, InitKind::kZeros});
      slots.push_back({p + "self_attn.o_proj.bias", &l.o_bias, {e}, InitKind::kZeros});
    }
    if (c.qk_norm) {
      slots.push_back({p + "self_attn.q_norm.weight", &l.q_norm, {d}, norm_init});
      slots.push_back({p + "self_attn.k_norm.weight", &l.k_norm, {d}, norm_init});
    }
    slots.push_back(
        {p + "post_attention_layernorm.weight", &l.post_attention_layernorm, {e}, norm_init});
    if (c.sandwich_norms) {
      slots.push_back(
          {p + "pre_feedforward_layernorm.weight", &l.pre_feedforward_layernorm, {e}, norm_init});
      slots.push_back(
          {p + "post_feedforward_layernorm.weight", &l.post_feedforward_layernorm, {e}, norm_init});
    }
    if (c.IsMoeLayer(il)) {
      const int64_t fm = c.moe_intermediate_size;
      slots.push_back({p + "mlp.gate.weight", &l.router, {c.n_expert, e}, InitKind::kNormal});
      for (int64_t x = 0; x < c.n_expert; ++x) {
        const std::string q = absl::StrCat(p, "mlp.experts.", x, ".");
        slots.push_back({q + "gate_proj.weight", &l.expert_gate[x], {fm, e}, InitKind::kNormal});
        slots.push_back({q + "up_proj.weight", &l.expert_up[x], {fm, e}, InitKind::kNormal});
        slots.push_back({q + "down_proj.weight", &l.expert_down[x], {e, fm}, InitKind::kNormal});
      }
      continue;
    }
    slots.push_back({p + "mlp.gate_proj.weight", &l.gate_proj, {f, e}, InitKind::kNormal});
    slots.push_back({p + "mlp.up_proj.weight", &l.up_proj, {f, e}, InitKind::kNormal});
    slots.push_back({p + "mlp.down_proj.weight", &l.down_proj, {e, f}, InitKind::kNormal});
  }
  slots.push_back({"model.norm.weight", &w->norm, {e}, norm_init});
  return slots;
}

// config.n_layer layers, each mixture-of-experts layer with its experts.
void SizeLayers(const ModelConfig& c, ModelWeights* w) {
  w->layers.resize(c.n_layer);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const size_t n = c.IsMoeLayer(il) ? static_cast<size_t>(c.n_expert) : 0;
    w->layers[il].expert_gate.resize(n);
    w->layers[il].expert_up.resize(n);
    w->layers[il].expert_down.resize(n);
  }
}

constexpr const char* kLmHead = "lm_head.weight";

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Buffers that some exporters save although they are recomputed from the
// config (RoPE inverse frequencies); loading ignores them.
bool IsHarmlessExtra(const std::string& name) {
  return absl::EndsWith(name, ".rotary_emb.inv_freq");
}

// A multimodal checkpoint's tensor name as the text model's: the language
// model's move under "model." (its head to "lm_head.weight"); false for a
// tensor of the vision side, which is dropped. Other names stay as they are
// (the text model's own, or unexpected ones that FromNamed reports).
bool TextModelName(std::string* name) {
  for (const char* prefix : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                             "model.multi_modal_projector."}) {
    if (absl::StartsWith(*name, prefix)) return false;
  }
  for (const char* prefix : {"language_model.model.", "model.language_model."}) {
    if (absl::StartsWith(*name, prefix)) {
      *name = absl::StrCat("model.", name->substr(std::strlen(prefix)));
      return true;
    }
  }
  if (*name == "language_model.lm_head.weight") *name = kLmHead;
  return true;
}

bool IsFloating(const at::Tensor& t) {
  const at::ScalarType s = t.scalar_type();
  return s == at::kFloat || s == at::kBFloat16 || s == at::kHalf;
}

absl::Status TakeTensor(std::map<std::string, at::Tensor>& named, const std::string& name,
                        const std::vector<int64_t>& shape, at::Tensor* out) {
  auto it = named.find(name);
  if (it == named.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing tensor ", name, " (expected shape ", ShapeString(shape), ")"));
  }
  const at::Tensor& t = it->second;
  if (t.sizes() != at::IntArrayRef(shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " has shape ", ShapeString(t.sizes()), ", expected ", ShapeString(shape)));
  }
  if (!IsFloating(t)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has dtype ",
                                                   c10::toString(t.scalar_type()),
                                                   ", expected float32, bfloat16 or float16"));
  }
  *out = std::move(it->second);
  named.erase(it);
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, at::Tensor> ModelWeights::Named(const ModelConfig& config) const {
  std::map<std::string, at::Tensor> named;
  for (const auto& slot : Slots(config, this)) named.emplace(slot.name, *slot.tensor);
  if (!config.tie_word_embeddings) named.emplace(kLmHead, lm_head);
  return named;
}

absl::StatusOr<ModelWeights> ModelWeights::FromNamed(const ModelConfig& config,
                                                     std::map<std::string, at::Tensor> named) {
  if (config.text_of_multimodal) {
    std::map<std::string, at::Tensor> text;
    for (auto& [name, tensor] : named) {
      std::string renamed = name;
      if (TextModelName(&renamed)) text.emplace(std::move(renamed), std::move(tensor));
    }
    named = std::move(text);
  }
  ModelWeights w;
  SizeLayers(config, &w);
  for (const auto& slot : Slots(config, &w)) {
    KVL_RETURN_IF_ERROR(TakeTensor(named, slot.name, slot.shape, slot.tensor));
  }
  if (config.tie_word_embeddings) {
    // transformers ties the head to the embedding even when the file also
    // holds an lm_head (some exporters write both); do the same.
    named.erase(kLmHead);
    w.lm_head = w.embed_tokens;
  } else if (absl::Status s =
                 TakeTensor(named, kLmHead, {config.vocab_size, config.hidden_size}, &w.lm_head);
             !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(s.message(), " (tie_word_embeddings is false)"));
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : named) {
    if (!IsHarmlessExtra(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    constexpr size_t kMaxListed = 8;
    const size_t n_listed = std::min(unexpected.size(), kMaxListed);
    return absl::InvalidArgumentError(
        absl::StrCat(unexpected.size(), " unexpected tensor(s) for ", config.architecture_name,
                     ": ", absl::StrJoin(unexpected.begin(), unexpected.begin() + n_listed, ", "),
                     unexpected.size() > n_listed ? ", ..." : ""));
  }
  return w;
}

std::vector<at::Tensor> ModelWeights::All() const {
  std::vector<at::Tensor> all;
  auto add = [&all](const at::Tensor& t) {
    if (t.defined()) all.push_back(t);
  };
  add(embed_tokens);
  for (const LayerWeights& l : layers) {
    for (const at::Tensor* t :
         {&l.input_layernorm, &l.q_proj, &l.k_proj, &l.v_proj, &l.q_bias, &l.k_bias, &l.v_bias,
          &l.o_proj, &l.o_bias, &l.q_norm, &l.k_norm, &l.post_attention_layernorm,
          &l.pre_feedforward_layernorm, &l.post_feedforward_layernorm, &l.gate_proj, &l.up_proj,
          &l.down_proj, &l.router}) {
      add(*t);
    }
    for (const auto* experts : {&l.expert_gate, &l.expert_up, &l.expert_down}) {
      for (const at::Tensor& t : *experts) add(t);
    }
  }
  add(norm);
  if (!lm_head.is_same(embed_tokens)) add(lm_head);
  return all;
}

ModelWeights ModelWeights::To(at::ScalarType dtype, const std::string& device) const {
  const at::Device dev(device);
  auto conv = [&](const at::Tensor& t) {
    return t.defined() ? t.to(dev, dtype, /*non_blocking=*/false, /*copy=*/false) : t;
  };
  ModelWeights out;
  out.embed_tokens = conv(embed_tokens);
  out.layers.reserve(layers.size());
  for (const LayerWeights& l : layers) {
    LayerWeights o;
    o.input_layernorm = conv(l.input_layernorm);
    o.q_proj = conv(l.q_proj);
    o.k_proj = conv(l.k_proj);
    o.v_proj = conv(l.v_proj);
    o.q_bias = conv(l.q_bias);
    o.k_bias = conv(l.k_bias);
    o.v_bias = conv(l.v_bias);
    o.o_proj = conv(l.o_proj);
    o.o_bias = conv(l.o_bias);
    o.q_norm = conv(l.q_norm);
    o.k_norm = conv(l.k_norm);
    o.post_attention_layernorm = conv(l.post_attention_layernorm);
    o.pre_feedforward_layernorm = conv(l.pre_feedforward_layernorm);
    o.post_feedforward_layernorm = conv(l.post_feedforward_layernorm);
    o.gate_proj = conv(l.gate_proj);
    o.up_proj = conv(l.up_proj);
    o.down_proj = conv(l.down_proj);
    o.router = conv(l.router);
    for (const at::Tensor& t : l.expert_gate) o.expert_gate.push_back(conv(t));
    for (const at::Tensor& t : l.expert_up) o.expert_up.push_back(conv(t));
    for (const at::Tensor& t : l.expert_down) o.expert_down.push_back(conv(t));
    out.layers.push_back(std::move(o));
  }
  out.norm = conv(norm);
  out.lm_head = lm_head.is_same(embed_tokens) ? out.embed_tokens : conv(lm_head);
  return out;
}

ModelWeights InitWeights(const ModelConfig& config, uint64_t seed) {
  ModelWeights w;
  SizeLayers(config, &w);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat);
  constexpr double kInitializerRange = 0.02;  // config.json "initializer_range"
  auto make = [&](const std::vector<int64_t>& shape, InitKind init) {
    switch (init) {
      case InitKind::kOnes:
        return at::ones(shape, opts);
      case InitKind::kZeros:
        return at::zeros(shape, opts);
      case InitKind::kNormal:
        break;
    }
    return at::empty(shape, opts).normal_(0.0, kInitializerRange, gen);
  };
  for (auto& slot : Slots(config, &w)) *slot.tensor = make(slot.shape, slot.init);
  w.lm_head = config.tie_word_embeddings
                  ? w.embed_tokens
                  : make({config.vocab_size, config.hidden_size}, InitKind::kNormal);
  return w;
}

}  // namespace kvl
