// Loopback networking for tests: free ports and a minimal HTTP GET.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace kvl::testing {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read
// back, released). Another process can take it before the caller binds it;
// where that matters, let the program under test bind port 0 and report it.
absl::StatusOr<int> FindFreeLoopbackPort();

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// GET http://host:port/path with HTTP/1.0 and "Connection: close"; reads the
// whole response. Unavailable when the connection fails, DeadlineExceeded when
// the reply takes longer than `timeout`.
absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace kvl::testing
