"""Load benchmark: aggregate throughput and latency of a real kvl-server under
1..32 concurrent sessions, with continuous batching on and off (the server's
`batching.enabled`), in one run.

Workloads: "large" (every turn on kvl-large, explicit policy) and "mix" (the
alternate policy: every turn switches between kvl-small and kvl-large,
translated). Each session sends --turns turns of --words words and generates up
to --max-tokens tokens greedily. Per cell: generated tokens/s over the cell's
wall time (all sessions together), client TTFT p50/p99 (send -> first
TokenDelta), inter-token latency p50/p99 (gaps between TokenDeltas of a
turn), turns and errors. Writes a text table, JSON and a PNG plot
(throughput and p99 TTFT against sessions).

Uses Debian's /usr/bin/python3 with python3-grpcio and python3-protobuf.

usage: /usr/bin/python3 bench/load_bench.py --server BUILD/server/kvl-server
           --out docs/results/load_bench [--levels 1,2,4,8,16,32] [--turns 3]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_bench as sb  # noqa: E402  (server start-up, config, client, filler)


def chat_timed(client, sid, text, max_tokens, policy, model=""):
    """One turn; the client-side time of each TokenDelta and the summary."""
    req = client.pb.ChatRequest(
        session_id=sid, user_message=text.encode(),
        sampling=client.pb.SamplingParams(max_tokens=max_tokens),  # temperature 0: greedy
        routing=client.pb.RoutingHints(policy=policy, model=model))
    start = time.perf_counter()
    deltas, summary, switched = [], None, False
    for ev in client._chat(req, timeout=600, metadata=[("x-kvl-session-id", sid)]):
        kind = ev.WhichOneof("event")
        if kind == "delta" and ev.delta.token_ids:
            deltas.append(time.perf_counter() - start)
        elif kind == "routing":
            switched = ev.routing.switched
        elif kind == "summary":
            summary = ev.summary
    return deltas, summary, switched


def run_cell(client, level, workload, turns, words, max_tokens, tag):
    policy, model = ("explicit", sb.LARGE) if workload == "large" else ("alternate", "")
    results, errors, wall = sb.run_sessions(
        client, level, turns, f"{tag}-{workload}-{level}",
        lambda sid, i, t: chat_timed(client, sid, f"Session {i} turn {t}: " +
                                     sb.filler(words, i * 31 + t), max_tokens, policy, model))
    ttft = [d[0] for d, _, _ in results if d]
    itl = [b - a for d, _, _ in results for a, b in zip(d, d[1:])]
    generated = sum(s.generated_tokens for _, s, _ in results if s is not None)
    pct = lambda v, p: sb.percentile(v, p) if v else float("nan")  # noqa: E731
    return {"sessions": level, "workload": workload, "turns": len(results),
            "switches": sum(1 for _, _, sw in results if sw), "errors": len(errors),
            "error_codes": sorted(set(errors)), "wall_s": wall, "generated_tokens": generated,
            "tokens_per_s": generated / wall if wall > 0 else 0.0,
            "ttft_p50_ms": pct(ttft, 50) * 1e3, "ttft_p99_ms": pct(ttft, 99) * 1e3,
            "itl_p50_ms": pct(itl, 50) * 1e3, "itl_p99_ms": pct(itl, 99) * 1e3}


def write_config(tmp, batching, threads):
    path = sb.write_config(tmp, threads, "auto", 32, "after-turn")
    with open(path) as f:
        config = json.load(f)
    config["batching"] = {"enabled": batching}
    config["limits"] = {"max_concurrent_streams": 1024, "max_waiting_turns_per_model": 1024}
    path = os.path.join(tmp, f"server-{'batched' if batching else 'unbatched'}.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path


def plot(rows, out):
    dat = out + ".dat"
    with open(dat, "w") as f:
        for workload in ("large", "mix"):
            for mode in ("batched", "unbatched"):
                f.write(f"# {workload} {mode}: sessions tokens_per_s ttft_p99_ms\n")
                for r in rows:
                    if r["workload"] == workload and r["mode"] == mode:
                        f.write(f"{r['sessions']} {r['tokens_per_s']:.2f} {r['ttft_p99_ms']:.2f}\n")
                f.write("\n\n")
    gp = out + ".gp"
    with open(gp, "w") as f:
        f.write(f"""set terminal pngcairo size 1100,450 font ",10" noenhanced
set output "{os.path.basename(out)}.png"
set multiplot layout 1,2 title "kvl-server load benchmark (bench/load_bench.py)"
set logscale x 2
set xlabel "concurrent sessions"
set key top left
set grid
set ylabel "generated tokens/s (all sessions)"
plot for [i=0:3] "{os.path.basename(dat)}" index i using 1:2 with linespoints lw 2 \\
     title word("large-batched large-unbatched mix-batched mix-unbatched", i+1)
set ylabel "client TTFT p99 (ms)"
set logscale y
plot for [i=0:3] "{os.path.basename(dat)}" index i using 1:3 with linespoints lw 2 \\
     title word("large-batched large-unbatched mix-batched mix-unbatched", i+1)
unset multiplot
""")
    subprocess.run(["gnuplot", os.path.basename(gp)], cwd=os.path.dirname(os.path.abspath(out)),
                   check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--out", required=True, help="path prefix: .txt, .json, .png, .dat, .gp")
    ap.add_argument("--levels", default="1,2,4,8,16,32")
    ap.add_argument("--workloads", default="large,mix")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--words", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="server runtime.threads")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    workloads = args.workloads.split(",")
    lines, rows = [], []

    def emit(line=""):
        print(line, flush=True)
        lines.append(line)

    emit("kvlingo load benchmark (bench/load_bench.py)")
    emit(f"command: /usr/bin/python3 bench/load_bench.py {' '.join(sys.argv[1:])}")
    emit(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host: {platform.node()}  "
         f"{os.cpu_count()} CPUs  runtime.threads {args.threads}  float32  greedy, "
         f"max_tokens {args.max_tokens}, {args.turns} turns of {args.words} words per session")
    emit(f"load at start: {sb.load_line()}")
    header = (f"{'mode':>9} {'workload':>8} {'sessions':>8} {'turns':>5} {'switch':>6} "
              f"{'errors':>6} {'wall s':>7} {'tokens':>6} {'tok/s':>8} {'TTFT p50':>9} "
              f"{'p99':>8} {'ITL p50':>8} {'p99':>8}")
    with tempfile.TemporaryDirectory(prefix="kvl-load-bench-") as tmp:
        stubs = os.path.join(tmp, "python")
        os.makedirs(stubs)
        subprocess.run(["protoc", f"--proto_path={sb.ROOT}/proto", f"--python_out={stubs}",
                        "kvlingo/v1/chat.proto", "kvlingo/v1/session.proto",
                        "kvlingo/v1/model.proto"], check=True)
        for batching in (True, False):
            mode = "batched" if batching else "unbatched"
            config = write_config(tmp, batching, args.threads)
            proc, target, _ = sb.start_server(os.path.abspath(args.server), config, tmp)
            try:
                client = sb.Client(target, stubs)
                client.wait_serving()
                emit()
                emit(f"== batching.enabled = {str(batching).lower()} ==")
                emit(header)
                # One warm-up turn per workload's models.
                run_cell(client, 1, "mix", 2, args.words, 4, f"warm-{mode}")
                for workload in workloads:
                    for level in levels:
                        r = run_cell(client, level, workload, args.turns, args.words,
                                     args.max_tokens, mode)
                        r["mode"] = mode
                        rows.append(r)
                        emit(f"{mode:>9} {workload:>8} {level:>8} {r['turns']:>5} "
                             f"{r['switches']:>6} {r['errors']:>6} {r['wall_s']:7.1f} "
                             f"{r['generated_tokens']:>6} {r['tokens_per_s']:8.1f} "
                             f"{r['ttft_p50_ms']:9.1f} {r['ttft_p99_ms']:8.1f} "
                             f"{r['itl_p50_ms']:8.2f} {r['itl_p99_ms']:8.2f}")
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    emit()
    emit("== ratios (same run) ==")
    by = {(r["mode"], r["workload"], r["sessions"]): r for r in rows}
    for workload in workloads:
        one = by.get(("batched", workload, 1))
        for level in levels:
            b, u = by.get(("batched", workload, level)), by.get(("unbatched", workload, level))
            if not (b and u and one and one["tokens_per_s"] > 0 and u["tokens_per_s"] > 0):
                continue
            emit(f"{workload:>8} {level:>3} sessions: batched tok/s = "
                 f"{b['tokens_per_s'] / one['tokens_per_s']:.2f}x one batched session, "
                 f"{b['tokens_per_s'] / u['tokens_per_s']:.2f}x unbatched at {level}; "
                 f"TTFT p99 batched {b['ttft_p99_ms']:.1f} ms vs unbatched {u['ttft_p99_ms']:.1f} ms")
    with open(args.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    plot(rows, args.out)


if __name__ == "__main__":
    main()
