#!/usr/bin/python3
"""Model cards and the results table of the house models.

Reads, for each model, from docs/results/training/<name>/ (where
scripts/train/train_house_models.sh keeps a model's training logs): summary.json and
summary_<stage>.json (written by kvl train-lm) and eval_test.json (kvl eval on
the test suites and test.txt); the step times in
$WORK/times.tsv (scripts/train/train_house_models.sh); the test suites, for the
chance baselines. Writes models/<name>/README.md and
docs/results/house_models.{md,json} and docs/results/house_times.tsv. Touches
nothing else.

Two baselines per task: chance, the accuracy of always giving the suite's most
frequent expected answer (normalised as the scoring rule does); and a stronger
heuristic, "pick", the expected accuracy of answering with a word of the prompt
drawn uniformly among those that are the expected answer of some item of the
suite (it knows the answer's type and that it was stated: for retrieval tasks
it is well above chance).

The table holds every house model whose eval_test.json is there (the Qwen3
models of train_house_models.sh, then the other architectures of
train_family_models.sh); cards are written for the named models (default:
all of them).

usage: scripts/report/house_report.py WORK_DIR [MODEL ...]
"""
import collections
import glob
import json
import os
import re
import sys

TASKS = ["facts", "kv", "arith", "lists", "strings"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOGS = os.path.join(ROOT, "docs", "results", "training")


def normalise(text, rule):
    text = text.strip()
    if text.endswith("."):
        text = text[:-1]
    if rule == "exact_ci":
        text = text.lower()
    return text


def chance(suite_path):
    items = [json.loads(line) for line in open(suite_path) if line.strip()]
    answers = [normalise(it["answer"], it["scoring"]) for it in items]
    majority = collections.Counter(answers).most_common(1)[0][1] / len(items)
    vocabulary = set(answers)
    pick = 0.0
    for it, ans in zip(items, answers):
        prompt = " ".join(m["content"] for m in it["messages"])
        words = {normalise(w, it["scoring"]) for w in re.findall(r"[A-Za-z0-9:'-]+", prompt)}
        candidates = words & vocabulary
        if ans in candidates:
            pick += 1.0 / len(candidates)
    return majority, pick / len(items), len(items)


def load(path):
    with open(path) as f:
        return json.load(f)


def times(work):
    out = {}
    path = os.path.join(work, "times.tsv")
    if os.path.exists(path):
        for line in open(path):
            name, seconds = line.rstrip("\n").split("\t")
            out[name] = float(seconds)  # the last run of a step wins
    return out


STAGE_DATA = {
    "drills1": "retrieval drills (scripts/train/make_drills.sh)",
    "tasks": "the task corpus, from the last drill round's weights",
    "kvdocs": "the 8,067 level-1 kv conversations (scripts/train/make_kv_corpora.sh), from the task "
              "stage's weights",
    "mix": "the task corpus plus the 16,082 level-1-2 kv conversations, from kvdocs' weights",
}
LATER_STAGES = ["tasks", "kvdocs"]  # summary_<stage>.json before the last stage's summary.json
HOUSE_MODELS = ["kvl-small", "kvl-small-b", "kvl-large", "kvl-gemma", "kvl-moe", "kvl-small-t2"]
# The script that trains each architecture's house models, and how a card names it.
ARCHITECTURES = {
    "Qwen3ForCausalLM": ("a Qwen3-architecture decoder", "scripts/train/train_house_models.sh"),
    "Gemma3ForCausalLM": ("a Gemma-3-architecture decoder (Gemma3ForCausalLM)",
                          "scripts/train/train_family_models.sh"),
    "Qwen3MoeForCausalLM": ("a Qwen3-MoE-architecture decoder (Qwen3MoeForCausalLM, a mixture "
                            "of experts)", "scripts/train/train_family_models.sh"),
}


def stages_of(name, summary):
    """[(stage, summary.json of that stage)]: the curriculum's, or one stage."""
    d = os.path.join(LOGS, name)
    paths = glob.glob(os.path.join(d, "summary_drills*.json"))
    rounds = sorted(int(re.fullmatch(r"summary_drills(\d+)\.json", os.path.basename(p)).group(1))
                    for p in paths)
    earlier = [(f"drills{r}", load(os.path.join(d, f"summary_drills{r}.json"))) for r in rounds]
    earlier += [(s, load(os.path.join(d, f"summary_{s}.json"))) for s in LATER_STAGES
                if os.path.exists(os.path.join(d, f"summary_{s}.json"))]
    if not earlier:
        return [("training", summary)]
    last = "mix" if any(stage == "tasks" for stage, _ in earlier) else "tasks"
    return earlier + [(last, summary)]


def weighted(run):
    w = run.get("assistant_weight", 1)
    return f", assistant tokens weighted {w:g}x" if w != 1 else ""


def final_router_aux(name):
    """Mean load-balancing loss of the last 20 logged steps of a model's last
    stage (docs/results/training/<name>/train_log.jsonl); None without one."""
    path = os.path.join(LOGS, name, "train_log.jsonl")
    if not os.path.exists(path):
        return None
    values = [r["router_aux"] for r in map(json.loads, open(path)) if "router_aux" in r]
    return sum(values[-20:]) / len(values[-20:]) if values else None


def all_sparse(cfg):
    """Whether every layer of a mixture of experts is sparse (no dense MLP)."""
    return bool(cfg.get("num_experts")) and not cfg.get("mlp_only_layers") and \
        cfg.get("decoder_sparse_step", 1) == 1


def architecture_rows(name, cfg):
    """Card rows for what an architecture adds to Qwen3's."""
    rows = []
    types = cfg.get("layer_types")
    if cfg["architectures"][0] == "Gemma3ForCausalLM" and types:
        n_sliding = sum(1 for x in types if x == "sliding_attention")
        rows.append(f"| attention | {n_sliding} sliding-window layers (window "
                    f"{cfg['sliding_window']}, RoPE base {cfg['rope_local_base_freq']:g}) and "
                    f"{len(types) - n_sliding} global (RoPE base {cfg['rope_theta']:g}): "
                    f"{', '.join('sliding' if x == 'sliding_attention' else 'global' for x in types)}; "
                    f"scale query_pre_attn_scalar^-1/2 = {cfg['query_pre_attn_scalar']:g}^-1/2 |")
        rows.append("| norms, activation | four (1 + w) RMSNorms per layer, GELU-tanh, embeddings "
                    "scaled by sqrt(hidden) |")
    if cfg.get("num_experts"):
        rows.append(f"| experts | {cfg['num_experts']} per layer of width "
                    f"{cfg['moe_intermediate_size']}, {cfg['num_experts_per_tok']} per token"
                    + (", weights renormalised" if cfg.get("norm_topk_prob") else "") + " |")
        aux = final_router_aux(name)
        if aux is not None:
            rows.append(f"| expert balance | load-balancing loss {aux:.3f} over the last 20 steps "
                        f"({cfg['num_experts_per_tok']} when the router spreads tokens evenly, "
                        f"{cfg['num_experts']} when every token goes to the same experts) |")
    return rows


def tokenizer_dir(name):
    """The models/ folder a house model's tokenizer files link to."""
    link = os.path.join(ROOT, "models", name, "tokenizer.json")
    return os.path.basename(os.path.dirname(os.path.realpath(link))) if os.path.islink(link) \
        else "tokenizer"


def card(name, summary, stages, ev, t, chances, picks):
    run = summary["run"]
    cfg = run["model_config"]
    what, script = ARCHITECTURES[cfg["architectures"][0]]
    lines = [
        f"# {name}",
        "",
        f"A house model of kvlingo: {what} trained from scratch on",
        f"the generated chat corpus (docs/data.md) by `{script}`.",
        "Hugging Face layout (`config.json`, bf16 `model.safetensors`, tokenizer files: links to "
        f"the shared `../{tokenizer_dir(name)}/`)."
        + (" Its tokenizer is the second house tokenizer (3,072 ids, Llama-3's split rule: "
           "docs/tokenizer-training.md), for switches across tokenizers (issue 54); its "
           "nats/token are over its own tokens, not comparable with the other models'."
           if tokenizer_dir(name) != "tokenizer" else ""),
        "",
        "| | |",
        "|---|---|",
        f"| layers / hidden / ffn | {cfg['num_hidden_layers']} / {cfg['hidden_size']} / "
        + ("experts in every layer (below)" if all_sparse(cfg) else f"{cfg['intermediate_size']}")
        + " |",
        f"| query / kv heads, head_dim | {cfg['num_attention_heads']} / "
        f"{cfg['num_key_value_heads']}, {cfg['head_dim']} |",
        *architecture_rows(name, cfg),
        f"| parameters | {summary['parameters'] / 1e6:.2f} M (tied embeddings, vocabulary "
        f"{cfg['vocab_size']}) |",
    ]
    first = stages[0][1]["run"]["seed"]  # the initialisation's
    other = [f"{stage} {st['run']['seed']}" for stage, st in stages if st["run"]["seed"] != first]
    lines.append(f"| seed | {first}" + (f" (batch order: {', '.join(other)})" if other else "") + " |")
    for stage, st in stages:
        r = st["run"]
        what = STAGE_DATA.get(stage) or (f"retrieval drills, from drills{int(stage[6:]) - 1}'s weights"
                                         if stage.startswith("drills") else "the task corpus")
        if stage == "mix" and not any(s == "kvdocs" for s, _ in stages):
            what = what.replace("from kvdocs' weights", "from the task stage's weights")
        arithmetic = "bf16 autocast" if st.get("bf16_autocast", True) else "float32"
        lines.append(f"| {stage} | {r['steps']} steps x {r['batch']} x {r['seq_len']} tokens of "
                     f"{what}{weighted(r)}; AdamW lr {r['lr']:g} (warm-up {r['warmup']}, cosine to "
                     f"{r['min_lr_ratio']:g}x)"
                     + (f", load-balancing loss x {r['router_aux_loss']:g}"
                        if r.get("router_aux_loss") else "")
                     + f", {arithmetic}; "
                     f"{st['mean_step_s']:.2f} s/step x {r['steps']} = "
                     f"{st['mean_step_s'] * r['steps']:.0f} s with {st.get('threads', 1)} thread(s) "
                     f"({st.get('wall_s_total', 0):.0f} s wall) |")
    seen = sum(st.get("tokens_seen", st["run"]["steps"] * st["run"]["batch"] * st["run"]["seq_len"])
               for _, st in stages)
    wall = sum(st.get("wall_s_total", 0) for _, st in stages)
    stepping = sum(st["mean_step_s"] * st["run"]["steps"] for _, st in stages)
    lines += [
        f"| tokens seen | {seen / 1e6:.2f} M |",
        f"| train time | {stepping:.0f} s of training steps, {wall:.0f} s wall in all (the wall "
        "time includes evaluations, checkpoints and any time a run was paused or shared the "
        "2-core machine) |",
        f"| final train / valid loss | {summary['final_train_loss']:.3f} / "
        f"{summary['final_valid_loss']:.3f} nats/token"
        + (" (the train loss with the assistant's tokens weighted as in training)"
           if run.get("assistant_weight", 1) != 1 else "") + " |",
    ]
    if f"eval {name}" in t:
        lines.append(f"| eval time | {t[f'eval {name}']:.0f} s |")
    lines += [
        "",
        "## Test split (`kvl eval`, greedy, exact match)",
        "",
        "| task | accuracy | chance | pick |",
        "|---|---|---|---|",
    ]
    for task in TASKS:
        if task in ev["tasks"]:
            lines.append(f"| {task} | {ev['tasks'][task]['accuracy']:.3f} | "
                         f"{chances[task]:.3f} | {picks[task]:.3f} |")
    weak = [k for k in TASKS if k in ev["tasks"] and ev["tasks"][k]["accuracy"] <= 2 * chances[k]]
    if weak:
        lines += ["", f"**Limitation:** not clearly above chance on {', '.join(weak)} (at most twice",
                  "the chance level). See docs/training.md."]
    lines += [
        "",
        f"Log-perplexity on test.txt: {ev['perplexity']['nats_per_token']:.4f} nats/token "
        f"({ev['perplexity']['tokens']} tokens, 512-token windows).",
        "",
        f"Training logs and plots (loss curve `loss.png`, `train_log.jsonl`, each stage's "
        f"`summary*.json`, `eval_test.json`): [docs/results/training/{name}/]"
        f"(../../docs/results/training/{name}/). Reproduce: `{script}` "
        "(docs/results/house_models.md).",
        "",
    ]
    return "\n".join(lines)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    work = sys.argv[1]
    present = [n for n in HOUSE_MODELS if os.path.exists(os.path.join(LOGS, n, "eval_test.json"))]
    names = sys.argv[2:] or present
    chances, picks, sizes = {}, {}, {}
    for task in TASKS:
        chances[task], picks[task], sizes[task] = chance(os.path.join(work, "data", "suites", f"test_{task}.jsonl"))
    t = times(work)
    rows = []
    for name in present + [n for n in names if n not in present]:
        logs = os.path.join(LOGS, name)
        summary = load(os.path.join(logs, "summary.json"))
        ev = load(os.path.join(logs, "eval_test.json"))
        stages = stages_of(name, summary)
        if name in names:
            with open(os.path.join(ROOT, "models", name, "README.md"), "w") as f:
                f.write(card(name, summary, stages, ev, t, chances, picks))
        rows.append((name, summary, stages, ev))

    out = {"chance": chances, "pick": picks, "items": sizes, "models": {}}
    md = [
        "# House models: test-split results",
        "",
        "Produced by `scripts/train/train_house_models.sh` and, for the other architectures",
        "(kvl-gemma, kvl-moe), `scripts/train/train_family_models.sh` (which run `kvl eval` on each",
        "model), then `scripts/report/house_report.py`. Accuracy: greedy decoding, exact match after the",
        "suite's normalisation. Chance: always giving the suite's most frequent answer; pick: a",
        "stronger heuristic that answers with a random prompt word of the answer's type",
        "(definitions in scripts/report/house_report.py).",
        "Log-perplexity: nats/token on test.txt, 512-token windows.",
        "",
        "| model | params | nats/token | " + " | ".join(TASKS) + " |",
        "|---|---|---|" + "---|" * len(TASKS),
        "| chance | | | " + " | ".join(f"{chances[k]:.3f}" for k in TASKS) + " |",
        "| pick | | | " + " | ".join(f"{picks[k]:.3f}" for k in TASKS) + " |",
    ]
    for name, summary, stages, ev in rows:
        acc = {k: ev["tasks"][k]["accuracy"] for k in TASKS if k in ev["tasks"]}
        nll = ev["perplexity"]["nats_per_token"]
        out["models"][name] = {"parameters": summary["parameters"], "nats_per_token": nll,
                               "accuracy": acc,
                               "train_seconds": round(sum(st.get("wall_s_total", 0)
                                                          for _, st in stages)),
                               "train_step_seconds": round(sum(
                                   st["mean_step_s"] * st["run"]["steps"]
                                   for _, st in stages))}
        md.append(f"| {name} | {summary['parameters'] / 1e6:.2f} M | {nll:.4f} | " +
                  " | ".join(f"{acc.get(k, float('nan')):.3f}" for k in TASKS) + " |")
    md.append("")
    md.append("Items per task: " + ", ".join(f"{k} {sizes[k]}" for k in TASKS) + ".")
    if any(tokenizer_dir(name) != "tokenizer" for name, _, _, _ in rows):
        md.append("kvl-small-t2 reads the second house tokenizer (models/tokenizer-t2), whose "
                  "tokens are longer: its nats/token are not comparable with the others'.")
    if "kvl-small" in out["models"] and "kvl-large" in out["models"]:
        s, l = out["models"]["kvl-small"], out["models"]["kvl-large"]
        better = [k for k in TASKS if l["accuracy"].get(k, 0) > s["accuracy"].get(k, 0)]
        md.append("")
        md.append(f"kvl-large vs kvl-small: {s['nats_per_token'] - l['nats_per_token']:.4f} "
                  f"nats/token lower log-perplexity; higher accuracy on {len(better)} of "
                  f"{len(TASKS)} tasks ({', '.join(better) or 'none'}).")
    below = [f"{n} {k}" for n, m in out["models"].items() for k in TASKS
             if m["accuracy"].get(k, 0) <= 2 * chances[k]]
    md.append("")
    md.append("Scores not clearly above chance (at most twice the chance level): " +
              (", ".join(below) if below else "none") + ".")
    md += ["", "Training time per stage (`mean_step_s` x steps from each stage's summary.json; "
           "wall includes evaluations, checkpoints and pauses):", "",
           "| model | stage | steps | threads | s/step | seconds of steps | wall s |",
           "|---|---|---|---|---|---|---|"]
    tsv = ["model\tstage\tsteps\tthreads\tseconds_of_steps\twall_seconds"]
    for name, _, stages, _ in rows:
        for stage, st in stages:
            steps, step_s = st["run"]["steps"], st["mean_step_s"]
            md.append(f"| {name} | {stage} | {steps} | {st.get('threads', 1)} | {step_s:.3f} | "
                      f"{step_s * steps:.0f} | {st.get('wall_s_total', 0):.0f} |")
            tsv.append(f"{name}\t{stage}\t{steps}\t{st.get('threads', 1)}\t{step_s * steps:.1f}\t"
                       f"{st.get('wall_s_total', 0):.1f}")
        md.append(f"| {name} | all | | | | {out['models'][name]['train_step_seconds']} | "
                  f"{out['models'][name]['train_seconds']} |")
    md.append("")
    os.makedirs(os.path.join(ROOT, "docs", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "docs", "results", "house_times.tsv"), "w") as f:
        f.write("\n".join(tsv) + "\n")
    with open(os.path.join(ROOT, "docs", "results", "house_models.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(ROOT, "docs", "results", "house_models.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
