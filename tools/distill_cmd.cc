// kvl distill: stage-2 self-distillation of a KV-cache translator
// (tools/translator_distill.h, docs/translators.md).
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "tools/commands.h"
#include "tools/translator_distill.h"
#include "tools/translator_tools.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl distill --source DIR --target DIR --init FILE --data TRAIN --valid VALID\n"
    "                   --out FILE [--prefix 255] [--continuation 128] [--batch 8]\n"
    "                   [--hand-over any|reply|turn|chat] [--score all|assistant]\n"
    "                   [--steps 600] [--lr 1e-3] [--min-lr 1e-4] [--warmup 30]\n"
    "                   [--weight-decay 0] [--clip 1.0] [--eval-every 50]\n"
    "                   [--valid-windows 64] [--seed 0] [--threads N] [--bf16] [--quiet]\n"
    "                   [--whiten] [--whiten-floor 1e-3] [--whiten-windows 64]\n"
    "                   [--no-plot]\n"
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
    "without one. AdamW, linear warm-up then\n"
    "cosine from --lr to --min-lr, global-norm clipping. The validation KL (first\n"
    "--valid-windows non-overlapping windows of VALID, placed the same way) is\n"
    "measured before training, every --eval-every steps and at the end; --out\n"
    "always holds the best maps (training.method \"distilled\"). Also writes\n"
    "OUT.distill.jsonl (per step), OUT.distill.json (summary) and OUT.distill.png\n"
    "(curves). --bf16: the training steps' forwards under bf16 autocast (faster;\n"
    "the validation KL stays float32). --whiten: Adam moves each map in whitened\n"
    "input coordinates, W = V·P with P = (C + f·tr(C)/d·I)^(-1/2) (f: --whiten-floor),\n"
    "C the covariance of the map's inputs over the source's prefixes of the first\n"
    "--whiten-windows training windows; the file holds W.\n";

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl distill: %s\n", message.c_str());
  return code;
}

}  // namespace

int RunDistill(const Args& args) {
  absl::StatusOr<ParsedFlags> flags = ParseFlags(
      args,
      {"source", "target", "init", "data", "valid", "out", "prefix", "continuation", "hand-over", "score", "batch",
       "steps", "lr", "min-lr", "warmup", "weight-decay", "clip", "eval-every", "valid-windows",
       "seed", "threads", "whiten-floor", "whiten-windows"},
      {"quiet", "no-plot", "bf16", "whiten"});
  if (!flags.ok()) return Fail(std::string(flags.status().message()) + " (see --help)", 2);
  if (flags->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (const char* required : {"source", "target", "init", "data", "valid", "out"}) {
    if (!flags->Has(required)) return Fail(std::string("--") + required + " is required", 2);
  }
  DistillOptions o;
  o.source_dir = flags->values.at("source");
  o.target_dir = flags->values.at("target");
  o.init_path = flags->values.at("init");
  o.train_path = flags->values.at("data");
  o.valid_path = flags->values.at("valid");
  o.out_path = flags->values.at("out");
  if (flags->Has("hand-over")) {
    absl::StatusOr<HandOver> h = ParseHandOver(flags->values.at("hand-over"));
    if (!h.ok()) return Fail(std::string(h.status().message()), 2);
    o.hand_over = *h;
  }
  if (flags->Has("score")) {
    const std::string& score = flags->values.at("score");
    if (score != "all" && score != "assistant") {
      return Fail("--score " + score + ": expected all or assistant", 2);
    }
    o.score_assistant = score == "assistant";
  }
  int64_t seed = 0, threads = 0;
  for (absl::Status s :
       {FlagInt(*flags, "prefix", &o.prefix), FlagInt(*flags, "continuation", &o.continuation),
        FlagInt(*flags, "batch", &o.batch), FlagInt(*flags, "steps", &o.steps),
        FlagInt(*flags, "warmup", &o.warmup), FlagInt(*flags, "eval-every", &o.eval_every),
        FlagInt(*flags, "valid-windows", &o.valid_windows), FlagInt(*flags, "seed", &seed),
        FlagInt(*flags, "threads", &threads), FlagDouble(*flags, "lr", &o.lr),
        FlagDouble(*flags, "min-lr", &o.min_lr), FlagDouble(*flags, "clip", &o.clip),
        FlagDouble(*flags, "weight-decay", &o.weight_decay),
        FlagInt(*flags, "whiten-windows", &o.whiten_windows),
        FlagDouble(*flags, "whiten-floor", &o.whiten_floor)}) {
    if (!s.ok()) return Fail(std::string(s.message()), 2);
  }
  if (seed < 0 || threads < 0) return Fail("--seed and --threads must be non-negative", 2);
  o.seed = static_cast<uint64_t>(seed);
  o.n_threads = static_cast<int>(threads);
  o.progress = !flags->switches.count("quiet");
  o.plot = !flags->switches.count("no-plot");
  o.bf16 = flags->switches.count("bf16") > 0;
  o.whiten = flags->switches.count("whiten") > 0;

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
