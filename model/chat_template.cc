#include "model/chat_template.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

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

}  // namespace

std::string GenerationPrompt(bool enable_thinking) {
  std::string out = absl::StrCat(kImStart, "assistant\n");
  if (!enable_thinking) absl::StrAppend(&out, kEmptyThink);
  return out;
}

absl::StatusOr<std::string> RenderChat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, ": unsupported role \"", role,
                                                     "\" (expected system, user or assistant)"));
    }
  }
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

std::string RenderUserTurn(absl::string_view content, const ChatTemplateOptions& options) {
  std::string out = absl::StrCat(kImStart, "user\n", content, kImEnd, "\n");
  if (options.add_generation_prompt) out += GenerationPrompt(options.enable_thinking);
  return out;
}

std::string CloseAssistantTurn(absl::string_view generated) {
  return absl::EndsWith(generated, kImEnd) ? std::string("\n") : absl::StrCat(kImEnd, "\n");
}

bool UserTurnAppendsExactly(const std::vector<ChatMessage>& history, absl::string_view content) {
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
