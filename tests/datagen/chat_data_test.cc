// Tests of the chat-data generator (`kvl make-data`): determinism, split
// disjointness, difficulty knobs, and answers re-derived by the independent
// checker scripts/oracles/check_suite.py.
#include "datagen/chat_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "model/tokenizer.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl::datagen {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A small data set: few items, and one prose file of each format so that
// reading and cleaning stay fast.
DataOptions SmallOptions(uint64_t seed) {
  DataOptions o;
  o.seed = seed;
  o.n_train = 400;
  o.n_valid = 90;
  o.n_test = 90;
  std::vector<ProseSource> subset;
  std::set<ProseFormat> formats;
  for (const ProseSource& s : DefaultProseSources()) {
    if (formats.insert(s.format).second || subset.size() < 6) subset.push_back(s);
  }
  o.prose_sources = subset;
  return o;
}

int RunChecker(const std::string& dir, std::string* output) {
  auto proc = kvl::testing::Subprocess::Start(
      {KVL_SYSTEM_PYTHON, std::string(KVL_SOURCE_DIR) + "/scripts/oracles/check_suite.py", dir});
  if (!proc.ok()) {
    *output = std::string(proc.status().message());
    return -1;
  }
  absl::StatusOr<int> rc = (*proc)->Wait(std::chrono::seconds(120));
  *output = (*proc)->Describe();
  return rc.ok() ? *rc : -1;
}

TEST(ChatDataTest, RendersChatMlExactly) {
  const std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hi\nthere"}, {"assistant", "Hello."}};
  EXPECT_EQ(RenderChatMl(m),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
}

TEST(ChatDataTest, SameSeedGivesIdenticalBytesAndOtherSeedDiffers) {
  kvl::testing::TempDir tmp("chat-data");
  const std::string a = tmp.MakeDir("a");
  const std::string b = tmp.MakeDir("b");
  const std::string c = tmp.MakeDir("c");
  for (const auto& [dir, seed] : {std::pair{a, 7}, std::pair{b, 7}, std::pair{c, 8}}) {
    absl::StatusOr<ChatDataset> data = GenerateChatData(SmallOptions(seed));
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_TRUE(WriteChatData(*data, dir).ok());
  }
  for (const char* f : {"train.txt", "train.jsonl", "valid.txt", "test.jsonl", "manifest.json",
                        "suites/valid_kv.jsonl", "suites/test_facts.jsonl"}) {
    const std::string bytes_a = ReadAll(a + "/" + f);
    ASSERT_FALSE(bytes_a.empty()) << f;
    EXPECT_EQ(bytes_a, ReadAll(b + "/" + f)) << f;
  }
  EXPECT_NE(ReadAll(a + "/train.txt"), ReadAll(c + "/train.txt"));
  EXPECT_NE(ReadAll(a + "/suites/test_arith.jsonl"), ReadAll(c + "/suites/test_arith.jsonl"));
}

TEST(ChatDataTest, SplitsShareNoCanonicalItem) {
  DataOptions o = SmallOptions(3);
  // Small knobs shrink the problem space so that collisions are frequent and
  // the rejection path is exercised.
  o.arith_max_steps = 2;
  o.list_max_len = 4;
  o.string_max_len = 4;
  absl::StatusOr<ChatDataset> data = GenerateChatData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  std::set<uint64_t> seen[3];
  std::set<std::string> ids;
  for (int s = 0; s < 3; ++s) {
    for (const Conversation& c : data->splits[s]) {
      seen[s].insert(c.canonical);
      EXPECT_TRUE(ids.insert(c.id).second) << "duplicate id " << c.id;
    }
  }
  for (int s = 1; s < 3; ++s) {
    for (uint64_t h : seen[s]) {
      for (int earlier = 0; earlier < s; ++earlier) EXPECT_EQ(seen[earlier].count(h), 0u) << "split " << s;
    }
  }
  // Every valid/test item is unique within its split too.
  EXPECT_EQ(seen[1].size(), data->splits[1].size());
  EXPECT_EQ(seen[2].size(), data->splits[2].size());
}

double MeanOf(Task task, int level, const DataOptions& o, double (*measure)(const Conversation&)) {
  double sum = 0;
  const int n = 150;
  for (int i = 0; i < n; ++i) sum += measure(GenerateItem(task, level, 1000 + i, o));
  return sum / n;
}

double UserBytes(const Conversation& c) {
  double n = 0;
  for (const ChatMessage& m : c.messages) {
    if (m.role == "user") n += static_cast<double>(m.content.size());
  }
  return n;
}
double NumbersInUserTurns(const Conversation& c) {
  static const std::regex kNumber("[0-9]+");
  double n = 0;
  for (const ChatMessage& m : c.messages) {
    if (m.role == "user") n += static_cast<double>(std::distance(
        std::sregex_iterator(m.content.begin(), m.content.end(), kNumber), std::sregex_iterator()));
  }
  return n;
}
double Turns(const Conversation& c) { return static_cast<double>(c.messages.size()); }
double ListItems(const Conversation& c) {
  static const std::regex kList(": ([a-z0-9]+(, [a-z0-9]+)*)\\.");
  std::smatch m;
  for (const ChatMessage& msg : c.messages) {
    if (msg.role == "user" && std::regex_search(msg.content, m, kList)) {
      return static_cast<double>(std::count(m[1].first, m[1].second, ',') + 1);
    }
  }
  return 0;
}
double QuotedStringLength(const Conversation& c) {
  static const std::regex kQuoted("\"([a-z0-9]{3,})\"");
  double longest = 0;
  for (const ChatMessage& msg : c.messages) {
    for (auto it = std::sregex_iterator(msg.content.begin(), msg.content.end(), kQuoted); it != std::sregex_iterator();
         ++it) {
      longest = std::max(longest, static_cast<double>((*it)[1].length()));
    }
  }
  return longest;
}

TEST(ChatDataTest, DifficultyKnobsChangeWhatTheyShould) {
  DataOptions o;
  o.prose_sources.clear();
  // Key-value documents grow with the level and with --kv-max-bytes.
  const double kv1 = MeanOf(Task::kKv, 1, o, UserBytes);
  const double kv3 = MeanOf(Task::kKv, 3, o, UserBytes);
  EXPECT_GT(kv3, 8 * kv1);
  EXPECT_GT(kv3, 0.4 * o.kv_max_bytes);
  EXPECT_LT(kv3, 1.5 * o.kv_max_bytes);
  DataOptions big = o;
  big.kv_max_bytes = 4 * o.kv_max_bytes;
  EXPECT_GT(MeanOf(Task::kKv, 3, big, UserBytes), 2.5 * kv3);

  // More arithmetic steps: more numbers in the user turns.
  EXPECT_GT(MeanOf(Task::kArith, 3, o, NumbersInUserTurns), 2 * MeanOf(Task::kArith, 1, o, NumbersInUserTurns));
  DataOptions few_steps = o;
  few_steps.arith_max_steps = 1;
  // One operation: at most a starting value and one operand ("Double it." has none).
  for (int i = 0; i < 100; ++i) EXPECT_LE(NumbersInUserTurns(GenerateItem(Task::kArith, 3, 900 + i, few_steps)), 2.0);

  // Facts: distractors and filler make conversations longer; none at all
  // leaves the fact, its acknowledgement, the question and the answer (level 1
  // has no "the meeting moved" updates, which add a turn pair of their own).
  EXPECT_GT(MeanOf(Task::kFacts, 3, o, Turns), 2.5 * MeanOf(Task::kFacts, 1, o, Turns));
  DataOptions no_distraction = o;
  no_distraction.facts_max_distractors = 0;
  no_distraction.facts_max_filler = 0;
  for (int i = 0; i < 50; ++i) {
    const Conversation c = GenerateItem(Task::kFacts, 1, 77 + i, no_distraction);
    const size_t n_system = c.messages[0].role == "system" ? 1 : 0;
    EXPECT_EQ(c.messages.size(), n_system + 4);
  }

  // Lists and strings get longer, and never beyond their maximum.
  EXPECT_GT(MeanOf(Task::kLists, 3, o, ListItems), 1.8 * MeanOf(Task::kLists, 1, o, ListItems));
  EXPECT_GT(MeanOf(Task::kStrings, 3, o, QuotedStringLength), 2 * MeanOf(Task::kStrings, 1, o, QuotedStringLength));
  for (int i = 0; i < 100; ++i) {
    EXPECT_LE(ListItems(GenerateItem(Task::kLists, 3, 500 + i, o)), o.list_max_len + 2);  // +2: "add" turns
    EXPECT_LE(QuotedStringLength(GenerateItem(Task::kStrings, 3, 500 + i, o)), o.string_max_len);
  }
}

TEST(ChatDataTest, IndependentCheckerAgreesWithEveryAnswerAndCatchesAWrongOne) {
  kvl::testing::TempDir tmp("chat-data-check");
  DataOptions o = SmallOptions(11);
  o.n_train = 600;
  o.n_valid = 150;
  o.n_test = 150;
  absl::StatusOr<ChatDataset> data = GenerateChatData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(WriteChatData(*data, tmp.path()).ok());
  std::string output;
  EXPECT_EQ(RunChecker(tmp.path(), &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("0 mismatches"));

  // A wrong answer must be caught: bump the first numeric answer in a suite.
  const std::string suite = tmp.Path("suites/valid_arith.jsonl");
  std::string text = ReadAll(suite);
  const std::regex answer("\"answer\":\"([0-9]+)\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, answer));
  const std::string wrong = "\"answer\":\"" + std::to_string(std::stol(m[1].str()) + 1) + "\"";
  text.replace(static_cast<size_t>(m.position(0)), static_cast<size_t>(m.length(0)), wrong);
  tmp.WriteFile("suites/valid_arith.jsonl", text);
  EXPECT_EQ(RunChecker(tmp.path(), &output), 1) << output;
  EXPECT_THAT(output, HasSubstr("MISMATCH suite valid_arith.jsonl"));
}

TEST(ChatDataTest, WritesSuitesAndManifest) {
  kvl::testing::TempDir tmp("chat-data-files");
  absl::StatusOr<ChatDataset> data = GenerateChatData(SmallOptions(5));
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(WriteChatData(*data, tmp.path()).ok());
  for (const char* split : {"valid", "test"}) {
    for (const char* task : {"facts", "kv", "arith", "lists", "strings"}) {
      const std::string path = tmp.Path(std::string("suites/") + split + "_" + task + ".jsonl");
      EXPECT_TRUE(std::filesystem::exists(path)) << path;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.Path("suites/train_facts.jsonl")));
  const std::string manifest = ReadAll(tmp.Path("manifest.json"));
  EXPECT_THAT(manifest, HasSubstr(kChatDataVersion));
  EXPECT_THAT(manifest, HasSubstr("\"seed\": 5"));
  EXPECT_THAT(manifest, HasSubstr("/usr/share/common-licenses/Apache-2.0"));
  // The recorded hash is the hash of the file as read.
  EXPECT_THAT(manifest, HasSubstr(Sha256Hex(ReadAll("/usr/share/common-licenses/Apache-2.0"))));
  // Each conversation of train.txt ends with "<|im_end|>\n" and one empty line.
  const std::string train = ReadAll(tmp.Path("train.txt"));
  ASSERT_GT(train.size(), 100u);
  EXPECT_EQ(train.rfind("<|im_end|>\n\n"), train.size() - 12);
}

TEST(ChatDataTest, MissingSourceIsNotFoundUnlessAllowed) {
  DataOptions o = SmallOptions(1);
  o.n_train = 10;
  o.n_valid = 6;
  o.n_test = 6;
  o.prose_sources = {{"/nonexistent/kvl-prose.txt", "no-such-package", ProseFormat::kPlain, "0000000000000000"}};
  absl::StatusOr<ChatDataset> data = GenerateChatData(o);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("no-such-package"));
  o.allow_missing_sources = true;
  data = GenerateChatData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->sources.size(), 1u);
  EXPECT_EQ(data->sources[0].status, "missing");
}

TEST(ChatDataTest, BadKnobIsInvalidArgument) {
  DataOptions o;
  o.list_max_len = 2;
  EXPECT_EQ(GenerateChatData(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = DataOptions();
  o.n_train = -1;
  EXPECT_EQ(GenerateChatData(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatDataTest, ProseCleanupRemovesMarkup) {
  const std::string rst =
      "Title\n=====\n\n.. note::\n   A directive body that must go away entirely, with many words in it.\n\n"
      "Use :command:`add_library` with ``STATIC`` to build a library, as described in the\n"
      "`CMake tutorial <https://example.org/t>`_ and in many other places of this manual.\n\n"
      "  indented literal block that is code, not prose, and is long enough to pass.\n";
  EXPECT_THAT(ExtractParagraphs(rst, ProseFormat::kRst),
              ::testing::ElementsAre("Use add_library with STATIC to build a library, as described in the "
                                     "CMake tutorial and in many other places of this manual."));
  const std::string pod =
      "package Foo;\nmy $x = 1;\n\n=head1 NAME\n\nFoo - does things\n\n=head1 DESCRIPTION\n\n"
      "The C<frobnicate> function takes B<< two arguments >> and returns E<lt>undefE<gt> when\n"
      "L<the manual|perlfunc> says that it has nothing useful to return to the caller.\n\n=cut\n\n"
      "sub frobnicate { return; } # This code comment is not documentation at all, none.\n";
  EXPECT_THAT(ExtractParagraphs(pod, ProseFormat::kPod),
              ::testing::ElementsAre("The frobnicate function takes two arguments and returns <undef> when "
                                     "the manual says that it has nothing useful to return to the caller."));
  const std::string notes =
      "Git 2.0 Release Notes\n=====================\n\n * \"git log\" learned a new option that does many\n"
      "   useful things for people who read history often.\n   (merge 1234567 ab/topic later to maint).\n";
  EXPECT_THAT(ExtractParagraphs(notes, ProseFormat::kRelNotes),
              ::testing::ElementsAre("\"git log\" learned a new option that does many useful things for people "
                                     "who read history often."));
}

}  // namespace
}  // namespace kvl::datagen
