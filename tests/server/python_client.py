"""Drives a running kvl-server from Python with only grpcio and protobuf.

No grpc_tools: the message classes come from `protoc --python_out` (run by the
calling test into STUBS_DIR) and each method is called by its full name with
the classes' own (de)serialisers. Prints one JSON object with what it saw.

usage: python_client.py TARGET STUBS_DIR
"""
import json
import sys

import grpc


def main():
    target, stubs_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, stubs_dir)
    from kvlingo.v1 import chat_pb2, model_pb2, session_pb2  # noqa: E402

    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=10)
    create = channel.unary_unary(
        "/kvlingo.v1.SessionService/CreateSession",
        request_serializer=session_pb2.CreateSessionRequest.SerializeToString,
        response_deserializer=session_pb2.Session.FromString)
    get = channel.unary_unary(
        "/kvlingo.v1.SessionService/GetSession",
        request_serializer=session_pb2.GetSessionRequest.SerializeToString,
        response_deserializer=session_pb2.Session.FromString)
    chat = channel.unary_stream(
        "/kvlingo.v1.ChatService/Chat",
        request_serializer=chat_pb2.ChatRequest.SerializeToString,
        response_deserializer=chat_pb2.ChatResponse.FromString)
    list_models = channel.unary_unary(
        "/kvlingo.v1.ModelService/ListModels",
        request_serializer=model_pb2.ListModelsRequest.SerializeToString,
        response_deserializer=model_pb2.ListModelsResponse.FromString)

    def code_of(call):
        try:
            result = call()
            if hasattr(result, "__iter__") and not hasattr(result, "SerializeToString"):
                list(result)
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details()

    created = create(session_pb2.CreateSessionRequest(session_id="py-1", system_prompt="Be brief."),
                     timeout=5)
    fetched = get(session_pb2.GetSessionRequest(session_id="py-1"), timeout=5)
    duplicate = code_of(lambda: create(session_pb2.CreateSessionRequest(session_id="py-1"), timeout=5))
    chat_code = code_of(lambda: chat(chat_pb2.ChatRequest(session_id="py-1", user_message="hi".encode()),
                                     timeout=5))
    models_code = code_of(lambda: list_models(model_pb2.ListModelsRequest(), timeout=5))
    print(json.dumps({
        "created_id": created.session_id,
        "fetched_prompt": fetched.system_prompt,
        "duplicate": duplicate[0],
        "chat": list(chat_code),
        "list_models": models_code[0],
    }))


if __name__ == "__main__":
    main()
