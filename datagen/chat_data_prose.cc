// Prose clean-up for the chat-data generator, and SHA-256 for source hashes.
#include <array>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "datagen/chat_data.h"

namespace kvl::datagen {
namespace {

std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

bool IsBlank(std::string_view line) { return line.find_first_not_of(" \t\f\v") == std::string_view::npos; }
bool StartsIndented(std::string_view line) { return !line.empty() && (line[0] == ' ' || line[0] == '\t'); }
std::string_view Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// A heading underline or a rule: "-----", "=====", "^^^^", at least 3 chars.
bool IsUnderline(std::string_view line) {
  line = Trim(line);
  if (line.size() < 3) return false;
  for (char c : line) {
    if (std::string_view("=-^~*#+\"'`_").find(c) == std::string_view::npos || c != line[0]) return false;
  }
  return true;
}

// Blocks of consecutive non-blank lines.
std::vector<std::vector<std::string_view>> Blocks(std::string_view text) {
  std::vector<std::vector<std::string_view>> blocks(1);
  for (std::string_view line : SplitLines(text)) {
    if (IsBlank(line)) {
      if (!blocks.back().empty()) blocks.emplace_back();
    } else {
      blocks.back().push_back(line);
    }
  }
  if (blocks.back().empty()) blocks.pop_back();
  return blocks;
}

std::string JoinLines(const std::vector<std::string_view>& lines) {
  std::string out;
  for (std::string_view l : lines) {
    if (!out.empty()) out += ' ';
    out += Trim(l);
  }
  return out;
}

// ``lit`` -> lit; :role:`text` -> text; `Title <target>`_ -> Title; **b** -> b.
std::string StripRst(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 2, "``") == 0) {
      const size_t end = s.find("``", i + 2);
      if (end == std::string_view::npos) return {};
      out.append(s.substr(i + 2, end - i - 2));
      i = end + 2;
      continue;
    }
    if (s[i] == ':') {
      size_t j = i + 1;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_' || s[j] == ':' ||
                              s[j] == '-' || s[j] == '+')) {
        ++j;
      }
      if (j > i + 1 && j < s.size() && s[j] == '`' && s[j - 1] == ':') {
        i = j;
        continue;
      }
    }
    if (s[i] == '`') {
      const size_t end = s.find('`', i + 1);
      if (end == std::string_view::npos) return {};
      std::string_view inner = s.substr(i + 1, end - i - 1);
      const size_t lt = inner.rfind(" <");
      if (lt != std::string_view::npos && inner.back() == '>') inner = inner.substr(0, lt);
      out.append(inner);
      i = end + 1;
      while (i < s.size() && s[i] == '_') ++i;
      continue;
    }
    if (s.compare(i, 2, "**") == 0) {
      i += 2;
      continue;
    }
    out += s[i++];
  }
  return out;
}

// Pod formatting codes: C<x>, B<< x >>, L<text|target>, E<gt>, ...
std::string StripPod(std::string_view s, bool* ok) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::string_view("BCEFILSXZ").find(c) != std::string_view::npos && i + 1 < s.size() && s[i + 1] == '<') {
      size_t n_angle = 0;
      while (i + 1 + n_angle < s.size() && s[i + 1 + n_angle] == '<') ++n_angle;
      size_t body_start = i + 1 + n_angle;
      size_t body_end;
      size_t next;
      if (n_angle >= 2) {
        const std::string close = " " + std::string(n_angle, '>');
        body_end = s.find(close, body_start);
        if (body_end == std::string_view::npos) {
          *ok = false;
          return {};
        }
        next = body_end + close.size();
        while (body_start < body_end && s[body_start] == ' ') ++body_start;
      } else {
        int depth = 1;
        size_t j = body_start;
        for (; j < s.size(); ++j) {
          if (s[j] == '<' && j > 0 && s[j - 1] >= 'A' && s[j - 1] <= 'Z') ++depth;
          if (s[j] == '>' && --depth == 0) break;
        }
        if (j >= s.size()) {
          *ok = false;
          return {};
        }
        body_end = j;
        next = j + 1;
      }
      std::string_view body = s.substr(body_start, body_end - body_start);
      if (c == 'E') {
        if (body == "lt") out += '<';
        else if (body == "gt") out += '>';
        else if (body == "verbar") out += '|';
        else if (body == "sol") out += '/';
        else {
          *ok = false;
          return {};
        }
      } else if (c == 'L') {
        const size_t bar = body.find('|');
        std::string inner = StripPod(bar == std::string_view::npos ? body : body.substr(0, bar), ok);
        if (bar == std::string_view::npos && inner.find('/') != std::string::npos) inner.erase(inner.find('/'));
        out += inner;
      } else if (c != 'X' && c != 'Z') {
        out += StripPod(body, ok);
      }
      i = next;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

// Maps common UTF-8 punctuation to ASCII, collapses whitespace; returns "" when
// the paragraph still holds other non-ASCII bytes or control characters.
std::string NormalizeAscii(std::string_view s) {
  struct Map {
    std::string_view from, to;
  };
  static constexpr Map kMaps[] = {
      {"\xE2\x80\x98", "'"}, {"\xE2\x80\x99", "'"}, {"\xE2\x80\x9C", "\""}, {"\xE2\x80\x9D", "\""},
      {"\xE2\x80\x93", "-"}, {"\xE2\x80\x94", "-"}, {"\xE2\x80\xA6", "..."}, {"\xC2\xA0", " "},
  };
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      bool mapped = false;
      for (const Map& m : kMaps) {
        if (s.compare(i, m.from.size(), m.from) == 0) {
          out += m.to;
          i += m.from.size();
          mapped = true;
          break;
        }
      }
      if (!mapped) return {};
      continue;
    }
    if (c == '\t' || c == '\n' || c == '\r') {
      out += ' ';
    } else if (c < 0x20 || c == 0x7F) {
      return {};
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  std::string collapsed;
  for (char c : out) {
    if (c == ' ' && (collapsed.empty() || collapsed.back() == ' ')) continue;
    collapsed += c;
  }
  while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
  return collapsed;
}

// Keeps paragraphs that read as English sentences: long enough, mostly
// letters, ending like a sentence, and free of chat-template markers.
bool LooksLikeProse(const std::string& p) {
  if (p.size() < 60 || p.size() > 2000) return false;
  const char last = p.back();
  if (last != '.' && last != '?' && last != '!') return false;
  if (p.find("<|") != std::string::npos) return false;
  size_t n_alpha = 0;
  size_t n_space = 0;
  for (char c : p) {
    if (std::isalpha(static_cast<unsigned char>(c))) ++n_alpha;
    if (c == ' ') ++n_space;
  }
  return n_space >= 8 && n_alpha * 10 >= (p.size() - n_space) * 8;
}

std::vector<std::string> RelNotesParagraphs(std::string_view text) {
  std::vector<std::string> out;
  std::string current;
  auto flush = [&] {
    if (!current.empty()) out.push_back(current);
    current.clear();
  };
  for (std::string_view line : SplitLines(text)) {
    const std::string_view t = Trim(line);
    if (t.empty() || IsUnderline(line)) {
      flush();
      continue;
    }
    if (t.rfind("(merge ", 0) == 0) {
      flush();
      continue;
    }
    if (t.rfind("* ", 0) == 0) {
      flush();
      current = std::string(t.substr(2));
      continue;
    }
    if (!current.empty()) current += ' ';
    current += t;
  }
  flush();
  return out;
}

// The POD regions of a Perl file: from a line starting "=word" (not "=cut")
// through the next "=cut". The command lines themselves are kept.
std::string PodRegions(std::string_view text) {
  std::string out;
  bool in_pod = false;
  for (std::string_view line : SplitLines(text)) {
    if (line.size() > 1 && line[0] == '=' && std::isalpha(static_cast<unsigned char>(line[1]))) {
      in_pod = line.rfind("=cut", 0) != 0;
    }
    if (in_pod) {
      out.append(line);
      out += '\n';
    }
  }
  return out;
}

// The text of the first "#[==[.rst:" ... "#]==]" bracket comment of a .cmake file.
std::string CmakeModuleDoc(std::string_view text) {
  const size_t open = text.find("#[");
  if (open == std::string_view::npos) return {};
  size_t i = open + 2;
  size_t n_eq = 0;
  while (i < text.size() && text[i] == '=') ++n_eq, ++i;
  const std::string head = "[.rst:";
  if (text.compare(i, head.size(), head) != 0) return {};
  const size_t start = text.find('\n', i);
  if (start == std::string_view::npos) return {};
  const std::string close = "]" + std::string(n_eq, '=') + "]";
  size_t end = text.find(close, start);
  if (end == std::string_view::npos) return {};
  if (end > 0 && text[end - 1] == '#') --end;
  return std::string(text.substr(start + 1, end - start - 1));
}

}  // namespace

std::vector<std::string> ExtractParagraphs(std::string_view text, ProseFormat format) {
  std::string extracted;
  if (format == ProseFormat::kPod) {
    extracted = PodRegions(text);
    text = extracted;
  } else if (format == ProseFormat::kCmakeModule) {
    extracted = CmakeModuleDoc(text);
    text = extracted;
    format = ProseFormat::kRst;
  }
  std::vector<std::string> raw;
  if (format == ProseFormat::kRelNotes) {
    raw = RelNotesParagraphs(text);
  } else {
    for (const auto& block : Blocks(text)) {
      std::vector<std::string_view> lines;
      if (format == ProseFormat::kRst) {
        if (block[0].rfind(".. ", 0) == 0 || StartsIndented(block[0])) continue;
        for (std::string_view l : block) {
          if (!IsUnderline(l)) lines.push_back(l);
        }
        if (!lines.empty()) raw.push_back(StripRst(JoinLines(lines)));
      } else if (format == ProseFormat::kPod) {
        if (StartsIndented(block[0])) continue;
        for (std::string_view l : block) {
          if (l.rfind("=", 0) != 0) lines.push_back(l);
        }
        bool ok = true;
        std::string stripped = lines.empty() ? std::string() : StripPod(JoinLines(lines), &ok);
        if (ok && !stripped.empty()) raw.push_back(stripped);
      } else {
        raw.push_back(JoinLines(block));
      }
    }
  }
  std::vector<std::string> out;
  for (const std::string& r : raw) {
    std::string p = NormalizeAscii(r);
    if (LooksLikeProse(p)) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace kvl::datagen
