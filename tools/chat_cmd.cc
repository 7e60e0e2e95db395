// kvl chat: an interactive gRPC client of kvl-server. Each line read from
// stdin is one user turn of one session; the answer streams to stdout and a
// status line per turn (model, switch, path, translated tokens, TTFT) goes to
// stderr, so that stdout holds only the conversation.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kvlingo/v1/chat.grpc.pb.h"
#include "kvlingo/v1/session.grpc.pb.h"
#include "tools/commands.h"

namespace kvl::tools {
namespace {

constexpr char kUsage[] =
    "usage: kvl chat [--server HOST:PORT] [--session ID] [--system TEXT] [--policy NAME]\n"
    "                [--model NAME] [--strategy translate|reprefill|reprefill-missing]\n"
    "                [--max-tokens N] [--temperature T] [--seed S]\n"
    "Talks to a running kvl-server (default 127.0.0.1:50051). Creates a session\n"
    "unless --session names an existing one. Each stdin line is a user turn; the\n"
    "answer streams to stdout, and one line per turn on stderr shows the model that\n"
    "answered, whether the session switched model and how (translated, re-prefilled\n"
    "or native cache), the tokens translated and the time to first token.\n"
    "In the conversation: '/model NAME' pins later turns to a model (explicit policy),\n"
    "'/policy NAME' sets the policy ('' = the server's), '/quit' ends.\n";

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "kvl chat: %s\n", message.c_str());
  return code;
}

const char* PathName(kvlingo::v1::CachePath path) {
  switch (path) {
    case kvlingo::v1::CACHE_PATH_NATIVE: return "native";
    case kvlingo::v1::CACHE_PATH_TRANSLATED: return "translated";
    case kvlingo::v1::CACHE_PATH_REPREFILL: return "reprefill";
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

bool ParseStrategy(const std::string& name, kvlingo::v1::SwitchStrategy* out) {
  if (name == "translate") *out = kvlingo::v1::SWITCH_STRATEGY_TRANSLATE;
  else if (name == "reprefill") *out = kvlingo::v1::SWITCH_STRATEGY_REPREFILL;
  else if (name == "reprefill-missing") *out = kvlingo::v1::SWITCH_STRATEGY_REPREFILL_MISSING;
  else return false;
  return true;
}

// One turn: streams the answer to stdout, the status line to stderr. Returns
// false (after printing the server's status) when the turn failed.
bool RunTurn(kvlingo::v1::ChatService::Stub& chat, const kvlingo::v1::ChatRequest& request) {
  grpc::ClientContext context;
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
    }
  }
  const grpc::Status status = reader->Finish();
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
  kvlingo::v1::ChatRequest request;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) return Fail("unexpected argument '" + arg + "'", 2);
    if (i + 1 >= args.size()) return Fail("flag " + arg + " needs a value", 2);
    const std::string& value = args[++i];
    uint32_t n = 0;
    float f = 0;
    uint64_t seed = 0;
    if (arg == "--server") {
      server = value;
    } else if (arg == "--session") {
      session_id = value;
    } else if (arg == "--system") {
      system_prompt = value;
    } else if (arg == "--policy") {
      request.mutable_routing()->set_policy(value);
    } else if (arg == "--model") {
      request.mutable_routing()->set_model(value);
    } else if (arg == "--strategy") {
      kvlingo::v1::SwitchStrategy strategy;
      if (!ParseStrategy(value, &strategy)) return Fail("unknown --strategy '" + value + "'", 2);
      request.mutable_routing()->set_strategy(strategy);
    } else if (arg == "--max-tokens" && absl::SimpleAtoi(value, &n)) {
      request.mutable_sampling()->set_max_tokens(n);
    } else if (arg == "--temperature" && absl::SimpleAtof(value, &f)) {
      request.mutable_sampling()->set_temperature(f);
    } else if (arg == "--seed" && absl::SimpleAtoi(value, &seed)) {
      request.mutable_sampling()->set_seed(seed);
    } else {
      return Fail("bad flag or value: " + arg + " " + value, 2);
    }
  }

  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  auto sessions = kvlingo::v1::SessionService::NewStub(channel);
  auto chat = kvlingo::v1::ChatService::NewStub(channel);
  {
    grpc::ClientContext context;
    kvlingo::v1::Session session;
    grpc::Status status;
    if (session_id.empty()) {
      kvlingo::v1::CreateSessionRequest create;
      create.set_system_prompt(system_prompt);
      status = sessions->CreateSession(&context, create, &session);
    } else {
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
