// The text rules a byte-level BPE tokenizer is built on, shared by the
// tokenizer (model/tokenizer.h) and the BPE trainer (training/bpe_trainer.h):
// if the two disagreed, a trained tokenizer would encode differently from how
// it was trained, silently. Written to match Hugging Face `tokenizers`.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvl {

bool IsAscii(std::string_view s);

// NFC (canonical composition) of valid UTF-8, embedded NULs kept; the input
// unchanged when it is not valid UTF-8 (callers repair it first).
std::string Nfc(std::string_view s);

// A pre-tokenizer regex with \s and \S spelled out as Unicode's White_Space
// set: `tokenizers` compiles with Oniguruma, whose \s is White_Space, while
// PCRE2's \s under UCP also matches U+180E. \S inside a class cannot be
// spelled as a union and stays PCRE2's.
std::string RewriteWhiteSpaceEscapes(std::string_view pattern);

// GPT-2's byte-level alphabet: every byte has a printable stand-in code point.
// Printable Latin-1 bytes stand for themselves; the other 68 bytes map, in
// byte order, to U+0100 upwards.
uint32_t ByteLevelCodePoint(uint8_t byte);
// Each byte of `bytes` as the UTF-8 of its stand-in (how vocabularies and
// merges are written in tokenizer.json).
std::string ByteLevelString(std::string_view bytes);

}  // namespace kvl
