#include "tests/testing/redis.h"

#include <signal.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tests/testing/net.h"

#ifndef KVL_REDIS_SERVER
#define KVL_REDIS_SERVER "redis-server"
#endif

namespace kvl::testing {

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start() {
  std::unique_ptr<RedisServer> server(new RedisServer());
  absl::StatusOr<int> port = FindFreeLoopbackPort();
  if (!port.ok()) return port.status();
  server->port_ = *port;
  KVL_RETURN_IF_ERROR(server->Launch());
  return server;
}

std::string RedisServer::address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::Status RedisServer::Launch() {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
      {KVL_REDIS_SERVER, "--port", absl::StrCat(port_), "--bind", "127.0.0.1", "--save", "",
       "--appendonly", "no", "--protected-mode", "no", "--loglevel", "notice"});
  if (!p.ok()) return p.status();
  absl::StatusOr<std::string> ready =
      (*p)->WaitForLine(Stream::kStdout, "Ready to accept connections", std::chrono::seconds(10));
  if (!ready.ok()) return absl::UnavailableError(ready.status().message());
  process_ = *std::move(p);
  return absl::OkStatus();
}

absl::Status RedisServer::Kill() {
  if (process_ == nullptr) return absl::FailedPreconditionError("redis-server is not running");
  KVL_RETURN_IF_ERROR(process_->Signal(SIGKILL));
  absl::StatusOr<int> code = process_->Wait(std::chrono::seconds(10));
  process_.reset();
  return code.status();
}

absl::Status RedisServer::Restart() {
  if (process_ != nullptr) return absl::FailedPreconditionError("redis-server is running");
  return Launch();
}

absl::Status RedisServer::Pause() {
  if (process_ == nullptr) return absl::FailedPreconditionError("redis-server is not running");
  return process_->Signal(SIGSTOP);
}

absl::Status RedisServer::Resume() {
  if (process_ == nullptr) return absl::FailedPreconditionError("redis-server is not running");
  return process_->Signal(SIGCONT);
}

}  // namespace kvl::testing
