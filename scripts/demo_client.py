"""The README main job's client: talks to a running kvl-server over gRPC.

Uses only Debian's python3-grpcio and python3-protobuf: message classes come
from `protoc --python_out` (scripts/run_demo.sh generates them into
build/python), and each method is called by its full name.

usage: /usr/bin/python3 scripts/demo_client.py TARGET STUBS_DIR METRICS_URL [POLICY]

POLICY names the routing policy of every turn: cascade (the default) or
alternate (scripts/run_demo.sh --families: each turn goes to the next model).
"""
import json
import pathlib
import sys
import time
import urllib.request

import grpc


def health_status(channel, service=""):
    # grpc.health.v1.Health/Check: HealthCheckRequest{string service = 1},
    # HealthCheckResponse{ServingStatus status = 1}; Debian ships no Python
    # stubs for it, so the two one-field messages are encoded by hand.
    encoded = service.encode()
    request = (b"\x0a" + bytes([len(encoded)]) + encoded) if encoded else b""
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    reply = check(request, timeout=5)
    value = reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0
    return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(value, str(value))


def house_models_note(served):
    """One line on what the served house models are and how accurate, from the
    committed results file (docs/results/house_models.json, written by `kvl eval`
    and house_report.py); None when the file or the models are not there."""
    here = pathlib.Path(__file__).resolve()
    for root in (pathlib.Path.cwd(), *here.parents):
        path = root / "docs/results/house_models.json"
        if path.is_file():
            break
    else:
        return None
    try:
        results = json.loads(path.read_text())["models"]
        parts = []
        for name in served:
            if name not in results:
                continue
            m = results[name]
            accuracy = m["accuracy"].values()
            parts.append(f"{name} ({m['parameters'] / 1e6:.1f} M parameters) "
                         f"{min(accuracy) * 100:.0f}-{max(accuracy) * 100:.0f}%")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not parts:
        return None
    return ("note: these are tiny house models trained from scratch here, not assistants; "
            "exact-match accuracy on held-out test items, by task: " + ", ".join(parts)
            + " (docs/results/house_models.json), so wrong answers are expected: the demo's "
            "proof is that the translated answers equal the re-prefilled ones")


def main():
    target, stubs_dir, metrics_url = sys.argv[1], sys.argv[2], sys.argv[3]
    policy = sys.argv[4] if len(sys.argv) > 4 else "cascade"
    sys.path.insert(0, stubs_dir)
    from kvlingo.v1 import chat_pb2, model_pb2, session_pb2  # noqa: E402

    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=30)
    print(f"health ''                          : {health_status(channel)}")
    for svc in ("kvlingo.v1.ChatService", "kvlingo.v1.SessionService", "kvlingo.v1.ModelService"):
        print(f"health {svc:<27} : {health_status(channel, svc)}")

    create = channel.unary_unary("/kvlingo.v1.SessionService/CreateSession",
                                 request_serializer=session_pb2.CreateSessionRequest.SerializeToString,
                                 response_deserializer=session_pb2.Session.FromString)
    get_session = channel.unary_unary("/kvlingo.v1.SessionService/GetSession",
                                      request_serializer=session_pb2.GetSessionRequest.SerializeToString,
                                      response_deserializer=session_pb2.Session.FromString)
    list_models = channel.unary_unary("/kvlingo.v1.ModelService/ListModels",
                                      request_serializer=model_pb2.ListModelsRequest.SerializeToString,
                                      response_deserializer=model_pb2.ListModelsResponse.FromString)
    chat = channel.unary_stream("/kvlingo.v1.ChatService/Chat",
                                request_serializer=chat_pb2.ChatRequest.SerializeToString,
                                response_deserializer=chat_pb2.ChatResponse.FromString)
    models = list_models(model_pb2.ListModelsRequest(), timeout=10).models
    print("models: " + ", ".join(f"{m.name} ({m.n_layer} layers, {m.hidden_size} wide)" for m in models))
    note = house_models_note([m.name for m in models])
    if note:
        print(note)

    def turn(session_id, text, **routing):
        decision, text_out, summary = None, "", None
        for event in chat(chat_pb2.ChatRequest(
                session_id=session_id, user_message=text.encode(),
                sampling=chat_pb2.SamplingParams(max_tokens=48),
                routing=chat_pb2.RoutingHints(**routing)), timeout=300,
                metadata=[("x-kvl-session-id", session_id)]):
            kind = event.WhichOneof("event")
            if kind == "routing":
                decision = event.routing
            elif kind == "delta":
                text_out += event.delta.text
            else:
                summary = event.summary
        return decision, text_out, summary

    system = "You are a helpful assistant."
    main_session = create(session_pb2.CreateSessionRequest(system_prompt=system), timeout=5)
    # The twin hears the same turns under the same policy (so the same model
    # answers), but every hand-over re-prefills: what the switch would cost
    # without translation.
    twin = create(session_pb2.CreateSessionRequest(system_prompt=system), timeout=5)
    # In the corpus's register (docs/data.md): facts and a running total that
    # kvl-small handles, an out-of-domain request that it is unsure about
    # (the cascade escalates there), then questions whose answers only the
    # history holds, answered by kvl-large from the translated cache (under
    # "alternate", every turn by the next model); where
    # an answer differs from the re-prefilled twin's, both are printed.
    script = [
        "My sister Nora lives in Lisbon.",
        "I have 5 stamps.",
        "I buy 3 more.",
        "Explain step by step why the sky looks blue during the day and red at sunset, "
        "in terms of Rayleigh scattering and the path length of sunlight through air.",
        "One more thing. Where does my sister live?",
        "How many stamps do I have now?",
    ]
    print(f"\n{'turn':>4}  {'model':<12} {'path':<11} {'switch':<7} {'TTFT ms':>8}  "
          f"{'reprefill TTFT ms':>17}  {'translated':>10}  reason")
    for i, text in enumerate(script, 1):
        d, answer, s = turn(main_session.session_id, text, policy=policy)
        td, twin_answer, ts = turn(twin.session_id, text, policy=policy,
                                   strategy=chat_pb2.SWITCH_STRATEGY_REPREFILL)
        path = chat_pb2.CachePath.Name(d.path).replace("CACHE_PATH_", "").lower()
        print(f"{i:>4}  {d.model:<12} {path:<11} {'yes' if d.switched else 'no':<7} "
              f"{s.time_to_first_token_seconds * 1e3:>8.1f}  "
              f"{ts.time_to_first_token_seconds * 1e3:>17.1f}  "
              f"{d.tokens_translated:>10}  {d.reason}"
              + ("" if td.model == d.model else f" (twin answered with {td.model})"))
        print(f"      user: {text}")
        # Greedy decoding: where the translated cache changes an answer, the
        # twin's (re-prefilled) answer shows what it would have been (after a
        # first difference the two histories differ too).
        same = twin_answer.strip() == answer.strip()
        print(f"      {d.model}: {answer.strip()[:160]!r}"
              + ("  (the same with re-prefill)" if same and d.switched else ""))
        if not same:
            print(f"      {td.model}, re-prefilled: {twin_answer.strip()[:160]!r}")

    def scrape():
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            return response.read().decode().splitlines()

    # Background repair (routing.repair, after-turn by default) recomputes the
    # translated cache natively after the switch turn; wait for it to land
    # (bounded), so that the excerpt shows what it did.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "kvlingo_repair_backlog_lines 0" in scrape():
            break
        time.sleep(0.2)
    lines = [l for l in scrape()
             if l.startswith(("kvlingo_up", "kvlingo_sessions_active", "kvlingo_switches_total",
                              "kvlingo_time_to_first_token_seconds_count",
                              "kvlingo_cache_bytes", "kvlingo_repaired_tokens_total",
                              "kvlingo_repairs_total", "kvlingo_repair_backlog_lines",
                              "kvlingo_switch_divergence_nats_sum",
                              "kvlingo_switch_divergence_nats_count",
                              "kvlingo_switch_first_token_differs_total"))
             and (not l.endswith(" 0") or l.startswith("kvlingo_repair_backlog_lines"))]
    print("metrics (excerpt):")
    for line in lines:
        print(f"  {line}")

    # Where each model's cache of the conversation came from, after the repair.
    view = get_session(session_pb2.GetSessionRequest(session_id=main_session.session_id), timeout=10)
    print("cache lines of the session (GetSession):")
    for line in view.cache_lines:
        spans = []
        for sp in line.spans:
            kind = session_pb2.SpanProvenance.Name(sp.provenance).replace("SPAN_PROVENANCE_", "").lower()
            spans.append(f"[{sp.begin}, {sp.end}) {kind}"
                         + (f" from {sp.source_model}" if sp.source_model else ""))
        print(f"  {line.model}: {line.tokens} tokens: " + ", ".join(spans))


if __name__ == "__main__":
    main()
