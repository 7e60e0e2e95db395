// UTF-8 well-formedness: the one validator, used by the tokenizer (added
// tokens, Encode's fast path) and by the server (every text field of a
// request). Repair of ill-formed input (one U+FFFD per maximal subpart) is
// AppendUtf8Lossy in model/tokenizer.h; text is valid exactly when repair
// leaves it unchanged.
//
// Thread-safe: a pure function.
#pragma once

#include <cstddef>
#include <string_view>

namespace kvl {

// True when `text` is well-formed UTF-8 (Unicode's Table 3-7: no overlong
// forms, no surrogates, nothing above U+10FFFF; NUL is a valid code point).
// On failure *bad_offset (when given) is the offset of the first byte of the
// first ill-formed sequence.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

}  // namespace kvl
