#include "translator/translator.h"

#include <ATen/ATen.h>
#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

constexpr char kMetadataKey[] = "kvlingo_translator";
constexpr char kFormatName[] = "kvlingo-translator";
// Version 2 adds token anchors; files without anchors are written as version 1,
// so that they keep their bytes and older builds read them.
constexpr int kFormatVersion = 1;
constexpr int kAnchorFormatVersion = 2;
// Spans up to this long run as one baddbmm over all target layers; longer ones
// as one addmm per layer, which reads the source rows in place instead of
// gathering a [L_t, T, ν*H_s*D_s] copy. On the house shapes batched wins below
// about this length and per-layer above (measured: translator/README.md).
constexpr int64_t kBatchedMaxTokens = 256;

absl::Status CheckLists(const std::vector<std::vector<int64_t>>& lists, int64_t n_layer_source,
                        int64_t n_layer_target, const char* side) {
  if (static_cast<int64_t>(lists.size()) != n_layer_target) {
    return absl::InvalidArgumentError(absl::StrCat("assignment for ", side, " has ", lists.size(),
                                                   " target layers, expected ", n_layer_target));
  }
  for (size_t il = 0; il < lists.size(); ++il) {
    if (lists[il].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("assignment for ", side, " of target layer ", il, " is empty"));
    }
    for (int64_t s : lists[il]) {
      if (s < 0 || s >= n_layer_source) {
        return absl::InvalidArgumentError(absl::StrCat("assignment for ", side, " of target layer ",
                                                       il, " names source layer ", s,
                                                       " (source has ", n_layer_source, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckEndpoint(const TranslatorEndpoint& e, const char* which) {
  if (e.n_layer <= 0 || e.n_head_kv <= 0 || e.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(which, " shape must be positive, got n_layer ",
                                                   e.n_layer, ", n_head_kv ", e.n_head_kv,
                                                   ", head_dim ", e.head_dim));
  }
  return absl::OkStatus();
}

// Validates and normalises one side's maps to contiguous float32 CPU tensors.
// anchor_in: W*E, the width of a map's anchor rows (0 without anchors).
absl::Status PrepareMaps(const TranslatorSpec& spec, const std::vector<std::vector<int64_t>>& lists,
                         const char* side, int64_t anchor_in, TranslatorMaps& maps) {
  const int64_t n_layer = spec.target.n_layer;
  const int64_t out = spec.target.n_head_kv * spec.target.head_dim;
  const int64_t in_per_layer = spec.source.n_head_kv * spec.source.head_dim;
  if (static_cast<int64_t>(maps.weight.size()) != n_layer) {
    return absl::InvalidArgumentError(absl::StrCat(side, ": ", maps.weight.size(),
                                                   " weights for ", n_layer, " target layers"));
  }
  if (spec.bias != !maps.bias.empty() ||
      (spec.bias && static_cast<int64_t>(maps.bias.size()) != n_layer)) {
    return absl::InvalidArgumentError(absl::StrCat(side, ": ", maps.bias.size(), " biases, spec ",
                                                   spec.bias ? "has" : "has no", " bias"));
  }
  const bool anchored = spec.anchor_window > 0;
  if (anchored != !maps.anchor.empty() ||
      (anchored && static_cast<int64_t>(maps.anchor.size()) != n_layer)) {
    return absl::InvalidArgumentError(absl::StrCat(side, ": ", maps.anchor.size(),
                                                   " anchor weights, spec has anchor window ",
                                                   spec.anchor_window));
  }
  for (int64_t il = 0; il < n_layer; ++il) {
    const int64_t in = in_per_layer * static_cast<int64_t>(lists[il].size());
    if (anchored) {
      at::Tensor& a = maps.anchor[il];
      if (!a.defined() || a.dim() != 2 || a.size(0) != out || !a.is_floating_point() ||
          a.size(1) != anchor_in) {
        return absl::InvalidArgumentError(
            absl::StrCat(side, ".", il, ".anchor must be float [", out, ", ", anchor_in, "], got ",
                         a.defined() ? c10::str(a.sizes()) : std::string("undefined")));
      }
      a = a.detach().to(at::kCPU, at::kFloat).contiguous();
    }
    at::Tensor& w = maps.weight[il];
    if (!w.defined() || w.dim() != 2 || w.size(0) != out || w.size(1) != in) {
      return absl::InvalidArgumentError(
          absl::StrCat(side, ".", il, ".weight must be [", out, ", ", in, "], got ",
                       w.defined() ? c10::str(w.sizes()) : std::string("undefined")));
    }
    if (!w.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(side, ".", il, ".weight is not float"));
    }
    w = w.detach().to(at::kCPU, at::kFloat).contiguous();
    if (spec.bias) {
      at::Tensor& b = maps.bias[il];
      if (!b.defined() || b.dim() != 1 || b.size(0) != out || !b.is_floating_point()) {
        return absl::InvalidArgumentError(
            absl::StrCat(side, ".", il, ".bias must be float [", out, "], got ",
                         b.defined() ? c10::str(b.sizes()) : std::string("undefined")));
      }
      b = b.detach().to(at::kCPU, at::kFloat).contiguous();
    }
  }
  return absl::OkStatus();
}

nlohmann::json EndpointToJson(const TranslatorEndpoint& e) {
  return {{"identity", e.identity},   {"tokenizer_hash", e.tokenizer_hash},
          {"n_layer", e.n_layer},     {"n_head_kv", e.n_head_kv},
          {"head_dim", e.head_dim}};
}

nlohmann::json TrainingToJson(const TranslatorTraining& t) {
  return {{"method", t.method},           {"weighting", t.weighting},
          {"corpus", t.corpus},           {"ridge", t.ridge},
          {"n_sequences", t.n_sequences}, {"n_tokens", t.n_tokens},
          {"steps", t.steps}};
}

TranslatorTraining TrainingFromJson(const nlohmann::json& j) {
  TranslatorTraining t;
  t.method = j.at("method").get<std::string>();
  t.weighting = j.at("weighting").get<std::string>();
  t.corpus = j.at("corpus").get<std::string>();
  t.ridge = j.at("ridge").get<double>();
  t.n_sequences = j.at("n_sequences").get<int64_t>();
  t.n_tokens = j.at("n_tokens").get<int64_t>();
  t.steps = j.at("steps").get<int64_t>();
  return t;
}

nlohmann::json EvaluationToJson(const TranslatorEvaluation& e) {
  return {{"recovered", e.recovered},       {"recovered_se", e.recovered_se},
          {"gap_nats", e.gap_nats},         {"gap_se", e.gap_se},
          {"data", e.data},                 {"windows", e.windows},
          {"prefix", e.prefix},             {"continuation", e.continuation},
          {"native_tail", e.native_tail},   {"translate_dtype", e.translate_dtype},
          {"measured_by", e.measured_by}};
}

TranslatorEvaluation EvaluationFromJson(const nlohmann::json& j) {
  TranslatorEvaluation e;
  e.recovered = j.at("recovered").get<double>();
  e.recovered_se = j.value("recovered_se", 0.0);
  e.gap_nats = j.at("gap_nats").get<double>();
  e.gap_se = j.value("gap_se", 0.0);
  e.data = j.value("data", std::string());
  e.windows = j.value("windows", int64_t{0});
  e.prefix = j.value("prefix", int64_t{0});
  e.continuation = j.value("continuation", int64_t{0});
  e.native_tail = j.value("native_tail", int64_t{0});
  e.translate_dtype = j.value("translate_dtype", std::string());
  e.measured_by = j.value("measured_by", std::string());
  return e;
}

TranslatorEndpoint EndpointFromJson(const nlohmann::json& j) {
  TranslatorEndpoint e;
  e.identity = j.at("identity").get<std::string>();
  e.tokenizer_hash = j.at("tokenizer_hash").get<std::string>();
  e.n_layer = j.at("n_layer").get<int64_t>();
  e.n_head_kv = j.at("n_head_kv").get<int64_t>();
  e.head_dim = j.at("head_dim").get<int64_t>();
  return e;
}

std::string ShortHash(const std::string& h) { return h.size() > 16 ? h.substr(0, 16) + "…" : h; }

}  // namespace

at::Tensor AnchorTable(const at::Tensor& embed_tokens, double rms_norm_eps, int64_t rank) {
  c10::InferenceMode guard;
  const at::Tensor x = embed_tokens.detach().to(at::kCPU, at::kFloat);
  const at::Tensor table = x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + rms_norm_eps);
  if (rank <= 0 || rank >= table.size(1)) return table.contiguous();
  // The right singular vectors are the eigenvectors of tableᵀ·table [E, E]
  // (eigh: ascending, so the top r are the last columns).
  const at::Tensor gram = at::mm(table.t().to(at::kDouble), table.to(at::kDouble));
  const at::Tensor basis = std::get<1>(at::linalg_eigh(gram)).narrow(1, gram.size(0) - rank, rank);
  return at::mm(table, basis.flip({1}).to(at::kFloat)).contiguous();
}

absl::StatusOr<double> ReduceAnchorRank(int64_t window, int64_t rank, at::Tensor* table,
                                        TranslatorMaps* keys, TranslatorMaps* values) {
  if (window <= 0 || table == nullptr || !table->defined() || table->dim() != 2) {
    return absl::InvalidArgumentError("anchor rank: the translator has no token anchors");
  }
  const int64_t e = table->size(1);
  if (rank < 1 || rank > e) {
    return absl::InvalidArgumentError(
        absl::StrCat("anchor rank must be in [1, ", e, "] (the table's width), got ", rank));
  }
  c10::InferenceMode guard;
  // table = U S Vᵀ. Every block's output over the table is U·M_k with
  // M_k = S Vᵀ A_kᵀ; the best rank-r approximation of M = [M_1 ...] is
  // L Lᵀ M (L: the top r eigenvectors of M Mᵀ = S Vᵀ (Σ A_kᵀ A_k) V S).
  // So the new table is U L = table·V S⁻¹ L and A_k's new block is
  // (Lᵀ M_k)ᵀ = A_k·V S L.
  const at::Tensor t64 = table->to(at::kDouble);
  const auto [eigenvalues, eigenvectors] = at::linalg_eigh(at::mm(t64.t(), t64));
  const at::Tensor keep = eigenvalues > eigenvalues.max() * 1e-12;
  const at::Tensor s = eigenvalues.index({keep}).sqrt();                 // [E']
  const at::Tensor v = eigenvectors.index({at::indexing::Slice(), keep});  // [E, E']
  at::Tensor moment = at::zeros({e, e}, at::kDouble);      // Σ A_kᵀ A_k
  for (TranslatorMaps* maps : {keys, values}) {
    for (const at::Tensor& a : maps->anchor) {
      for (int64_t k = 0; k < window; ++k) {
        const at::Tensor block = a.narrow(1, k * e, e).to(at::kDouble);
        moment.add_(at::mm(block.t(), block));
      }
    }
  }
  const at::Tensor vs = v * s;  // V S [E, E']
  const at::Tensor mmt = at::mm(at::mm(vs.t(), moment), vs);
  const auto [lambda_all, l_all] = at::linalg_eigh(mmt);  // ascending
  const int64_t r = std::min<int64_t>(rank, mmt.size(0));
  const at::Tensor l = l_all.narrow(1, mmt.size(0) - r, r).flip({1});  // [E', r]
  const double total = lambda_all.clamp_min(0).sum().item<double>();
  const double kept =
      total > 0 ? lambda_all.narrow(0, mmt.size(0) - r, r).clamp_min(0).sum().item<double>() / total
                : 1.0;
  const at::Tensor g = at::mm(vs, l).to(at::kFloat);      // V S L [E, r]
  const at::Tensor h = at::mm(v / s, l).to(at::kFloat);   // V S⁻¹ L [E, r]
  *table = at::mm(*table, h).contiguous();
  for (TranslatorMaps* maps : {keys, values}) {
    for (at::Tensor& a : maps->anchor) {
      std::vector<at::Tensor> blocks;
      for (int64_t k = 0; k < window; ++k) blocks.push_back(at::mm(a.narrow(1, k * e, e), g));
      a = at::cat(blocks, 1).contiguous();
    }
  }
  return kept;
}

const char* MapInputsName(MapInputs inputs) {
  return inputs == MapInputs::kJoint ? "joint" : "split";
}

absl::StatusOr<MapInputs> ParseMapInputs(std::string_view name) {
  if (name == "split") return MapInputs::kSplit;
  if (name == "joint") return MapInputs::kJoint;
  return absl::InvalidArgumentError(
      absl::StrCat("map inputs must be split or joint, got '", std::string(name), "'"));
}

InputBlocks InputBlocksOf(const LayerAssignment& assignment, MapInputs inputs,
                          int64_t n_layer_source) {
  InputBlocks blocks;
  const size_t n_layer_target = std::min(assignment.keys.size(), assignment.values.size());
  for (size_t il = 0; il < n_layer_target; ++il) {
    std::vector<int64_t> keys = assignment.keys[il];
    std::vector<int64_t> values = assignment.values[il];
    for (int64_t& s : values) s += n_layer_source;
    if (inputs == MapInputs::kJoint) {
      keys.insert(keys.end(), values.begin(), values.end());
      values = keys;
    }
    blocks.keys.push_back(std::move(keys));
    blocks.values.push_back(std::move(values));
  }
  return blocks;
}

absl::StatusOr<LayerAssignment> SameIndexAssignment(int64_t n_layer_source,
                                                    int64_t n_layer_target) {
  if (n_layer_source != n_layer_target || n_layer_source <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("same_index needs equal depths, got source ",
                                                   n_layer_source, " and target ",
                                                   n_layer_target, " layers"));
  }
  LayerAssignment a;
  for (int64_t il = 0; il < n_layer_target; ++il) {
    a.keys.push_back({il});
    a.values.push_back({il});
  }
  return a;
}

absl::StatusOr<LayerAssignment> RelativeDepthAssignment(int64_t n_layer_source,
                                                        int64_t n_layer_target, int64_t band) {
  if (n_layer_source <= 0 || n_layer_target <= 0) {
    return absl::InvalidArgumentError("relative_depth needs positive layer counts");
  }
  if (band < 1 || band > n_layer_source) {
    return absl::InvalidArgumentError(
        absl::StrCat("band must be in [1, ", n_layer_source, "], got ", band));
  }
  LayerAssignment a;
  for (int64_t il = 0; il < n_layer_target; ++il) {
    // round(il*(L_s-1)/(L_t-1)) with halves up, in exact integer arithmetic.
    const int64_t den = n_layer_target - 1;
    const int64_t center = den == 0 ? 0 : (2 * il * (n_layer_source - 1) + den) / (2 * den);
    const int64_t start =
        std::clamp<int64_t>(center - (band - 1) / 2, 0, n_layer_source - band);
    std::vector<int64_t> list(band);
    std::iota(list.begin(), list.end(), start);
    a.keys.push_back(list);
    a.values.push_back(std::move(list));
  }
  return a;
}

absl::StatusOr<LayerAssignment> TopR2Assignment(const at::Tensor& r2_keys,
                                                const at::Tensor& r2_values, int64_t band) {
  if (!r2_keys.defined() || !r2_values.defined() || r2_keys.dim() != 2 ||
      !r2_keys.sizes().equals(r2_values.sizes())) {
    return absl::InvalidArgumentError("top_r2 needs two R² tables [L_t, L_s] of equal shape");
  }
  const int64_t n_layer_target = r2_keys.size(0), n_layer_source = r2_keys.size(1);
  if (band < 1 || band > n_layer_source) {
    return absl::InvalidArgumentError(
        absl::StrCat("band must be in [1, ", n_layer_source, "], got ", band));
  }
  LayerAssignment a;
  for (const auto& [table, out] : {std::pair{&r2_keys, &a.keys}, {&r2_values, &a.values}}) {
    const at::Tensor t = table->to(at::kCPU, at::kDouble).contiguous();
    const double* p = t.data_ptr<double>();
    for (int64_t il = 0; il < n_layer_target; ++il) {
      std::vector<int64_t> order(n_layer_source);
      std::iota(order.begin(), order.end(), 0);
      const double* row = p + il * n_layer_source;
      std::stable_sort(order.begin(), order.end(),
                       [row](int64_t x, int64_t y) { return row[x] > row[y]; });
      order.resize(band);
      std::sort(order.begin(), order.end());
      out->push_back(std::move(order));
    }
  }
  return a;
}

TranslatorEndpoint EndpointOf(const ModelConfig& config, std::string identity,
                              std::string tokenizer_hash) {
  TranslatorEndpoint e;
  e.identity = std::move(identity);
  e.tokenizer_hash = std::move(tokenizer_hash);
  e.n_layer = config.n_layer;
  e.n_head_kv = config.n_head_kv;
  e.head_dim = config.head_dim;
  return e;
}

absl::StatusOr<std::unique_ptr<Translator>> Translator::Create(TranslatorSpec spec,
                                                               TranslatorMaps keys,
                                                               TranslatorMaps values,
                                                               DType compute,
                                                               at::Tensor anchor_table,
                                                               int64_t max_anchor_lookup_bytes) {
  if (compute != DType::kFloat32 && compute != DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "translators compute in float32 or bfloat16, not ", DTypeName(compute)));
  }
  KVL_RETURN_IF_ERROR(CheckEndpoint(spec.source, "source"));
  KVL_RETURN_IF_ERROR(CheckEndpoint(spec.target, "target"));
  for (const auto& [lists, side] :
       {std::pair{&spec.assignment.keys, "keys"}, {&spec.assignment.values, "values"}}) {
    KVL_RETURN_IF_ERROR(CheckLists(*lists, spec.source.n_layer, spec.target.n_layer, side));
  }
  if (spec.anchor_window < 0) return absl::InvalidArgumentError("negative anchor window");
  const bool anchored = spec.anchor_window > 0;
  if (anchored != anchor_table.defined()) {
    return absl::InvalidArgumentError(anchored ? "anchor window set but no anchor table"
                                               : "an anchor table without an anchor window");
  }
  if (anchored && (anchor_table.dim() != 2 || anchor_table.size(0) < 1 ||
                   anchor_table.size(1) < 1 || !anchor_table.is_floating_point())) {
    return absl::InvalidArgumentError(absl::StrCat("anchor table must be float [V, E], got ",
                                                   c10::str(anchor_table.sizes())));
  }
  const int64_t anchor_in = anchored ? spec.anchor_window * anchor_table.size(1) : 0;
  InputBlocks blocks = InputBlocksOf(spec.assignment, spec.inputs, spec.source.n_layer);
  try {
    KVL_RETURN_IF_ERROR(PrepareMaps(spec, blocks.keys, "keys", anchor_in, keys));
    KVL_RETURN_IF_ERROR(PrepareMaps(spec, blocks.values, "values", anchor_in, values));
    std::unique_ptr<Translator> t(new Translator());
    t->spec_ = std::move(spec);
    t->blocks_ = std::move(blocks);
    t->keys_ = std::move(keys);
    t->values_ = std::move(values);
    t->compute_ = compute;
    const int64_t out = t->spec_.target.n_head_kv * t->spec_.target.head_dim;
    if (anchored) {
      t->anchor_table_ = anchor_table.detach().to(at::kCPU, at::kFloat).contiguous();
      // The anchors' contribution per token and offset, looked up instead of
      // multiplied at each switch: [id, k] holds table[id] · A_kᵀ for both
      // sides ([keys | values], each [L_t*H_t*D_t]).
      const int64_t w = t->spec_.anchor_window, e = t->anchor_table_.size(1);
      const int64_t vocab = t->anchor_table_.size(0), width = t->spec_.target.n_layer * out;
      const at::ScalarType element = compute == DType::kBFloat16 ? at::kBFloat16 : at::kFloat;
      const at::Tensor weight = t->AnchorWeight();
      const int64_t lookup_bytes =
          vocab * w * 2 * width * static_cast<int64_t>(c10::elementSize(element));
      if (lookup_bytes <= max_anchor_lookup_bytes) {
        at::Tensor lookup = at::empty({vocab, w, 2 * width}, at::kFloat);
        for (int64_t k = 0; k < w; ++k) {
          lookup.select(1, k).copy_(at::mm(t->anchor_table_, weight.narrow(0, k * e, e)));
        }
        t->anchor_lookup_ = lookup.to(element).contiguous();
      } else {
        t->anchor_rows_ = t->AnchorRows(element);
        t->anchor_weight_ = weight.to(element).contiguous();
      }
    }
    // Copies in the compute dtype (none for float32: the maps are shared).
    auto in_compute = [compute](const at::Tensor& x) {
      return x.defined() && compute == DType::kBFloat16 ? x.to(at::kBFloat16).contiguous() : x;
    };
    for (const auto& [lists, maps, prepared] :
         {std::tuple{&t->blocks_.keys, &t->keys_, &t->prepared_keys_},
          {&t->blocks_.values, &t->values_, &t->prepared_values_}}) {
      Stacked& stacked = prepared->stacked;
      const auto& first = lists->front();  // a structured binding cannot be captured (C++17)
      stacked.shared = std::all_of(lists->begin(), lists->end(),
                                   [&first](const auto& l) { return l == first; });
      if (stacked.shared) {
        // Rows of layer il's map land at columns [il*out, (il+1)*out).
        stacked.shared_weight_t = in_compute(at::cat(maps->weight, 0).t().contiguous());
        stacked.shared_bias = in_compute(
            maps->bias.empty() ? at::zeros({t->spec_.target.n_layer * out}, at::kFloat)
                               : at::cat(maps->bias, 0).contiguous());
        continue;  // Apply uses the shared product only
      }
      for (const at::Tensor& w : maps->weight) prepared->maps.weight.push_back(in_compute(w));
      for (const at::Tensor& b : maps->bias) prepared->maps.bias.push_back(in_compute(b));
      const size_t band = lists->front().size();
      stacked.uniform = std::all_of(lists->begin(), lists->end(),
                                    [band](const auto& l) { return l.size() == band; });
      if (!stacked.uniform) continue;
      std::vector<int64_t> flat;
      for (const auto& l : *lists) flat.insert(flat.end(), l.begin(), l.end());
      stacked.index = at::tensor(flat, at::kLong);
      stacked.weight_t = in_compute(at::stack(maps->weight).transpose(1, 2).contiguous());
      stacked.bias = in_compute(maps->bias.empty()
                                    ? at::zeros({t->spec_.target.n_layer, 1, out}, at::kFloat)
                                    : at::stack(maps->bias).unsqueeze(1).contiguous());
    }
    return t;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("building translator: ", e.what_without_backtrace()));
  }
}

namespace {

// x's rows at `index` along dim 0. index_select copies whole rows on the CPU;
// off it, advanced indexing, which every device has (LibTorch 1.13 has no
// meta kernel for index_select, and the tests run the device paths on meta).
at::Tensor SelectRows(const at::Tensor& x, const at::Tensor& index) {
  return x.device().is_cpu() ? x.index_select(0, index) : x.index({index});
}

}  // namespace

at::Tensor Translator::AnchorWeight() const {
  // [W*E, 2*L_t*H_t*D_t]: both sides' anchor weights, keys' columns first.
  return at::cat({at::cat(keys_.anchor, 0).t(), at::cat(values_.anchor, 0).t()}, 1);
}

at::Tensor Translator::AnchorRows(at::ScalarType element) const {
  const at::Tensor zero = at::zeros({1, anchor_table_.size(1)}, at::kFloat);
  return at::cat({anchor_table_, zero}, 0).to(element).contiguous();
}

absl::Status Translator::MoveTo(const std::string& device_name) {
  at::Device device = at::kCPU;
  try {
    device = at::Device(device_name);
    // An empty tensor there: what LibTorch cannot place (CUDA without a
    // GPU, or without CUDA) throws here, before anything has moved.
    (void)at::empty({0}, at::TensorOptions().device(device));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("translator device \"", device_name,
                                                   "\": ", e.what_without_backtrace()));
  }
  try {
    auto to = [&device](at::Tensor& x) {
      if (x.defined()) x = x.to(device);
    };
    // Built whole before any member changes, so that a failure leaves the
    // translator as it was.
    Prepared keys = prepared_keys_, values = prepared_values_;
    for (Prepared* p : {&keys, &values}) {
      for (at::Tensor& w : p->maps.weight) to(w);
      for (at::Tensor& b : p->maps.bias) to(b);
      for (at::Tensor* x : {&p->stacked.index, &p->stacked.weight_t, &p->stacked.bias,
                            &p->stacked.shared_weight_t, &p->stacked.shared_bias}) {
        to(*x);
      }
    }
    at::Tensor lookup = anchor_lookup_, rows = anchor_rows_, weight = anchor_weight_;
    if (lookup.defined() && !device.is_cpu()) {
      // The lookup's sum runs on the CPU: off it, the product instead.
      rows = AnchorRows(lookup.scalar_type());
      weight = AnchorWeight().to(lookup.scalar_type()).contiguous();
      lookup = at::Tensor();
    }
    to(rows);
    to(weight);
    PrepareResidual(device);
    prepared_keys_ = std::move(keys);
    prepared_values_ = std::move(values);
    anchor_lookup_ = std::move(lookup);
    anchor_rows_ = std::move(rows);
    anchor_weight_ = std::move(weight);
    device_ = device;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("moving the translator to ", device_name, ": ",
                                            e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

at::Tensor Translator::Apply(const at::Tensor& x,
                             const std::vector<std::vector<int64_t>>& lists,
                             const Prepared& prepared, Output output,
                             const std::vector<int64_t>& unread) const {
  const TranslatorMaps& maps = prepared.maps;
  const Stacked& stacked = prepared.stacked;
  const int64_t n_rows = x.size(1), in_per_layer = x.size(2);
  const int64_t first = unread.empty() ? 0 : *std::min_element(unread.begin(), unread.end());
  const int64_t n_tokens = first + n_rows;
  const int64_t n_layer_target = spec_.target.n_layer;
  const int64_t width = spec_.target.n_head_kv * spec_.target.head_dim;
  const bool all_read = first == 0 && std::all_of(unread.begin(), unread.end(),
                                                  [](int64_t u) { return u == 0; });
  auto skip = [&unread](int64_t il) { return unread.empty() ? 0 : unread[il]; };
  // A permuted view of the product, [L_t, H_t, T, D_t]: as it is, or copied
  // in that order as float32 (one copy that also converts).
  auto to_output = [output](const at::Tensor& view) {
    if (output == Output::kProduct) return view;
    return at::empty(view.sizes(), view.options().dtype(at::kFloat)).copy_(view);
  };
  if (stacked.shared) {
    std::vector<at::Tensor> parts;
    for (int64_t s : lists.front()) parts.push_back(x[s]);
    const at::Tensor xs = parts.size() == 1 ? parts[0] : at::cat(parts, 1);  // [T', ν*in]
    at::Tensor y;  // [T, L_t*H_t*D_t]
    if (all_read) {
      y = at::addmm(stacked.shared_bias, xs, stacked.shared_weight_t);
    } else {
      // One product per run of consecutive layers with equal unread counts,
      // over the rows they read, into their columns of the product; the
      // unread rows zeroed only for a float32 result (Translate).
      y = at::empty({n_tokens, n_layer_target * width}, x.options());
      for (int64_t l0 = 0, l1 = 0; l0 < n_layer_target; l0 = l1) {
        const int64_t u = skip(l0);
        for (l1 = l0 + 1; l1 < n_layer_target && skip(l1) == u;) ++l1;
        const at::Tensor columns = y.narrow(1, l0 * width, (l1 - l0) * width);
        if (u > 0 && output != Output::kProduct) columns.narrow(0, 0, u).zero_();
        if (u == n_tokens) continue;
        at::Tensor read = columns.narrow(0, u, n_tokens - u);
        at::addmm_out(read, stacked.shared_bias.narrow(0, l0 * width, (l1 - l0) * width),
                      xs.narrow(0, u - first, n_tokens - u),
                      stacked.shared_weight_t.narrow(1, l0 * width, (l1 - l0) * width));
      }
    }
    // [T, L_t*H_t*D_t] -> [L_t, H_t, T, D_t]
    return to_output(
        y.view({n_tokens, n_layer_target, spec_.target.n_head_kv, spec_.target.head_dim})
            .permute({1, 2, 0, 3}));
  }
  at::Tensor y;  // [L_t, T, H_t*D_t]
  if (stacked.uniform && n_rows <= kBatchedMaxTokens) {
    const int64_t band = static_cast<int64_t>(lists.front().size());
    // [L_t*ν, T', in] -> [L_t, T', ν*in] with the ν blocks in list order.
    const at::Tensor xs = SelectRows(x, stacked.index)
                              .view({n_layer_target, band, n_rows, in_per_layer})
                              .permute({0, 2, 1, 3})
                              .reshape({n_layer_target, n_rows, band * in_per_layer});
    y = at::baddbmm(stacked.bias, xs, stacked.weight_t);
    if (!all_read) {
      // A short span: every layer's rows computed, the unread ones zeroed.
      at::Tensor full = at::zeros({n_layer_target, n_tokens, width}, x.options());
      full.narrow(1, first, n_rows).copy_(y);
      for (int64_t il = 0; il < n_layer_target; ++il) full[il].narrow(0, 0, skip(il)).zero_();
      y = full;
    }
  } else {
    y = at::empty({n_layer_target, n_tokens, width}, x.options());
    for (int64_t il = 0; il < n_layer_target; ++il) {
      const int64_t u = skip(il);
      if (u > 0 && output != Output::kProduct) y[il].narrow(0, 0, u).zero_();
      if (u == n_tokens) continue;
      std::vector<at::Tensor> parts;
      for (int64_t s : lists[il]) parts.push_back(x[s].narrow(0, u - first, n_tokens - u));
      const at::Tensor xi = parts.size() == 1 ? parts[0] : at::cat(parts, 1);
      at::Tensor yl = y[il].narrow(0, u, n_tokens - u);
      if (maps.bias.empty()) {
        at::mm_out(yl, xi, maps.weight[il].t());
      } else {
        at::addmm_out(yl, maps.bias[il], xi, maps.weight[il].t());
      }
    }
  }
  return to_output(
      y.view({n_layer_target, n_tokens, spec_.target.n_head_kv, spec_.target.head_dim})
          .permute({0, 2, 1, 3}));
}

DType FastestTranslateDtype() {
#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
  // clang 14 (the sanitizer and fuzz builds) knows no "amx-bf16" feature
  // name: AMX-BF16 is CPUID leaf 7, EDX bit 22.
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool amx_bf16 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 22) & 1;
  if (__builtin_cpu_supports("avx512bf16") || amx_bf16) return DType::kBFloat16;
#elif defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16")) {
    return DType::kBFloat16;
  }
#endif
  return DType::kFloat32;
}

namespace {

// o[c] += row[c] for c < d: the inner loop of AddAnchorRows, compiled for
// AVX-512, AVX2 and the baseline, the best chosen at load (the build targets
// generic x86-64, whose SSE2 makes this memory-bound sum compute-bound).
// Not under ThreadSanitizer: gcc instruments the clones' resolver, which the
// dynamic loader runs before TSan's runtime is up (the binary crashes at load).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#define KVL_ANCHOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVL_ANCHOR_CLONES
#endif
KVL_ANCHOR_CLONES void AddRow(const float* __restrict row, float* __restrict o, int64_t d) {
  for (int64_t c = 0; c < d; ++c) o[c] += row[c];
}
// The same for bfloat16 rows: a bfloat16 is a float32's upper 16 bits.
KVL_ANCHOR_CLONES void AddRow(const uint16_t* __restrict row, float* __restrict o, int64_t d) {
  for (int64_t c = 0; c < d; ++c) {
    const uint32_t bits = static_cast<uint32_t>(row[c]) << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    o[c] += x;
  }
}

// Rows [t0, t1) of a span's [T, D] anchor sum += for each position j of the
// span (j < 0: the W-1 tokens before it) and offset k, lookup[id_j, k] into
// row j + k: the anchors' contribution of token j to the tokens that read it,
// in the columns [c, c + n) of `columns` only (the layers some of these rows
// are read in). out holds rows t0..t1-1. Each token's W rows are read as one
// contiguous block when the columns are all of them.
template <typename Element>
void AddAnchorRows(const Element* table, int64_t d, const std::vector<int64_t>& padded, int64_t w,
                   int64_t t0, int64_t t1, const std::vector<std::pair<int64_t, int64_t>>& columns,
                   float* out) {
  const int64_t element = static_cast<int64_t>(sizeof(Element));
  for (int64_t j = t0 - (w - 1); j < t1; ++j) {
    // The blocks are scattered: fetch the next token's ahead, since the
    // hardware's prefetchers stop at each page boundary.
    if (j + 1 < t1 && padded[static_cast<size_t>(j + w)] >= 0) {
      const char* next =
          reinterpret_cast<const char*>(table + padded[static_cast<size_t>(j + w)] * w * d);
      for (int64_t k = 0; k < w; ++k) {
        for (const auto& [c, n] : columns) {
          for (int64_t b = (k * d + c) * element; b < (k * d + c + n) * element; b += 64) {
            __builtin_prefetch(next + b);
          }
        }
      }
    }
    const int64_t id = padded[static_cast<size_t>(j + w - 1)];
    if (id < 0) continue;  // before the conversation's start
    const Element* block = table + id * w * d;
    for (int64_t k = std::max<int64_t>(0, t0 - j); k < w && j + k < t1; ++k) {
      for (const auto& [c, n] : columns) AddRow(block + k * d + c, out + (j + k - t0) * d + c, n);
    }
  }
}

// Translate's ids padded to W-1 ids before the span of n_tokens (-1: before
// the conversation's start). InvalidArgument for too few or too many ids, or
// an id outside the table.
absl::StatusOr<std::vector<int64_t>> PaddedAnchorIds(const std::vector<int64_t>& ids,
                                                    int64_t n_tokens, int64_t w, int64_t vocab) {
  const int64_t n_ids = static_cast<int64_t>(ids.size());
  const int64_t n_before = n_ids - n_tokens;
  if (n_before < 0 || n_before > w - 1) {
    return absl::InvalidArgumentError(absl::StrCat("token anchors need the span's ", n_tokens,
                                                   " ids preceded by up to ", w - 1,
                                                   " earlier ones, got ", n_ids));
  }
  std::vector<int64_t> padded(static_cast<size_t>(w - 1 - n_before), -1);
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the anchor table of ", vocab, " rows"));
    }
    padded.push_back(id);
  }
  return padded;
}

// The anchor table rows of tokens [t0, t0 + n) of a span, W per token (ids
// t, t-1, ..., t-W+1; `vocab`, the zero row, before the conversation's
// start), from PaddedAnchorIds' padding: [n * W] row indices.
std::vector<int64_t> AnchorIndex(const std::vector<int64_t>& padded, int64_t t0, int64_t n,
                                 int64_t w, int64_t vocab) {
  std::vector<int64_t> index(static_cast<size_t>(n * w));
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t k = 0; k < w; ++k) {
      const int64_t id = padded[static_cast<size_t>(t0 + p + w - 1 - k)];
      index[static_cast<size_t>(p * w + k)] = id < 0 ? vocab : id;
    }
  }
  return index;
}

// Tokens per chunk of AddAnchors: its float32 buffer (1.5 MB for kvl-small
// -> kvl-large) stays in cache and is reused, where a whole span's sum was a
// fresh allocation of 23 MB at 3.8k tokens whose page faults, in the server,
// cost more than the sum itself (docs/server-bench.md).
constexpr int64_t kAnchorChunkTokens = 256;

}  // namespace

absl::Status Translator::AddAnchors(const std::vector<int64_t>& ids,
                                    const std::vector<int64_t>& unread, KvTaps* out) const {
  const int64_t n_tokens = out->keys.size(2);
  const int64_t w = spec_.anchor_window;
  const int64_t vocab = anchor_table_.size(0);
  absl::StatusOr<std::vector<int64_t>> padded_ids = PaddedAnchorIds(ids, n_tokens, w, vocab);
  if (!padded_ids.ok()) return padded_ids.status();
  const std::vector<int64_t>& padded = *padded_ids;
  const TranslatorEndpoint& t = spec_.target;
  const int64_t layer_width = t.n_head_kv * t.head_dim;
  const int64_t width = t.n_layer * layer_width, d = 2 * width;
  const int64_t first = unread.empty() ? 0 : *std::min_element(unread.begin(), unread.end());
  const at::Tensor buffer = at::empty({std::min(n_tokens - first, kAnchorChunkTokens), d},
                                      at::dtype(at::kFloat).device(device_));
  for (int64_t t0 = first; t0 < n_tokens; t0 += kAnchorChunkTokens) {
    const int64_t n = std::min(kAnchorChunkTokens, n_tokens - t0);
    // The runs of consecutive layers that read some row of the chunk, and
    // their columns of the sum (keys' then values'); rows of those layers
    // before their unread count are summed too, and zeroed by Translate.
    std::vector<std::pair<int64_t, int64_t>> layers, columns;
    for (int64_t il = 0; il < t.n_layer; ++il) {
      if (!unread.empty() && unread[static_cast<size_t>(il)] >= t0 + n) continue;
      if (!layers.empty() && layers.back().first + layers.back().second == il) {
        ++layers.back().second;
      } else {
        layers.push_back({il, 1});
      }
    }
    for (int64_t side : {int64_t{0}, width}) {
      for (const auto& [l0, nl] : layers) {
        columns.push_back({side + l0 * layer_width, nl * layer_width});
      }
    }
    at::Tensor sum = buffer.narrow(0, 0, n);  // [n, 2*L_t*H_t*D_t]
    if (!anchor_lookup_.defined()) {
      // Token p's table rows times the anchor weights.
      const std::vector<int64_t> index = AnchorIndex(padded, t0, n, w, vocab);
      const at::Tensor rows =
          SelectRows(anchor_rows_, at::tensor(index, at::kLong).to(device_)).view({n, -1});
      for (const auto& [c, nc] : columns) {
        sum.narrow(1, c, nc).copy_(at::mm(rows, anchor_weight_.narrow(1, c, nc)));  // converts
      }
    } else {
      for (const auto& [c, nc] : columns) sum.narrow(1, c, nc).zero_();
      if (anchor_lookup_.scalar_type() == at::kBFloat16) {
        AddAnchorRows(reinterpret_cast<const uint16_t*>(anchor_lookup_.data_ptr<at::BFloat16>()),
                      d, padded, w, t0, t0 + n, columns, sum.data_ptr<float>());
      } else {
        AddAnchorRows(anchor_lookup_.data_ptr<float>(), d, padded, w, t0, t0 + n, columns,
                      sum.data_ptr<float>());
      }
    }
    for (const auto& [result, side] : {std::pair{&out->keys, int64_t{0}}, {&out->values, width}}) {
      for (const auto& [l0, nl] : layers) {
        // [n, nl*H_t*D_t] -> [nl, H_t, n, D_t], added into Apply's result
        // (a fresh tensor, a permuted view of its product or a float32 copy).
        result->narrow(0, l0, nl).narrow(2, t0, n).add_(
            sum.narrow(1, side + l0 * layer_width, nl * layer_width)
                .view({n, nl, t.n_head_kv, t.head_dim})
                .permute({1, 2, 0, 3}));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// InvalidArgument unless source holds float taps [L_s, H_s, T, D_s] of the
// same T on `device`.
absl::Status CheckSourceTaps(const KvTaps& source, const TranslatorEndpoint& s,
                             const at::Device& device) {
  for (const at::Tensor* t : {&source.keys, &source.values}) {
    if (!t->defined() || t->dim() != 4 || t->size(0) != s.n_layer || t->size(1) != s.n_head_kv ||
        t->size(3) != s.head_dim || !t->is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "source taps must be float [", s.n_layer, ", ", s.n_head_kv, ", T, ", s.head_dim,
          "], got ", t->defined() ? c10::str(t->sizes()) : std::string("undefined")));
    }
  }
  if (source.keys.size(2) != source.values.size(2)) {
    return absl::InvalidArgumentError("source keys and values cover different token counts");
  }
  if (source.keys.device() != device || source.values.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "source taps on ", source.keys.device().str(), " and ", source.values.device().str(),
        ", the translator on ", device.str(), " (Translator::MoveTo)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Translator::SetResidualMaps(std::vector<ResidualMap> maps, int64_t native_layers,
                                         std::string basis) {
  const TranslatorEndpoint &s = spec_.source, &t = spec_.target;
  const int64_t e_t = maps.empty() ? 0 : maps.front().weight.size(0);
  std::vector<ResidualMap> merged = residual_;
  for (ResidualMap& m : maps) {
    const std::string which = absl::StrCat("residual map of layer ", m.layer);
    if (m.layer < 1 || m.layer >= t.n_layer) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, ": outside [1, ", t.n_layer, ") of the target"));
    }
    if (m.source_layers.empty() ||
        !std::is_sorted(m.source_layers.begin(), m.source_layers.end()) ||
        std::adjacent_find(m.source_layers.begin(), m.source_layers.end()) !=
            m.source_layers.end() ||
        m.source_layers.front() < 0 || m.source_layers.back() >= s.n_layer) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, ": source layers must be distinct, ascending and in [0, ", s.n_layer, ")"));
    }
    const int64_t in = 2 * static_cast<int64_t>(m.source_layers.size()) * s.n_head_kv * s.head_dim;
    const bool anchored = spec_.anchor_window > 0;
    if (!m.weight.defined() || m.weight.dim() != 2 || m.weight.size(1) != in ||
        m.weight.size(0) != e_t || e_t < 1 || !m.bias.defined() ||
        m.bias.sizes() != at::IntArrayRef{e_t} || anchored != m.anchor.defined() ||
        (anchored && m.anchor.sizes() != at::IntArrayRef{e_t, spec_.anchor_window *
                                                                  anchor_table_.size(1)})) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, ": needs weight [E_t, ", in, "], bias [E_t]",
          anchored ? absl::StrCat(" and anchor [E_t, ", spec_.anchor_window * anchor_table_.size(1),
                                  "]")
                   : std::string(" and no anchor weight"),
          ", one E_t for every map"));
    }
    for (at::Tensor* x : {&m.weight, &m.bias, &m.anchor}) {
      if (x->defined()) *x = x->detach().to(at::kCPU, at::kFloat).contiguous();
    }
    merged.erase(std::remove_if(merged.begin(), merged.end(),
                                [&m](const ResidualMap& o) { return o.layer == m.layer; }),
                 merged.end());
    merged.push_back(std::move(m));
  }
  if (!merged.empty() && merged.front().weight.size(0) != merged.back().weight.size(0)) {
    return absl::InvalidArgumentError("residual maps of different widths");
  }
  if (native_layers < 0) return absl::InvalidArgumentError("negative native layers");
  if (native_layers > 0 && native_layers < t.n_layer &&
      std::none_of(merged.begin(), merged.end(), [&](const ResidualMap& m) {
        return m.layer == t.n_layer - native_layers;
      })) {
    return absl::InvalidArgumentError(absl::StrCat(native_layers,
                                                   " native layers need the residual map of layer ",
                                                   t.n_layer - native_layers));
  }
  std::sort(merged.begin(), merged.end(),
            [](const ResidualMap& a, const ResidualMap& b) { return a.layer < b.layer; });
  residual_ = std::move(merged);
  spec_.native_layers = native_layers;
  spec_.native_layers_basis = std::move(basis);
  try {
    PrepareResidual(device_);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("preparing residual maps: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

void Translator::PrepareResidual(const at::Device& device) {
  const at::ScalarType compute = compute_ == DType::kBFloat16 ? at::kBFloat16 : at::kFloat;
  std::vector<PreparedResidual> prepared;
  for (const ResidualMap& m : residual_) {
    PreparedResidual p;
    p.weight_t = m.weight.t().to(device, compute).contiguous();
    p.bias = m.bias.to(device, compute);
    if (m.anchor.defined()) p.anchor_t = m.anchor.t().to(device).contiguous();
    prepared.push_back(std::move(p));
  }
  at::Tensor rows;
  if (!residual_.empty() && anchor_table_.defined()) {
    rows = at::cat({anchor_table_, at::zeros({1, anchor_table_.size(1)}, at::kFloat)}, 0)
               .to(device)
               .contiguous();
  }
  residual_prepared_ = std::move(prepared);
  residual_anchor_rows_ = std::move(rows);
}

const ResidualMap* Translator::ResidualFor(int64_t layer) const {
  for (const ResidualMap& m : residual_) {
    if (m.layer == layer) return &m;
  }
  return nullptr;
}

absl::StatusOr<at::Tensor> Translator::PredictResidual(const KvTaps& source, int64_t layer,
                                                       const std::vector<int64_t>& ids) const {
  const TranslatorEndpoint& s = spec_.source;
  size_t i = 0;
  while (i < residual_.size() && residual_[i].layer != layer) ++i;
  if (i == residual_.size()) {
    return absl::NotFoundError(absl::StrCat("the translator has no residual map of layer ", layer));
  }
  KVL_RETURN_IF_ERROR(CheckSourceTaps(source, s, device_));
  const ResidualMap& m = residual_[i];
  const PreparedResidual& p = residual_prepared_[i];
  const int64_t n_tokens = source.keys.size(2);
  std::vector<int64_t> index;
  if (spec_.anchor_window > 0) {
    const int64_t w = spec_.anchor_window, vocab = anchor_table_.size(0);
    absl::StatusOr<std::vector<int64_t>> padded = PaddedAnchorIds(ids, n_tokens, w, vocab);
    if (!padded.ok()) return padded.status();
    index = AnchorIndex(*padded, 0, n_tokens, w, vocab);
  }
  try {
    c10::InferenceMode guard;
    const int64_t nu = static_cast<int64_t>(m.source_layers.size());
    const at::Tensor x = at::empty({n_tokens, 2, nu, s.n_head_kv, s.head_dim},
                                   p.weight_t.options());
    for (int64_t j = 0; j < nu; ++j) {
      const int64_t sl = m.source_layers[static_cast<size_t>(j)];
      x.select(1, 0).select(1, j).copy_(source.keys[sl].transpose(0, 1));
      x.select(1, 1).select(1, j).copy_(source.values[sl].transpose(0, 1));
    }
    at::Tensor out = at::addmm(p.bias, x.view({n_tokens, -1}), p.weight_t).to(at::kFloat);
    if (p.anchor_t.defined()) {
      const at::Tensor rows =
          SelectRows(residual_anchor_rows_, at::tensor(index, at::kLong).to(device_))
              .view({n_tokens, -1});
      out.add_(at::mm(rows, p.anchor_t));
    }
    return out;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("residual map: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<KvTaps> Translator::Translate(const KvTaps& source, Output output,
                                             const std::vector<int64_t>& ids,
                                             const std::vector<int64_t>& unread) const {
  const TranslatorEndpoint& s = spec_.source;
  const TranslatorEndpoint& t = spec_.target;
  KVL_RETURN_IF_ERROR(CheckSourceTaps(source, s, device_));
  const int64_t n_tokens = source.keys.size(2);
  if (!unread.empty()) {
    if (static_cast<int64_t>(unread.size()) != t.n_layer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "translate: ", unread.size(), " unread counts for ", t.n_layer, " target layers"));
    }
    for (int64_t u : unread) {
      if (u < 0 || u > n_tokens) {
        return absl::InvalidArgumentError(
            absl::StrCat("translate: unread count ", u, " outside [0, ", n_tokens, "]"));
      }
    }
  }
  // Tokens before `first` are unread in every target layer: not even copied.
  const int64_t first = unread.empty() ? 0 : *std::min_element(unread.begin(), unread.end());
  try {
    c10::InferenceMode guard;
    // The maps' dtype is the compute dtype; a float32 result comes from
    // Apply's permuting copy at the end, which converts.
    const at::ScalarType compute = compute_ == DType::kBFloat16 ? at::kBFloat16 : at::kFloat;
    // [L_s, H_s, T, D_s] keys and values -> rows [2*L_s, T, H_s*D_s], the
    // blocks of InputBlocks: head-major rows, as the maps expect; one copy per
    // side that also converts to the compute dtype.
    const int64_t n_rows = n_tokens - first;
    const at::Tensor rows = at::empty({2, s.n_layer, n_rows, s.n_head_kv, s.head_dim},
                                      at::dtype(compute).device(device_));
    rows[0].copy_(source.keys.narrow(2, first, n_rows).permute({0, 2, 1, 3}));
    rows[1].copy_(source.values.narrow(2, first, n_rows).permute({0, 2, 1, 3}));
    const at::Tensor x = rows.view({2 * s.n_layer, n_rows, s.n_head_kv * s.head_dim});
    KvTaps out;
    out.keys = Apply(x, blocks_.keys, prepared_keys_, output, unread);
    out.values = Apply(x, blocks_.values, prepared_values_, output, unread);
    if (spec_.anchor_window > 0) {
      KVL_RETURN_IF_ERROR(AddAnchors(ids, unread, &out));
      // The anchors' sum covers a layer's rows chunk by chunk: those before
      // its unread count are zeroed again (not in the router's views).
      for (int64_t il = 0; il < t.n_layer && !unread.empty(); ++il) {
        const int64_t u = unread[static_cast<size_t>(il)];
        if (u > first && output != Output::kProduct) {
          out.keys[il].narrow(1, first, u - first).zero_();
          out.values[il].narrow(1, first, u - first).zero_();
        }
      }
    }
    return out;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("translate: ", e.what_without_backtrace()));
  }
}

absl::Status Translator::Save(const std::string& path) const {
  nlohmann::json meta;
  meta["format"] = kFormatName;
  meta["format_version"] = spec_.anchor_window > 0 ? kAnchorFormatVersion : kFormatVersion;
  if (spec_.anchor_window > 0) {
    meta["anchors"] = {{"window", spec_.anchor_window}, {"dim", anchor_table_.size(1)}};
  }
  meta["source"] = EndpointToJson(spec_.source);
  meta["target"] = EndpointToJson(spec_.target);
  meta["bias"] = spec_.bias;
  meta["inputs"] = MapInputsName(spec_.inputs);
  meta["assignment"] = {{"kind", spec_.assignment_kind},
                        {"band", spec_.band},
                        {"keys", spec_.assignment.keys},
                        {"values", spec_.assignment.values}};
  meta["training"] = TrainingToJson(spec_.training);
  // Written only when there are earlier stages, so single-stage files keep their bytes.
  if (!spec_.history.empty()) {
    nlohmann::json history = nlohmann::json::array();
    for (const TranslatorTraining& stage : spec_.history) history.push_back(TrainingToJson(stage));
    meta["training_history"] = std::move(history);
  }
  if (spec_.evaluation) meta["evaluation"] = EvaluationToJson(*spec_.evaluation);
  // Written only with residual maps, so other files keep their bytes.
  if (!residual_.empty() || spec_.native_layers > 0) {
    nlohmann::json maps = nlohmann::json::array();
    for (const ResidualMap& m : residual_) {
      maps.push_back({{"layer", m.layer}, {"source_layers", m.source_layers}});
    }
    meta["residual"] = {{"maps", std::move(maps)},
                        {"native_layers", spec_.native_layers},
                        {"basis", spec_.native_layers_basis}};
  }
  std::map<std::string, at::Tensor> tensors;
  for (const ResidualMap& m : residual_) {
    tensors[absl::StrCat("residual.", m.layer, ".weight")] = m.weight;
    tensors[absl::StrCat("residual.", m.layer, ".bias")] = m.bias;
    if (m.anchor.defined()) tensors[absl::StrCat("residual.", m.layer, ".anchor")] = m.anchor;
  }
  for (const auto& [maps, side] : {std::pair{&keys_, "keys"}, {&values_, "values"}}) {
    for (size_t il = 0; il < maps->weight.size(); ++il) {
      tensors[absl::StrCat(side, ".", il, ".weight")] = maps->weight[il];
      if (spec_.bias) tensors[absl::StrCat(side, ".", il, ".bias")] = maps->bias[il];
      if (spec_.anchor_window > 0) {
        tensors[absl::StrCat(side, ".", il, ".anchor")] = maps->anchor[il];
      }
    }
  }
  if (spec_.anchor_window > 0) tensors["anchor.table"] = anchor_table_;
  return WriteSafetensors(path, tensors, {{kMetadataKey, meta.dump()}});
}

absl::StatusOr<std::unique_ptr<Translator>> Translator::Load(const std::string& path,
                                                             const TranslatorExpectation& expect,
                                                             DType compute) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("translator file not found: ", path));
  }
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) {
    // Whatever the reader's code, an unreadable translator file is invalid input.
    return absl::InvalidArgumentError(file.status().message());
  }
  auto bad = [&path](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  auto it = file->metadata.find(kMetadataKey);
  if (it == file->metadata.end()) return bad("no kvlingo_translator metadata");
  TranslatorSpec spec;
  std::vector<ResidualMap> residual;
  int64_t native_layers = 0;
  std::string basis;
  try {
    const nlohmann::json meta = nlohmann::json::parse(it->second);
    if (meta.at("format").get<std::string>() != kFormatName) return bad("not a kvlingo translator");
    const int version = meta.at("format_version").get<int>();
    if (version != kFormatVersion && version != kAnchorFormatVersion) {
      return bad(absl::StrCat("unsupported format_version ", meta.at("format_version").dump(),
                              " (this build reads ", kFormatVersion, " and ",
                              kAnchorFormatVersion, ")"));
    }
    if (meta.contains("anchors")) spec.anchor_window = meta.at("anchors").at("window").get<int64_t>();
    spec.source = EndpointFromJson(meta.at("source"));
    spec.target = EndpointFromJson(meta.at("target"));
    spec.bias = meta.at("bias").get<bool>();
    // Files written before joint maps existed have split maps and no "inputs".
    if (meta.contains("inputs")) {
      absl::StatusOr<MapInputs> inputs = ParseMapInputs(meta.at("inputs").get<std::string>());
      if (!inputs.ok()) return bad(std::string(inputs.status().message()));
      spec.inputs = *inputs;
    }
    const nlohmann::json& a = meta.at("assignment");
    spec.assignment_kind = a.at("kind").get<std::string>();
    spec.band = a.at("band").get<int64_t>();
    spec.assignment.keys = a.at("keys").get<std::vector<std::vector<int64_t>>>();
    spec.assignment.values = a.at("values").get<std::vector<std::vector<int64_t>>>();
    spec.training = TrainingFromJson(meta.at("training"));
    if (meta.contains("training_history")) {
      for (const nlohmann::json& stage : meta.at("training_history")) {
        spec.history.push_back(TrainingFromJson(stage));
      }
    }
    if (meta.contains("evaluation")) spec.evaluation = EvaluationFromJson(meta.at("evaluation"));
    if (meta.contains("residual")) {
      const nlohmann::json& r = meta.at("residual");
      native_layers = r.at("native_layers").get<int64_t>();
      basis = r.value("basis", std::string());
      for (const nlohmann::json& m : r.at("maps")) {
        ResidualMap map;
        map.layer = m.at("layer").get<int64_t>();
        map.source_layers = m.at("source_layers").get<std::vector<int64_t>>();
        residual.push_back(std::move(map));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("malformed metadata: ", e.what()));
  }
  // The models and tokenizers must be exactly the ones the maps were fitted for.
  const std::pair<const char*, std::pair<const std::string*, const std::string*>> checks[] = {
      {"source model", {&spec.source.identity, &expect.source_identity}},
      {"target model", {&spec.target.identity, &expect.target_identity}},
      {"source tokenizer", {&spec.source.tokenizer_hash, &expect.source_tokenizer_hash}},
      {"target tokenizer", {&spec.target.tokenizer_hash, &expect.target_tokenizer_hash}},
  };
  for (const auto& [what, pair] : checks) {
    if (*pair.first != *pair.second) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": ", what, " differs from the one this translator was built for (file ",
          ShortHash(*pair.first), ", given ", ShortHash(*pair.second), ")"));
    }
  }
  TranslatorMaps keys, values;
  for (const auto& [maps, side] : {std::pair{&keys, "keys"}, {&values, "values"}}) {
    for (int64_t il = 0; il < spec.target.n_layer; ++il) {
      for (const std::string part : {"weight", "bias", "anchor"}) {
        if (part == "bias" && !spec.bias) continue;
        if (part == "anchor" && spec.anchor_window == 0) continue;
        const std::string name = absl::StrCat(side, ".", il, ".", part);
        auto t = file->tensors.find(name);
        if (t == file->tensors.end()) return bad(absl::StrCat("missing tensor ", name));
        (part == "weight" ? maps->weight : part == "bias" ? maps->bias : maps->anchor)
            .push_back(t->second);
      }
    }
  }
  at::Tensor anchor_table;
  if (spec.anchor_window > 0) {
    auto t = file->tensors.find("anchor.table");
    if (t == file->tensors.end()) return bad("missing tensor anchor.table");
    anchor_table = t->second;
  }
  for (ResidualMap& m : residual) {
    for (const auto& [part, dst] : {std::pair{"weight", &m.weight}, {"bias", &m.bias},
                                    {"anchor", &m.anchor}}) {
      if (std::string_view(part) == "anchor" && spec.anchor_window == 0) continue;
      const std::string name = absl::StrCat("residual.", m.layer, ".", part);
      auto t = file->tensors.find(name);
      if (t == file->tensors.end()) return bad(absl::StrCat("missing tensor ", name));
      *dst = t->second;
    }
  }
  absl::StatusOr<std::unique_ptr<Translator>> t =
      Create(std::move(spec), std::move(keys), std::move(values), compute, anchor_table);
  if (!t.ok()) return bad(std::string(t.status().message()));
  if (!residual.empty() || native_layers > 0) {
    if (absl::Status r = (*t)->SetResidualMaps(std::move(residual), native_layers, basis);
        !r.ok()) {
      return bad(std::string(r.message()));
    }
  }
  return t;
}

absl::Status StampTranslatorEvaluation(const std::string& path,
                                       const TranslatorEvaluation& evaluation) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("translator file not found: ", path));
  }
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) return absl::InvalidArgumentError(file.status().message());
  auto it = file->metadata.find(kMetadataKey);
  if (it == file->metadata.end()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no kvlingo_translator metadata"));
  }
  nlohmann::json meta = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || meta.value("format", std::string()) != kFormatName) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a kvlingo translator"));
  }
  meta["evaluation"] = EvaluationToJson(evaluation);
  file->metadata[kMetadataKey] = meta.dump();
  // Written next to the file and renamed over it: a crash leaves the old file.
  const std::string tmp = path + ".stamp.tmp";
  KVL_RETURN_IF_ERROR(WriteSafetensors(tmp, file->tensors, file->metadata));
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::InternalError(absl::StrCat("cannot replace ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace kvl
