// Training a Qwen3-architecture decoder from scratch (`kvl train-lm`,
// docs/training.md): next-token cross-entropy on random windows of a
// tokenized text, AdamW with warm-up and cosine decay, global-norm gradient
// clipping, optional bf16 autocast on CPU, checkpoints that resume exactly,
// a JSONL log, a loss-curve PNG and a Hub-format model directory.
//
// The forward is ReferenceForward (model/reference.h) under autograd; master
// weights and optimizer state stay float32.
//
// Legend: B=batch, T=seq_len, V=vocab_size.
//
// Thread safety: TrainLm sets LibTorch's process-wide intra-op thread count
// and autocast state; run one training per process.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/tokenizer.h"

namespace kvl::training {

struct TrainOptions {
  std::string config_path;     // model config.json (ModelConfig::FromFile)
  std::string tokenizer_path;  // tokenizer.json, or a directory holding it
  std::string train_path;      // training text
  std::string valid_path;      // validation text; empty: no validation loss
  std::string out_dir;         // model directory (Hub format) + train_state/, logs, plot
  uint64_t seed = 0;
  int64_t n_steps = 1000;      // total optimizer steps of the whole run (sets the schedule)
  int64_t batch = 8;
  int64_t seq_len = 512;
  // Windows start at the beginning of a conversation (an <|im_start|> after an
  // empty line, or the start of the text) instead of anywhere: a window then
  // holds whole short conversations, so a question and the context it needs
  // are seen together. Falls back to anywhere for text without conversations.
  bool align_to_conversations = true;
  // Loss weight of the tokens an assistant wrote (the content of each
  // assistant message and its <|im_end|>) relative to every other token: the
  // step loss is sum(w * nll) / sum(w). 1 is the plain language-model loss.
  double assistant_weight = 1.0;
  // Weight of the mixture-of-experts load-balancing loss (LoadBalancingLoss)
  // added to the step loss; 0: none. Only for a model with experts.
  double router_aux_loss = 0;
  double lr = 3e-3;            // peak learning rate
  int64_t warmup = 50;         // linear warm-up steps (from lr/warmup)
  double min_lr_ratio = 0.1;   // cosine decays to min_lr_ratio * lr at n_steps
  double weight_decay = 0.1;   // decoupled, on matrices only (not norms or biases)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip = 1.0;           // global gradient norm limit; <= 0: off
  bool bf16 = false;           // bf16 autocast for the training forward/backward
  // The training forward's attention: grouped (training::GroupedAttention,
  // the fast one) or eager (model/reference.h's, the decoder tests' oracle).
  bool grouped_attention = true;
  int n_threads = 0;           // 0: all cores
  int64_t eval_every = 100;    // validation loss every K steps (and at the end); 0: end only
  int64_t eval_tokens = 32768; // validation tokens predicted per evaluation
  int64_t checkpoint_every = 0;  // checkpoint every K steps (and at the end); 0: end only
  int64_t stop_after = 0;      // stop (with a checkpoint) once this step is done; 0: run to n_steps
  bool resume = false;         // continue from out_dir/train_state
  // Start from this model directory's weights instead of a random
  // initialisation (a curriculum's next stage); the optimizer state and the
  // schedule start fresh. Its config must have --config's shapes.
  std::string init_from;
  DType save_dtype = DType::kFloat32;  // dtype of the exported model.safetensors
  bool progress = true;        // progress bar on stderr
  bool plot = true;            // write loss.png (needs gnuplot)
};

struct StepRecord {
  int64_t step = 0;  // 1-based: the optimizer step just taken
  double loss = 0;   // training loss of this step's batch (before the update)
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double tokens_per_s = 0;
  double valid_loss = -1;  // at evaluation steps, else -1
  double router_aux = -1;  // the batch's load-balancing loss when one is trained, else -1
};

struct TrainResult {
  int64_t start_step = 0;  // 0, or the step a resumed run continued from
  int64_t steps_done = 0;  // the last step completed
  int64_t n_params = 0;
  int64_t n_train_tokens = 0;  // tokens in the training text
  int64_t tokens_seen = 0;     // B * T * steps_done
  double wall_s = 0;           // this invocation
  double mean_step_s = 0;      // this invocation, excluding evaluation and checkpoints
  double initial_valid_loss = -1;  // before the first step of a fresh run
  double final_train_loss = 0;     // mean of the last min(20, steps) step losses of this invocation
  double final_valid_loss = -1;
  std::vector<StepRecord> log;     // steps of this invocation
};

// Sets LibTorch's intra-op threads and, when LibTorch runs on OpenBLAS, its
// separate pthread pool too (at::set_num_threads does not size it, and its
// idle workers spin in sched_yield, which slows 2-thread steps on a busy
// 2-core machine; docs/training.md). n_threads <= 0: all cores. Returns
// the count set. Process-wide.
int SetIntraOpThreads(int n_threads);

// bf16 CPU autocast for the forward of one training step: on for the scope's
// lifetime, then off, with the autocast weight cache cleared (it holds bf16
// copies of this step's weights, which the optimizer step makes stale) and the
// previous autocast dtype restored. Not nestable.
class Bf16AutocastScope {
 public:
  Bf16AutocastScope();
  ~Bf16AutocastScope();
  Bf16AutocastScope(const Bf16AutocastScope&) = delete;
  Bf16AutocastScope& operator=(const Bf16AutocastScope&) = delete;

 private:
  at::ScalarType dtype_before_;
};

// The learning rate at 1-based step s: lr * s / warmup during warm-up, then
// cosine from lr down to min_lr_ratio * lr at n_steps.
double LearningRate(const TrainOptions& options, int64_t step);

// Start offsets of the `batch` training windows (seq_len + 1 tokens each) of a
// 1-based step: a pure function of (seed, step), so a resumed run sees exactly
// the batches the uninterrupted run would have.
std::vector<int64_t> BatchOffsets(uint64_t seed, int64_t step, int64_t batch, int64_t seq_len,
                                  int64_t n_tokens);
// The same, drawn from a list of allowed start offsets (non-empty).
std::vector<int64_t> BatchOffsets(uint64_t seed, int64_t step, int64_t batch,
                                  const std::vector<int64_t>& starts);

// One "<|im_start|>ROLE\n" line of a ChatML token stream: `start` is the
// <|im_start|> token, `end` the token whose text ends the line, `role` the
// text between them ("user", "assistant", ...).
struct ChatRoleLine {
  int64_t start = 0, end = 0;
  std::string role;
};
// Every role line of `tokens`, in order (none when the tokenizer lacks the
// ChatML tokens).
std::vector<ChatRoleLine> ChatRoleLines(const Tokenizer& tokenizer,
                                        const std::vector<int32_t>& tokens);

// Per token of `tokens`: 1 when it belongs to an assistant message's content
// or is the <|im_end|> closing it, else 0.
std::vector<uint8_t> AssistantTokenMask(const Tokenizer& tokenizer,
                                        const std::vector<int32_t>& tokens);

// Offsets of the <|im_start|> tokens that begin a conversation in `tokens`
// (at offset 0, or whose preceding text ends with an empty line) and leave
// room for a window of seq_len + 1 tokens.
std::vector<int64_t> ConversationStarts(const Tokenizer& tokenizer,
                                        const std::vector<int32_t>& tokens, int64_t seq_len);

// Hugging Face's load-balancing loss of a mixture of experts (transformers'
// load_balancing_loss_func, from Switch Transformers), over every sparse
// layer's tokens together: n_expert * sum over top-k slots s and experts e of
// (share of tokens whose slot s chose e) * (mean router probability of e).
// It is n_expert_used when routing is uniform and balanced, n_expert when
// every token goes to the same experts with all the probability. probs: per
// layer [N, n_expert] float32; experts: per layer [N, k] int64.
at::Tensor LoadBalancingLoss(const std::vector<at::Tensor>& probs,
                             const std::vector<at::Tensor>& experts, int64_t n_expert);

// Runs (or resumes) training. Writes, in out_dir: the model (config.json,
// model.safetensors, generation_config.json, tokenizer files) at every
// checkpoint; train_state/{optimizer.safetensors,state.json}; train_log.jsonl;
// loss.png (+ loss.dat, loss.gp); summary.json at the end.
// Errors: NotFound for missing inputs, InvalidArgument for bad options, a
// config whose vocabulary is smaller than the tokenizer's, too little text for
// one window, or --resume without a matching train_state (FailedPrecondition
// when out_dir holds a run with other settings); PermissionDenied / DataLoss
// naming the file when a result (train_log.jsonl, summary.json, ...) cannot be
// written.
absl::StatusOr<TrainResult> TrainLm(const TrainOptions& options);

}  // namespace kvl::training
