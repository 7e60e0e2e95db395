// SHA-256 (FIPS 180-4), for content hashes (tokenizer files, corpora) and
// API key digests; no dependency on a crypto library.
//
// Thread-safe: a free function.
#pragma once

#include <string>
#include <string_view>

namespace kvl {

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

}  // namespace kvl
