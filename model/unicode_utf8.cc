// UTF-8 repair, declared in model/tokenizer.h.
#include <cstdint>
#include <string>
#include <string_view>

#include "model/tokenizer.h"
#include "model/utf8.h"

namespace kvl {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

// Follows the Unicode "maximal subpart" practice (the one Rust's
// from_utf8_lossy, Python's errors="replace" and WHATWG's TextDecoder share):
// a lead byte plus the continuation bytes that are still valid for it is one
// unit; each unit that cannot complete becomes one U+FFFD.
size_t AppendUtf8Lossy(std::string_view in, bool final, std::string* out) {
  const auto* s = reinterpret_cast<const uint8_t*>(in.data());
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      size_t j = i + 1;
      while (j < n && s[j] < 0x80) ++j;
      out->append(in.data() + i, j - i);
      i = j;
      continue;
    }
    const Utf8Lead lead = ReadUtf8Lead(b);
    if (lead.need == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    int k = 0;
    for (; k < lead.need && j < n; ++k, ++j) {
      const uint8_t c = s[j];
      const bool ok = k == 0 ? (c >= lead.lo && c <= lead.hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
    }
    if (k == lead.need) {
      out->append(in.data() + i, j - i);
    } else if (j >= n && !final) {
      return i;  // a prefix of a sequence that may still complete
    } else {
      out->append(kReplacement);
    }
    i = j;
  }
  return n;
}

}  // namespace kvl
