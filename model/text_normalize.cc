#include "model/text_normalize.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvl {
namespace {

constexpr char kWhiteSpaceClassBody[] =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

struct ByteLevelTable {
  std::array<uint32_t, 256> code_point;
  std::array<std::string, 256> utf8;
  ByteLevelTable() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      code_point[b] = printable ? static_cast<uint32_t>(b) : next++;
      utf8proc_uint8_t buf[4];
      const utf8proc_ssize_t n =
          utf8proc_encode_char(static_cast<utf8proc_int32_t>(code_point[b]), buf);
      utf8[b] = std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
    }
  }
};

const ByteLevelTable& Table() {
  static const ByteLevelTable* table = new ByteLevelTable();
  return *table;
}

}  // namespace

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  }
  return true;
}

std::string Nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string RewriteWhiteSpaceEscapes(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceClassBody)
                        : absl::StrCat("[", kWhiteSpaceClassBody, "]");
      } else if (e == 'S' && !in_class) {
        out += absl::StrCat("[^", kWhiteSpaceClassBody, "]");
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // POSIX class, e.g. [:alpha:]
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

uint32_t ByteLevelCodePoint(uint8_t byte) { return Table().code_point[byte]; }

std::string ByteLevelString(std::string_view bytes) {
  const ByteLevelTable& table = Table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += table.utf8[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace kvl
