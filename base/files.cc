#include "base/files.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kvl {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return std::move(buffer).str();
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, bool allow_comments) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false,
                                           /*ignore_comments=*/allow_comments);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON"));
  return j;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot create"));
  out << text;
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kvl
