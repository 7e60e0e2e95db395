// A minimal C++ Chat client for bench/server_bench.py: sends one turn to each
// of the given (already filled) sessions and prints, per turn, one JSON line
// with the client-observed times next to the server-reported ones. Their
// difference is the cost of gRPC, HTTP/2 and protobuf on both sides without
// the Python client's own share (grpcio's stream iterator, message classes).
//
// usage: ttft_client --target HOST:PORT --model NAME [--strategy N]
//                    [--max-tokens K] [--message TEXT] SESSION_ID...
//        ttft_client --target HOST:PORT --floor N [--gap-ms G]
// --floor prints the median round trip of N GetSession calls for an unknown
// session and of N Chat streams the server rejects at once (NOT_FOUND): the
// per-call cost of the transport without any model work. With --gap-ms, the
// client sleeps G ms before each call, so that both processes are idle when
// it starts, as they are when a turn's request arrives or its first token
// leaves after milliseconds of model work.
// The channel is connected and warmed by one unary call before the first
// measured turn, so no turn pays for connection set-up.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/flags.h"
#include "kvlingo/v1/chat.grpc.pb.h"
#include "kvlingo/v1/session.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Round trips that fail at once with NOT_FOUND: a unary call and a Chat stream
// (naming `model` under the explicit policy when given, so that the turn is
// valid and the unknown session is what refuses it).
int Floor(const std::shared_ptr<grpc::Channel>& channel, int n, int gap_ms,
          const std::string& model) {
  auto idle = [gap_ms] {
    if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
  };
  auto sessions = kvlingo::v1::SessionService::NewStub(channel);
  auto chat = kvlingo::v1::ChatService::NewStub(channel);
  std::vector<double> unary, stream;
  for (int i = 0; i < n + 1; ++i) {  // the first of each warms up and is dropped
    idle();
    {
      grpc::ClientContext context;
      kvlingo::v1::GetSessionRequest request;
      request.set_session_id("no-such-session");
      kvlingo::v1::Session reply;
      const Clock::time_point start = Clock::now();
      const grpc::Status s = sessions->GetSession(&context, request, &reply);
      if (i > 0) unary.push_back(Seconds(start, Clock::now()));
      if (s.error_code() != grpc::StatusCode::NOT_FOUND) {
        std::fprintf(stderr, "ttft_client: GetSession of an unknown session: %s\n",
                     s.error_message().c_str());
        return 1;
      }
    }
    idle();
    {
      grpc::ClientContext context;
      kvlingo::v1::ChatRequest request;
      request.set_session_id("no-such-session");
      request.set_user_message("hi");
      if (!model.empty()) {
        request.mutable_routing()->set_policy("explicit");
        request.mutable_routing()->set_model(model);
      }
      const Clock::time_point start = Clock::now();
      std::unique_ptr<grpc::ClientReader<kvlingo::v1::ChatResponse>> reader =
          chat->Chat(&context, request);
      kvlingo::v1::ChatResponse event;
      while (reader->Read(&event)) {
      }
      const grpc::Status s = reader->Finish();
      if (i > 0) stream.push_back(Seconds(start, Clock::now()));
      if (s.error_code() != grpc::StatusCode::NOT_FOUND) {
        std::fprintf(stderr, "ttft_client: Chat on an unknown session: %s\n",
                     s.error_message().c_str());
        return 1;
      }
    }
  }
  std::printf(
      "{\"unary_seconds\": %.9f, \"rejected_stream_seconds\": %.9f, \"n\": %d, "
      "\"gap_ms\": %d}\n",
      Median(unary), Median(stream), n, gap_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string target, model, message = "Now answer this briefly, please.";
  int strategy = 0, max_tokens = 4, floor = 0, gap_ms = 0;
  std::vector<std::string> sessions;
  kvl::FlagSet flags("ttft_client",
                     "Runs one Chat turn per SESSION_ID (one after another) and prints the time to\n"
                     "the first token as JSON lines; with --floor N, times N unary and N rejected\n"
                     "streaming calls instead (the gRPC floor; bench/server_bench.py).");
  flags.Required("target", &target, "HOST:PORT", "the server");
  flags.Add("model", &model, "NAME",
            "the explicit model of every turn (turn mode; floor mode: of the rejected turns)");
  flags.Add("strategy", &strategy, "N", "a kvlingo.v1.SwitchStrategy value");
  flags.Add("max-tokens", &max_tokens, "K", "tokens to generate per turn, >= 1");
  flags.Add("message", &message, "TEXT", "the user turn");
  flags.Add("floor", &floor, "N", "floor mode: N calls of each kind");
  flags.Add("gap-ms", &gap_ms, "G", "floor mode: pause between calls");
  flags.Positional(&sessions, "SESSION_ID", "sessions to run a turn in (turn mode)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  const bool floor_mode = floor > 0;
  if (!floor_mode && (model.empty() || sessions.empty() || max_tokens < 1)) {
    return flags.UsageError("turn mode needs --model, --max-tokens >= 1 and SESSION_IDs");
  }
  if (!kvlingo::v1::SwitchStrategy_IsValid(strategy)) {
    std::fprintf(stderr, "ttft_client: --strategy %d is not a SwitchStrategy value\n", strategy);
    return 2;
  }

  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
    std::fprintf(stderr, "ttft_client: could not connect to %s\n", target.c_str());
    return 1;
  }
  if (floor_mode) return Floor(channel, floor, gap_ms, model);
  auto chat = kvlingo::v1::ChatService::NewStub(channel);
  {
    auto session_stub = kvlingo::v1::SessionService::NewStub(channel);
    grpc::ClientContext context;
    kvlingo::v1::GetSessionRequest request;
    request.set_session_id(sessions.front());
    kvlingo::v1::Session reply;
    const grpc::Status s = session_stub->GetSession(&context, request, &reply);
    if (!s.ok()) {
      std::fprintf(stderr, "ttft_client: GetSession %s: %s\n", sessions.front().c_str(),
                   s.error_message().c_str());
      return 1;
    }
  }

  for (const std::string& sid : sessions) {
    kvlingo::v1::ChatRequest request;
    request.set_session_id(sid);
    request.set_user_message(message);
    request.mutable_sampling()->set_max_tokens(max_tokens);  // temperature 0: greedy
    request.mutable_routing()->set_policy("explicit");
    request.mutable_routing()->set_model(model);
    request.mutable_routing()->set_strategy(static_cast<kvlingo::v1::SwitchStrategy>(strategy));

    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(600));
    const Clock::time_point start = Clock::now();
    std::unique_ptr<grpc::ClientReader<kvlingo::v1::ChatResponse>> reader =
        chat->Chat(&context, request);
    double first = -1, last = -1;
    kvlingo::v1::ChatResponse event;
    kvlingo::v1::RoutingDecision routing;
    kvlingo::v1::TurnSummary summary;
    bool have_summary = false;
    while (reader->Read(&event)) {
      if (event.has_delta() && first < 0) {
        first = Seconds(start, Clock::now());
      } else if (event.has_routing()) {
        routing = event.routing();
      } else if (event.has_summary()) {
        summary = event.summary();
        last = Seconds(start, Clock::now());
        have_summary = true;
      }
    }
    const grpc::Status s = reader->Finish();
    if (!s.ok() || !have_summary || first < 0) {
      std::fprintf(stderr, "ttft_client: turn on %s failed: %s\n", sid.c_str(),
                   s.ok() ? "no token or no summary" : s.error_message().c_str());
      return 1;
    }
    std::printf(
        "{\"session\": \"%s\", \"client_ttft\": %.9f, \"client_total\": %.9f, "
        "\"server_ttft\": %.9f, \"server_total\": %.9f, \"tokens_translated\": %u, "
        "\"tokens_reprefilled\": %u, \"translation_seconds\": %.9f}\n",
        sid.c_str(), first, last, summary.time_to_first_token_seconds(),
        summary.timing().total_seconds(), routing.tokens_translated(), routing.tokens_reprefilled(),
        routing.translation_seconds());
    std::fflush(stdout);
  }
  return 0;
}
