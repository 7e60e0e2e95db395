// kvl distill: stage-2 self-distillation of a KV-cache translator
// (training/translator_distill.h, docs/translators.md).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "base/flags.h"
#include "tools/commands.h"
#include "training/translator_distill.h"

namespace kvl::tools {

using training::Distill;
using training::DistillOptions;
using training::DistillResult;
using training::HandOverName;
using training::ParseHandOver;

namespace {

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl distill: %s\n", message.c_str());
  return code;
}


}  // namespace

int RunDistill(const Args& args) {
  DistillOptions o;
  std::string hand_over = HandOverName(o.hand_over);
  std::string score = o.score_assistant ? "assistant" : "all";
  bool quiet = false, no_plot = false;
  FlagSet flags(
      "kvl distill",
      "Both models stay frozen; only the maps of the closed-form translator --init\n"
      "(kvl fit) are trained. Each sample is a window of prefix + continuation tokens\n"
      "of the corpus (.jsonl chats rendered as ChatML, or text): the source prefills\n"
      "the prefix, its cache is translated, the target processes the continuation\n"
      "(its first token is the held-back last prefix token) from the translated\n"
      "cache; loss = KL(target on its native cache || target on the translated\n"
      "cache) averaged over the continuation positions. Windows start anywhere\n"
      "(--hand-over any, the default) or so that the prefix ends where a chat hands\n"
      "over: reply (the target reads the last token of \"<|im_start|>assistant\\n\"\n"
      "itself and predicts the reply, as the task prompts of kvl eval-translator),\n"
      "turn (the target prefills a user turn after the translated history, as the\n"
      "router does at a switch) or chat (either). --score assistant (with a\n"
      "--hand-over other than any) counts only the positions that predict an\n"
      "assistant reply's tokens (its content and <|im_end|>) and skips windows\n"
      "without one. AdamW, linear warm-up then cosine from --lr to --min-lr,\n"
      "global-norm clipping. The validation KL (first --valid-windows\n"
      "non-overlapping windows of VALID, placed the same way) is\n"
      "measured before training, every --eval-every steps and at the end; --out\n"
      "always holds the best maps (training.method \"distilled\"). Also writes\n"
      "OUT.distill.jsonl (per step), OUT.distill.json (summary) and OUT.distill.png\n"
      "(curves). --bf16: the training steps' forwards under bf16 autocast (faster;\n"
      "the validation KL stays float32). --whiten: Adam moves each map in whitened\n"
      "input coordinates, W = V·P with P = (C + f·tr(C)/d·I)^(-1/2) (f: --whiten-floor),\n"
      "C the covariance of the map's inputs over the source's prefixes of the first\n"
      "--whiten-windows training windows; the file holds W.");
  flags.Required("source", &o.source_dir, "DIR", "the source model (frozen)");
  flags.Required("target", &o.target_dir, "DIR", "the target model (frozen)");
  flags.Required("init", &o.init_path, "FILE", "the closed-form translator to start from");
  flags.Required("data", &o.train_path, "TRAIN", "training corpus, .jsonl chats or text");
  flags.Required("valid", &o.valid_path, "VALID", "held-out corpus for the validation KL");
  flags.Required("out", &o.out_path, "OUT", "the distilled translator to write");
  flags.Add("prefix", &o.prefix, "P", "tokens the source prefills and the maps translate");
  flags.Add("continuation", &o.continuation, "C",
            "positions the target scores after the prefix (held-back token included)");
  flags.Add("batch", &o.batch, "B", "windows per step");
  flags.Choice("hand-over", &hand_over, {"any", "reply", "turn", "chat"},
               "where training and validation prefixes end");
  flags.Choice("score", &score, {"all", "assistant"},
               "the continuation positions in the loss");
  flags.Add("steps", &o.steps, "N", "optimizer steps");
  flags.Add("lr", &o.lr, "LR", "peak learning rate, after the warm-up");
  flags.Add("min-lr", &o.min_lr, "LR", "learning rate at the last step (cosine floor)");
  flags.Add("warmup", &o.warmup, "N", "linear warm-up steps");
  flags.Add("weight-decay", &o.weight_decay, "W", "decoupled weight decay of the maps");
  flags.Add("clip", &o.clip, "C", "global gradient-norm limit, <= 0: off");
  flags.Add("eval-every", &o.eval_every, "K", "validation KL every K steps");
  flags.Add("valid-windows", &o.valid_windows, "N", "validation windows");
  flags.Add("seed", &o.seed, "N", "seed of the training windows' order");
  flags.Add("threads", &o.n_threads, "N", "intra-op threads, 0: all cores");
  flags.Switch("bf16", &o.bf16, "bf16 autocast in the training steps' forwards");
  flags.Switch("quiet", &quiet, "no progress bar on stderr");
  flags.Switch("whiten", &o.whiten, "train the maps in whitened input coordinates");
  flags.Add("whiten-floor", &o.whiten_floor, "F", "f of the whitening, relative to tr(C)/d");
  flags.Add("whiten-windows", &o.whiten_windows, "N",
            "training windows whose prefixes give the whitening covariance");
  flags.Switch("no-plot", &no_plot, "do not write OUT.distill.png (which needs gnuplot)");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (o.n_threads < 0) return flags.UsageError("--threads must be >= 0");
  o.hand_over = *ParseHandOver(hand_over);  // one of the names the Choice admits
  o.score_assistant = score == "assistant";
  o.progress = !quiet;
  o.plot = !no_plot;

  absl::StatusOr<DistillResult> r = Distill(o);
  if (!r.ok()) {
    return Fail(std::string(r.status().message()),
                r.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  std::printf(
      "validation KL: closed-form %.5f -> best %.5f at step %lld (final %.5f), %.1fx lower\n"
      "%lld steps in %.1f s (%.3f s/step); wrote %s\n",
      r->initial_valid_kl, r->best_valid_kl, static_cast<long long>(r->best_step),
      r->final_valid_kl, r->initial_valid_kl / std::max(r->best_valid_kl, 1e-12),
      static_cast<long long>(o.steps), r->wall_s, r->mean_step_s, o.out_path.c_str());
  return 0;
}

}  // namespace kvl::tools
