"""Soak test of kvl-server (issue 36, item 6): one server, --sessions sessions,
each on its own worker thread, doing a random mix of actions for --seconds:

  turn      a normal chat turn: a few random words (sometimes non-ASCII), greedy,
            max_tokens 4-24, on a random model of kvl-small, kvl-small-b and
            kvl-large (policy "explicit"; 1 in 5 turns policy "alternate"; 1 in 10
            strategy reprefill or reprefill-missing, else the server's default,
            translate), so that translated switches happen;
  cancel    a turn cancelled after its first TokenDelta or after 0-300 ms;
  deadline  a turn with a 1-20 ms deadline;
  bad       a bad request: empty user_message, invalid UTF-8, max_tokens over the
            server's limit, an unknown routing.model, an unknown session id;
  delete    GetTranscript (checked as below), DeleteSession, then a turn and a
            GetTranscript on the deleted id (both NOT_FOUND), then a fresh
            session; a session whose history reaches --max-history tokens is
            rotated the same way, so no session nears the models' 4096 positions;
  inspect   GetSession.
  openai    a request to the OpenAI API (server.http_address), stateless: the
            worker's own conversation, whole, on a random model, streamed or
            not; 1 in 5 streams is closed after its first event (the turn is
            cancelled and the conversation stays as it was). The conversation
            restarts after 6 turns.
Workers think 0..--think-ms between actions. The cache budget
(sessions.memory_budget_bytes = --budget-mib) is small, so idle sessions' cache
lines are evicted and later turns on them re-prefill.

Expected statuses (anything else is an "unexpected error" and fails the run):
  turn: OK; cancel: OK or CANCELLED; deadline: OK or DEADLINE_EXCEEDED;
  bad: INVALID_ARGUMENT naming the field (user_message, sampling.max_tokens),
       NOT_FOUND naming routing.model or the session (proto/kvlingo/v1/chat.proto);
  a turn on a deleted id, GetTranscript of it: NOT_FOUND; other session calls: OK;
  openai: HTTP 200 with a well-formed response (a stream: "data:" events, the
       role first, a finish_reason, "[DONE]" last), reusing every turn of the
       conversation from the prefix cache unless its last request was closed
       early; 429 only for the memory budget, as a turn.
  Any turn may also get
    ABORTED "already running a turn", but only while the session's last
      cancelled or timed-out turn may still run in the server (a turn stops at
      its next token; until then the session is busy): from that interruption to
      the session's next turn that reached the model;
    RESOURCE_EXHAUSTED "KV cache memory budget exhausted": the documented answer
      when the turns running at that moment pin more cache than the budget (a
      busy session's lines cannot be evicted; the turn pool has 4 threads per
      model + batching.max_running 4 = 16, so up to 16 sessions are pinned at
      once). Not an error under this load, so counted and reported (1 of 524
      turns with 16 sessions, none with 64, in the development runs); the end checks
      (a final turn alone per session, cache bytes at rest) catch a leak of
      budget.
  Admission limits (limits.*) are set far above this load: their
  RESOURCE_EXHAUSTED is unexpected.

Assertions at the end (exit 1 naming each failure, 0 when all hold):
  1. no unexpected status, no broken stream (RoutingDecision first, TurnSummary
     last, OK only with a summary);
  2. no lost turn: once the workers have stopped, every live session gets one
     more turn alone (it must succeed: nothing else holds the budget, most of
     its lines are evicted), and its GetTranscript lists every turn whose
     TurnSummary the client received, in order, with the streamed reply text,
     user message and model; a cancelled or timed-out turn may be listed or
     not, nothing else may. The same check runs before every DeleteSession.
     ListSessions lists exactly the live sessions;
  3. cache lines were evicted (kvlingo_cache_evicted_lines_total > 0) and
     turns ran on evicted lines; at the end kvlingo_cache_bytes <= budget;
  4. RSS (VmRSS of /proc/PID/status, every second, through the whole run) stays
     below RSS after start-up (models loaded, before any turn) + budget +
     --rss-slack-mib (default 192). The slack covers what is not KV cache:
     LibTorch activations and allocator caches of the first turns on each model,
     malloc arenas of the 16 turn-pool threads and the repair thread, gRPC buffers,
     the transcripts the session store keeps, and lines over the budget for a
     moment (a line grows by copying, and a turn is measured after it ends).
     Measured on the 2-core development machine (with two fuzzers on its
     cores), the largest RSS - start-up RSS - cache bytes (sampled every 5 s) was
     22 MiB (16 sessions, 60 s), 52 MiB (64 sessions, 90 s) and 70 MiB (64
     sessions, 150 s; RSS then stayed flat at 755 MiB, start-up 678, over the
     last 90 s); the slack is 2.7x the largest;
  5. no thread or fd growth: the maximum of /proc/PID/status Threads and of the
     count of /proc/PID/fd over the last third of the load phase is at most the
     maximum over its first third after a warm-up (min(15 s, 1/6 of the run)),
     + --thread-slack (default 4) and + --fd-slack (default 8);
  6. grpc.health.v1 reports SERVING at the end, and the server then exits 0 on
     SIGTERM within 60 s.

Outputs: PREFIX.txt (the summary, also printed), PREFIX.tsv (time_s, rss_mib,
threads, fds, cache_mib), PREFIX.png (gnuplot: RSS, cache bytes and the bound;
threads and fds). The run ends by letting in-flight calls finish (each bounded
by its deadline, --turn-timeout for turns).

Uses Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf), protoc and
gnuplot; the server's helpers come from bench/server_bench.py.

usage: /usr/bin/python3 scripts/ci/soak.py --server BUILD/server/kvl-server
           [--sessions 64] [--seconds 1800] [--budget-mib 32] [--out PREFIX] [--seed 1]
short (ctest): --sessions 16 --seconds 60 --out TMPDIR/soak
"""
import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import http.client

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "bench"))
import server_bench as sb  # noqa: E402  (config, server start-up, client, words)

MODELS = (sb.SMALL, sb.SMALL_B, sb.LARGE)
MAX_TOKENS_LIMIT = 256        # server.max_new_tokens_limit in the soak's config
ACTIONS = (("turn", 44), ("cancel", 12), ("deadline", 12), ("bad", 12), ("delete", 5),
           ("inspect", 5), ("openai", 10))
# Valid UTF-8 beyond ASCII, so that replies and transcripts see multi-byte text.
EXTRA_WORDS = ("café", "naïve", "Grüße", "日本語", "emoji 🙂", "Ωμέγα")
OK = "OK"


class Attempt:
    """One Chat call with a well-formed request on a live session."""
    __slots__ = ("rid", "message", "action", "code", "details", "acked", "reply", "model",
                 "routing", "summary")

    def __init__(self, rid, message, action):
        self.rid, self.message, self.action = rid, message, action
        self.code = self.details = None
        self.acked, self.reply, self.model, self.routing, self.summary = False, "", "", None, None


class SessionState:
    def __init__(self, sid):
        self.sid = sid
        self.attempts = []
        self.unsettled = False   # an interrupted turn of it may still run in the server
        self.history = 0


class Soak:
    def __init__(self, args, client, proc, metrics_addr, budget, http_addr=None):
        self.args, self.client, self.proc = args, client, proc
        self.http_addr = http_addr
        self.conversations = {}                  # worker -> OpenAI conversation
        self.metrics_addr, self.budget = metrics_addr, budget
        self.pb, self.spb = client.pb, client.spb
        self.lock = threading.Lock()
        self.counts = collections.defaultdict(collections.Counter)  # action -> code -> n
        self.unexpected = []
        self.switches = collections.Counter()    # "from->to path"
        self.paths = collections.Counter()
        self.evicted_turns = 0                   # OK turns that re-prefilled their own line
        self.budget_full = []                    # details of budget RESOURCE_EXHAUSTED turns
        self.stop = threading.Event()
        self.fatal = None
        self.live = {}                           # worker -> SessionState
        self.deleted = 0
        self.lost = []                           # transcript problems
        self.next_turn = {}                      # worker -> its last turn number
        self.peak_cache = 0.0
        self.sampler_stop = threading.Event()
        self.t0 = self.end = time.monotonic()
        ch = client.channel
        unary = lambda m, req, resp: ch.unary_unary(  # noqa: E731
            f"/kvlingo.v1.SessionService/{m}", request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString)
        s = self.spb
        self._get = unary("GetSession", s.GetSessionRequest, s.Session)
        self._delete = unary("DeleteSession", s.DeleteSessionRequest, s.DeleteSessionResponse)
        self._list = unary("ListSessions", s.ListSessionsRequest, s.ListSessionsResponse)
        self._transcript = unary("GetTranscript", s.GetTranscriptRequest, s.Transcript)

    # -- bookkeeping -------------------------------------------------------
    def count(self, action, code):
        with self.lock:
            self.counts[action][code] += 1

    def bad_status(self, worker, sid, action, code, details, why=""):
        with self.lock:
            self.unexpected.append((time.monotonic() - self.t0, worker, sid, action, code,
                                    (details or "")[:300], why))
        print(f"UNEXPECTED: worker {worker} session {sid} {action}: {code} {details!r} {why}",
              file=sys.stderr, flush=True)

    def unary_call(self, fn, req, worker, sid, action, expect=(OK,)):
        try:
            resp, code, details = fn(req, timeout=60), OK, ""
        except grpc.RpcError as e:
            resp, code, details = None, e.code().name, e.details()
        self.count(action, code)
        if code not in expect:
            self.bad_status(worker, sid, action, code, details, f"expected {'/'.join(expect)}")
        return resp

    # -- chat --------------------------------------------------------------
    def chat(self, req, timeout, cancel_after_delta=False, cancel_delay=None):
        """Runs one Chat call; returns (code, details, events) where events holds
        the routing decision, the concatenated delta text, the summary and any
        protocol violation."""
        ev = {"routing": None, "reply": [], "summary": None, "order": ""}
        call = self.client._chat(req, timeout=timeout, metadata=[("x-kvl-session-id",
                                                                  req.session_id)])
        timer = None
        if cancel_delay is not None:
            timer = threading.Timer(cancel_delay, call.cancel)
            timer.start()
        code, details = OK, ""
        try:
            for r in call:
                kind = r.WhichOneof("event")
                ev["order"] += {"routing": "R", "delta": "D", "summary": "S"}.get(kind, "?")
                if kind == "routing":
                    ev["routing"] = r.routing
                elif kind == "delta":
                    ev["reply"].append(r.delta.text)
                    if cancel_after_delta:
                        call.cancel()
                elif kind == "summary":
                    ev["summary"] = r.summary
        except grpc.RpcError as e:
            code, details = e.code().name, e.details() or ""
        finally:
            if timer is not None:
                timer.cancel()
        ev["reply"] = "".join(ev["reply"])
        order = ev["order"]
        if order and not re.fullmatch(r"RD*S?", order):
            ev["broken"] = f"events out of order: {order}"
        elif code == OK and not order.endswith("S"):
            ev["broken"] = f"status OK without a TurnSummary (events {order or 'none'})"
        return code, details, ev

    def turn_request(self, rng, sess, rid, message, policy=None, model=None, max_tokens=None):
        if policy is None:
            policy = "alternate" if rng.random() < 0.2 else "explicit"
        if model is None and policy == "explicit":
            model = rng.choice(MODELS)
        strategy = rng.choice((2, 3)) if rng.random() < 0.1 else 0
        return self.pb.ChatRequest(
            session_id=sess.sid, user_message=message.encode(), request_id=rid,
            sampling=self.pb.SamplingParams(max_tokens=max_tokens or rng.randint(4, 24)),
            routing=self.pb.RoutingHints(policy=policy, model=model or "", strategy=strategy))

    def message(self, rng):
        words = [rng.choice(sb.WORDS) for _ in range(rng.randint(2, 8))]
        if rng.random() < 0.15:
            words.insert(rng.randrange(len(words) + 1), rng.choice(EXTRA_WORDS))
        return " ".join(words).capitalize() + rng.choice(("?", ".", "!"))

    def attempt(self, worker, rng, sess, action, n, final=False):
        rid = f"w{worker}-{sess.sid}-{n}"
        msg = self.message(rng)
        req = self.turn_request(rng, sess, rid, msg)
        a = Attempt(rid, msg, action)
        kwargs = {"timeout": self.args.turn_timeout}
        if action == "cancel":
            if rng.random() < 0.5:
                kwargs["cancel_after_delta"] = True
            else:
                kwargs["cancel_delay"] = rng.uniform(0, 0.3)
        elif action == "deadline":
            kwargs["timeout"] = rng.uniform(0.001, 0.020)
        code, details, ev = self.chat(req, **kwargs)
        a.code, a.details, a.reply = code, details, ev["reply"]
        a.routing, a.summary = ev["routing"], ev["summary"]
        a.acked = ev["summary"] is not None
        a.model = ev["routing"].model if ev["routing"] is not None else ""
        sess.attempts.append(a)
        self.count("final-turn" if final else action, code)

        expect = {"turn": {OK}, "cancel": {OK, "CANCELLED"},
                  "deadline": {OK, "DEADLINE_EXCEEDED"}}[action]
        reached_model = code == OK or a.acked or (
            code == "RESOURCE_EXHAUSTED" and "memory budget" in details)
        extra_ok = ((code == "ABORTED" and sess.unsettled and "already running a turn" in details)
                    or (code == "RESOURCE_EXHAUSTED" and "memory budget" in details
                        and not final))
        if "broken" in ev:
            self.bad_status(worker, sess.sid, action, code, details, ev["broken"])
        elif code not in expect and not extra_ok:
            why = f"expected {'/'.join(sorted(expect))}"
            if code == "ABORTED" and not sess.unsettled:
                why += " (ABORTED though no earlier turn of the session was interrupted)"
            self.bad_status(worker, sess.sid, action, code, details, why)
        if code == "RESOURCE_EXHAUSTED" and "memory budget" in details:
            with self.lock:
                self.budget_full.append(details)
        if reached_model:
            sess.unsettled = False
        if code in ("CANCELLED", "DEADLINE_EXCEEDED") and not a.acked:
            sess.unsettled = True
        if a.acked:
            sess.history = a.summary.history_tokens
            r = a.routing
            with self.lock:
                path = self.pb.CachePath.Name(r.path).replace("CACHE_PATH_", "").lower()
                self.paths[path] += 1
                if r.switched:
                    self.switches[f"{r.previous_model}->{r.model} {path}"] += 1
                elif r.path == self.pb.CACHE_PATH_REPREFILL and r.previous_model:
                    self.evicted_turns += 1
        return a

    def bad_input(self, worker, rng, sess):
        """One malformed request; returns nothing, checks the code and the field named."""
        kind = rng.choice(("empty", "utf8", "max_tokens", "model", "session"))
        sid, msg, max_tokens, model = sess.sid, b"Hello there.", 8, sb.SMALL
        expect, field = "INVALID_ARGUMENT", None
        if kind == "empty":
            msg, field = b"", "user_message"
        elif kind == "utf8":
            msg, field = rng.choice((b"caf\xe9 latte", b"\xff\xfe", b"ok \xc3",
                                         b"\xed\xa0\x80", b"\xc0\xaf")), \
                "user_message"
        elif kind == "max_tokens":
            max_tokens, field = rng.choice((MAX_TOKENS_LIMIT + 1, 100000, 2 ** 32 - 1)), \
                "sampling.max_tokens"
        elif kind == "model":
            model, expect, field = f"no-such-model-{rng.randrange(1000)}", "NOT_FOUND", \
                "routing.model"
        else:
            sid, expect = f"soak-unknown-{worker}-{rng.randrange(10 ** 9)}", "NOT_FOUND"
            field = sid
        req = self.pb.ChatRequest(session_id=sid, user_message=msg,
                                  sampling=self.pb.SamplingParams(max_tokens=max_tokens),
                                  routing=self.pb.RoutingHints(policy="explicit", model=model))
        code, details, ev = self.chat(req, timeout=60)
        self.count(f"bad:{kind}", code)
        if code != expect or field not in details or ev["order"]:
            self.bad_status(worker, sid, f"bad:{kind}", code, details,
                            f"expected {expect} naming {field!r}, no events")

    # -- the OpenAI API ----------------------------------------------------
    def openai(self, worker, rng):
        """One stateless request on the worker's conversation; checks the
        response's shape and that the prefix cache found the conversation."""
        conv = self.conversations.get(worker)
        if conv is None or len(conv["messages"]) > 12:
            conv = {"messages": [{"role": "system",
                                  "content": f"Worker {worker}, conversation "
                                             f"{rng.randrange(10 ** 9)}."}],
                    "known": True}
            self.conversations[worker] = conv
        messages = conv["messages"] + [{"role": "user", "content": self.message(rng)}]
        model = rng.choice(MODELS)
        stream = rng.random() < 0.5
        close_early = stream and rng.random() < 0.2
        body = {"model": model, "messages": messages, "temperature": 0,
                "max_tokens": rng.randint(4, 24), "stream": stream}
        host, port = self.http_addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=self.args.turn_timeout)
        action = "openai:" + ("closed" if close_early else "stream" if stream else "plain")
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read().decode(errors="replace")
                self.count(action, f"HTTP {resp.status}")
                if not (resp.status == 429 and "memory budget" in text):
                    self.bad_status(worker, "-", action, f"HTTP {resp.status}", text, "expected 200")
                return
            if close_early:
                resp.readline()
                self.count(action, "HTTP 200")
                conv["known"] = False  # its turn may still be unwinding
                return
            if stream:
                events = []
                for line in resp.read().decode().split("\n\n"):
                    if line.startswith("data: "):
                        events.append(line[6:])
                    elif line and not line.startswith(":"):
                        raise ValueError(f"not an SSE event: {line[:100]!r}")
                if not events or events[-1] != "[DONE]":
                    raise ValueError(f"the stream does not end with [DONE]: {events[-1:]}")
                chunks = [json.loads(e) for e in events[:-1]]
                if any("error" in c for c in chunks):
                    raise ValueError(f"an error event: {chunks}")
                if chunks[0]["choices"][0]["delta"].get("role") != "assistant":
                    raise ValueError("the first chunk does not carry the role")
                finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
                if len(finish) != 1:
                    raise ValueError(f"{len(finish)} chunks with a finish_reason")
                reply = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
                kvlingo, served = finish[0]["kvlingo"], finish[0]["model"]
            else:
                out = json.loads(resp.read())
                reply = out["choices"][0]["message"]["content"]
                kvlingo, served = out["kvlingo"], out["model"]
            self.count(action, "HTTP 200")
            want = (len(messages) - 2) // 2
            if served != model:
                self.bad_status(worker, "-", action, "HTTP 200", served, f"served by {served}, "
                                f"asked for {model}")
            elif conv["known"] and kvlingo["reused_turns"] != want:
                self.bad_status(worker, kvlingo["conversation_id"], action, "HTTP 200",
                                json.dumps(kvlingo), f"reused {kvlingo['reused_turns']} turns "
                                f"of {want}: the prefix cache lost the conversation")
            conv["messages"] = messages + [{"role": "assistant", "content": reply}]
            conv["known"] = True
        except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
            self.count(action, "broken")
            self.bad_status(worker, "-", action, "broken", repr(e), "malformed response")
        finally:
            conn.close()

    # -- transcripts -------------------------------------------------------
    def verify(self, worker, sess, when):
        """Checks sess's transcript against what the client saw; returns problems."""
        try:
            tr = self._transcript(self.spb.GetTranscriptRequest(session_id=sess.sid), timeout=60)
        except grpc.RpcError as e:
            self.count("transcript", e.code().name)
            return [f"{sess.sid} ({when}): GetTranscript failed: {e.code().name} {e.details()}"]
        self.count("transcript", OK)
        index = {a.rid: i for i, a in enumerate(sess.attempts)}
        problems, seen, last = [], set(), -1
        for k, t in enumerate(tr.turns):
            i = index.get(t.request_id)
            if i is None:
                problems.append(f"transcript turn {k} has request_id {t.request_id!r}, which "
                                f"this client never sent on the session")
                continue
            a = sess.attempts[i]
            if i <= last:
                problems.append(f"transcript turn {k} ({a.rid}) out of order or repeated")
            last = max(last, i)
            seen.add(i)
            if a.acked:
                for what, got, want in (("reply", t.reply, a.reply),
                                        ("user_message", t.user_message, a.message),
                                        ("model", t.model, a.model)):
                    if got != want:
                        problems.append(f"turn {a.rid}: transcript {what} {got!r} != streamed "
                                        f"{want!r}")
            elif a.code not in ("CANCELLED", "DEADLINE_EXCEEDED"):
                problems.append(f"turn {a.rid} failed with {a.code} ({a.details!r}) but the "
                                f"transcript lists it")
        for i, a in enumerate(sess.attempts):
            if a.acked and i not in seen:
                problems.append(f"LOST TURN {a.rid} ({a.action}, status {a.code}): its "
                                f"TurnSummary was received, the transcript lacks it")
        return [f"{sess.sid} ({when}): {p}" for p in problems]

    # -- workers -----------------------------------------------------------
    def new_session(self, worker, generation):
        sid = f"soak-{worker}-{generation}"
        self.unary_call(self.client._create, self.spb.CreateSessionRequest(session_id=sid),
                        worker, sid, "create")
        return SessionState(sid)

    def delete(self, worker, sess, why):
        for p in self.verify(worker, sess, f"before {why}"):
            self.lost.append(p)
        self.unary_call(self._delete, self.spb.DeleteSessionRequest(session_id=sess.sid),
                        worker, sess.sid, why)
        # The deleted id is gone for Chat and GetTranscript.
        req = self.pb.ChatRequest(session_id=sess.sid, user_message=b"Are you still there?",
                                  sampling=self.pb.SamplingParams(max_tokens=4),
                                  routing=self.pb.RoutingHints(policy="explicit", model=sb.SMALL))
        code, details, _ = self.chat(req, timeout=60)
        self.count("turn-on-deleted", code)
        if code != "NOT_FOUND":
            self.bad_status(worker, sess.sid, "turn-on-deleted", code, details,
                            "expected NOT_FOUND")
        self.unary_call(self._transcript, self.spb.GetTranscriptRequest(session_id=sess.sid),
                        worker, sess.sid, "transcript-of-deleted", expect=("NOT_FOUND",))
        with self.lock:
            self.deleted += 1

    def worker(self, w):
        rng = random.Random(self.args.seed * 1000003 + w)
        generation, n = 0, 0
        sess = self.new_session(w, generation)
        self.live[w] = sess
        names, weights = zip(*ACTIONS)
        while not self.stop.is_set() and time.monotonic() < self.end:
            try:
                if sess.history >= self.args.max_history:
                    action = "rotate"
                else:
                    action = rng.choices(names, weights)[0]
                if action in ("delete", "rotate"):
                    self.delete(w, sess, action)
                    generation += 1
                    sess = self.new_session(w, generation)
                    self.live[w] = sess
                elif action == "bad":
                    self.bad_input(w, rng, sess)
                elif action == "openai":
                    self.openai(w, rng)
                elif action == "inspect":
                    self.unary_call(self._get, self.spb.GetSessionRequest(session_id=sess.sid),
                                    w, sess.sid, "inspect")
                else:
                    n += 1
                    a = self.attempt(w, rng, sess, action, n)
                    if a.code == "ABORTED":
                        time.sleep(rng.uniform(0.1, 0.5))
            except Exception as e:  # a bug here must not pass as a clean run
                self.bad_status(w, sess.sid, "worker", "EXCEPTION", repr(e), "client exception")
                time.sleep(1)
            time.sleep(rng.uniform(0, self.args.think_ms / 1e3))
        self.next_turn[w] = n

    # -- metrics -------------------------------------------------------------
    def metrics(self):
        """Sums of the series of each kvlingo_ metric family of interest."""
        text = urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=10).read()
        out = collections.Counter()
        for line in text.decode().splitlines():
            m = re.match(r"(kvlingo_[a-z_]+)(\{[^}]*\})? ([-+0-9.eE]+|NaN)$", line)
            if m and m.group(3) != "NaN":
                name, labels = m.group(1), m.group(2) or ""
                out[name] += float(m.group(3))
                if name == "kvlingo_grpc_requests_total" and "ChatService/Chat" in labels:
                    code = re.search(r'code="([A-Z_]+)"', labels)
                    if code:
                        out[f"chat:{code.group(1)}"] += float(m.group(3))
        return out


def proc_sample(pid):
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    return rss, threads, len(os.listdir(f"/proc/{pid}/fd"))


def sampler(soak, pid, samples, t0):
    """Every second: RSS, threads, fds; every 5 s the cache bytes from /metrics."""
    cache, tick = 0.0, 0
    while not soak.sampler_stop.is_set():
        if soak.proc.poll() is not None:
            soak.fatal = f"kvl-server exited with {soak.proc.returncode} during the run"
            soak.stop.set()
            return
        try:
            if tick % 5 == 0:
                m = soak.metrics()
                cache = m["kvlingo_cache_bytes"] / 2 ** 20
                soak.peak_cache = max(soak.peak_cache, m["kvlingo_cache_bytes"])
        except (OSError, ValueError):
            pass
        try:
            rss, threads, fds = proc_sample(pid)
            samples.append((time.monotonic() - t0, rss, threads, fds, cache))
        except (OSError, AttributeError):
            pass
        tick += 1
        soak.sampler_stop.wait(1.0)


def window_max(samples, col, lo, hi):
    vals = [s[col] for s in samples if lo <= s[0] <= hi]
    return max(vals) if vals else None


def plot(prefix, bound, rss_start):
    tsv = os.path.abspath(prefix + ".tsv")
    with open(tsv) as f:
        rows = [line.split("\t") for line in f.read().splitlines()[1:]]
    top = {col: 1.3 * max([float(r[col]) for r in rows] or [1]) for col in (2, 3)}
    script = f"""set terminal pngcairo size 1000,700 font ",10" noenhanced
set output "{os.path.abspath(prefix + '.png')}"
set multiplot layout 2,1 title "kvl-server soak (scripts/ci/soak.py)"
set grid
set key bottom right opaque
set offsets graph 0, 0, 0.15, 0
set xlabel "seconds since the server was listening"
set ylabel "MiB"
set yrange [0:*]
plot "{tsv}" using 1:2 with lines lw 2 title "RSS", \\
     "{tsv}" using 1:($5+{rss_start}) with lines lw 1 \\
         title "RSS at start-up + KV cache bytes (/metrics)", \\
     {bound} with lines dt 2 lw 2 title "bound {bound:.0f} MiB"
set ylabel "threads"
set y2label "open fds"
set ytics nomirror
set y2tics
set yrange [0:{top[2]:.0f}]
set y2range [0:{top[3]:.0f}]
plot "{tsv}" using 1:3 with lines lw 2 title "threads", \\
     "{tsv}" using 1:4 axes x1y2 with lines lw 2 title "fds"
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="path of the kvl-server binary")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--budget-mib", type=int, default=32, help="sessions.memory_budget_bytes")
    ap.add_argument("--out", help="output prefix: PREFIX.txt, .tsv, .png")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-history", type=int, default=384,
                    help="rotate a session (delete, create) once its history has this many tokens")
    ap.add_argument("--think-ms", type=float, default=1000, help="pause 0..this between actions")
    ap.add_argument("--turn-timeout", type=float, default=120, help="deadline of a normal turn (s)")
    ap.add_argument("--rss-slack-mib", type=float, default=192)
    ap.add_argument("--thread-slack", type=int, default=4)
    ap.add_argument("--fd-slack", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="server runtime.threads")
    args = ap.parse_args()
    budget = args.budget_mib << 20

    lines = []

    def emit(line=""):
        print(line, flush=True)
        lines.append(line)

    failures = []
    with tempfile.TemporaryDirectory(prefix="kvl-soak-") as tmp:
        stubs = os.path.join(tmp, "python")
        os.makedirs(stubs)
        subprocess.run(["protoc", f"--proto_path={sb.ROOT}/proto", f"--python_out={stubs}"] +
                       [f"kvlingo/v1/{p}.proto" for p in ("chat", "session", "model")],
                       check=True)
        config_path = sb.write_config(tmp, args.threads, "auto", 32, "after-turn")
        with open(config_path) as f:
            config = json.load(f)
        config["server"].update(max_new_tokens_limit=MAX_TOKENS_LIMIT, drain_timeout_seconds=10,
                                http_address="127.0.0.1:0")
        config["routing"]["models"] = list(MODELS)
        config["sessions"]["memory_budget_bytes"] = budget
        config["batching"] = {"enabled": True, "max_running": 4}
        config["limits"] = {"max_concurrent_streams": 4096, "max_waiting_turns_per_model": 4096,
                            "max_sessions": 100000}
        with open(config_path, "w") as f:
            json.dump(config, f, indent=1)
        launched = time.monotonic()
        proc, target, log_path = sb.start_server(os.path.abspath(args.server), config_path, tmp)
        t0 = time.monotonic()
        try:
            with open(log_path) as f:
                started = f.read()
            metrics_addr = re.search(r"metrics on (\S+)", started).group(1).rstrip(",")
            http_addr = re.search(r"OpenAI API on (\S+)", started).group(1)
            client = sb.Client(target, stubs)
            client.wait_serving()
            soak = Soak(args, client, proc, metrics_addr, budget, http_addr)
            soak.t0 = t0
            rss_start, threads_start, fds_start = proc_sample(proc.pid)
            samples = []
            sampling = threading.Thread(target=sampler, args=(soak, proc.pid, samples, t0),
                                        daemon=True)
            sampling.start()
            emit("kvlingo soak test (scripts/ci/soak.py)")
            emit(f"command: /usr/bin/python3 scripts/ci/soak.py {' '.join(sys.argv[1:])}")
            emit(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  {sb.load_line()}")
            emit(f"server: {args.server} pid {proc.pid}; models {', '.join(MODELS)}; budget "
                 f"{args.budget_mib} MiB; runtime.threads {args.threads}; batching.max_running 4; "
                 f"max_new_tokens_limit {MAX_TOKENS_LIMIT}")
            emit(f"load: {args.sessions} sessions for {args.seconds:.0f} s, seed {args.seed}, "
                 f"think 0-{args.think_ms:.0f} ms, rotate at {args.max_history} history tokens, "
                 f"turn deadline {args.turn_timeout:.0f} s")
            emit(f"after start-up: RSS {rss_start:.1f} MiB, {threads_start} threads, "
                 f"{fds_start} fds (listening {t0 - launched:.1f} s after launch, SERVING "
                 f"{time.monotonic() - t0:.1f} s later)")

            load0 = time.monotonic()
            soak.end = load0 + args.seconds
            workers = [threading.Thread(target=soak.worker, args=(w,), daemon=True)
                       for w in range(args.sessions)]
            for th in workers:
                th.start()
            join_by = soak.end + args.turn_timeout + 90
            for th in workers:
                th.join(timeout=max(1, join_by - time.monotonic()))
            stuck = sum(th.is_alive() for th in workers)
            load_end = time.monotonic()
            if stuck:
                failures.append(f"{stuck} workers still busy {load_end - soak.end:.0f} s after "
                                "the end of the load phase")
            if soak.fatal:
                failures.append(soak.fatal)
            print(f"load phase done after {load_end - load0:.1f} s; final checks",
                  file=sys.stderr, flush=True)

            # End checks: one more turn alone per live session, then its transcript.
            evicted_before, final_ok = 0, 0
            rng = random.Random(args.seed)
            if not soak.fatal:
                for w, sess in sorted(soak.live.items()):
                    s = soak.unary_call(soak._get, soak.spb.GetSessionRequest(session_id=sess.sid),
                                        w, sess.sid, "inspect")
                    lines_evicted = s is not None and any(c.evicted for c in s.cache_lines)
                    give_up = time.monotonic() + 60
                    while True:
                        a = soak.attempt(w, rng, sess, "turn", soak.next_turn.get(w, 0) + 1,
                                         final=True)
                        soak.next_turn[w] = soak.next_turn.get(w, 0) + 1
                        if a.code != "ABORTED" or time.monotonic() > give_up:
                            break
                        time.sleep(0.5)
                    if a.code == OK:
                        final_ok += 1
                        evicted_before += lines_evicted
                    soak.lost.extend(soak.verify(w, sess, "at the end"))
                listed, token = set(), ""
                while True:
                    page = soak._list(soak.spb.ListSessionsRequest(page_size=1000,
                                                                   page_token=token), timeout=60)
                    # The OpenAI API's conversations ("oai-...") are sessions too.
                    listed.update(x.session_id for x in page.sessions
                                  if not x.session_id.startswith("oai-"))
                    token = page.next_page_token
                    if not token:
                        break
                alive = {s.sid for s in soak.live.values()}
                if listed != alive:
                    failures.append(f"ListSessions lists {len(listed)} sessions, the client holds "
                                    f"{len(alive)}: extra {sorted(listed - alive)[:5]}, missing "
                                    f"{sorted(alive - listed)[:5]}")
            m_end = soak.metrics() if proc.poll() is None else collections.Counter()
            healthy = False
            try:
                healthy = client._health(b"", timeout=10) == b"\x08\x01"
            except grpc.RpcError:
                pass
            soak.sampler_stop.set()
            sampling.join()
            wall = time.monotonic() - t0
        finally:
            exit_code = None
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    exit_code = proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            else:
                exit_code = proc.returncode
        with open(log_path) as f:
            log_tail = f.read()[-3000:]

    # -- the verdict -------------------------------------------------------------
    load_s = load_end - load0
    total = sum(sum(c.values()) for c in soak.counts.values())
    emit(f"load phase {load_s:.1f} s, whole run {wall:.1f} s; {total} calls; sessions deleted "
         f"or rotated {soak.deleted}; final turns OK {final_ok} of {len(soak.live)}")
    emit("")
    emit("calls by action and status:")
    for action in sorted(soak.counts):
        c = soak.counts[action]
        emit(f"  {action:<22} {sum(c.values()):>6}  " +
             ", ".join(f"{k} {v}" for k, v in c.most_common()))
    by_code = collections.Counter()
    for c in soak.counts.values():
        by_code.update(c)
    emit("all calls by status: " + ", ".join(f"{k} {v}" for k, v in by_code.most_common()))
    emit("server's Chat statuses (kvlingo_grpc_requests_total): " + ", ".join(
        f"{k[5:]} {int(v)}" for k, v in sorted(m_end.items()) if k.startswith("chat:") and v))
    emit("")
    emit("cache paths of acknowledged turns: " +
         ", ".join(f"{k} {v}" for k, v in soak.paths.most_common()))
    emit(f"switches seen (RoutingDecision.switched): {sum(soak.switches.values())}")
    for k, v in sorted(soak.switches.items()):
        emit(f"  {k:<40} {v}")
    evicted_lines = m_end["kvlingo_cache_evicted_lines_total"]
    emit(f"evictions: kvlingo_cache_evicted_lines_total {evicted_lines:.0f}; acknowledged "
         f"turns that re-prefilled their model's evicted line {soak.evicted_turns}; final turns "
         f"on sessions holding an evicted line {evicted_before}")
    if soak.budget_full:
        emit(f"turns refused by the cache budget (RESOURCE_EXHAUSTED): {len(soak.budget_full)}, "
             f"e.g. {soak.budget_full[0]!r}")
    emit(f"cache bytes: peak sampled {soak.peak_cache / 2 ** 20:.1f} MiB, at the end "
         f"{m_end['kvlingo_cache_bytes'] / 2 ** 20:.1f} MiB, budget {args.budget_mib} MiB")

    rss = [s[1] for s in samples] or [rss_start]
    bound = rss_start + args.budget_mib + args.rss_slack_mib
    excess = max((s[1] - rss_start - s[4] for s in samples), default=0.0)
    emit(f"RSS: start-up {rss_start:.1f} MiB, min {min(rss):.1f}, max {max(rss):.1f}, end "
         f"{rss[-1]:.1f}; bound {bound:.1f} = start-up + budget {args.budget_mib} + slack "
         f"{args.rss_slack_mib:.0f}; largest RSS - start-up - cache bytes {excess:.1f} MiB")
    first, last = samples[0] if samples else None, samples[-1] if samples else None
    warm = min(15.0, load_s / 6)
    lo = load0 - t0
    w1 = (lo + warm, lo + load_s / 3)
    w3 = (lo + 2 * load_s / 3, lo + load_s)
    growth = {}
    for col, name, slack in ((2, "threads", args.thread_slack), (3, "fds", args.fd_slack)):
        a, b = window_max(samples, col, *w1), window_max(samples, col, *w3)
        growth[name] = (a, b, slack)
        emit(f"{name}: start-up {first[col] if first else '?'}, end {last[col] if last else '?'}; "
             f"max over {w1[0]:.0f}-{w1[1]:.0f} s {a}, over {w3[0]:.0f}-{w3[1]:.0f} s {b} "
             f"(allowed +{slack})")
    emit(f"health at the end: {'SERVING' if healthy else 'NOT SERVING'}; exit code on SIGTERM "
         f"{exit_code}")

    # Assertions.
    if soak.unexpected:
        failures.append(f"{len(soak.unexpected)} unexpected statuses")
    if soak.lost:
        failures.append(f"{len(soak.lost)} transcript problems (lost or foreign turns)")
    if final_ok != len(soak.live) and not soak.fatal:
        failures.append(f"only {final_ok} of {len(soak.live)} final turns succeeded")
    if evicted_lines <= 0:
        failures.append("no cache line was evicted: the budget did not bite (lower --budget-mib)")
    elif soak.evicted_turns + evicted_before == 0:
        failures.append("no turn ran on an evicted line")
    if m_end["kvlingo_cache_bytes"] > budget:
        failures.append(f"cache bytes at rest {m_end['kvlingo_cache_bytes']:.0f} > budget {budget}")
    if max(rss) > bound:
        failures.append(f"RSS reached {max(rss):.1f} MiB, above the bound {bound:.1f} MiB")
    for name, (a, b, slack) in growth.items():
        if a is None or b is None:
            failures.append(f"too few samples to compare {name}")
        elif b > a + slack:
            failures.append(f"{name} grew: {a} early, {b} late (allowed +{slack})")
    if not healthy:
        failures.append("grpc.health.v1 did not report SERVING at the end")
    if exit_code != 0:
        failures.append(f"kvl-server exited with {exit_code} on SIGTERM (expected 0)")

    emit("")
    if soak.unexpected:
        emit("unexpected statuses (first 20): time_s worker session action code details / why")
        for u in soak.unexpected[:20]:
            emit(f"  {u[0]:7.1f} w{u[1]} {u[2]} {u[3]} {u[4]} {u[5]!r} / {u[6]}")
    if soak.lost:
        emit("transcript problems (first 20):")
        for p in soak.lost[:20]:
            emit(f"  {p}")
    if failures:
        emit("FAILED:")
        for f_ in failures:
            emit(f"  - {f_}")
        if exit_code not in (0, None) or soak.fatal:
            emit("server log (tail):")
            emit(log_tail)
    else:
        emit("PASSED: no unexpected status, no lost turn, evictions survived, RSS within bound, "
             "no thread or fd growth, healthy, clean exit")

    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out + ".tsv", "w") as f:
            f.write("time_s\trss_mib\tthreads\tfds\tcache_mib\n")
            for s in samples:
                f.write(f"{s[0]:.1f}\t{s[1]:.1f}\t{s[2]}\t{s[3]}\t{s[4]:.1f}\n")
        try:
            plot(args.out, bound, rss_start)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"warning: gnuplot failed: {e}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
