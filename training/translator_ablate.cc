#include "training/translator_ablate.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "model/reference.h"
#include "training/translator_distill.h"

namespace kvl::training {
namespace {

// Which layers read native keys / values in one condition.
struct Mix {
  std::vector<bool> native_keys, native_values;
};

}  // namespace

absl::StatusOr<LayerAblation> AblateTranslator(const TranslatorModel& source,
                                               const TranslatorModel& target,
                                               const Translator& translator,
                                               const std::vector<std::vector<int64_t>>& windows,
                                               int64_t n_prefix, int64_t batch) {
  if (windows.empty() || batch < 1) {
    return absl::InvalidArgumentError("ablation needs at least one window and batch >= 1");
  }
  const int64_t window = static_cast<int64_t>(windows[0].size());
  const int64_t n_cont = window - n_prefix;
  if (n_prefix < 1 || n_cont < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("windows of ", window, " tokens leave no prefix or continuation after ",
                     n_prefix));
  }
  for (const std::vector<int64_t>& w : windows) {
    if (static_cast<int64_t>(w.size()) != window) {
      return absl::InvalidArgumentError("all windows must have the same length");
    }
  }
  const TranslatorSpec& spec = translator.spec();
  const ModelConfig& tc = target.config();
  const int64_t n_layer = tc.n_layer;

  // The conditions, in the order their results are stored below.
  std::vector<Mix> mixes;
  const std::vector<bool> none(n_layer, false), all(n_layer, true);
  mixes.push_back({none, none});
  mixes.push_back({all, none});
  mixes.push_back({none, all});
  for (int64_t l = 0; l < n_layer; ++l) {
    std::vector<bool> one = none, but = all;
    one[l] = true;
    but[l] = false;
    mixes.push_back({one, one});
    mixes.push_back({but, but});
  }
  std::vector<AblationKl> sums(mixes.size());

  c10::AutoGradMode no_grad(false);
  const size_t n = windows.size();
  for (size_t i = 0; i < n; i += static_cast<size_t>(batch)) {
    const size_t j = std::min(n, i + static_cast<size_t>(batch));
    std::vector<at::Tensor> rows;
    for (size_t r = i; r < j; ++r) rows.push_back(at::tensor(windows[r], at::kLong));
    const at::Tensor ids = at::stack(rows);  // [B, P + C]
    const at::Tensor teacher = at::log_softmax(
        ReferenceForward(tc, target.weights32, ids).logits.narrow(1, n_prefix, n_cont), -1);
    ReferenceOptions capture;
    capture.capture_kv = true;
    capture.last_logits_only = true;
    const at::Tensor prefix = ids.narrow(1, 0, n_prefix);
    const ReferenceOutput from_source =
        ReferenceForward(source.config(), source.weights32, prefix, capture);
    const ReferenceOutput native = ReferenceForward(tc, target.weights32, prefix, capture);
    const at::Tensor anchors =
        spec.anchor_window > 0
            ? AnchorBatch(translator.anchor_table(), prefix, spec.anchor_window)
            : at::Tensor();
    const TranslatedBatch translated =
        TranslateBatchKv(spec, translator.key_maps(), translator.value_maps(),
                         from_source.keys_prenorm, from_source.values, anchors);
    const std::vector<at::Tensor>& keys = translated.keys;
    const std::vector<at::Tensor>& values = translated.values;
    const at::Tensor continuation = ids.narrow(1, n_prefix, n_cont);
    for (size_t m = 0; m < mixes.size(); ++m) {
      ReferenceOptions mixed;
      for (int64_t l = 0; l < n_layer; ++l) {
        mixed.prefix_keys.push_back(mixes[m].native_keys[l] ? native.keys_prenorm[l] : keys[l]);
        mixed.prefix_values.push_back(mixes[m].native_values[l] ? native.values[l] : values[l]);
      }
      const at::Tensor student =
          at::log_softmax(ReferenceForward(tc, target.weights32, continuation, mixed).logits, -1);
      const at::Tensor kl = (teacher.exp() * (teacher - student)).sum(-1);  // [B, C]
      sums[m].all += kl.sum().item<double>();
      sums[m].first += kl.select(1, 0).sum().item<double>();
    }
  }
  for (AblationKl& s : sums) {
    s.all /= static_cast<double>(n * static_cast<size_t>(n_cont));
    s.first /= static_cast<double>(n);
  }
  LayerAblation out;
  out.n_windows = static_cast<int64_t>(n);
  out.translated = sums[0];
  out.keys_native = sums[1];
  out.values_native = sums[2];
  for (int64_t l = 0; l < n_layer; ++l) {
    out.layer_native.push_back(sums[3 + 2 * l]);
    out.only_layer.push_back(sums[4 + 2 * l]);
  }
  return out;
}

}  // namespace kvl::training
