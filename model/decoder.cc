#include "model/decoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/decoder_ops.h"
#include "model/key_transform.h"

namespace kvl {

// Fused per-layer weights in the runtime dtype/device. Linear weights stay
// [out, in]; matmuls read them transposed (BLAS handles it without a copy).
// Gemma's norms are float32 (1 + w) (ops::RmsNorm).
struct Decoder::Layer {
  at::Tensor input_layernorm;           // [E]
  at::Tensor qkv, qkv_bias;             // [(Hq + 2H) * D, E], [(Hq + 2H) * D] or undefined
  at::Tensor o_proj, o_bias;            // [E, Hq * D], [E] or undefined
  at::Tensor q_norm;                    // [D] or undefined
  at::Tensor post_attention_layernorm;  // [E]: the MLP's input norm, or with sandwich
                                        // norms the attention output's
  at::Tensor pre_feedforward_layernorm, post_feedforward_layernorm;  // [E]; sandwich norms only
  at::Tensor gate_up;                   // [2F, E]; undefined on a mixture-of-experts layer
  at::Tensor down_proj;                 // [E, F]
  // A mixture-of-experts layer: the router and each expert's fused weights.
  at::Tensor router;                    // [X, E]
  std::vector<at::Tensor> expert_gate_up;  // X x [2Fm, E]
  std::vector<at::Tensor> expert_down;     // X x [E, Fm]
};

namespace {
at::Tensor Project(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   bool vector);
}  // namespace

Decoder::~Decoder() = default;

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const ModelConfig& config,
                                                         const ModelWeights& weights,
                                                         const DecoderOptions& options) {
  if (config.n_head_kv <= 0 || config.n_head % config.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", config.n_head,
                                                   " is not a multiple of num_key_value_heads ",
                                                   config.n_head_kv));
  }
  if (config.head_dim <= 0 || config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", config.head_dim, " must be even"));
  }
  if (static_cast<int64_t>(weights.layers.size()) != config.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", weights.layers.size(), " layers, config ", config.n_layer));
  }
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16 && options.dtype != at::kHalf) {
    return absl::InvalidArgumentError("decoder dtype must be float32, bfloat16 or float16");
  }
  std::unique_ptr<Decoder> d(new Decoder());
  try {
    const at::Device device(options.device);
    if (device.is_cuda() && !at::hasCUDA()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", options.device, ": this LibTorch has no CUDA"));
    }
    if (device.is_cpu() && options.dtype == at::kHalf) {
      return absl::InvalidArgumentError("float16 is not supported on cpu; use bfloat16");
    }
    const ModelWeights w = weights.To(options.dtype, options.device);
    d->config_ = config;
    d->dtype_ = options.dtype;
    d->options_ = at::TensorOptions().dtype(options.dtype).device(device);
    d->max_scores_bytes_ = std::max<int64_t>(options.max_scores_bytes, 1);
    d->raw_decode_attention_ = options.raw_decode_attention;
    d->matrix_vector_decode_ = options.matrix_vector_decode;
    // Gemma's RMSNorm scales by 1 + w, computed in float32 (HF:
    // 1.0 + weight.float(), the weight in the model's dtype).
    auto norm = [&config](const at::Tensor& weight) {
      if (!weight.defined()) return weight;
      return config.norm_weight_offset ? weight.detach().to(at::kFloat).add(1.0) : weight.detach();
    };
    d->embed_tokens_ = w.embed_tokens.detach();
    if (config.scale_embeddings) {
      // sqrt(E) rounded to the weights' dtype first, as HF does (55.4256
      // becomes 55.5 in bfloat16).
      d->embed_scale_ =
          at::scalar_tensor(std::sqrt(static_cast<double>(config.hidden_size)), at::kDouble)
              .to(options.dtype)
              .to(at::kDouble)
              .item<double>();
    }
    d->norm_ = norm(w.norm);
    d->lm_head_ = w.lm_head.detach();
    std::vector<at::Tensor> k_norm;
    bool k_norm_invertible = true;
    for (const LayerWeights& lw : w.layers) {
      Layer l;
      l.input_layernorm = norm(lw.input_layernorm);
      l.qkv = at::cat({lw.q_proj, lw.k_proj, lw.v_proj}, 0).detach();
      if (config.attention_bias) {
        l.qkv_bias = at::cat({lw.q_bias, lw.k_bias, lw.v_bias}, 0).detach();
        l.o_bias = lw.o_bias.detach();
      }
      l.o_proj = lw.o_proj.detach().contiguous();
      if (config.qk_norm) {
        l.q_norm = norm(lw.q_norm);
        k_norm.push_back(norm(lw.k_norm));
        k_norm_invertible = k_norm_invertible && !(k_norm.back() == 0).any().item<bool>();
      }
      l.post_attention_layernorm = norm(lw.post_attention_layernorm);
      l.pre_feedforward_layernorm = norm(lw.pre_feedforward_layernorm);
      l.post_feedforward_layernorm = norm(lw.post_feedforward_layernorm);
      if (lw.router.defined()) {
        l.router = lw.router.detach().contiguous();
        for (size_t x = 0; x < lw.expert_gate.size(); ++x) {
          l.expert_gate_up.push_back(at::cat({lw.expert_gate[x], lw.expert_up[x]}, 0).detach());
          l.expert_down.push_back(lw.expert_down[x].detach().contiguous());
        }
      } else {
        l.gate_up = at::cat({lw.gate_proj, lw.up_proj}, 0).detach();
        l.down_proj = lw.down_proj.detach().contiguous();
      }
      d->layers_.push_back(std::move(l));
    }
    d->tap_mode_ = k_norm_invertible ? options.tap_mode : KeyTapMode::kStorePreNorm;
    d->key_transform_ = std::make_shared<KeyTransform>(config, std::move(k_norm), d->options_);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("preparing the decoder: ", e.what_without_backtrace()));
  }
  return d;
}

std::unique_ptr<KvCache> Decoder::NewCache() const {
  return std::unique_ptr<KvCache>(new KvCache(key_transform_, config_.n_layer, config_.n_head_kv,
                                              config_.head_dim, options_, tap_mode_));
}

at::Tensor Decoder::Mlp(const at::Tensor& h, const at::Tensor& gate_up_weight,
                        const at::Tensor& down_weight, int64_t ffn) const {
  const at::Tensor gate_up = Project(h, gate_up_weight, at::Tensor(), matrix_vector_decode_);
  at::Tensor act = config_.hidden_act == Activation::kGeluTanh
                       ? at::gelu(gate_up.narrow(1, 0, ffn), "tanh")
                       : at::silu(gate_up.narrow(1, 0, ffn));
  act.mul_(gate_up.narrow(1, ffn, ffn));
  return Project(act, down_weight, at::Tensor(), matrix_vector_decode_);
}

at::Tensor Decoder::MixtureOfExperts(const Layer& w, const at::Tensor& h) const {
  const int64_t n_tokens = h.size(0), k = config_.n_expert_used;
  // HF's order: float32 softmax over the router logits, the top k, optionally
  // renormalized, then cast to the activations' dtype.
  const at::Tensor logits = Project(h, w.router, at::Tensor(), matrix_vector_decode_);  // [T, X]
  auto [weights, experts] = at::softmax(logits, -1, at::kFloat).topk(k, -1);  // [T, k] each
  if (config_.norm_topk_prob) weights.div_(weights.sum(-1, /*keepdim=*/true));
  weights = weights.to(h.scalar_type());
  // The (token, slot) pairs grouped by expert: each expert runs once over its
  // tokens, experts in ascending order, their outputs added in that order (as
  // HF's loop does).
  const at::Tensor flat = experts.reshape({-1});
  const at::Tensor order = flat.argsort();
  const at::Tensor sorted = flat.index_select(0, order).cpu();
  const at::Tensor pair_weights = weights.reshape({-1, 1}).index_select(0, order);
  const at::Tensor tokens = order.div(k, "floor");
  const int64_t* expert_of = sorted.data_ptr<int64_t>();
  at::Tensor out = at::zeros_like(h);
  const int64_t n_pairs = n_tokens * k;
  for (int64_t i = 0; i < n_pairs;) {
    int64_t j = i;
    while (j < n_pairs && expert_of[j] == expert_of[i]) ++j;
    const int64_t x = expert_of[i];
    const at::Tensor rows = tokens.narrow(0, i, j - i);
    const at::Tensor y = Mlp(h.index_select(0, rows), w.expert_gate_up[x], w.expert_down[x],
                             config_.moe_intermediate_size);
    out.index_add_(0, rows, y.mul_(pair_weights.narrow(0, i, j - i)));
    i = j;
  }
  return out;
}

at::Tensor Decoder::Forward(KvCache& cache, const at::Tensor& ids, bool all_logits) {
  return ForwardBatch({Row{&cache, ids, all_logits}}).front();
}

namespace {

// x · weightᵀ (+ bias): [T, in] -> [T, out] for a weight [out, in]. With
// one row and `vector` set, a matrix-vector product: OpenBLAS's 1-row GEMM
// packs the whole weight before it multiplies, gemv reads it once.
at::Tensor Project(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   bool vector) {
  if (vector && x.size(0) == 1) {
    const at::Tensor row = x[0];
    return (bias.defined() ? at::addmv(bias, weight, row) : at::mv(weight, row)).unsqueeze(0);
  }
  return bias.defined() ? at::addmm(bias, x, weight.t()) : at::mm(x, weight.t());
}

// Causal mask of a query block against its own tokens' keys, rows ordered
// (token, group): row i*G+g may see key column c iff c <= i. Earlier keys are
// all visible. Shorter blocks use its top-left corner.
at::Tensor DiagonalMask(int64_t block, int64_t n_group, const at::TensorOptions& options) {
  const at::Tensor pos = at::arange(block, options.dtype(at::kLong));
  const at::Tensor hidden = pos.unsqueeze(0) > pos.unsqueeze(1);  // [block, block]
  return at::zeros({block, block}, options)
      .masked_fill_(hidden, -std::numeric_limits<double>::infinity())
      .unsqueeze(1)
      .expand({block, n_group, block})
      .reshape({block * n_group, block});
}

// The window's mask of a query block: rows (token, group) for queries at
// positions [q0, q0 + block), columns the keys at [first_key, first_key +
// n_keys); the query at p may not see a key at k <= p - window. (The causal
// part is DiagonalMask's.)
at::Tensor WindowMask(int64_t block, int64_t n_group, int64_t first_key, int64_t q0,
                      int64_t n_keys, int64_t window, const at::TensorOptions& options) {
  const at::Tensor query = at::arange(q0, q0 + block, options.dtype(at::kLong));
  const at::Tensor key = at::arange(first_key, first_key + n_keys, options.dtype(at::kLong));
  const at::Tensor hidden = key.unsqueeze(0) <= (query - window).unsqueeze(1);  // [block, keys]
  return at::zeros({block, n_keys}, options)
      .masked_fill_(hidden, -std::numeric_limits<double>::infinity())
      .unsqueeze(1)
      .expand({block, n_group, n_keys})
      .reshape({block * n_group, n_keys});
}

}  // namespace

std::vector<at::Tensor> Decoder::ForwardBatch(const std::vector<Row>& rows) {
  return RunRows(rows, Pass{});
}

void Decoder::ForwardLayers(KvCache& cache, int64_t position, const at::Tensor& ids,
                            const at::Tensor& hidden, int64_t first_layer) {
  TORCH_CHECK(first_layer >= 0 && first_layer < config_.n_layer, "ForwardLayers: first layer ",
              first_layer, " outside [0, ", config_.n_layer, ")");
  TORCH_CHECK(hidden.defined() || first_layer == 0,
              "ForwardLayers: a residual stream is needed above layer 0");
  const int64_t n_tokens = hidden.defined() ? hidden.size(0) : ids.numel();
  TORCH_CHECK(!hidden.defined() || (hidden.dim() == 2 && hidden.size(1) == config_.hidden_size),
              "ForwardLayers: hidden must be [T, ", config_.hidden_size, "]");
  TORCH_CHECK(position >= 0 && position + n_tokens <= cache.Length(), "ForwardLayers: tokens [",
              position, ", ", position + n_tokens, ") are not all in the line of ",
              cache.Length());
  Pass pass;
  pass.position = position;
  pass.hidden = hidden;
  pass.first_layer = first_layer;
  RunRows({Row{&cache, hidden.defined() ? at::zeros({n_tokens}, at::kLong) : ids, false}}, pass);
}

at::Tensor Decoder::ForwardResiduals(KvCache& cache, const at::Tensor& ids) {
  at::Tensor residuals;
  Pass pass;
  pass.residuals = &residuals;
  RunRows({Row{&cache, ids, false}}, pass);
  return residuals;
}

std::vector<at::Tensor> Decoder::RunRows(const std::vector<Row>& rows, const Pass& pass) {
  c10::InferenceMode inference;
  TORCH_CHECK(!rows.empty(), "ForwardBatch: no rows");
  const bool rewrite = pass.position >= 0;
  TORCH_CHECK((!rewrite && pass.residuals == nullptr) || rows.size() == 1,
              "a layer pass runs one row");
  const size_t n_rows = rows.size();
  const bool single = n_rows == 1;
  const int64_t n_head = config_.n_head, n_head_kv = config_.n_head_kv, d = config_.head_dim;
  const int64_t n_group = n_head / n_head_kv, q_dim = n_head * d, kv_dim = n_head_kv * d;
  const int64_t ffn = config_.intermediate_size;
  const double eps = config_.rms_norm_eps;
  const double scale = config_.AttentionScale();
  const bool bf16_softmax = dtype_ != at::kFloat;
  const int64_t score_elem = static_cast<int64_t>(c10::elementSize(dtype_));

  // Row r's tokens are [off[r], off[r] + n[r]) of the batch, at positions
  // [p0[r], p0[r] + n[r]) of its line.
  std::vector<int64_t> n(n_rows), p0(n_rows), off(n_rows + 1, 0), block(n_rows);
  for (size_t r = 0; r < n_rows; ++r) {
    const Row& row = rows[r];
    TORCH_CHECK(row.cache != nullptr, "ForwardBatch: row ", r, " has no cache line");
    TORCH_CHECK(row.ids.dim() == 1 && row.ids.numel() > 0, "Forward: ids must be a non-empty [T]");
    for (size_t q = 0; q < r; ++q) {
      TORCH_CHECK(rows[q].cache != row.cache, "ForwardBatch: rows ", q, " and ", r,
                  " share a cache line");
    }
    n[r] = row.ids.numel();
    p0[r] = rewrite ? pass.position : row.cache->Length();
    off[r + 1] = off[r] + n[r];
    // Query blocks bound the scores buffer [H, block * G, keys].
    block[r] = std::clamp<int64_t>(max_scores_bytes_ / (n_head * (p0[r] + n[r]) * score_elem), 1,
                                   n[r]);
  }
  for (size_t r = 0; r < n_rows; ++r) rows[r].cache->EnsureCapacity(p0[r] + n[r]);
  const int64_t total = off[n_rows];

  at::Tensor ids_all, rope_positions;
  LayerRope rope;
  if (single) {
    ids_all = rows[0].ids;
    rope = key_transform_->Rope(p0[0], n[0]);
  } else {
    std::vector<at::Tensor> ids, positions;
    for (size_t r = 0; r < n_rows; ++r) {
      ids.push_back(rows[r].ids.to(at::kLong));
      positions.push_back(at::arange(p0[r], p0[r] + n[r], at::kLong));
    }
    ids_all = at::cat(ids);
    rope = key_transform_->RopeAt(at::cat(positions));
  }
  std::vector<at::Tensor> diag_masks(n_rows);
  for (size_t r = 0; r < n_rows; ++r) {
    if (block[r] > 1) diag_masks[r] = DiagonalMask(block[r], n_group, options_);
  }

  at::Tensor x;  // [T, E]
  if (pass.hidden.defined()) {
    x = pass.hidden.to(options_.device(), dtype_).clone();
  } else {
    const at::Tensor ids_dev = ids_all.to(options_.device(), at::kLong);
    x = at::embedding(embed_tokens_, ids_dev);
    if (config_.scale_embeddings) x.mul_(embed_scale_);
  }
  if (pass.residuals != nullptr) {
    *pass.residuals = at::empty({config_.n_layer + 1, total, config_.hidden_size},
                                x.options().dtype(at::kFloat));
  }
  // Queries in the layout the grouped attention matmul reads: [H, T, G, D].
  at::Tensor q_buf = at::empty({n_head_kv, total, n_group, d}, options_);
  const at::Tensor q_dst = q_buf.permute({1, 0, 2, 3});  // [T, H, G, D] view
  at::Tensor attn_buf = at::empty({n_head_kv, total, n_group, d}, options_);
  // Several rows: the layer's attention keys (and 1/rms) for every row, then
  // copied into each line. One row writes into its line directly.
  const KvCache& first = *rows[0].cache;
  const at::Tensor k_batch = single ? at::Tensor() : at::empty({total, n_head_kv, d}, options_);
  const at::Tensor inv_rms_batch =
      single || !first.keep_inv_rms_
          ? at::Tensor()
          : at::empty({total, n_head_kv}, options_.dtype(at::kFloat));
  // A decode row (one token) of a float32 model on the CPU: its keys and
  // values are copied into its line and its attention is computed by
  // ops::DecodeAttention over raw memory, with no tensor operation per row.
  const bool raw_rows_possible =
      raw_decode_attention_ && dtype_ == at::kFloat && options_.device().is_cpu();
  const bool mv = matrix_vector_decode_;
  std::vector<char> raw(n_rows, 0);
  int64_t longest_raw = 0;
  for (size_t r = 0; r < n_rows; ++r) {
    const KvCache& cache = *rows[r].cache;
    raw[r] = raw_rows_possible && n[r] == 1 && cache.keys_.is_contiguous() &&
             cache.values_.is_contiguous() &&
             (!cache.keep_inv_rms_ || cache.inv_rms_.is_contiguous());
    if (raw[r]) longest_raw = std::max(longest_raw, p0[r] + 1);
  }
  std::vector<float> raw_scratch(static_cast<size_t>(n_group * longest_raw));

  for (size_t il = static_cast<size_t>(pass.first_layer); il < layers_.size(); ++il) {
    const Layer& w = layers_[il];
    if (pass.residuals != nullptr) (*pass.residuals)[static_cast<int64_t>(il)].copy_(x);
    // A windowed layer's query at position p sees keys (p - window, p].
    const int64_t window = config_.AttentionWindow(static_cast<int64_t>(il));
    const at::Tensor h = ops::RmsNorm(x, w.input_layernorm, eps);
    const at::Tensor qkv = Project(h, w.qkv, w.qkv_bias, mv);  // [T, (Hq + 2H) * D]
    at::Tensor q = qkv.narrow(1, 0, q_dim).view({total, n_head, d});
    const at::Tensor k = qkv.narrow(1, q_dim, kv_dim).view({total, n_head_kv, d});
    const at::Tensor v = qkv.narrow(1, q_dim + kv_dim, kv_dim).view({total, n_head_kv, d});

    if (w.q_norm.defined()) q = ops::RmsNorm(q, w.q_norm, eps);
    const ops::RopeTable& layer_rope = rope.For(static_cast<int64_t>(il));
    ops::ApplyRope(q.view({total, n_head_kv, n_group, d}), layer_rope, q_dst);

    if (single) {
      KvCache& cache = *rows[0].cache;
      const at::Tensor k_dst = cache.keys_[il].narrow(1, p0[0], n[0]).transpose(0, 1);  // [T, H, D]
      const at::Tensor inv_rms_dst =
          cache.keep_inv_rms_ ? cache.inv_rms_[il].narrow(1, p0[0], n[0]).t() : at::Tensor();
      key_transform_->Apply(static_cast<int64_t>(il), k, layer_rope, k_dst, inv_rms_dst);
    } else {
      key_transform_->Apply(static_cast<int64_t>(il), k, layer_rope, k_batch, inv_rms_batch);
    }
    for (size_t r = 0; r < n_rows; ++r) {
      KvCache& cache = *rows[r].cache;
      const int64_t t0 = p0[r], nr = n[r];
      if (raw[r]) {
        const int64_t cap = cache.capacity_;
        float* line_keys = cache.keys_.data_ptr<float>() + il * n_head_kv * cap * d;
        float* line_values = cache.values_.data_ptr<float>() + il * n_head_kv * cap * d;
        const float* v_row = qkv.data_ptr<float>() + off[r] * qkv.stride(0) + q_dim + kv_dim;
        for (int64_t hk = 0; hk < n_head_kv; ++hk) {
          float* key_dst = line_keys + (hk * cap + t0) * d;
          if (!single) {
            std::memcpy(key_dst, k_batch.data_ptr<float>() + (off[r] * n_head_kv + hk) * d,
                        sizeof(float) * d);
            if (cache.keep_inv_rms_) {
              cache.inv_rms_.data_ptr<float>()[(il * n_head_kv + hk) * cap + t0] =
                  inv_rms_batch.data_ptr<float>()[off[r] * n_head_kv + hk];
            }
          }
          std::memcpy(line_values + (hk * cap + t0) * d, v_row + hk * d, sizeof(float) * d);
        }
        if (cache.tap_mode_ == KeyTapMode::kStorePreNorm) {
          cache.keys_prenorm_[il].narrow(1, t0, 1).copy_(k.narrow(0, off[r], 1).transpose(0, 1));
        }
        const int64_t head_stride = total * n_group * d;
        const int64_t first_key = window > 0 ? std::max<int64_t>(0, t0 + 1 - window) : 0;
        ops::DecodeAttention({n_head_kv, n_group, d, cap, t0 + 1 - first_key},
                             q_buf.data_ptr<float>() + off[r] * n_group * d, head_stride,
                             line_keys + first_key * d, line_values + first_key * d,
                             static_cast<float>(scale),
                             attn_buf.data_ptr<float>() + off[r] * n_group * d, head_stride,
                             raw_scratch.data());
        continue;
      }
      if (!single) {
        cache.keys_[il].narrow(1, t0, nr).transpose(0, 1).copy_(k_batch.narrow(0, off[r], nr));
        if (cache.keep_inv_rms_) {
          cache.inv_rms_[il].narrow(1, t0, nr).t().copy_(inv_rms_batch.narrow(0, off[r], nr));
        }
      }
      if (cache.tap_mode_ == KeyTapMode::kStorePreNorm) {
        cache.keys_prenorm_[il].narrow(1, t0, nr).copy_(k.narrow(0, off[r], nr).transpose(0, 1));
      }
      cache.values_[il].narrow(1, t0, nr).copy_(v.narrow(0, off[r], nr).transpose(0, 1));

      const at::Tensor keys = cache.keys_[il];      // [H, capacity, D]
      const at::Tensor values = cache.values_[il];  // [H, capacity, D]
      for (int64_t i0 = 0; i0 < nr; i0 += block[r]) {
        const int64_t nb = std::min(block[r], nr - i0);
        // The block's queries are at positions [t0 + i0, t0 + i0 + nb): with a
        // window, none of them sees a key before first_key.
        const int64_t first_key = window > 0 ? std::max<int64_t>(0, t0 + i0 + 1 - window) : 0;
        const int64_t n_keys = t0 + i0 + nb - first_key;
        const at::Tensor qb =
            q_buf.narrow(1, off[r] + i0, nb).view({n_head_kv, nb * n_group, d});
        // Per kv head: each head's cached keys/values are a contiguous [T, D]
        // block; at::bmm over the strided [H, T, D] views of the line falls
        // back to a path far slower than one GEMM per head
        // (docs/model-runtime.md).
        at::Tensor scores = at::empty({n_head_kv, nb * n_group, n_keys}, options_);
        // HF order, q k^T then * scale, as the GEMM's alpha: the product is
        // rounded once and then scaled, as a separate multiply would, without
        // another pass over the scores (beta 0: dst's contents are ignored).
        for (int64_t hk = 0; hk < n_head_kv; ++hk) {
          at::Tensor dst = scores[hk];
          at::addmm_out(dst, dst, qb[hk], keys[hk].narrow(0, first_key, n_keys).t(), /*beta=*/0,
                        /*alpha=*/scale);
        }
        if (nb > 1) {
          scores.narrow(2, t0 + i0 - first_key, nb)
              .add_(diag_masks[r].narrow(0, 0, nb * n_group).narrow(1, 0, nb));
          if (window > 0 && window < nb + (t0 + i0 - first_key)) {
            scores.add_(WindowMask(nb, n_group, first_key, t0 + i0, n_keys, window, options_));
          }
        }
        const at::Tensor probs = bf16_softmax ? at::softmax(scores, -1, at::kFloat).to(dtype_)
                                              : at::softmax(scores, -1);
        at::Tensor out = at::empty({n_head_kv, nb * n_group, d}, options_);
        for (int64_t hk = 0; hk < n_head_kv; ++hk) {
          at::Tensor dst = out[hk];
          at::mm_out(dst, probs[hk], values[hk].narrow(0, first_key, n_keys));
        }
        if (single && nb == nr) {
          attn_buf = out.view({n_head_kv, nr, n_group, d});
        } else {
          attn_buf.narrow(1, off[r] + i0, nb).copy_(out.view({n_head_kv, nb, n_group, d}));
        }
      }
    }
    const at::Tensor attn =
        attn_buf.permute({1, 0, 2, 3}).reshape({total, q_dim});  // [T, Hq * D]
    const at::Tensor attn_out = Project(attn, w.o_proj, w.o_bias, mv);
    if (config_.sandwich_norms) {
      x.add_(ops::RmsNorm(attn_out, w.post_attention_layernorm, eps));
    } else {
      x.add_(attn_out);
    }

    const at::Tensor h2 = ops::RmsNorm(
        x, config_.sandwich_norms ? w.pre_feedforward_layernorm : w.post_attention_layernorm, eps);
    const at::Tensor mlp_out = w.router.defined() ? MixtureOfExperts(w, h2)
                                                  : Mlp(h2, w.gate_up, w.down_proj, ffn);
    if (config_.sandwich_norms) {
      x.add_(ops::RmsNorm(mlp_out, w.post_feedforward_layernorm, eps));
    } else {
      x.add_(mlp_out);
    }
  }
  if (pass.residuals != nullptr) (*pass.residuals)[config_.n_layer].copy_(x);
  if (rewrite) return {};
  for (size_t r = 0; r < n_rows; ++r) rows[r].cache->Commit(n[r], /*native=*/true);

  // The hidden states the rows want logits for: all of a row's, or its last.
  std::vector<int64_t> keep(n_rows);
  at::Tensor wanted;
  if (single) {
    keep[0] = rows[0].all_logits ? n[0] : 1;
    wanted = rows[0].all_logits ? x : x.narrow(0, n[0] - 1, 1);
  } else {
    std::vector<int64_t> index;
    for (size_t r = 0; r < n_rows; ++r) {
      keep[r] = rows[r].all_logits ? n[r] : 1;
      for (int64_t i = off[r + 1] - keep[r]; i < off[r + 1]; ++i) index.push_back(i);
    }
    wanted = x.index_select(
        0, at::tensor(index, at::TensorOptions().dtype(at::kLong)).to(options_.device()));
  }
  const at::Tensor h = ops::RmsNorm(wanted, norm_, eps);
  // One row: matrix-vector beats a 1-row GEMM here (docs/model-runtime.md).
  at::Tensor logits = Project(h, lm_head_, at::Tensor(), /*vector=*/true);
  if (config_.final_logit_softcapping > 0) {
    // In the model's dtype, as HF: logits / cap, tanh, * cap.
    const double cap = config_.final_logit_softcapping;
    logits.div_(cap).tanh_().mul_(cap);
  }
  if (logits.scalar_type() != at::kFloat) logits = logits.to(at::kFloat);
  if (single) return {logits};
  std::vector<at::Tensor> out;
  int64_t at_row = 0;
  for (size_t r = 0; r < n_rows; ++r) {
    out.push_back(logits.narrow(0, at_row, keep[r]));
    at_row += keep[r];
  }
  return out;
}

}  // namespace kvl
