#!/usr/bin/python3
"""Adopts a finished `kvl train-lm` run (float32 export) as a curriculum stage
exported in bfloat16: writes OUT_DIR as `kvl train-lm --save-dtype bfloat16`
would have (model.safetensors byte for byte as SaveCheckpoint writes it: round
to nearest even, the same header; config.json's torch_dtype), copies the
tokenizer, generation config, summary and log, and, for a run trained with
--no-plot, draws its loss curve (loss.png, .dat, .gp) as train-lm does.
   /usr/bin/python3 scripts/adopt_run.py SRC_DIR OUT_DIR
Used to adopt the kv probe's runs (scripts/kv_probe.sh) as the recipe's last
stage (scripts/train_house_models.sh) without training them again."""
import array, json, os, shutil, struct, subprocess, sys

src, out = sys.argv[1:3]
os.makedirs(out, exist_ok=True)
blob = open(f"{src}/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n])
data = memoryview(blob)[8 + n:]
names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
new_header, chunks, offset = {}, [], 0
if "__metadata__" in header:
    new_header["__metadata__"] = header["__metadata__"]
for name in names:
    t = header[name]
    if t["dtype"] != "F32":
        sys.exit(f"{src}: {name} is {t['dtype']}, not F32")
    begin, end = t["data_offsets"]
    bits = array.array("I")
    bits.frombytes(data[begin:end])
    if sys.byteorder != "little":
        bits.byteswap()
    half = array.array("H", (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
                             if (b & 0x7F800000) != 0x7F800000 or not (b & 0x7FFFFF)
                             else (b >> 16) | 0x40 for b in bits))
    chunk = half.tobytes()
    new_header[name] = {"data_offsets": [offset, offset + len(chunk)], "dtype": "BF16",
                        "shape": t["shape"]}
    chunks.append(chunk)
    offset += len(chunk)
text = json.dumps(new_header, separators=(",", ":"))
text += " " * ((8 - (8 + len(text)) % 8) % 8)  # the data starts 8-aligned
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text.encode() + b"".join(chunks))
config = open(f"{src}/config.json", encoding="utf-8").read()
if '"torch_dtype": "float32"' not in config:
    sys.exit(f"{src}/config.json: no float32 torch_dtype")
open(f"{out}/config.json", "w", encoding="utf-8").write(
    config.replace('"torch_dtype": "float32"', '"torch_dtype": "bfloat16"'))
for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "summary.json",
          "train_log.jsonl", "loss.png", "loss.dat", "loss.gp"):
    if os.path.exists(f"{src}/{f}"):
        shutil.copyfile(f"{src}/{f}", f"{out}/{f}")

if not os.path.exists(f"{src}/loss.png"):  # as tools/train_lm.cc's PlotLoss and tools/plot.cc
    log = [json.loads(line) for line in open(f"{src}/train_log.jsonl") if line.strip()]
    initial = json.load(open(f"{src}/summary.json")).get("initial_valid_loss", -1)
    train = [(r["step"], r["loss"]) for r in log]
    smooth = [(r["step"], sum(x["loss"] for x in log[max(0, i - 19):i + 1]) / min(i + 1, 20))
              for i, r in enumerate(log)]
    valid = ([(0, initial)] if initial >= 0 else []) + \
        [(r["step"], r["valid_loss"]) for r in log if "valid_loss" in r]
    series = [("train loss (per step)", train, False),
              ("train loss (trailing mean of 20)", smooth, False), ("valid loss (fp32)", valid, True)]
    png = os.path.abspath(f"{out}/loss.png")
    dat, gp = png[:-4] + ".dat", png[:-4] + ".gp"
    with open(dat, "w") as f:
        for title, points, _ in series:
            f.write(f"# {title}\n" + "".join(f"{x:.10g} {y:.10g}\n" for x, y in points) + "\n\n")
    plots = ", \\\n     ".join(
        f'"{dat}" index {i} using 1:2 with {"linespoints pt 7 ps 0.8" if points_style else "lines"}'
        f' lw 2 title "{title}"' for i, (title, _, points_style) in enumerate(series))
    with open(gp, "w") as f:
        f.write(f'set terminal pngcairo size 1000,600\nset output "{png}"\n'
                f'set title "kvl train-lm: {os.path.basename(os.path.abspath(out))}" noenhanced\n'
                'set xlabel "step" noenhanced\nset ylabel "cross-entropy (nats/token)" noenhanced\n'
                f"set grid\nset key top right noenhanced\nplot {plots}\n")
    subprocess.run(["gnuplot", gp], check=True)
