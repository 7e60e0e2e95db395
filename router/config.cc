#include "router/config.h"

#include <string>

#include "absl/strings/cord.h"

namespace kvl::router {
namespace {

// The payload's type URL; its value is the setting's number.
constexpr char kSettingUrl[] = "type.kvlingo/router.Setting";

}  // namespace

absl::Status WithSetting(absl::Status status, Setting setting) {
  if (!status.ok()) {
    status.SetPayload(kSettingUrl, absl::Cord(std::to_string(static_cast<int>(setting))));
  }
  return status;
}

std::optional<Setting> SettingOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kSettingUrl);  // absl::optional
  if (!payload.has_value()) return std::nullopt;
  const std::string text(*payload);
  if (text.size() != 1 || text[0] < '0' ||
      text[0] > '0' + static_cast<int>(Setting::kNativeLayers)) {
    return std::nullopt;
  }
  return static_cast<Setting>(text[0] - '0');
}

}  // namespace kvl::router
