// A JSON-lines log written as a run goes (one object per line, e.g. the
// per-step record of train-lm and distill): every line is flushed and
// checked, so that a full disk or a bad path stops the run with an error that
// names the file instead of losing the record silently. Whole files (the
// summaries) go through base/files.h WriteTextFile.
//
// Thread-compatible: one writer per log.
#pragma once

#include <fstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvl::training {

class JsonlLog {
 public:
  enum class Mode { kTruncate, kAppend };

  // PermissionDenied ("<path>: cannot open") when the file cannot be opened
  // (a missing directory, no permission, a directory at that path).
  static absl::StatusOr<JsonlLog> Open(const std::string& path, Mode mode);

  // Writes line.dump() and a newline, then flushes; DataLoss ("<path>: write
  // failed") when either fails. After a failure every later Append fails too.
  absl::Status Append(const nlohmann::json& line);

  const std::string& path() const { return path_; }

 private:
  JsonlLog(std::string path, std::ofstream out) : path_(std::move(path)), out_(std::move(out)) {}

  std::string path_;
  std::ofstream out_;
};

}  // namespace kvl::training
