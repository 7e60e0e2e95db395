#include "training/jsonl_log.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvl::training {

absl::StatusOr<JsonlLog> JsonlLog::Open(const std::string& path, Mode mode) {
  std::ofstream out(path, mode == Mode::kTruncate ? std::ios::trunc : std::ios::app);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open"));
  return JsonlLog(path, std::move(out));
}

absl::Status JsonlLog::Append(const nlohmann::json& line) {
  out_ << line.dump() << '\n';
  out_.flush();
  if (!out_) return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kvl::training
