#include "server/services.h"

#include <string>
#include <utility>

#include "server/status.h"
#include "spdlog/spdlog.h"

namespace kvl::server {
namespace {

using kvlingo::v1::ChatResponse;

// Finishes a unary call and counts it.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, ServerMetrics* metrics,
                                      RpcMethod method, const absl::Status& status) {
  grpc::Status result = ToGrpcStatus(status);
  metrics->CountRpc(method, result.error_code());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(result));
  return reactor;
}

void ToProto(const SessionInfo& info, kvlingo::v1::Session* out) {
  out->set_session_id(info.session_id);
  out->set_system_prompt(info.system_prompt);
  out->set_turns(info.turns);
  out->set_history_tokens(info.history_tokens);
  out->set_last_model(info.last_model);
  out->set_created_unix_seconds(info.created_unix_seconds);
  out->set_last_active_unix_seconds(info.last_active_unix_seconds);
}

// One Chat stream. It owns its slot in the drain gate from construction to
// OnDone, so that shutdown waits for it. Deletes itself in OnDone, as the
// callback API requires.
class ChatReactor final : public grpc::ServerWriteReactor<ChatResponse> {
 public:
  // `admitted`: the caller took a slot in deps.chat_gate for this stream.
  ChatReactor(const ServiceDeps& deps, bool admitted) : deps_(deps), admitted_(admitted) {}

  // Ends the stream with `status`; call exactly once.
  void FinishWith(const absl::Status& status) {
    grpc::Status result = ToGrpcStatus(status);
    deps_.metrics->CountRpc(RpcMethod::kChat, result.error_code());
    Finish(std::move(result));
  }

  void OnDone() override {
    if (admitted_) deps_.chat_gate->Exit();
    delete this;
  }

 private:
  ServiceDeps deps_;
  bool admitted_;
};

}  // namespace

grpc::ServerUnaryReactor* SessionServiceImpl::CreateSession(
    grpc::CallbackServerContext* context, const kvlingo::v1::CreateSessionRequest* request,
    kvlingo::v1::Session* response) {
  absl::StatusOr<SessionInfo> created =
      deps_.sessions->Create(request->session_id(), request->system_prompt());
  if (created.ok()) {
    ToProto(*created, response);
    deps_.metrics->SetSessionsActive(static_cast<int64_t>(deps_.sessions->size()));
    SPDLOG_DEBUG("session {} created", created->session_id);
  }
  return FinishUnary(context, deps_.metrics, RpcMethod::kCreateSession, created.status());
}

grpc::ServerUnaryReactor* SessionServiceImpl::GetSession(
    grpc::CallbackServerContext* context, const kvlingo::v1::GetSessionRequest* request,
    kvlingo::v1::Session* response) {
  absl::StatusOr<SessionInfo> info = deps_.sessions->Get(request->session_id());
  if (info.ok()) ToProto(*info, response);
  return FinishUnary(context, deps_.metrics, RpcMethod::kGetSession, info.status());
}

grpc::ServerUnaryReactor* SessionServiceImpl::ListSessions(
    grpc::CallbackServerContext* context, const kvlingo::v1::ListSessionsRequest* request,
    kvlingo::v1::ListSessionsResponse* response) {
  absl::StatusOr<SessionPage> page =
      deps_.sessions->List(request->page_size(), request->page_token());
  if (page.ok()) {
    for (const SessionInfo& info : page->sessions) ToProto(info, response->add_sessions());
    response->set_next_page_token(page->next_page_token);
  }
  return FinishUnary(context, deps_.metrics, RpcMethod::kListSessions, page.status());
}

grpc::ServerUnaryReactor* SessionServiceImpl::DeleteSession(
    grpc::CallbackServerContext* context, const kvlingo::v1::DeleteSessionRequest* request,
    kvlingo::v1::DeleteSessionResponse* /*response*/) {
  absl::Status status = deps_.sessions->Delete(request->session_id());
  if (status.ok()) {
    deps_.metrics->SetSessionsActive(static_cast<int64_t>(deps_.sessions->size()));
    SPDLOG_DEBUG("session {} deleted", request->session_id());
  }
  return FinishUnary(context, deps_.metrics, RpcMethod::kDeleteSession, status);
}

grpc::ServerWriteReactor<ChatResponse>* ChatServiceImpl::Chat(
    grpc::CallbackServerContext* /*context*/, const kvlingo::v1::ChatRequest* request) {
  const bool admitted = deps_.chat_gate->TryEnter();
  auto* reactor = new ChatReactor(deps_, admitted);
  if (!admitted) {
    reactor->FinishWith(
        absl::UnavailableError("the server is shutting down; retry on another replica"));
    return reactor;
  }
  absl::StatusOr<TurnRequest> turn = ParseChatRequest(*request, deps_.limits);
  if (!turn.ok()) {
    reactor->FinishWith(turn.status());
    return reactor;
  }
  if (absl::Status s = deps_.sessions->Touch(turn->session_id); !s.ok()) {
    reactor->FinishWith(s);
    return reactor;
  }
  reactor->FinishWith(absl::UnimplementedError(
      "no models are loaded: the server does not load models until the router is built, so "
      "it only manages sessions"));
  return reactor;
}

grpc::ServerUnaryReactor* ModelServiceImpl::ListModels(
    grpc::CallbackServerContext* context, const kvlingo::v1::ListModelsRequest* /*request*/,
    kvlingo::v1::ListModelsResponse* /*response*/) {
  return FinishUnary(
      context, deps_.metrics, RpcMethod::kListModels,
      absl::UnimplementedError(
          "no models are loaded: the server does not load models until the router is built"));
}

grpc::ServerUnaryReactor* ModelServiceImpl::ListTranslators(
    grpc::CallbackServerContext* context, const kvlingo::v1::ListTranslatorsRequest* /*request*/,
    kvlingo::v1::ListTranslatorsResponse* /*response*/) {
  return FinishUnary(
      context, deps_.metrics, RpcMethod::kListTranslators,
      absl::UnimplementedError(
          "no translators are loaded: the server does not load translators until the router is "
          "built"));
}

}  // namespace kvl::server
