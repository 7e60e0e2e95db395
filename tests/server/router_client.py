"""End-to-end scenarios against a running kvl-server with models, driven with
Debian's grpcio and protoc-generated message classes only (no grpc_tools).
Prints one JSON object with what it saw; the calling gtest checks it.

usage: router_client.py TARGET STUBS_DIR SCENARIO [SERVER_PID]
  SCENARIO: policies | bad_inputs | concurrent | burst | eviction | drain (needs SERVER_PID)
"""
import json
import os
import signal
import sys
import threading
import time

import grpc

# Tokens of the answer that streams while the drain scenario's server drains:
# enough that the refusal, milliseconds after the signal, comes while it
# streams, with a wide margin (the result has both times: refused.after_s,
# long.streamed_after_sigterm_s).
DRAIN_LONG_TOKENS = 1000


def main():
    target, stubs_dir, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, stubs_dir)
    from kvlingo.v1 import chat_pb2, model_pb2, session_pb2  # noqa: E402

    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=20)

    def unary(method, req_cls, resp_cls):
        return channel.unary_unary(method, request_serializer=req_cls.SerializeToString,
                                   response_deserializer=resp_cls.FromString)

    create = unary("/kvlingo.v1.SessionService/CreateSession", session_pb2.CreateSessionRequest,
                   session_pb2.Session)
    get = unary("/kvlingo.v1.SessionService/GetSession", session_pb2.GetSessionRequest,
                session_pb2.Session)
    list_models = unary("/kvlingo.v1.ModelService/ListModels", model_pb2.ListModelsRequest,
                        model_pb2.ListModelsResponse)
    list_translators = unary("/kvlingo.v1.ModelService/ListTranslators",
                             model_pb2.ListTranslatorsRequest, model_pb2.ListTranslatorsResponse)
    chat_call = channel.unary_stream("/kvlingo.v1.ChatService/Chat",
                                     request_serializer=chat_pb2.ChatRequest.SerializeToString,
                                     response_deserializer=chat_pb2.ChatResponse.FromString)
    S = chat_pb2

    def session_state(sid):
        s = get(session_pb2.GetSessionRequest(session_id=sid), timeout=10)
        return {"turns": s.turns, "history_tokens": s.history_tokens, "last_model": s.last_model,
                "lines": [[l.model, l.tokens, l.bytes, l.evicted] for l in s.cache_lines],
                "spans": {l.model: [[sp.begin, sp.end, session_pb2.SpanProvenance.Name(sp.provenance),
                                     sp.source_model] for sp in l.spans] for l in s.cache_lines}}

    def chat(sid, text, policy="", model="", strategy=0, max_tokens=6, timeout=60, **sampling):
        req = S.ChatRequest(session_id=sid, user_message=text if isinstance(text, bytes) else text.encode(),
                            sampling=S.SamplingParams(max_tokens=max_tokens, **sampling),
                            routing=S.RoutingHints(policy=policy, model=model, strategy=strategy))
        out = {"code": "OK", "ids": [], "text": ""}
        try:
            for ev in chat_call(req, timeout=timeout):
                kind = ev.WhichOneof("event")
                if kind == "routing":
                    r = ev.routing
                    out["routing"] = {"model": r.model, "previous": r.previous_model,
                                      "policy": r.policy, "reason": r.reason,
                                      "switched": r.switched,
                                      "strategy": S.SwitchStrategy.Name(r.strategy),
                                      "path": S.CachePath.Name(r.path),
                                      "spans_translated": r.spans_translated,
                                      "tokens_translated": r.tokens_translated,
                                      "tokens_reprefilled": r.tokens_reprefilled}
                    out["order"] = out.get("order", "") + "R"
                elif kind == "delta":
                    out["ids"] += list(ev.delta.token_ids)
                    out["text"] += ev.delta.text
                    out["order"] = out.get("order", "") + "D"
                else:
                    s = ev.summary
                    out["summary"] = {"finish": S.FinishReason.Name(s.finish_reason),
                                      "ttft": s.time_to_first_token_seconds,
                                      "prefill_tokens": s.prefill_tokens,
                                      "generated_tokens": s.generated_tokens,
                                      "history_tokens": s.history_tokens}
                    out["order"] = out.get("order", "") + "S"
        except grpc.RpcError as e:
            out["code"] = e.code().name
            out["details"] = e.details()
        return out

    result = {}
    if scenario == "policies":
        result["models"] = [m.name for m in list_models(model_pb2.ListModelsRequest(), timeout=10).models]
        listed = list_translators(model_pb2.ListTranslatorsRequest(), timeout=10).translators
        result["translators"] = {t.name: t.compute_dtype for t in listed}
        result["translator_inputs"] = {t.name: t.inputs for t in listed}
        runs = {}
        # Every policy, three turns; every strategy under explicit A->B->C->A.
        plans = {
            "fixed": [dict(policy="fixed")] * 3,
            "alternate": [dict(policy="alternate")] * 3,
            "rules": [dict(policy="rules")] * 3,
            "cascade": [dict(policy="cascade")] * 3,
        }
        for strat_name, strat in (("translate", 1), ("reprefill", 2), ("reprefill-missing", 3)):
            plans["explicit-" + strat_name] = [
                dict(policy="explicit", model=m, strategy=strat)
                for m in ("small", "small-b", "large", "small")]
        texts = ["Hello, who are you?", "Please explain caches in detail.", "Thanks! And why?",
                 "One more question."]
        for name, turns in plans.items():
            sid = create(session_pb2.CreateSessionRequest(session_id="pol-" + name,
                                                          system_prompt="Be brief."),
                         timeout=10).session_id
            runs[name] = [chat(sid, texts[i], **kw) for i, kw in enumerate(turns)]
            runs[name + ":state"] = session_state(sid)
        result["runs"] = runs
    elif scenario == "bad_inputs":
        sid = create(session_pb2.CreateSessionRequest(session_id="bad"), timeout=10).session_id
        first = chat(sid, "A first turn.", policy="explicit", model="small")
        before = session_state(sid)
        cases = {
            "unknown_session": dict(sid="nope", text="hi"),
            "unknown_model": dict(text="hi", policy="explicit", model="no-such-model"),
            "empty_turn": dict(text=""),
            "invalid_utf8": dict(text=b"bad \xff\xfe bytes"),
            "turn_too_long": dict(text="x" * 3000),
            "max_tokens_over_limit": dict(text="hi", max_tokens=100000),
            "temperature_out_of_range": dict(text="hi", temperature=3.0),
            "top_p_out_of_range": dict(text="hi", top_p=1.5),
            "unknown_policy": dict(text="hi", policy="bogus"),
            "unknown_strategy": dict(text="hi", strategy=7),
            "explicit_without_model": dict(text="hi", policy="explicit"),
        }
        seen = {"first": first}
        for name, kw in cases.items():
            s = kw.pop("sid", sid)
            r = chat(s, kw.pop("text"), **kw)
            seen[name] = {"code": r["code"], "details": r.get("details", ""),
                          "unchanged": session_state(sid) == before}
        # Cancellation: a deadline that expires mid-generation.
        r = chat(sid, "Say a lot.", policy="explicit", model="small-b", max_tokens=1500,
                 timeout=0.4)
        time.sleep(0.5)
        seen["deadline"] = {"code": r["code"], "unchanged": session_state(sid) == before}
        # The session still works afterwards (retry while the cancelled turn unwinds).
        for _ in range(50):
            r = chat(sid, "Still alive?", policy="explicit", model="small")
            if r["code"] != "ABORTED":
                break
            time.sleep(0.1)
        seen["after"] = {"code": r["code"], "turns": session_state(sid)["turns"]}
        # A system prompt over server.max_system_prompt_bytes: no session.
        try:
            create(session_pb2.CreateSessionRequest(session_id="long-prompt",
                                                    system_prompt="y" * 3000), timeout=10)
            seen["long_system_prompt"] = {"code": "OK"}
        except grpc.RpcError as e:
            seen["long_system_prompt"] = {"code": e.code().name, "details": e.details()}
        try:
            get(session_pb2.GetSessionRequest(session_id="long-prompt"), timeout=10)
            seen["long_system_prompt"]["created"] = True
        except grpc.RpcError as e:
            seen["long_system_prompt"]["created"] = e.code().name != "NOT_FOUND"
        result = seen
    elif scenario == "concurrent":
        outcomes = {}

        def run(i):
            sid = create(session_pb2.CreateSessionRequest(session_id=f"c-{i}"), timeout=10).session_id
            codes = []
            for t in range(3):
                r = chat(sid, f"Session {i} turn {t}.", policy="alternate", max_tokens=4,
                         timeout=120)
                codes.append([r["code"], r.get("routing", {}).get("switched", False)])
            outcomes[i] = codes

        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result["outcomes"] = outcomes
    elif scenario == "burst":
        # The server's limits: 4 streams, 1 turn waiting per model, 13
        # sessions, 300 history tokens. 12 sessions fire one turn each at
        # once on large; the 14th session is refused.
        sids = [create(session_pb2.CreateSessionRequest(session_id=f"b-{i}"), timeout=10).session_id
                for i in range(12)]
        create(session_pb2.CreateSessionRequest(session_id="h"), timeout=10)
        try:
            create(session_pb2.CreateSessionRequest(session_id="one-too-many"), timeout=10)
            result["session_limit"] = {"code": "OK"}
        except grpc.RpcError as e:
            result["session_limit"] = {"code": e.code().name, "details": e.details()}
        start, outcomes = threading.Barrier(len(sids)), {}

        def fire(sid):
            start.wait()
            t0 = time.monotonic()
            r = chat(sid, "Tell me a long story.", policy="explicit", model="large",
                     max_tokens=96, timeout=120)
            outcomes[sid] = {"code": r["code"], "details": r.get("details", ""),
                             "seconds": time.monotonic() - t0}

        threads = [threading.Thread(target=fire, args=(sid,)) for sid in sids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for sid in sids:
            outcomes[sid]["state"] = session_state(sid)
        result["burst"] = outcomes
        # Past the history limit: refused, the session unchanged.
        first = chat("h", "Hi.", policy="explicit", model="small", max_tokens=4)
        before = session_state("h")
        r = chat("h", "word " * 400, policy="explicit", model="small", max_tokens=4)
        result["history_limit"] = {"first": first["code"], "code": r["code"],
                                   "details": r.get("details", ""),
                                   "unchanged": session_state("h") == before}
    elif scenario == "eviction":
        # Two sessions alternate on one model under a budget that holds about
        # one line: each turn evicts the other session's line.
        for sid in ("ev-x", "ev-y"):
            create(session_pb2.CreateSessionRequest(session_id=sid), timeout=10)
        turns = []
        for t in range(3):
            for sid in ("ev-x", "ev-y"):
                r = chat(sid, f"{sid} turn {t}.", policy="explicit", model="small")
                turns.append({"sid": sid, "code": r["code"], "ids": r["ids"],
                              "path": r.get("routing", {}).get("path"),
                              "state": session_state(sid)})
                turns[-1]["other"] = session_state("ev-y" if sid == "ev-x" else "ev-x")
        result["turns"] = turns
        # large needs more than the whole budget while ev-x holds small's line.
        before = session_state("ev-x")
        r = chat("ev-x", "Switch to large.", policy="explicit", model="large")
        result["budget_exhausted"] = {"code": r["code"], "details": r.get("details", ""),
                                      "unchanged": session_state("ev-x")["history_tokens"] ==
                                      before["history_tokens"] and
                                      session_state("ev-x")["turns"] == before["turns"]}
    elif scenario == "drain":
        # A long answer is streaming when the server gets SIGTERM: new Chat
        # calls are refused with UNAVAILABLE while it finishes.
        pid = int(sys.argv[4])
        for sid in ("dr-a", "dr-b"):
            create(session_pb2.CreateSessionRequest(session_id=sid), timeout=10)
        streaming, long = threading.Event(), {}

        def run_long():
            req = S.ChatRequest(session_id="dr-a", user_message=b"Talk for a long time.",
                                sampling=S.SamplingParams(max_tokens=DRAIN_LONG_TOKENS),
                                routing=S.RoutingHints(policy="explicit", model="large"))
            long["code"], long["deltas"] = "OK", 0
            try:
                for ev in chat_call(req, timeout=300):  # a loaded machine may be slow
                    kind = ev.WhichOneof("event")
                    if kind == "delta":
                        long["deltas"] += 1
                        streaming.set()
                    elif kind == "summary":
                        long["summary_at"] = time.monotonic()
                        long["finish"] = S.FinishReason.Name(ev.summary.finish_reason)
                        long["generated_tokens"] = ev.summary.generated_tokens
            except grpc.RpcError as e:
                long["code"], long["details"] = e.code().name, e.details()
            streaming.set()

        worker = threading.Thread(target=run_long)
        worker.start()
        streaming.wait(60)
        signalled_at = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        # The signal is handled asynchronously: retry until the drain refuses.
        refused = {"code": "none"}
        while time.monotonic() - signalled_at < 10:
            r = chat("dr-b", "Are you still there?", policy="explicit", model="small",
                     max_tokens=1)
            if r["code"] != "OK":
                refused = {"code": r["code"], "details": r.get("details", ""),
                           "long_still_streaming": "summary_at" not in long,
                           "after_s": round(time.monotonic() - signalled_at, 3)}
                break
            time.sleep(0.01)
        worker.join()
        long["streamed_after_sigterm_s"] = round(long.get("summary_at", signalled_at) - signalled_at, 3)
        long["in_flight_at_sigterm"] = long.get("summary_at", float("inf")) > signalled_at
        long.pop("summary_at", None)
        result = {"long": long, "refused": refused}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
