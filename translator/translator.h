// KV-cache translators (KV-Lingo, docs/design.md decisions 2-4): per target layer,
// one linear map for keys and one for values. Each reads the concatenated
// pre-norm keys (values) of the source layers assigned to that target layer,
// mixing all heads, and writes the target layer's pre-norm keys (values); the
// target cache then applies its own k-norm and RoPE (KvCache::Accept).
// translator/README.md documents the file format and the math.
//
// Legend: L_s/L_t = n_layer of source/target, H_s/H_t = n_head_kv,
// D_s/D_t = head_dim, T = tokens, ν = source layers assigned to one target layer.
//
// Map of target layer il (keys; values alike):
//   x = concat over s in assignment.keys[il] (list order) of source keys[s]
//       as [T, H_s*D_s] (head-major), so x is [T, ν*H_s*D_s]
//   y = x · weight^T + bias,  weight [H_t*D_t, ν*H_s*D_s], bias [H_t*D_t]
//   target keys[il] = y viewed as [T, H_t, D_t], returned as [H_t, T, D_t].
// With joint inputs (MapInputs::kJoint) both maps of target layer il read
//   x = [keys of assignment.keys[il], values of assignment.values[il]],
// [T, (ν_k+ν_v)*H_s*D_s]: a source layer's keys and values together carry its
// whole normed residual stream when 2*H_s*D_s >= d_model (translator/README.md).
// Token anchors (spec.anchor_window W > 0): every map also reads the target's
// own anchor rows of tokens t, t-1, ..., t-W+1, a = [table[id_t], table[id_{t-1}],
// ...] ([T, W*E], E = the table's width, zeros before the conversation's first
// token), through a second weight: y += a · anchor^T, anchor [H_t*D_t, W*E].
// The table ([V, E], stored in the file) is the target's token embeddings, RMS
// normalised: what the target's first layer reads, in the target's own basis,
// so that the maps need not carry token identity across two embeddings.
// Where it fits, Translate does not multiply the anchor rows: Create
// precomputes table·A_kᵀ for every token id and offset k (V·W rows of both
// sides' outputs, in the compute dtype: 100 MB in bfloat16 for kvl-small ->
// kvl-large) and Translate sums each token's W rows, a lookup instead of a
// GEMM W·E wide (several times the maps' own cost at the house shapes,
// docs/translators.md section 5). At a real vocabulary that lookup would take
// hundreds of GB; there the table has a low rank r (AnchorTable with a rank,
// ReduceAnchorRank), E = r, and Translate multiplies each token's W rows by
// the anchor weights, W·r per output.
//
// Thread-safety: a Translator is immutable after creation; Translate may be
// called from any number of threads at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/kv_cache.h"

namespace kvl {

// Per target layer, the source layers its map reads, in concatenation order.
struct LayerAssignment {
  std::vector<std::vector<int64_t>> keys;    // L_t lists
  std::vector<std::vector<int64_t>> values;  // L_t lists
};

// Target layer il reads source layer il. InvalidArgument unless L_s == L_t.
absl::StatusOr<LayerAssignment> SameIndexAssignment(int64_t n_layer_source,
                                                    int64_t n_layer_target);
// Target layer il reads the band of `band` consecutive source layers around
// c = round(il*(L_s-1)/(L_t-1)) (halves rounded up; c = 0 when L_t == 1): the
// band starts at c - floor((band-1)/2) and is shifted to lie within
// [0, L_s). Keys and values alike. InvalidArgument unless 1 <= band <= L_s.
absl::StatusOr<LayerAssignment> RelativeDepthAssignment(int64_t n_layer_source,
                                                        int64_t n_layer_target, int64_t band);
// From single-layer R² tables [L_t, L_s] (any float dtype): for each target
// layer the `band` source layers with the highest R², separately for keys and
// values, listed in ascending layer order (ties: lower layer first).
// InvalidArgument for bad shapes or band.
absl::StatusOr<LayerAssignment> TopR2Assignment(const at::Tensor& r2_keys,
                                                const at::Tensor& r2_values, int64_t band);

// What the maps read. kSplit: key maps read source keys, value maps source
// values (docs/design.md decision 3, the paper's maps). kJoint: both maps of a
// target layer read the keys of its key layers and the values of its value
// layers.
enum class MapInputs { kSplit, kJoint };
const char* MapInputsName(MapInputs inputs);  // "split" | "joint"
absl::StatusOr<MapInputs> ParseMapInputs(std::string_view name);

// The source as the maps index it: 2*L_s row blocks, keys of layers 0..L_s-1
// then values of layers 0..L_s-1 (the values of layer s are block L_s + s).
// Per target layer, the blocks each map reads, in concatenation order.
struct InputBlocks {
  std::vector<std::vector<int64_t>> keys, values;  // L_t lists each
};
InputBlocks InputBlocksOf(const LayerAssignment& assignment, MapInputs inputs,
                          int64_t n_layer_source);

// What one side of a translator was built for.
struct TranslatorEndpoint {
  std::string identity;        // ModelIdentity(config, weights)
  std::string tokenizer_hash;  // Tokenizer::content_hash()
  int64_t n_layer = 0, n_head_kv = 0, head_dim = 0;
};
TranslatorEndpoint EndpointOf(const ModelConfig& config, std::string identity,
                              std::string tokenizer_hash);

// How the maps were obtained; recorded in the file, not used to translate.
struct TranslatorTraining {
  std::string method = "closed_form";  // closed_form | distilled | identity
  std::string weighting = "uniform";   // uniform | attention
  std::string corpus;                  // data file(s) the moments came from
  double ridge = 0.0;
  int64_t n_sequences = 0, n_tokens = 0, steps = 0;
};

// How well the maps did on held-out data (`kvl eval-translator --stamp`,
// `kvl stamp-translator`); recorded in the file for the router's load-time
// quality gate (routing.gate.min_recovered / max_gap_nats).
struct TranslatorEvaluation {
  // Share of the prefix's benefit the translated cache recovers:
  // (no_prefix - translated) / (no_prefix - native) continuation NLL.
  double recovered = 0, recovered_se = 0;
  double gap_nats = 0, gap_se = 0;  // translated - native continuation NLL, nats/token
  std::string data;                 // the held-out data it was measured on
  int64_t windows = 0, prefix = 0, continuation = 0, native_tail = 0;
  std::string translate_dtype;      // the arithmetic it was measured in
  std::string measured_by;          // e.g. "kvl eval-translator"
};

// The native-depth dial (docs/translators.md, "Native layers"): at a switch
// with k native layers the target computes its top k layers' keys and values
// itself (Engine::ForwardLayers) from a predicted residual stream at the
// input of layer L_t - k; the layers below are translated. A residual map
// predicts that stream for each token from the keys and values of
// `source_layers` (pre-norm, as Translate reads them) and, with token
// anchors, the same anchor rows as the K/V maps:
//   x = [keys of source_layers..., values of source_layers...]  [T, 2*ν*H_s*D_s]
//   r = x · weightᵀ + bias (+ a · anchorᵀ, a [T, W*E] as translator.h's)
struct ResidualMap {
  int64_t layer = 0;                   // the target layer whose input it predicts, 1..L_t-1
  std::vector<int64_t> source_layers;  // ascending, in [0, L_s)
  at::Tensor weight;                   // [E_t, 2*ν*H_s*D_s] float32
  at::Tensor bias;                     // [E_t] float32
  at::Tensor anchor;                   // [E_t, W*E] float32; undefined without anchors
};

struct TranslatorSpec {
  TranslatorEndpoint source, target;
  std::string assignment_kind;  // same_index | relative_depth | top_r2 | greedy | custom
  int64_t band = 1;
  LayerAssignment assignment;
  MapInputs inputs = MapInputs::kSplit;
  bool bias = true;
  int64_t anchor_window = 0;  // W: tokens t..t-W+1 anchor each map; 0: no anchors
  TranslatorTraining training;       // the stage that produced these maps
  std::vector<TranslatorTraining> history;  // the stages before it, oldest first
  std::optional<TranslatorEvaluation> evaluation;  // unset: never measured
  // The native-depth dial's default for this pair (0: translate every
  // layer), and what it was chosen on (`kvl fit-residual --native-layers`,
  // experiments/native_depth). A k in [1, L_t) needs the residual map of
  // layer L_t - k; k >= L_t re-computes every layer.
  int64_t native_layers = 0;
  std::string native_layers_basis;
};

// The weights of one side (keys or values), per target layer.
struct TranslatorMaps {
  std::vector<at::Tensor> weight;  // L_t x [H_t*D_t, blocks*H_s*D_s] float32 (InputBlocks)
  std::vector<at::Tensor> bias;    // L_t x [H_t*D_t] float32; empty when !spec.bias
  std::vector<at::Tensor> anchor;  // L_t x [H_t*D_t, W*E] float32; empty without anchors
};

// The anchor table of a target model: its token embeddings [V, E], each row
// RMS normalised (x / sqrt(mean(x²) + eps), no weight), float32. With rank r
// in [1, E): the normalised rows in the basis of their top r principal
// directions (right singular vectors), [V, r], for maps fitted at rank r from
// the start (a real vocabulary's anchors: translator/README.md).
at::Tensor AnchorTable(const at::Tensor& embed_tokens, double rms_norm_eps, int64_t rank = 0);

// Rewrites token anchors for a table of rank r: *table [V, E] becomes
// table·H [V, r] (fewer columns when the table's own rank is lower) and each anchor weight's offset block A_k [H_t*D_t, E] (every
// layer, both sides) becomes A_k·G [H_t*D_t, r], with the rank-r pair (G, H)
// that best keeps every block's output over the table's rows (least squares
// over all V rows and blocks together, so no token is favoured). Returns the
// share of those outputs' squared norm kept. InvalidArgument without anchors
// or for r outside [1, E]. experiments/lowrank_anchors/README.md measures it.
absl::StatusOr<double> ReduceAnchorRank(int64_t window, int64_t rank, at::Tensor* table,
                                        TranslatorMaps* keys, TranslatorMaps* values);

// What Load checks a file against: the models and tokenizers about to use it.
struct TranslatorExpectation {
  std::string source_identity, target_identity;
  std::string source_tokenizer_hash, target_tokenizer_hash;
};

// The compute dtype that translates fastest on this CPU: bfloat16 where it has
// bfloat16 dot-product instructions (AVX512-BF16 or AMX-BF16, which oneDNN's
// bfloat16 GEMM uses), float32 elsewhere (bfloat16 products without them are
// emulated, no faster than float32 or much slower).
DType FastestTranslateDtype();

// Writes `evaluation` into a translator file's metadata, replacing any
// earlier one; the maps are copied unchanged. NotFound for a missing file,
// InvalidArgument for one that is not a translator file.
absl::Status StampTranslatorEvaluation(const std::string& path,
                                       const TranslatorEvaluation& evaluation);

class Translator {
 public:
  // Validates the spec (assignment lists in range, one list per target layer)
  // and the map shapes; InvalidArgument naming what is wrong. Weights are
  // converted to contiguous float32 CPU tensors. `compute`: the arithmetic of
  // Translate, float32 or bfloat16 (else InvalidArgument). bfloat16 rounds the
  // rows, maps and bias to bfloat16 (the maps once, here; oneDNN accumulates
  // in float32 and rounds the result to bfloat16) and is faster on CPUs with
  // bfloat16 dot products: docs/translators.md measures both speed and
  // quality.
  // With spec.anchor_window > 0, `anchor_table` [V, E] (AnchorTable) and the
  // maps' anchor weights are required; without, both must be absent. The
  // anchors are a lookup when its V·W rows of both sides' outputs fit in
  // max_anchor_lookup_bytes, else a product of each token's W table rows
  // with the anchor weights (W·E per output: small with a low-rank table).
  static absl::StatusOr<std::unique_ptr<Translator>> Create(
      TranslatorSpec spec, TranslatorMaps keys, TranslatorMaps values,
      DType compute = DType::kFloat32, at::Tensor anchor_table = {},
      int64_t max_anchor_lookup_bytes = kMaxAnchorLookupBytes);
  // The largest anchor lookup Create builds (1 GiB: kvl-small -> kvl-large's
  // is 100 MB in bfloat16; a real vocabulary's is hundreds of GB).
  static constexpr int64_t kMaxAnchorLookupBytes = int64_t{1} << 30;
  // Reads a translator file. InvalidArgument for a file that is not a valid
  // translator (corrupt or truncated safetensors, missing or malformed
  // metadata, unsupported format version, missing tensor, wrong shape) or an
  // unsupported `compute`; NotFound when the file does not exist;
  // FailedPrecondition naming the model or tokenizer that differs from
  // `expect`.
  static absl::StatusOr<std::unique_ptr<Translator>> Load(const std::string& path,
                                                          const TranslatorExpectation& expect,
                                                          DType compute = DType::kFloat32);
  // Writes the file (safetensors, metadata under __metadata__["kvlingo_translator"]).
  absl::Status Save(const std::string& path) const;

  // Adds residual maps (replacing any for the same layers), and sets the
  // stamped default of native layers. Call before the translator is shared
  // (it is immutable from then on). InvalidArgument for a layer outside
  // [1, L_t), source layers out of range, shapes that do not match, anchors
  // present or absent unlike the K/V maps', or a default k in [1, L_t)
  // without the map it needs.
  absl::Status SetResidualMaps(std::vector<ResidualMap> maps, int64_t native_layers,
                               std::string basis);
  const std::vector<ResidualMap>& residual_maps() const { return residual_; }
  // The map predicting target layer `layer`'s input; null when there is none.
  const ResidualMap* ResidualFor(int64_t layer) const;
  // The target's predicted residual stream at the input of `layer` for the
  // span whose taps are `source` (Translate's), [T, E_t] float32 on
  // device(). ids as Translate's. NotFound without a map for the layer;
  // InvalidArgument as Translate's.
  absl::StatusOr<at::Tensor> PredictResidual(const KvTaps& source, int64_t layer,
                                             const std::vector<int64_t>& ids = {}) const;

  // Places what Translate computes with (the maps in the compute dtype and
  // the anchors) on `device` ("cpu", "cuda", "cuda:N", or any device
  // LibTorch names, such as "meta" in tests); Translate then reads taps on
  // that device and returns its products there. key_maps(), value_maps()
  // and anchor_table() stay float32 on the CPU (Save and training read
  // them). Off the CPU the anchors are a product even where a lookup would
  // fit (the lookup's sum is a CPU loop). InvalidArgument for a name
  // LibTorch does not parse or a device it cannot place tensors on; the
  // translator is unchanged then.
  absl::Status MoveTo(const std::string& device);
  const at::Device& device() const { return device_; }

  const TranslatorSpec& spec() const { return spec_; }
  // The maps as created or loaded, float32 whatever the compute dtype.
  const TranslatorMaps& key_maps() const { return keys_; }
  const TranslatorMaps& value_maps() const { return values_; }
  DType compute_dtype() const { return compute_; }
  const at::Tensor& anchor_table() const { return anchor_table_; }  // undefined without anchors
  // Whether the anchors are a lookup (else a product per token; Create).
  bool anchor_lookup() const { return anchor_lookup_.defined(); }

  // What Translate returns.
  enum class Output {
    // Contiguous float32 tensors.
    kFloat32,
    // The products themselves, [L_t, H_t, T, D_t] views in compute_dtype()
    // with strides that permute the product's rows (head vectors stay
    // contiguous): no copy after the product. KvCache::Accept of a float32
    // line reads them as they are, converting each element exactly, so the
    // line holds the same bits as from kFloat32, with half the memory traffic
    // of a switch's translation in bfloat16 (docs/translators.md, "Switch
    // cost"). The router's path.
    kProduct,
  };
  // source: keys/values [L_s, H_s, T, D_s] before k-norm/RoPE (KvCache::Taps),
  // any float dtype. Returns [L_t, H_t, T, D_t] keys and values for
  // KvCache::Accept of the target, computed in compute_dtype(), as `output`
  // says. Runs under c10::InferenceMode (the result is an inference tensor).
  // ids: with token anchors, the span's T token ids preceded by up to W-1 of
  // the ids before it (fewer only at the conversation's start); ignored
  // without. unread (empty, or one count per target layer: the target's
  // ModelConfig::UnreadTokens of the span): layer il's first unread[il]
  // tokens are not computed, nor the source rows that only they would read
  // (a sliding target layer's translation costs its window, not the span);
  // they are zeros in kFloat32 output and left unwritten in kProduct views,
  // which KvCache::Accept with the same counts never reads (writing them
  // cost about a third of a thin switch's first token at 4k tokens:
  // experiments/thin_spans). InvalidArgument on shape mismatch, taps on
  // another device than device(), missing ids, an id outside the table, or
  // unread counts of another length or outside [0, T].
  absl::StatusOr<KvTaps> Translate(const KvTaps& source, Output output = Output::kFloat32,
                                   const std::vector<int64_t>& ids = {},
                                   const std::vector<int64_t>& unread = {}) const;

 private:
  // Maps stacked for one batched product when every target layer reads the
  // same number of source layers: x [L_t, T, in] -> baddbmm with w_t [L_t, in, out].
  // Used for short spans; long ones run one addmm per layer (README.md).
  // When every target layer reads the same source layers (e.g. band = L_s),
  // all maps share one input: one product x [T, ν*in] · shared_weight_t
  // [ν*in, L_t*H_t*D_t] computes every layer at once, for any span length.
  struct Stacked {
    bool uniform = false;
    at::Tensor index;     // [L_t*ν] int64 source layers, row-major per target layer
    at::Tensor weight_t;  // [L_t, ν*H_s*D_s, H_t*D_t]
    at::Tensor bias;      // [L_t, 1, H_t*D_t] (zeros when !spec.bias)
    bool shared = false;
    at::Tensor shared_weight_t;  // [ν*H_s*D_s, L_t*H_t*D_t]
    at::Tensor shared_bias;      // [L_t*H_t*D_t] (zeros when !spec.bias)
  };
  // The maps of one side as Apply reads them, in the compute dtype.
  struct Prepared {
    TranslatorMaps maps;  // per-layer path (only when !stacked.shared)
    Stacked stacked;
  };
  Translator() = default;
  // rows: the source's tokens [first, T) as [2*L_s, T - first, H_s*D_s]
  // blocks (InputBlocks), in the compute dtype, first = the least of
  // `unread` (0 when empty); lists: one side's blocks. [L_t, H_t, T, D_t] as
  // `output` says, layer il's first unread[il] tokens zeros.
  at::Tensor Apply(const at::Tensor& rows, const std::vector<std::vector<int64_t>>& lists,
                   const Prepared& prepared, Output output,
                   const std::vector<int64_t>& unread) const;

  // Adds the anchors' contribution to a span's tokens, from Translate's ids,
  // into out's keys and values ([L_t, H_t, T, D_t], as Apply returned them),
  // a chunk of tokens at a time through one small float32 buffer; in each
  // chunk, only to the layers that read some of its tokens (`unread`, as
  // Translate's).
  absl::Status AddAnchors(const std::vector<int64_t>& ids, const std::vector<int64_t>& unread,
                          KvTaps* out) const;
  // Both sides' anchor weights [W*E, 2*L_t*H_t*D_t] (keys' columns first),
  // float32 on the CPU; and the table with a zero row after it [V+1, E] in
  // `element`: what the anchors' product reads.
  at::Tensor AnchorWeight() const;
  at::Tensor AnchorRows(at::ScalarType element) const;

  TranslatorSpec spec_;
  InputBlocks blocks_;
  TranslatorMaps keys_, values_;  // float32, as created or loaded
  at::Tensor anchor_table_;       // [V, E] float32; undefined without anchors
  // [V, W, 2*L_t*H_t*D_t] in the compute dtype: [id, k] holds table[id]·A_kᵀ
  // of the keys' then the values' maps, every layer.
  // undefined when it would exceed max_anchor_lookup_bytes; then:
  at::Tensor anchor_lookup_;
  // [V+1, E] the table and a zero row (index V: before the conversation's
  // start), and [W*E, 2*L_t*H_t*D_t] the anchor weights of both sides, in the
  // compute dtype; undefined with a lookup.
  at::Tensor anchor_rows_, anchor_weight_;
  DType compute_ = DType::kFloat32;
  Prepared prepared_keys_, prepared_values_;
  std::vector<ResidualMap> residual_;  // float32 on the CPU, by layer
  // Per residual map (same order): weightᵀ and bias in the compute dtype, and
  // anchorᵀ float32, on device(); and the anchor table with a zero row after
  // it [V+1, E] float32 on device() (undefined without maps or anchors).
  struct PreparedResidual {
    at::Tensor weight_t, bias, anchor_t;
  };
  std::vector<PreparedResidual> residual_prepared_;
  at::Tensor residual_anchor_rows_;
  // Builds residual_prepared_ and residual_anchor_rows_ on `device`.
  void PrepareResidual(const at::Device& device);
  at::Device device_ = at::kCPU;
};

}  // namespace kvl
