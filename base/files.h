// Whole-file reads and writes: the one place that turns a path into text or
// JSON, so that every loader reports a missing or malformed file the same way.
//
// Thread-safe: free functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvl {

// NotFound ("<path>: cannot open"), DataLoss on a read error.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

// ReadTextFile, then the JSON parse; InvalidArgument ("<path>: malformed
// JSON") when it is not JSON. With allow_comments, // and /* */ comments are
// skipped (configuration files).
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, bool allow_comments = false);

// Creates or truncates `path`; PermissionDenied when it cannot be created,
// DataLoss when the write fails.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace kvl
