// Evaluation of KV-cache translators (`kvl eval-translator`,
// docs/translators.md) on held-out data, for one source -> target direction.
//
// 1. Continuation log-perplexity. Windows of P + C + 1 tokens (consecutive,
//    from the start of the data stream). The target predicts tokens
//    [P + 1, P + C] while processing [P, P + C) — the last prefix token is held
//    back, as at a switch — under four conditions:
//      target_native  the target prefilled [0, P) itself;
//      translated     the source prefilled [0, P), the translator turned its
//                     taps into the target's cache (one row per translator);
//      no_prefix      no cache at all: the target sees only [P, P + C];
//      source_native  the source model itself, on its own cache (a reference).
//    gap = translated - target_native; recovered = (no_prefix - translated) /
//    (no_prefix - target_native); both over all C positions and the first 32.
// 2. Suite accuracy: greedy answers of target_native, source_native and each
//    translated condition (source prefills the prompt but its last token; the
//    target decodes from the translated cache after processing that token),
//    scored as `kvl eval` scores them (training/eval_lm.h).
// 3. Multi-turn: windows of (n_switches + 1) turns of turn_len tokens. Turn 0
//    is written by the source, then the models alternate, so every later turn
//    is a switch. The model taking turn k holds a cache of the tokens before
//    the turn's last-preceding token and processes that token plus the turn
//    (teacher forcing); we report its mean NLL over the turn's tokens, per
//    turn, for three ways of obtaining that cache:
//      (a) span-wise: keep its own cache line and translate only the span the
//          other model wrote natively since (never a translation of a
//          translation), but for the last native_tail tokens of the history,
//          which it processes itself with the turn (as the router does);
//      (b) whole prefix: translate the other model's entire current cache
//          line (translated spans included) at each switch;
//      (c) re-prefill: the model's native cache of the whole history.
//    Needs translators in both directions.
//
// Across tokenizers (issue 54), 1. and 2. run in the target's tokens: a
// translated condition's source reads the text of the target's prefix (or
// prompt) in its own tokens and the translation lands on the target's tokens
// up to the last minimal matching group boundary at or before the cut
// (TranslatedCacheAcross); the target reads the rest itself. source_native is
// left out of 1. (its NLL is over other tokens) and answers 2. in its own
// tokens; 3. needs one tokenizer.
//
// Legend: P=prefix tokens, C=continuation tokens scored, V=vocab_size.
//
// Thread safety: RunTranslatorEval sets LibTorch's process-wide thread count.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "nlohmann/json_fwd.hpp"

namespace kvl::training {

struct TranslatorEvalOptions {
  std::string source_dir, target_dir;
  std::vector<std::string> translators;  // source -> target files (e.g. closed-form, distilled)
  std::string data_path;                 // held-out .jsonl chats or text
  int64_t prefix = 255;                  // P
  int64_t continuation = 128;            // C
  int64_t max_windows = 64;              // 0: all that fit
  int64_t first_k = 32;                  // the "first tokens" statistics
  std::vector<std::string> suites;       // suite files (suites/test_<task>.jsonl)
  int64_t suite_limit = 50;              // items per suite file (0: all)
  int64_t max_new_tokens = 64;
  // Multi-turn: forward (source -> target) and reverse (target -> source)
  // translators; both empty: no multi-turn run.
  std::string multi_turn_forward, multi_turn_reverse;
  int64_t n_switches = 8;
  int64_t turn_len = 64;
  int64_t multi_turn_runs = 16;
  // The translators' arithmetic (Translator::Translate): float32 or bfloat16.
  DType translate_dtype = DType::kFloat32;
  // Translated conditions of 1. and 2., and multi-turn (a): the target
  // prefills the last native_tail prefix (prompt, span) tokens itself, on top
  // of the translation of the ones before (0: the plain switch; the router's
  // routing.native_tail_tokens); a prompt no longer than the tail plus its
  // last token is all the target's own. Multi-turn (b) ignores it.
  int64_t native_tail = 0;
  // Across tokenizers: the translated conditions of 1. and 2. fill every
  // group that is not one token to one token by the target's own prefill
  // (UnevenGroups::kPrefill) instead of translating it.
  bool prefill_uneven_groups = false;
  int n_threads = 0;
  bool progress = true;
};

struct PplCondition {
  std::string name;  // target_native | no_prefix | source_native | translated:<file>
  double log_ppl = 0, log_ppl_first = 0;  // mean NLL, nats/token
};

struct TranslatedPpl {
  std::string file, method;
  double log_ppl = 0, log_ppl_first = 0;
  double gap = 0, gap_first = 0;
  double recovered = 0, recovered_first = 0;
  // Standard errors over the windows (paired with the native and no-prefix
  // runs on the same windows; the shares' by the delta method for a ratio of
  // means). 0 with fewer than two windows.
  double gap_se = 0, gap_first_se = 0;
  double recovered_se = 0, recovered_first_se = 0;
};

// The standard error of mean(a) / mean(b) over paired samples (delta method):
// sqrt(sum((a_i - R b_i)^2) / (n (n - 1))) / |mean(b)|, R = mean(a) / mean(b).
// 0 with fewer than two samples.
double RatioOfMeansStandardError(const std::vector<double>& a, const std::vector<double>& b);
// The standard error of the mean of a - b over paired samples.
double PairedDifferenceStandardError(const std::vector<double>& a, const std::vector<double>& b);

struct AccuracyCell {
  int64_t n_items = 0, n_correct = 0, n_over_context = 0;
  double Accuracy() const {
    return n_items ? static_cast<double>(n_correct) / static_cast<double>(n_items) : 0;
  }
};

struct MultiTurnRow {
  int64_t turn = 0;
  std::string model;  // "source" | "target"
  double span_wise = 0, whole_prefix = 0, reprefill = 0;  // mean NLL of the turn's tokens
};

struct TranslatorEvalReport {
  int64_t n_windows = 0, prefix = 0, continuation = 0, first_k = 0;
  DType translate_dtype = DType::kFloat32;
  int64_t native_tail = 0;
  bool prefill_uneven_groups = false;
  std::vector<PplCondition> conditions;
  std::vector<TranslatedPpl> translated;
  // condition -> task -> cell ("all" included); conditions in column order.
  std::vector<std::string> accuracy_conditions;
  std::map<std::string, std::map<std::string, AccuracyCell>> accuracy;
  std::vector<MultiTurnRow> multi_turn;
  int64_t multi_turn_runs = 0, turn_len = 0;
  // Across tokenizers: the minimal matching groups of every translated span
  // of part 1 (all translators), and how many were one token to one token.
  int64_t align_groups = 0, align_one_to_one = 0;
  double wall_s = 0;
};

// Errors: those of loading models, translators (FailedPrecondition for a
// translator built for other models), data and suites; InvalidArgument for
// bad options or data too short for one window.
absl::StatusOr<TranslatorEvalReport> RunTranslatorEval(const TranslatorEvalOptions& options);

nlohmann::json TranslatorEvalJson(const TranslatorEvalOptions& options,
                                  const TranslatorEvalReport& report);
std::string TranslatorEvalTable(const TranslatorEvalReport& report);

}  // namespace kvl::training
