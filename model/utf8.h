// UTF-8 well-formedness: the one validator, used by the tokenizer (added
// tokens, Encode's fast path) and by the server (every text field of a
// request). Repair of ill-formed input (one U+FFFD per maximal subpart) is
// AppendUtf8Lossy in model/tokenizer.h; text is valid exactly when repair
// leaves it unchanged.
//
// Thread-safe: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvl {

// Unicode's Table 3-7 for a byte at 0x80 or above: the continuation bytes
// its sequence needs and the range of the first of them (which excludes
// overlong forms, surrogates and code points above U+10FFFF); later ones are
// 80..BF. need 0: the byte cannot begin a sequence. Shared by IsValidUtf8
// and AppendUtf8Lossy (model/unicode_utf8.cc).
struct Utf8Lead {
  int need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
};
constexpr Utf8Lead ReadUtf8Lead(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {};
}

// True when `text` is well-formed UTF-8 (Unicode's Table 3-7: no overlong
// forms, no surrogates, nothing above U+10FFFF; NUL is a valid code point).
// On failure *bad_offset (when given) is the offset of the first byte of the
// first ill-formed sequence.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

}  // namespace kvl
