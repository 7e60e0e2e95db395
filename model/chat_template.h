// The chat templates of four model families, rendered in C++ byte for byte as
// the family's Jinja chat_template renders without tools (Python jinja2, as
// transformers' apply_chat_template runs it):
//   kQwen3   Qwen3's ChatML with <think> reasoning blocks (also Qwen2)
//   kGemma   Gemma-3: <bos><start_of_turn>user\n...<end_of_turn>\n, the
//            assistant written as "model", a system message joined to the first
//            user turn; stop token <end_of_turn>
//   kLlama3  Llama-3 Instruct: <|begin_of_text|><|start_header_id|>role
//            <|end_header_id|>\n\n...<|eot_id|>; no default system block
//            (Llama-3.1's dated one is not rendered); stop token <|eot_id|>
//   kMistral Mistral v0.3 (tokenizer v3): <s>[INST] ...[/INST] answer</s>, the
//            system message joined to the last user turn; stop token </s>
// Checked against goldens from @huggingface/jinja over the real templates
// (scripts/oracles/gen_chat_template_goldens.mjs) for Qwen3, Gemma-3 and
// Llama-3, and against hand-written expectations for Mistral (no npm package
// ships its template); docs/checkpoints.md, "Chat template".
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

enum class ChatTemplateKind { kQwen3, kGemma, kLlama3, kMistral };

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  // Qwen3 only. false: the generation prompt is followed by an empty think block
  // ("<think>\n\n</think>\n\n"), which tells Qwen3 to answer without reasoning.
  bool enable_thinking = true;
  ChatTemplateKind kind = ChatTemplateKind::kQwen3;
};

// "qwen3", "gemma", "llama3", "mistral".
absl::string_view ChatTemplateKindName(ChatTemplateKind kind);

// The family of a model directory: the chat_template of
// <dir>/tokenizer_config.json when there is one (by its markers: <|im_start|>,
// <start_of_turn>, <|start_header_id|>, [INST]), else <dir>/config.json's
// architectures[0] or model_type (Qwen2*/Qwen3* -> kQwen3, Gemma3* -> kGemma,
// Llama* -> kLlama3, Mistral* -> kMistral). NotFound without config.json;
// InvalidArgument for a family not listed.
absl::StatusOr<ChatTemplateKind> ChatTemplateKindForModelDir(const std::string& dir);

// The prompt text for a conversation. Roles other than system/user/assistant
// (tool messages, tool calls) are InvalidArgument, and so is what the family's
// template refuses with raise_exception or an undefined message: for kGemma and
// kMistral an empty conversation and roles that do not alternate
// user/assistant after an optional leading system message (Gemma-3 admits a
// system message in an assistant position, and writes it as such a turn).
//
// kGemma, kLlama3: every content is trimmed (Python's str.strip()); the
// system message of kGemma becomes "content\n\n" before the first turn's
// text (it is dropped when no turn follows). kMistral: an assistant content is
// trimmed and written " content</s>"; the system message is written as
// "[INST] system\n\nuser[/INST]" into the last user turn, only when that turn
// is the last message; the template has no generation prompt (its user turns
// end with [/INST]).
//
// kQwen3, as in the template: an assistant message before the last user query keeps
// only the text after its last "</think>" (reasoning is dropped); an assistant
// message after the last user query is written with a <think> block when it is
// the last message or has reasoning. A user message whose content is wrapped
// in <tool_response>...</tool_response> does not count as a query.
absl::StatusOr<std::string> RenderChat(const std::vector<ChatMessage>& messages,
                                       const ChatTemplateOptions& options = {});

// What a new user turn adds to the end of a conversation (then, when
// options.add_generation_prompt, the generation prompt):
//   kQwen3   "<|im_start|>user\n" + content + "<|im_end|>\n"
//            + "<|im_start|>assistant\n" [+ empty think]
//   kGemma   "<start_of_turn>user\n" + trimmed + "<end_of_turn>\n"
//            + "<start_of_turn>model\n"
//   kLlama3  "<|start_header_id|>user<|end_header_id|>\n\n" + trimmed + "<|eot_id|>"
//            + "<|start_header_id|>assistant<|end_header_id|>\n\n"
//   kMistral "[INST] " + content + "[/INST]"
std::string RenderUserTurn(absl::string_view content, const ChatTemplateOptions& options = {});

// A session as one append-only token stream (the router's): SessionPreamble
// once, then per user turn SessionUserTurn (its generation prompt included),
// the reply with its stop token, and CloseAssistantTurn. For every family the
// preamble plus the first turn is RenderChat([system,] user) with the
// generation prompt; each later turn appends exactly as RenderUserTurn does.
//   kQwen3   the system block, or nothing without a system prompt
//   kLlama3  "<|begin_of_text|>" and the system block if any
//   kGemma   "<bos><start_of_turn>user\n" + system + "\n\n" (the template puts
//            the system text inside the first user turn, which the preamble
//            therefore opens; without a system prompt "<bos><start_of_turn>user\n")
//   kMistral "<s>[INST] " + system + "\n\n" (or "<s>[INST] "): v3's template
//            moves the system text into the latest user turn, which no
//            append-only stream can follow; the session keeps it in the first
//            turn, as rendered when that turn was the latest
std::string SessionPreamble(absl::string_view system_prompt, ChatTemplateKind kind);
// A user turn of a session's stream; `first`: the session's first, whose
// opening SessionPreamble wrote for kGemma and kMistral.
std::string SessionUserTurn(absl::string_view content, bool first,
                            const ChatTemplateOptions& options);

// The generation prompt alone: kQwen3 "<|im_start|>assistant\n" [+ empty think
// block], kGemma "<start_of_turn>model\n", kLlama3 the assistant header,
// kMistral "" (the user turn's [/INST] is the prompt).
std::string GenerationPrompt(bool enable_thinking,
                             ChatTemplateKind kind = ChatTemplateKind::kQwen3);

// The family's stop token, as text: "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "</s>".
absl::string_view StopToken(ChatTemplateKind kind);

// What must follow a generated assistant reply so that the conversation can
// continue. kQwen3: "\n" when the reply ended with the <|im_end|> stop token
// (the template puts a newline after it), else "<|im_end|>\n" (stopped by a
// length limit). kGemma: "\n" or "<end_of_turn>\n" alike. kLlama3: "" or
// "<|eot_id|>". kMistral: "" or "</s>". (The template also trims a reply; a
// reply with leading or trailing white space is therefore not re-rendered
// byte for byte, which UserTurnAppendsExactly reports.)
std::string CloseAssistantTurn(absl::string_view generated,
                               ChatTemplateKind kind = ChatTemplateKind::kQwen3);

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
//
// Other families: kGemma holds when `history` renders, has at least one turn
// after the optional system message and ends with a non-user turn (so that the
// appended user turn alternates); kLlama3 holds for every non-empty history
// (an empty one lacks the <|begin_of_text|> the first turn brings); kMistral
// holds when `history` renders, has no system message (it would move into the
// new last turn) and does not end with a user turn.
bool UserTurnAppendsExactly(const std::vector<ChatMessage>& history, absl::string_view content,
                            ChatTemplateKind kind = ChatTemplateKind::kQwen3);

}  // namespace kvl
