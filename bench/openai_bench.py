"""Multi-turn benchmark of the OpenAI API, in the shape of LMCache's multi-round
QA and vLLM's multi-turn benchmark: --users users each hold a growing
conversation (a shared system prompt, their own history) for --rounds rounds,
all users at once, every request streamed and carrying the whole
conversation. Every --switch-every rounds a user's model changes between
kvl-small and kvl-large (users staggered, so switch and non-switch requests
mix at every moment).

Two arms over the same workload, on one server, in one run (alternated
--repeats times): "cross-model cache" (switches served by translation, the
server's default) and "re-prefill" (the request's "kvlingo": {"strategy":
"reprefill"}: every switch re-prefills the conversation; non-switch requests
still reuse their model's cache). Each arm's conversations carry their own tag
in the system prompt, so no arm finds the other's conversations cached.

Reports, per arm: TTFT (client: request sent -> first content chunk) mean,
p50, p90, p99 by round and by switch / no switch; TPOT; ITL; request and
output-token throughput; the share of prompt tokens served from a cache (own
and translated, from the responses' usage and kvlingo blocks). Writes a
Markdown report and the raw rows as JSON.

Uses Debian's /usr/bin/python3 (the standard library, and python3-grpcio for
bench/server_bench.py's helpers).

usage: /usr/bin/python3 bench/openai_bench.py --server BUILD/server/kvl-server
           --out docs/results/openai_bench [--users 8] [--rounds 6] [--quick]
"""
import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_bench as sb  # noqa: E402  (config, filler, percentile)

ARMS = (("cross-model cache", None), ("re-prefill", "reprefill"))


def start_server(binary, config, directory):
    log_path = os.path.join(directory, "server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([binary, "--config", config, "--listen", "127.0.0.1:0",
                             "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(log_path) as f:
            text = f.read()
        m = re.search(r"OpenAI API on (\S+):(\d+)", text)
        if m and "listening on" in text:
            return proc, (m.group(1), int(m.group(2)))
        if proc.poll() is not None:
            sys.exit(f"kvl-server exited with {proc.returncode}:\n{text}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("kvl-server did not start within 120 s")


def stream_completion(address, body):
    """One streamed request; client-side times of its content chunks and the
    final chunk's kvlingo block and usage."""
    conn = http.client.HTTPConnection(*address, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    chunks, text, kvlingo, usage = [], [], None, None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error']}")
        for choice in event.get("choices", []):
            content = choice.get("delta", {}).get("content")
            if content:
                chunks.append(time.perf_counter() - start)
                text.append(content)
        kvlingo = event.get("kvlingo", kvlingo)
        usage = event.get("usage", usage)
    conn.close()
    return {"chunks": chunks, "text": "".join(text), "kvlingo": kvlingo, "usage": usage,
            "total": time.perf_counter() - start}


def user_model(user, rnd, switch_every):
    return (sb.SMALL, sb.LARGE)[((rnd + user % switch_every) // switch_every) % 2]


def run_arm(address, arm, strategy, args, rep):
    system = (f"[{arm} / run {rep}] You are a helpful assistant for a team. " +
              sb.filler(args.system_words, 7))
    rows, errors = [], []

    def user_loop(u):
        messages = [{"role": "system", "content": system}]
        for r in range(args.rounds):
            model = user_model(u, r, args.switch_every)
            messages.append({"role": "user",
                             "content": f"User {u}, question {r}: " +
                                        sb.filler(args.user_words, 1000 * u + r)})
            body = {"model": model, "messages": messages, "stream": True,
                    "stream_options": {"include_usage": True}, "temperature": 0,
                    "max_tokens": args.max_tokens}
            if strategy:
                body["kvlingo"] = {"strategy": strategy}
            try:
                got = stream_completion(address, body)
            except Exception as e:  # noqa: BLE001  (reported, the user stops)
                errors.append(f"user {u} round {r}: {e}")
                return
            k, usage = got["kvlingo"] or {}, got["usage"] or {}
            rows.append({
                "arm": arm, "rep": rep, "user": u, "round": r, "model": model,
                "switched": bool(k.get("switched")), "path": k.get("path"),
                "ttft": got["chunks"][0] if got["chunks"] else got["total"],
                "itl": [b - a for a, b in zip(got["chunks"], got["chunks"][1:])],
                "tpot": ((got["total"] - got["chunks"][0]) / (len(got["chunks"]) - 1)
                         if len(got["chunks"]) > 1 else None),
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "completion_tokens": usage.get("completion_tokens", 0),
                "own": k.get("prompt_tokens_own_cache", 0),
                "translated": k.get("prompt_tokens_translated", 0),
                "prefilled": k.get("prompt_tokens_prefilled", 0),
                "server_ttft": k.get("time_to_first_token_seconds"),
            })
            messages.append({"role": "assistant", "content": got["text"]})

    start = time.perf_counter()
    threads = [threading.Thread(target=user_loop, args=(u,)) for u in range(args.users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows, errors, time.perf_counter() - start


def stats(values):
    if not values:
        return "n/a"
    return (f"{statistics.mean(values) * 1e3:8.1f} {sb.percentile(values, 50) * 1e3:8.1f} "
            f"{sb.percentile(values, 90) * 1e3:8.1f} {sb.percentile(values, 99) * 1e3:8.1f}")


def report(rows, walls, errors, args):
    out = ["# OpenAI API multi-turn benchmark", "",
           "Command: `/usr/bin/python3 bench/openai_bench.py " + " ".join(sys.argv[1:]) + "`", "",
           f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
           f"{sb.load_line()} at the end.", "",
           f"Workload: {args.users} users at once, {args.rounds} rounds each, a shared system "
           f"prompt of {args.system_words} words, user messages of {args.user_words} words, "
           f"up to {args.max_tokens} tokens per reply (greedy), each user's model changing "
           f"every {args.switch_every} rounds (kvl-small <-> kvl-large, users staggered); "
           f"arms alternated {args.repeats} time(s). Times in ms (mean, p50, p90, p99).", ""]
    for arm, _ in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        wall = sum(w for (a, _), w in walls.items() if a == arm)
        out += [f"## {arm}", "", "```",
                f"{'':28s} {'n':>4s} {'mean':>8s} {'p50':>8s} {'p90':>8s} {'p99':>8s}"]
        for label, sel in (("TTFT, switch requests", [r for r in mine if r["switched"]]),
                           ("TTFT, no-switch requests",
                            [r for r in mine if not r["switched"] and r["round"] > 0]),
                           ("TTFT, first requests", [r for r in mine if r["round"] == 0])):
            out.append(f"{label:28s} {len(sel):4d} {stats([r['ttft'] for r in sel])}")
        for rnd in range(args.rounds):
            sel = [r for r in mine if r["round"] == rnd]
            out.append(f"{'TTFT, round ' + str(rnd):28s} {len(sel):4d} "
                       f"{stats([r['ttft'] for r in sel])}")
        tpot = [r["tpot"] for r in mine if r["tpot"] is not None]
        itl = [x for r in mine for x in r["itl"]]
        out.append(f"{'TPOT':28s} {len(tpot):4d} {stats(tpot)}")
        out.append(f"{'ITL':28s} {len(itl):4d} {stats(itl)}")
        prompt = sum(r["prompt_tokens"] for r in mine)
        own = sum(r["own"] for r in mine)
        translated = sum(r["translated"] for r in mine)
        completion = sum(r["completion_tokens"] for r in mine)
        out += ["```", "",
                f"- {len(mine)} requests in {wall:.1f} s: {len(mine) / wall:.2f} requests/s, "
                f"{completion / wall:.1f} output tokens/s.",
                f"- Prompt tokens: {prompt}; from a cache {own + translated} "
                f"({(own + translated) / max(prompt, 1):.1%}): the model's own "
                f"{own / max(prompt, 1):.1%}, translated {translated / max(prompt, 1):.1%}.",
                f"- Switch requests by path: " + ", ".join(
                    f"{p}: {sum(1 for r in mine if r['switched'] and r['path'] == p)}"
                    for p in sorted({r['path'] for r in mine if r['switched']})), ""]
    a = [r["ttft"] for r in rows if r["arm"] == ARMS[0][0] and r["switched"]]
    b = [r["ttft"] for r in rows if r["arm"] == ARMS[1][0] and r["switched"]]
    if a and b:
        out += ["## Switch requests, cross-model cache against re-prefill", "",
                f"Mean TTFT {statistics.mean(a) * 1e3:.1f} ms against "
                f"{statistics.mean(b) * 1e3:.1f} ms: {statistics.mean(b) / statistics.mean(a):.2f}x "
                f"sooner; p50 {sb.percentile(b, 50) / sb.percentile(a, 50):.2f}x, "
                f"p90 {sb.percentile(b, 90) / sb.percentile(a, 90):.2f}x.", ""]
    if errors:
        out += ["## Errors", ""] + [f"- {e}" for e in errors] + [""]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--out", required=True, help="writes OUT.md and OUT.json")
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--switch-every", type=int, default=2)
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--user-words", type=int, default=120)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 users, 3 rounds, 1 repeat")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless every switch request was served translated in the first "
                        "arm and re-prefilled in the second, and some were")
    args = p.parse_args()
    if args.quick:
        args.users, args.rounds, args.repeats, args.system_words = 2, 3, 1, 60
    with tempfile.TemporaryDirectory(prefix="kvl-openai-bench-") as tmp:
        config = sb.write_config(tmp, args.threads, "float32", 32, "after-turn")
        proc, address = start_server(args.server, config, tmp)
        try:
            rows, walls, errors = [], {}, []
            for rep in range(args.repeats):
                order = ARMS if rep % 2 == 0 else ARMS[::-1]
                for arm, strategy in order:
                    print(f"run {rep}: {arm} ...", file=sys.stderr, flush=True)
                    got, errs, wall = run_arm(address, arm, strategy, args, rep)
                    rows += got
                    errors += errs
                    walls[(arm, rep)] = wall
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    text = report(rows, walls, errors, args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump({"args": vars(args), "rows": rows, "errors": errors}, f)
    print(text)
    if args.check:
        for (arm, strategy), want in zip(ARMS, ("translated", "reprefill")):
            paths = [r["path"] for r in rows if r["arm"] == arm and r["switched"]]
            if not paths or any(p != want for p in paths):
                errors.append(f"{arm}: switch requests served {paths}, expected all {want}")
                print(errors[-1], file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
