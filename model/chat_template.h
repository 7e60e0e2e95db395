// Qwen3's chat template (ChatML with <think> reasoning blocks), rendered in C++
// byte for byte as the chat_template of Qwen3's tokenizer_config.json renders
// without tools. Checked against goldens from @huggingface/jinja
// (scripts/oracles/gen_chat_template_goldens.mjs).
//
// Thread-safe: free functions over their arguments.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvl {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  // false: the generation prompt is followed by an empty think block
  // ("<think>\n\n</think>\n\n"), which tells Qwen3 to answer without reasoning.
  bool enable_thinking = true;
};

// The prompt text for a conversation. Roles other than system/user/assistant
// (tool messages, tool calls) are InvalidArgument.
//
// As in the template: an assistant message before the last user query keeps
// only the text after its last "</think>" (reasoning is dropped); an assistant
// message after the last user query is written with a <think> block when it is
// the last message or has reasoning. A user message whose content is wrapped
// in <tool_response>...</tool_response> does not count as a query.
absl::StatusOr<std::string> RenderChat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options = {});

// What a new user turn adds to the end of a conversation (then, when
// options.add_generation_prompt, the generation prompt):
//   "<|im_start|>user\n" + content + "<|im_end|>\n" + "<|im_start|>assistant\n" [+ empty think]
std::string RenderUserTurn(absl::string_view content, const ChatTemplateOptions& options = {});

// The generation prompt alone: "<|im_start|>assistant\n" [+ empty think block].
std::string GenerationPrompt(bool enable_thinking);

// What must follow a generated assistant reply so that the conversation can
// continue: "\n" when the reply ended with the <|im_end|> stop token (the
// template puts a newline after it), else "<|im_end|>\n" (stopped by a length
// limit).
std::string CloseAssistantTurn(absl::string_view generated);

// Whether RenderChat(history + {user, content}, options) ==
// RenderChat(history, {add_generation_prompt = false}) + RenderUserTurn(content, options),
// decided without rendering. For a plain user turn it holds exactly when no
// assistant message after the last user query of `history` is written with a
// <think> block, i.e. none of them is the last message of `history` or carries
// non-empty reasoning. So it does NOT hold for the usual history that ends with
// an assistant reply: once a user turn follows, the template rewrites that
// reply without its think block (see docs/checkpoints.md, "Chat template").
// (A <tool_response> wrapper as the new content does not move the last query;
// the answer then accounts for that too.)
bool UserTurnAppendsExactly(const std::vector<ChatMessage>& history, absl::string_view content);

}  // namespace kvl
