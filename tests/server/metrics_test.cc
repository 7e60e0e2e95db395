// The server's metrics registry and its /metrics endpoint (server/metrics*.h).
#include "server/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "server/metrics_http.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl::server {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, RpcCountsLandInTheirMethodAndCodeSeries) {
  ServerMetrics metrics("1.2.3");
  metrics.CountRpc(RpcMethod::kGetSession, 5);  // NOT_FOUND
  metrics.CountRpc(RpcMethod::kGetSession, 5);
  metrics.CountRpc(RpcMethod::kChat, 12);  // UNIMPLEMENTED
  metrics.CountRpc(RpcMethod::kChat, 99);  // out of range: UNKNOWN
  CacheStoreStats stats;
  stats.sessions = 3;
  metrics.SetCacheStats(stats);
  const std::string text = metrics.RenderText();
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="NOT_FOUND",method="kvlingo.v1.SessionService/GetSession"} 2)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="UNIMPLEMENTED",method="kvlingo.v1.ChatService/Chat"} 1)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="UNKNOWN",method="kvlingo.v1.ChatService/Chat"} 1)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(kvlingo_grpc_requests_total{code="OK",method="kvlingo.v1.ChatService/Chat"} 0)"));
  EXPECT_THAT(text, HasSubstr("kvlingo_sessions_active 3\n"));
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_build_info{version="1.2.3"} 1)"));
  EXPECT_THAT(text, HasSubstr("kvlingo_up 1\n"));
  metrics.SetUp(false);
  EXPECT_THAT(metrics.RenderText(), HasSubstr("kvlingo_up 0\n"));
}

TEST(MetricsTest, ACompletedTurnLandsInTheRequestHistogramsAndItsFinishReason) {
  ServerMetrics metrics("1.2.3", {"small", "large"});
  router::TurnResult r;
  r.routing.model = 1;
  r.total_seconds = 0.9;
  r.queue_seconds = 0.4;
  r.generated_tokens = 5;
  r.decode_seconds = 0.2;  // 0.05 s per token after the first
  r.finish_reason = FinishReason::kLength;
  metrics.OnTurnDone(r);
  r.generated_tokens = 1;  // no time per output token
  r.finish_reason = FinishReason::kStopToken;
  metrics.OnTurnDone(r);
  metrics.OnModelQueue(1, 1, 3);
  metrics.OnRejected("max_sessions");
  const std::string text = metrics.RenderText();
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_e2e_request_latency_seconds_count{model="large"} 2)"));
  EXPECT_THAT(text,
              HasSubstr(R"(kvlingo_e2e_request_latency_seconds_bucket{model="large",le="0.8"} 0)"));
  EXPECT_THAT(text,
              HasSubstr(R"(kvlingo_e2e_request_latency_seconds_bucket{model="large",le="1"} 2)"));
  EXPECT_THAT(text,
              HasSubstr(R"(kvlingo_request_queue_time_seconds_bucket{model="large",le="0.5"} 2)"));
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_time_per_output_token_seconds_count{model="large"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_time_per_output_token_seconds_sum{model="large"} 0.05)"));
  EXPECT_THAT(text, HasSubstr(
                        R"(kvlingo_request_success_total{finished_reason="length",model="large"} 1)"));
  EXPECT_THAT(text, HasSubstr(
                        R"(kvlingo_request_success_total{finished_reason="stop_token",model="large"} 1)"));
  EXPECT_THAT(text, HasSubstr(
                        R"(kvlingo_request_success_total{finished_reason="stop_token",model="small"} 0)"));
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_requests_running{model="large"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_requests_waiting{model="large"} 3)"));
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_requests_rejected_total{limit="max_sessions"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(kvlingo_requests_rejected_total{limit="max_concurrent_streams"} 0)"));
}

TEST(MetricsTest, CodeNamesFollowGrpc) {
  EXPECT_EQ(GrpcCodeName(0), "OK");
  EXPECT_EQ(GrpcCodeName(3), "INVALID_ARGUMENT");
  EXPECT_EQ(GrpcCodeName(14), "UNAVAILABLE");
  EXPECT_EQ(GrpcCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(GrpcCodeName(-1), "UNKNOWN");
}

TEST(MetricsTest, ExpositionPassesPromtool) {
  if (std::string(KVL_PROMTOOL).empty()) GTEST_FAIL() << "promtool not found at configure time (scripts/setup.sh installs it)";
  ServerMetrics metrics("0.0.0-test", {"small", "large"});
  metrics.CountRpc(RpcMethod::kCreateSession, 0);
  router::TurnResult r;
  r.generated_tokens = 3;
  metrics.OnTurnDone(r);
  testing::TempDir dir("metrics");
  const std::string file = dir.WriteFile("metrics.txt", metrics.RenderText());
  absl::StatusOr<testing::RunResult> run =
      testing::RunProcess({"/bin/sh", "-c", std::string(KVL_PROMTOOL) + " check metrics < " + file},
                          std::chrono::seconds(30));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->out << run->err;
}

TEST(MetricsHttpTest, ServesMetricsOnAnOsChosenPortAndStops) {
  {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
        HostPort{"127.0.0.1", 0}, [] { return std::string("x_total 1\n"); });
    ASSERT_TRUE(http.ok()) << http.status();
    const int port = (*http)->address().port;
    ASSERT_GT(port, 0);
    absl::StatusOr<testing::HttpResponse> got = testing::HttpGet("127.0.0.1", port, "/metrics");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->status, 200);
    EXPECT_EQ(got->body, "x_total 1\n");
    EXPECT_THAT(got->headers["content-type"], HasSubstr("text/plain; version=0.0.4"));
    absl::StatusOr<testing::HttpResponse> other = testing::HttpGet("127.0.0.1", port, "/other");
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(other->status, 404);

    // A second server cannot take the same port.
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> clash =
        MetricsHttpServer::Start(HostPort{"127.0.0.1", port}, [] { return std::string(); });
    EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);

    (*http)->Stop();
    EXPECT_EQ(testing::HttpGet("127.0.0.1", port, "/metrics").status().code(),
              absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace kvl::server
