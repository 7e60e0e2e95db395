// kvl train-lm: trains a Qwen3-architecture decoder from scratch
// (training/train_lm.h, docs/training.md).
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "model/config.h"
#include "tools/commands.h"
#include "training/progress.h"
#include "training/train_lm.h"

namespace kvl::tools {

using training::FormatCount;
using training::FormatDuration;
using training::TrainLm;
using training::TrainOptions;
using training::TrainResult;
int RunTrainLm(const Args& args) {
  TrainOptions o;
  std::string save_dtype = DTypeName(o.save_dtype);
  std::string windows = o.align_to_conversations ? "conversation" : "anywhere";
  std::string attention = o.grouped_attention ? "grouped" : "eager";
  bool no_plot = false, quiet = false;
  FlagSet flags(
      "kvl train-lm",
      "Trains from a random initialisation (or continues DIR/train_state with --resume,\n"
      "or starts from MODEL_DIR's weights with a fresh optimizer and schedule: --init-from;\n"
      "a run started with --init-from resumes with the same --init-from and --resume)\n"
      "and writes DIR as a Hugging Face model directory, plus train_log.jsonl, loss.png\n"
      "and summary.json. --windows conversation: training windows start at the beginning\n"
      "of a conversation; anywhere: at any token offset. --attention grouped is the fast\n"
      "attention; eager is the decoder tests' oracle, for timing comparisons.");
  flags.Required("config", &o.config_path, "config.json", "the model's config.json");
  flags.Required("tokenizer", &o.tokenizer_path, "DIR|tokenizer.json",
                 "the tokenizer, or a directory holding its tokenizer.json");
  flags.Required("train", &o.train_path, "train.txt", "the training text");
  flags.Add("valid", &o.valid_path, "valid.txt", "validation text (none: no validation loss)");
  flags.Required("out", &o.out_dir, "DIR", "the model directory to write");
  flags.Add("seed", &o.seed, "N", "initialisation and data-order seed");
  flags.Add("steps", &o.n_steps, "N", "optimizer steps of the whole run (sets the schedule)");
  flags.Add("batch", &o.batch, "B", "windows per step");
  flags.Add("seq-len", &o.seq_len, "T", "tokens per window");
  flags.Add("lr", &o.lr, "LR", "peak learning rate");
  flags.Add("warmup", &o.warmup, "N", "linear warm-up steps");
  flags.Add("min-lr-ratio", &o.min_lr_ratio, "R", "the cosine ends at R * --lr");
  flags.Add("weight-decay", &o.weight_decay, "W", "decoupled weight decay, on matrices only");
  flags.Add("clip", &o.clip, "C", "global gradient-norm limit, <= 0: off");
  flags.Switch("bf16", &o.bf16, "bf16 autocast for the training forward and backward");
  flags.Add("threads", &o.n_threads, "N", "intra-op threads, 0: all cores");
  flags.Add("eval-every", &o.eval_every, "K", "validation loss every K steps, 0: at the end only");
  flags.Add("eval-tokens", &o.eval_tokens, "N", "validation tokens predicted per evaluation");
  flags.Add("checkpoint-every", &o.checkpoint_every, "K",
            "checkpoint every K steps (and at the end), 0: at the end only");
  flags.Add("stop-after", &o.stop_after, "STEP",
            "stop with a checkpoint once this step is done, 0: run all --steps");
  flags.Switch("resume", &o.resume, "continue from DIR/train_state");
  flags.Add("init-from", &o.init_from, "MODEL_DIR",
            "start from this model's weights (same shapes as --config)");
  flags.Choice("save-dtype", &save_dtype, {"float32", "bfloat16", "float16"},
               "dtype of the written model.safetensors");
  flags.Choice("windows", &windows, {"conversation", "anywhere"}, "where training windows start");
  flags.Add("assistant-weight", &o.assistant_weight, "W",
            "loss weight of assistant-written tokens relative to the rest");
  flags.Add("router-aux-loss", &o.router_aux_loss, "W",
            "weight of the mixture-of-experts load-balancing loss, 0: none");
  flags.Choice("attention", &attention, {"grouped", "eager"},
               "the training forward's attention");
  flags.Switch("no-plot", &no_plot, "do not write loss.png (which needs gnuplot)");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  const std::pair<const char*, int64_t> non_negative[] = {
      {"steps", o.n_steps},           {"batch", o.batch},
      {"seq-len", o.seq_len},         {"warmup", o.warmup},
      {"threads", o.n_threads},       {"eval-every", o.eval_every},
      {"eval-tokens", o.eval_tokens}, {"checkpoint-every", o.checkpoint_every},
      {"stop-after", o.stop_after}};
  for (const auto& [name, value] : non_negative) {
    if (value < 0) {
      return flags.UsageError(
          absl::StrCat("--", name, " must be a non-negative integer, got '", value, "'"));
    }
  }
  o.save_dtype = *ParseDType(save_dtype);  // one of the names the Choice admits
  o.align_to_conversations = windows == "conversation";
  o.grouped_attention = attention == "grouped";
  o.plot = !no_plot;
  o.progress = !quiet;

  absl::StatusOr<TrainResult> r = TrainLm(o);
  if (!r.ok()) {
    std::fprintf(stderr, "kvl train-lm: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  std::printf(
      "trained %s: steps %lld-%lld of %lld, %s tokens seen, %s parameters, %.3f s/step, "
      "wall %s\n  final train loss %.4f, valid loss %.4f (initial %.4f) nats/token\n",
      o.out_dir.c_str(), static_cast<long long>(r->start_step + 1),
      static_cast<long long>(r->steps_done), static_cast<long long>(o.n_steps),
      FormatCount(static_cast<double>(r->tokens_seen)).c_str(),
      FormatCount(static_cast<double>(r->n_params)).c_str(), r->mean_step_s,
      FormatDuration(r->wall_s).c_str(), r->final_train_loss, r->final_valid_loss,
      r->initial_valid_loss);
  return 0;
}

}  // namespace kvl::tools
