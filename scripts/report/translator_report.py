#!/usr/bin/python3
"""docs/results/translators.md from the kvl eval-translator JSON reports.

Reads docs/results/translators/<source>__<target>.json (written by
scripts/train/train_translators.sh), the server's native tail runs of
scripts/report/translate_variants.sh and the many-window runs of
scripts/report/translator_precision.sh where they exist, and writes docs/results/translators.md: per
direction the continuation log-perplexity of the target natively, with no
prefix, and from the closed-form and distilled translated caches (gap and share
of the prefix benefit recovered, over the whole continuation and its first
tokens), the issue's targets checked one by one, task accuracy per condition,
and the multi-turn comparison of span-wise translation, whole-prefix
re-translation and re-prefill.

usage: scripts/report/translator_report.py
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORDER = ["kvl-small__kvl-large", "kvl-large__kvl-small", "kvl-small__kvl-small-b",
         "kvl-small-b__kvl-small"]


def server_native_tail():
    """The server's default routing.native_tail_tokens (server/config.h)."""
    with open(os.path.join(ROOT, "server/config.h")) as f:
        m = re.search(r"kDefaultNativeTailTokens = (\d+);", f.read())
    if not m:
        sys.exit("translator_report.py: no kDefaultNativeTailTokens in server/config.h")
    return int(m.group(1))


def direction(path):
    return os.path.basename(path)[:-len(".json")]


def pretty(name):
    return name.replace("__", " → ")


def gap_cell(t, key, scale, fmt, unit):
    """"all / first" for a gap or share, each with its standard error where the
    report has one (eval-translator reports from before 2026-12-03 do not)."""
    cells = []
    for k in (key, key + "_first"):
        cell = f"{scale * t[k]:{fmt}}{unit}"
        if t.get(k + "_se") is not None:
            cell += f" ± {scale * t[k + '_se']:{fmt}}{unit}"
        cells.append(cell)
    return " / ".join(cells)


def why_missed(reports, names, with_tail, tail, precision):
    """Why each target the table marks as missed is missed, from the reports;
    the experiments behind it are in docs/translators.md (Results and section 2)."""
    distilled, closed = [], []
    for n in names:
        by_method = {t["method"]: t for t in reports[n]["translators"]}
        if "distilled" in by_method and "closed_form" in by_method:
            distilled.append(by_method["distilled"]["gap"])
            closed.append(by_method["closed_form"]["gap"])
    if not distilled:
        return []
    served = [with_tail[n]["translators"][0]["gap"] for n in names if with_tail.get(n)]
    plain = [next(t for t in precision[n][0]["translators"] if t["method"] == "distilled")
             for n in names if 0 in precision.get(n, {})]
    md = ["", "## Why the missed targets are missed", ""]
    if max(distilled) > 0.02:
        md += [
          f"- Whole-continuation gap ≤ 0.02: the distilled translators alone leave "
          f"{min(distilled):.3f}–{max(distilled):.3f} nats/token. The paper's own from-scratch",
          "  pair keeps 0.031–0.101 after distillation, so 0.02 asks for less than the method",
          "  reached in the comparable setting. Every change tried on the recipe (joint maps,",
          "  whitened steps, learning rates, more steps, hand-over stages, kv-focused",
          "  distillation) moved it by at most about 13% (joint, whitened maps against split: 8–13%; kv hand-overs",
          "  raised it; [translators.md](../translators.md), section 2 and Results). The",
          "  gap also grew as the house models learned to read their context: with the",
          "  earlier models, which barely did, the same pipeline left 0.0026–0.0075."]
    if served and max(distilled) > 0.02:
        md += [f"  With the router's {tail}-token native tail (the target reads the last {tail}",
               f"  prefix tokens itself) the gap is {min(served):.3f}–{max(served):.3f} over these "
               "windows."]
        many = [precision[n][tail] for n in names if tail in precision.get(n, {})]
        if many:
            gaps = [next(t for t in r["translators"] if t["method"] == "distilled") for r in many]
            md += [f"  Over {many[0]['windows']} windows it is {min(t['gap'] for t in gaps):.3f}–"
                   f"{max(t['gap'] for t in gaps):.3f} (± {min(t['gap_se'] for t in gaps):.3f}–"
                   f"{max(t['gap_se'] for t in gaps):.3f}), and without the tail "
                   f"{min(t['gap'] for t in plain):.3f}–{max(t['gap'] for t in plain):.3f}:",
                   "  the 64-window values lie within one standard error of these; with the",
                   "  tail the served gap is not shown to be under 0.02 either"
                   " ([translator_precision.txt](translator_precision.txt))."]
    kv = []
    for n in names:
        found = distilled_accuracy(reports[n])
        if found and "kv" in found[1]:
            acc, tr = found
            kv.append((tr["kv"]["correct"], tr["kv"]["items"],
                       acc["target_native"]["kv"]["correct"]))
    if kv:
        md += [f"- Translated task accuracy: kv lookup answers {min(c for c, _, _ in kv)}–"
               f"{max(c for c, _, _ in kv)} of {kv[0][1]} items from a translated cache in every direction,",
               f"  where the targets answer {min(x for _, _, x in kv)}–{max(x for _, _, x in kv)} "
               "on their own caches. Token anchors brought part of it back (0–1 of 50 without",
               "  them; [token_anchors](../../experiments/token_anchors/README.md)); what still",
               "  fails is the lookup, which the deepest layers' keys decide: the answers are",
               "  values of the document from the wrong row (issue 32). Facts and lists lose",
               "  part of their accuracy the same way (table below)."]
    md += [f"- Distillation factor: the closed forms, whose maps read every source layer (and",
           "  in three directions keys and values together) and the target's embeddings of",
           f"  the last tokens, already start at {min(closed):.3f}–{max(closed):.3f},",
           "  below where the paper's distillation ends; its from-scratch closed-form gaps",
           "  were 5–9 times its distilled ones."]
    return md


def distilled_accuracy(report):
    """(accuracy table, cells of the distilled translator) or None."""
    acc = report.get("accuracy")
    if not acc:
        return None
    distilled = [c for c in acc if c.startswith("translated:") and
                 not c.endswith(".closed-form.safetensors")]
    return (acc, acc[distilled[0]]) if distilled else None


def main():
    reports = {direction(p): json.load(open(p))
               for p in glob.glob(os.path.join(ROOT, "docs/results/translators/*.json"))}
    if not reports:
        print("no reports in docs/results/translators/", file=sys.stderr)
        return 1
    names = [n for n in ORDER if n in reports] + sorted(n for n in reports if n not in ORDER)
    first_k = next(iter(reports.values()))["first_k"]
    # The same translators with the server's default native tail
    # (scripts/report/translate_variants.sh), where that run exists.
    w = server_native_tail()
    with_tail = {}
    for n in names:
        path = os.path.join(ROOT, "docs/results/translate_variants", f"{n}.float32.tail{w}.json")
        if os.path.exists(path):
            with_tail[n] = json.load(open(path))
    md = [
        "# Translators between the house models: results",
        "",
        "Produced by `scripts/train/train_translators.sh` (kvl fit, kvl distill, kvl eval-translator",
        "per direction) and `scripts/report/translator_report.py`; raw reports in",
        "[translators/](translators/). Test split conversations the translators never saw;",
        "log-perplexity in nats/token over the continuation after the prefix.",
        "Maps: in both pairs each target layer reads every source layer (`kvl fit",
        "--assignment relative_depth --band all`) and the target's own embeddings of the",
        "last 8 tokens (`--anchor-window 8`, token anchors: translator/README.md); kvl-large",
        "→ kvl-small and the shape-preserving pair read the source's keys and values",
        "together (`--inputs joint`) and are distilled with whitened steps (`kvl distill",
        "--whiten`), kvl-small → kvl-large's maps are split. Closed form, then distilled on",
        "windows that start anywhere (scripts/train/train_translators.sh; what the anchors and",
        "each stage buy: [token_anchors](../../experiments/token_anchors/README.md)).",
        "",
        f"Log-perplexity of the target over the continuation (all / first {first_k} tokens):",
        "natively, with no prefix (it sees only the continuation), from the closed-form and",
        "the distilled translated caches; and of the source on its own cache.",
        "",
        "| direction | windows | native | no prefix | translated, closed-form | "
        "translated, distilled | source native |",
        "|---|---|---|---|---|---|---|",
    ]
    gaps = [
        "",
        "Gap (translated − native) and share of the prefix benefit recovered,",
        f"(no prefix − translated) / (no prefix − native), all / first {first_k} tokens, each",
        "± its standard error over the windows where the report has one (paired per window;",
        "the shares' by the delta method for a ratio of means).",
        "",
        f"| direction | closed-form gap | distilled gap | recovered, closed-form | "
        f"recovered, distilled | distillation factor (all) |",
        "|---|---|---|---|---|---|",
    ]
    # The same translators over more windows (scripts/report/translator_precision.sh).
    precision = {}
    for n in names:
        for tail in (0, w):
            path = os.path.join(ROOT, "docs/results/translator_precision", f"{n}.tail{tail}.json")
            if os.path.exists(path):
                precision.setdefault(n, {})[tail] = json.load(open(path))

    def precise(n, tail, key, scale=1, fmt=".4f", unit=""):
        """'; over N windows: x ± se' from the precision run of the distilled translator."""
        run = precision.get(n, {}).get(tail)
        if not run:
            return ""
        t = next(t for t in run["translators"] if t["method"] == "distilled")
        return (f"; over {run['windows']} windows"
                f"{f' with the {tail}-token tail' if tail else ''}: "
                f"{scale * t[key]:{fmt}}{unit} ± {scale * t[key + '_se']:{fmt}}{unit}")

    checks = []
    for n in names:
        r = reports[n]
        by_method = {t["method"]: t for t in r["translators"]}
        cf, di = by_method.get("closed_form"), by_method.get("distilled")
        if cf is None or di is None:
            continue
        ppl = r["log_ppl"]
        both = lambda c: f"{c['log_ppl']:.4f} / {c['log_ppl_first']:.4f}"
        factor = cf["gap"] / di["gap"] if di["gap"] > 0 else float("inf")
        md.append(
            f"| {pretty(n)} | {r['windows']} | {both(ppl['target_native'])} | "
            f"{both(ppl['no_prefix'])} | {both(cf)} | {both(di)} | {both(ppl['source_native'])} |")
        gaps.append(
            f"| {pretty(n)} | {gap_cell(cf, 'gap', 1, '.4f', '')} | "
            f"{gap_cell(di, 'gap', 1, '.4f', '')} | {gap_cell(cf, 'recovered', 100, '.1f', '%')} | "
            f"{gap_cell(di, 'recovered', 100, '.1f', '%')} | {factor:.2f}× |")
        share = f"{100 * di['recovered_first']:.1f}%"
        se = di.get("recovered_first_se")
        if se is not None:
            share += f" ± {100 * se:.1f}% over {r['windows']} windows"
            if abs(di["recovered_first"] - 0.85) < 2 * se:
                share += " (within two standard errors of 85%)"
        share += precise(n, 0, "recovered_first", 100, ".1f", "%")
        checks.append((n, "distilled recovers ≥ 85% of the prefix benefit over the first "
                       f"{first_k} tokens", di["recovered_first"] >= 0.85, share))
        gap = f"{di['gap']:.4f}"
        if di.get("gap_se") is not None:
            gap += f" ± {di['gap_se']:.4f}"
        # Beside the plain switch the target is about.
        if with_tail.get(n):
            gap += (f" ({with_tail[n]['translators'][0]['gap']:.4f} with the server's "
                    f"{w}-token native tail, [translate_variants.txt](translate_variants.txt))")
        # KV-Lingo appendix V: after self-distillation its from-scratch Qwen3-like pair
        # keeps 0.031-0.101 nats/token (../shared/reference/kv-lingo-paper-summary.txt).
        gap += precise(n, 0, "gap") + precise(n, w, "gap")
        gap += "; paper's from-scratch pair after distillation: 0.031–0.101"
        checks.append((n, "distilled whole-continuation gap ≤ 0.02 nats/token", di["gap"] <= 0.02,
                       gap))
        checks.append((n, "distillation lowers the closed-form gap", di["gap"] < cf["gap"],
                       f"{factor:.2f}× (paper: 5–9× for its from-scratch pair)"))
    for n in names:
        found = distilled_accuracy(reports[n])
        if not found or n != "kvl-small__kvl-large":
            continue
        own, tr = found[0]["source_native"], found[1]
        tasks = sorted(t for t in own if t != "all")
        at_least = [t for t in tasks if tr[t]["accuracy"] >= own[t]["accuracy"]]
        value = f"{len(at_least)} of {len(tasks)} ({', '.join(at_least) or 'none'})"
        if with_tail.get(n):
            acc = with_tail[n]["accuracy"]
            tr_w = next(v for k, v in acc.items() if k.startswith("translated"))
            at_w = [t for t in tasks if tr_w[t]["accuracy"] >= own[t]["accuracy"]]
            value += (f"; with the server's {w}-token native tail {len(at_w)} of {len(tasks)} "
                      f"({', '.join(at_w) or 'none'}), {tr_w['all']['accuracy']:.3f} against "
                      f"{own['all']['accuracy']:.3f} over all tasks")
        checks.append((n, "distilled translated task accuracy ≥ kvl-small's own on most tasks",
                       2 * len(at_least) > len(tasks), value))
    md += gaps
    md += ["", "## Targets of the issue", "", "| direction | target | met | value |",
           "|---|---|---|---|"]
    for n, what, ok, value in checks:
        md.append(f"| {pretty(n)} | {what} | {'yes' if ok else '**no**'} | {value} |")

    md += why_missed(reports, names, with_tail, w, precision)
    md += ["", "## Task accuracy (greedy, exact match; translated: the source prefills the prompt)",
           ""]
    for n in names:
        acc = reports[n].get("accuracy")
        if not acc:
            continue
        tasks = sorted(next(iter(acc.values())).keys())
        md += [f"{pretty(n)}:", "", "| condition | " + " | ".join(tasks) + " |",
               "|---|" + "---|" * len(tasks)]
        for cond, cells in acc.items():
            label = cond
            if cond.startswith("translated:"):
                label = "translated " + os.path.basename(cond[len("translated:"):])
            md.append(f"| {label} | " + " | ".join(f"{cells[t]['accuracy']:.3f}" for t in tasks) + " |")
        md.append("")

    md += ["## Multi-turn: alternating switches", "",
           "Mean NLL (nats/token) of each turn's tokens when the models alternate turn by turn,",
           "by how the incoming model gets the history: (a) translating only the spans it lacks",
           "from their native writer, (b) re-translating the whole prefix, (c) re-prefill.", "",
           "| direction | runs × turns | (a) span-wise | (b) whole prefix | (c) re-prefill |",
           "|---|---|---|---|---|"]
    excess_a, excess_b = [], []  # per direction: (a) - (c), (b) - (c)
    for n in names:
        mt = reports[n].get("multi_turn")
        if not mt or not mt["turns"]:
            continue
        rows = [t for t in mt["turns"] if t["turn"] > 0] or mt["turns"]
        mean = lambda key: sum(t[key] for t in rows) / len(rows)
        excess_a.append(mean("span_wise") - mean("reprefill"))
        excess_b.append(mean("whole_prefix") - mean("reprefill"))
        md.append(f"| {pretty(n)} | {mt['runs']} × {len(mt['turns'])} | {mean('span_wise'):.4f} | "
                  f"{mean('whole_prefix'):.4f} | {mean('reprefill'):.4f} |")
    benefits = [reports[n]["log_ppl"]["no_prefix"]["log_ppl"] -
                reports[n]["log_ppl"]["target_native"]["log_ppl"] for n in names]
    md += ["", "## Reading these numbers", "",
           f"- The prefix benefit (no prefix − native) is {min(benefits):.3f}–{max(benefits):.3f}",
           "  nats/token over the whole continuation; the shares recovered are shares of it.",
           "  Most of the continuation's tokens are predictable without the prefix, so the",
           "  task accuracies (answers that need the prompt) are the harder test of a",
           "  translated cache.",
           ]
    for n in names:
        found = distilled_accuracy(reports[n])
        if not found:
            continue
        tgt, tr = found[0]["target_native"], found[1]
        tasks = sorted(t for t in tgt if t != "all")
        lost = [f"{t} {tgt[t]['accuracy']:.3f} → {tr[t]['accuracy']:.3f}" for t in tasks
                if tr[t]["accuracy"] < tgt[t]["accuracy"] - 0.05]
        kept = len(tasks) - len(lost)
        md.append(f"- {pretty(n)}: the distilled translated prompt keeps the target's native "
                  f"accuracy within 0.05 on {kept} of {len(tasks)} tasks" +
                  (f"; it loses {'; '.join(lost)}." if lost else "."))
    if excess_a:
        md += ["- Multi-turn: span-wise translation (a) stays within "
               f"{min(excess_a):.3f}–{max(excess_a):.3f} nats/token of re-prefill; re-translating",
               "  the whole prefix (b) compounds the error of translating already-translated",
               f"  spans ({min(excess_b):.3f}–{max(excess_b):.3f} above re-prefill; maps that read every",
               "  source layer compound far more than one-layer maps: the shape-preserving pair",
               "  mapped layer to layer stayed 0.13–0.15 above re-prefill, docs/translators.md).",
               "  The router translates span-wise (docs/design.md decision 1)."]
    # Distillation runs (docs/results/training/S__T/), by stage: on windows that start anywhere
    # (S__T.any.distill.json where later stages followed, else S__T.distill.json),
    # at chat hand-overs (S__T.chat.distill.json where a low-lr pass followed,
    # else S__T.distill.json with a hand_over other than "any"), and the low-lr
    # pass back on windows that start anywhere (S__T.distill.json with
    # hand_over "any" after the other two).
    anywhere, hand_over, polish = {}, {}, {}
    for n in names:
        runs = {}
        for stage in ("any.", "chat.", ""):
            path = os.path.join(ROOT, "docs", "results", "training", n, f"{n}.{stage}distill.json")
            if os.path.exists(path):
                runs[stage] = json.load(open(path))
        last = runs.get("")
        last_any = last is not None and last.get("hand_over", "any") == "any"
        if "any." in runs:
            anywhere[n] = runs["any."]
        elif last_any:
            anywhere[n] = last
        if "chat." in runs:
            hand_over[n] = runs["chat."]
        elif last and not last_any:
            hand_over[n] = last
        if last_any and "any." in runs:
            polish[n] = last
    for stage, runs in (("on windows that start anywhere", anywhere),
                        ("at chat hand-overs", hand_over),
                        ("back on windows that start anywhere, at low lr", polish)):
        if not runs:
            continue
        steps = sorted({r["steps"] for r in runs.values()})
        lrs = sorted({r["lr"] for r in runs.values()})
        at_end = [n for n, r in runs.items() if r["best_step"] == r["steps"]]
        md += [f"- Distillation {stage} ({len(runs)} directions, logs in [training/](training/)): "
               f"{'/'.join(str(x) for x in steps)} steps at lr "
               f"{'/'.join(f'{x:g}' for x in lrs)}; the best validation KL came at the last step "
               f"in {len(at_end)} of {len(runs)}" + (" (still falling)." if at_end else ".")]
    md.append("")
    out = os.path.join(ROOT, "docs/results/translators.md")
    with open(out, "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
