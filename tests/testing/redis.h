// A private redis-server for a test: Debian's redis-server on a free loopback
// port, in-memory only (no snapshots, no append-only file), killed with the
// test. Stop and Start again on the same port to play an outage.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/subprocess.h"

namespace kvl::testing {

class RedisServer {
 public:
  // Picks a free port and starts the server; Unavailable when it does not
  // come up within 10 s.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();
  ~RedisServer() = default;

  int port() const { return port_; }
  std::string address() const;  // "127.0.0.1:<port>"
  bool running() const { return process_ != nullptr; }

  // SIGKILL: the data is gone, as after a crash of an in-memory Redis.
  absl::Status Kill();
  // Starts it again on the same port (after Kill).
  absl::Status Restart();
  // SIGSTOP / SIGCONT: an outage that keeps the data (connections hang, as
  // behind a network partition, until the client's timeout).
  absl::Status Pause();
  absl::Status Resume();

 private:
  RedisServer() = default;
  absl::Status Launch();

  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

}  // namespace kvl::testing
