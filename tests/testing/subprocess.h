// Running other programs from tests: start a process with its stdout and
// stderr captured, wait for a line, signal it, wait for its exit with a timeout.
//
// The child runs in its own process group; destroying a Subprocess that is
// still running SIGKILLs the whole group and reaps it, so a failing test never
// leaves a server behind.
//
// Exit codes: a normal exit gives its code (0-255); death by signal N gives
// 128 + N, as shells report it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvl::testing {

struct SubprocessOptions {
  // Working directory of the child; empty: the caller's.
  std::string cwd;
  // Added to (or replacing entries of) the caller's environment.
  std::vector<std::pair<std::string, std::string>> env;
};

enum class Stream { kStdout, kStderr };

class Subprocess {
 public:
  // argv[0] is a path, or a name looked up in PATH. NotFound if it cannot be
  // executed.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const SubprocessOptions& options = {});
  ~Subprocess();

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Waits until a complete line of `stream` contains `needle`; returns that
  // line (without the newline). DeadlineExceeded after `timeout`;
  // FailedPrecondition if the stream ends first. Both messages include the
  // captured output, so that a failing assertion shows why.
  absl::StatusOr<std::string> WaitForLine(Stream stream, const std::string& needle,
                                          std::chrono::milliseconds timeout);

  // kill(pid, signal) on the child itself (not its group).
  absl::Status Signal(int signal);

  // Waits for the child to exit; returns its exit code (see above).
  // DeadlineExceeded if it is still running after `timeout` (it is left running).
  absl::StatusOr<int> Wait(std::chrono::milliseconds timeout);

  // Everything captured so far.
  std::string stdout_text() const;
  std::string stderr_text() const;
  // "stdout: ...\nstderr: ..." for failure messages.
  std::string Describe() const;

 private:
  Subprocess() = default;
  void ReadLoop(int out_fd, int err_fd);

  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::thread reader_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::string out_;
  std::string err_;
  bool out_closed_ = false;
  bool err_closed_ = false;
};

struct RunResult {
  int exit_code = -1;  // see the header comment
  std::string out;
  std::string err;
};

// Runs a program to completion. DeadlineExceeded (with the output so far) if
// it runs longer than `timeout`; it is then killed.
absl::StatusOr<RunResult> RunProcess(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds timeout,
                                     const SubprocessOptions& options = {});

}  // namespace kvl::testing
