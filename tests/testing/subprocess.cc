#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace kvl::testing {
namespace {

void CloseIfOpen(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// The line of `text` containing `needle`, if that line is complete.
bool FindCompleteLine(const std::string& text, const std::string& needle, std::string* line) {
  size_t from = 0;
  while (true) {
    const size_t hit = text.find(needle, from);
    if (hit == std::string::npos) return false;
    const size_t begin = text.rfind('\n', hit);
    const size_t start = begin == std::string::npos ? 0 : begin + 1;
    const size_t end = text.find('\n', hit);
    if (end == std::string::npos) return false;
    *line = text.substr(start, end - start);
    return true;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const SubprocessOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("Subprocess: empty argv");
  // Everything the child needs is prepared before fork(): between fork and exec
  // a multi-threaded parent's child may only call async-signal-safe functions.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    bool overridden = false;
    for (const auto& [k, v] : options.env) overridden |= entry.rfind(k + "=", 0) == 0;
    if (!overridden) env_storage.push_back(std::move(entry));
  }
  for (const auto& [k, v] : options.env) env_storage.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
      pipe2(exec_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    // The test may block these (e.g. a server under test does); the child
    // must start with default signal handling.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!options.cwd.empty() && chdir(options.cwd.c_str()) != 0) {
      const int e = errno;
      (void)!write(exec_pipe[1], &e, sizeof e);
      _exit(127);
    }
    execvpe(args[0], args.data(), envp.data());
    const int e = errno;
    (void)!write(exec_pipe[1], &e, sizeof e);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  int exec_errno = 0;
  const ssize_t n = read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  close(exec_pipe[0]);
  std::unique_ptr<Subprocess> self(new Subprocess());
  self->pid_ = pid;
  if (n == sizeof exec_errno) {
    waitpid(pid, nullptr, 0);
    self->reaped_ = true;
    close(out_pipe[0]);
    close(err_pipe[0]);
    return absl::NotFoundError(absl::StrCat("cannot run '", argv[0], "': ", strerror(exec_errno)));
  }
  const int out_fd = out_pipe[0], err_fd = err_pipe[0];
  Subprocess* raw = self.get();
  self->reader_ = std::thread([raw, out_fd, err_fd] { raw->ReadLoop(out_fd, err_fd); });
  return self;
}

void Subprocess::ReadLoop(int out_fd, int err_fd) {
  char buffer[4096];
  while (out_fd >= 0 || err_fd >= 0) {
    pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      int& fd = i == 0 ? out_fd : err_fd;
      if (fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = read(fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (got <= 0) {
        CloseIfOpen(fd);
        (i == 0 ? out_closed_ : err_closed_) = true;
      } else {
        (i == 0 ? out_ : err_).append(buffer, static_cast<size_t>(got));
      }
      changed_.notify_all();
    }
  }
  CloseIfOpen(out_fd);
  CloseIfOpen(err_fd);
  std::lock_guard<std::mutex> lock(mu_);
  out_closed_ = err_closed_ = true;
  changed_.notify_all();
}

Subprocess::~Subprocess() {
  if (!reaped_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  } else if (pid_ > 0) {
    kill(-pid_, SIGKILL);  // descendants that may still hold the pipes
  }
  if (reader_.joinable()) reader_.join();
}

absl::StatusOr<std::string> Subprocess::WaitForLine(Stream stream, const std::string& needle,
                                                    std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::string& text = stream == Stream::kStdout ? out_ : err_;
  const bool& closed = stream == Stream::kStdout ? out_closed_ : err_closed_;
  std::string line;
  const bool found = changed_.wait_for(
      lock, timeout, [&] { return FindCompleteLine(text, needle, &line) || closed; });
  if (found && FindCompleteLine(text, needle, &line)) return line;
  const std::string output = absl::StrCat("stdout: ", out_, "\nstderr: ", err_);
  if (!found) {
    return absl::DeadlineExceededError(absl::StrCat("no line containing '", needle, "' within ",
                                                    timeout.count(), " ms\n", output));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("stream ended without a line containing '", needle, "'\n", output));
}

absl::Status Subprocess::Signal(int signal) {
  if (reaped_) return absl::FailedPreconditionError("process already exited");
  if (kill(pid_, signal) != 0) return absl::InternalError(absl::StrCat("kill: ", strerror(errno)));
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (reaped_) return exit_code_;
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      exit_code_ = DecodeWaitStatus(status);
      break;
    }
    if (r < 0 && errno != EINTR)
      return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
    if (std::chrono::steady_clock::now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("still running after ", timeout.count(), " ms\n", Describe()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Let the reader drain what the child wrote last; a descendant holding the
  // pipes open must not block the caller, hence the bound.
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, std::chrono::seconds(2), [&] { return out_closed_ && err_closed_; });
  return exit_code_;
}

std::string Subprocess::stdout_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_;
}

std::string Subprocess::stderr_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  return err_;
}

std::string Subprocess::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return absl::StrCat("stdout: ", out_, "\nstderr: ", err_);
}

absl::StatusOr<RunResult> RunProcess(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds timeout,
                                     const SubprocessOptions& options) {
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(argv, options);
  if (!process.ok()) return process.status();
  absl::StatusOr<int> code = (*process)->Wait(timeout);
  if (!code.ok()) return code.status();  // the destructor kills it
  return RunResult{*code, (*process)->stdout_text(), (*process)->stderr_text()};
}

}  // namespace kvl::testing
