// kvl hash-key: prints the SHA-256 of an API key, the form kvl-server's
// configuration stores (auth.keys[].sha256), so that the key itself is never
// written to a file. The key is read from stdin (one line), not from the
// command line, where `ps` and shell history would see it. --generate makes a
// new random key, prints it once on stderr and its hash on stdout.
#include <openssl/rand.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "base/flags.h"
#include "base/sha256.h"
#include "tools/commands.h"

namespace kvl::tools {

int RunHashKey(const Args& args) {
  bool generate = false;
  FlagSet flags("kvl hash-key",
                "Reads an API key from stdin and prints its SHA-256 (hex) for kvl-server's\n"
                "auth.keys[].sha256. With --generate, makes a random key instead: the key goes\n"
                "to stderr (give it to the client), the hash to stdout (put it in the config).");
  flags.Switch("generate", &generate, "make a new random key (32 random bytes, base64url)");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  std::string key;
  if (generate) {
    unsigned char bytes[32];
    if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
      std::fprintf(stderr, "kvl hash-key: no randomness available\n");
      return 1;
    }
    key = "kvl_" + absl::WebSafeBase64Escape(
                       absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
    std::fprintf(stderr, "%s\n", key.c_str());
  } else {
    std::getline(std::cin, key);
    key = std::string(absl::StripAsciiWhitespace(key));
    if (key.empty()) {
      std::fprintf(stderr, "kvl hash-key: no key on stdin (or use --generate)\n");
      return 2;
    }
  }
  std::printf("%s\n", Sha256Hex(key).c_str());
  return 0;
}

}  // namespace kvl::tools
