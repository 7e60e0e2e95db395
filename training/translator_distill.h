// Stage 2 of translator training (`kvl distill`, KV-Lingo §3.2, summary C/E):
// self-distillation with both models frozen. Only the maps train; they start
// from a closed-form translator file (stage 1, `kvl fit`).
//
// One training sample is a window of P + C tokens of the corpus stream
// (starting anywhere, or placed so that the prefix ends at a chat hand-over
// point: HandOver below):
//   source prefills ids[0, P) (ReferenceForward, capture_kv, no grad);
//   its pre-norm keys/values [B, H_s, P, D_s] per layer go through the maps
//     (autograd) to the target's pre-norm keys/values [B, H_t, P, D_t];
//   the target processes ids[P, P + C) — the held-back last prefix token and
//     the continuation — attending to the translated prefix (ReferenceForward
//     prefix_keys/values: the target's own k-norm and RoPE are applied to the
//     translated keys inside the graph), giving q_t [B, C, V];
//   the teacher is the target on its native cache: ReferenceForward over the
//     whole window, rows [P, P + C), p [B, C, V], no grad;
//   loss = mean over the B*C positions of KL(p || q).
//
// Across tokenizers (issue 54) the windows are the target's tokens and the
// source reads each prefix's text in its own, resampled onto the P target
// tokens (AcrossTokenizers below).
//
// Legend: B=batch, P=prefix tokens, C=continuation tokens (positions scored),
// L_s/L_t=n_layer, H=n_head_kv, D=head_dim, V=vocab_size, ν=source layers per map.
//
// Thread safety: Distill sets LibTorch's process-wide thread count; one per process.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "translator/translator.h"

namespace kvl::training {

// The differentiable form of Translator::Translate for a batch: source
// per-layer tensors L_s x [B, H_s, T, D_s] -> target L_t x [B, H_t, T, D_t],
// y = x·Wᵀ + b (+ a·Aᵀ with token anchors) with x the head-major concatenation
// of the listed source layers (translator.h) and a the anchor rows [B, T, W*E]
// (AnchorBatch; undefined without anchors). Gradients flow to maps (and
// source) when they require grad.
std::vector<at::Tensor> TranslateBatch(const std::vector<at::Tensor>& source,
                                       const std::vector<std::vector<int64_t>>& lists,
                                       const TranslatorMaps& maps,
                                       const TranslatorEndpoint& target,
                                       const at::Tensor& anchors = at::Tensor());

// The anchor rows of a batch of windows ids [B, T] (translator.h): [B, T, W*E]
// float32, offset k reading table[ids[:, t-k]] and zeros before a window's
// first token (a window is treated as the start of its conversation).
at::Tensor AnchorBatch(const at::Tensor& table, const at::Tensor& ids, int64_t window);

// Both sides of a translator for a batch, reading spec.inputs: source
// pre-norm keys and values L_s x [B, H_s, T, D_s] -> target pre-norm keys and
// values L_t x [B, H_t, T, D_t] (TranslateBatch over the InputBlocks).
struct TranslatedBatch {
  std::vector<at::Tensor> keys, values;
};
TranslatedBatch TranslateBatchKv(const TranslatorSpec& spec, const TranslatorMaps& keys,
                                 const TranslatorMaps& values,
                                 const std::vector<at::Tensor>& source_keys,
                                 const std::vector<at::Tensor>& source_values,
                                 const at::Tensor& anchors = at::Tensor());

// The whitening preconditioner of DistillOptions::whiten for the inputs x [N, d]
// (rows: tokens) gathered in float64: {P, P⁻¹}, both [d, d] float32 symmetric,
// P = (C + floor·tr(C)/d·I)^(-1/2) with C the covariance of the rows.
struct Whitening {
  at::Tensor p, p_inv;
};
Whitening WhiteningOf(const at::Tensor& xx, const at::Tensor& x_sum, int64_t n, double floor);

// Distillation across tokenizers (issue 54): the windows are the target's
// tokens, and the source reads the text of each window's prefix in its own
// tokens; its taps are resampled onto the prefix's target tokens
// (AssignWithinGroups, ResampleTaps), so the maps learn from the target's
// native distribution what the router's switch will feed them. Unset: one
// tokenizer, the source reads the target's ids.
struct AcrossTokenizers {
  const Tokenizer* source = nullptr;
  const Tokenizer* target = nullptr;
};

// The source's pre-norm keys and values of prefixes ids [B, P], per source
// layer [B, H_s, P, D_s], without autograd: its forward over ids or, across
// tokenizers, window by window over its own tokens of their text, resampled
// onto the P tokens. Throws (c10::Error) for a text a tokenizer cannot
// spell back (a window cut inside a UTF-8 character).
struct SourcePrefixKv {
  std::vector<at::Tensor> keys, values;
};
SourcePrefixKv SourcePrefixTaps(const ModelConfig& source_config,
                                const ModelWeights& source_weights, const at::Tensor& ids,
                                const AcrossTokenizers* across = nullptr);

// Mean KL(target native || target on translated prefix) per position over the
// continuation, for windows ids [B, P + C] (see the file comment); with
// `position_weights` [B, C], the weighted mean (0 when all weights are 0).
// With token anchors (spec.anchor_window > 0) `anchor_table` is the
// translator's; the prefix's anchor rows come from ids (AnchorBatch).
// Runs under autograd when the maps require grad; the models' weights should
// not. `across`: ids are the target's tokens (SourcePrefixTaps).
at::Tensor DistillKl(const ModelConfig& source_config, const ModelWeights& source_weights,
                     const ModelConfig& target_config, const ModelWeights& target_weights,
                     const TranslatorSpec& spec, const TranslatorMaps& keys,
                     const TranslatorMaps& values, const at::Tensor& ids, int64_t n_prefix,
                     const at::Tensor& position_weights = at::Tensor(),
                     const at::Tensor& anchor_table = at::Tensor(),
                     const AcrossTokenizers* across = nullptr);

// Where a training window's translated prefix ends (kvl distill --hand-over),
// i.e. which token p the target reads first itself:
//   any:   anywhere in the corpus stream;
//   reply: p is the last token of an assistant role line ("<|im_start|>assistant\n"),
//          so the target's first scored prediction is the reply's first token:
//          what kvl eval-translator's task prompts do;
//   turn:  p is the <|im_start|> of a user turn that follows an assistant turn
//          of the same conversation: a router switch (history translated, the
//          new turn prefilled by the target);
//   chat:  reply or turn.
enum class HandOver { kAny, kReply, kTurn, kChat };
absl::StatusOr<HandOver> ParseHandOver(std::string_view name);
std::string HandOverName(HandOver h);

// The positions p of a ChatML token stream where `h` lets a prefix hand over,
// ascending; empty for kAny (every position does) or a stream without ChatML.
std::vector<int64_t> HandOverPoints(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens,
                                    HandOver h);

// Start offsets of the windows of `window` tokens of `stream` whose first
// n_prefix tokens end at a hand-over point of kind `h` (kAny: every offset
// that fits), ascending.
std::vector<int64_t> HandOverWindowStarts(const Tokenizer& tokenizer,
                                          const std::vector<int32_t>& stream, HandOver h,
                                          int64_t n_prefix, int64_t window);

// The first of `starts` (ascending) that do not overlap the windows taken
// before them, at most max_windows, skipping those `keep` rejects (if given).
std::vector<int64_t> FirstDisjointWindows(const std::vector<int64_t>& starts, int64_t window,
                                          int64_t max_windows,
                                          const std::function<bool(int64_t)>& keep = nullptr);

struct DistillOptions {
  std::string source_dir, target_dir;
  std::string init_path;    // closed-form translator file (kvl fit)
  std::string train_path;   // .jsonl chats or text (ReadTokenStream)
  std::string valid_path;   // held-out .jsonl or text for validation KL
  std::string out_path;     // distilled translator; siblings .distill.{jsonl,json,png}
  int64_t prefix = 255;     // P: tokens the source prefills and the maps translate
  int64_t continuation = 128;  // C: held-back token + continuation, positions scored
  HandOver hand_over = HandOver::kAny;  // where training and validation prefixes end
  // Score only the continuation positions that predict an assistant reply's
  // tokens (its content and closing <|im_end|>), as the paper's recipe scores
  // the answer; windows without such a position are skipped. Needs a
  // hand_over other than kAny (InvalidArgument otherwise).
  bool score_assistant = false;
  int64_t batch = 8;
  int64_t steps = 600;
  double lr = 1e-3;         // peak, after linear warm-up
  double min_lr = 1e-4;     // cosine floor at the last step
  int64_t warmup = 30;
  double weight_decay = 0;  // decoupled, on the map weights (decays towards zero, not the init)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip = 1.0;        // global gradient-norm limit; <= 0: off
  int64_t eval_every = 50;  // validation KL every K steps (and at 0 and the end)
  int64_t valid_windows = 64;
  uint64_t seed = 0;
  int n_threads = 0;        // 0: all cores
  // bf16 CPU autocast for the training steps' forwards (the maps stay float32
  // master weights; the validation KL is always float32). Off by default.
  bool bf16 = false;
  // Train every map in whitened input coordinates: W = V·P with P = (C +
  // whiten_floor·tr(C)/d·I)^(-1/2), C the covariance of the map's inputs over
  // the source's prefixes of the first whiten_windows training windows; Adam
  // moves V (started at W·P⁻¹), so each step changes the translated output
  // alike along every input direction, whatever the scale and collinearity of
  // the source's keys and values. The files hold W as always.
  bool whiten = false;
  double whiten_floor = 1e-3;
  int64_t whiten_windows = 64;
  bool progress = true;
  bool plot = true;         // needs gnuplot
};

struct DistillRecord {
  int64_t step = 0;
  double kl = 0, lr = 0, grad_norm = 0, step_s = 0;
  double valid_kl = -1;  // at evaluation steps
};

struct DistillResult {
  double initial_valid_kl = 0;  // the closed-form init
  double best_valid_kl = 0;
  int64_t best_step = 0;        // 0: the init was never beaten (the file then holds it)
  double final_valid_kl = 0;
  double wall_s = 0, mean_step_s = 0;
  int64_t n_train_tokens = 0, n_valid_windows = 0;
  std::vector<DistillRecord> log;
};

// Runs stage 2 and writes out_path (method "distilled", steps = best_step)
// whenever the validation KL improves. Errors: those of loading the models and
// the init translator (FailedPrecondition when it was built for other models),
// InvalidArgument for bad options or corpora too short for one window,
// PermissionDenied / DataLoss naming the file when the log (<out>.distill.jsonl)
// or the summary (<out>.distill.json) cannot be written.
absl::StatusOr<DistillResult> Distill(const DistillOptions& options);

}  // namespace kvl::training
