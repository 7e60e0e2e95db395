// Does a TSan build run a SIGTERM handler while the main thread waits in
// read() on the handler's self-pipe? And in poll()? Usage: signal_wait.sh.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

int g_pipe[2];

extern "C" void OnSignal(int signal_number) {
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  (void)!write(g_pipe[1], &byte, 1);
}

int main(int argc, char** argv) {
  if (argc != 2 || pipe(g_pipe) != 0) return 2;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  std::thread([] { sleep(100); }).detach();  // a second thread, as in kvl-server
  if (std::strcmp(argv[1], "poll") == 0) {
    struct pollfd readable {};
    readable.fd = g_pipe[0];
    readable.events = POLLIN;
    while (poll(&readable, 1, -1) < 0) {
    }
  }
  unsigned char byte = 0;
  while (read(g_pipe[0], &byte, 1) != 1) {
  }
  std::printf("handled signal %d\n", byte);
  return 0;
}
