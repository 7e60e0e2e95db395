// The cached decoder: a Qwen3-family (dense or MoE) / Llama-style / Gemma-3
// model prepared for fast
// inference (dtype/device chosen at load, q/k/v and gate/up weights fused once),
// running chunks of tokens against a KvCache line. Numerically it follows
// model/reference.h (the oracle it is tested against).
//
// Legend: T=tokens, V=vocab_size, E=hidden_size.
//
// Thread-safety: the weights are immutable after Create and Forward keeps no
// state between calls, so threads may run Forward at once on distinct cache
// lines (each line is used by one thread at a time). Cache lines it creates
// belong to the caller.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace kvl {

class KeyTransform;

struct DecoderOptions {
  at::ScalarType dtype = at::kFloat;
  std::string device = "cpu";
  // Query tokens per attention block: bounds the scores buffer
  // (n_head x block x context floats) independently of the prefill chunk.
  int64_t max_scores_bytes = 16 << 20;
  // kInvert unless a k-norm weight is exactly zero (k-norm is then not
  // invertible and pre-norm keys are kept).
  KeyTapMode tap_mode = KeyTapMode::kInvert;
  // Decode rows (one token) of a float32 model on the CPU take their attention
  // from ops::DecodeAttention, loops over the line's raw memory, instead of
  // per-head GEMMs; false keeps the tensor path (for A/B benchmarks).
  bool raw_decode_attention = true;
  // A step of one token in all (a lone session's decode) multiplies each
  // weight by a vector (at::mv: BLAS gemv, which streams the weight once)
  // instead of a one-row GEMM, which packs the whole weight matrix first;
  // false keeps the GEMMs (for A/B benchmarks).
  bool matrix_vector_decode = true;
};

class Decoder {
 public:
  // Converts the weights to dtype/device and fuses them. InvalidArgument for an
  // unsupported dtype/device or weights that do not match the config.
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(const ModelConfig& config,
                                                         const ModelWeights& weights,
                                                         const DecoderOptions& options);
  ~Decoder();

  const ModelConfig& config() const { return config_; }
  KeyTapMode tap_mode() const { return tap_mode_; }
  at::ScalarType dtype() const { return dtype_; }

  // A new, empty cache line for this model.
  std::unique_ptr<KvCache> NewCache() const;

  // Runs ids [T] (int64, any device) at positions [cache.Length(), + T) in one
  // chunk, appending their keys/values to the cache as a native span. Returns
  // float32 logits [T, V], or [1, V] for the last token when !all_logits.
  // Must run under c10::InferenceMode. Throws c10::Error on bad input.
  at::Tensor Forward(KvCache& cache, const at::Tensor& ids, bool all_logits);

  // Several lines in one forward (continuous batching, model/scheduler.h):
  // each row's ids run against its own line, as Forward would run them, with
  // the projections, the MLP and the LM head over all rows' tokens at once
  // (one GEMM each) and attention per row (ragged lengths, no padding).
  // Returns each row's logits as Forward does. Per row the result equals
  // Forward's up to the summation order a larger GEMM may choose (tests bound
  // the difference). The lines must be distinct. Throws c10::Error on bad
  // input; the lines are then left as they were.
  struct Row {
    KvCache* cache = nullptr;
    at::Tensor ids;  // [T] int64, T >= 1
    bool all_logits = false;
  };
  std::vector<at::Tensor> ForwardBatch(const std::vector<Row>& rows);

  // The native-depth dial's pass (router/router.h, docs/translators.md
  // "Native layers"): runs layers [first_layer, L) for the line's tokens at
  // [position, position + T) from their residual stream `hidden` [T, E] at
  // the input of first_layer (any float dtype; undefined with first_layer 0:
  // the embeddings of ids [T]), overwriting those layers' keys and values
  // there. Attention reads the line's keys and values of [0, position + T) as
  // they are (so these layers before `position` must hold what the model
  // would have written there). The line's length and spans are unchanged;
  // no logits. Must run under c10::InferenceMode. Throws c10::Error on bad
  // input (position + T past Length(), first_layer outside [0, L)).
  void ForwardLayers(KvCache& cache, int64_t position, const at::Tensor& ids,
                     const at::Tensor& hidden, int64_t first_layer);
  // Forward of one row that also returns the residual stream at the input
  // of every layer and of the final norm: [L + 1, T, E] float32 (layer L's
  // entry is what the final norm reads). For fitting residual maps
  // (training/residual_fit.h).
  at::Tensor ForwardResiduals(KvCache& cache, const at::Tensor& ids);

 private:
  // What a pass changes from ForwardBatch's (one row only when set).
  struct Pass {
    int64_t position = -1;     // >= 0: rewrite layers at [position, position + T)
    at::Tensor hidden;         // the residual at first_layer's input
    int64_t first_layer = 0;
    at::Tensor* residuals = nullptr;  // ForwardResiduals' output
  };
  std::vector<at::Tensor> RunRows(const std::vector<Row>& rows, const Pass& pass);
  struct Layer;
  Decoder() = default;
  // The gated MLP: down(act(gate(h)) * up(h)), gate and up fused as
  // [2 * ffn, E]; h: [T, E].
  at::Tensor Mlp(const at::Tensor& h, const at::Tensor& gate_up_weight,
                 const at::Tensor& down_weight, int64_t ffn) const;
  // A mixture-of-experts layer's MLP over h: [T, E] (ModelConfig, Qwen3-MoE).
  at::Tensor MixtureOfExperts(const Layer& w, const at::Tensor& h) const;

  ModelConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  at::TensorOptions options_;
  KeyTapMode tap_mode_ = KeyTapMode::kInvert;
  int64_t max_scores_bytes_ = 0;
  bool raw_decode_attention_ = true;
  bool matrix_vector_decode_ = true;
  at::Tensor embed_tokens_, norm_, lm_head_;
  double embed_scale_ = 1.0;  // config.scale_embeddings: sqrt(E) in the runtime dtype
  std::vector<Layer> layers_;
  std::shared_ptr<const KeyTransform> key_transform_;
};

}  // namespace kvl
