// The native-depth dial's residual maps (translator/translator.h,
// ResidualMap), fitted in closed form: per target layer j, a ridge regression
// of the target's residual stream at the input of layer j on what the source
// keeps (the keys and values of the chosen source layers) and, when the K/V
// maps are token-anchored, the same anchor rows. Moments in float64 over a
// corpus, as training/translator_fit.h's.
//
// Thread-safety: a call owns everything it loads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "training/translator_data.h"
#include "translator/translator.h"

namespace kvl::training {

struct ResidualFitOptions {
  std::string data_path;
  // Target layers whose input is predicted; empty: every one of 1..L_t-1.
  std::vector<int64_t> layers;
  // The source layers each map reads (keys and values); empty: all.
  std::vector<int64_t> source_layers;
  double ridge = 1e-4;  // relative to the mean input second moment
  int64_t max_sequences = 256, seq_len = 512;
  bool progress = true;
};

struct ResidualFit {
  std::vector<ResidualMap> maps;  // by layer, ascending
  // Per map, in-sample R² = 1 - ΣSSE/ΣSST over the residual's dimensions.
  std::vector<double> r2;
  int64_t n_sequences = 0, n_tokens = 0;
};

// Prefills every sequence of the corpus (ReadSequences) with both models of
// `pair` and solves one map per layer; `translator` (from pair.source to
// pair.target) supplies the anchor table and window. Errors: ReadSequences' and the engines',
// FailedPrecondition for a translator built for other models,
// InvalidArgument for layers outside [1, L_t) or source layers outside
// [0, L_s), ResourceExhausted when the moments would pass 8 GiB.
absl::StatusOr<ResidualFit> FitResidualMaps(const ResidualFitOptions& options, TranslatorPair& pair,
                                            const Translator& translator);

// The native-depth dial's switch as a differentiable function, for windows
// ids [B, P + C]: the source's prefix keys and values (no grad) are
// translated by the translator's maps (no grad) for the target's layers
// below map.layer; the map predicts the residual stream at that layer's
// input (autograd through map.weight / bias / anchor), from which the
// target computes its layers map.layer .. L_t-1 over the prefix; the target
// then reads ids[P, P + C) after that cache. Returns the mean KL(target on
// its native cache || target on the hybrid one) over the C positions. With
// an undefined map.weight: the plain translation's KL (k = 0).
at::Tensor ResidualDistillKl(const TranslatorModel& source, const TranslatorModel& target,
                             const Translator& translator, const ResidualMap& map,
                             const at::Tensor& ids, int64_t n_prefix);

// Stage 2 for a residual map (`kvl distill-residual`): AdamW on the map's
// weight, bias and anchor weight against ResidualDistillKl, windows of the
// training stream starting anywhere, the best map by validation KL kept.
struct ResidualDistillOptions {
  std::string train_path, valid_path;
  int64_t layer = 0;  // the map to distill (the translator must have it)
  int64_t prefix = 255, continuation = 64, batch = 4, steps = 300;
  double lr = 1e-3, weight_decay = 0.0;
  int64_t warmup = 20, eval_every = 50, valid_windows = 32;
  uint64_t seed = 1;
  bool progress = true;
};
struct ResidualDistill {
  ResidualMap map;          // the best by validation KL (the init when no step beat it)
  double translate_kl = 0;  // validation KL of the plain translation (k = 0)
  double initial_kl = 0, best_kl = 0;
  int64_t best_step = 0;
  std::vector<std::pair<int64_t, double>> curve;  // (step, validation KL)
};
// Errors: ReadTokenStream's, InvalidArgument for streams shorter than a
// window or a translator without the layer's map, InternalError when the KL
// diverges.
absl::StatusOr<ResidualDistill> DistillResidualMap(const ResidualDistillOptions& options,
                                                   const TranslatorPair& pair,
                                                   const Translator& translator);

}  // namespace kvl::training
