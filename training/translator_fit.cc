#include "training/translator_fit.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/engine.h"
#include "model/model_dir.h"
#include "model/token_alignment.h"
#include "training/attention.h"
#include "training/progress.h"
#include "training/translator_data.h"
#include "translator/resample.h"

namespace kvl::training {
namespace {

// [L, H, T, D] -> [T, L*H*D] float64, layer-major then head-major per row.
at::Tensor Rows(const at::Tensor& taps) {
  const int64_t n_tokens = taps.size(2);
  return taps.to(at::kCPU, at::kDouble).permute({2, 0, 1, 3}).reshape({n_tokens, -1});
}

absl::Status CheckTaps(const KvTaps& taps, const TranslatorEndpoint& e, const char* which) {
  for (const at::Tensor* t : {&taps.keys, &taps.values}) {
    if (!t->defined() || t->dim() != 4 || t->size(0) != e.n_layer || t->size(1) != e.n_head_kv ||
        t->size(3) != e.head_dim || !t->is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, " taps must be float [", e.n_layer, ", ", e.n_head_kv, ", T, ", e.head_dim,
          "], got ", t->defined() ? c10::str(t->sizes()) : std::string("undefined")));
    }
  }
  if (taps.keys.size(2) != taps.values.size(2)) {
    return absl::InvalidArgumentError(absl::StrCat(which, " keys and values differ in length"));
  }
  return absl::OkStatus();
}

bool SameShape(const TranslatorEndpoint& a, const TranslatorEndpoint& b) {
  return a.n_layer == b.n_layer && a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim;
}

// The taps of every position of ids, prefilled by `engine` into a new line.
absl::StatusOr<KvTaps> PrefillTaps(Engine& engine, const std::vector<int64_t>& ids) {
  std::unique_ptr<KvCache> line = engine.NewCache();
  if (absl::StatusOr<at::Tensor> r = engine.Prefill(*line, ids); !r.ok()) return r.status();
  return line->Taps(0, static_cast<int64_t>(ids.size()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MomentAccumulator>> MomentAccumulator::Create(
    const TranslatorEndpoint& source, const TranslatorEndpoint& target, int64_t max_bytes,
    const at::Tensor& anchor_table, int64_t anchor_window) {
  if (anchor_window < 0 || (anchor_window > 0) != anchor_table.defined() ||
      (anchor_table.defined() && anchor_table.dim() != 2)) {
    return absl::InvalidArgumentError("anchors need a window >= 1 and a [V, E] table");
  }
  for (const TranslatorEndpoint* e : {&source, &target}) {
    if (e->n_layer <= 0 || e->n_head_kv <= 0 || e->head_dim <= 0) {
      return absl::InvalidArgumentError("model shapes must be positive");
    }
  }
  std::unique_ptr<MomentAccumulator> m(new MomentAccumulator());
  m->source_ = source;
  m->target_ = target;
  m->n_in_ = source.n_layer * source.n_head_kv * source.head_dim;
  m->n_out_ = target.n_layer * target.n_head_kv * target.head_dim;
  if (anchor_window > 0) {
    m->anchor_window_ = anchor_window;
    m->anchor_table_ = anchor_table.detach().to(at::kCPU, at::kDouble).contiguous();
    m->n_anchor_ = anchor_window * anchor_table.size(1);
  }
  if (m->Bytes() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "moments need ", m->Bytes(), " bytes (N_in ", m->n_in_, ", N_out ", m->n_out_,
        "), over the limit of ", max_bytes));
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const int64_t n_x = m->OnesColumn() + 1;
  m->xx_ = at::zeros({n_x, n_x}, f64);
  m->xy_ = at::zeros({n_x, 2 * m->n_out_}, f64);
  m->yy_ = at::zeros({2 * m->n_out_}, f64);
  return m;
}

int64_t MomentAccumulator::Bytes() const {
  const int64_t n_x = OnesColumn() + 1;
  return 8 * (n_x * n_x + n_x * 2 * n_out_ + 2 * n_out_);
}

absl::Status MomentAccumulator::Add(const KvTaps& source, const KvTaps& target,
                                    const at::Tensor& weights, const std::vector<int64_t>& ids) {
  KVL_RETURN_IF_ERROR(CheckTaps(source, source_, "source"));
  KVL_RETURN_IF_ERROR(CheckTaps(target, target_, "target"));
  const int64_t n_tokens = source.keys.size(2);
  if (target.keys.size(2) != n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("source has ", n_tokens, " tokens, target ",
                                                   target.keys.size(2)));
  }
  if (weights.defined() && (weights.dim() != 1 || weights.size(0) != n_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("weights must be [", n_tokens, "]"));
  }
  if (n_anchor_ > 0) {
    if (static_cast<int64_t>(ids.size()) != n_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("anchored moments need the span's ", n_tokens, " ids, got ", ids.size()));
    }
    for (int64_t id : ids) {
      if (id < 0 || id >= anchor_table_.size(0)) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside the table"));
      }
    }
  }
  try {
    c10::InferenceMode guard;
    const at::Tensor w = weights.defined() ? weights.to(at::kCPU, at::kDouble).unsqueeze(1)
                                           : at::Tensor();
    std::vector<at::Tensor> columns = {Rows(source.keys), Rows(source.values)};
    if (n_anchor_ > 0) {
      // Offset k reads token t-k's row; before the span's start, zeros.
      const at::Tensor id_tensor = at::tensor(ids, at::kLong);
      const int64_t e = anchor_table_.size(1);
      for (int64_t k = 0; k < anchor_window_; ++k) {
        at::Tensor rows = at::zeros({n_tokens, e}, at::kDouble);
        if (k < n_tokens) {
          rows.narrow(0, k, n_tokens - k)
              .copy_(anchor_table_.index_select(0, id_tensor.narrow(0, 0, n_tokens - k)));
        }
        columns.push_back(rows);
      }
    }
    columns.push_back(at::ones({n_tokens, 1}, at::TensorOptions().dtype(at::kDouble)));
    const at::Tensor x = at::cat(columns, 1);
    const at::Tensor y = at::cat({Rows(target.keys), Rows(target.values)}, 1);
    const at::Tensor xw = w.defined() ? x * w : x;
    xx_.addmm_(xw.t(), x);
    xy_.addmm_(xw.t(), y);
    yy_.add_(w.defined() ? (y * y * w).sum(0) : (y * y).sum(0));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("accumulating moments: ", e.what_without_backtrace()));
  }
  n_tokens_ += n_tokens;
  ++n_spans_;
  return absl::OkStatus();
}

at::Tensor MomentAccumulator::SolveOne(const std::vector<int64_t>& blocks, int64_t il,
                                       bool values, bool bias, double ridge, double* r2) const {
  const int64_t in_per_layer = source_.n_head_kv * source_.head_dim;
  const int64_t out = target_.n_head_kv * target_.head_dim;
  std::vector<int64_t> idx;
  for (int64_t s : blocks) {
    for (int64_t k = 0; k < in_per_layer; ++k) idx.push_back(s * in_per_layer + k);
  }
  for (int64_t k = 0; k < n_anchor_; ++k) idx.push_back(2 * n_in_ + k);
  const int64_t d = static_cast<int64_t>(idx.size());
  if (bias) idx.push_back(OnesColumn());
  const int64_t column = (values ? n_out_ : 0) + il * out;
  const at::Tensor index = at::tensor(idx, at::kLong);
  const at::Tensor a = xx_.index_select(0, index).index_select(1, index);
  const at::Tensor b = xy_.index_select(0, index).narrow(1, column, out);

  at::Tensor a_reg = a.clone();
  if (ridge > 0.0) {
    const double scale = ridge * a.narrow(0, 0, d).narrow(1, 0, d).trace().item<double>() / d;
    a_reg.diagonal().narrow(0, 0, d).add_(scale);
  }
  at::Tensor w;
  auto [chol, info] = at::linalg_cholesky_ex(a_reg);
  if (info.item<int64_t>() == 0) {
    w = at::cholesky_solve(b, chol);
  } else {
    w = at::linalg_pinv(a_reg, /*rcond=*/1e-12, /*hermitian=*/true).matmul(b);
  }
  // SSE = Σ y² - 2 Σ W∘B + Σ W∘(A W), with the unregularised A.
  const double sum_yy = yy_.narrow(0, column, out).sum().item<double>();
  const double sse = sum_yy - 2.0 * (w * b).sum().item<double>() + (w * a.matmul(w)).sum().item<double>();
  const double sum_w = xx_[OnesColumn()][OnesColumn()].item<double>();
  const at::Tensor sum_y = xy_[OnesColumn()].narrow(0, column, out);
  const double sst = sum_yy - (sum_y * sum_y).sum().item<double>() / sum_w;
  *r2 = sst > 0.0 ? 1.0 - sse / sst : 0.0;
  return w;
}

absl::StatusOr<FitResult> MomentAccumulator::Fit(TranslatorSpec spec, double ridge) const {
  if (n_tokens_ == 0) return absl::FailedPreconditionError("no tokens accumulated");
  if (!SameShape(spec.source, source_) || !SameShape(spec.target, target_)) {
    return absl::InvalidArgumentError("spec shapes differ from the accumulated moments'");
  }
  if (ridge < 0.0) return absl::InvalidArgumentError("ridge must be >= 0");
  FitResult result;
  TranslatorMaps keys, values;
  try {
    c10::InferenceMode guard;
    for (const std::vector<std::vector<int64_t>>* lists :
         {&spec.assignment.keys, &spec.assignment.values}) {
      if (static_cast<int64_t>(lists->size()) != target_.n_layer) {
        return absl::InvalidArgumentError("assignment must list every target layer");
      }
      for (const std::vector<int64_t>& list : *lists) {
        for (int64_t s : list) {
          if (s < 0 || s >= source_.n_layer) {
            return absl::InvalidArgumentError(absl::StrCat("source layer ", s, " out of range"));
          }
        }
      }
    }
    const InputBlocks blocks = InputBlocksOf(spec.assignment, spec.inputs, source_.n_layer);
    for (const auto& [lists, is_values, maps, r2s] :
         {std::tuple{&blocks.keys, false, &keys, &result.r2_keys},
          {&blocks.values, true, &values, &result.r2_values}}) {
      for (int64_t il = 0; il < target_.n_layer; ++il) {
        double r2 = 0.0;
        const at::Tensor w = SolveOne((*lists)[il], il, is_values, spec.bias, ridge, &r2);
        // Rows of w: the taps' columns, the anchors' (A), then the bias.
        const int64_t d = w.size(0) - (spec.bias ? 1 : 0) - n_anchor_;
        // Leave inference mode for the maps: distillation trains them later.
        {
          c10::InferenceMode off(false);
          maps->weight.push_back(at::empty({w.size(1), d}, at::kFloat));
          if (n_anchor_ > 0) maps->anchor.push_back(at::empty({w.size(1), n_anchor_}, at::kFloat));
          if (spec.bias) maps->bias.push_back(at::empty({w.size(1)}, at::kFloat));
        }
        maps->weight.back().copy_(w.narrow(0, 0, d).t());
        if (n_anchor_ > 0) maps->anchor.back().copy_(w.narrow(0, d, n_anchor_).t());
        if (spec.bias) maps->bias.back().copy_(w[d + n_anchor_]);
        r2s->push_back(r2);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("solving: ", e.what_without_backtrace()));
  }
  spec.training.ridge = ridge;
  spec.training.n_tokens = n_tokens_;
  spec.training.n_sequences = n_spans_;
  spec.anchor_window = anchor_window_;
  absl::StatusOr<std::unique_ptr<Translator>> t =
      Translator::Create(std::move(spec), std::move(keys), std::move(values), DType::kFloat32,
                         n_anchor_ > 0 ? anchor_table_.to(at::kFloat) : at::Tensor());
  if (!t.ok()) return t.status();
  result.translator = std::move(*t);
  return result;
}

absl::StatusOr<SingleLayerR2Table> MomentAccumulator::SingleLayerR2(bool bias,
                                                                     double ridge) const {
  if (n_tokens_ == 0) return absl::FailedPreconditionError("no tokens accumulated");
  SingleLayerR2Table table;
  try {
    c10::InferenceMode guard;
    // Split semantics: target keys from source keys, values from values
    // (block L_s + s holds the values of source layer s).
    for (const auto& [is_values, out] : {std::pair{false, &table.keys}, {true, &table.values}}) {
      *out = at::zeros({target_.n_layer, source_.n_layer}, at::kDouble);
      double* p = out->data_ptr<double>();
      const int64_t offset = is_values ? source_.n_layer : 0;
      for (int64_t il = 0; il < target_.n_layer; ++il) {
        for (int64_t s = 0; s < source_.n_layer; ++s) {
          SolveOne({offset + s}, il, is_values, bias, ridge, &p[il * source_.n_layer + s]);
        }
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("solving: ", e.what_without_backtrace()));
  }
  return table;
}

absl::StatusOr<LayerAssignment> MomentAccumulator::GreedyAssignment(int64_t band, bool bias,
                                                                    double ridge) const {
  if (band < 1 || band > source_.n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("greedy assignment: band must be in [1, ",
                                                   source_.n_layer, "], got ", band));
  }
  if (n_tokens_ == 0) return absl::FailedPreconditionError("no tokens accumulated");
  LayerAssignment assignment;
  try {
    c10::InferenceMode guard;
    // Split semantics, as SingleLayerR2.
    for (const auto& [is_values, out] :
         {std::pair{false, &assignment.keys}, {true, &assignment.values}}) {
      const int64_t offset = is_values ? source_.n_layer : 0;
      out->resize(static_cast<size_t>(target_.n_layer));
      for (int64_t il = 0; il < target_.n_layer; ++il) {
        std::vector<int64_t> chosen;
        while (static_cast<int64_t>(chosen.size()) < band) {
          int64_t best = -1;
          double best_r2 = -std::numeric_limits<double>::infinity();
          for (int64_t s = 0; s < source_.n_layer; ++s) {
            if (std::find(chosen.begin(), chosen.end(), s) != chosen.end()) continue;
            std::vector<int64_t> trial = chosen;
            trial.insert(std::upper_bound(trial.begin(), trial.end(), s), s);
            for (int64_t& t : trial) t += offset;
            double r2 = 0;
            SolveOne(trial, il, is_values, bias, ridge, &r2);
            if (r2 > best_r2) {  // ties keep the shallower layer
              best = s;
              best_r2 = r2;
            }
          }
          chosen.insert(std::upper_bound(chosen.begin(), chosen.end(), best), best);
        }
        (*out)[static_cast<size_t>(il)] = std::move(chosen);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("solving: ", e.what_without_backtrace()));
  }
  return assignment;
}

absl::Status AccumulateSequence(Engine& source, Engine& target, const std::vector<int64_t>& ids,
                                MomentAccumulator& moments) {
  absl::StatusOr<KvTaps> s = PrefillTaps(source, ids);
  if (!s.ok()) return s.status();
  absl::StatusOr<KvTaps> t = PrefillTaps(target, ids);
  if (!t.ok()) return t.status();
  return moments.Add(*s, *t, {}, ids);
}

namespace {

// `text` in each tokenizer's tokens (special tokens parsed) and their
// minimal matching groups.
struct Spellings {
  std::vector<int32_t> source, target;
  std::vector<AlignedGroup> groups;
};
absl::StatusOr<Spellings> Spell(const Tokenizer& source_tokenizer,
                                const Tokenizer& target_tokenizer, std::string_view text) {
  Spellings out;
  out.source = source_tokenizer.Encode(text);
  out.target = target_tokenizer.Encode(text);
  if (out.source.empty() || out.target.empty()) {
    return absl::InvalidArgumentError("no tokens to align");
  }
  absl::StatusOr<std::vector<AlignedGroup>> groups =
      AlignSpellings(source_tokenizer, out.source, target_tokenizer, out.target, text);
  if (!groups.ok()) return groups.status();
  out.groups = *std::move(groups);
  return out;
}

}  // namespace

absl::StatusOr<TargetAlignedTaps> AlignTapsOnTarget(Engine& source,
                                                    const Tokenizer& source_tokenizer,
                                                    Engine& target,
                                                    const Tokenizer& target_tokenizer,
                                                    std::string_view text) {
  absl::StatusOr<Spellings> spellings = Spell(source_tokenizer, target_tokenizer, text);
  if (!spellings.ok()) return spellings.status();
  const std::vector<int32_t>& s32 = spellings->source;
  const std::vector<int32_t>& t32 = spellings->target;
  const std::vector<AlignedGroup>& groups = spellings->groups;
  absl::StatusOr<std::vector<TokenRun>> runs = AssignWithinGroups(groups);
  if (!runs.ok()) return runs.status();
  TargetAlignedTaps out;
  out.target_ids.assign(t32.begin(), t32.end());
  absl::StatusOr<KvTaps> s = PrefillTaps(source, std::vector<int64_t>(s32.begin(), s32.end()));
  if (!s.ok()) return s.status();
  absl::StatusOr<KvTaps> resampled = ResampleTaps(*s, *runs);
  if (!resampled.ok()) return resampled.status();
  absl::StatusOr<KvTaps> t = PrefillTaps(target, out.target_ids);
  if (!t.ok()) return t.status();
  out.taps.source = *std::move(resampled);
  out.taps.target = *std::move(t);
  out.taps.n_groups = static_cast<int64_t>(groups.size());
  for (const AlignedGroup& g : groups) out.taps.n_one_to_one += g.one_to_one() ? 1 : 0;
  return out;
}

absl::StatusOr<AlignedTaps> AlignTaps(Engine& source, const Tokenizer& source_tokenizer,
                                      Engine& target, const Tokenizer& target_tokenizer,
                                      std::string_view text) {
  absl::StatusOr<Spellings> spellings = Spell(source_tokenizer, target_tokenizer, text);
  if (!spellings.ok()) return spellings.status();
  const std::vector<int32_t>& s32 = spellings->source;
  const std::vector<int32_t>& t32 = spellings->target;
  const std::vector<AlignedGroup>& groups = spellings->groups;
  const std::vector<int64_t> s_ids(s32.begin(), s32.end()), t_ids(t32.begin(), t32.end());
  const int64_t n_s = static_cast<int64_t>(s_ids.size());
  const int64_t n_t = static_cast<int64_t>(t_ids.size());
  absl::StatusOr<KvTaps> s = PrefillTaps(source, s_ids);
  if (!s.ok()) return s.status();
  absl::StatusOr<KvTaps> t = PrefillTaps(target, t_ids);
  if (!t.ok()) return t.status();
  AlignedTaps out;
  out.source = *std::move(s);
  out.n_groups = static_cast<int64_t>(groups.size());
  // Each target token's group, and each source token's; the group means of
  // the target's taps gathered in source token order.
  std::vector<int64_t> group_of_target(static_cast<size_t>(n_t)),
      group_of_source(static_cast<size_t>(n_s));
  std::vector<double> size(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const AlignedGroup& a = groups[g];
    if (a.one_to_one()) ++out.n_one_to_one;
    for (int64_t i = a.a_begin; i < a.a_end; ++i) group_of_source[static_cast<size_t>(i)] = g;
    for (int64_t j = a.b_begin; j < a.b_end; ++j) group_of_target[static_cast<size_t>(j)] = g;
    size[g] = static_cast<double>(a.b_end - a.b_begin);
  }
  c10::InferenceMode guard;
  const at::Tensor target_index = at::tensor(group_of_target, at::kLong);
  const at::Tensor source_index = at::tensor(group_of_source, at::kLong);
  const at::Tensor counts = at::tensor(size, at::kDouble);
  for (const auto& [from, to] : {std::pair{&t->keys, &out.target.keys},
                                 std::pair{&t->values, &out.target.values}}) {
    // [L, H, n_t, D] summed per group in float64 -> [L, H, groups, D].
    const at::Tensor x = from->to(at::kDouble);
    at::Tensor sums = at::zeros({x.size(0), x.size(1), out.n_groups, x.size(3)}, x.options());
    sums.index_add_(2, target_index, x);
    sums.div_(counts.view({1, 1, -1, 1}));
    *to = sums.index_select(2, source_index).to(from->scalar_type()).contiguous();
  }
  return out;
}

namespace {

// Moments are accumulated in float64 from float32 caches.
absl::StatusOr<ModelDir> LoadForFit(const std::string& dir, int n_threads, int64_t seq_len) {
  RuntimeOptions o;
  o.dtype = DType::kFloat32;
  o.n_threads = n_threads;
  o.prefill_chunk = std::max<int64_t>(seq_len, 1);
  return LoadModelDir(dir, o);
}

// The prefix of ids (all but its last C tokens; half when shorter than 2C),
// each token weighted by the attention the target's continuation queries give
// it, normalised to mean 1.
absl::Status AccumulateAttentionWeighted(Engine& source, Engine& target,
                                         const ModelConfig& target_config,
                                         const ModelWeights& target_weights,
                                         const std::vector<int64_t>& ids, int64_t n_queries,
                                         MomentAccumulator& moments) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t n_prefix = n > 2 * n_queries ? n - n_queries : std::max<int64_t>(n / 2, 1);
  const AttentionMass mass = PrefixAttentionMass(target_config, target_weights, ids, n_prefix);
  const std::vector<int64_t> prefix(ids.begin(), ids.begin() + n_prefix);
  absl::StatusOr<KvTaps> s = PrefillTaps(source, prefix);
  if (!s.ok()) return s.status();
  absl::StatusOr<KvTaps> t = PrefillTaps(target, prefix);
  if (!t.ok()) return t.status();
  const double mean = mass.received.mean().item<double>();
  if (!(mean > 0)) return absl::InternalError("attention mass is zero");
  return moments.Add(*s, *t, mass.received / mean, prefix);
}

nlohmann::json TableJson(const at::Tensor& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < t.size(0); ++i) {
    std::vector<double> row(t.size(1));
    for (int64_t j = 0; j < t.size(1); ++j) row[j] = t[i][j].item<double>();
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

absl::StatusOr<CorpusFit> FitFromCorpus(const CorpusFitOptions& o) {
  absl::StatusOr<ModelDir> source = LoadForFit(o.source_dir, o.n_threads, o.seq_len);
  if (!source.ok()) return source.status();
  absl::StatusOr<ModelDir> target = LoadForFit(o.target_dir, o.n_threads, o.seq_len);
  if (!target.ok()) return target.status();
  // Across tokenizers each sequence is text that both models encode with
  // their own tokenizers, aligned by bytes (AlignTaps).
  const bool cross = source->tokenizer->content_hash() != target->tokenizer->content_hash();
  if (cross && o.weighting != "uniform") {
    return absl::InvalidArgumentError(
        "across tokenizers the fit takes uniform weights (the source and target tokenizers "
        "differ)");
  }
  const ModelConfig& sc = source->config();
  const ModelConfig& tc = target->config();
  const int64_t band = o.band_all ? sc.n_layer : o.band;
  std::string kind = o.assignment;
  if (kind.empty()) kind = sc.n_layer == tc.n_layer && !o.band_all ? "same_index" : "relative_depth";

  absl::StatusOr<std::vector<std::vector<int64_t>>> sequences =
      ReadSequences(o.data_path, *source->tokenizer, o.seq_len, o.max_sequences);
  if (!sequences.ok()) return sequences.status();

  CorpusFit out;
  TranslatorSpec& spec = out.spec;
  spec.source = EndpointOf(sc, source->identity, source->tokenizer->content_hash());
  spec.target = EndpointOf(tc, target->identity, target->tokenizer->content_hash());
  spec.assignment_kind = kind;
  spec.band = band;
  spec.bias = o.bias;
  spec.inputs = o.inputs;
  spec.training.method = "closed_form";
  spec.training.weighting = o.weighting;
  spec.training.corpus = o.data_path;

  if (o.anchor_window < 0) return absl::InvalidArgumentError("anchor window must be >= 0");
  if (o.anchor_rank < 0) return absl::InvalidArgumentError("anchor rank must be >= 0");
  const at::Tensor anchor_table =
      o.anchor_window > 0
          ? AnchorTable(target->checkpoint.weights.embed_tokens, tc.rms_norm_eps, o.anchor_rank)
          : at::Tensor();
  absl::StatusOr<std::unique_ptr<MomentAccumulator>> moments = MomentAccumulator::Create(
      spec.source, spec.target, int64_t{8} << 30, anchor_table, o.anchor_window);
  if (!moments.ok()) return moments.status();
  {
    ProgressOptions po;
    po.label = "fit";
    po.total = static_cast<int64_t>(sequences->size());
    po.unit = "seq";
    std::unique_ptr<ProgressBar> bar = o.progress ? std::make_unique<ProgressBar>(po) : nullptr;
    const ModelWeights target_weights32 = target->checkpoint.weights.To(at::kFloat, "cpu");
    for (size_t i = 0; i < sequences->size(); ++i) {
      const std::vector<int64_t>& ids = (*sequences)[i];
      absl::Status s;
      if (cross && o.anchor_window > 0) {
        // Token anchors read the target's ids: rows in the target's tokens.
        const std::vector<int32_t> ids32(ids.begin(), ids.end());
        absl::StatusOr<TargetAlignedTaps> aligned = AlignTapsOnTarget(
            *source->engine, *source->tokenizer, *target->engine, *target->tokenizer,
            source->tokenizer->Decode(ids32));
        s = aligned.ok() ? (*moments)->Add(aligned->taps.source, aligned->taps.target, {},
                                           aligned->target_ids)
                         : aligned.status();
        if (aligned.ok()) {
          out.n_groups += aligned->taps.n_groups;
          out.n_one_to_one += aligned->taps.n_one_to_one;
        }
      } else if (cross) {
        const std::vector<int32_t> ids32(ids.begin(), ids.end());
        absl::StatusOr<AlignedTaps> aligned =
            AlignTaps(*source->engine, *source->tokenizer, *target->engine, *target->tokenizer,
                      source->tokenizer->Decode(ids32));
        s = aligned.ok() ? (*moments)->Add(aligned->source, aligned->target) : aligned.status();
        if (aligned.ok()) {
          out.n_groups += aligned->n_groups;
          out.n_one_to_one += aligned->n_one_to_one;
        }
      } else {
        s = o.weighting == "uniform"
                ? AccumulateSequence(*source->engine, *target->engine, ids, **moments)
                : AccumulateAttentionWeighted(*source->engine, *target->engine, tc,
                                              target_weights32, ids, o.attention_queries,
                                              **moments);
      }
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("sequence ", i, ": ", s.message()));
      if (bar) {
        bar->Update(static_cast<int64_t>(i) + 1,
                    absl::StrCat(FormatCount(static_cast<double>((*moments)->n_tokens())), " tok"));
      }
    }
    if (bar) bar->Finish();
  }

  absl::StatusOr<SingleLayerR2Table> single = (*moments)->SingleLayerR2(o.bias, o.ridge);
  if (!single.ok()) return single.status();
  out.single = *std::move(single);
  absl::StatusOr<LayerAssignment> assignment =
      kind == "same_index" ? (band == 1 ? SameIndexAssignment(sc.n_layer, tc.n_layer)
                                        : absl::InvalidArgumentError("same_index takes no band"))
      : kind == "relative_depth" ? RelativeDepthAssignment(sc.n_layer, tc.n_layer, band)
      : kind == "top_r2"         ? TopR2Assignment(out.single.keys, out.single.values, band)
                                 : (*moments)->GreedyAssignment(band, o.bias, o.ridge);
  if (!assignment.ok()) return assignment.status();
  spec.assignment = *assignment;

  absl::StatusOr<FitResult> fit = (*moments)->Fit(spec, o.ridge);
  if (!fit.ok()) return fit.status();
  out.fit = *std::move(fit);
  out.n_sequences = (*moments)->n_spans();
  out.n_tokens = (*moments)->n_tokens();
  return out;
}

nlohmann::json CorpusFitReport(const CorpusFitOptions& o, const CorpusFit& f,
                               const std::string& translator_path) {
  const int64_t n_layer = static_cast<int64_t>(f.fit.r2_keys.size());
  double mean_k = 0, mean_v = 0;
  for (int64_t il = 0; il < n_layer; ++il) {
    mean_k += f.fit.r2_keys[il] / static_cast<double>(n_layer);
    mean_v += f.fit.r2_values[il] / static_cast<double>(n_layer);
  }
  nlohmann::json report = {
      {"translator", translator_path},
      {"source", o.source_dir},
      {"target", o.target_dir},
      {"data", o.data_path},
      {"assignment", f.spec.assignment_kind},
      {"band", f.spec.band},
      {"ridge", o.ridge},
      {"bias", o.bias},
      {"inputs", MapInputsName(o.inputs)},
      {"weighting", o.weighting},
      {"anchor_window", o.anchor_window},
      {"anchor_rank", o.anchor_rank},
      {"n_sequences", f.n_sequences},
      {"n_tokens", f.n_tokens},
      {"r2_keys", f.fit.r2_keys},
      {"r2_values", f.fit.r2_values},
      {"mean_r2_keys", mean_k},
      {"mean_r2_values", mean_v},
      {"assignment_keys", f.spec.assignment.keys},
      {"assignment_values", f.spec.assignment.values},
      {"single_layer_r2_keys", TableJson(f.single.keys)},
      {"single_layer_r2_values", TableJson(f.single.values)},
  };
  if (f.n_groups > 0) {
    report["alignment"] = {{"groups", f.n_groups}, {"one_to_one", f.n_one_to_one}};
  }
  return report;
}

}  // namespace kvl::training
