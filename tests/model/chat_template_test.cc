// Qwen3's chat template: every golden rendered by @huggingface/jinja from the
// real chat_template (scripts/oracles/gen_chat_template_goldens.mjs) must match byte
// for byte; the incremental helpers are checked against the goldens and
// against full renderings.
#include "model/chat_template.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

struct Golden {
  std::string name;
  std::vector<ChatMessage> messages;
  ChatTemplateOptions options;
  std::string text;
};

std::vector<Golden> LoadGoldens() {
  std::ifstream in(std::string(KVL_SOURCE_DIR) + "/tests/data/chat_template/qwen3_golden.jsonl");
  std::vector<Golden> goldens;
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    Golden g;
    g.name = j["name"];
    for (const json& m : j["messages"]) g.messages.push_back({m["role"], m["content"]});
    g.options.add_generation_prompt = j["add_generation_prompt"];
    // null: the template variable was left undefined, which means thinking on.
    g.options.enable_thinking = j["enable_thinking"].is_null() || j["enable_thinking"].get<bool>();
    g.text = j["text"];
    goldens.push_back(std::move(g));
  }
  return goldens;
}

TEST(ChatTemplateTest, MatchesEveryGoldenByteForByte) {
  const std::vector<Golden> goldens = LoadGoldens();
  ASSERT_GE(goldens.size(), 20u);
  for (const Golden& g : goldens) {
    absl::StatusOr<std::string> text = RenderChat(g.messages, g.options);
    ASSERT_TRUE(text.ok()) << g.name << ": " << text.status();
    EXPECT_EQ(*text, g.text) << g.name;
  }
}

TEST(ChatTemplateTest, KnownRenderings) {
  // Spelled out once so that a reader sees the format without the goldens.
  absl::StatusOr<std::string> text =
      RenderChat({{"system", "S"}, {"user", "Hi"}}, {/*add_generation_prompt=*/true,
                                                     /*enable_thinking=*/false});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(GenerationPrompt(true), "<|im_start|>assistant\n");
  EXPECT_EQ(RenderUserTurn("Hi", {/*add_generation_prompt=*/false, true}),
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateTest, RefusesUnsupportedRoles) {
  absl::StatusOr<std::string> text = RenderChat({{"user", "x"}, {"tool", "42"}});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("\"tool\""));
}

// For each golden that ends with a user turn: history rendering + appended
// turn reproduces the golden exactly when UserTurnAppendsExactly says so.
TEST(ChatTemplateTest, IncrementalAppendAgainstGoldens) {
  int n_exact = 0, n_inexact = 0;
  for (const Golden& g : LoadGoldens()) {
    if (g.messages.empty() || g.messages.back().role != "user") continue;
    const std::vector<ChatMessage> history(g.messages.begin(), g.messages.end() - 1);
    absl::StatusOr<std::string> prefix = RenderChat(history, {false, true});
    ASSERT_TRUE(prefix.ok());
    const std::string appended = *prefix + RenderUserTurn(g.messages.back().content, g.options);
    const bool exact = UserTurnAppendsExactly(history, g.messages.back().content);
    EXPECT_EQ(appended == g.text, exact) << g.name;
    (exact ? n_exact : n_inexact)++;
  }
  // Both outcomes occur among the goldens, so both branches were compared.
  EXPECT_GE(n_exact, 3);
  EXPECT_GE(n_inexact, 3);
}

// Exhaustively over short histories built from every kind of message the
// template treats differently: the predicate agrees with full renderings.
TEST(ChatTemplateTest, IncrementalPredicateIsExactOnAllShortHistories) {
  const std::vector<ChatMessage> kinds = {
      {"system", "sys"},
      {"user", "question"},
      {"user", "<tool_response>\nresult\n</tool_response>"},
      {"assistant", "plain answer"},
      {"assistant", "<think>\nreasoning\n</think>\n\nanswer"},
      {"assistant", "<think>\n\n</think>\n\nanswer after empty think"},
  };
  const std::vector<std::string> new_turns = {"next question",
                                              "<tool_response>\nmore\n</tool_response>"};
  int n_checked = 0, n_exact = 0;
  std::vector<ChatMessage> history;
  // Histories of length 0..4: 1 + 6 + 36 + 216 + 1296 of them.
  std::vector<int> digits;
  for (int length = 0; length <= 4; ++length) {
    digits.assign(length, 0);
    while (true) {
      history.clear();
      for (int d : digits) history.push_back(kinds[d]);
      for (const std::string& turn : new_turns) {
        std::vector<ChatMessage> full = history;
        full.push_back({"user", turn});
        const ChatTemplateOptions options{true, false};
        const std::string expected = *RenderChat(full, options);
        const std::string appended =
            *RenderChat(history, {false, true}) + RenderUserTurn(turn, options);
        const bool exact = UserTurnAppendsExactly(history, turn);
        ASSERT_EQ(appended == expected, exact)
            << "history of " << history.size() << " messages, new turn \"" << turn << "\"";
        ++n_checked;
        n_exact += exact;
      }
      int i = 0;
      while (i < length && ++digits[i] == static_cast<int>(kinds.size())) digits[i++] = 0;
      if (i == length) break;
    }
  }
  EXPECT_EQ(n_checked, 2 * (1 + 6 + 36 + 216 + 1296));
  EXPECT_GT(n_exact, 0);
  EXPECT_LT(n_exact, n_checked);
}

// What a server that keeps the KV cache of the actual token stream sees:
// prompt + generated reply + CloseAssistantTurn + next user turn. It equals
// the template's full rendering of the conversation when the reply had no
// reasoning and thinking was left on; otherwise the template rewrites the
// earlier reply and the two differ.
TEST(ChatTemplateTest, StreamContinuationVersusFullRendering) {
  const std::vector<ChatMessage> first = {{"system", "S"}, {"user", "Q1"}};
  for (bool thinking : {true, false}) {
    for (const std::string& reply :
         {std::string("A1<|im_end|>"), std::string("<think>\nr\n</think>\n\nA1<|im_end|>")}) {
      const ChatTemplateOptions options{true, thinking};
      const std::string stream = *RenderChat(first, options) + reply + CloseAssistantTurn(reply) +
                                 RenderUserTurn("Q2", options);
      std::vector<ChatMessage> full = first;
      full.push_back({"assistant", reply.substr(0, reply.size() - 10)});  // without <|im_end|>
      full.push_back({"user", "Q2"});
      const bool plain_reply = reply.find("</think>") == std::string::npos;
      EXPECT_EQ(stream == *RenderChat(full, options), thinking && plain_reply)
          << "thinking=" << thinking << " reply=" << reply;
    }
  }
}

TEST(ChatTemplateTest, CloseAssistantTurn) {
  EXPECT_EQ(CloseAssistantTurn("answer<|im_end|>"), "\n");
  EXPECT_EQ(CloseAssistantTurn("cut off by max_tokens"), "<|im_end|>\n");
  EXPECT_EQ(CloseAssistantTurn(""), "<|im_end|>\n");
}

}  // namespace
}  // namespace kvl
