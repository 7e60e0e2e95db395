// The absl::Status -> grpc::Status mapping (server/status.h).
#include "server/status.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace kvl::server {
namespace {

TEST(StatusTest, EveryCanonicalCodeMapsToTheSameGrpcCodeAndKeepsTheMessage) {
  // Written out pairwise (not derived from the enum values) so that a wrong
  // mapping cannot hide behind the shared numbering.
  const std::vector<std::pair<absl::StatusCode, grpc::StatusCode>> pairs = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [absl_code, grpc_code] : pairs) {
    const grpc::Status s = ToGrpcStatus(absl::Status(absl_code, "what went wrong"));
    EXPECT_EQ(s.error_code(), grpc_code) << absl::StatusCodeToString(absl_code);
    EXPECT_EQ(s.error_message(), "what went wrong");
  }
}

TEST(StatusTest, OkIsOkWithNoMessage) {
  const grpc::Status s = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.error_message(), "");
}

TEST(StatusTest, NonCanonicalCodeBecomesUnknown) {
  const grpc::Status s = ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(s.error_message(), "odd");
}

TEST(StatusTest, ARouterErrorNamesTheServersKeyForItsSetting) {
  const std::vector<std::pair<router::Setting, std::string>> keys = {
      {router::Setting::kTurnModel, "routing.model"},
      {router::Setting::kOrder, "routing.models"},
      {router::Setting::kRules, "routing.rules"},
      {router::Setting::kMaxWaitingTurns, "limits.max_waiting_turns_per_model"},
      {router::Setting::kMaxHistoryTokens, "limits.max_history_tokens"},
  };
  for (const auto& [setting, key] : keys) {
    const absl::Status tagged =
        router::WithSetting(absl::ResourceExhaustedError("over the limit of 3"), setting);
    EXPECT_EQ(router::SettingOf(tagged), setting) << key;
    const grpc::Status s = ToGrpcStatus(tagged);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << key;
    EXPECT_EQ(s.error_message(), key + ": over the limit of 3");
  }
  // Untagged, and tagged OK (which stays OK): nothing added.
  EXPECT_FALSE(router::SettingOf(absl::InternalError("x")).has_value());
  EXPECT_TRUE(router::WithSetting(absl::OkStatus(), router::Setting::kRules).ok());
}

}  // namespace
}  // namespace kvl::server
