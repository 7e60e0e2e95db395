// The chat template (model/chat_template.h) on arbitrary conversations. The
// input is split at 0xFF bytes into messages; each message's first byte picks
// its role (system, user, assistant, or an unsupported one) and the rest is
// its content. Properties: unsupported roles are InvalidArgument; every
// rendering starts with <|im_start|>; UserTurnAppendsExactly(history, c) is
// true exactly when rendering history + {user, c} equals rendering history
// without a generation prompt followed by RenderUserTurn(c).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "model/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const kvl::ChatTemplateOptions options{/*add_generation_prompt=*/true,
                                         /*enable_thinking=*/(data[0] & 1) != 0};
  std::vector<kvl::ChatMessage> messages;
  bool unsupported = false;
  size_t start = 1;
  while (start <= size) {
    size_t end = start;
    while (end < size && data[end] != 0xFF) ++end;
    if (end > start) {
      static const char* const kRoles[] = {"system", "user", "assistant", "tool"};
      const uint8_t pick = data[start] % 4;
      unsupported |= pick == 3;
      messages.push_back({kRoles[pick], std::string(reinterpret_cast<const char*>(data + start + 1),
                                                    end - start - 1)});
    }
    start = end + 1;
  }
  absl::StatusOr<std::string> rendered = kvl::RenderChat(messages, options);
  if (unsupported) {
    KVL_FUZZ_CHECK(!rendered.ok() && rendered.status().code() == absl::StatusCode::kInvalidArgument,
                   "an unsupported role is InvalidArgument");
    return 0;
  }
  KVL_FUZZ_CHECK(rendered.ok(), "RenderChat refused supported roles: " + rendered.status().ToString());
  if (messages.empty()) return 0;
  KVL_FUZZ_CHECK(absl::StartsWith(*rendered, "<|im_start|>"), "rendering starts with <|im_start|>");

  // The last message as a new user turn after the others.
  std::vector<kvl::ChatMessage> history(messages.begin(), messages.end() - 1);
  const std::string content = messages.back().content;
  std::vector<kvl::ChatMessage> with_turn = history;
  with_turn.push_back({"user", content});
  absl::StatusOr<std::string> whole = kvl::RenderChat(with_turn, options);
  kvl::ChatTemplateOptions no_prompt = options;
  no_prompt.add_generation_prompt = false;
  absl::StatusOr<std::string> before = kvl::RenderChat(history, no_prompt);
  KVL_FUZZ_CHECK(whole.ok() && before.ok(), "rendering supported roles");
  const bool appends = *whole == *before + kvl::RenderUserTurn(content, options);
  KVL_FUZZ_CHECK(appends == kvl::UserTurnAppendsExactly(history, content),
                 appends ? "UserTurnAppendsExactly is false but the turn appends exactly"
                         : "UserTurnAppendsExactly is true but the rendering differs");
  return 0;
}
