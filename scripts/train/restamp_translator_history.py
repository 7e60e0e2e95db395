#!/usr/bin/python3
"""Writes the training history into translators distilled before files kept one.

Until `kvl distill` kept its init's record ("training_history", translator/README.md),
a translator's header described only its last stage. For kvl-small -> kvl-large,
whose last stage kept the stage-2 maps, that read "distilled, 0 steps". This
script rebuilds each committed translator's history from its committed stage
summaries (S__T.closed-form.r2.json, S__T.any.distill.json,
S__T.chat.distill.json, S__T.distill.json, in docs/results/training/S__T/, or
beside the translator where they are not there), following each stage's "init" back
to the closed-form fit, and rewrites only the header's metadata; the tensors'
bytes are unchanged (checked). It first checks that the last stage it rebuilds
equals the record the file already holds, so a summary that does not belong to
the file is refused.

Usage: /usr/bin/python3 scripts/train/restamp_translator_history.py [--check] [DIR]
(DIR: models/translators; the summaries are read from docs/results/training/
of this repository). --check changes nothing and fails if a file's
history differs from the one the summaries give.
"""
import json
import pathlib
import struct
import sys

KEY = "kvlingo_translator"
# Where scripts/train/train_translators.sh keeps each translator's training logs.
LOGS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "training"


def read_header(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_header(path, header, body):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data 8-byte aligned
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def fit_record(r2):
    return {"method": "closed_form", "weighting": r2["weighting"], "corpus": r2["data"],
            "ridge": r2["ridge"], "n_sequences": r2["n_sequences"],
            "n_tokens": r2["n_tokens"], "steps": 0}


def distill_record(summary, fit):
    # As kvl distill writes it: weighting and ridge stay those of the fit.
    steps, batch = summary["best_step"], summary["batch"]
    window = summary["prefix"] + summary["continuation"]
    return {"method": "distilled", "weighting": fit["weighting"], "corpus": summary["train"],
            "ridge": fit["ridge"], "n_sequences": steps * batch,
            "n_tokens": steps * batch * window, "steps": steps}


def summaries_dir(directory, base):
    """docs/results/training/S__T/ where it holds the fit's summary, else DIR."""
    logs = LOGS / base
    return logs if (logs / f"{base}.closed-form.r2.json").exists() else directory


def stages_of(directory, base):
    """The records of every stage, oldest first, rebuilt from the summaries."""
    directory = summaries_dir(directory, base)
    r2 = json.loads((directory / f"{base}.closed-form.r2.json").read_text())
    fit = fit_record(r2)
    by_output = {}
    for p in directory.glob(f"{base}*.distill.json"):
        s = json.loads(p.read_text())
        by_output[s["translator"]] = s
    # The last stage wrote the committed file (its path as the recipe named it,
    # relative to the repository); earlier stages wrote build paths.
    finals = [o for o in by_output if pathlib.PurePath(o).name == f"{base}.safetensors"]
    if len(finals) != 1:
        raise SystemExit(f"{base}: {len(finals)} stage summaries wrote {base}.safetensors")
    chain, out = [], finals[0]
    while out in by_output:
        chain.append(by_output[out])
        out = by_output[out]["init"]
    if out != r2["translator"]:
        raise SystemExit(f"{base}: the stages lead back to {out}, not to the fit "
                         f"{r2['translator']}")
    return [fit] + [distill_record(s, fit) for s in reversed(chain)]


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    directory = pathlib.Path(args[0] if args else "models/translators")
    failed = False
    for path in sorted(directory.glob("*.safetensors")):
        base = path.name[:-len(".safetensors")]
        if "." in base:
            continue  # stage outputs, not committed translators
        header, body = read_header(path)
        meta = json.loads(header["__metadata__"][KEY])
        stages = stages_of(directory, base)
        if stages[-1] != meta["training"]:
            raise SystemExit(f"{path}: the summaries' last stage {stages[-1]} is not the "
                             f"file's record {meta['training']}")
        history = stages[:-1]
        if meta.get("training_history") == history:
            print(f"{path}: history already recorded ({len(history)} earlier stages)")
            continue
        if check:
            print(f"{path}: history missing or different", file=sys.stderr)
            failed = True
            continue
        meta["training_history"] = history
        header["__metadata__"][KEY] = json.dumps(meta, sort_keys=True, separators=(",", ":"))
        write_header(path, header, body)
        if read_header(path)[1] != body:
            raise SystemExit(f"{path}: tensor bytes changed")
        steps = " -> ".join(f"{s['method']} {s['steps']} steps" for s in stages)
        print(f"{path}: {steps}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
