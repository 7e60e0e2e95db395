// UTF-8 repair, declared in model/tokenizer.h.
#include <cstdint>
#include <string>
#include <string_view>

#include "model/tokenizer.h"

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
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // valid range of the first continuation byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b == 0xE0) {
      need = 2, lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
      need = 2;
    } else if (b == 0xED) {
      need = 2, hi = 0x9F;  // excludes surrogates
    } else if (b == 0xF0) {
      need = 3, lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      need = 3;
    } else if (b == 0xF4) {
      need = 3, hi = 0x8F;  // nothing above U+10FFFF
    } else {
      out->append(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    int k = 0;
    for (; k < need && j < n; ++k, ++j) {
      const uint8_t c = s[j];
      const bool ok = k == 0 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
    }
    if (k == need) {
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
