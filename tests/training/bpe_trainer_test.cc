// Tests of byte-level BPE training (`kvl train-tokenizer`): the written
// tokenizer.json loads in the runtime tokenizer and round-trips any text;
// training is deterministic; frequent words become single tokens; compression
// grows with the vocabulary; the file has the real Qwen3 file's structure; the
// trainer's pre-tokenizer agrees with the runtime's (oracle: the Qwen3
// goldens and the runtime tokenizer itself).
#include "training/bpe_trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "datagen/chat_data.h"

namespace kvl::training {
namespace {

using ::testing::HasSubstr;

const std::string& ReferenceDir() {
  static const std::string dir = std::string(KVL_SOURCE_DIR) + "/" + kQwen3ReferenceDir;
  return dir;
}

// Loaded once: the reference file is 11 MB.
const Qwen3Reference& Reference() {
  static const Qwen3Reference* ref = [] {
    absl::StatusOr<Qwen3Reference> r = LoadQwen3Reference(ReferenceDir());
    if (!r.ok()) {
      ADD_FAILURE() << "Qwen3 reference files missing (run scripts/setup.sh): " << r.status();
      return new Qwen3Reference();
    }
    return new Qwen3Reference(*std::move(r));
  }();
  return *ref;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const nlohmann::json& RealTokenizerJson() {
  static const nlohmann::json* j =
      new nlohmann::json(nlohmann::json::parse(ReadAll(ReferenceDir() + "/tokenizer.json")));
  return *j;
}

// ChatML conversations from the data generator's exact tasks and grammar chat,
// items [first, first + n) (disjoint seeds give a held-out text).
std::string ChatCorpus(uint64_t first, int n) {
  datagen::DataOptions o;
  o.prose_sources = {};
  std::string text;
  const datagen::Task tasks[] = {datagen::Task::kFacts, datagen::Task::kKv,      datagen::Task::kArith,
                        datagen::Task::kLists, datagen::Task::kStrings, datagen::Task::kChat};
  for (int i = 0; i < n; ++i) {
    const datagen::Task task = tasks[i % 6];
    const int difficulty = task == datagen::Task::kChat ? 0 : 1 + (i / 6) % 2;
    text +=
        datagen::RenderChatMl(datagen::GenerateItem(task, difficulty, first + static_cast<uint64_t>(i), o).messages);
    text += "\n";
  }
  return text;
}

const std::string& TrainText() {
  static const std::string text = ChatCorpus(1000, 240);
  return text;
}
const std::string& HeldOutText() {
  static const std::string text = ChatCorpus(900000, 60);
  return text;
}

std::vector<std::string> GoldenTexts() {
  std::vector<std::string> texts;
  std::ifstream in(std::string(KVL_SOURCE_DIR) + "/tests/data/tokenizer/qwen3_golden.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  }
  return texts;
}

struct Trained {
  TrainedBpe bpe;
  std::string json;
  std::unique_ptr<Tokenizer> tokenizer;
};

Trained Train(const std::vector<std::string>& texts, int vocab_size, int64_t min_frequency = 2) {
  BpeTrainerOptions options;
  options.vocab_size = vocab_size;
  options.min_frequency = min_frequency;
  absl::StatusOr<std::unique_ptr<BpeTrainer>> trainer =
      BpeTrainer::Create(options, Reference().split_regex);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  Trained t;
  if (!trainer.ok()) return t;
  for (const std::string& text : texts) (*trainer)->AddText(text);
  t.bpe = (*trainer)->Train();
  t.json = TokenizerJson(t.bpe, Reference());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(t.json);
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (tok.ok()) t.tokenizer = *std::move(tok);
  return t;
}

double BytesPerToken(const Tokenizer& tok, const std::string& text) {
  return static_cast<double>(text.size()) / static_cast<double>(tok.Encode(text).size());
}

std::vector<std::string> Pieces(const PreTokenizer& pre, std::string_view text) {
  std::vector<std::string> out;
  pre.Split(text, [&](std::string_view piece, bool) { out.emplace_back(piece); });
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

TEST(BpeTrainerTest, LoadsInRuntimeAndRoundTripsCorpusAndUnseenUnicode) {
  Trained t = Train({TrainText()}, 1024);
  ASSERT_NE(t.tokenizer, nullptr);
  EXPECT_EQ(t.tokenizer->vocab_size(), 1024);
  EXPECT_EQ(t.bpe.tokens.size(), 1024u - 5);
  for (const std::string& line : Lines(TrainText())) {
    ASSERT_EQ(t.tokenizer->Decode(t.tokenizer->Encode(line)), line);
  }
  EXPECT_EQ(t.tokenizer->Decode(t.tokenizer->Encode(HeldOutText())), HeldOutText());
  // Characters never seen in training fall back to the 256 byte symbols.
  static constexpr char kControls[] = "tab\tnul\0bell\x07 del\x7F";
  const std::vector<std::string> unseen = {
      "\xF0\x9F\x98\x80 emoji \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB and flags "
      "\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 "
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 "
      "\xCE\xB3\xCE\xB5\xCE\xB9\xCE\xB1",
      std::string(kControls, sizeof(kControls) - 1),
      "  leading and trailing spaces   \n\n\r\n",
  };
  for (const std::string& s : unseen) {
    const std::vector<int32_t> ids = t.tokenizer->Encode(s);
    for (int32_t id : ids) ASSERT_LT(id, 1024 - 5) << "no added token in plain text";
    EXPECT_EQ(t.tokenizer->Decode(ids), s);
  }
}

TEST(BpeTrainerTest, AddedTokensAreSingleIdsAfterTheBaseVocabulary) {
  Trained t = Train({TrainText()}, 700);
  ASSERT_NE(t.tokenizer, nullptr);
  const std::vector<AddedTokenSpec> added = DefaultAddedTokens();
  const int32_t n_base = static_cast<int32_t>(t.bpe.tokens.size());
  for (size_t i = 0; i < added.size(); ++i) {
    const std::vector<int32_t> ids = t.tokenizer->Encode(added[i].content);
    ASSERT_EQ(ids.size(), 1u) << added[i].content;
    EXPECT_EQ(ids[0], n_base + static_cast<int32_t>(i));
    EXPECT_EQ(t.tokenizer->AddedTokenId(added[i].content), ids[0]);
    EXPECT_EQ(t.tokenizer->IsSpecial(ids[0]), added[i].special) << added[i].content;
  }
  EXPECT_FALSE(t.tokenizer->IsSpecial(*t.tokenizer->AddedTokenId("<think>")));
  // A ChatML turn: the markers are one id each and never merged with text.
  const std::vector<int32_t> ids = t.tokenizer->Encode("<|im_start|>user\nHi<|im_end|>\n");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), *t.tokenizer->AddedTokenId("<|im_start|>"));
  EXPECT_EQ(ids[ids.size() - 2], *t.tokenizer->AddedTokenId("<|im_end|>"));
  // As text (parse_special=false) a special token is several byte-level tokens.
  EXPECT_GT(t.tokenizer->Encode("<|im_end|>", /*parse_special=*/false).size(), 1u);
  // No learned token contains an added token's text.
  for (const std::string& token : t.bpe.tokens) {
    EXPECT_EQ(token.find("<|im_"), std::string::npos) << token;
  }
}

TEST(BpeTrainerTest, FrequentWordBecomesOneTokenAndRareWordDoesNot) {
  std::string text = TrainText();
  for (int i = 0; i < 400; ++i) text += "<|im_start|>user\nWe saw a zorblaxite today.<|im_end|>\n";
  text += "<|im_start|>user\nOnce: qwipfendral.<|im_end|>\n";
  Trained t = Train({text}, 1024);
  ASSERT_NE(t.tokenizer, nullptr);
  const std::vector<int32_t> ids = t.tokenizer->Encode("They found zorblaxite.");
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.emplace_back(t.tokenizer->TokenBytes(id));
  EXPECT_THAT(pieces, ::testing::Contains(" zorblaxite"));
  EXPECT_EQ(t.tokenizer->Encode(" zorblaxite").size(), 1u);
  EXPECT_GT(t.tokenizer->Encode(" qwipfendral").size(), 2u);
}

TEST(BpeTrainerTest, TrainingIsDeterministicAndFileStreamingMatchesWholeText) {
  kvl::testing::TempDir tmp("bpe");
  const std::string path = tmp.WriteFile("train.txt", TrainText());
  Trained a = Train({TrainText()}, 900);
  Trained b = Train({TrainText()}, 900);
  EXPECT_EQ(a.json, b.json);
  EXPECT_EQ(TokenizerConfigJson(a.bpe, Reference()), TokenizerConfigJson(b.bpe, Reference()));

  BpeTrainerOptions options;
  options.vocab_size = 900;
  auto trainer = BpeTrainer::Create(options, Reference().split_regex);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->AddFile(path).ok());
  EXPECT_EQ((*trainer)->bytes_read(), static_cast<int64_t>(TrainText().size()));
  EXPECT_EQ(TokenizerJson((*trainer)->Train(), Reference()), a.json);
}

TEST(BpeTrainerTest, SafeCutChunksPreTokenizeLikeTheWholeText) {
  // The corpus plus every golden string (odd whitespace, scripts, emoji,
  // contractions, numbers, embedded special tokens), read in 97-byte blocks.
  std::string text = TrainText();
  for (const std::string& g : GoldenTexts()) text += g + "\n";
  kvl::testing::TempDir tmp("bpe");
  const std::string path = tmp.WriteFile("mixed.txt", text);
  auto pre = PreTokenizer::Create(Reference().split_regex, {"<|endoftext|>", "<|im_start|>",
                                                            "<|im_end|>", "<think>", "</think>"});
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::string joined;
  std::vector<std::string> chunked;
  int n_chunks = 0;
  ASSERT_TRUE(ForEachSafeChunk(
                  path, **pre, 0,
                  [&](std::string_view chunk) {
                    ++n_chunks;
                    joined += chunk;
                    for (std::string& p : Pieces(**pre, chunk)) chunked.push_back(std::move(p));
                  },
                  /*block_bytes=*/97)
                  .ok());
  EXPECT_EQ(joined, text);
  EXPECT_GT(n_chunks, 100);
  EXPECT_EQ(chunked, Pieces(**pre, text));

  // --max-bytes never ends inside a character.
  std::string limited;
  ASSERT_TRUE(ForEachSafeChunk(tmp.WriteFile("cjk.txt", "ab\xE4\xBD\xA0\xE5\xA5\xBD"), **pre, 4,
                               [&](std::string_view c) { limited += c; })
                  .ok());
  EXPECT_EQ(limited, "ab");
}

TEST(BpeTrainerTest, PreTokenizerMatchesRuntimeOnGoldens) {
  const std::vector<std::string> goldens = GoldenTexts();
  ASSERT_GT(goldens.size(), 500u);
  // Unlimited vocabulary and min frequency 1: every pre-token of the training
  // text becomes one token, so the runtime's encoding of the same text shows
  // its pre-token boundaries, which must be the trainer's.
  Trained t = Train(goldens, 1 << 20, /*min_frequency=*/1);
  ASSERT_NE(t.tokenizer, nullptr);
  auto pre = PreTokenizer::Create(Reference().split_regex, {"<|endoftext|>", "<|im_start|>",
                                                            "<|im_end|>", "<think>", "</think>"});
  ASSERT_TRUE(pre.ok());
  int n_checked = 0;
  for (const std::string& g : goldens) {
    std::vector<std::string> runtime;
    for (int32_t id : t.tokenizer->Encode(g)) runtime.emplace_back(t.tokenizer->TokenBytes(id));
    std::vector<std::string> trainer_pieces = Pieces(**pre, g);
    // Added tokens are in both; the runtime gives their text as their bytes.
    EXPECT_EQ(runtime, trainer_pieces) << g;
    ++n_checked;
  }
  EXPECT_EQ(n_checked, static_cast<int>(goldens.size()));

  // Independent oracle: the real Qwen3 tokenizer. Encoding the trainer's
  // pieces one by one must give the goldens' ids (pieces finer than the real
  // pre-tokens would change them). Qwen3 has more added tokens than ours.
  auto qwen = Tokenizer::FromFile(ReferenceDir() + "/tokenizer.json");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  std::vector<std::string> qwen_added;
  for (const nlohmann::json& t : RealTokenizerJson().at("added_tokens")) {
    qwen_added.push_back(t.at("content").get<std::string>());
  }
  ASSERT_EQ(qwen_added.size(), 26u);
  pre = PreTokenizer::Create(Reference().split_regex, qwen_added);
  ASSERT_TRUE(pre.ok());
  std::ifstream in(std::string(KVL_SOURCE_DIR) + "/tests/data/tokenizer/qwen3_golden.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    std::vector<int32_t> ids;
    for (const std::string& p : Pieces(**pre, j.at("text").get<std::string>())) {
      (*qwen)->EncodeTo(p, /*parse_special=*/true, &ids);
    }
    EXPECT_EQ(ids, j.at("ids").get<std::vector<int32_t>>()) << j.at("text");
  }
}

// A second implementation loads the written files: @lenml/tokenizers (a
// JavaScript port of transformers.js, the npm oracle of docs/tokenizer.md)
// must encode held-out chat text to the same ids as kvl::Tokenizer.
constexpr char kNodeEncoder[] = R"js(
import fs from "node:fs";
import path from "node:path";
const [npm, dir, inputs] = process.argv.slice(2);
const { TokenizerLoader } = await import(path.join(npm, "@lenml/tokenizers/dist/main.mjs"));
const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"), tokenizerConfig: read("tokenizer_config.json") });
for (const text of JSON.parse(fs.readFileSync(inputs, "utf8"))) {
  console.log(JSON.stringify(tok.encode(text, { add_special_tokens: false })));
}
)js";

TEST(BpeTrainerTest, JavaScriptTokenizersEncodeLikeTheRuntime) {
  Trained t = Train({TrainText()}, 1200);
  ASSERT_NE(t.tokenizer, nullptr);
  kvl::testing::TempDir tmp("bpe-js");
  tmp.WriteFile("tok/tokenizer.json", t.json);
  tmp.WriteFile("tok/tokenizer_config.json", TokenizerConfigJson(t.bpe, Reference()));
  std::vector<std::string> texts = Lines(HeldOutText());
  texts.resize(std::min<size_t>(texts.size(), 300));
  texts.push_back(HeldOutText().substr(0, 4000));  // ChatML with special tokens
  texts.push_back(
      "Unseen: \xF0\x9F\x98\x80 \xE4\xBD\xA0\xE5\xA5\xBD <think>\nok\n</think>\n\n done");
  const std::string inputs = tmp.WriteFile("inputs.json", nlohmann::json(texts).dump());
  const std::string script = tmp.WriteFile("encode.mjs", kNodeEncoder);
  auto run = kvl::testing::RunProcess(
      {KVL_NODE, script, std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules", tmp.Path("tok"),
       inputs},
      std::chrono::seconds(60));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;
  const std::vector<std::string> lines = Lines(run->out);
  ASSERT_EQ(lines.size(), texts.size()) << run->err;
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(nlohmann::json::parse(lines[i]).get<std::vector<int32_t>>(),
              t.tokenizer->Encode(texts[i]))
        << texts[i];
  }
}

TEST(BpeTrainerTest, CompressionGrowsWithVocabularySize) {
  Trained small = Train({TrainText()}, 512);
  Trained large = Train({TrainText()}, 2048);
  ASSERT_NE(small.tokenizer, nullptr);
  ASSERT_NE(large.tokenizer, nullptr);
  const double bpt_small = BytesPerToken(*small.tokenizer, HeldOutText());
  const double bpt_large = BytesPerToken(*large.tokenizer, HeldOutText());
  EXPECT_GT(bpt_small, 1.5);  // merges help at all
  EXPECT_GT(bpt_large, 1.15 * bpt_small) << bpt_small << " vs " << bpt_large;
}

TEST(BpeTrainerTest, MinFrequencyStopsTrainingEarly) {
  Trained t = Train({TrainText()}, 1 << 16, /*min_frequency=*/50);
  ASSERT_NE(t.tokenizer, nullptr);
  EXPECT_LT(t.tokenizer->vocab_size(), 1 << 16);
  EXPECT_GT(t.bpe.merges.size(), 50u);
  // The last merge was still frequent enough: its pair occurs >= 50 times.
  const auto& [l, r] = t.bpe.merges.back();
  int64_t n = 0;
  for (size_t p = TrainText().find(l + r); p != std::string::npos;
       p = TrainText().find(l + r, p + 1))
    ++n;
  EXPECT_GE(n, 50) << l << "|" << r;
}

TEST(BpeTrainerTest, JsonHasTheRealQwen3Structure) {
  Trained t = Train({TrainText()}, 600);
  const nlohmann::json mine = nlohmann::json::parse(t.json);
  const nlohmann::json& real = RealTokenizerJson();
  auto keys = [](const nlohmann::json& j) {
    std::vector<std::string> k;
    for (auto it = j.begin(); it != j.end(); ++it) k.push_back(it.key());
    return k;
  };
  EXPECT_EQ(keys(mine), keys(real));
  EXPECT_EQ(keys(mine["model"]), keys(real["model"]));
  for (const std::string& k : keys(real["model"])) {
    EXPECT_EQ(mine["model"][k].type(), real["model"][k].type()) << k;
    if (k != "vocab" && k != "merges") {
      EXPECT_EQ(mine["model"][k], real["model"][k]) << k;
    }
  }
  for (const char* k : {"version", "truncation", "padding", "normalizer", "pre_tokenizer",
                        "post_processor", "decoder"}) {
    EXPECT_EQ(mine[k], real[k]) << k;
  }
  // Merges are [left, right] string pairs as in the real file.
  ASSERT_TRUE(mine["model"]["merges"][0].is_array());
  EXPECT_EQ(mine["model"]["merges"][0].size(), 2u);
  // The base vocabulary is the real file's first 256 entries, in id order.
  for (const auto& [token, id] : real["model"]["vocab"].items()) {
    if (id.get<int>() < 256) {
      EXPECT_EQ(mine["model"]["vocab"].at(token), id) << token;
    }
  }
  for (size_t i = 0; i < mine["added_tokens"].size(); ++i) {
    EXPECT_EQ(keys(mine["added_tokens"][i]), keys(real["added_tokens"][0]));
  }
  EXPECT_EQ(mine["added_tokens"][4]["content"], "</think>");
  EXPECT_EQ(mine["added_tokens"][4]["id"], mine["model"]["vocab"].size() + 4);

  const nlohmann::json cfg = nlohmann::json::parse(TokenizerConfigJson(t.bpe, Reference()));
  const nlohmann::json real_cfg =
      nlohmann::json::parse(ReadAll(ReferenceDir() + "/tokenizer_config.json"));
  EXPECT_EQ(keys(cfg), keys(real_cfg));
  EXPECT_EQ(cfg["chat_template"], real_cfg["chat_template"]);
  EXPECT_EQ(cfg["eos_token"], "<|im_end|>");
  EXPECT_EQ(cfg["pad_token"], "<|endoftext|>");
  EXPECT_TRUE(cfg["bos_token"].is_null());
  EXPECT_EQ(cfg["added_tokens_decoder"][std::to_string(t.bpe.tokens.size() + 2)]["content"],
            "<|im_end|>");
  EXPECT_EQ(cfg["additional_special_tokens"], nlohmann::json({"<|im_start|>", "<|im_end|>"}));
}

TEST(BpeTrainerTest, RejectsBadOptionsAndMissingFiles) {
  BpeTrainerOptions options;
  options.vocab_size = 260;  // < 256 + 5 added tokens
  EXPECT_EQ(BpeTrainer::Create(options, Reference().split_regex).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.vocab_size = 1000;
  options.min_frequency = 0;
  EXPECT_EQ(BpeTrainer::Create(options, Reference().split_regex).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.min_frequency = 2;
  EXPECT_EQ(BpeTrainer::Create(options, "(unclosed").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto trainer = BpeTrainer::Create(options, Reference().split_regex);
  ASSERT_TRUE(trainer.ok());
  EXPECT_EQ((*trainer)->AddFile("/nonexistent/corpus.txt").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadQwen3Reference("/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

TEST(BpeTrainerTest, CommandWritesLoadableFilesAndReportsCompression) {
  kvl::testing::TempDir tmp("bpe-cli");
  const std::string train = tmp.WriteFile("train.txt", TrainText());
  const std::string eval = tmp.WriteFile("valid.txt", HeldOutText());
  const std::string out = tmp.Path("tok");
  auto run = kvl::testing::RunProcess(
      {KVL_CLI_BIN, "train-tokenizer", "--input", train, "--out", out, "--vocab-size", "800",
       "--eval", eval, "--reference", ReferenceDir()},
      std::chrono::seconds(60));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_THAT(run->out, HasSubstr("input: "));
  EXPECT_THAT(run->out, HasSubstr("bytes/token"));
  EXPECT_THAT(run->out, HasSubstr("eval " + eval));
  EXPECT_THAT(run->err, HasSubstr("merges 539/539"));
  auto tok = Tokenizer::FromFile(out + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 800);
  EXPECT_EQ(ReadAll(out + "/tokenizer.json"), Train({TrainText()}, 800).json);
  EXPECT_TRUE(
      nlohmann::json::parse(ReadAll(out + "/tokenizer_config.json")).contains("chat_template"));

  auto usage = kvl::testing::RunProcess({KVL_CLI_BIN, "train-tokenizer", "--input", train},
                                        std::chrono::seconds(30));
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->exit_code, 2);
  auto missing =
      kvl::testing::RunProcess({KVL_CLI_BIN, "train-tokenizer", "--input", tmp.Path("nope.txt"),
                                "--out", out, "--reference", ReferenceDir()},
                               std::chrono::seconds(30));
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->exit_code, 1);
  EXPECT_THAT(missing->err, HasSubstr("nope.txt"));
}

}  // namespace
}  // namespace kvl::training
