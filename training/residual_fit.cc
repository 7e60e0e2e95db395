#include "training/residual_fit.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/engine.h"
#include "model/reference.h"
#include "training/attention.h"
#include "training/progress.h"
#include "training/train_lm.h"
#include "training/translator_distill.h"

namespace kvl::training {
namespace {

// One token's inputs, float64 [T, in + 1]: the keys then the values of
// `source_layers` (head-major, as ResidualMap reads them), the anchor rows of
// tokens t..t-W+1 (zeros before the sequence's start), and a one.
at::Tensor InputRows(const KvTaps& taps, const std::vector<int64_t>& source_layers,
                     const at::Tensor& anchor_table, int64_t window,
                     const std::vector<int64_t>& ids) {
  const int64_t n = taps.keys.size(2);
  std::vector<at::Tensor> parts;
  for (const at::Tensor* side : {&taps.keys, &taps.values}) {
    for (int64_t sl : source_layers) {
      parts.push_back((*side)[sl].transpose(0, 1).reshape({n, -1}).to(at::kDouble));
    }
  }
  if (window > 0) {
    parts.push_back(
        AnchorBatch(anchor_table, at::tensor(ids, at::kLong).unsqueeze(0), window)[0].to(
            at::kDouble));
  }
  parts.push_back(at::ones({n, 1}, at::kDouble));
  return at::cat(parts, 1);
}

}  // namespace

absl::StatusOr<ResidualFit> FitResidualMaps(const ResidualFitOptions& o, TranslatorPair& pair,
                                            const Translator& translator) {
  TranslatorModel& source = pair.source;
  TranslatorModel& target = pair.target;
  const TranslatorExpectation expect = ExpectationFor(source, target);
  const TranslatorSpec& spec = translator.spec();
  if (spec.source.identity != expect.source_identity ||
      spec.target.identity != expect.target_identity) {
    return absl::FailedPreconditionError(
        "the translator was built for other models than --source and --target");
  }
  const int64_t l_s = source.config().n_layer, l_t = target.config().n_layer;
  const int64_t e_t = target.config().hidden_size;
  std::vector<int64_t> layers = o.layers;
  if (layers.empty()) {
    layers.resize(static_cast<size_t>(l_t - 1));
    std::iota(layers.begin(), layers.end(), 1);
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  for (int64_t j : layers) {
    if (j < 1 || j >= l_t) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", j, " is outside [1, ", l_t, ") of the target"));
    }
  }
  std::vector<int64_t> source_layers = o.source_layers;
  if (source_layers.empty()) {
    source_layers.resize(static_cast<size_t>(l_s));
    std::iota(source_layers.begin(), source_layers.end(), 0);
  }
  std::sort(source_layers.begin(), source_layers.end());
  source_layers.erase(std::unique(source_layers.begin(), source_layers.end()), source_layers.end());
  if (source_layers.front() < 0 || source_layers.back() >= l_s) {
    return absl::InvalidArgumentError(
        absl::StrCat("source layers must lie in [0, ", l_s, ") of the source"));
  }
  const int64_t window = spec.anchor_window;
  const at::Tensor& table = translator.anchor_table();
  const int64_t n_in = 2 * static_cast<int64_t>(source_layers.size()) * spec.source.n_head_kv *
                           spec.source.head_dim +
                       (window > 0 ? window * table.size(1) : 0);
  const int64_t n_out = static_cast<int64_t>(layers.size()) * e_t;
  const int64_t bytes = 8 * ((n_in + 1) * (n_in + 1) + (n_in + 1) * n_out + 2 * n_out);
  if (bytes > (int64_t{8} << 30)) {
    return absl::ResourceExhaustedError(absl::StrCat("the residual moments would take ", bytes,
                                                     " bytes; choose fewer --source-layers"));
  }
  absl::StatusOr<std::vector<std::vector<int64_t>>> sequences =
      ReadSequences(o.data_path, *source.tokenizer, o.seq_len, o.max_sequences);
  if (!sequences.ok()) return sequences.status();

  c10::InferenceMode guard;
  at::Tensor xx = at::zeros({n_in + 1, n_in + 1}, at::kDouble);
  at::Tensor xy = at::zeros({n_in + 1, n_out}, at::kDouble);
  at::Tensor yy = at::zeros({n_out}, at::kDouble);
  ResidualFit fit;
  {
    ProgressOptions po;
    po.label = "fit-residual";
    po.total = static_cast<int64_t>(sequences->size());
    po.unit = "seq";
    std::unique_ptr<ProgressBar> bar = o.progress ? std::make_unique<ProgressBar>(po) : nullptr;
    const at::Tensor index = at::tensor(layers, at::kLong);
    for (size_t i = 0; i < sequences->size(); ++i) {
      const std::vector<int64_t>& ids = (*sequences)[i];
      const int64_t n = static_cast<int64_t>(ids.size());
      std::unique_ptr<KvCache> source_line = source.engine->NewCache();
      std::unique_ptr<KvCache> target_line = target.engine->NewCache();
      if (absl::StatusOr<at::Tensor> r = source.engine->Prefill(*source_line, ids); !r.ok()) {
        return r.status();
      }
      absl::StatusOr<at::Tensor> residuals = target.engine->PrefillResiduals(*target_line, ids);
      if (!residuals.ok()) return residuals.status();
      absl::StatusOr<KvTaps> taps = source_line->Taps(0, n);
      if (!taps.ok()) return taps.status();
      const at::Tensor x = InputRows(*taps, source_layers, table, window, ids);
      // [layers, T, E] -> [T, layers * E]
      const at::Tensor y =
          residuals->index_select(0, index).permute({1, 0, 2}).reshape({n, -1}).to(at::kDouble);
      xx.addmm_(x.t(), x);
      xy.addmm_(x.t(), y);
      yy.add_(y.square().sum(0));
      fit.n_tokens += n;
      if (bar) bar->Update(static_cast<int64_t>(i) + 1, absl::StrCat(fit.n_tokens, " tok"));
    }
    if (bar) bar->Finish();
  }
  fit.n_sequences = static_cast<int64_t>(sequences->size());
  if (fit.n_tokens == 0) return absl::FailedPreconditionError("no tokens to fit");

  // W = (A + λ·(tr(A_x)/d)·I_x)^-1 B, the ones column not regularised.
  at::Tensor a = xx.clone();
  const double mean_moment = xx.diagonal().narrow(0, 0, n_in).sum().item<double>() / n_in;
  a.diagonal().narrow(0, 0, n_in).add_(o.ridge * mean_moment);
  at::Tensor w;
  try {
    w = at::cholesky_solve(xy, at::linalg_cholesky(a));
  } catch (const c10::Error&) {
    w = at::matmul(at::linalg_pinv(a), xy);
  }
  // SSE per column = Σy² - 2 wᵀB + wᵀAw (A without the ridge); SST about the mean.
  const at::Tensor sse = yy - 2 * (w * xy).sum(0) + (w * at::mm(xx, w)).sum(0);
  const double count = static_cast<double>(fit.n_tokens);
  const at::Tensor mean = xy[n_in] / count;  // the ones row of B: Σ y
  const at::Tensor sst = yy - count * mean.square();
  const int64_t n_taps = n_in - (window > 0 ? window * table.size(1) : 0);
  for (size_t m = 0; m < layers.size(); ++m) {
    const at::Tensor wm = w.narrow(1, static_cast<int64_t>(m) * e_t, e_t);  // [in + 1, E]
    ResidualMap map;
    map.layer = layers[m];
    map.source_layers = source_layers;
    map.weight = wm.narrow(0, 0, n_taps).t().to(at::kFloat).contiguous();
    if (window > 0) {
      map.anchor = wm.narrow(0, n_taps, n_in - n_taps).t().to(at::kFloat).contiguous();
    }
    map.bias = wm[n_in].to(at::kFloat).contiguous();
    const double sse_m = sse.narrow(0, static_cast<int64_t>(m) * e_t, e_t).sum().item<double>();
    const double sst_m = sst.narrow(0, static_cast<int64_t>(m) * e_t, e_t).sum().item<double>();
    fit.r2.push_back(sst_m > 0 ? 1.0 - sse_m / sst_m : 0.0);
    fit.maps.push_back(std::move(map));
  }
  return fit;
}

at::Tensor ResidualDistillKl(const TranslatorModel& source, const TranslatorModel& target,
                             const Translator& translator, const ResidualMap& map,
                             const at::Tensor& ids, int64_t n_prefix) {
  const int64_t n_batch = ids.size(0), n_cont = ids.size(1) - n_prefix;
  TORCH_CHECK(n_prefix >= 1 && n_cont >= 1, "ResidualDistillKl needs a prefix and a continuation");
  const TranslatorSpec& spec = translator.spec();
  const at::Tensor prefix_ids = ids.narrow(1, 0, n_prefix);
  ReferenceOptions plain;
  plain.attention = GroupedAttention();
  at::Tensor teacher_logp, anchors;
  ReferenceOutput source_out;
  TranslatedBatch translated;
  {
    c10::AutoGradMode no_grad(false);
    teacher_logp = at::log_softmax(ReferenceForward(target.config(), target.weights32, ids, plain)
                                       .logits.narrow(1, n_prefix, n_cont),
                                   -1);
    ReferenceOptions so = plain;
    so.capture_kv = true;
    so.last_logits_only = true;
    source_out = ReferenceForward(source.config(), source.weights32, prefix_ids, so);
    if (spec.anchor_window > 0) {
      anchors = AnchorBatch(translator.anchor_table(), prefix_ids, spec.anchor_window);
    }
    translated = TranslateBatchKv(spec, translator.key_maps(), translator.value_maps(),
                                  source_out.keys_prenorm, source_out.values, anchors);
  }
  ReferenceOptions to = plain;
  to.prefix_keys = translated.keys;
  to.prefix_values = translated.values;
  if (map.weight.defined()) {
    // The predicted residual stream [B, P, E_t] at map.layer's input.
    std::vector<at::Tensor> parts;
    for (const std::vector<at::Tensor>* side : {&source_out.keys_prenorm, &source_out.values}) {
      for (int64_t sl : map.source_layers) {
        const at::Tensor& x = (*side)[static_cast<size_t>(sl)];  // [B, H_s, P, D_s]
        parts.push_back(x.transpose(1, 2).reshape({n_batch, n_prefix, -1}));
      }
    }
    at::Tensor hidden = at::linear(at::cat(parts, -1), map.weight, map.bias);
    if (map.anchor.defined()) hidden = hidden + at::linear(anchors, map.anchor);
    ReferenceOptions upper = plain;
    upper.first_layer = map.layer;
    upper.hidden = hidden;
    upper.capture_kv = true;
    upper.no_logits = true;
    const ReferenceOutput top =
        ReferenceForward(target.config(), target.weights32, prefix_ids, upper);
    for (size_t il = static_cast<size_t>(map.layer); il < to.prefix_keys.size(); ++il) {
      to.prefix_keys[il] = top.keys_prenorm[il];
      to.prefix_values[il] = top.values[il];
    }
  }
  const at::Tensor student_logp = at::log_softmax(
      ReferenceForward(target.config(), target.weights32, ids.narrow(1, n_prefix, n_cont), to)
          .logits,
      -1);
  return (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1).mean();
}

absl::StatusOr<ResidualDistill> DistillResidualMap(const ResidualDistillOptions& o,
                                                   const TranslatorPair& pair,
                                                   const Translator& translator) {
  const ResidualMap* init = translator.ResidualFor(o.layer);
  if (init == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the translator has no residual map of layer ",
                                                   o.layer, " (kvl fit-residual adds one)"));
  }
  const int64_t window = o.prefix + o.continuation;
  absl::StatusOr<std::vector<int32_t>> train =
      ReadTokenStream(o.train_path, *pair.source.tokenizer);
  if (!train.ok()) return train.status();
  absl::StatusOr<std::vector<int32_t>> valid =
      ReadTokenStream(o.valid_path, *pair.source.tokenizer);
  if (!valid.ok()) return valid.status();
  const int64_t n_train = static_cast<int64_t>(train->size());
  const int64_t n_valid = static_cast<int64_t>(valid->size());
  if (n_train < window + 1 || n_valid < window) {
    return absl::InvalidArgumentError(
        absl::StrCat("the training and validation streams need a window of ", window, " tokens"));
  }
  const at::Tensor train_ids =
      at::from_blob(train->data(), {n_train}, at::TensorOptions().dtype(at::kInt)).to(at::kLong);
  std::vector<at::Tensor> valid_ids;
  for (int64_t off = 0;
       off + window <= n_valid && static_cast<int64_t>(valid_ids.size()) < o.valid_windows;
       off += window) {
    valid_ids.push_back(at::tensor(
        std::vector<int64_t>(valid->begin() + off, valid->begin() + off + window), at::kLong));
  }
  auto mean_kl = [&](const ResidualMap& map) {
    c10::AutoGradMode no_grad(false);
    double sum = 0;
    int64_t n = 0;
    for (size_t i = 0; i < valid_ids.size(); i += static_cast<size_t>(o.batch)) {
      const size_t end = std::min(valid_ids.size(), i + static_cast<size_t>(o.batch));
      const std::vector<at::Tensor> rows(valid_ids.begin() + i, valid_ids.begin() + end);
      sum += ResidualDistillKl(pair.source, pair.target, translator, map, at::stack(rows), o.prefix)
                 .item<double>() *
             static_cast<double>(rows.size());
      n += static_cast<int64_t>(rows.size());
    }
    return sum / static_cast<double>(n);
  };

  ResidualDistill out;
  ResidualMap trained = *init;
  std::vector<at::Tensor> params;
  for (at::Tensor* p : {&trained.weight, &trained.bias, &trained.anchor}) {
    if (!p->defined()) continue;
    *p = p->to(at::kFloat).clone().set_requires_grad(true);
    params.push_back(*p);
  }
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  for (const at::Tensor& p : params) {
    exp_avg.push_back(at::zeros_like(p));
    exp_avg_sq.push_back(at::zeros_like(p));
  }
  auto snapshot = [&] {
    ResidualMap m = trained;
    for (at::Tensor* p : {&m.weight, &m.bias, &m.anchor}) {
      if (p->defined()) *p = p->detach().clone();
    }
    return m;
  };
  out.translate_kl = mean_kl(ResidualMap{});
  out.initial_kl = out.best_kl = mean_kl(trained);
  out.map = snapshot();
  out.curve.push_back({0, out.initial_kl});
  TrainOptions schedule;
  schedule.n_steps = o.steps;
  schedule.lr = o.lr;
  schedule.warmup = o.warmup;
  schedule.min_lr_ratio = 0.1;
  ProgressOptions popts;
  popts.label = "distill-residual";
  popts.total = o.steps;
  popts.unit = "step";
  popts.out = o.progress ? stderr : nullptr;
  ProgressBar bar(popts);
  constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  c10::AutoGradMode grad_on(true);
  for (int64_t step = 1; step <= o.steps; ++step) {
    std::vector<at::Tensor> rows;
    for (int64_t off : BatchOffsets(o.seed, step, o.batch, window - 1, n_train)) {
      rows.push_back(train_ids.narrow(0, off, window));
    }
    at::Tensor loss =
        ResidualDistillKl(pair.source, pair.target, translator, trained, at::stack(rows), o.prefix);
    loss.backward();
    const double kl = loss.item<double>();
    if (!std::isfinite(kl)) {
      return absl::InternalError(absl::StrCat("distillation diverged: KL ", kl, " at step ", step));
    }
    {
      c10::AutoGradMode no_grad(false);
      const double lr = LearningRate(schedule, step);
      const double bc1 = 1.0 - std::pow(kBeta1, static_cast<double>(step));
      const double bc2 = 1.0 - std::pow(kBeta2, static_cast<double>(step));
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor p = params[i];
        const at::Tensor g = p.grad();
        exp_avg[i].mul_(kBeta1).add_(g, 1 - kBeta1);
        exp_avg_sq[i].mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
        if (o.weight_decay > 0) p.mul_(1 - lr * o.weight_decay);
        p.addcdiv_(exp_avg[i] / bc1, (exp_avg_sq[i] / bc2).sqrt_().add_(kEps), -lr);
        p.mutable_grad().zero_();
      }
    }
    if (step % o.eval_every == 0 || step == o.steps) {
      const double v = mean_kl(trained);
      out.curve.push_back({step, v});
      if (v < out.best_kl) {
        out.best_kl = v;
        out.best_step = step;
        out.map = snapshot();
      }
    }
    bar.Update(step, absl::StrCat("kl ", kl, " valid ", out.curve.back().second));
  }
  bar.Finish();
  return out;
}

}  // namespace kvl::training
