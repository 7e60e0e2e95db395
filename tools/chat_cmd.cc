// kvl chat: an interactive gRPC client of kvl-server. Each line read from
// stdin is one user turn of one session; the answer streams to stdout and a
// status line per turn (model, switch, path, translated tokens, TTFT) goes to
// stderr, so that stdout holds only the conversation.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "kvlingo/v1/chat.grpc.pb.h"
#include "kvlingo/v1/session.grpc.pb.h"
#include "tools/client_credentials.h"
#include "tools/commands.h"

namespace kvl::tools {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvl chat: %s\n", message.c_str());
  return 1;
}

const char* PathName(kvlingo::v1::CachePath path) {
  switch (path) {
    case kvlingo::v1::CACHE_PATH_NATIVE: return "native";
    case kvlingo::v1::CACHE_PATH_TRANSLATED: return "translated";
    case kvlingo::v1::CACHE_PATH_REPREFILL: return "reprefill";
    case kvlingo::v1::CACHE_PATH_RESTORED: return "restored";
    case kvlingo::v1::CACHE_PATH_NATIVE_TAIL: return "native-tail";
    case kvlingo::v1::CACHE_PATH_HYBRID: return "hybrid";
    default: return "?";
  }
}

const char* FinishName(kvlingo::v1::FinishReason reason) {
  switch (reason) {
    case kvlingo::v1::FINISH_REASON_STOP: return "stop";
    case kvlingo::v1::FINISH_REASON_LENGTH: return "length";
    case kvlingo::v1::FINISH_REASON_STOP_STRING: return "stop string";
    default: return "?";
  }
}

// One of the names --strategy admits.
kvlingo::v1::SwitchStrategy StrategyOf(const std::string& name) {
  if (name == "reprefill") return kvlingo::v1::SWITCH_STRATEGY_REPREFILL;
  if (name == "reprefill-missing") return kvlingo::v1::SWITCH_STRATEGY_REPREFILL_MISSING;
  return kvlingo::v1::SWITCH_STRATEGY_TRANSLATE;
}

// A fresh request id for a turn: 128 random bits in hex.
std::string NewRequestId() {
  static std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("r-%016x%016x", rng(), rng());
}

// One attempt at a turn: streams the answer to stdout, the status line to
// stderr; returns the call's status.
grpc::Status TryTurn(kvlingo::v1::ChatService::Stub& chat,
                     const kvlingo::v1::ChatRequest& request) {
  grpc::ClientContext context;
  // Load balancers in front of several replicas route a session by it.
  context.AddMetadata("x-kvl-session-id", request.session_id());
  AddApiKey(&context);
  std::unique_ptr<grpc::ClientReader<kvlingo::v1::ChatResponse>> reader =
      chat.Chat(&context, request);
  kvlingo::v1::ChatResponse response;
  kvlingo::v1::RoutingDecision decision;
  while (reader->Read(&response)) {
    if (response.has_routing()) {
      decision = response.routing();
    } else if (response.has_delta()) {
      std::fputs(response.delta().text().c_str(), stdout);
      std::fflush(stdout);
    } else if (response.has_summary()) {
      const kvlingo::v1::TurnSummary& s = response.summary();
      std::fputc('\n', stdout);
      std::fflush(stdout);
      std::string change = "no switch";
      if (decision.switched()) {
        change = absl::StrFormat("switch %s -> %s", decision.previous_model(), decision.model());
      }
      std::fprintf(stderr,
                   "[%s | %s | %s cache | %u tokens translated in %.1f ms, %u re-prefilled | "
                   "TTFT %.1f ms | %u generated (%s) | history %u tokens]\n",
                   decision.model().c_str(), change.c_str(), PathName(decision.path()),
                   decision.tokens_translated(), 1e3 * decision.translation_seconds(),
                   decision.tokens_reprefilled(), 1e3 * s.time_to_first_token_seconds(),
                   s.generated_tokens(), FinishName(s.finish_reason()), s.history_tokens());
      if (!decision.reason().empty()) std::fprintf(stderr, "  reason: %s\n", decision.reason().c_str());
      if (s.replayed()) std::fputs("  (replayed: the turn had already committed)\n", stderr);
    }
  }
  return reader->Finish();
}

// One turn under a fresh request id, retried with the same id while the
// server (or, behind a load balancer, every replica) is UNAVAILABLE, or the
// session was busy with another call (ABORTED): a turn
// that committed before the failure is replayed, not run twice. Returns false
// (after printing the server's status) when the turn failed.
bool RunTurn(kvlingo::v1::ChatService::Stub& chat, kvlingo::v1::ChatRequest request) {
  request.set_request_id(NewRequestId());
  constexpr int kAttempts = 4;
  grpc::Status status;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    status = TryTurn(chat, request);
    const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       status.error_code() == grpc::StatusCode::ABORTED;
    if (!retry || attempt == kAttempts) break;
    std::fprintf(stderr, "\nkvl chat: %s; retrying (%d/%d)\n", status.error_message().c_str(),
                 attempt, kAttempts - 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(500 * attempt));
  }
  if (!status.ok()) {
    std::fprintf(stderr, "kvl chat: turn failed: %d %s\n", static_cast<int>(status.error_code()),
                 status.error_message().c_str());
    return false;
  }
  return true;
}

}  // namespace

int RunChat(const Args& args) {
  std::string server = "127.0.0.1:50051", session_id, system_prompt;
  ClientTlsFiles tls;
  std::string policy, model, strategy;
  uint32_t max_tokens = 0;
  float temperature = 0;
  kvlingo::v1::ChatRequest request;
  FlagSet flags(
      "kvl chat",
      "Talks to a running kvl-server. Creates a session unless --session names an\n"
      "existing one. Each stdin line is a user turn; the answer streams to stdout, and\n"
      "one line per turn on stderr shows the model that answered, whether the session\n"
      "switched model and how (translated, re-prefilled or native cache), the tokens\n"
      "translated and the time to first token. The routing and sampling flags go with\n"
      "every turn; those not given are left to the server.\n"
      "In the conversation: '/model NAME' pins later turns to a model (explicit policy),\n"
      "'/policy NAME' sets the policy ('' = the server's), '/quit' ends.\n"
      "With the environment variable KVL_API_KEY set, every call carries that API key.");
  flags.Add("server", &server, "HOST:PORT", "the kvl-server's gRPC address");
  flags.Add("ca", &tls.ca_file, "FILE",
            "connect with TLS, trusting the server certificate this CA (PEM) signed");
  flags.Add("cert", &tls.cert_file, "FILE", "with --key: the client certificate (PEM) for mTLS");
  flags.Add("key", &tls.key_file, "FILE", "the client certificate's private key (PEM)");
  flags.Add("session", &session_id, "ID", "continue this session instead of creating one");
  flags.Add("system", &system_prompt, "TEXT", "system prompt of the session created");
  flags.Add("policy", &policy, "NAME",
            "routing policy: fixed, explicit, rules, cascade or alternate");
  flags.Add("model", &model, "NAME", "the model to use (the explicit policy)");
  flags.Choice("strategy", &strategy, {"translate", "reprefill", "reprefill-missing"},
               "how a model switch moves the session's cache");
  flags.Add("max-tokens", &max_tokens, "N", "most tokens generated per turn, 0: the server's");
  flags.Add("temperature", &temperature, "T", "softmax temperature in [0, 2], 0: greedy");
  // Custom: a seed not given stays unset in the request (the server's choice),
  // which no integer default could say.
  flags.Custom("seed", "S", "sampler seed, for repeatable sampling",
               [&request](const std::string& v) -> absl::Status {
                 uint64_t seed = 0;
                 if (!absl::SimpleAtoi(v, &seed)) {
                   return absl::InvalidArgumentError("expected a non-negative integer, got '" +
                                                     v + "'");
                 }
                 request.mutable_sampling()->set_seed(seed);
                 return absl::OkStatus();
               });
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  // Only what was given goes into the request: the routing and sampling
  // messages stay absent otherwise, and the server applies its defaults.
  if (flags.Given("policy")) request.mutable_routing()->set_policy(policy);
  if (flags.Given("model")) request.mutable_routing()->set_model(model);
  if (flags.Given("strategy")) request.mutable_routing()->set_strategy(StrategyOf(strategy));
  if (flags.Given("max-tokens")) request.mutable_sampling()->set_max_tokens(max_tokens);
  if (flags.Given("temperature")) request.mutable_sampling()->set_temperature(temperature);

  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeClientCredentials(tls);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  if (HasApiKey() && tls.ca_file.empty() && tls.cert_file.empty()) {
    std::fprintf(stderr,
                 "kvl chat: warning: sending KVL_API_KEY over plaintext (no --ca); anyone on "
                 "the network path can read it\n");
  }
  const std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(server, *credentials);
  auto sessions = kvlingo::v1::SessionService::NewStub(channel);
  auto chat = kvlingo::v1::ChatService::NewStub(channel);
  {
    grpc::ClientContext context;
    AddApiKey(&context);
    kvlingo::v1::Session session;
    grpc::Status status;
    if (session_id.empty()) {
      kvlingo::v1::CreateSessionRequest create;
      create.set_system_prompt(system_prompt);
      status = sessions->CreateSession(&context, create, &session);
    } else {
      context.AddMetadata("x-kvl-session-id", session_id);
      kvlingo::v1::GetSessionRequest get;
      get.set_session_id(session_id);
      status = sessions->GetSession(&context, get, &session);
    }
    if (!status.ok()) {
      return Fail(absl::StrFormat("%s: %s", server, status.error_message()));
    }
    session_id = session.session_id();
  }
  request.set_session_id(session_id);
  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::fprintf(stderr, "session %s on %s\n", session_id.c_str(), server.c_str());

  bool all_ok = true;
  std::string line;
  while (true) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/quit") break;
    if (line.rfind("/model ", 0) == 0) {
      request.mutable_routing()->set_policy("explicit");
      request.mutable_routing()->set_model(line.substr(7));
      continue;
    }
    if (line.rfind("/policy", 0) == 0) {
      request.mutable_routing()->set_policy(line.size() > 8 ? line.substr(8) : "");
      continue;
    }
    request.set_user_message(line);
    all_ok = RunTurn(*chat, request) && all_ok;
  }
  return all_ok ? 0 : 1;
}

}  // namespace kvl::tools
