// scripts/train/retrieval_drills.py writes the first stage of the house models'
// curriculum. Its answers must be right by construction: each item is checked
// here by re-reading its prompt (independently of the generator's code), and
// the output must be deterministic.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace {

using json = nlohmann::json;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class RetrievalDrillsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 60 distinct words, each seen 6 times (the script keeps words seen >= 5).
    std::string corpus;
    for (int rep = 0; rep < 6; ++rep) {
      for (int w = 0; w < 60; ++w) {
        corpus += "word" + std::string(1, static_cast<char>('a' + w % 26)) +
                  std::string(1, static_cast<char>('a' + w / 26)) + (w % 7 == 0 ? ".\n" : " ");
      }
    }
    corpus_ = dir_.WriteFile("corpus.txt", corpus);
  }

  // Runs the script; returns its exit code and fills *err.
  int Run(const std::vector<std::string>& args, std::string* err = nullptr) {
    std::vector<std::string> argv = {KVL_SYSTEM_PYTHON,
                                     std::string(KVL_SOURCE_DIR) + "/scripts/train/retrieval_drills.py"};
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<kvl::testing::RunResult> r =
        kvl::testing::RunProcess(argv, std::chrono::seconds(60));
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return -1;
    }
    if (err != nullptr) *err = r->err;
    return r->exit_code;
  }

  kvl::testing::TempDir dir_{"retrieval-drills"};
  std::string corpus_;
};

// "k1 is v1. k2 is v2. ... What is k?" -> the value stated for k.
std::string RecallAnswer(const std::string& prompt) {
  const size_t q = prompt.rfind(" What is ");
  if (q == std::string::npos) return "<no question>";
  const std::string key(absl::StripSuffix(prompt.substr(q + 9), "?"));
  std::map<std::string, std::string> facts;
  for (absl::string_view sentence : absl::StrSplit(prompt.substr(0, q), ". ")) {
    sentence = absl::StripSuffix(sentence, ".");
    const std::vector<std::string> kv = absl::StrSplit(sentence, " is ");
    if (kv.size() != 2) return "<malformed fact>";
    if (!facts.emplace(kv[0], kv[1]).second) return "<key stated twice>";
  }
  return facts.count(key) ? facts[key] : "<key never stated>";
}

// "Remember: w1 ... wn. What comes after w?" -> the word after w.
std::string NextAnswer(const std::string& prompt) {
  const size_t q = prompt.rfind(". What comes after ");
  if (!absl::StartsWith(prompt, "Remember: ") || q == std::string::npos) return "<malformed>";
  const std::vector<std::string> seq = absl::StrSplit(prompt.substr(10, q - 10), ' ');
  const std::string w(absl::StripSuffix(prompt.substr(q + 19), "?"));
  if (std::set<std::string>(seq.begin(), seq.end()).size() != seq.size()) return "<repeated word>";
  for (size_t i = 0; i + 1 < seq.size(); ++i) {
    if (seq[i] == w) return seq[i + 1];
  }
  return "<no next word>";
}

// Record lines "prefix-xxxx: value" in the first user message; the question
// (the last user message's last paragraph) names one key -> its value.
std::string RecordsAnswer(const json& messages) {
  std::map<std::string, std::string> records;
  for (absl::string_view line : absl::StrSplit(messages[0]["content"].get<std::string>(), '\n')) {
    const size_t colon = line.find(": ");
    if (colon == absl::string_view::npos || line.find('-') > colon) continue;
    const std::string key(line.substr(0, colon));
    if (!records.emplace(key, std::string(line.substr(colon + 2))).second) return "<key twice>";
  }
  // The question: the last paragraph of the last user message.
  std::string question = messages.back()["content"].get<std::string>();
  if (const size_t para = question.rfind("\n\n"); para != std::string::npos) {
    question = question.substr(para + 2);
  }
  std::string found;
  for (const auto& [key, value] : records) {
    // The asked key, and not merely a key that contains it.
    const size_t at = question.find(key);
    if (at != std::string::npos && (at + key.size() == question.size() ||
                                    !std::isalnum(static_cast<unsigned char>(question[at + key.size()])))) {
      if (!found.empty()) return "<two keys asked>";
      found = value;
    }
  }
  return found.empty() ? "<no key asked>" : found;
}

TEST_F(RetrievalDrillsTest, EveryAnswerFollowsFromItsPromptAndOutputIsDeterministic) {
  const std::string a = dir_.Path("a.jsonl"), b = dir_.Path("b.jsonl"), c = dir_.Path("c.jsonl");
  ASSERT_EQ(Run({corpus_, a, "400", "7", "copy,recall,next,records"}), 0);
  ASSERT_EQ(Run({corpus_, b, "400", "7", "copy,recall,next,records"}), 0);
  ASSERT_EQ(Run({corpus_, c, "400", "8", "copy,recall,next,records"}), 0);
  const std::string text = ReadAll(a);
  EXPECT_EQ(text, ReadAll(b));
  EXPECT_NE(text, ReadAll(c));

  std::map<std::string, int> per_task;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const json item = json::parse(line);
    const std::string task = item["task"], answer = item["answer"];
    const json& messages = item["messages"];
    ASSERT_FALSE(messages.empty());
    EXPECT_EQ(messages.back()["role"], "user") << line;
    const std::string prompt = messages.back()["content"];
    ++per_task[task];
    if (task == "drill_copy") {
      EXPECT_EQ("Repeat after me: " + answer, prompt) << line;
    } else if (task == "drill_recall") {
      EXPECT_EQ(RecallAnswer(prompt), answer) << line;
    } else if (task == "drill_next") {
      EXPECT_EQ(NextAnswer(prompt), answer) << line;
    } else if (task == "drill_records") {
      EXPECT_EQ(RecordsAnswer(messages), answer) << line;
    } else {
      ADD_FAILURE() << "unexpected task " << task;
    }
  }
  for (const char* task : {"drill_copy", "drill_recall", "drill_next", "drill_records"}) {
    EXPECT_GT(per_task[task], 60) << task;  // about 100 each
  }
}

TEST_F(RetrievalDrillsTest, ChatTextEndsEachConversationWithTheAnswer) {
  const std::string out = dir_.Path("drills.txt");
  ASSERT_EQ(Run({corpus_, out, "50", "3", "records"}), 0);
  const std::string text = ReadAll(out);
  int conversations = 0;
  // One empty line after each conversation (record documents hold empty
  // lines of their own, as the kv task's do).
  ASSERT_TRUE(absl::EndsWith(text, "<|im_end|>\n\n"));
  for (absl::string_view conv : absl::StrSplit(text, "<|im_end|>\n\n", absl::SkipEmpty())) {
    ++conversations;
    EXPECT_TRUE(absl::StartsWith(conv, "<|im_start|>user\n")) << conv;
    const size_t answer = conv.rfind("<|im_start|>assistant\n");
    ASSERT_NE(answer, absl::string_view::npos) << conv;
    EXPECT_EQ(conv.find("<|im_end|>", answer), absl::string_view::npos) << conv;
  }
  EXPECT_EQ(conversations, 50);
}

TEST_F(RetrievalDrillsTest, UnknownKindIsRefusedByName) {
  std::string err;
  EXPECT_NE(Run({corpus_, dir_.Path("x.txt"), "5", "1", "copy,lookup"}, &err), 0);
  EXPECT_NE(err.find("lookup"), std::string::npos) << err;
}

}  // namespace
