"""Server benchmark: drives a real kvl-server over gRPC and reports, in one run,
  1. TTFT of the first turn after a model switch, by strategy/path, at about 1k
     and 4k tokens of history, client-observed next to server-reported, whose
     difference is the gRPC (and Python client) overhead; the same difference
     seen by bench/ttft_client, a C++ client, when it is built;
 1b. the same for a second switch, where the target lacks only the last span;
  2. TTFT percentiles with 1, 8 and 32 concurrent sessions switching models.

Uses only Debian's /usr/bin/python3 with python3-grpcio and python3-protobuf;
message classes come from `protoc --python_out` into a temporary directory.

usage: /usr/bin/python3 bench/server_bench.py --server BUILD/server/kvl-server
                                              --out docs/results/server_bench.txt [--quick]
--native-layers K,K,... adds to parts 1 and 1b a "translate k=K" row per K: the
translate strategy with RoutingHints.native_layers K (the native-depth dial;
the kvl-small -> kvl-large translator must carry the residual maps they need:
--small-large-translator FILE, from kvl fit-residual).
--pair SOURCE,TARGET switches between two other committed house models with
translators both ways (e.g. kvl-small,kvl-small-t2: across tokenizers) in
place of kvl-small -> kvl-large; the server then serves those two alone.
"""
import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL, SMALL_B, LARGE = "kvl-small", "kvl-small-b", "kvl-large"
# SwitchStrategy values of proto/kvlingo/v1/chat.proto.
STRATEGIES = (("translate", 1), ("reprefill", 2), ("reprefill-missing", 3))
# The short user turn sent to kvl-large at every switch, by both clients.
SWITCH_TURN = "Now answer this briefly, please."

# Filler for long user turns: ordinary English words in a fixed pseudo-random
# order, so the tokenizer sees text like the training data and every session
# built from the same seed has the same history.
WORDS = ("the cache of a model keeps keys and values for every token so that a "
         "later turn only needs to read them instead of computing them again while "
         "a router decides which model answers each question and hands the history "
         "over when the choice changes between a small fast model and a larger one "
         "that is slower but more careful about long answers in a conversation").split()


def filler(n_words, seed):
    state, out = seed * 2654435761 % (2 ** 32) or 1, []
    for _ in range(n_words):
        state = (state * 1103515245 + 12345) % (2 ** 31)
        out.append(WORDS[state % len(WORDS)])
    return " ".join(out) + "."


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, p):
    """Nearest-rank percentile (no interpolation), p in (0, 100]."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def ms(seconds):
    return f"{seconds * 1e3:9.2f}"


def load_line():
    one, five, fifteen = os.getloadavg()
    return f"loadavg {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


class MachineShare:
    """How much of the machine other processes used during a part of the run:
    the CPU time /proc/stat counts as busy, less this bench's own (this process,
    its waited-for children such as bench/ttft_client, and the server), over the
    CPU time there was. Times and ratios measured on a shared machine are not
    the server's alone; the report says so above WARN_ABOVE (and MIN_SECONDS of
    others' CPU time, since /proc/stat counts 10 ms ticks)."""
    WARN_ABOVE = 0.05
    MIN_SECONDS = 0.1

    def __init__(self, server_pid):
        self.pid = server_pid
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start = self.sample()

    def sample(self):
        with open("/proc/stat") as f:
            user, nice, system, idle, iowait, irq, softirq, steal = (
                int(x) for x in f.readline().split()[1:9])
        busy = (user + nice + system + irq + softirq + steal) / self.tick
        total = busy + (idle + iowait) / self.tick
        with open(f"/proc/{self.pid}/stat") as f:
            # Fields after the command name, which is in parentheses: utime and stime are 14, 15.
            fields = f.read().rsplit(")", 1)[1].split()
        server = (int(fields[11]) + int(fields[12])) / self.tick
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return busy, total, server + own

    def line(self, what):
        """The share since the last call (or since start), as one report line."""
        now = self.sample()
        busy, total, ours = (b - a for a, b in zip(self.start, now))
        self.start = now
        others = min(max((busy - ours) / total, 0.0), 1.0) if total > 0 else float("nan")
        # /proc/stat counts in clock ticks (10 ms): a short part can read a tick or two high.
        shared = others > self.WARN_ABOVE and busy - ours > self.MIN_SECONDS
        warn = (" -- WARNING: the machine was shared; the times above are not the server's "
                "alone, rerun on an idle machine") if shared else ""
        return (f"machine share during {what}: other processes used {100 * others:.1f}% of the "
                f"{os.cpu_count()} CPUs' time{warn}")


def served_models():
    """The models the benchmark's server loads: the three Qwen3 house models,
    or the --pair alone."""
    return [SMALL, SMALL_B, LARGE] if (SMALL, LARGE) == ("kvl-small", "kvl-large") else [SMALL, LARGE]


def write_config(directory, threads, translate_dtype, native_tail, repair,
                 small_large_translator=None):
    names = served_models()
    models = [{"name": m, "path": os.path.join(ROOT, "models", m)} for m in names]
    translators = []
    pairs = [(SMALL, LARGE), (LARGE, SMALL)]
    if SMALL_B in names and SMALL_B not in (SMALL, LARGE):
        pairs += [(SMALL, SMALL_B), (SMALL_B, SMALL)]
    for src, dst in pairs:
        path = os.path.join(ROOT, "models", "translators", f"{src}__{dst}.safetensors")
        if (src, dst) == (SMALL, LARGE) and small_large_translator:
            path = os.path.abspath(small_large_translator)
        translators.append({"source": src, "target": dst, "path": path,
                            "compute_dtype": translate_dtype})
    config = {
        "server": {"listen_address": "127.0.0.1:0", "metrics_address": "127.0.0.1:0",
                   "drain_timeout_seconds": 5, "max_turn_bytes": 65536,
                   "max_new_tokens_limit": 4096},
        "log": {"level": "warn"},
        "runtime": {"threads": threads, "dtype": "float32"},
        "models": models,
        "translators": translators,
        "routing": {"policy": "explicit", "default_model": SMALL, "strategy": "translate",
                    "models": [SMALL, LARGE], "native_tail_tokens": native_tail,
                    "repair": repair},
        "sessions": {"idle_timeout_seconds": 0, "memory_budget_bytes": 8 << 30},
    }
    path = os.path.join(directory, "server.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path


def start_server(binary, config, directory):
    port = free_port()
    log_path = os.path.join(directory, "server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([binary, "--config", config, "--listen", f"127.0.0.1:{port}",
                             "--metrics-address", "127.0.0.1:0"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(log_path) as f:
            text = f.read()
        if re.search(r"listening on \S+, metrics on \S+", text):
            return proc, f"127.0.0.1:{port}", log_path
        if proc.poll() is not None:
            sys.exit(f"kvl-server exited with {proc.returncode}:\n{text}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("kvl-server did not report 'listening on' within 120 s")


class Client:
    def __init__(self, target, stubs_dir):
        sys.path.insert(0, stubs_dir)
        from kvlingo.v1 import chat_pb2, session_pb2  # noqa: E402
        self.pb, self.spb = chat_pb2, session_pb2
        self.channel = grpc.insecure_channel(target)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self._health = self.channel.unary_unary("/grpc.health.v1.Health/Check",
                                                request_serializer=lambda b: b,
                                                response_deserializer=lambda b: b)
        self._create = self.channel.unary_unary(
            "/kvlingo.v1.SessionService/CreateSession",
            request_serializer=session_pb2.CreateSessionRequest.SerializeToString,
            response_deserializer=session_pb2.Session.FromString)
        self._chat = self.channel.unary_stream(
            "/kvlingo.v1.ChatService/Chat",
            request_serializer=chat_pb2.ChatRequest.SerializeToString,
            response_deserializer=chat_pb2.ChatResponse.FromString)

    def wait_serving(self, timeout=60):
        # HealthCheckRequest{} is empty on the wire; SERVING is field 1 = 1.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self._health(b"", timeout=5) == b"\x08\x01":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        sys.exit("kvl-server never reported SERVING on grpc.health.v1")

    def unary_floor(self, n=50):
        """Median round trip of an empty unary call (grpc.health.v1 Check): the
        per-call cost of this Python client and the transport alone."""
        times = []
        for _ in range(n):
            start = time.perf_counter()
            self._health(b"", timeout=5)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def stream_floor(self, n=50):
        """Median round trip of a Chat stream the server rejects at once
        (unknown session, NOT_FOUND): stream setup and status, no model work."""
        # A valid turn (the explicit policy needs its model), so that the
        # session lookup is what refuses it.
        req = self.pb.ChatRequest(session_id="no-such-session", user_message=b"hi",
                                  routing=self.pb.RoutingHints(policy="explicit", model=SMALL))
        times = []
        for _ in range(n):
            start = time.perf_counter()
            try:
                for _ in self._chat(req, timeout=5):
                    pass
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def create(self, sid):
        return self._create(self.spb.CreateSessionRequest(session_id=sid), timeout=30).session_id

    def chat(self, sid, text, max_tokens, policy, model="", strategy=0, native_layers=None):
        """One turn; returns client TTFT (send -> first TokenDelta), the routing
        decision and the summary. Raises grpc.RpcError on a failed turn."""
        hints = self.pb.RoutingHints(policy=policy, model=model, strategy=strategy)
        if native_layers is not None:
            hints.native_layers = native_layers
        req = self.pb.ChatRequest(
            session_id=sid, user_message=text.encode(),
            sampling=self.pb.SamplingParams(max_tokens=max_tokens),  # temperature 0: greedy
            routing=hints)
        routing = summary = first = last = None
        start = time.perf_counter()
        for ev in self._chat(req, timeout=600, metadata=[("x-kvl-session-id", sid)]):
            kind = ev.WhichOneof("event")
            if kind == "delta" and first is None:
                first = time.perf_counter() - start
            elif kind == "routing":
                routing = ev.routing
            elif kind == "summary":
                summary = ev.summary
                last = time.perf_counter() - start
        return {"client_ttft": first, "client_total": last, "routing": routing,
                "summary": summary}


def build_history(client, sid, target_tokens, turn_words, seed):
    """Fills session `sid` on kvl-small (explicit, one generated token per turn)
    with long user turns until its history is about `target_tokens`."""
    # About 1.4 tokens per filler word with the house tokenizer; refined per turn.
    history, turn, per_word = 0, 0, 1.4
    while history < target_tokens * 0.97:
        # Size each turn so the last one lands near the target.
        words = min(turn_words, max(8, int((target_tokens - history) / per_word) - 8))
        r = client.chat(sid, filler(words, seed * 1000 + turn), 1, "explicit", SMALL)
        new_history = r["summary"].history_tokens
        per_word = (new_history - history) / words
        history, turn = new_history, turn + 1
    return history


def cxx_switch(cxx_client, target, sids, max_tokens, strategy):
    """The measured switch turn of each filled session in `sids`, sent by
    bench/ttft_client (C++): one JSON dict per turn."""
    cmd = [cxx_client, "--target", target, "--model", LARGE, "--strategy", str(strategy),
           "--max-tokens", str(max_tokens), "--message", SWITCH_TURN]
    done = subprocess.run(cmd + sids, check=True, capture_output=True, text=True, timeout=900)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def cxx_floor(cxx_client, target, n, gap_ms):
    cmd = [cxx_client, "--target", target, "--floor", str(n), "--gap-ms", str(gap_ms),
           "--model", SMALL]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout)


def first_switch(client, sid, size, turn_words, seed):
    """A history of about `size` tokens on kvl-small; kvl-large has never seen it."""
    return build_history(client, sid, size, turn_words, seed)


def second_switch(client, sid, size, turn_words, seed, new_words=180):
    """A history of about `size` - 300 tokens on kvl-small, a first switch to
    kvl-large (translated), then one more kvl-small turn of `new_words` words
    (about 256 tokens): about `size` tokens in all, of which kvl-large holds a
    line for all but the last span."""
    build_history(client, sid, size - 300, turn_words, seed)
    client.chat(sid, SWITCH_TURN, 1, "explicit", LARGE, STRATEGIES[0][1])
    r = client.chat(sid, filler(new_words, seed + 7), 1, "explicit", SMALL)
    return r["summary"].history_tokens


def part_switch(client, sizes, reps, max_tokens, turn_words, prepare, tag, cxx_client=None,
                target=None, native_layers=()):
    """One row per (history size, strategy): `reps` fresh sessions prepared by
    `prepare`, then one short turn to kvl-large with that strategy (and one
    per native-layers K: translate with RoutingHints.native_layers K)."""
    rows = []
    strategies = [(name, strategy, None) for name, strategy in STRATEGIES]
    strategies += [(f"translate k={k}", STRATEGIES[0][1], k) for k in native_layers]
    for size in sizes:
        for name, strategy, k in strategies:
            samples = []
            print(f"[{tag}] history {size}, {name}: {2 * reps if cxx_client else reps} sessions",
                  file=sys.stderr, flush=True)
            for rep in range(reps):
                sid = client.create(f"{tag}-{size}-{name.replace(' k=', '-k')}-{rep}")
                history = prepare(client, sid, size, turn_words, size + rep)
                r = client.chat(sid, SWITCH_TURN, max_tokens, "explicit",
                                LARGE, strategy, k)
                samples.append((history, r))
            cxx_over = []
            if cxx_client and k is None:
                sids = []
                for rep in range(reps):
                    sid = client.create(f"{tag}c-{size}-{name}-{rep}")
                    prepare(client, sid, size, turn_words, size + rep)
                    sids.append(sid)
                cxx_over = [t["client_ttft"] - t["server_ttft"]
                            for t in cxx_switch(cxx_client, target, sids, max_tokens, strategy)]
            rt = samples[-1][1]["routing"]
            client_t = [s[1]["client_ttft"] for s in samples]
            server_t = [s[1]["summary"].time_to_first_token_seconds for s in samples]
            over = [c - s for c, s in zip(client_t, server_t)]
            # The same difference at the end of the stream (send -> TurnSummary
            # against the server's total), when no decoding competes for CPU.
            end_over = [s[1]["client_total"] - s[1]["summary"].timing.total_seconds
                        for s in samples]
            rows.append({
                "history": statistics.median(s[0] for s in samples), "strategy": name,
                "path": client.pb.CachePath.Name(rt.path).replace("CACHE_PATH_", "").lower(),
                "translated": rt.tokens_translated, "reprefilled": rt.tokens_reprefilled,
                "translation_s": statistics.median(s[1]["routing"].translation_seconds
                                                   for s in samples),
                "client": statistics.median(client_t), "server": statistics.median(server_t),
                "overhead": statistics.median(over), "overhead_max": max(over),
                "end_overhead": statistics.median(end_over), "n": reps,
                "cxx_overhead": statistics.median(cxx_over) if cxx_over else float("nan")})
    return rows


def switch_lines(rows):
    lines = [f"{'history':>7} {'strategy':<17} {'path':<10} {'transl':>6} {'repref':>6} "
             f"{'xlate ms':>9} {'client ms':>9} {'server ms':>9} {'ovh p50 ms':>10} "
             f"{'ovh max':>9} {'end ovh':>9} {'n':>3} {'c++ ovh':>9}"]
    for r in rows:
        lines.append(f"{int(r['history']):>7} {r['strategy']:<17} {r['path']:<10} "
                     f"{r['translated']:>6} {r['reprefilled']:>6} {ms(r['translation_s'])} "
                     f"{ms(r['client'])} {ms(r['server'])} {ms(r['overhead']):>10} "
                     f"{ms(r['overhead_max'])} {ms(r['end_overhead'])} {r['n']:>3} "
                     f"{ms(r['cxx_overhead'])}")
    return lines


def median_of(rows, key):
    values = [r[key] for r in rows if r[key] == r[key]]  # NaN != NaN
    return statistics.median(values) if values else float("nan")


def run_sessions(client, n_sessions, turns, prefix, turn):
    """n_sessions sessions at once, each on its own thread, each sending `turns`
    turns: turn(sid, i, t) runs turn t of session i and returns its result.
    Returns (results, error code names, wall seconds)."""
    results, errors, lock = [], [], threading.Lock()

    def run(i):
        sid = client.create(f"{prefix}-{i}")
        for t in range(turns):
            try:
                r = turn(sid, i, t)
                with lock:
                    results.append(r)
            except grpc.RpcError as e:
                with lock:
                    errors.append(e.code().name)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_sessions)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results, errors, time.perf_counter() - start


def part_concurrency(client, levels, turns, max_tokens, turn_words):
    lines = [f"{'sessions':>8} {'turns':>5} {'switch':>6} {'errors':>6} {'wall s':>7} "
             f"{'client p50':>10} {'p90':>9} {'p99':>9} {'server p50':>10} {'p90':>9} "
             f"{'p99':>9} {'ovh p50':>9}"]
    for level in levels:
        results, errors, wall = run_sessions(
            client, level, turns, f"cc-{level}",
            lambda sid, i, t: client.chat(sid, f"Session {i} turn {t}: " +
                                          filler(turn_words, i * 31 + t), max_tokens, "alternate"))
        c = [r["client_ttft"] for r in results]
        s = [r["summary"].time_to_first_token_seconds for r in results]
        switches = sum(1 for r in results if r["routing"].switched)
        if not c:
            lines.append(f"{level:>8} {0:>5} {0:>6} {len(errors):>6} {wall:7.1f}  (no turn completed)")
            continue
        over = statistics.median(a - b for a, b in zip(c, s))
        lines.append(f"{level:>8} {len(results):>5} {switches:>6} {len(errors):>6} {wall:7.1f} "
                     f"{ms(percentile(c, 50)):>10} {ms(percentile(c, 90))} {ms(percentile(c, 99))} "
                     f"{ms(percentile(s, 50)):>10} {ms(percentile(s, 90))} {ms(percentile(s, 99))} "
                     f"{ms(over)}")
    return lines


def main():
    global SMALL, LARGE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="path of the kvl-server binary")
    ap.add_argument("--pair", default=f"{SMALL},{LARGE}",
                    help="SOURCE,TARGET: the switch measured (committed house models with "
                         "translators both ways)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--quick", action="store_true",
                    help="smoke sizes: history 256 and 1024, 2 reps, 1/4 sessions")
    ap.add_argument("--history", default="1000,3800",
                    help="history sizes in tokens (models have 4096 positions)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per switch cell")
    ap.add_argument("--concurrency", default="1,8,32", help="concurrent session counts")
    ap.add_argument("--turns", type=int, default=3, help="turns per concurrent session")
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens generated per measured turn")
    ap.add_argument("--turn-words", type=int, default=400,
                    help="words per history-building turn")
    ap.add_argument("--chat-words", type=int, default=40, help="words per concurrent-part turn")
    ap.add_argument("--threads", type=int, default=0, help="server runtime.threads (0: all)")
    ap.add_argument("--translate-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="translators[].compute_dtype (default: the server's default, auto)")
    ap.add_argument("--repair", choices=["off", "after-turn", "idle-only"], default="after-turn",
                    help="routing.repair (default: the server's default, after-turn)")
    ap.add_argument("--native-tail", type=int, default=32,
                    help="routing.native_tail_tokens (default: the server's default, 32)")
    ap.add_argument("--native-layers", default="",
                    help="K,K,...: also the translate strategy with RoutingHints.native_layers K")
    ap.add_argument("--small-large-translator",
                    help="the kvl-small -> kvl-large translator file (default: the committed one)")
    ap.add_argument("--cxx-client",
                    help="bench/ttft_client binary (default: bench/ttft_client of the server's "
                         "build directory, when it exists)")
    args = ap.parse_args()
    pair = args.pair.split(",")
    if len(pair) != 2 or pair[0] == pair[1]:
        sys.exit(f"--pair {args.pair}: two different model names, SOURCE,TARGET")
    SMALL, LARGE = pair
    for name in served_models():
        if not os.path.exists(os.path.join(ROOT, "models", name, "config.json")):
            sys.exit(f"--pair: models/{name} is not a model directory")
    cxx_client = args.cxx_client
    if cxx_client is None:
        guess = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.server))),
                             "bench", "ttft_client")
        cxx_client = guess if os.access(guess, os.X_OK) else None
    elif not os.access(cxx_client, os.X_OK):
        sys.exit(f"--cxx-client {cxx_client}: not an executable file")
    if args.quick:
        args.history, args.reps, args.concurrency, args.turns = "256,1024", 2, "1,4", 2
    sizes = [int(x) for x in args.history.split(",") if x]
    native_layers = [int(x) for x in args.native_layers.split(",") if x]
    levels = [int(x) for x in args.concurrency.split(",") if x]

    out = []

    def emit(line=""):
        print(line, flush=True)
        out.append(line)

    with tempfile.TemporaryDirectory(prefix="kvl-server-bench-") as tmp:
        stubs = os.path.join(tmp, "python")
        os.makedirs(stubs)
        subprocess.run(["protoc", f"--proto_path={ROOT}/proto", f"--python_out={stubs}",
                        "kvlingo/v1/chat.proto", "kvlingo/v1/session.proto",
                        "kvlingo/v1/model.proto"], check=True)
        config = write_config(tmp, args.threads, args.translate_dtype, args.native_tail, args.repair,
                              args.small_large_translator)
        proc, target, log_path = start_server(os.path.abspath(args.server), config, tmp)
        wall_start = time.perf_counter()
        try:
            client = Client(target, stubs)
            client.wait_serving()
            share = MachineShare(proc.pid)
            emit("kvlingo server benchmark (bench/server_bench.py)")
            emit(f"command: /usr/bin/python3 bench/server_bench.py {' '.join(sys.argv[1:])}")
            emit(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host: {platform.node()}  "
                 f"python {platform.python_version()}  grpcio {grpc.__version__}")
            emit(f"server: {args.server}  runtime.threads={args.threads}  dtype float32  "
                 f"models {', '.join(served_models())}  translators compute_dtype "
                 f"{args.translate_dtype}  routing.native_tail_tokens {args.native_tail}  "
                 f"routing.repair {args.repair}")
            emit(f"load at start: {load_line()}")
            emit()
            emit(f"== 1. TTFT of the first turn after a switch {SMALL} -> {LARGE} "
                 f"(explicit policy, max_tokens {args.max_tokens}, greedy) ==")
            emit("client = send -> first TokenDelta in this Python client; server = "
                 "TurnSummary.time_to_first_token_seconds;")
            emit("ovh = client - server (gRPC + HTTP/2 + protobuf + Python), median per cell; "
                 "times are medians over n fresh sessions.")
            emit("end ovh = the same difference for the TurnSummary against "
                 "TimingBreakdown.total_seconds (median).")
            emit("reprefill-missing equals reprefill here: the target holds no earlier cache line.")
            if cxx_client:
                emit(f"c++ ovh = the same difference with bench/ttft_client ({cxx_client}), a C++ "
                     "grpc++ client, on n further fresh sessions (median).")
            else:
                emit("c++ ovh: nan, no C++ client (build the ttft_client target or pass "
                     "--cxx-client).")
            rows = part_switch(client, sizes, args.reps, args.max_tokens, args.turn_words,
                               first_switch, "sw", cxx_client, target, native_layers)
            for line in switch_lines(rows):
                emit(line)
            emit()
            emit(f"== 1b. TTFT of a second switch to {LARGE}: the history above, a first "
                 f"(translated) switch to {LARGE}, one more {SMALL} turn of ~256 tokens, "
                 "then the measured turn ==")
            emit(f"{LARGE} lacks only the last span: translate translates it, reprefill-missing "
                 "prefills it, reprefill prefills the whole history.")
            rows_b = part_switch(client, sizes, args.reps, args.max_tokens, args.turn_words,
                                 second_switch, "sw2", cxx_client, target, native_layers)
            for line in switch_lines(rows_b):
                emit(line)
            overhead = median_of(rows + rows_b, "overhead")
            cxx_overhead = median_of(rows + rows_b, "cxx_overhead")
            emit(f"for scale: an empty unary gRPC call (health Check) takes "
                 f"{client.unary_floor() * 1e3:.3f} ms round trip, a Chat stream rejected with "
                 f"NOT_FOUND {client.stream_floor() * 1e3:.3f} ms (medians of 50)")
            if cxx_client:
                busy, idle = (cxx_floor(cxx_client, target, 50, gap) for gap in (0, 20))
                emit(f"in the C++ client, a unary GetSession of an unknown session and a rejected "
                     f"Chat stream: {busy['unary_seconds'] * 1e3:.3f} ms and "
                     f"{busy['rejected_stream_seconds'] * 1e3:.3f} ms back to back; "
                     f"{idle['unary_seconds'] * 1e3:.3f} ms and "
                     f"{idle['rejected_stream_seconds'] * 1e3:.3f} ms when each call follows "
                     f"20 ms of idleness, as a turn's request and first token do")
            emit(f"median gRPC overhead over all cells of 1 and 1b, Python client: "
                 f"{overhead * 1e3:.4f} ms "
                 f"(target < 1 ms): {'met' if overhead < 1e-3 else 'NOT met'}")
            if cxx_client:
                emit(f"median gRPC overhead over all cells of 1 and 1b, C++ client: "
                     f"{cxx_overhead * 1e3:.4f} ms (target < 1 ms): "
                     f"{'met' if cxx_overhead < 1e-3 else 'NOT met'}")
            emit(f"load after part 1: {load_line()}")
            emit(share.line("parts 1 and 1b"))
            if levels:  # --concurrency "" skips part 2
                emit()
                emit(f"== 2. TTFT percentiles, concurrent sessions (policy alternate "
                     f"{SMALL} <-> {LARGE}, {args.turns} turns of ~{args.chat_words} words, "
                     f"max_tokens {args.max_tokens}) ==")
                emit("every turn after a session's first is a translated switch; percentiles "
                     "are nearest-rank over all turns; times in ms.")
                for line in part_concurrency(client, levels, args.turns, args.max_tokens,
                                             args.chat_words):
                    emit(line)
                emit()
                emit(f"load at end: {load_line()}")
                emit(share.line("part 2"))
            emit(f"total wall time: {time.perf_counter() - wall_start:.1f} s")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
