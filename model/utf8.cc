#include "model/utf8.h"

#include <cstdint>

namespace kvl {

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    const Utf8Lead lead = ReadUtf8Lead(b);
    const size_t need = static_cast<size_t>(lead.need);
    bool ok = need > 0 && i + need < n && s[i + 1] >= lead.lo && s[i + 1] <= lead.hi;
    for (size_t k = 2; ok && k <= need; ++k) ok = s[i + k] >= 0x80 && s[i + k] <= 0xBF;
    if (!ok) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += need + 1;
  }
  return true;
}

}  // namespace kvl
