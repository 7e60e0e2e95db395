"""The README main job's client: talks to a running kvl-server over gRPC.

Uses only Debian's python3-grpcio and python3-protobuf: message classes come
from `protoc --python_out` (scripts/run_demo.sh generates them into
build/python), and each method is called by its full name.

usage: /usr/bin/python3 scripts/demo_client.py TARGET STUBS_DIR METRICS_URL
"""
import sys
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


def main():
    target, stubs_dir, metrics_url = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, stubs_dir)
    from kvlingo.v1 import chat_pb2, session_pb2  # noqa: E402

    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=30)
    print(f"health ''                          : {health_status(channel)}")
    for svc in ("kvlingo.v1.ChatService", "kvlingo.v1.SessionService", "kvlingo.v1.ModelService"):
        print(f"health {svc:<27} : {health_status(channel, svc)}")

    create = channel.unary_unary("/kvlingo.v1.SessionService/CreateSession",
                                 request_serializer=session_pb2.CreateSessionRequest.SerializeToString,
                                 response_deserializer=session_pb2.Session.FromString)
    session = create(session_pb2.CreateSessionRequest(system_prompt="You are a helpful assistant."),
                     timeout=5)
    print(f"created session                     : {session.session_id}")

    chat = channel.unary_stream("/kvlingo.v1.ChatService/Chat",
                                request_serializer=chat_pb2.ChatRequest.SerializeToString,
                                response_deserializer=chat_pb2.ChatResponse.FromString)
    try:
        for event in chat(chat_pb2.ChatRequest(session_id=session.session_id,
                                               user_message="Hello!".encode()), timeout=30):
            print(event)
    except grpc.RpcError as e:
        print(f"chat                                : {e.code().name}: {e.details()}")

    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        lines = [l for l in response.read().decode().splitlines()
                 if l.startswith(("kvlingo_up", "kvlingo_sessions_active", "kvlingo_build_info"))]
    print("metrics (excerpt):")
    for line in lines:
        print(f"  {line}")


if __name__ == "__main__":
    main()
