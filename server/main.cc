// kvl-server: serves the kvlingo.v1 API described by a config file
// (`kvl-server --help`). Flags override the config file. Exit codes: 0 after a clean shutdown on
// SIGTERM/SIGINT, 1 when the server cannot start (e.g. an address in use), 2 for
// bad usage or a bad config (one message naming the problem on stderr).
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/flags.h"
#include "model/device.h"
#include "model/engine.h"
#include "model/omp_wait.h"
#include "server/config.h"
#include "server/protobuf_log.h"
#include "server/server.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

constexpr int kExitStartFailed = 1;
constexpr int kExitBadConfig = 2;

struct Flags {
  std::string config;
  std::optional<std::string> log_level;
  std::optional<std::string> listen;
  std::optional<std::string> metrics_address;
  std::optional<std::string> http_address;
  std::optional<std::string> redis;
  std::optional<std::string> device;
};

spdlog::level::level_enum ToSpdlog(kvl::server::LogLevel level) {
  switch (level) {
    case kvl::server::LogLevel::kTrace:
      return spdlog::level::trace;
    case kvl::server::LogLevel::kDebug:
      return spdlog::level::debug;
    case kvl::server::LogLevel::kInfo:
      return spdlog::level::info;
    case kvl::server::LogLevel::kWarn:
      return spdlog::level::warn;
    case kvl::server::LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

// Applies the flag overrides; returns an error message or "".
std::string ApplyOverrides(const Flags& flags, kvl::server::ServerConfig* config) {
  if (flags.log_level) {
    absl::StatusOr<kvl::server::LogLevel> level = kvl::server::ParseLogLevel(*flags.log_level);
    if (!level.ok()) return absl::StrCat("--log-level: ", level.status().message());
    config->log.level = *level;
  }
  if (flags.listen) {
    absl::StatusOr<kvl::server::HostPort> address = kvl::server::ParseHostPort(*flags.listen);
    if (!address.ok()) return absl::StrCat("--listen: ", address.status().message());
    config->server.listen_address = *address;
  }
  if (flags.metrics_address) {
    absl::StatusOr<kvl::server::HostPort> address =
        kvl::server::ParseHostPort(*flags.metrics_address);
    if (!address.ok()) return absl::StrCat("--metrics-address: ", address.status().message());
    config->server.metrics_address = *address;
  }
  if (flags.http_address) {
    absl::StatusOr<kvl::server::HostPort> address = kvl::server::ParseHostPort(*flags.http_address);
    if (!address.ok()) return absl::StrCat("--http-address: ", address.status().message());
    config->server.http_address = *address;
  }
  if (flags.device) {
    if (absl::Status s = kvl::ParseDeviceName(*flags.device); !s.ok()) {
      return absl::StrCat("--device: ", s.message());
    }
    config->runtime.device = *flags.device;
  }
  if (flags.redis) {
    absl::StatusOr<kvl::server::HostPort> address = kvl::server::ParseHostPort(*flags.redis);
    if (!address.ok()) return absl::StrCat("--redis: ", address.status().message());
    config->sessions.store.backend = "redis";
    config->sessions.store.redis_address = *flags.redis;
  }
  return "";
}

// Self-pipe: the handler only write()s the signal number (async-signal-safe);
// main() does the real work after reading it. A handler, unlike a blocked mask
// plus sigwait(), also works when a library started threads before main().
int g_signal_pipe[2] = {-1, -1};

extern "C" void OnShutdownSignal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  (void)!write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

absl::Status InstallShutdownPipe() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  struct sigaction action {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal_number : {SIGTERM, SIGINT}) {
    if (sigaction(signal_number, &action, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigaction: ", strerror(errno)));
    }
  }
  std::signal(SIGPIPE, SIG_IGN);
  return absl::OkStatus();
}

// Waits in poll(), then reads: ThreadSanitizer runs a signal's handler late,
// at the thread's next call it intercepts, except inside the calls it knows
// block. poll() is one of those and read() is not, so a TSan build waiting in
// read() would never see SIGTERM (its tests then timed out waiting for exit).
int WaitForShutdownSignal() {
  struct pollfd readable {};
  readable.fd = g_signal_pipe[0];
  readable.events = POLLIN;
  while (poll(&readable, 1, -1) < 0) {
    if (errno != EINTR) return 0;
  }
  unsigned char byte = 0;
  while (read(g_signal_pipe[0], &byte, 1) != 1) {
    if (errno != EINTR) return 0;
  }
  return byte;
}

}  // namespace

int main(int argc, char** argv) {
  kvl::ReexecWithPassiveOpenMpWait(argv);
  Flags flags;
  kvl::FlagSet flag_set(
      "kvl-server",
      "Serves the kvlingo.v1 gRPC API (chat, sessions, models) and GET /metrics as the\n"
      "config file describes (server/README.md). Flags override the file. Exit codes: 0\n"
      "after a clean shutdown on SIGTERM/SIGINT, 1 when the server cannot start (e.g. an\n"
      "address in use), 2 for bad usage or a bad config.");
  flag_set.Required("config", &flags.config, "FILE", "the server's JSON configuration");
  flag_set.Add("log-level", &flags.log_level, "trace|debug|info|warn|error",
               "overrides log.level");
  flag_set.Add("listen", &flags.listen, "HOST:PORT", "overrides server.listen_address");
  flag_set.Add("metrics-address", &flags.metrics_address, "HOST:PORT",
               "overrides server.metrics_address");
  flag_set.Add("http-address", &flags.http_address, "HOST:PORT",
               "serves the OpenAI-compatible HTTP API there (overrides server.http_address)");
  flag_set.Add("device", &flags.device, "cpu|cuda|cuda:N", "overrides runtime.device");
  flag_set.Add("redis", &flags.redis, "HOST:PORT",
               "keeps sessions in this Redis (sessions.store backend \"redis\" at HOST:PORT)");
  if (std::optional<int> exit = flag_set.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit == 0 ? 0 : kExitBadConfig;
  }

  // Before any thread starts: every thread then shares the tuned heap.
  kvl::TuneMallocForTensors();
  if (absl::Status s = InstallShutdownPipe(); !s.ok()) {
    std::cerr << "kvl-server: " << s.message() << "\n";
    return kExitStartFailed;
  }

  absl::StatusOr<kvl::server::ServerConfig> config = kvl::server::LoadConfigFile(flags.config);
  if (!config.ok()) {
    std::cerr << "kvl-server: " << config.status().message() << "\n";
    return kExitBadConfig;
  }
  if (std::string error = ApplyOverrides(flags, &*config); !error.empty()) {
    std::cerr << "kvl-server: " << error << "\n";
    return kExitBadConfig;
  }

  // A device the build or the machine lacks stops the start before anything
  // loads (also checked by Server::Load, for embedders).
  if (!config->models.empty()) {
    if (absl::Status s = kvl::CheckDeviceAvailable(config->runtime.device); !s.ok()) {
      std::cerr << "kvl-server: config: runtime." << s.message() << "\n";
      return kExitBadConfig;
    }
  }

  // Logs go to stderr; stdout carries only the one "listening" line.
  auto logger = spdlog::stderr_color_mt("kvl-server");
  spdlog::set_default_logger(logger);
  spdlog::set_level(ToSpdlog(config->log.level));
  kvl::server::RouteProtobufLogToSpdlog();
  spdlog::info("kvl-server {} starting with {} model(s), {} translator(s), policy {}",
               kvl::server::Version(), config->models.size(), config->translators.size(),
               kvl::router::PolicyName(config->router.policy.policy));

  // A model or translator that cannot be loaded is a bad config (exit 2); an
  // address that cannot be bound is a failed start (exit 1).
  absl::StatusOr<std::unique_ptr<kvl::server::Server>> server = kvl::server::Server::Load(*config);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    std::cerr << "kvl-server: config: " << server.status().message() << "\n";
    return kExitBadConfig;
  }
  if (absl::Status s = (*server)->Serve(); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    std::cerr << "kvl-server: " << s.message() << "\n";
    return kExitStartFailed;
  }
  const std::string listen = (*server)->listen_address().ToString();
  const std::string metrics = (*server)->metrics_address().ToString();
  if (const std::optional<kvl::server::HostPort> http = (*server)->http_address()) {
    // Before the ready line, so that a reader of that line finds this one.
    std::cout << "kvl-server OpenAI API on " << http->ToString() << std::endl;
  }
  std::cout << "kvl-server listening on " << listen << ", metrics on " << metrics << std::endl;
  spdlog::info("serving gRPC on {}, GET /metrics on {}", listen, metrics);

  const int signal_number = WaitForShutdownSignal();
  spdlog::info("received {}; draining (up to {} s)", strsignal(signal_number),
               config->server.drain_timeout_seconds);
  const int64_t cut = (*server)->Shutdown();
  server->reset();
  spdlog::info("stopped{}", cut == 0 ? "" : absl::StrCat(" (", cut, " chat stream(s) cancelled)"));
  return 0;
}
