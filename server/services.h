// The kvlingo.v1 gRPC services, on gRPC's callback API. Handlers validate,
// convert to native types and hand off; they never block on model work or on
// the session store.
//
// Threading: gRPC's callback threads run the handlers' first part only
// (authentication, validation, tokenizing a system prompt). Whatever touches
// the session store (server/sessions.h, possibly a Redis round trip) runs on
// the session pool (CreateSession, GetSession, ListSessions, DeleteSession,
// GetTranscript, Chat without models) or on the turn pool (Chat,
// ImportSession: they run model work too), and finishes the call from there.
//
// Every RPC is counted once, with its final code, in
// kvlingo_grpc_requests_total.
//
// Every RPC first authenticates the caller (server/auth.h: UNAUTHENTICATED,
// PERMISSION_DENIED) and works on the caller's tenant's sessions only: the
// ids a client sends and receives are its own, the store's are scoped
// ("<tenant>/<id>"), and another tenant's session is NOT_FOUND.
#pragma once

#include "kvlingo/v1/chat.grpc.pb.h"
#include "kvlingo/v1/model.grpc.pb.h"
#include "kvlingo/v1/session.grpc.pb.h"
#include "router/router.h"
#include "server/auth.h"
#include "server/chat_request.h"
#include "server/drain_gate.h"
#include "server/metrics.h"
#include "server/sessions.h"
#include "server/turn_pool.h"

namespace kvl::server {

// What the services share; owned by the Server, which outlives the services.
struct ServiceDeps {
  // The one owner of sessions (the replica's registry and the durable
  // store); never null.
  Sessions* sessions = nullptr;
  ServerMetrics* metrics = nullptr;
  DrainGate* chat_gate = nullptr;
  TurnLimits limits;
  int64_t max_concurrent_streams = 0;  // limits.max_concurrent_streams; 0: none
  int64_t max_metadata_bytes = 8192;   // server.max_metadata_bytes
  // Null when the server was started without models: Chat then answers
  // UNIMPLEMENTED and sessions hold no history.
  router::Router* router = nullptr;
  TurnPool* pool = nullptr;  // turns; null without a router
  // The session calls' store work, apart from the turns so that a pool full
  // of long turns never holds them up; never null.
  TurnPool* session_pool = nullptr;
  // Model dtypes as configured, by model index (for ListModels).
  std::vector<std::string> model_dtypes;
  // API keys and tenants; never null (it lets everyone in when no keys are
  // configured).
  Authenticator* auth = nullptr;
};

// Shared by the gRPC services and the OpenAI API (server/openai_http.h).
//
// Creates the session `store_id` of the caller's tenant (with the turns
// `populate` runs), within server and tenant limits (max_sessions), counting
// a refusal in kvlingo_requests_rejected_total.
absl::StatusOr<SessionView> CreateForCaller(const ServiceDeps& deps, const Caller& caller,
                                            const std::string& store_id, std::string prompt,
                                            std::vector<int64_t> preamble,
                                            const Sessions::Populate& populate = nullptr);
// `status` with the tenant's store ids ("<tenant>/<id>") made the client's.
absl::Status ForClient(const std::string& tenant, const absl::Status& status);
absl::Status ForClient(const absl::StatusOr<Caller>& caller, const absl::Status& status);
// The tokens `system_prompt` renders to, after ValidateSystemPrompt against
// the smallest loaded model's context.
absl::Status PreambleOf(const ServiceDeps& deps, const std::string& system_prompt,
                        std::vector<int64_t>* preamble);
// What the session store keeps of a turn, before Sessions::Record adds the
// tokens and ledger.
TurnRecord RecordOf(const router::Router& router, const std::string& request_id,
                    const std::string& user_message, const router::TurnResult& result,
                    std::string events);

// A unary call as the services handle it: the request parsed from the bytes
// that came (UnaryDispatch, services.cc), the response to fill, and Finish,
// which sends the response when the status is OK, counts the call in
// kvlingo_grpc_requests_total and deletes the call. Finish may be called from
// any thread, once.
template <class Request, class Response>
struct UnaryCall {
  grpc::CallbackServerContext* context = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;  // the context's default one
  Request request;
  Response response;
  grpc::ByteBuffer* out = nullptr;  // gRPC's, for the serialized response
  ServerMetrics* metrics = nullptr;
  RpcMethod method{};
  void Finish(const absl::Status& status);
};

// The methods are registered raw (bytes in, bytes out) and parsed here: gRPC
// answers a request its own parser refuses with UNIMPLEMENTED and no message,
// which tells a client the method does not exist; these answer
// INVALID_ARGUMENT naming the message type.
using RawSessionService = kvlingo::v1::SessionService::WithRawCallbackMethod_CreateSession<
    kvlingo::v1::SessionService::WithRawCallbackMethod_GetSession<
        kvlingo::v1::SessionService::WithRawCallbackMethod_ListSessions<
            kvlingo::v1::SessionService::WithRawCallbackMethod_DeleteSession<
                kvlingo::v1::SessionService::WithRawCallbackMethod_GetTranscript<
                    kvlingo::v1::SessionService::WithRawCallbackMethod_ImportSession<
                        kvlingo::v1::SessionService::Service>>>>>>;
using RawChatService =
    kvlingo::v1::ChatService::WithRawCallbackMethod_Chat<kvlingo::v1::ChatService::Service>;
using RawModelService = kvlingo::v1::ModelService::WithRawCallbackMethod_ListModels<
    kvlingo::v1::ModelService::WithRawCallbackMethod_ListTranslators<
        kvlingo::v1::ModelService::Service>>;

class SessionServiceImpl final : public RawSessionService {
 public:
  explicit SessionServiceImpl(const ServiceDeps& deps) : deps_(deps) {}

  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetTranscript(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  // Validates on the gRPC thread, then reads the turns on the turn pool, on
  // a session that exists for no one else until they are all read and the
  // session is recorded (Sessions::Create with a Populate): a failed import
  // leaves nothing.
  grpc::ServerUnaryReactor* ImportSession(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

 private:
  void HandleCreateSession(
      UnaryCall<kvlingo::v1::CreateSessionRequest, kvlingo::v1::Session>* call);
  void HandleGetSession(UnaryCall<kvlingo::v1::GetSessionRequest, kvlingo::v1::Session>* call);
  void HandleListSessions(
      UnaryCall<kvlingo::v1::ListSessionsRequest, kvlingo::v1::ListSessionsResponse>* call);
  void HandleDeleteSession(
      UnaryCall<kvlingo::v1::DeleteSessionRequest, kvlingo::v1::DeleteSessionResponse>* call);
  void HandleGetTranscript(
      UnaryCall<kvlingo::v1::GetTranscriptRequest, kvlingo::v1::Transcript>* call);
  void HandleImportSession(
      UnaryCall<kvlingo::v1::ImportSessionRequest, kvlingo::v1::Session>* call);

  ServiceDeps deps_;
};

// Chat validates the request on the gRPC thread (INVALID_ARGUMENT, NOT_FOUND,
// UNAVAILABLE come back before any model work), then runs the turn on the
// turn pool and streams its events.
class ChatServiceImpl final : public RawChatService {
 public:
  explicit ChatServiceImpl(const ServiceDeps& deps) : deps_(deps) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Chat(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;

 private:
  ServiceDeps deps_;
};

class ModelServiceImpl final : public RawModelService {
 public:
  explicit ModelServiceImpl(const ServiceDeps& deps) : deps_(deps) {}

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListTranslators(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;

 private:
  void HandleListModels(
      UnaryCall<kvlingo::v1::ListModelsRequest, kvlingo::v1::ListModelsResponse>* call);
  void HandleListTranslators(
      UnaryCall<kvlingo::v1::ListTranslatorsRequest, kvlingo::v1::ListTranslatorsResponse>* call);

  ServiceDeps deps_;
};

}  // namespace kvl::server
