// Stage 1 of translator training (KV-Lingo §3.2): closed-form ridge fits of
// every map from second moments accumulated in float64 over a corpus, plus the
// R² statistics that choose layer assignments for unequal depths.
// translator/README.md has the math.
//
// Legend: L_s/L_t = n_layer of source/target, H = n_head_kv, D = head_dim,
// T = tokens, N_in = L_s*H_s*D_s, N_out = L_t*H_t*D_t.
//
// Thread-safety: a MomentAccumulator is driven by one thread at a time; Fit and
// SingleLayerR2 are const and may run concurrently with each other.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/kv_cache.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "translator/translator.h"

namespace kvl {
class Engine;
}  // namespace kvl

namespace kvl::training {

struct FitResult {
  std::unique_ptr<Translator> translator;
  // Per target layer, in-sample R² = 1 - ΣSSE/ΣSST over the layer's output
  // dimensions (SST about the weighted mean), from the same moments.
  std::vector<double> r2_keys, r2_values;
};

struct SingleLayerR2Table {
  at::Tensor keys, values;  // [L_t, L_s] float64: R² of target layer il_t from source il_s alone
};

class MomentAccumulator {
 public:
  // Shapes only are read from the endpoints. The moments are joint over keys
  // and values (rows x = [source keys, source values, anchors, 1], y = [target
  // keys, target values]) so that split and joint maps (MapInputs) solve from
  // the same pass: 8*((2*N_in+A+1)^2 + (2*N_in+A+1)*2*N_out + 2*N_out) bytes;
  // ResourceExhausted above max_bytes. With an anchor table [V, E]
  // (AnchorTable) and a window W >= 1, every map also reads the token anchors
  // (A = W*E columns, translator.h); without, A = 0.
  static absl::StatusOr<std::unique_ptr<MomentAccumulator>> Create(
      const TranslatorEndpoint& source, const TranslatorEndpoint& target,
      int64_t max_bytes = int64_t{8} << 30, const at::Tensor& anchor_table = {},
      int64_t anchor_window = 0);

  // Adds the tokens of one aligned span: source taps [L_s, H_s, T, D_s] and
  // target taps [L_t, H_t, T, D_t] of the same T tokens (KvCache::Taps, any
  // float dtype). weights: optional [T] non-negative per-token weights w_t
  // (undefined: all 1), which multiply the rows: X^T W X, X^T W Y. ids: with
  // anchors, the span's T token ids, the span starting the conversation.
  // InvalidArgument on shape mismatch or missing ids.
  absl::Status Add(const KvTaps& source, const KvTaps& target, const at::Tensor& weights = {},
                   const std::vector<int64_t>& ids = {});

  int64_t n_tokens() const { return n_tokens_; }
  int64_t n_spans() const { return n_spans_; }
  int64_t Bytes() const;

  // Solves every map of spec.assignment, reading spec.inputs (InputBlocks;
  // spec.bias decides the bias column):
  //   W = (A + λ·(tr(A_x)/d)·I_x)^-1 B,  A = X^T W X over [x, 1], B = X^T W Y,
  // where I_x covers the d input dimensions but not the bias. Cholesky in
  // float64; a pseudo-inverse when the system is not positive definite.
  // spec.training.ridge / n_tokens / n_sequences (= n_spans) are filled in.
  // FailedPrecondition before any token was added; InvalidArgument for a spec
  // whose shapes differ from the accumulator's.
  absl::StatusOr<FitResult> Fit(TranslatorSpec spec, double ridge) const;

  // R² of each (target layer, source layer) pair fitted alone, keys and values.
  absl::StatusOr<SingleLayerR2Table> SingleLayerR2(bool bias, double ridge) const;

  // Greedy match (KV-Lingo appendix H): per target layer, and separately for
  // keys and values, grows the source support one layer at a time, each time
  // adding the source layer whose joint fit with those already chosen has the
  // highest in-sample R², until `band` layers (listed in ascending order).
  // Unlike the top-R² assignment it accounts for redundancy among the chosen
  // layers. InvalidArgument unless 1 <= band <= L_s; FailedPrecondition
  // before any token was added.
  absl::StatusOr<LayerAssignment> GreedyAssignment(int64_t band, bool bias, double ridge) const;

 private:
  MomentAccumulator() = default;
  // Solves one map: source blocks `blocks` (InputBlocks, concatenated) ->
  // target layer il's keys (values == false) or values. Returns W [in(+1),
  // out] and writes the R² of the fit.
  at::Tensor SolveOne(const std::vector<int64_t>& blocks, int64_t il, bool values, bool bias,
                      double ridge, double* r2) const;

  // The column of the ones (the bias): after the taps and the anchors.
  int64_t OnesColumn() const { return 2 * n_in_ + n_anchor_; }

  TranslatorEndpoint source_, target_;
  int64_t n_in_ = 0, n_out_ = 0;  // per side: L_s*H_s*D_s, L_t*H_t*D_t
  int64_t anchor_window_ = 0, n_anchor_ = 0;  // W and A = W*E
  at::Tensor anchor_table_;                    // [V, E] float64; undefined without anchors
  at::Tensor xx_;  // [2*N_in+A+1, 2*N_in+A+1] float64; last row/column: the ones column
  at::Tensor xy_;  // [2*N_in+A+1, 2*N_out] float64
  at::Tensor yy_;  // [2*N_out] float64: Σ w y²
  int64_t n_tokens_ = 0, n_spans_ = 0;
};

// Runs ids (one sequence, tokens of both models' shared tokenizer) through
// source and target into fresh cache lines and adds the aligned taps of all
// tokens with uniform weights (and their ids, for anchors). Errors as
// Engine::Prefill's.
absl::Status AccumulateSequence(Engine& source, Engine& target, const std::vector<int64_t>& ids,
                                MomentAccumulator& moments);

// Across tokenizers (issue 54; KV-Lingo appendix K): `text` encoded by each
// model's own tokenizer (special tokens parsed), the two tokenizations
// aligned into minimal matching groups (model/token_alignment.h), both
// models prefilled with their own ids. `source`: the source's taps of all
// its tokens; `target`: in the same token order, the mean of the target's
// taps over each source token's group, what the paper's stage 1 regresses
// each source token onto. Identical tokenizations give the target's own
// taps. Errors: the engines', and InvalidArgument from TokenByteLengths /
// AlignByBytes when a tokenizer does not spell the text back (a normalizer
// that rewrites it).
struct AlignedTaps {
  KvTaps source, target;  // [L_s, H_s, n, D_s] and [L_t, H_t, n, D_t], n source tokens
  int64_t n_groups = 0, n_one_to_one = 0;
};
absl::StatusOr<AlignedTaps> AlignTaps(Engine& source, const Tokenizer& source_tokenizer,
                                      Engine& target, const Tokenizer& target_tokenizer,
                                      std::string_view text);

// The same text in the target's token order, as a switch translates it: rows
// are the target's tokens; `source` holds the source's taps resampled onto
// them (AssignWithinGroups, ResampleTaps: each row the mean of its run of
// source tokens), `target` the target's own taps, `target_ids` its ids (for
// token anchors, which read the target's embeddings). The fit with token
// anchors across tokenizers regresses these rows.
struct TargetAlignedTaps {
  AlignedTaps taps;  // n = the target's tokens
  std::vector<int64_t> target_ids;
};
absl::StatusOr<TargetAlignedTaps> AlignTapsOnTarget(Engine& source,
                                                    const Tokenizer& source_tokenizer,
                                                    Engine& target,
                                                    const Tokenizer& target_tokenizer,
                                                    std::string_view text);

// Stage 1 from a corpus, as `kvl fit` runs it: both models prefill every
// sequence of `data_path` (ReadSequences), their taps are accumulated (each
// token weighted uniformly, or by the attention the target's continuation
// queries give it: KV-Lingo appendix O), the assignment is chosen and the
// maps are solved.
struct CorpusFitOptions {
  std::string source_dir, target_dir, data_path;
  // "same_index", "relative_depth", "top_r2" or "greedy"; empty: same_index
  // when the depths match and band_all is off, else relative_depth.
  std::string assignment;
  int64_t band = 1;
  bool band_all = false;  // every target layer reads every source layer
  MapInputs inputs = MapInputs::kSplit;
  double ridge = 1e-4;  // relative to the mean input second moment
  bool bias = true;
  // "uniform", or "attention": each sequence's last attention_queries tokens
  // (half the sequence when it is shorter than twice that) act as
  // continuation queries, and only the tokens before them are fitted.
  std::string weighting = "uniform";
  int64_t attention_queries = 64;
  // W >= 1: token-anchored maps reading the target's anchor rows of tokens
  // t..t-W+1 (translator.h); 0: none.
  int64_t anchor_window = 0;
  // R >= 1: the anchor table at rank R, the target's normalised embeddings in
  // their top R principal directions (AnchorTable), so that the anchors of a
  // real vocabulary fit in memory; 0: the embeddings' full width.
  int64_t anchor_rank = 0;
  int64_t max_sequences = 512, seq_len = 256;
  int n_threads = 0;
  bool progress = true;  // a progress bar on stderr
};

struct CorpusFit {
  TranslatorSpec spec;  // as fitted: the chosen assignment and band
  FitResult fit;
  SingleLayerR2Table single;
  int64_t n_sequences = 0, n_tokens = 0;
  // Across tokenizers (AlignTaps): the minimal matching groups of all
  // sequences, and how many paired one token with one token.
  int64_t n_groups = 0, n_one_to_one = 0;
};

// Models with different tokenizers are fitted across them: each sequence is
// decoded to text, which both encode with their own tokenizers, and each
// source token is regressed onto its group's mean target keys and values
// (AlignTaps; uniform weights, no token anchors).
// Errors: the loaders' (LoadModelDir), ReadSequences', InvalidArgument for an
// assignment the depths or band do not allow or for anchors or attention
// weights across tokenizers, the accumulator's.
absl::StatusOr<CorpusFit> FitFromCorpus(const CorpusFitOptions& options);

// The .r2.json report of a fit written to translator_path: the options, the
// per-layer R² of the fit, the assignment and the single-layer R² tables.
nlohmann::json CorpusFitReport(const CorpusFitOptions& options, const CorpusFit& fit,
                               const std::string& translator_path);

}  // namespace kvl::training
