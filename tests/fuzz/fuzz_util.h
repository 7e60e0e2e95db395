// Helpers shared by the fuzz targets (tests/fuzz/README.md).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvl::fuzz {

// A property of the code under test does not hold: print it and abort, which
// libFuzzer (and the replay driver) report as a crash with this input saved.
[[noreturn]] inline void Violated(std::string_view what) {
  std::fprintf(stderr, "fuzz property violated: %.*s\n", static_cast<int>(what.size()),
               what.data());
  std::abort();
}

#define KVL_FUZZ_CHECK(cond, what) \
  do {                             \
    if (!(cond)) ::kvl::fuzz::Violated(what); \
  } while (0)

// The parsers that take a path read the input from this process's own file,
// rewritten for every input (tmpfs when the machine has one).
inline const std::string& InputPath() {
  static const std::string path = [] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/kvl-fuzz-" + std::to_string(getpid()) + ".bin";
  }();
  return path;
}

inline const std::string& WriteInput(const uint8_t* data, size_t size) {
  const std::string& path = InputPath();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) Violated("cannot write the input file " + path);
  return path;
}

// With KVL_FUZZ_VERBOSE set, prints what the parser answered (to check that
// the seeds are accepted).
inline void Note(const absl::Status& status) {
  static const bool verbose = std::getenv("KVL_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "  -> %s\n", status.ToString().c_str());
}

inline void RemoveInput() { std::remove(InputPath().c_str()); }

}  // namespace kvl::fuzz
