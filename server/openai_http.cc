#include "server/openai_http.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "router/config.h"
#include "server/openai_api.h"
#include "spdlog/spdlog.h"

namespace kvl::server {
namespace {

constexpr char kCompletionsRoute[] = "/v1/chat/completions";
constexpr char kModelsRoute[] = "/v1/models";
// How long a stream may stay silent before a comment line is written: a
// write is how a closed connection is noticed.
constexpr auto kKeepAlive = std::chrono::seconds(1);

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RandomHex(int n_bytes) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < n_bytes; ++i) {
    const uint64_t b = rng() & 0xff;
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::string SseFrame(const std::string& json) { return absl::StrCat("data: ", json, "\n\n"); }

// An address as httplib's Request spells it ("127.0.0.1", "::1") and a port.
bool SameEndpoint(const sockaddr_storage& a, const std::string& ip, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  int got_port = -1;
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    got_port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof text);
    got_port = ntohs(in->sin6_port);
  } else {
    return false;
  }
  return got_port == port && ip == text;
}

// The socket of the request's connection, or -1. cpp-httplib 0.11 does not
// hand it to handlers, so it is found among the process's descriptors by its
// two ends (Linux). It stays open while the handler runs.
int ConnectionSocket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof peer, local_len = sizeof local;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    if (SameEndpoint(peer, req.remote_addr, req.remote_port) &&
        SameEndpoint(local, req.local_addr, req.local_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// Whether the client has closed the connection: it sent its whole request
// and waits, so a read that would not block finds the end of the stream.
bool ClientGone(int fd) {
  if (fd < 0) return false;
  char byte;
  return recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// One request's results, handed from its turn (on the turn pool) to its HTTP
// thread.
struct Exchange {
  std::mutex mu;
  std::condition_variable changed;
  std::deque<std::string> frames;  // SSE frames not yet written
  bool started = false;            // the routing decision is known: the stream may begin
  bool finished = false;
  absl::Status error;  // finished before it started: the response is this error
  std::string body;    // a non-streamed response
  std::atomic<bool> cancelled{false};
  // The X-Kvl-Timeout-Ms header's deadline, when the request has one.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  bool Expired() const { return deadline && std::chrono::steady_clock::now() >= *deadline; }

  void Push(std::string frame, bool start = false) {
    {
      std::lock_guard<std::mutex> lock(mu);
      frames.push_back(std::move(frame));
      started = started || start;
    }
    changed.notify_all();
  }
  void Finish(absl::Status status, std::string response_body = {}) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!status.ok() && !started) error = std::move(status);
      body = std::move(response_body);
      finished = true;
    }
    changed.notify_all();
  }
};

// A slot of the drain gate, and of the tenant's concurrent turns, held by a
// request until both its HTTP response and its turn are done.
struct Admission {
  DrainGate* gate = nullptr;
  Authenticator* auth = nullptr;
  std::string tenant;
  bool holds_turn = false;
  ~Admission() {
    if (holds_turn) auth->EndTurn(tenant);
    if (gate != nullptr) gate->Exit();
  }
};

}  // namespace

struct OpenAiHttpServer::Impl {
  ServiceDeps deps;
  OpenAiOptions options;
  PrefixIndex index;
  std::atomic<bool> stopping{false};

  Impl(const ServiceDeps& d, OpenAiOptions o)
      : deps(d), options(std::move(o)), index(options.max_conversations) {}

  void Reply(const httplib::Request& req, httplib::Response& res, const std::string& route,
             const absl::Status& status) {
    const ApiError e = ApiErrorOf(status);
    res.status = e.http_status;
    res.set_content(ApiErrorJson(e), "application/json");
    deps.metrics->CountHttpRequest(route, e.http_status);
  }

  absl::StatusOr<Caller> Authorize(const httplib::Request& req, Right right,
                                   absl::string_view what) {
    std::optional<std::string> authorization;
    if (req.has_header("Authorization")) {
      authorization = req.get_header_value("Authorization");
    } else if (deps.auth->enabled()) {
      return absl::UnauthenticatedError(
          "no credentials: send the API key as the header 'Authorization: Bearer <key>'");
    }
    absl::StatusOr<Caller> caller = deps.auth->Authenticate(authorization);
    if (!caller.ok()) return caller.status();
    if (absl::Status s = Authenticator::Require(*caller, right, what); !s.ok()) return s;
    return caller;
  }

  void Models(const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<Caller> caller = Authorize(req, Right::kModels, "GET /v1/models");
    if (!caller.ok()) return Reply(req, res, kModelsRoute, caller.status());
    res.set_content(ModelsJson(deps.router->model_names(), options.router_model, UnixNow()),
                    "application/json");
    deps.metrics->CountHttpRequest(kModelsRoute, 200);
  }

  void Completions(const httplib::Request& req, httplib::Response& res);
  // On the turn pool: finds the conversation's cached prefix, reads the turns
  // past it, answers the last message; reports to `ex`.
  void Serve(const Caller& caller, const CompletionRequest& request, int model,
             const std::shared_ptr<Exchange>& ex);
  // The conversation's session, held: the cached one holding the longest
  // prefix (*reused: its completed turns), forked when it went on past it, or
  // a new one (*reused = 0).
  absl::StatusOr<std::string> FindOrCreate(const Caller& caller, const CompletionRequest& request,
                                           const std::vector<PrefixIndex::Key>& keys,
                                           size_t* reused);
  // Enters the session under `key`, removing the sessions that pushes out.
  // The session has passed `keys` (the last its conversation now) and is
  // held no more; removes the sessions that pushes out of the index.
  void Publish(const std::vector<PrefixIndex::Key>& keys, const std::string& session_id);
};

absl::StatusOr<std::string> OpenAiHttpServer::Impl::FindOrCreate(
    const Caller& caller, const CompletionRequest& request,
    const std::vector<PrefixIndex::Key>& keys, size_t* reused) {
  *reused = 0;
  std::vector<int64_t> preamble;
  if (absl::Status s = PreambleOf(deps, request.system_prompt, &preamble); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("messages: the system messages: ", s.message()));
  }
  const std::string id = ScopedSessionId(caller, absl::StrCat("oai-", RandomHex(12)));
  const std::vector<PrefixIndex::Key> none;
  while (std::optional<PrefixIndex::Hit> hit = index.Take(request.use_prefix_cache ? keys : none)) {
    if (hit->head) {
      absl::StatusOr<std::optional<TurnRecord>> prepared =
          deps.sessions->Prepare(hit->session_id, "");
      if (prepared.ok()) {
        deps.metrics->OnPrefixLookup(true);
        *reused = hit->index;
        return hit->session_id;
      }
      if (!absl::IsNotFound(prepared.status())) {
        index.Release(hit->session_id);
        return prepared.status();
      }
      index.Forget(hit->session_id);  // expired or removed meanwhile
      continue;
    }
    // The session went on past this prefix (a regenerated or edited reply):
    // a new session gets its turns up to here and their cache.
    absl::StatusOr<SessionView> forked =
        CreateForCaller(deps, caller, id, request.system_prompt, preamble,
                        deps.sessions->ForkOf(hit->session_id, static_cast<int64_t>(hit->index)));
    index.Release(hit->session_id);
    if (forked.ok()) {
      deps.metrics->OnPrefixLookup(true);
      *reused = hit->index;
      return forked->session_id;
    }
    if (absl::IsNotFound(forked.status())) {
      index.Forget(hit->session_id);
      continue;
    }
    if (absl::IsResourceExhausted(forked.status())) return forked.status();
    spdlog::warn("prefix cache: forking {}: {}", hit->session_id, forked.status().ToString());
    break;  // prefill instead
  }
  deps.metrics->OnPrefixLookup(false);
  absl::StatusOr<SessionView> created =
      CreateForCaller(deps, caller, id, request.system_prompt, std::move(preamble));
  if (!created.ok()) return created.status();
  return created->session_id;
}

void OpenAiHttpServer::Impl::Publish(const std::vector<PrefixIndex::Key>& keys,
                                     const std::string& session_id) {
  const std::vector<std::string> removed = index.Put(keys, session_id);
  for (const std::string& id : removed) {
    absl::Status s = deps.sessions->Remove(id);
    if (!s.ok() && !absl::IsNotFound(s)) {
      spdlog::warn("prefix cache: removing session {}: {}", id, s.ToString());
    }
  }
  deps.metrics->OnPrefixEvictions(static_cast<int64_t>(removed.size()));
  deps.metrics->SetPrefixConversations(index.sessions());
}

void OpenAiHttpServer::Impl::Serve(const Caller& caller, const CompletionRequest& request,
                                   int model, const std::shared_ptr<Exchange>& ex) {
  const auto received = std::chrono::steady_clock::now();
  const router::Router& router = *deps.router;
  std::vector<PrefixIndex::Key> keys{PrefixIndex::Root(caller.tenant, request.system_prompt)};
  for (const CompletionRequest::Turn& t : request.history) {
    keys.push_back(PrefixIndex::Extend(keys.back(), t.user, t.assistant));
  }
  auto cancelled = [this, ex] { return ex->cancelled.load() || stopping.load() || ex->Expired(); };
  auto fail = [&](const absl::Status& status) {
    absl::Status shown = ForClient(caller.tenant, status);
    if (router::SettingOf(status) == router::Setting::kNativeLayers) {
      shown = absl::Status(shown.code(), absl::StrCat("kvlingo.native_layers: ", shown.message()));
    }
    if (absl::IsCancelled(status) && ex->Expired() && !ex->cancelled) {
      shown = absl::DeadlineExceededError(
          "the request's deadline (X-Kvl-Timeout-Ms) passed; the turn was stopped and the "
          "conversation left as it was");
    }
    bool started;
    {
      std::lock_guard<std::mutex> lock(ex->mu);
      started = ex->started;
    }
    if (started) {
      ex->Push(SseFrame(ApiErrorJson(ApiErrorOf(shown))));
      ex->Push("data: [DONE]\n\n");
    }
    ex->Finish(shown);
  };

  size_t reused = 0;
  absl::StatusOr<std::string> found = FindOrCreate(caller, request, keys, &reused);
  if (!found.ok()) return fail(found.status());
  const std::string session_id = *found;

  ServedPrompt served;
  served.reused_turns = static_cast<int64_t>(reused);
  served.request_turns = static_cast<int64_t>(request.history.size());
  served.conversation_id = ClientSessionId(caller, session_id);
  auto commit = [&](const std::string& user) {
    return
        [this, &session_id, &user](const ConversationState& before, const ConversationState& after,
                                   const router::TurnResult& result) {
          return deps.sessions->Record(session_id, before, after,
                                       RecordOf(*deps.router, "", user, result, std::string()));
        };
  };

  // The turns past the cached prefix, read (not sampled) by the model that
  // answers, or by the policy's default model for the router model.
  const int reader = model >= 0 ? model : router.config().policy.default_model;
  // The boundaries the session passes, from where it was found.
  std::vector<PrefixIndex::Key> passed{keys[reused]};
  for (size_t t = reused; t < request.history.size(); ++t) {
    router::TurnOptions options;
    options.user_message = request.history[t].user;
    options.reply = request.history[t].assistant;
    options.policy = router::Policy::kExplicit;
    options.explicit_model = reader;
    options.strategy = request.strategy;
    options.native_layers = request.native_layers;
    options.cancelled = cancelled;
    options.on_commit = commit(options.user_message);
    absl::StatusOr<router::TurnResult> read = deps.router->RunTurn(session_id, options, {});
    if (!read.ok()) {
      Publish(passed, session_id);
      return fail(absl::Status(read.status().code(),
                               absl::StrCat("messages (turn ", t, "): ", read.status().message())));
    }
    served.prefilled_tokens += read->prefill_tokens;
    served.translated_tokens += read->routing.tokens_translated;
    passed.push_back(keys[t + 1]);
  }

  // The request's own turn.
  router::TurnOptions options;
  options.user_message = request.user_message;
  if (model >= 0) {
    options.policy = router::Policy::kExplicit;
    options.explicit_model = model;
  }
  options.strategy = request.strategy;
  options.native_layers = request.native_layers;
  options.max_tokens = request.max_tokens;
  options.sampling = request.sampling;
  options.seed = request.seed;
  options.stop = request.stop;
  options.received = received;
  options.cancelled = cancelled;
  options.on_commit = commit(options.user_message);
  const std::string id = absl::StrCat("chatcmpl-", RandomHex(12));
  const int64_t created = UnixNow();
  router::TurnCallbacks callbacks;
  callbacks.on_routing = [&](const router::RoutingEvent& ev) {
    const auto& names = router.model_names();
    served.model = names[ev.model];
    served.previous_model = ev.previous_model >= 0 ? names[ev.previous_model] : "";
    served.policy = router::PolicyName(ev.policy);
    served.reason = ev.reason;
    served.switched = ev.switched;
    served.strategy = ev.switched ? router::StrategyName(ev.strategy) : "";
    served.path = router::CachePathName(ev.path);
    served.native_layers = ev.native_layers;
    if (request.stream)
      ex->Push(SseFrame(ChunkJson(id, created, served.model, DeltaJson("", true), "")), true);
  };
  callbacks.on_token = [&](int64_t, std::string_view text) {
    if (request.stream && !text.empty()) {
      ex->Push(SseFrame(ChunkJson(id, created, served.model, DeltaJson(text, false), "")));
    }
  };
  absl::StatusOr<router::TurnResult> result = deps.router->RunTurn(session_id, options, callbacks);
  deps.metrics->SetCacheStats(deps.sessions->CacheStats());
  if (!result.ok()) {
    Publish(passed, session_id);
    if (result.status().code() != absl::StatusCode::kCancelled) {
      spdlog::warn("OpenAI API, conversation {}: {}", session_id, result.status().ToString());
    }
    return fail(result.status());
  }
  passed.push_back(PrefixIndex::Extend(keys.back(), request.user_message, result->text));
  Publish(passed, session_id);

  router::TurnResult done = *result;
  done.total_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count();
  deps.metrics->OnTurnDone(done);
  served.prompt_tokens = done.prompt_tokens;
  served.prefilled_tokens += done.prefill_tokens;
  served.translated_tokens += done.routing.tokens_translated;
  served.own_cache_tokens = std::max<int64_t>(
      0, served.prompt_tokens - served.prefilled_tokens - served.translated_tokens);
  served.completion_tokens = done.generated_tokens;
  served.time_to_first_token_seconds = done.time_to_first_token_seconds;
  served.translation_seconds = done.routing.translation_seconds;
  deps.metrics->OnPromptTokens(done.routing.model, served.own_cache_tokens,
                               served.translated_tokens, served.prefilled_tokens);
  const std::string finish = OpenAiFinishReason(done.finish_reason);
  if (!request.stream) {
    ex->Finish(absl::OkStatus(), CompletionJson(id, created, served, done.text, finish));
    return;
  }
  ex->Push(SseFrame(ChunkJson(id, created, served.model, "{}", finish, &served)));
  if (request.include_usage) ex->Push(SseFrame(UsageChunkJson(id, created, served)));
  ex->Push("data: [DONE]\n\n");
  ex->Finish(absl::OkStatus());
}

void OpenAiHttpServer::Impl::Completions(const httplib::Request& req, httplib::Response& res) {
  auto admission = std::make_shared<Admission>();
  switch (deps.chat_gate->TryEnter(deps.max_concurrent_streams)) {
    case DrainGate::Admission::kDraining:
      return Reply(req, res, kCompletionsRoute,
                   absl::UnavailableError("the server is shutting down; retry on another replica"));
    case DrainGate::Admission::kFull:
      deps.metrics->OnRejected("max_concurrent_streams");
      return Reply(req, res, kCompletionsRoute,
                   absl::ResourceExhaustedError(absl::StrCat(
                       deps.max_concurrent_streams,
                       " requests are in progress (limits.max_concurrent_streams); retry later")));
    case DrainGate::Admission::kAdmitted:
      admission->gate = deps.chat_gate;
      break;
  }
  absl::StatusOr<Caller> caller = Authorize(req, Right::kChat, "POST /v1/chat/completions");
  if (!caller.ok()) return Reply(req, res, kCompletionsRoute, caller.status());
  // A deadline, as gRPC's: X-Kvl-Timeout-Ms from receipt.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (req.has_header("X-Kvl-Timeout-Ms")) {
    const std::string text = req.get_header_value("X-Kvl-Timeout-Ms");
    int64_t ms = 0;
    if (!absl::SimpleAtoi(text, &ms) || ms < 1 || ms > int64_t{24} * 3600 * 1000) {
      return Reply(
          req, res, kCompletionsRoute,
          absl::InvalidArgumentError(absl::StrCat(
              "X-Kvl-Timeout-Ms: expected milliseconds in [1, 86400000], got '", text, "'")));
    }
    deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  }
  absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(req.body, deps.limits);
  if (!request.ok()) return Reply(req, res, kCompletionsRoute, request.status());
  int model = -1;
  if (request->model != options.router_model || options.router_model.empty()) {
    model = deps.router->ModelIndex(request->model);
    if (model < 0) {
      std::vector<std::string> names = deps.router->model_names();
      if (!options.router_model.empty()) names.push_back(options.router_model);
      return Reply(req, res, kCompletionsRoute,
                   absl::NotFoundError(absl::StrCat(
                       "model: the model '", request->model,
                       "' does not exist (served: ", absl::StrJoin(names, ", "), ")")));
    }
  }
  {
    router::TurnOptions check;
    if (model >= 0) {
      check.policy = router::Policy::kExplicit;
      check.explicit_model = model;
    }
    if (absl::Status s = deps.router->ValidateTurn(check); !s.ok()) {
      return Reply(req, res, kCompletionsRoute, s);
    }
  }
  if (absl::Status s = deps.auth->BeginTurn(caller->tenant); !s.ok()) {
    deps.metrics->OnRejected("tenant_max_concurrent_turns");
    return Reply(req, res, kCompletionsRoute, s);
  }
  admission->auth = deps.auth;
  admission->tenant = caller->tenant;
  admission->holds_turn = true;

  auto ex = std::make_shared<Exchange>();
  ex->deadline = deadline;
  const bool stream = request->stream;
  deps.pool->Submit([this, caller = *caller, request = *std::move(request), model, ex, admission] {
    Serve(caller, request, model, ex);
  });
  // Wait for the response's status: the first event of a stream, or the end.
  // A client that leaves meanwhile cancels the turn (a stream's later
  // departure is noticed by its writes).
  {
    const int socket = ConnectionSocket(req);
    std::unique_lock<std::mutex> lock(ex->mu);
    while (!ex->changed.wait_for(lock, std::chrono::milliseconds(200),
                                 [&] { return ex->finished || (stream && ex->started); })) {
      if (!ex->cancelled && ClientGone(socket)) ex->cancelled = true;
    }
    if (!ex->error.ok()) {
      const absl::Status error = ex->error;
      lock.unlock();
      return Reply(req, res, kCompletionsRoute, error);
    }
    if (!stream) {
      res.set_content(ex->body, "application/json");
      lock.unlock();
      deps.metrics->CountHttpRequest(kCompletionsRoute, 200);
      return;
    }
  }
  deps.metrics->CountHttpRequest(kCompletionsRoute, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // nginx: pass events on as they come
  res.set_chunked_content_provider(
      "text/event-stream",
      [ex, admission](size_t, httplib::DataSink& sink) {
        std::deque<std::string> frames;
        bool finished;
        {
          std::unique_lock<std::mutex> lock(ex->mu);
          ex->changed.wait_for(lock, kKeepAlive,
                               [&] { return ex->finished || !ex->frames.empty(); });
          frames.swap(ex->frames);
          finished = ex->finished;
        }
        if (frames.empty() && !finished) frames.push_back(": keep-alive\n\n");
        for (const std::string& f : frames) {
          if (!sink.write(f.data(), f.size())) {
            ex->cancelled = true;  // the client is gone: stop its turn
            return false;
          }
        }
        if (finished) sink.done();
        return true;
      },
      [ex](bool success) {
        if (!success) ex->cancelled = true;
      });
}

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(const HostPort& address,
                                                                          const TlsSection* tls,
                                                                          const ServiceDeps& deps,
                                                                          OpenAiOptions options) {
  std::unique_ptr<OpenAiHttpServer> self(new OpenAiHttpServer());
  self->impl_ = std::make_unique<Impl>(deps, std::move(options));
  Impl* impl = self->impl_.get();
  // The largest body the limits allow: every message at its limits, with room
  // for the JSON around them.
  const int64_t max_body = deps.limits.max_import_bytes + deps.limits.max_turn_bytes +
                           deps.limits.max_system_prompt_bytes + (int64_t{1} << 20);
  absl::StatusOr<std::unique_ptr<HttpListener>> listener = HttpListener::Start(
      address, tls, "server.http_address", [impl, max_body](httplib::Server& http) {
        http.set_payload_max_length(static_cast<size_t>(max_body));
        http.Post(kCompletionsRoute, [impl](const httplib::Request& req, httplib::Response& res) {
          impl->Completions(req, res);
        });
        http.Get(kModelsRoute, [impl](const httplib::Request& req, httplib::Response& res) {
          impl->Models(req, res);
        });
        // httplib's own answers (unknown route, body too large) in OpenAI's shape.
        httplib::Server::HandlerWithResponse on_error =
            [impl, max_body](const httplib::Request& req, httplib::Response& res) {
              if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
              ApiError e;
              e.http_status = res.status;
              e.type = "invalid_request_error";
              if (res.status == 404) {
                e.message = absl::StrCat("unknown request URL: ", req.method, " ", req.path,
                                         " (served: POST /v1/chat/completions, GET /v1/models)");
              } else if (res.status == 413) {
                e.message =
                    absl::StrCat("the request body is over the server's limit of ", max_body,
                                 " bytes (server.max_import_bytes and the message limits)");
              } else {
                e.message = absl::StrCat("HTTP ", res.status, " for ", req.method, " ", req.path);
              }
              res.set_content(ApiErrorJson(e), "application/json");
              impl->deps.metrics->CountHttpRequest(
                  req.path == kCompletionsRoute || req.path == kModelsRoute ? req.path : "other",
                  res.status);
              return httplib::Server::HandlerResponse::Handled;
            };
        http.set_error_handler(std::move(on_error));
      });
  if (!listener.ok()) return listener.status();
  self->listener_ = *std::move(listener);
  return self;
}

OpenAiHttpServer::~OpenAiHttpServer() { Stop(); }

void OpenAiHttpServer::Stop() {
  if (impl_ != nullptr) impl_->stopping = true;
  if (listener_ != nullptr) listener_->Stop();
}

}  // namespace kvl::server
