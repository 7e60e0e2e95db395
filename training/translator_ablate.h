// Which target layers' translated keys and values cost the most (`kvl
// ablate-translator`): the target reads its cache of a prefix with some
// layers taken from its own prefill (native) and the rest translated, and we
// measure KL(target on its native cache || target on that mixed cache) over
// the continuation, as `kvl distill` does (training/translator_distill.h).
//
// Legend: L_t = target layers, N = windows, P = prefix, C = continuation.
//
// Thread safety: one call at a time per pair of models.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "training/translator_data.h"
#include "translator/translator.h"

namespace kvl::training {

// Mean KL per continuation position over all C positions (`all`) and over the
// first one only (`first`: the prediction right after the hand-over).
struct AblationKl {
  double all = 0, first = 0;
};

struct LayerAblation {
  int64_t n_windows = 0;
  AblationKl translated;    // every layer translated: what a switch does
  AblationKl keys_native;   // every layer's keys native, values translated
  AblationKl values_native; // every layer's values native, keys translated
  std::vector<AblationKl> layer_native;  // [L_t]: that layer native, the rest translated
  std::vector<AblationKl> only_layer;    // [L_t]: that layer translated, the rest native
};

// windows: N x (P + C) token ids; batch: windows per forward pass.
absl::StatusOr<LayerAblation> AblateTranslator(const TranslatorModel& source,
                                               const TranslatorModel& target,
                                               const Translator& translator,
                                               const std::vector<std::vector<int64_t>>& windows,
                                               int64_t n_prefix, int64_t batch = 16);

}  // namespace kvl::training
