// The chat templates (model/chat_template.h) on arbitrary conversations, each
// input under every family. The input is split at 0xFF bytes into messages;
// each message's first byte picks its role (system, user, assistant, or an
// unsupported one) and the rest is its content. Properties: unsupported roles
// are InvalidArgument; Qwen3 and Llama-3 render every other conversation,
// Gemma-3 and Mistral render it or refuse it as InvalidArgument (their role
// alternation); a non-empty rendering starts with the family's first token;
// UserTurnAppendsExactly(history, c, kind) is true exactly when history +
// {user, c} and history (without a generation prompt) both render and the
// first equals the second followed by RenderUserTurn(c).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "model/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void CheckFamily(const std::vector<kvl::ChatMessage>& messages, bool unsupported,
                 kvl::ChatTemplateOptions options) {
  const kvl::ChatTemplateKind kind = options.kind;
  const bool may_refuse =
      kind == kvl::ChatTemplateKind::kGemma || kind == kvl::ChatTemplateKind::kMistral;
  const std::string family(kvl::ChatTemplateKindName(kind));
  absl::StatusOr<std::string> rendered = kvl::RenderChat(messages, options);
  if (unsupported || (may_refuse && !rendered.ok())) {
    KVL_FUZZ_CHECK(!rendered.ok() && rendered.status().code() == absl::StatusCode::kInvalidArgument,
                   family + ": an unsupported role or order is InvalidArgument");
    return;
  }
  KVL_FUZZ_CHECK(rendered.ok(),
                 family + ": RenderChat refused supported roles: " + rendered.status().ToString());
  if (messages.empty()) return;
  static const char* const kFirst[] = {"<|im_start|>", "<bos>", "<|begin_of_text|>", "<s>"};
  KVL_FUZZ_CHECK(absl::StartsWith(*rendered, kFirst[static_cast<int>(kind)]),
                 family + ": rendering starts with the family's first token");

  // The last message as a new user turn after the others.
  std::vector<kvl::ChatMessage> history(messages.begin(), messages.end() - 1);
  const std::string content = messages.back().content;
  std::vector<kvl::ChatMessage> with_turn = history;
  with_turn.push_back({"user", content});
  absl::StatusOr<std::string> whole = kvl::RenderChat(with_turn, options);
  kvl::ChatTemplateOptions no_prompt = options;
  no_prompt.add_generation_prompt = false;
  absl::StatusOr<std::string> before = kvl::RenderChat(history, no_prompt);
  if (!may_refuse) KVL_FUZZ_CHECK(whole.ok() && before.ok(), family + ": rendering supported roles");
  const bool appends =
      whole.ok() && before.ok() && *whole == *before + kvl::RenderUserTurn(content, options);
  KVL_FUZZ_CHECK(appends == kvl::UserTurnAppendsExactly(history, content, kind),
                 appends ? family + ": UserTurnAppendsExactly is false but the turn appends exactly"
                         : family + ": UserTurnAppendsExactly is true but the rendering differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kvl::ChatTemplateOptions options{/*add_generation_prompt=*/true,
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
  for (kvl::ChatTemplateKind kind :
       {kvl::ChatTemplateKind::kQwen3, kvl::ChatTemplateKind::kGemma,
        kvl::ChatTemplateKind::kLlama3, kvl::ChatTemplateKind::kMistral}) {
    options.kind = kind;
    CheckFamily(messages, unsupported, options);
  }
  return 0;
}
