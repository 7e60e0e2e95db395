// libprotobuf's own log lines (GOOGLE_LOG: e.g. one ERROR per string field
// with invalid UTF-8 in a request) routed through spdlog, rate-limited, so
// that no client can flood the server's log through the parser, and no line
// reaches stderr outside the server's log format.
//
// Thread-safety: RouteProtobufLogToSpdlog installs a process-wide handler
// (call it once, at start, before serving); the handler and LogRateLimiter
// are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvl::server {

// At most `burst` lines per `window`; the lines over it are dropped and
// counted, and the first line allowed after a drop reports how many.
class LogRateLimiter {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // Null `clock`: the steady clock (tests inject theirs).
  LogRateLimiter(int64_t burst, std::chrono::nanoseconds window, Clock clock = nullptr);

  // Whether a line may be written now; when it may, *dropped is the number
  // of lines refused since the last one allowed.
  bool Allow(int64_t* dropped);

 private:
  const int64_t burst_;
  const std::chrono::nanoseconds window_;
  Clock clock_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_ ABSL_GUARDED_BY(mu_);
  int64_t in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// Installs the handler: protobuf's lines go to spdlog's default logger at
// their level (LOGLEVEL_ERROR as warn: a malformed request is the client's
// error, not the server's), prefixed "protobuf:", at most 10 per minute.
void RouteProtobufLogToSpdlog();

}  // namespace kvl::server
