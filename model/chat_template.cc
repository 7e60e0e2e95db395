#include "model/chat_template.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";
constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";
constexpr absl::string_view kEmptyThink = "<think>\n\n</think>\n\n";

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n'), which the template
// uses; '\n' is ASCII, so byte-wise stripping is UTF-8 safe.
absl::string_view LStripNewlines(absl::string_view s) {
  const size_t i = s.find_first_not_of('\n');
  return i == absl::string_view::npos ? absl::string_view() : s.substr(i);
}
absl::string_view RStripNewlines(absl::string_view s) {
  const size_t i = s.find_last_not_of('\n');
  return i == absl::string_view::npos ? absl::string_view() : s.substr(0, i + 1);
}
absl::string_view StripNewlines(absl::string_view s) { return RStripNewlines(LStripNewlines(s)); }

// s.split(sep)[-1] and s.split(sep)[0].
absl::string_view AfterLast(absl::string_view s, absl::string_view sep) {
  const size_t i = s.rfind(sep);
  return i == absl::string_view::npos ? s : s.substr(i + sep.size());
}
absl::string_view BeforeFirst(absl::string_view s, absl::string_view sep) {
  return s.substr(0, s.find(sep));
}

bool IsToolResponse(absl::string_view content) {
  return absl::StartsWith(content, "<tool_response>") &&
         absl::EndsWith(content, "</tool_response>");
}

// The template's "last_query_index": the last user message that is not a tool
// response, or the last index when there is none.
int64_t LastQueryIndex(const std::vector<ChatMessage>& messages) {
  for (int64_t i = static_cast<int64_t>(messages.size()) - 1; i >= 0; --i) {
    if (messages[i].role == "user" && !IsToolResponse(messages[i].content)) return i;
  }
  return static_cast<int64_t>(messages.size()) - 1;
}

// An assistant message split as the template splits it: the answer after the
// last "</think>", and the reasoning between the first "</think>" and the
// "<think>" before it.
struct AssistantParts {
  absl::string_view content;
  absl::string_view reasoning;
};

AssistantParts SplitAssistant(absl::string_view text) {
  if (text.find(kThinkClose) == absl::string_view::npos) return {text, {}};
  return {LStripNewlines(AfterLast(text, kThinkClose)),
          LStripNewlines(AfterLast(RStripNewlines(BeforeFirst(text, kThinkClose)), kThinkOpen))};
}

// Whether the template writes assistant message `index` with a think block.
bool WritesThinkBlock(const std::vector<ChatMessage>& messages, int64_t index,
                      int64_t last_query_index) {
  const bool is_last = index + 1 == static_cast<int64_t>(messages.size());
  return index > last_query_index &&
         (is_last || !SplitAssistant(messages[index].content).reasoning.empty());
}

// ---------------------------------------------------------------------------
// Gemma-3, Llama-3 and Mistral v0.3.
constexpr absl::string_view kGemmaBos = "<bos>";
constexpr absl::string_view kStartOfTurn = "<start_of_turn>";
constexpr absl::string_view kEndOfTurn = "<end_of_turn>";
constexpr absl::string_view kLlamaBos = "<|begin_of_text|>";
constexpr absl::string_view kStartHeader = "<|start_header_id|>";
constexpr absl::string_view kEndHeader = "<|end_header_id|>";
constexpr absl::string_view kEotId = "<|eot_id|>";
constexpr absl::string_view kMistralBos = "<s>";
constexpr absl::string_view kMistralEos = "</s>";

// Python's str.isspace() for one code point (what jinja2's `trim` filter,
// str.strip(), removes): JavaScript's String.trim differs (it strips U+FEFF and
// keeps U+001C..U+001F and U+0085), so the JS oracle is not used for those.
bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes the code point at s[i] (UTF-8; an invalid byte counts as itself,
// which is never a space) and returns its length.
size_t CodePointAt(absl::string_view s, size_t i, uint32_t* cp) {
  const auto b = static_cast<uint8_t>(s[i]);
  size_t n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
  if (i + n > s.size()) n = 1;
  if (n == 1) {
    *cp = b;
    return 1;
  }
  uint32_t v = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) v = (v << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *cp = v;
  return n;
}

// jinja2's `trim` (Python str.strip()).
absl::string_view Trim(absl::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    uint32_t cp;
    const size_t n = CodePointAt(s, begin, &cp);
    if (!IsPythonSpace(cp)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    uint32_t cp;
    if (CodePointAt(s, start, &cp) != end - start || !IsPythonSpace(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

absl::Status CheckRoles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, ": unsupported role \"", role,
                                                     "\" (expected system, user or assistant)"));
    }
  }
  return absl::OkStatus();
}

// Both templates read messages[0] unguarded: jinja2 raises on an empty list.
absl::Status CheckNotEmpty(const std::vector<ChatMessage>& messages, absl::string_view family) {
  if (!messages.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the ", family, " chat template needs at least one message"));
}

// The template's check after the optional leading system message: the n-th
// remaining message is a user message exactly when n is even.
absl::Status CheckAlternation(const std::vector<ChatMessage>& messages, size_t first) {
  for (size_t i = first; i < messages.size(); ++i) {
    if ((messages[i].role == "user") != ((i - first) % 2 == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " (", messages[i].role,
                       "): after an optional system message, roles must alternate "
                       "user/assistant/user/..."));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RenderGemma(const std::vector<ChatMessage>& messages,
                                        const ChatTemplateOptions& options) {
  KVL_RETURN_IF_ERROR(CheckNotEmpty(messages, "Gemma"));
  const bool has_system = messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  KVL_RETURN_IF_ERROR(CheckAlternation(messages, first));
  std::string out(kGemmaBos);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    absl::StrAppend(&out, kStartOfTurn, m.role == "assistant" ? "model" : m.role, "\n");
    if (i == first && has_system) absl::StrAppend(&out, messages[0].content, "\n\n");
    absl::StrAppend(&out, Trim(m.content), kEndOfTurn, "\n");
  }
  if (options.add_generation_prompt) out += GenerationPrompt(false, ChatTemplateKind::kGemma);
  return out;
}

absl::StatusOr<std::string> RenderLlama3(const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) absl::StrAppend(&out, kLlamaBos);
    absl::StrAppend(&out, kStartHeader, messages[i].role, kEndHeader, "\n\n",
                    Trim(messages[i].content), kEotId);
  }
  if (options.add_generation_prompt) out += GenerationPrompt(false, ChatTemplateKind::kLlama3);
  return out;
}

absl::StatusOr<std::string> RenderMistral(const std::vector<ChatMessage>& messages) {
  KVL_RETURN_IF_ERROR(CheckNotEmpty(messages, "Mistral"));
  const bool has_system = messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  KVL_RETURN_IF_ERROR(CheckAlternation(messages, first));
  std::string out(kMistralBos);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      if (i + 1 == messages.size() && has_system) {
        absl::StrAppend(&out, "[INST] ", messages[0].content, "\n\n", m.content, "[/INST]");
      } else {
        absl::StrAppend(&out, "[INST] ", m.content, "[/INST]");
      }
    } else if (m.role == "assistant") {
      absl::StrAppend(&out, " ", Trim(m.content), kMistralEos);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", i, ": the Mistral chat template admits a system message only first"));
    }
  }
  return out;
}

absl::StatusOr<std::string> RenderQwen3(const std::vector<ChatMessage>& messages,
                                        const ChatTemplateOptions& options);

}  // namespace

absl::string_view ChatTemplateKindName(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kQwen3:
      return "qwen3";
    case ChatTemplateKind::kGemma:
      return "gemma";
    case ChatTemplateKind::kLlama3:
      return "llama3";
    case ChatTemplateKind::kMistral:
      return "mistral";
  }
  return "";
}

absl::string_view StopToken(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kQwen3:
      return "<|im_end|>";
    case ChatTemplateKind::kGemma:
      return "<end_of_turn>";
    case ChatTemplateKind::kLlama3:
      return "<|eot_id|>";
    case ChatTemplateKind::kMistral:
      return "</s>";
  }
  return "";
}

absl::StatusOr<ChatTemplateKind> ChatTemplateKindForModelDir(const std::string& dir) {
  using nlohmann::json;
  absl::StatusOr<std::string> tokenizer_config = ReadTextFile(dir + "/tokenizer_config.json");
  if (tokenizer_config.ok()) {
    const json j = json::parse(*tokenizer_config, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()) {
      const std::string t = j["chat_template"].get<std::string>();
      if (absl::StrContains(t, "<|im_start|>")) return ChatTemplateKind::kQwen3;
      if (absl::StrContains(t, "<start_of_turn>")) return ChatTemplateKind::kGemma;
      if (absl::StrContains(t, "<|start_header_id|>")) return ChatTemplateKind::kLlama3;
      if (absl::StrContains(t, "[INST]")) return ChatTemplateKind::kMistral;
    }
  }
  absl::StatusOr<std::string> config = ReadTextFile(dir + "/config.json");
  if (!config.ok()) return config.status();
  const json j = json::parse(*config, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(dir + "/config.json: not a JSON object");
  std::string name;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    name = j["architectures"][0].get<std::string>();
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    name = j["model_type"].get<std::string>();
  }
  const auto starts = [&](absl::string_view prefix) {
    return absl::StartsWithIgnoreCase(name, prefix);
  };
  if (starts("qwen3") || starts("qwen2")) return ChatTemplateKind::kQwen3;
  if (starts("gemma3")) return ChatTemplateKind::kGemma;
  if (starts("llama")) return ChatTemplateKind::kLlama3;
  if (starts("mistral")) return ChatTemplateKind::kMistral;
  return absl::InvalidArgumentError(
      absl::StrCat(dir, "/config.json: no chat template for architecture '", name,
                   "' (known: Qwen2/Qwen3, Gemma3, Llama, Mistral)"));
}

std::string GenerationPrompt(bool enable_thinking, ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kQwen3:
      break;
    case ChatTemplateKind::kGemma:
      return absl::StrCat(kStartOfTurn, "model\n");
    case ChatTemplateKind::kLlama3:
      return absl::StrCat(kStartHeader, "assistant", kEndHeader, "\n\n");
    case ChatTemplateKind::kMistral:
      return "";
  }
  std::string out = absl::StrCat(kImStart, "assistant\n");
  if (!enable_thinking) absl::StrAppend(&out, kEmptyThink);
  return out;
}

absl::StatusOr<std::string> RenderChat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options) {
  KVL_RETURN_IF_ERROR(CheckRoles(messages));
  switch (options.kind) {
    case ChatTemplateKind::kQwen3:
      return RenderQwen3(messages, options);
    case ChatTemplateKind::kGemma:
      return RenderGemma(messages, options);
    case ChatTemplateKind::kLlama3:
      return RenderLlama3(messages, options);
    case ChatTemplateKind::kMistral:
      return RenderMistral(messages);
  }
  return absl::InvalidArgumentError("unknown chat template kind");
}

namespace {

absl::StatusOr<std::string> RenderQwen3(const std::vector<ChatMessage>& messages,
                                        const ChatTemplateOptions& options) {
  std::string out;
  const int64_t last_query = LastQueryIndex(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      const AssistantParts parts = SplitAssistant(m.content);
      absl::StrAppend(&out, kImStart, "assistant\n");
      if (WritesThinkBlock(messages, i, last_query)) {
        absl::StrAppend(&out, kThinkOpen, "\n", StripNewlines(parts.reasoning), "\n", kThinkClose,
                        "\n\n", LStripNewlines(parts.content));
      } else {
        absl::StrAppend(&out, parts.content);
      }
      absl::StrAppend(&out, kImEnd, "\n");
    } else {
      // A leading system message and every user or later system message are
      // written the same way.
      absl::StrAppend(&out, kImStart, m.role, "\n", m.content, kImEnd, "\n");
    }
  }
  if (options.add_generation_prompt) out += GenerationPrompt(options.enable_thinking);
  return out;
}

}  // namespace

std::string RenderUserTurn(absl::string_view content, const ChatTemplateOptions& options) {
  std::string out;
  switch (options.kind) {
    case ChatTemplateKind::kQwen3:
      out = absl::StrCat(kImStart, "user\n", content, kImEnd, "\n");
      break;
    case ChatTemplateKind::kGemma:
      out = absl::StrCat(kStartOfTurn, "user\n", Trim(content), kEndOfTurn, "\n");
      break;
    case ChatTemplateKind::kLlama3:
      out = absl::StrCat(kStartHeader, "user", kEndHeader, "\n\n", Trim(content), kEotId);
      break;
    case ChatTemplateKind::kMistral:
      return absl::StrCat("[INST] ", content, "[/INST]");
  }
  if (options.add_generation_prompt) out += GenerationPrompt(options.enable_thinking, options.kind);
  return out;
}

namespace {

// Where SessionPreamble's first turn opens: the user turn's opening for the
// families whose preamble writes it.
absl::string_view FirstTurnOpening(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kGemma:
      return "<start_of_turn>user\n";
    case ChatTemplateKind::kMistral:
      return "[INST] ";
    case ChatTemplateKind::kQwen3:
    case ChatTemplateKind::kLlama3:
      break;
  }
  return "";
}

}  // namespace

std::string SessionPreamble(absl::string_view system_prompt, ChatTemplateKind kind) {
  ChatTemplateOptions options;
  options.kind = kind;
  options.add_generation_prompt = false;
  switch (kind) {
    case ChatTemplateKind::kQwen3:
    case ChatTemplateKind::kLlama3: {
      if (system_prompt.empty()) return kind == ChatTemplateKind::kLlama3 ? "<|begin_of_text|>" : "";
      absl::StatusOr<std::string> text =
          RenderChat({ChatMessage{"system", std::string(system_prompt)}}, options);
      return text.ok() ? *text : std::string();
    }
    case ChatTemplateKind::kGemma:
    case ChatTemplateKind::kMistral:
      break;
  }
  // The template's own rendering of [system,] user up to the user's content
  // (a placeholder no template trims or escapes).
  constexpr absl::string_view kMark = "\x01kvl-first-turn\x01";
  std::vector<ChatMessage> messages;
  if (!system_prompt.empty()) messages.push_back({"system", std::string(system_prompt)});
  messages.push_back({"user", std::string(kMark)});
  absl::StatusOr<std::string> text = RenderChat(messages, options);
  if (!text.ok()) return std::string();
  const size_t at = text->find(kMark.data(), 0, kMark.size());
  return at == std::string::npos ? std::string() : text->substr(0, at);
}

std::string SessionUserTurn(absl::string_view content, bool first,
                            const ChatTemplateOptions& options) {
  std::string turn = RenderUserTurn(content, options);
  const absl::string_view opening = FirstTurnOpening(options.kind);
  if (first && !opening.empty() && absl::StartsWith(turn, opening)) turn.erase(0, opening.size());
  return turn;
}

std::string CloseAssistantTurn(absl::string_view generated, ChatTemplateKind kind) {
  const absl::string_view stop = StopToken(kind);
  const bool stopped = absl::EndsWith(generated, stop);
  switch (kind) {
    case ChatTemplateKind::kQwen3:
    case ChatTemplateKind::kGemma:
      // The template puts a newline after the stop token.
      return stopped ? std::string("\n") : absl::StrCat(stop, "\n");
    case ChatTemplateKind::kLlama3:
    case ChatTemplateKind::kMistral:
      return stopped ? std::string() : std::string(stop);
  }
  return "";
}

bool UserTurnAppendsExactly(const std::vector<ChatMessage>& history, absl::string_view content,
                            ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kQwen3:
      break;
    case ChatTemplateKind::kGemma:
    case ChatTemplateKind::kMistral: {
      if (!CheckRoles(history).ok() || history.empty()) return false;
      ChatTemplateOptions options;
      options.kind = kind;
      options.add_generation_prompt = false;
      const bool has_system = history[0].role == "system";
      if (kind == ChatTemplateKind::kMistral && has_system) return false;
      return history.size() > (has_system ? 1u : 0u) && history.back().role != "user" &&
             RenderChat(history, options).ok();
    }
    case ChatTemplateKind::kLlama3:
      return !history.empty() && CheckRoles(history).ok();
  }
  // Every user message is written the same way wherever it stands, so the
  // identity holds exactly when no assistant message of `history` changes
  // between plain and think-block form once the new turn follows it.
  const int64_t n = static_cast<int64_t>(history.size());
  const int64_t last_query_before = LastQueryIndex(history);
  const bool history_has_query = n > 0 && history[last_query_before].role == "user" &&
                                 !IsToolResponse(history[last_query_before].content);
  // A tool-response wrapper is not a query: the last query stays where it was.
  const int64_t last_query_after =
      IsToolResponse(content) && history_has_query ? last_query_before : n;
  for (int64_t i = 0; i < n; ++i) {
    if (history[i].role != "assistant") continue;
    const bool before = WritesThinkBlock(history, i, last_query_before);
    // Never the last message after the append.
    const bool after =
        i > last_query_after && !SplitAssistant(history[i].content).reasoning.empty();
    if (before != after) return false;
  }
  return true;
}

}  // namespace kvl
