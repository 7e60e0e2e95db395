#include "server/services.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "server/model_runtime.h"
#include "server/status.h"
#include "spdlog/spdlog.h"

namespace kvl::server {

template <class Request, class Response>
void UnaryCall<Request, Response>::Finish(const absl::Status& status) {
  grpc::Status result = ToGrpcStatus(status);
  if (result.ok()) {
    bool own_buffer = false;
    result = grpc::SerializationTraits<Response>::Serialize(response, out, &own_buffer);
  }
  metrics->CountRpc(method, result.error_code());
  reactor->Finish(std::move(result));
  delete this;
}

namespace {

using kvlingo::v1::ChatResponse;

// `request`, parsed as a `Message`; INVALID_ARGUMENT naming the type when the
// bytes are not one (malformed, or a string field that is not UTF-8).
template <class Message>
absl::Status ParseRequest(const grpc::ByteBuffer& request, Message* out) {
  grpc::ByteBuffer bytes(request);  // Deserialize consumes its buffer
  const grpc::Status parsed = grpc::SerializationTraits<Message>::Deserialize(&bytes, out);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", Message::descriptor()->full_name(),
                   " message (malformed protobuf, or a string field that is not UTF-8)"));
}

// Parses a raw unary call and hands it to `handle`, which finishes it.
template <class Request, class Response, class Handle>
grpc::ServerUnaryReactor* UnaryDispatch(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                        ServerMetrics* metrics, RpcMethod method, Handle handle) {
  auto* call = new UnaryCall<Request, Response>;
  call->context = context;
  // DefaultReactor constructs the reactor anew at each call: taken once.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  call->reactor = reactor;
  call->out = response;
  call->metrics = metrics;
  call->method = method;
  if (absl::Status parsed = ParseRequest(*request, &call->request); !parsed.ok()) {
    call->Finish(parsed);
  } else {
    handle(call);
  }
  return reactor;
}

// INVALID_ARGUMENT when the call's metadata is over server.max_metadata_bytes,
// counted as HTTP/2 counts a header list: each entry's name and value and 32.
absl::Status CheckMetadataSize(const grpc::CallbackServerContext* context, int64_t limit) {
  int64_t bytes = 0;
  for (const auto& [name, value] : context->client_metadata()) {
    bytes += static_cast<int64_t>(name.size() + value.size()) + 32;
  }
  if (bytes <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "metadata: the call's headers take ", bytes, " bytes (names, values and 32 per entry), over ",
      "server.max_metadata_bytes = ", limit, "; send fewer or shorter headers"));
}

// The caller of `rpc`, if it may call it (server/auth.h), and if its metadata
// is within bounds.
absl::StatusOr<Caller> Authorize(const ServiceDeps& deps,
                                 const grpc::CallbackServerContext* context, Right right,
                                 absl::string_view rpc) {
  KVL_RETURN_IF_ERROR(CheckMetadataSize(context, deps.max_metadata_bytes));
  std::optional<std::string> authorization;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = std::string(it->second.data(), it->second.size());
  }
  absl::StatusOr<Caller> caller = deps.auth->Authenticate(authorization);
  if (!caller.ok()) return caller.status();
  KVL_RETURN_IF_ERROR(Authenticator::Require(*caller, right, rpc));
  return caller;
}

// The store's id of the session a client names in a new session: its own id,
// checked, or a generated one; scoped to its tenant. A tenant at its
// max_sessions gets RESOURCE_EXHAUSTED.
absl::StatusOr<std::string> NewSessionId(const Caller& caller, const std::string& requested) {
  if (!requested.empty() && !IsValidSessionId(requested)) {
    return absl::InvalidArgumentError(
        "session_id: expected 1-128 characters of [A-Za-z0-9._:-] (or empty to have one "
        "generated)");
  }
  if (caller.tenant.empty()) return requested;  // open: the store generates one
  return ScopedSessionId(caller, requested.empty() ? GenerateSessionId() : requested);
}

// The store's id of an existing session a client names. An id with a '/' is
// no client's (it would name another tenant's namespace): NOT_FOUND.
absl::StatusOr<std::string> StoreIdOf(const Caller& caller, const std::string& session_id) {
  if (session_id.find('/') != std::string::npos) {
    return absl::NotFoundError(absl::StrCat("session '", session_id, "' not found"));
  }
  return ScopedSessionId(caller, session_id);
}

}  // namespace

// Creates the session `store_id` of the caller's tenant (with the turns
// `populate` runs), within the tenant's max_sessions, and counts a refusal by
// either limit in kvlingo_rejected_total once, here. The tenant's sessions
// are counted and created under its creation mutex: on this replica no
// creation slips between; across replicas (a shared store) two creations at
// once may both pass the count.
absl::StatusOr<SessionView> CreateForCaller(const ServiceDeps& deps, const Caller& caller,
                                            const std::string& store_id, std::string prompt,
                                            std::vector<int64_t> preamble,
                                            const Sessions::Populate& populate) {
  auto create = [&]() -> absl::StatusOr<SessionView> {
    // Create's own ResourceExhausted is the server's limits.max_sessions; a
    // populating turn's is the turn's (the router counts those).
    bool populate_failed = false;
    Sessions::Populate watched;
    if (populate) {
      watched = [&](const std::string& session_id, std::vector<TurnRecord>* turns) {
        absl::Status s = populate(session_id, turns);
        populate_failed = !s.ok();
        return s;
      };
    }
    absl::StatusOr<SessionView> created =
        deps.sessions->Create(store_id, std::move(prompt), std::move(preamble), watched);
    if (absl::IsResourceExhausted(created.status()) && !populate_failed) {
      deps.metrics->OnRejected("max_sessions");
    }
    return created;
  };
  const int64_t limit = caller.tenant.empty() ? 0 : deps.auth->LimitsOf(caller.tenant).max_sessions;
  if (limit <= 0) return create();
  std::lock_guard<std::mutex> lock(deps.auth->CreationMutex(caller.tenant));
  absl::StatusOr<int64_t> held = deps.sessions->Count(absl::StrCat(caller.tenant, "/"));
  if (!held.ok()) return held.status();
  if (*held >= limit) {
    deps.metrics->OnRejected("tenant_max_sessions");
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant '", caller.tenant, "' holds ", *held, " sessions (auth.tenants.", caller.tenant,
        ".max_sessions = ", limit, "); delete sessions or wait for idle ones to expire"));
  }
  return create();
}

// `status` as the caller sees it: store ids ("<tenant>/<id>") in its message
// become the client's own ids.
absl::Status ForClient(const std::string& tenant, const absl::Status& status) {
  if (tenant.empty() || status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrReplaceAll(status.message(), {{absl::StrCat(tenant, "/"), ""}}));
}

absl::Status ForClient(const absl::StatusOr<Caller>& caller, const absl::Status& status) {
  return caller.ok() ? ForClient(caller->tenant, status) : status;
}

namespace {

// Runs `work` on the session pool, then finishes the call with its status
// (store ids made the client's): `work` may block on the session store, which
// gRPC's callback threads must never do. The call stays valid until then.
template <class Call>
void FinishOffThread(Call* call, const ServiceDeps& deps, std::string tenant,
                     std::function<absl::Status()> work) {
  deps.session_pool->Submit([call, tenant = std::move(tenant), work = std::move(work)] {
    call->Finish(ForClient(tenant, work()));
  });
}

// The header a load balancer routes a session's calls by (x-kvl-session-id,
// deploy/cluster): when a call carries it, it must name the call's session,
// or the call may have been routed to a replica by another session's key.
absl::Status CheckSessionHeader(const grpc::CallbackServerContext* context,
                                const std::string& session_id) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("x-kvl-session-id");
  if (it == metadata.end()) return absl::OkStatus();
  const std::string header(it->second.data(), it->second.size());
  if (header == session_id) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "x-kvl-session-id: the header names session '", header, "' but the request's session_id is '",
      session_id, "'; send the request's own session id (load balancers route on the header)"));
}

// A turn's response events, as recorded in the session store for replay:
// length-delimited ChatResponse messages.
std::string EncodeEvents(const std::vector<ChatResponse>& events) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    for (const ChatResponse& e : events) {
      google::protobuf::util::SerializeDelimitedToZeroCopyStream(e, &stream);
    }
  }
  return out;
}

absl::StatusOr<std::vector<ChatResponse>> DecodeEvents(const std::string& data) {
  google::protobuf::io::ArrayInputStream stream(data.data(), static_cast<int>(data.size()));
  std::vector<ChatResponse> events;
  for (;;) {
    ChatResponse e;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&e, &stream, &clean_eof)) {
      if (clean_eof) break;
      return absl::DataLossError("the stored events of the turn are malformed");
    }
    events.push_back(std::move(e));
  }
  return events;
}

void ToProto(const ServiceDeps& deps, const SessionView& view, kvlingo::v1::Session* out) {
  out->set_session_id(view.session_id);
  out->set_system_prompt(view.system_prompt);
  out->set_created_unix_seconds(view.created_unix_seconds);
  out->set_last_active_unix_seconds(view.last_active_unix_seconds);
  out->set_turns(static_cast<uint32_t>(view.state.turns));
  out->set_history_tokens(static_cast<uint32_t>(view.state.history.size()));
  if (deps.router == nullptr) return;
  const std::vector<std::string>& names = deps.router->model_names();
  if (view.state.last_model >= 0) out->set_last_model(names[view.state.last_model]);
  for (const CacheLineInfo& line : view.lines) {
    kvlingo::v1::CacheLine* l = out->add_cache_lines();
    l->set_model(names[line.model]);
    l->set_tokens(static_cast<uint32_t>(line.tokens));
    l->set_bytes(static_cast<uint64_t>(line.bytes));
    l->set_evicted(line.evicted);
    l->set_translated_tokens(static_cast<uint32_t>(line.translated_tokens));
    l->set_repaired_tokens(static_cast<uint64_t>(line.repaired_tokens));
    for (const LineSpanInfo& span : line.spans) {
      kvlingo::v1::CacheSpan* sp = l->add_spans();
      sp->set_begin(static_cast<uint32_t>(span.begin));
      sp->set_end(static_cast<uint32_t>(span.end));
      switch (span.provenance) {
        case SpanProvenance::kNative:
          sp->set_provenance(kvlingo::v1::SPAN_PROVENANCE_NATIVE);
          break;
        case SpanProvenance::kTranslated:
          sp->set_provenance(kvlingo::v1::SPAN_PROVENANCE_TRANSLATED);
          if (span.source >= 0) sp->set_source_model(names[span.source]);
          break;
        case SpanProvenance::kRepaired:
          sp->set_provenance(kvlingo::v1::SPAN_PROVENANCE_REPAIRED);
          break;
      }
    }
  }
}

kvlingo::v1::SwitchStrategy ToProto(router::Strategy s) {
  switch (s) {
    case router::Strategy::kTranslate:
      return kvlingo::v1::SWITCH_STRATEGY_TRANSLATE;
    case router::Strategy::kReprefill:
      return kvlingo::v1::SWITCH_STRATEGY_REPREFILL;
    case router::Strategy::kReprefillMissing:
      return kvlingo::v1::SWITCH_STRATEGY_REPREFILL_MISSING;
  }
  return kvlingo::v1::SWITCH_STRATEGY_UNSPECIFIED;
}

kvlingo::v1::CachePath ToProto(router::CachePath p) {
  switch (p) {
    case router::CachePath::kNative:
      return kvlingo::v1::CACHE_PATH_NATIVE;
    case router::CachePath::kTranslated:
      return kvlingo::v1::CACHE_PATH_TRANSLATED;
    case router::CachePath::kReprefill:
      return kvlingo::v1::CACHE_PATH_REPREFILL;
    case router::CachePath::kRestored:
      return kvlingo::v1::CACHE_PATH_RESTORED;
    case router::CachePath::kNativeTail:
      return kvlingo::v1::CACHE_PATH_NATIVE_TAIL;
    case router::CachePath::kHybrid:
      return kvlingo::v1::CACHE_PATH_HYBRID;
  }
  return kvlingo::v1::CACHE_PATH_UNSPECIFIED;
}

kvlingo::v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStopToken:
      return kvlingo::v1::FINISH_REASON_STOP;
    case FinishReason::kStopString:
      return kvlingo::v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kLength:
      return kvlingo::v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      break;
  }
  return kvlingo::v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

// The tokens `system_prompt` renders to, after checking it
// (ValidateSystemPrompt against the smallest loaded model's context).
absl::Status PreambleOf(const ServiceDeps& deps, const std::string& system_prompt,
                        std::vector<int64_t>* preamble) {
  int64_t context_tokens = 0;
  if (deps.router != nullptr) {
    *preamble = deps.router->RenderPreamble(system_prompt);
    for (int m = 0; m < deps.router->n_models(); ++m) {
      const int64_t c = deps.router->model(m).engine->config().max_position_embeddings;
      context_tokens = context_tokens == 0 ? c : std::min(context_tokens, c);
    }
  }
  return ValidateSystemPrompt(system_prompt, deps.limits, static_cast<int64_t>(preamble->size()),
                              context_tokens);
}

// What the session store keeps of a turn, before Sessions::Record adds the
// tokens and ledger.
TurnRecord RecordOf(const router::Router& router, const std::string& request_id,
                    const std::string& user_message, const router::TurnResult& result,
                    std::string events) {
  TurnRecord record;
  record.request_id = request_id;
  record.user_message = user_message;
  record.reply = result.text;
  record.model = router.model_names()[result.routing.model];
  record.finish_reason = kvlingo::v1::FinishReason_Name(ToProto(result.finish_reason));
  record.events = std::move(events);
  return record;
}

namespace {

ChatResponse SummaryOf(const router::TurnResult& result) {
  ChatResponse r;
  kvlingo::v1::TurnSummary* s = r.mutable_summary();
  s->set_finish_reason(ToProto(result.finish_reason));
  s->set_time_to_first_token_seconds(result.time_to_first_token_seconds);
  s->set_prefill_tokens(static_cast<uint32_t>(result.prefill_tokens));
  s->set_generated_tokens(static_cast<uint32_t>(result.generated_tokens));
  s->set_history_tokens(static_cast<uint32_t>(result.history_tokens));
  kvlingo::v1::TimingBreakdown* t = s->mutable_timing();
  t->set_queue_seconds(result.queue_seconds);
  t->set_switch_seconds(result.switch_seconds);
  t->set_prefill_seconds(result.prefill_seconds);
  t->set_decode_seconds(result.decode_seconds);
  t->set_total_seconds(result.total_seconds);
  return r;
}

// How close to a Chat call's deadline a cancellation counts as the deadline
// passing (ChatServiceImpl::Chat).
constexpr std::chrono::milliseconds kDeadlineMargin{100};

// One Chat stream. It owns its slot in the drain gate from construction to
// OnDone, so that shutdown waits for it.
//
// Writes: the turn thread queues responses (Enqueue) and finally a status
// (Complete); the reactor writes them one at a time (the callback API allows
// one write in flight) and finishes once the queue is drained. Decisions are
// taken under mu_, gRPC calls made outside it. Deletes itself in OnDone, which
// gRPC calls only after Finish, i.e. after the turn thread's last touch.
class ChatReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `admitted`: the caller took a slot in deps.chat_gate for this stream.
  ChatReactor(const ServiceDeps& deps, bool admitted) : deps_(deps), admitted_(admitted) {}

  // Ends the stream with `status` when nothing is queued; call once, instead
  // of Complete, before any Enqueue.
  void FinishWith(const absl::Status& status) {
    grpc::Status result = ToGrpcStatus(ForClient(tenant_, status));
    deps_.metrics->CountRpc(RpcMethod::kChat, result.error_code());
    Finish(std::move(result));
  }

  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  void Enqueue(ChatResponse response) {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return;
      queue_.push_back(std::move(response));
      start = !writing_;
      if (start) writing_ = true;
    }
    if (start) WriteNext();
  }

  // The turn's final status; the stream finishes after the queued writes.
  void Complete(const absl::Status& status) {
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      final_ = status;
      completed_ = true;
      finish = !writing_;
    }
    if (finish) FinishWith(status);
  }

  void OnWriteDone(bool ok) override {
    bool finish = false, next = false;
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        broken_ = true;
        cancelled_ = true;
        queue_.clear();
      }
      if (!queue_.empty()) {
        next = true;
      } else {
        writing_ = false;
        finish = completed_;
        status = final_;
      }
    }
    if (next) {
      WriteNext();
    } else if (finish) {
      FinishWith(status);
    }
  }

  void OnCancel() override { cancelled_ = true; }

  // The stream holds one of `tenant`'s concurrent turns until it is done.
  void HoldTenantTurn(std::string tenant) {
    tenant_turn_ = true;
    tenant_ = std::move(tenant);
  }

  void OnDone() override {
    if (admitted_) deps_.chat_gate->Exit();
    if (tenant_turn_) deps_.auth->EndTurn(tenant_);
    delete this;
  }

 private:
  void WriteNext() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = std::move(queue_.front());
      queue_.pop_front();
    }
    // The method is registered raw (services.h): the reactor writes bytes.
    bool own_buffer = false;
    current_bytes_.Clear();
    const grpc::Status serialized =
        grpc::SerializationTraits<ChatResponse>::Serialize(current_, &current_bytes_, &own_buffer);
    TORCH_CHECK(serialized.ok(), "serializing a ChatResponse: ", serialized.error_message());
    StartWrite(&current_bytes_);
  }

  ServiceDeps deps_;
  bool admitted_;
  bool tenant_turn_ = false;
  std::string tenant_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::deque<ChatResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_ ABSL_GUARDED_BY(mu_);
  ChatResponse current_;            // the write in flight
  grpc::ByteBuffer current_bytes_;  // current_, serialized
};

}  // namespace

grpc::ServerUnaryReactor* SessionServiceImpl::CreateSession(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::CreateSessionRequest, kvlingo::v1::Session>(
      context, request, response, deps_.metrics, RpcMethod::kCreateSession,
      [this](auto* call) { HandleCreateSession(call); });
}

void SessionServiceImpl::HandleCreateSession(
    UnaryCall<kvlingo::v1::CreateSessionRequest, kvlingo::v1::Session>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::CreateSessionRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::Session* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kChat, "CreateSession");
  std::vector<int64_t> preamble;
  absl::Status valid = caller.status();
  if (valid.ok()) valid = PreambleOf(deps_, request->system_prompt(), &preamble);
  if (valid.ok() && !request->session_id().empty()) {
    valid = CheckSessionHeader(context, request->session_id());
  }
  absl::StatusOr<std::string> id =
      valid.ok() ? NewSessionId(*caller, request->session_id()) : valid;
  if (!id.ok()) {
    call->Finish(ForClient(caller, id.status()));
    return;
  }
  FinishOffThread(call, deps_, caller->tenant,
                  [deps = deps_, caller = *caller, id = *id, request, response,
                   preamble = std::move(preamble)]() mutable -> absl::Status {
                    absl::StatusOr<SessionView> created = CreateForCaller(
                        deps, caller, id, request->system_prompt(), std::move(preamble));
                    if (!created.ok()) return created.status();
                    ToProto(deps, *created, response);
                    response->set_session_id(ClientSessionId(caller, created->session_id));
                    deps.metrics->SetCacheStats(deps.sessions->CacheStats());
                    SPDLOG_DEBUG("session {} created", created->session_id);
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* SessionServiceImpl::GetSession(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::GetSessionRequest, kvlingo::v1::Session>(
      context, request, response, deps_.metrics, RpcMethod::kGetSession,
      [this](auto* call) { HandleGetSession(call); });
}

void SessionServiceImpl::HandleGetSession(
    UnaryCall<kvlingo::v1::GetSessionRequest, kvlingo::v1::Session>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::GetSessionRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::Session* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kChat, "GetSession");
  absl::Status header =
      caller.ok() ? CheckSessionHeader(context, request->session_id()) : caller.status();
  absl::StatusOr<std::string> id = header.ok() ? StoreIdOf(*caller, request->session_id()) : header;
  if (!id.ok()) {
    call->Finish(ForClient(caller, id.status()));
    return;
  }
  FinishOffThread(call, deps_, caller->tenant,
                  [deps = deps_, id = *id, request, response]() -> absl::Status {
                    absl::StatusOr<SessionView> view = deps.sessions->View(id);
                    if (!view.ok()) return view.status();
                    ToProto(deps, *view, response);
                    response->set_session_id(request->session_id());
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* SessionServiceImpl::ListSessions(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::ListSessionsRequest, kvlingo::v1::ListSessionsResponse>(
      context, request, response, deps_.metrics, RpcMethod::kListSessions,
      [this](auto* call) { HandleListSessions(call); });
}

void SessionServiceImpl::HandleListSessions(
    UnaryCall<kvlingo::v1::ListSessionsRequest, kvlingo::v1::ListSessionsResponse>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::ListSessionsRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::ListSessionsResponse* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kChat, "ListSessions");
  if (!caller.ok()) {
    call->Finish(caller.status());
    return;
  }
  FinishOffThread(call, deps_, caller->tenant,
                  [deps = deps_, caller = *caller, request, response]() -> absl::Status {
                    // The caller's tenant's sessions; with auth off, every session.
                    absl::StatusOr<SessionPage> page =
                        deps.sessions->List(request->page_size(), request->page_token(),
                                            caller.tenant.empty() ? "" : caller.tenant + "/");
                    if (!page.ok()) return page.status();
                    for (const SessionView& view : page->sessions) {
                      kvlingo::v1::Session* session = response->add_sessions();
                      ToProto(deps, view, session);
                      session->set_session_id(ClientSessionId(caller, view.session_id));
                    }
                    response->set_next_page_token(page->next_page_token);
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* SessionServiceImpl::DeleteSession(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::DeleteSessionRequest, kvlingo::v1::DeleteSessionResponse>(
      context, request, response, deps_.metrics, RpcMethod::kDeleteSession,
      [this](auto* call) { HandleDeleteSession(call); });
}

void SessionServiceImpl::HandleDeleteSession(
    UnaryCall<kvlingo::v1::DeleteSessionRequest, kvlingo::v1::DeleteSessionResponse>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::DeleteSessionRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::DeleteSessionResponse* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kChat, "DeleteSession");
  absl::Status status = caller.status();
  if (status.ok()) status = CheckSessionHeader(context, request->session_id());
  absl::StatusOr<std::string> id = status.ok() ? StoreIdOf(*caller, request->session_id()) : status;
  if (!id.ok()) {
    call->Finish(ForClient(caller, id.status()));
    return;
  }
  FinishOffThread(call, deps_, caller->tenant, [deps = deps_, id = *id]() -> absl::Status {
    absl::Status removed = deps.sessions->Remove(id);
    if (!removed.ok()) return removed;
    deps.metrics->SetCacheStats(deps.sessions->CacheStats());
    SPDLOG_DEBUG("session {} deleted", id);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* SessionServiceImpl::GetTranscript(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::GetTranscriptRequest, kvlingo::v1::Transcript>(
      context, request, response, deps_.metrics, RpcMethod::kGetTranscript,
      [this](auto* call) { HandleGetTranscript(call); });
}

void SessionServiceImpl::HandleGetTranscript(
    UnaryCall<kvlingo::v1::GetTranscriptRequest, kvlingo::v1::Transcript>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::GetTranscriptRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::Transcript* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kChat, "GetTranscript");
  absl::Status status = caller.status();
  if (status.ok()) status = CheckSessionHeader(context, request->session_id());
  absl::StatusOr<std::string> id = status.ok() ? StoreIdOf(*caller, request->session_id()) : status;
  if (!id.ok()) {
    call->Finish(ForClient(caller, id.status()));
    return;
  }
  FinishOffThread(
      call, deps_, caller->tenant, [deps = deps_, id = *id, request, response]() -> absl::Status {
        absl::StatusOr<SessionRecord> record = deps.sessions->Transcript(id);
        if (!record.ok()) return record.status();
        response->set_session_id(request->session_id());
        response->set_system_prompt(record->system_prompt);
        response->set_created_unix_seconds(record->created_unix_seconds);
        for (const TurnRecord& t : record->turns) {
          kvlingo::v1::TranscriptTurn* turn = response->add_turns();
          turn->set_request_id(t.request_id);
          turn->set_user_message(t.user_message);
          turn->set_reply(t.reply);
          turn->set_model(t.model);
          kvlingo::v1::FinishReason reason = kvlingo::v1::FINISH_REASON_UNSPECIFIED;
          kvlingo::v1::FinishReason_Parse(t.finish_reason, &reason);
          turn->set_finish_reason(reason);
          turn->set_committed_unix_seconds(t.unix_seconds);
          turn->set_history_tokens(static_cast<uint32_t>(t.history_begin + t.tokens.size()));
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SessionServiceImpl::ImportSession(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::ImportSessionRequest, kvlingo::v1::Session>(
      context, request, response, deps_.metrics, RpcMethod::kImportSession,
      [this](auto* call) { HandleImportSession(call); });
}

void SessionServiceImpl::HandleImportSession(
    UnaryCall<kvlingo::v1::ImportSessionRequest, kvlingo::v1::Session>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::ImportSessionRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::Session* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kImport, "ImportSession");
  auto finish = [call, tenant = caller.ok() ? caller->tenant : std::string()](
                    const absl::Status& status) { call->Finish(ForClient(tenant, status)); };
  if (!caller.ok()) {
    finish(caller.status());
    return;
  }
  if (deps_.router == nullptr) {
    finish(absl::UnimplementedError(
        "no models are loaded: the server was started without models, so it cannot read an "
        "imported conversation"));
    return;
  }
  std::vector<int64_t> preamble;
  absl::Status valid = PreambleOf(deps_, request->system_prompt(), &preamble);
  if (valid.ok() && !request->session_id().empty()) {
    valid = CheckSessionHeader(context, request->session_id());
  }
  absl::StatusOr<std::vector<ImportTurn>> turns =
      valid.ok() ? ParseImportTurns(*request, deps_.limits, deps_.router->model_names(),
                                    deps_.router->config().policy.default_model)
                 : absl::StatusOr<std::vector<ImportTurn>>(valid);
  absl::StatusOr<std::string> id =
      turns.ok() ? NewSessionId(*caller, request->session_id()) : turns.status();
  if (!id.ok()) {
    finish(id.status());
    return;
  }
  // On the turn pool: the import runs its turns (model work) on the session
  // staged by Sessions::Create, which records the session with all its turns
  // at once; a turn that fails leaves no session anywhere.
  deps_.pool->Submit([deps = deps_, finish, response, context, id = *id, caller = *caller,
                      prompt = request->system_prompt(), preamble = std::move(preamble),
                      turns = *std::move(turns)]() mutable {
    auto populate = [&](const std::string& session_id,
                        std::vector<TurnRecord>* records) -> absl::Status {
      for (size_t i = 0; i < turns.size(); ++i) {
        router::TurnOptions options;
        options.user_message = turns[i].user_message;
        options.policy = router::Policy::kExplicit;
        options.explicit_model = turns[i].model;
        options.reply = turns[i].reply;
        options.on_commit = [&](const ConversationState& before, const ConversationState& after,
                                const router::TurnResult& result) {
          records->push_back(deps.sessions->CompleteTurn(
              before, after,
              RecordOf(*deps.router, "", options.user_message, result, std::string())));
          return absl::OkStatus();
        };
        options.cancelled = [context] { return context->IsCancelled(); };
        absl::StatusOr<router::TurnResult> read = deps.router->RunTurn(session_id, options, {});
        if (!read.ok()) {
          // The router's setting (router::SettingOf) travels on for ToGrpcStatus.
          absl::Status named(read.status().code(),
                             absl::StrCat("turns[", i, "]: ", read.status().message()));
          read.status().ForEachPayload([&named](absl::string_view url, const absl::Cord& payload) {
            named.SetPayload(url, payload);
          });
          return named;
        }
      }
      return absl::OkStatus();
    };
    absl::StatusOr<SessionView> created =
        CreateForCaller(deps, caller, id, prompt, std::move(preamble), populate);
    deps.metrics->SetCacheStats(deps.sessions->CacheStats());
    if (created.ok()) {
      ToProto(deps, *created, response);
      response->set_session_id(ClientSessionId(caller, created->session_id));
      SPDLOG_DEBUG("session {} imported ({} turns)", created->session_id, turns.size());
    }
    finish(created.status());
  });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ChatServiceImpl::Chat(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  const auto received = std::chrono::steady_clock::now();
  const DrainGate::Admission admission = deps_.chat_gate->TryEnter(deps_.max_concurrent_streams);
  auto* reactor = new ChatReactor(deps_, admission == DrainGate::Admission::kAdmitted);
  if (admission == DrainGate::Admission::kDraining) {
    reactor->FinishWith(
        absl::UnavailableError("the server is shutting down; retry on another replica"));
    return reactor;
  }
  if (admission == DrainGate::Admission::kFull) {
    deps_.metrics->OnRejected("max_concurrent_streams");
    reactor->FinishWith(absl::ResourceExhaustedError(absl::StrCat(
        deps_.max_concurrent_streams,
        " chat streams are in progress (limits.max_concurrent_streams); retry later or on "
        "another replica")));
    return reactor;
  }
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kChat, "Chat");
  if (!caller.ok()) {
    reactor->FinishWith(caller.status());
    return reactor;
  }
  kvlingo::v1::ChatRequest parsed;
  if (absl::Status s = ParseRequest(*raw_request, &parsed); !s.ok()) {
    reactor->FinishWith(s);
    return reactor;
  }
  const kvlingo::v1::ChatRequest* request = &parsed;
  static const std::vector<std::string> kNoModels;
  absl::StatusOr<TurnRequest> turn = ParseChatRequest(
      *request, deps_.limits, deps_.router != nullptr ? deps_.router->model_names() : kNoModels);
  if (!turn.ok()) {
    reactor->FinishWith(turn.status());
    return reactor;
  }
  if (absl::Status s = CheckSessionHeader(context, turn->session_id); !s.ok()) {
    reactor->FinishWith(s);
    return reactor;
  }
  turn->session_id = ScopedSessionId(*caller, turn->session_id);
  if (absl::Status s = deps_.auth->BeginTurn(caller->tenant); !s.ok()) {
    deps_.metrics->OnRejected("tenant_max_concurrent_turns");
    reactor->FinishWith(s);
    return reactor;
  }
  reactor->HoldTenantTurn(caller->tenant);
  if (deps_.router == nullptr) {
    // An unknown session is still NOT_FOUND (the store is read off gRPC's
    // threads).
    deps_.session_pool->Submit([deps = deps_, reactor, session_id = turn->session_id] {
      absl::Status known = deps.sessions->View(session_id).status();
      reactor->FinishWith(
          known.ok() ? absl::UnimplementedError("no models are loaded: the server was started "
                                                "without models (config 'models' is empty), so it "
                                                "only manages sessions")
                     : known);
    });
    return reactor;
  }
  if (absl::Status s = deps_.router->ValidateTurn(turn->options); !s.ok()) {
    reactor->FinishWith(s);
    return reactor;
  }
  router::TurnOptions options = std::move(turn->options);
  options.received = received;
  const std::chrono::system_clock::time_point deadline = context->deadline();
  options.cancelled = [reactor, deadline] {
    return reactor->cancelled() || std::chrono::system_clock::now() > deadline;
  };

  deps_.pool->Submit([deps = deps_, reactor, deadline, options = std::move(options),
                      session_id = turn->session_id, request_id = turn->request_id]() mutable {
    // The session as committed in the store, on this replica; or the turn
    // this request id already committed, replayed.
    absl::StatusOr<std::optional<TurnRecord>> prepared =
        deps.sessions->Prepare(session_id, request_id);
    if (!prepared.ok()) {
      if (absl::IsUnavailable(prepared.status())) {
        spdlog::warn("session {}: {}", session_id, prepared.status().ToString());
      }
      reactor->Complete(prepared.status());
      return;
    }
    if (prepared->has_value()) {
      absl::StatusOr<std::vector<ChatResponse>> events = DecodeEvents((*prepared)->events);
      if (!events.ok()) {
        reactor->Complete(events.status());
        return;
      }
      for (ChatResponse& e : *events) {
        if (e.has_routing()) e.mutable_routing()->set_replayed(true);
        if (e.has_summary()) e.mutable_summary()->set_replayed(true);
        reactor->Enqueue(std::move(e));
      }
      SPDLOG_DEBUG("session {}: replayed request {}", session_id, request_id);
      reactor->Complete(absl::OkStatus());
      return;
    }
    // Every event streamed, for the store's record of the turn (replays).
    std::vector<ChatResponse> streamed;
    ChatResponse summary;
    options.on_commit = [&](const ConversationState& before, const ConversationState& after,
                            const router::TurnResult& result) {
      router::TurnResult final_result = result;
      final_result.total_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - options.received)
              .count();
      summary = SummaryOf(final_result);
      std::vector<ChatResponse> events = streamed;
      events.push_back(summary);
      return deps.sessions->Record(
          session_id, before, after,
          RecordOf(*deps.router, request_id, options.user_message, result, EncodeEvents(events)));
    };
    router::TurnCallbacks callbacks;
    callbacks.on_routing = [&](const router::RoutingEvent& ev) {
      ChatResponse r;
      kvlingo::v1::RoutingDecision* d = r.mutable_routing();
      const auto& names = deps.router->model_names();
      d->set_model(names[ev.model]);
      if (ev.previous_model >= 0) d->set_previous_model(names[ev.previous_model]);
      d->set_policy(router::PolicyName(ev.policy));
      d->set_reason(ev.reason);
      d->set_switched(ev.switched);
      d->set_strategy(ev.switched ? ToProto(ev.strategy)
                                  : kvlingo::v1::SWITCH_STRATEGY_UNSPECIFIED);
      d->set_path(ToProto(ev.path));
      d->set_spans_translated(static_cast<uint32_t>(ev.spans_translated));
      d->set_tokens_translated(static_cast<uint32_t>(ev.tokens_translated));
      d->set_tokens_reprefilled(static_cast<uint32_t>(ev.tokens_reprefilled));
      d->set_translation_seconds(ev.translation_seconds);
      d->set_native_layers(static_cast<uint32_t>(ev.native_layers));
      streamed.push_back(r);
      reactor->Enqueue(std::move(r));
    };
    callbacks.on_token = [&](int64_t id, std::string_view text) {
      ChatResponse r;
      kvlingo::v1::TokenDelta* delta = r.mutable_delta();
      delta->set_text(std::string(text));
      if (id >= 0) delta->add_token_ids(static_cast<uint32_t>(id));
      streamed.push_back(r);
      reactor->Enqueue(std::move(r));
    };
    absl::StatusOr<router::TurnResult> result =
        deps.router->RunTurn(session_id, options, callbacks);
    deps.metrics->SetCacheStats(deps.sessions->CacheStats());
    if (!result.ok()) {
      if (result.status().code() != absl::StatusCode::kCancelled) {
        spdlog::warn("session {}: turn failed: {}", session_id, result.status().ToString());
      }
      // A turn stopped by its deadline (not by the client) says so, in the
      // status and in kvlingo_grpc_requests_total. gRPC reports an expired
      // deadline through OnCancel too, and the client's own deadline timer
      // may cancel the call a little before the server's copy of the
      // deadline passes: a cancellation found within kDeadlineMargin of the
      // deadline counts as the deadline.
      if (result.status().code() == absl::StatusCode::kCancelled &&
          std::chrono::system_clock::now() >= deadline - kDeadlineMargin) {
        reactor->Complete(absl::DeadlineExceededError(
            "the call's deadline passed; the turn was stopped and the session left unchanged"));
        return;
      }
      reactor->Complete(result.status());
      return;
    }
    deps.metrics->OnTurnDone(*result);
    // The summary as recorded in the store (a replay sends the same one).
    reactor->Enqueue(std::move(summary));
    reactor->Complete(absl::OkStatus());
  });
  return reactor;
}

grpc::ServerUnaryReactor* ModelServiceImpl::ListModels(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::ListModelsRequest, kvlingo::v1::ListModelsResponse>(
      context, request, response, deps_.metrics, RpcMethod::kListModels,
      [this](auto* call) { HandleListModels(call); });
}

void ModelServiceImpl::HandleListModels(
    UnaryCall<kvlingo::v1::ListModelsRequest, kvlingo::v1::ListModelsResponse>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::ListModelsRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::ListModelsResponse* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kModels, "ListModels");
  if (!caller.ok()) {
    call->Finish(caller.status());
    return;
  }
  if (deps_.router != nullptr) {
    for (int i = 0; i < deps_.router->n_models(); ++i) {
      const router::LoadedModel& m = deps_.router->model(i);
      const ModelConfig& c = m.engine->config();
      kvlingo::v1::ModelInfo* info = response->add_models();
      info->set_name(m.name);
      info->set_architecture(c.architecture_name);
      info->set_path(m.path);
      info->set_n_layer(static_cast<uint32_t>(c.n_layer));
      info->set_hidden_size(static_cast<uint32_t>(c.hidden_size));
      info->set_n_head(static_cast<uint32_t>(c.n_head));
      info->set_n_kv_head(static_cast<uint32_t>(c.n_head_kv));
      info->set_head_dim(static_cast<uint32_t>(c.head_dim));
      info->set_vocab_size(static_cast<uint32_t>(c.vocab_size));
      info->set_n_params(static_cast<uint64_t>(c.ParameterCount()));
      info->set_dtype(DTypeName(m.engine->options().dtype));
      info->set_cache_bytes_per_token(static_cast<uint64_t>(deps_.router->BytesPerToken(i)));
    }
  }
  call->Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* ModelServiceImpl::ListTranslators(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return UnaryDispatch<kvlingo::v1::ListTranslatorsRequest, kvlingo::v1::ListTranslatorsResponse>(
      context, request, response, deps_.metrics, RpcMethod::kListTranslators,
      [this](auto* call) { HandleListTranslators(call); });
}

void ModelServiceImpl::HandleListTranslators(
    UnaryCall<kvlingo::v1::ListTranslatorsRequest, kvlingo::v1::ListTranslatorsResponse>* call) {
  grpc::CallbackServerContext* context = call->context;
  [[maybe_unused]] const kvlingo::v1::ListTranslatorsRequest* request = &call->request;
  [[maybe_unused]] kvlingo::v1::ListTranslatorsResponse* response = &call->response;
  absl::StatusOr<Caller> caller = Authorize(deps_, context, Right::kModels, "ListTranslators");
  if (!caller.ok()) {
    call->Finish(caller.status());
    return;
  }
  if (deps_.router != nullptr) {
    for (const router::LoadedTranslator& t : deps_.router->translators()) {
      kvlingo::v1::TranslatorInfo* info = response->add_translators();
      const TranslatorSpec& spec = t.translator->spec();
      info->set_name(t.name);
      info->set_source(deps_.router->model_names()[t.source]);
      info->set_target(deps_.router->model_names()[t.target]);
      info->set_assignment(spec.assignment_kind);
      info->set_band(static_cast<uint32_t>(spec.band));
      info->set_inputs(MapInputsName(spec.inputs));
      int64_t n_params = 0;
      for (const TranslatorMaps* maps : {&t.translator->key_maps(), &t.translator->value_maps()}) {
        for (const at::Tensor& w : maps->weight) n_params += w.numel();
        for (const at::Tensor& b : maps->bias) n_params += b.numel();
      }
      info->set_n_params(static_cast<uint64_t>(n_params));
      info->set_training(spec.training.method);
      info->set_path(t.path);
      info->set_compute_dtype(DTypeName(t.translator->compute_dtype()));
    }
  }
  call->Finish(absl::OkStatus());
}

}  // namespace kvl::server
