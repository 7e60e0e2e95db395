#include "server/protobuf_log.h"

#include <string>
#include <utility>

#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

namespace kvl::server {

LogRateLimiter::LogRateLimiter(int64_t burst, std::chrono::nanoseconds window, Clock clock)
    : burst_(burst), window_(window), clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return std::chrono::steady_clock::now(); };
  window_start_ = clock_();
}

bool LogRateLimiter::Allow(int64_t* dropped) {
  const auto now = clock_();
  std::lock_guard<std::mutex> lock(mu_);
  if (now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++dropped_;
    return false;
  }
  ++in_window_;
  *dropped = dropped_;
  dropped_ = 0;
  return true;
}

namespace {

void HandleProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                       const std::string& message) {
  // Fatal lines end the process inside libprotobuf after the handler returns:
  // never dropped.
  static LogRateLimiter limiter(10, std::chrono::minutes(1));
  int64_t dropped = 0;
  if (level != google::protobuf::LOGLEVEL_FATAL && !limiter.Allow(&dropped)) return;
  spdlog::level::level_enum spd = spdlog::level::info;
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      spd = spdlog::level::info;
      break;
    case google::protobuf::LOGLEVEL_WARNING:
    case google::protobuf::LOGLEVEL_ERROR:
      spd = spdlog::level::warn;
      break;
    case google::protobuf::LOGLEVEL_FATAL:
      spd = spdlog::level::critical;
      break;
  }
  if (dropped > 0) {
    spdlog::log(spd, "protobuf: {} ({}:{}; {} earlier line(s) dropped by the rate limit)",
                message, filename, line, dropped);
  } else {
    spdlog::log(spd, "protobuf: {} ({}:{})", message, filename, line);
  }
}

}  // namespace

void RouteProtobufLogToSpdlog() { google::protobuf::SetLogHandler(&HandleProtobufLog); }

}  // namespace kvl::server
