#include "tests/testing/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvl::testing {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<int> FindFreeLoopbackPort() {
  Fd fd(socket(AF_INET, SOCK_STREAM, 0));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return absl::UnavailableError(absl::StrCat("bind: ", strerror(errno)));
  }
  socklen_t len = sizeof addr;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", strerror(errno)));
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("getaddrinfo(", host, "): ", gai_strerror(rc)));
  }
  Fd fd(socket(found->ai_family, SOCK_STREAM, 0));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int connected = connect(fd.get(), found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  if (connected != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", host, ":", port, ": ", strerror(errno)));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, ":", port,
                                           "\r\nConnection: close\r\n\r\n");
  if (send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
  }
  std::string raw;
  char buffer[8192];
  while (true) {
    const ssize_t got = recv(fd.get(), buffer, sizeof buffer, 0);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError(
            absl::StrCat("GET ", path, ": no complete reply in time"));
      }
      return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
    }
    raw.append(buffer, static_cast<size_t>(got));
  }
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return absl::DataLossError("HTTP reply without a header end");
  HttpResponse response;
  response.body = raw.substr(head_end + 4);
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, head_end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &response.status)) {
    return absl::DataLossError(absl::StrCat("bad HTTP status line '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    response.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  return response;
}

}  // namespace kvl::testing
