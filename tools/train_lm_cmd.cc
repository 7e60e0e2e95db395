// kvl train-lm: trains a Qwen3-architecture decoder from scratch
// (tools/train_lm.h, docs/training.md).
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "model/config.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "tools/train_lm.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl train-lm --config config.json --tokenizer DIR|tokenizer.json\n"
    "                    --train train.txt [--valid valid.txt] --out DIR\n"
    "                    [--seed N] [--steps N] [--batch B] [--seq-len T] [--lr 3e-3]\n"
    "                    [--warmup 50] [--min-lr-ratio 0.1] [--weight-decay 0.1] [--clip 1.0]\n"
    "                    [--bf16] [--threads N] [--eval-every K] [--eval-tokens N]\n"
    "                    [--checkpoint-every K] [--stop-after STEP] [--resume]\n"
    "                    [--init-from MODEL_DIR]\n"
    "                    [--save-dtype float32|bfloat16] [--windows conversation|anywhere]\n"
    "                    [--assistant-weight W] [--attention grouped|eager] [--no-plot] [--quiet]\n"
    "Trains from a random initialisation (or continues DIR/train_state with --resume,\n"
    "or starts from MODEL_DIR's weights with a fresh optimizer and schedule: --init-from;\n"
    "a run started with --init-from resumes with the same --init-from and --resume)\n"
    "and writes DIR as a Hugging Face model directory, plus train_log.jsonl, loss.png\n"
    "and summary.json. Defaults: seed 0, steps 1000, batch 8, seq-len 512, lr 3e-3,\n"
    "warmup 50, min-lr-ratio 0.1, weight-decay 0.1, clip 1.0, eval-every 100,\n"
    "eval-tokens 32768, threads = all cores, windows conversation (training windows start\n"
    "at the beginning of a conversation; 'anywhere' draws any token offset),\n"
    "assistant-weight 1 (loss weight of assistant-written tokens relative to the rest),\n"
    "attention grouped (the fast attention; 'eager' is the decoder tests' oracle, for\n"
    "timing comparisons).\n";

const std::set<std::string> kValueFlags = {
    "config", "tokenizer", "train", "valid", "out", "seed", "steps", "batch", "seq-len",
    "lr", "warmup", "min-lr-ratio", "weight-decay", "clip", "threads", "eval-every",
    "eval-tokens", "checkpoint-every", "stop-after", "save-dtype", "windows", "assistant-weight",
    "init-from", "attention"};
const std::set<std::string> kBoolFlags = {"bf16", "resume", "no-plot", "quiet"};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "kvl train-lm: %s (see kvl train-lm --help)\n", message.c_str());
  return 2;
}

}  // namespace

int RunTrainLm(const Args& args) {
  std::map<std::string, std::string> flags;
  std::set<std::string> bools;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) return UsageError("unexpected argument '" + arg + "'");
    std::string key = arg.substr(2), value;
    const size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key.resize(eq);
    }
    if (kBoolFlags.count(key)) {
      if (eq != std::string::npos) return UsageError("--" + key + " takes no value");
      bools.insert(key);
      continue;
    }
    if (!kValueFlags.count(key)) return UsageError("unknown flag --" + key);
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) return UsageError("flag --" + key + " needs a value");
      value = args[++i];
    }
    flags[key] = value;
  }
  for (const char* required : {"config", "tokenizer", "train", "out"}) {
    if (!flags.count(required)) return UsageError(std::string("--") + required + " is required");
  }

  TrainOptions o;
  o.config_path = flags["config"];
  o.tokenizer_path = flags["tokenizer"];
  o.train_path = flags["train"];
  o.valid_path = flags.count("valid") ? flags["valid"] : "";
  o.out_dir = flags["out"];
  bool ok = true;
  std::string bad;
  auto int_flag = [&](const char* name, auto* out) {
    if (!flags.count(name)) return;
    int64_t v = 0;
    if (!absl::SimpleAtoi(flags[name], &v) || v < 0) {
      ok = false;
      bad = std::string("--") + name + " must be a non-negative integer, got '" + flags[name] + "'";
      return;
    }
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(v);
  };
  auto double_flag = [&](const char* name, double* out) {
    if (!flags.count(name)) return;
    if (!absl::SimpleAtod(flags[name], out)) {
      ok = false;
      bad = std::string("--") + name + " must be a number, got '" + flags[name] + "'";
    }
  };
  int_flag("seed", &o.seed);
  int_flag("steps", &o.n_steps);
  int_flag("batch", &o.batch);
  int_flag("seq-len", &o.seq_len);
  int_flag("warmup", &o.warmup);
  int_flag("threads", &o.n_threads);
  int_flag("eval-every", &o.eval_every);
  int_flag("eval-tokens", &o.eval_tokens);
  int_flag("checkpoint-every", &o.checkpoint_every);
  int_flag("stop-after", &o.stop_after);
  double_flag("lr", &o.lr);
  double_flag("min-lr-ratio", &o.min_lr_ratio);
  double_flag("weight-decay", &o.weight_decay);
  double_flag("clip", &o.clip);
  double_flag("assistant-weight", &o.assistant_weight);
  if (!ok) return UsageError(bad);
  if (flags.count("save-dtype")) {
    absl::StatusOr<DType> dtype = ParseDType(flags["save-dtype"]);
    if (!dtype.ok()) return UsageError(std::string(dtype.status().message()));
    o.save_dtype = *dtype;
  }
  if (flags.count("windows")) {
    if (flags["windows"] != "conversation" && flags["windows"] != "anywhere") {
      return UsageError("--windows must be 'conversation' or 'anywhere', got '" +
                        flags["windows"] + "'");
    }
    o.align_to_conversations = flags["windows"] == "conversation";
  }
  if (flags.count("attention")) {
    if (flags["attention"] != "grouped" && flags["attention"] != "eager") {
      return UsageError("--attention must be 'grouped' or 'eager', got '" +
                        flags["attention"] + "'");
    }
    o.grouped_attention = flags["attention"] == "grouped";
  }
  o.bf16 = bools.count("bf16") > 0;
  o.resume = bools.count("resume") > 0;
  if (flags.count("init-from")) o.init_from = flags["init-from"];
  o.plot = bools.count("no-plot") == 0;
  o.progress = bools.count("quiet") == 0;

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
