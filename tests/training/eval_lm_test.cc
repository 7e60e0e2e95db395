// kvl eval: the documented answer normalisation, suite parsing, prompts
// rendered as the training corpus renders conversations, accuracy consistent
// with an independent greedy decode (ReferenceForward argmax, not the Engine),
// and perplexity equal to a mean NLL computed with the Engine's cached decoder.
#include "training/eval_lm.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "model/chat_template.h"
#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/reference.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/training/tiny_lm_fixture.h"

namespace kvl::training {
namespace {

using kvl::testing::TempDir;
using nlohmann::json;

TEST(NormalizeAnswerTest, StripsWhitespaceAndOneTrailingPeriod) {
  EXPECT_EQ(NormalizeAnswer("  Paris. \n", "exact"), "Paris");
  EXPECT_EQ(NormalizeAnswer("Paris .", "exact"), "Paris");
  EXPECT_EQ(NormalizeAnswer("etc..", "exact"), "etc.");
  EXPECT_EQ(NormalizeAnswer("Paris", "exact_ci"), "paris");
  EXPECT_EQ(NormalizeAnswer("a, b, c", "exact"), "a, b, c");
}

TEST(AnswerMatchesTest, AppliesEachScoringRule) {
  EXPECT_TRUE(AnswerMatches("K3X9P.", "K3X9P", "exact"));
  EXPECT_FALSE(AnswerMatches("k3x9p", "K3X9P", "exact"));
  EXPECT_TRUE(AnswerMatches(" k3x9p ", "K3X9P", "exact_ci"));
  EXPECT_TRUE(AnswerMatches("42.", "42", "numeric"));
  EXPECT_TRUE(AnswerMatches("042", "42", "numeric"));  // integer value, as the checker's int()
  EXPECT_TRUE(AnswerMatches("-7", "-7", "numeric"));
  EXPECT_FALSE(AnswerMatches("4 2", "42", "numeric"));
  EXPECT_FALSE(AnswerMatches("42 apples", "42", "numeric"));
  EXPECT_FALSE(AnswerMatches("", "0", "numeric"));
  EXPECT_FALSE(AnswerMatches("a, c, b", "a, b, c", "exact"));
}

TEST(LoadSuiteTest, ParsesItemsAndRejectsBadLinesWithSpecificCodes) {
  TempDir dir("suite");
  const json item = {{"id", "valid-arith-1"}, {"task", "arith"}, {"difficulty", 2},
                     {"messages", {{{"role", "user"}, {"content", "Compute 2 + 3."}}}},
                     {"answer", "5"}, {"scoring", "numeric"}};
  absl::StatusOr<std::vector<SuiteItem>> ok =
      LoadSuite(dir.WriteFile("ok.jsonl", item.dump() + "\n\n" + item.dump() + "\n"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].task, "arith");
  EXPECT_EQ((*ok)[0].difficulty, 2);
  EXPECT_EQ((*ok)[0].messages[0].content, "Compute 2 + 3.");

  EXPECT_EQ(LoadSuite(dir.Path("missing.jsonl")).status().code(), absl::StatusCode::kNotFound);
  json bad = item;
  bad["scoring"] = "fuzzy";
  const absl::Status s = LoadSuite(dir.WriteFile("bad.jsonl", item.dump() + "\n" + bad.dump())).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad.jsonl:2"), std::string::npos) << s;
  EXPECT_EQ(LoadSuite(dir.WriteFile("junk.jsonl", "{not json")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SuitePromptTest, IsTheTrainingRenderingUpToTheAnswer) {
  SuiteItem item;
  item.messages = {{"system", "You are terse."}, {"user", "Start with 4."},
                   {"assistant", "4"}, {"user", "Add 3. What is the total?"}};
  item.answer = "7";
  // The corpus line of the full conversation continues the prompt with the answer.
  std::vector<ChatMessage> full = item.messages;
  full.push_back({"assistant", item.answer});
  EXPECT_EQ(datagen::RenderChatMl(full), SuitePrompt(item) + "7<|im_end|>\n");
  // And it is what Qwen3's template renders with thinking enabled (no empty
  // think block, which the corpus never contains).
  std::vector<kvl::ChatMessage> chat;
  for (const ChatMessage& m : item.messages) chat.push_back({m.role, m.content});
  absl::StatusOr<std::string> rendered = RenderChat(chat, {/*add_generation_prompt=*/true,
                                                           /*enable_thinking=*/true});
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(*rendered, SuitePrompt(item));
}

class EvalModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("eval-lm");
    files_ = new kvl::testing::TinyLmFiles(kvl::testing::MakeTinyLm(*dir_, 120));
    // Weights with O(1) activations so that greedy outputs vary by prompt.
    absl::StatusOr<ModelConfig> config = ModelConfig::FromFile(files_->config);
    ASSERT_TRUE(config.ok()) << config.status();
    ModelWeights w = InitWeights(*config, 11);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12);
    for (auto& [name, t] : w.Named(*config)) {
      if (name.find("norm") != std::string::npos) {
        t.normal_(1.0, 0.1, gen);
      } else {
        t.normal_(0.0, 0.2, gen);
      }
    }
    ASSERT_TRUE(SaveCheckpoint(dir_->Path("model"), *config, w, DType::kFloat32,
                               files_->tokenizer_dir + "/tokenizer.json",
                               files_->tokenizer_dir + "/tokenizer_config.json")
                    .ok());
  }
  static void TearDownTestSuite() {
    delete files_;
    delete dir_;
  }
  static TempDir* dir_;
  static kvl::testing::TinyLmFiles* files_;
};
TempDir* EvalModelTest::dir_ = nullptr;
kvl::testing::TinyLmFiles* EvalModelTest::files_ = nullptr;

// Greedy decoding the slow way: the whole sequence through ReferenceForward
// for every new token, argmax (lowest id on ties), stop at <|im_end|>.
std::string GreedyByReference(const Checkpoint& ckpt, const Tokenizer& tok,
                              const std::string& prompt, int64_t max_new, int32_t im_end) {
  c10::InferenceMode guard;
  std::vector<int64_t> ids;
  for (int32_t id : tok.Encode(prompt, true)) ids.push_back(id);
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < max_new; ++i) {
    const at::Tensor logits =
        ReferenceForward(ckpt.config, ckpt.weights, at::tensor(ids).unsqueeze(0)).logits[0][-1];
    const int64_t next = logits.argmax().item<int64_t>();
    if (next == im_end) break;
    generated.push_back(static_cast<int32_t>(next));
    ids.push_back(next);
  }
  return tok.Decode(generated);
}

// The normalisation as scripts/oracles/check_suite.py writes it, independently.
std::string PyNormalize(std::string a, const std::string& scoring) {
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!a.empty() && is_space(a.back())) a.pop_back();
  size_t b = 0;
  while (b < a.size() && is_space(a[b])) ++b;
  a = a.substr(b);
  if (!a.empty() && a.back() == '.') {
    a.pop_back();
    while (!a.empty() && is_space(a.back())) a.pop_back();
  }
  if (scoring == "exact_ci") {
    for (char& c : a) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return a;
}

TEST_F(EvalModelTest, AccuracyMatchesAnIndependentGreedyDecode) {
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir_->Path("model"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromFile(dir_->Path("model/tokenizer.json"));
  ASSERT_TRUE(tok.ok());
  const int64_t max_new = 6;
  const char* questions[] = {"Compute 3 + 4.", "Sort these words: pear, apple.",
                             "What is the length of the string \"ab3\"?", "Hello there."};
  // Per task: an item whose answer is the model's own output (correct), one
  // with that output upper-cased (correct only under exact_ci, or if it has
  // no letters), and one with an answer it cannot produce (wrong).
  std::string suite_a, suite_b;
  std::map<std::string, std::pair<int, int>> expected;  // task -> (correct, items)
  int n = 0;
  for (int q = 0; q < 4; ++q) {
    SuiteItem item;
    item.messages = {{"user", questions[q]}};
    const std::string output =
        GreedyByReference(*ckpt, **tok, SuitePrompt(item), max_new, files_->im_end);
    std::string upper = output;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const std::string task = q % 2 ? "odd" : "even";
    for (const auto& [answer, scoring] : std::vector<std::pair<std::string, std::string>>{
             {output, "exact"}, {upper, "exact_ci"}, {upper, "exact"}, {"#never#", "exact"}}) {
      const json line = {{"id", "i" + std::to_string(n++)}, {"task", task},
                         {"messages", {{{"role", "user"}, {"content", questions[q]}}}},
                         {"answer", answer}, {"scoring", scoring}};
      (q < 2 ? suite_a : suite_b) += line.dump() + "\n";
      const bool correct = PyNormalize(output, scoring) == PyNormalize(answer, scoring);
      expected[task].first += correct;
      expected[task].second += 1;
    }
  }
  EvalOptions o;
  o.model_dir = dir_->Path("model");
  o.suites = {dir_->WriteFile("a.jsonl", suite_a), dir_->WriteFile("b.jsonl", suite_b)};
  o.max_new_tokens = max_new;
  o.n_threads = 1;
  o.progress = false;
  absl::StatusOr<EvalReport> r = RunEvaluation(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tasks.size(), 2u);
  int all_correct = 0;
  for (const TaskResult& t : r->tasks) {
    SCOPED_TRACE(t.task);
    EXPECT_EQ(t.n_items, expected[t.task].second);
    EXPECT_EQ(t.n_correct, expected[t.task].first);
    EXPECT_DOUBLE_EQ(t.accuracy, static_cast<double>(t.n_correct) / t.n_items);
    all_correct += expected[t.task].first;
  }
  EXPECT_EQ(r->overall.n_items, 16);
  EXPECT_EQ(r->overall.n_correct, all_correct);
  EXPECT_GE(all_correct, 8);  // own output and the exact_ci variant, at least
  EXPECT_LE(all_correct, 12);  // never the impossible answer

  // --limit keeps the first K items of each suite file.
  o.limit = 1;
  absl::StatusOr<EvalReport> limited = RunEvaluation(o);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->overall.n_items, 2);
}

TEST_F(EvalModelTest, PerplexityEqualsMeanNllFromTheCachedDecoder) {
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir_->Path("model"));
  ASSERT_TRUE(ckpt.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromFile(dir_->Path("model/tokenizer.json"));
  ASSERT_TRUE(tok.ok());
  const std::string text = kvl::testing::TinyChatCorpus(500000, 6);
  const std::vector<int32_t> tokens = (*tok)->Encode(text, true);
  const int64_t seq_len = 48, max_tokens = 150;  // 3 full windows + a short one
  ASSERT_GT(static_cast<int64_t>(tokens.size()), max_tokens + 1);

  // Oracle: each window prefilled into a fresh Engine cache, log-softmax of
  // every position's logits at the next token.
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*ckpt, RuntimeOptions{});
  ASSERT_TRUE(engine.ok());
  double nll = 0;
  int64_t predicted = 0;
  for (int64_t start = 0; predicted < max_tokens; start += seq_len) {
    const int64_t len = std::min(seq_len, max_tokens - predicted);
    std::vector<int64_t> ids(tokens.begin() + start, tokens.begin() + start + len);
    std::unique_ptr<KvCache> cache = (*engine)->NewCache();
    absl::StatusOr<at::Tensor> logits = (*engine)->Prefill(*cache, ids, /*all_logits=*/true);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const at::Tensor logp = at::log_softmax(logits->to(at::kDouble), -1);
    for (int64_t t = 0; t < len; ++t) nll -= logp[t][tokens[start + t + 1]].item<double>();
    predicted += len;
  }
  const double want = nll / static_cast<double>(predicted);

  absl::StatusOr<NllResult> got =
      MeanNll(ckpt->config, ckpt->weights, tokens, seq_len, /*batch=*/2, max_tokens);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->n_tokens, max_tokens);
  EXPECT_EQ(got->n_windows, 4);
  EXPECT_NEAR(got->nats_per_token, want, 1e-4);
  // Far from uniform: the oracle is not trivially satisfied.
  EXPECT_GT(std::fabs(want - std::log(static_cast<double>(ckpt->config.vocab_size))), 0.05);

  // The same through RunEvaluation and the file it reads.
  EvalOptions o;
  o.model_dir = dir_->Path("model");
  o.text_path = dir_->WriteFile("held_out.txt", text);
  o.seq_len = seq_len;
  o.max_text_tokens = max_tokens;
  o.n_threads = 1;
  o.progress = false;
  absl::StatusOr<EvalReport> r = RunEvaluation(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_nll);
  EXPECT_NEAR(r->nll.nats_per_token, want, 1e-4);

  EXPECT_EQ(MeanNll(ckpt->config, ckpt->weights, {7}, seq_len, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EvalModelTest, CommandLinePrintsTableAndJson) {
  const json item = {{"id", "x"}, {"task", "arith"},
                     {"messages", {{{"role", "user"}, {"content", "Compute 1 + 1."}}}},
                     {"answer", "2"}, {"scoring", "numeric"}};
  const std::string suite = dir_->WriteFile("cli.jsonl", item.dump() + "\n");
  const std::string text = dir_->WriteFile("cli.txt", kvl::testing::TinyChatCorpus(7000, 2));
  const std::string out_json = dir_->Path("report.json");
  auto p = kvl::testing::Subprocess::Start(
      {KVL_CLI_BIN, "eval", "--model", dir_->Path("model"), "--suite", suite, "--text", text,
       "--seq-len", "64", "--max-new-tokens", "4", "--threads", "1", "--json", out_json});
  ASSERT_TRUE(p.ok());
  absl::StatusOr<int> rc = (*p)->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(rc.ok());
  ASSERT_EQ(*rc, 0) << (*p)->Describe();
  const std::string out = (*p)->stdout_text();
  EXPECT_NE(out.find("arith"), std::string::npos) << out;
  EXPECT_NE(out.find("nats/token"), std::string::npos) << out;
  EXPECT_NE((*p)->stderr_text().find("1/1 item"), std::string::npos) << (*p)->Describe();
  std::ifstream in(out_json);
  const json report = json::parse(in);
  EXPECT_EQ(report["tasks"]["arith"]["items"], 1);
  EXPECT_GT(report["perplexity"]["nats_per_token"].get<double>(), 0);
  ASSERT_EQ(report["items"].size(), 1u);
  EXPECT_EQ(report["items"][0]["answer"], "2");

  auto bad = kvl::testing::Subprocess::Start({KVL_CLI_BIN, "eval", "--model", dir_->Path("model")});
  ASSERT_TRUE(bad.ok());
  absl::StatusOr<int> bad_rc = (*bad)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(bad_rc.ok());
  EXPECT_EQ(*bad_rc, 2);  // nothing to evaluate
}

}  // namespace
}  // namespace kvl::training
