// BPE tokenizer (byte-level or SentencePiece-style); see model/tokenizer.h and
// docs/tokenizer.md.
//
// Encode pipeline (the order of the Rust `tokenizers` library):
//   text -> repair invalid UTF-8 -> split out added tokens (raw text)
//        -> per remaining piece: normalizer (NFC, Replace, Prepend) -> split
//           out normalized added tokens -> pre-tokenizer stages (regex splits,
//           byte-level, Metaspace) -> BPE per pre-token (from bytes, or from
//           characters with byte fallback) -> ids
#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/files.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "model/text_normalize.h"
#include "model/utf8.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using json = nlohmann::json;

// Debian's Abseil is built with its own string_view type.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// ---------------------------------------------------------------------------
// The byte-level alphabet (model/text_normalize.h) with its inverse.
struct ByteLevelAlphabet {
  uint32_t byte_to_cp[256];
  int16_t cp_to_byte[512];  // -1 where no byte maps to the code point
  ByteLevelAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    for (int b = 0; b < 256; ++b) {
      byte_to_cp[b] = ByteLevelCodePoint(static_cast<uint8_t>(b));
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet kAlphabet;
  return kAlphabet;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes one code point of valid UTF-8 at s[*i] and advances *i.
uint32_t NextCodePoint(std::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + *i;
  if (p[0] < 0x80) return (*i += 1, p[0]);
  if (p[0] < 0xE0) return (*i += 2, ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu));
  if (p[0] < 0xF0) {
    return (*i += 3, ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu));
  }
  return (*i += 4, ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
                       (p[3] & 0x3Fu));
}

// Start of the code point that ends right before s[i] (i > 0, valid UTF-8).
size_t PrevCodePointStart(std::string_view s, size_t i) {
  do {
    --i;
  } while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80);
  return i;
}

// Unicode White_Space property (what Rust's char::is_whitespace and
// Oniguruma's \s test).
bool IsWhiteSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool IsWordChar(uint32_t cp) {
  if (cp == '_') return true;
  const utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

// ---------------------------------------------------------------------------
// Regexes: \s and \S are rewritten to Oniguruma's White_Space before PCRE2
// compiles them (RewriteWhiteSpaceEscapes, model/text_normalize.h).
std::string EscapeLiteral(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::strchr("\\^$.|?*+()[]{}-#", c) != nullptr && c != '\0') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

struct Pcre2CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using Pcre2CodePtr = std::unique_ptr<pcre2_code, Pcre2CodeDeleter>;

absl::StatusOr<Pcre2CodePtr> CompileRegex(std::string_view pattern, std::string_view component) {
  const std::string rewritten = RewriteWhiteSpaceEscapes(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()),
                                   rewritten.size(), PCRE2_UTF | PCRE2_UCP, &error, &offset,
                                   nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ", Av(component), " regex does not compile at offset ", offset,
                     ": ", reinterpret_cast<const char*>(message)));
  }
  // JIT is an optimisation only; without it pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Pcre2CodePtr(code);
}

// The regex ByteLevel applies when use_regex is true (GPT-2's pattern).
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Per-thread match state: match data is not tied to a pattern, so one block
// serves every tokenizer on this thread; the JIT stack is only created when the
// default 32 KiB machine stack runs out.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~MatchState() {
    pcre2_match_data_free(data);
    if (context != nullptr) pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
  void EnsureBigStack() {
    if (jit_stack != nullptr) return;
    jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

// Finds the next match at or after `start`; returns false when there is none.
bool NextMatch(const pcre2_code* code, std::string_view subject, size_t start, size_t* m_begin,
               size_t* m_end) {
  MatchState& st = ThreadMatchState();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
      rc == PCRE2_ERROR_MATCHLIMIT) {
    st.EnsureBigStack();
    pcre2_set_heap_limit(st.context, UINT32_MAX);
    pcre2_set_match_limit(st.context, UINT32_MAX);
    rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
  }
  if (rc < 0) {
    // Only PCRE2_ERROR_NOMATCH is expected; a resource failure past the raised
    // limits would need a pathological pattern, and the rest then stays one piece.
    return false;
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  *m_begin = ov[0];
  *m_end = ov[1];
  return true;
}

// ---------------------------------------------------------------------------
// Open-addressing map from a merge pair (left id, right id) to its rank and
// merged id; the hot lookup of BPE.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void Reserve(size_t n) {
    bits_ = 4;
    while ((size_t{1} << bits_) < 2 * n + 16) ++bits_;
    slots_.assign(size_t{1} << bits_, Entry{kEmpty, 0, 0});
  }
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Keeps the first (lowest-rank) entry for a duplicated pair.
  void Insert(uint64_t key, int32_t rank, int32_t merged) {
    for (size_t i = Slot(key);; i = (i + 1) & Mask()) {
      if (slots_[i].key == key) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Entry{key, rank, merged};
        return;
      }
    }
  }
  const Entry* Find(uint64_t key) const {
    for (size_t i = Slot(key);; i = (i + 1) & Mask()) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  size_t Mask() const { return (size_t{1} << bits_) - 1; }
  size_t Slot(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
  }
  int bits_ = 4;
  std::vector<Entry> slots_;
};

struct AddedToken {
  std::string content;  // as matched in text (normalized form for normalized tokens)
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Leftmost-longest matching over the added tokens (the semantics of the
// aho-corasick automaton `tokenizers` builds): a byte trie, so that files with
// thousands of added tokens sharing a prefix (Gemma-3's <unused0..6241>) cost
// one walk per candidate position, not one comparison per token.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() : nodes_(1) {}
  void Add(const AddedToken* token) {
    if (token->content.empty()) return;
    int32_t node = 0;
    for (char c : token->content) {
      const uint8_t b = static_cast<uint8_t>(c);
      int32_t child = Child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].next.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    if (nodes_[node].token == nullptr) nodes_[node].token = token;
    first_byte_[static_cast<uint8_t>(token->content[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Next match at or after `from`: returns the token and sets *pos, or nullptr.
  const AddedToken* Find(std::string_view text, size_t from, size_t* pos) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_byte_[static_cast<uint8_t>(text[i])]) continue;
      const AddedToken* best = nullptr;
      int32_t node = 0;
      for (size_t j = i; j < text.size(); ++j) {
        node = Child(node, static_cast<uint8_t>(text[j]));
        if (node < 0) break;
        if (nodes_[node].token != nullptr) best = nodes_[node].token;
      }
      if (best != nullptr) {
        *pos = i;
        return best;
      }
    }
    return nullptr;
  }

 private:
  struct Node {
    const AddedToken* token = nullptr;  // a token ends here
    std::vector<std::pair<uint8_t, int32_t>> next;
  };
  int32_t Child(int32_t node, uint8_t b) const {
    for (const auto& [byte, child] : nodes_[node].next) {
      if (byte == b) return child;
    }
    return -1;
  }
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
  bool empty_ = true;
};

// How a Split stage turns matches into pieces (`tokenizers`'
// SplitDelimiterBehavior): Isolated keeps matches and gaps as pieces; the
// merged forms attach a match to the piece before / after it (two adjacent
// matches stay apart).
enum class SplitBehavior { kIsolated, kMergedWithPrevious, kMergedWithNext };

// Metaspace's prepend_scheme: whether a piece gets the replacement prepended.
// kFirst: only the piece that starts the input text (not one after an added
// token).
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStage {
  Pcre2CodePtr regex;             // null: no split at this stage
  bool add_prefix_space = false;  // ByteLevel's option, applied per piece
  SplitBehavior behavior = SplitBehavior::kIsolated;
  // Metaspace (SentencePiece-style files only): ' ' -> replacement, prepend,
  // and with `split` a cut before every replacement (MergedWithNext).
  bool metaspace = false;
  std::string replacement;
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = false;
};

// One normalizer step, applied in file order to each piece of text between
// added tokens.
struct NormalizerStep {
  enum class Kind { kNfc, kReplace, kPrepend } kind;
  std::string pattern;  // kReplace: the literal text replaced
  std::string content;  // kReplace: its replacement; kPrepend: the prefix
};

// One step of a SentencePiece-style decoder, in file order.
struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string pattern;  // kReplace
  std::string content;  // kReplace: replacement; kStrip: the stripped character;
                        // kMetaspace: the replacement character
  int start = 0;        // kStrip: leading characters stripped (0 or 1)
  PrependScheme prepend = PrependScheme::kAlways;  // kMetaspace
};

struct BpeScratch {
  std::vector<int32_t> id, prev, next, rank;
  std::vector<uint64_t> heap;
  std::vector<uint8_t> dead;  // absorbed into their left neighbour
};

BpeScratch& ThreadBpeScratch() {
  thread_local BpeScratch scratch;
  return scratch;
}

absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", Av(what)));
}

bool GetBool(const json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  return it->get<bool>();
}

std::string TypeOf(const json& obj) {
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

}  // namespace

// ---------------------------------------------------------------------------
struct Tokenizer::Impl {
  std::string hash;
  // Indexed by id; entries are empty for ids the file does not define.
  std::vector<std::string> token_text;   // tokenizer.json form
  std::vector<std::string> token_bytes;  // what the ByteLevel decoder emits
  std::vector<uint8_t> is_special;
  std::vector<uint8_t> defined;
  std::unordered_map<std::string, int32_t> text_to_id;   // base vocabulary + added
  std::unordered_map<std::string, int32_t> bytes_to_id;  // base vocabulary, raw bytes
  int32_t byte_id[256];
  MergeTable merges;
  bool ignore_merges = false;
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStage> stages;

  // false: SentencePiece-style BPE (Gemma, Llama-2, Mistral): the model starts
  // from characters of the vocabulary, unknown ones become <0xNN> byte tokens
  // (byte_fallback) or the unk token; a SentencePiece decoder maps tokens back.
  bool byte_level = true;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;
  int32_t fallback_id[256];          // <0xNN>, -1 if absent
  std::vector<int32_t> bmp_char_id;  // one-character tokens, by code point
  std::unordered_map<uint32_t, int32_t> astral_char_id;
  std::vector<DecoderStep> decoder;
  // Bytes of a token that a decode emits first, where the decoder treats the
  // first token differently (Strip, Metaspace); empty otherwise.
  std::vector<std::string> leading_bytes;
  std::vector<AddedToken> added;
  // [parse_special]: raw-text and normalized-text matchers.
  AddedTokenMatcher raw_matcher[2];
  AddedTokenMatcher norm_matcher[2];

  absl::Status Load(const json& root);
  absl::Status LoadModel(const json& model);
  absl::Status LoadPreTokenizer(const json& node, bool* saw_byte_level);
  absl::Status LoadNormalizer(const json& node);
  absl::Status LoadDecoder(const json& node);
  // What a SentencePiece-style decoder makes of one token's text; `leading`:
  // the token is the first one decoded.
  std::string DecodeTokenSp(const std::string& text, bool leading) const;

  // The normalizer applied to `piece`; returns `piece` itself or a view of *storage.
  std::string_view Normalize(std::string_view piece, std::string* storage) const;

  void SplitAdded(std::string_view text, const AddedTokenMatcher& matcher,
                  std::vector<int32_t>* ids,
                  const std::function<void(std::string_view)>& on_text) const;
  void PreTokenize(std::string_view piece, size_t stage, std::vector<int32_t>* ids) const;
  // SentencePiece-style pre-tokenization; `at_start`: the piece begins the input text.
  void PreTokenizeSp(std::string_view piece, size_t stage, bool at_start,
                     std::vector<int32_t>* ids) const;
  void Bpe(std::string_view word, std::vector<int32_t>* ids) const;
  void BpeChars(std::string_view word, std::vector<int32_t>* ids) const;
  void MergeSymbols(BpeScratch& s, std::vector<int32_t>* ids) const;
  int32_t CharId(uint32_t cp) const {
    if (cp < bmp_char_id.size()) return bmp_char_id[cp];
    auto it = astral_char_id.find(cp);
    return it == astral_char_id.end() ? -1 : it->second;
  }
  int32_t PairRank(int32_t a, int32_t b) const {
    const MergeTable::Entry* e = merges.Find(MergeTable::Key(a, b));
    return e == nullptr ? INT32_MAX : e->rank;
  }
};

namespace {

// A `{"String": "..."}` pattern (Replace normalizer and decoder). Regex
// patterns are refused: no supported file uses one there.
absl::StatusOr<std::string> StringPattern(const json& node, std::string_view component) {
  const json& pattern = node.at("pattern");
  if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
      pattern["String"].get<std::string>().empty()) {
    return Invalid(
        absl::StrCat(Av(component), " pattern is not a non-empty String (Regex is not supported)"));
  }
  return pattern["String"].get<std::string>();
}

absl::StatusOr<PrependScheme> ParsePrependScheme(const json& node, std::string_view component) {
  if (node.contains("prepend_scheme") && node["prepend_scheme"].is_string()) {
    const std::string scheme = node["prepend_scheme"].get<std::string>();
    if (scheme == "always") return PrependScheme::kAlways;
    if (scheme == "first") return PrependScheme::kFirst;
    if (scheme == "never") return PrependScheme::kNever;
    return Invalid(absl::StrCat(Av(component), " prepend_scheme '", scheme, "' is unknown"));
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return GetBool(node, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

// Whether a pre-tokenizer tree has a ByteLevel step (byte-level BPE).
bool HasByteLevelStep(const json& node) {
  if (!node.is_object()) return false;
  if (TypeOf(node) == "ByteLevel") return true;
  if (TypeOf(node) == "Sequence" && node.contains("pretokenizers") &&
      node["pretokenizers"].is_array()) {
    for (const json& p : node["pretokenizers"]) {
      if (HasByteLevelStep(p)) return true;
    }
  }
  return false;
}

}  // namespace

absl::Status Tokenizer::Impl::LoadNormalizer(const json& node) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(node);
  if (type == "NFC") {
    normalizer.push_back(NormalizerStep{NormalizerStep::Kind::kNfc, "", ""});
    return absl::OkStatus();
  }
  if (type == "Replace") {
    absl::StatusOr<std::string> pattern = StringPattern(node, "normalizer Replace");
    if (!pattern.ok()) return pattern.status();
    normalizer.push_back(NormalizerStep{NormalizerStep::Kind::kReplace, *std::move(pattern),
                                        node.at("content").get<std::string>()});
    return absl::OkStatus();
  }
  if (type == "Prepend") {
    normalizer.push_back(
        NormalizerStep{NormalizerStep::Kind::kPrepend, "", node.at("prepend").get<std::string>()});
    return absl::OkStatus();
  }
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (const json& n : node["normalizers"]) {
      KVL_RETURN_IF_ERROR(LoadNormalizer(n));
    }
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat("normalizer type '", type,
                              "' is not supported (NFC, Replace, Prepend, Sequence)"));
}

std::string_view Tokenizer::Impl::Normalize(std::string_view piece, std::string* storage) const {
  for (const NormalizerStep& step : normalizer) {
    switch (step.kind) {
      case NormalizerStep::Kind::kNfc:
        if (!IsAscii(piece)) {
          std::string nfc = Nfc(piece);
          *storage = std::move(nfc);
          piece = *storage;
        }
        break;
      case NormalizerStep::Kind::kReplace:
        if (piece.find(step.pattern) != std::string_view::npos) {
          std::string replaced = absl::StrReplaceAll(Av(piece), {{step.pattern, step.content}});
          *storage = std::move(replaced);
          piece = *storage;
        }
        break;
      case NormalizerStep::Kind::kPrepend:
        // `tokenizers` leaves an empty string empty.
        if (!piece.empty()) {
          std::string prepended = absl::StrCat(step.content, Av(piece));
          *storage = std::move(prepended);
          piece = *storage;
        }
        break;
    }
  }
  return piece;
}

absl::Status Tokenizer::Impl::LoadPreTokenizer(const json& node, bool* saw_byte_level) {
  const std::string type = TypeOf(node);
  if (*saw_byte_level) {
    return Invalid(absl::StrCat("pre_tokenizer '", type, "' after ByteLevel is not supported"));
  }
  if (type == "Sequence") {
    if (!node.contains("pretokenizers") || !node["pretokenizers"].is_array()) {
      return Invalid("pre_tokenizer Sequence without a 'pretokenizers' array");
    }
    for (const json& p : node["pretokenizers"]) {
      KVL_RETURN_IF_ERROR(LoadPreTokenizer(p, saw_byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    const std::string behavior = node.value("behavior", "");
    SplitBehavior split_behavior;
    if (behavior == "Isolated") {
      split_behavior = SplitBehavior::kIsolated;
    } else if (!byte_level && behavior == "MergedWithPrevious") {
      split_behavior = SplitBehavior::kMergedWithPrevious;
    } else if (!byte_level && behavior == "MergedWithNext") {
      split_behavior = SplitBehavior::kMergedWithNext;
    } else {
      return Invalid(absl::StrCat("pre_tokenizer Split behavior '", behavior,
                                  "' is not supported (Isolated; MergedWithPrevious and "
                                  "MergedWithNext without ByteLevel)"));
    }
    if (GetBool(node, "invert", false)) {
      return Invalid("pre_tokenizer Split with invert=true is not supported");
    }
    const json& pattern = node.at("pattern");
    std::string source;
    if (pattern.contains("Regex")) {
      source = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String")) {
      source = EscapeLiteral(pattern["String"].get<std::string>());
    } else {
      return Invalid("pre_tokenizer Split pattern is neither Regex nor String");
    }
    auto code = CompileRegex(source, "pre_tokenizer Split");
    if (!code.ok()) return code.status();
    PreTokenizerStage stage;
    stage.regex = std::move(*code);
    stage.behavior = split_behavior;
    stages.push_back(std::move(stage));
    return absl::OkStatus();
  }
  if (type == "Metaspace" && !byte_level) {
    PreTokenizerStage stage;
    stage.metaspace = true;
    stage.replacement = node.value("replacement", "\xE2\x96\x81");
    if (stage.replacement.empty()) {
      return Invalid("pre_tokenizer Metaspace with an empty replacement");
    }
    absl::StatusOr<PrependScheme> scheme = ParsePrependScheme(node, "pre_tokenizer Metaspace");
    if (!scheme.ok()) return scheme.status();
    stage.prepend = *scheme;
    stage.split = GetBool(node, "split", true);
    stages.push_back(std::move(stage));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *saw_byte_level = true;
    PreTokenizerStage stage;
    stage.add_prefix_space = GetBool(node, "add_prefix_space", true);
    if (GetBool(node, "use_regex", true)) {
      auto code = CompileRegex(kGpt2Pattern, "ByteLevel");
      if (!code.ok()) return code.status();
      stage.regex = std::move(*code);
    }
    if (stage.regex != nullptr || stage.add_prefix_space) stages.push_back(std::move(stage));
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat("pre_tokenizer type '", type, "' is not supported ",
                              byte_level ? "with ByteLevel (Sequence, Split, ByteLevel)"
                                         : "(Sequence, Split, Metaspace, or ByteLevel)"));
}

absl::Status Tokenizer::Impl::LoadModel(const json& model) {
  if (!model.is_object()) return Invalid("'model' is missing or not an object");
  const std::string type = TypeOf(model);
  if (!type.empty() && type != "BPE") {
    return Invalid(absl::StrCat("model type '", type, "' is not supported (only BPE)"));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() != 0.0) {
    return Invalid("model BPE dropout is not supported");
  }
  byte_fallback = GetBool(model, "byte_fallback", false);
  fuse_unk = GetBool(model, "fuse_unk", false);
  if (byte_level && byte_fallback) {
    return Invalid("model BPE byte_fallback is not supported with a ByteLevel pre_tokenizer");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return Invalid(absl::StrCat("model BPE ", key, " is not supported"));
    }
  }
  ignore_merges = GetBool(model, "ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Invalid("model.vocab is missing or not an object");
  }
  const ByteLevelAlphabet& alphabet = Alphabet();
  int32_t max_id = -1;
  for (const auto& [text, id_json] : model["vocab"].items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > INT32_MAX / 2) {
      return Invalid(absl::StrCat("model.vocab id of '", text, "' is not a valid id"));
    }
    max_id = std::max(max_id, id_json.get<int32_t>());
  }
  token_text.assign(max_id + 1, "");
  token_bytes.assign(max_id + 1, "");
  defined.assign(max_id + 1, 0);
  is_special.assign(max_id + 1, 0);
  text_to_id.reserve(model["vocab"].size() * 2);
  bytes_to_id.reserve(model["vocab"].size() * 2);
  if (!byte_level) bmp_char_id.assign(0x10000, -1);
  for (const auto& [text, id_json] : model["vocab"].items()) {
    const int32_t id = id_json.get<int32_t>();
    token_text[id] = text;
    defined[id] = 1;
    text_to_id.emplace(text, id);
    if (!byte_level) {
      // token_bytes come from the decoder (LoadDecoder).
      size_t i = 0;
      const uint32_t cp = text.empty() ? 0 : NextCodePoint(text, &i);
      if (!text.empty() && i == text.size()) {
        if (cp < bmp_char_id.size()) {
          bmp_char_id[cp] = id;
        } else {
          astral_char_id.emplace(cp, id);
        }
      }
      continue;
    }
    // Byte-level form -> raw bytes; a symbol outside the alphabet makes the
    // token unreachable by BPE and decodes as its own UTF-8 (as in `tokenizers`).
    std::string bytes;
    bool in_alphabet = true;
    for (size_t i = 0; i < text.size();) {
      const uint32_t cp = NextCodePoint(text, &i);
      const int b = cp < 512 ? alphabet.cp_to_byte[cp] : -1;
      if (b < 0) {
        in_alphabet = false;
        break;
      }
      bytes.push_back(static_cast<char>(b));
    }
    if (in_alphabet) {
      token_bytes[id] = bytes;
      bytes_to_id.emplace(std::move(bytes), id);
    } else {
      token_bytes[id] = text;
    }
  }
  if (!byte_level) {
    std::fill(std::begin(byte_id), std::end(byte_id), -1);
    for (int b = 0; b < 256; ++b) {
      // `tokenizers` spells them format!("<{b:#04X}>"): "<0x0A>".
      static constexpr char kHex[] = "0123456789ABCDEF";
      const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      auto it = text_to_id.find(name);
      fallback_id[b] = it == text_to_id.end() ? -1 : it->second;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = text_to_id.find(model["unk_token"].get<std::string>());
      if (it == text_to_id.end()) return Invalid("model.unk_token is not in model.vocab");
      unk_id = it->second;
    }
  }
  for (int b = 0; b < 256 && byte_level; ++b) {
    std::string symbol;
    AppendUtf8(alphabet.byte_to_cp[b], &symbol);
    auto it = text_to_id.find(symbol);
    if (it == text_to_id.end()) {
      return Invalid(absl::StrCat("model.vocab lacks the byte-level symbol '", symbol,
                                  "' for byte ", b, " (not a byte-level BPE vocabulary)"));
    }
    byte_id[b] = it->second;
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return Invalid("model.merges is missing or not an array");
  }
  const json& merge_list = model["merges"];
  merges.Reserve(merge_list.size());
  int32_t rank = 0;
  std::string left, right;
  for (const json& m : merge_list) {
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Invalid(absl::StrCat("model.merges entry '", s, "' is not 'left right'"));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return Invalid(absl::StrCat("model.merges entry ", rank, " is neither 'a b' nor [a, b]"));
    }
    auto l = text_to_id.find(left), r = text_to_id.find(right);
    auto merged = text_to_id.find(left + right);
    if (l == text_to_id.end() || r == text_to_id.end() || merged == text_to_id.end()) {
      return Invalid(absl::StrCat("model.merges entry ", rank, " ('", left, "' + '", right,
                                  "') uses a token missing from model.vocab"));
    }
    merges.Insert(MergeTable::Key(l->second, r->second), rank, merged->second);
    ++rank;
  }
  return absl::OkStatus();
}

// The SentencePiece-style decoders: Replace, ByteFallback and Metaspace act
// per token before Fuse joins them; Strip acts on the joined text, so only its
// leading cut (start <= 1) is supported, as the first token's.
absl::Status Tokenizer::Impl::LoadDecoder(const json& node) {
  const std::string type = node.is_null() ? "null" : TypeOf(node);
  const bool fused = std::any_of(decoder.begin(), decoder.end(), [](const DecoderStep& d) {
    return d.kind == DecoderStep::Kind::kFuse;
  });
  if (type == "Sequence" && node.contains("decoders") && node["decoders"].is_array()) {
    for (const json& d : node["decoders"]) KVL_RETURN_IF_ERROR(LoadDecoder(d));
    return absl::OkStatus();
  }
  DecoderStep step{};
  if (type == "Replace") {
    absl::StatusOr<std::string> pattern = StringPattern(node, "decoder Replace");
    if (!pattern.ok()) return pattern.status();
    size_t one = 0;
    NextCodePoint(*pattern, &one);
    // One character: replacing per token equals replacing in the joined text.
    if (one != pattern->size()) return Invalid("decoder Replace pattern longer than one character");
    step.kind = DecoderStep::Kind::kReplace;
    step.pattern = *std::move(pattern);
    step.content = node.at("content").get<std::string>();
  } else if (type == "ByteFallback" && !fused) {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse" && !fused) {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip" && fused) {
    step.kind = DecoderStep::Kind::kStrip;
    step.content = node.at("content").get<std::string>();
    step.start = node.value("start", 0);
    size_t one = 0;
    if (!step.content.empty()) NextCodePoint(step.content, &one);
    if (step.start < 0 || step.start > 1 || node.value("stop", 0) != 0 || step.content.empty() ||
        one != step.content.size()) {
      return Invalid("decoder Strip is supported only as start <= 1, stop = 0, one character");
    }
  } else if (type == "Metaspace" && !fused) {
    step.kind = DecoderStep::Kind::kMetaspace;
    step.content = node.value("replacement", "\xE2\x96\x81");
    absl::StatusOr<PrependScheme> scheme = ParsePrependScheme(node, "decoder Metaspace");
    if (!scheme.ok()) return scheme.status();
    step.prepend = *scheme;
  } else {
    return Invalid(absl::StrCat("decoder type '", type,
                                "' is not supported here (without ByteLevel: Replace, "
                                "ByteFallback, Metaspace, then Fuse, then Strip, in a Sequence)"));
  }
  decoder.push_back(std::move(step));
  return absl::OkStatus();
}

std::string Tokenizer::Impl::DecodeTokenSp(const std::string& text, bool leading) const {
  std::string s = text;
  for (const DecoderStep& step : decoder) {
    switch (step.kind) {
      case DecoderStep::Kind::kReplace:
        s = absl::StrReplaceAll(s, {{step.pattern, step.content}});
        break;
      case DecoderStep::Kind::kByteFallback: {
        int hi = -1, lo = -1;
        auto hex = [](char c) {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          return -1;
        };
        if (s.size() == 6 && absl::StartsWith(s, "<0x") && s[5] == '>') {
          hi = hex(s[3]);
          lo = hex(s[4]);
        }
        if (hi >= 0 && lo >= 0) s = std::string(1, static_cast<char>(hi * 16 + lo));
        break;
      }
      case DecoderStep::Kind::kFuse:
        break;
      case DecoderStep::Kind::kStrip:
        if (leading && step.start > 0 && absl::StartsWith(s, step.content)) {
          s.erase(0, step.content.size());
        }
        break;
      case DecoderStep::Kind::kMetaspace:
        // `tokenizers` drops every replacement character of the first token.
        s = absl::StrReplaceAll(
            s, {{step.content, leading && step.prepend != PrependScheme::kNever ? "" : " "}});
        break;
    }
  }
  return s;
}

absl::Status Tokenizer::Impl::Load(const json& root) {
  if (!root.is_object()) return Invalid("top level is not an object");
  const json pre = root.value("pre_tokenizer", json());
  byte_level = HasByteLevelStep(pre);
  KVL_RETURN_IF_ERROR(LoadModel(root.contains("model") ? root["model"] : json()));
  KVL_RETURN_IF_ERROR(LoadNormalizer(root.value("normalizer", json())));
  bool saw_byte_level = false;
  if (!pre.is_null()) {
    KVL_RETURN_IF_ERROR(LoadPreTokenizer(pre, &saw_byte_level));
  }
  const json decoder_json = root.value("decoder", json());
  if (byte_level && TypeOf(decoder_json) != "ByteLevel") {
    return Invalid(
        absl::StrCat("decoder type '", decoder_json.is_null() ? "null" : TypeOf(decoder_json),
                     "' is not supported with a ByteLevel pre_tokenizer (only ByteLevel)"));
  }
  if (!byte_level) {
    if (TypeOf(decoder_json) == "ByteLevel") {
      return Invalid(
          absl::StrCat("decoder 'ByteLevel' needs a ByteLevel pre_tokenizer (this "
                       "file's pre_tokenizer is '",
                       pre.is_null() ? "null" : TypeOf(pre), "')"));
    }
    KVL_RETURN_IF_ERROR(LoadDecoder(decoder_json));
    for (size_t id = 0; id < token_text.size(); ++id) {
      if (defined[id]) token_bytes[id] = DecodeTokenSp(token_text[id], /*leading=*/false);
    }
  }
  // post_processor only adds template tokens (BOS/EOS) or trims offsets; Encode
  // never adds special tokens, so it is not consulted.

  const json added_list = root.value("added_tokens", json::array());
  if (!added_list.is_array()) return Invalid("added_tokens is not an array");
  added.reserve(added_list.size());  // pointers into `added` stay valid
  for (const json& t : added_list) {
    AddedToken token;
    if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() > INT32_MAX / 2 || !t.contains("content") ||
        !t["content"].is_string()) {
      return Invalid("added_tokens entry without a valid id and content");
    }
    token.id = t["id"].get<int32_t>();
    token.content = t["content"].get<std::string>();
    if (!IsValidUtf8(token.content)) return Invalid("added token content is not UTF-8");
    token.special = GetBool(t, "special", false);
    token.lstrip = GetBool(t, "lstrip", false);
    token.rstrip = GetBool(t, "rstrip", false);
    token.single_word = GetBool(t, "single_word", false);
    token.normalized = GetBool(t, "normalized", !token.special);
    const size_t need = static_cast<size_t>(token.id) + 1;
    if (need > token_text.size()) {
      token_text.resize(need);
      token_bytes.resize(need);
      defined.resize(need, 0);
      is_special.resize(need, 0);
    }
    token_text[token.id] = token.content;
    defined[token.id] = 1;
    is_special[token.id] = token.special ? 1 : 0;
    text_to_id[token.content] = token.id;
    if (byte_level) {
      // The ByteLevel decoder maps each symbol back to a byte, falling back to
      // the token's own UTF-8 when a character is outside the alphabet.
      std::string bytes;
      bool in_alphabet = true;
      for (size_t i = 0; i < token.content.size();) {
        const uint32_t cp = NextCodePoint(token.content, &i);
        const int b = cp < 512 ? Alphabet().cp_to_byte[cp] : -1;
        if (b < 0) {
          in_alphabet = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      token_bytes[token.id] = in_alphabet ? bytes : token.content;
    } else {
      // The decoder runs over added tokens too (`tokenizers` decodes them alike).
      token_bytes[token.id] = DecodeTokenSp(token.content, /*leading=*/false);
    }
    if (token.normalized && !normalizer.empty()) {
      std::string storage;
      token.content = std::string(Normalize(token.content, &storage));
    }
    added.push_back(std::move(token));
  }
  const bool leading_rule = std::any_of(decoder.begin(), decoder.end(), [](const DecoderStep& d) {
    return d.kind == DecoderStep::Kind::kStrip || d.kind == DecoderStep::Kind::kMetaspace;
  });
  if (leading_rule) {
    leading_bytes.assign(token_text.size(), "");
    for (size_t id = 0; id < token_text.size(); ++id) {
      if (defined[id]) leading_bytes[id] = DecodeTokenSp(token_text[id], /*leading=*/true);
    }
  }
  for (const AddedToken& t : added) {
    for (int parse_special = 0; parse_special < 2; ++parse_special) {
      if (t.special && !parse_special) continue;
      (t.normalized ? norm_matcher : raw_matcher)[parse_special].Add(&t);
    }
  }
  return absl::OkStatus();
}

void Tokenizer::Impl::SplitAdded(std::string_view text, const AddedTokenMatcher& matcher,
                                 std::vector<int32_t>* ids,
                                 const std::function<void(std::string_view)>& on_text) const {
  size_t emitted = 0;  // text[..emitted) has been handed on
  size_t search = 0;
  size_t pos = 0;
  while (const AddedToken* t = matcher.empty() ? nullptr : matcher.Find(text, search, &pos)) {
    size_t start = pos, stop = pos + t->content.size();
    search = stop;
    if (t->single_word) {
      size_t i = stop;
      const bool word_before = start > 0 && [&] {
        size_t p = PrevCodePointStart(text, start);
        return IsWordChar(NextCodePoint(text, &p));
      }();
      const bool word_after = stop < text.size() && IsWordChar(NextCodePoint(text, &i));
      if (word_before || word_after) continue;
    }
    if (t->lstrip) {
      while (start > emitted) {
        size_t p = PrevCodePointStart(text, start);
        size_t q = p;
        if (!IsWhiteSpace(NextCodePoint(text, &q))) break;
        start = p;
      }
    }
    if (t->rstrip) {
      while (stop < text.size()) {
        size_t q = stop;
        if (!IsWhiteSpace(NextCodePoint(text, &q))) break;
        stop = q;
      }
      search = stop;
    }
    if (start > emitted) on_text(text.substr(emitted, start - emitted));
    ids->push_back(t->id);
    emitted = stop;
  }
  if (emitted < text.size()) on_text(text.substr(emitted));
}

void Tokenizer::Impl::PreTokenize(std::string_view piece, size_t stage,
                                  std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (stage == stages.size()) {
    Bpe(piece, ids);
    return;
  }
  const PreTokenizerStage& st = stages[stage];
  std::string prefixed;
  if (st.add_prefix_space && piece[0] != ' ') {
    prefixed = absl::StrCat(" ", Av(piece));
    piece = prefixed;
  }
  if (st.regex == nullptr) {
    PreTokenize(piece, stage + 1, ids);
    return;
  }
  // Isolated: matches and the gaps between them are both pieces.
  size_t prev = 0, search = 0, begin = 0, end = 0;
  while (search <= piece.size() && NextMatch(st.regex.get(), piece, search, &begin, &end)) {
    if (end == begin) {  // empty match: produces no piece; step one character
      if (begin >= piece.size()) break;
      size_t next = begin;
      NextCodePoint(piece, &next);
      search = next;
      continue;
    }
    if (begin > prev) PreTokenize(piece.substr(prev, begin - prev), stage + 1, ids);
    PreTokenize(piece.substr(begin, end - begin), stage + 1, ids);
    prev = search = end;
  }
  if (prev < piece.size()) PreTokenize(piece.substr(prev), stage + 1, ids);
}

// Segments of `piece` cut at matches, joined per `behavior` (`tokenizers`'
// NormalizedString::split): each entry is [begin, end).
void SplitPiece(std::string_view piece, SplitBehavior behavior,
                const std::function<bool(size_t, size_t*, size_t*)>& next_match,
                std::vector<std::pair<size_t, size_t>>* out) {
  struct Segment {
    size_t begin, end;
    bool match;
  };
  std::vector<Segment> segments;
  size_t prev = 0, search = 0, begin = 0, end = 0;
  while (search <= piece.size() && next_match(search, &begin, &end)) {
    if (end == begin) {  // empty match: produces no piece; step one character
      if (begin >= piece.size()) break;
      size_t next = begin;
      NextCodePoint(piece, &next);
      search = next;
      continue;
    }
    if (begin > prev) segments.push_back({prev, begin, false});
    segments.push_back({begin, end, true});
    prev = search = end;
  }
  if (prev < piece.size()) segments.push_back({prev, piece.size(), false});
  out->clear();
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& g : segments) out->emplace_back(g.begin, g.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& g : segments) {
        if (g.match && !previous_match && !out->empty()) {
          out->back().second = g.end;
        } else {
          out->emplace_back(g.begin, g.end);
        }
        previous_match = g.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool next_match_seen = false;  // the segment after this one is a match
      for (size_t k = segments.size(); k-- > 0;) {
        const Segment& g = segments[k];
        if (g.match && !next_match_seen && !out->empty()) {
          out->back().first = g.begin;
        } else {
          out->emplace_back(g.begin, g.end);
        }
        next_match_seen = g.match;
      }
      std::reverse(out->begin(), out->end());
      break;
    }
  }
}

void Tokenizer::Impl::PreTokenizeSp(std::string_view piece, size_t stage, bool at_start,
                                    std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (stage == stages.size()) {
    BpeChars(piece, ids);
    return;
  }
  const PreTokenizerStage& st = stages[stage];
  std::string replaced;
  std::vector<std::pair<size_t, size_t>> parts;
  if (st.metaspace) {
    replaced = absl::StrReplaceAll(Av(piece), {{" ", st.replacement}});
    const bool prepend = (st.prepend == PrependScheme::kAlways ||
                          (st.prepend == PrependScheme::kFirst && at_start)) &&
                         !absl::StartsWith(replaced, st.replacement);
    if (prepend) replaced.insert(0, st.replacement);
    piece = replaced;
    if (!st.split) {
      PreTokenizeSp(piece, stage + 1, at_start, ids);
      return;
    }
    SplitPiece(
        piece, SplitBehavior::kMergedWithNext,
        [&](size_t from, size_t* b, size_t* e) {
          const size_t at = piece.find(st.replacement, from);
          if (at == std::string_view::npos) return false;
          *b = at;
          *e = at + st.replacement.size();
          return true;
        },
        &parts);
  } else {
    SplitPiece(
        piece, st.behavior,
        [&](size_t from, size_t* b, size_t* e) {
          return NextMatch(st.regex.get(), piece, from, b, e);
        },
        &parts);
  }
  for (const auto& [b, e] : parts) {
    PreTokenizeSp(piece.substr(b, e - b), stage + 1, at_start && b == 0, ids);
  }
}

// BPE over the bytes of one pre-token: repeatedly merge the adjacent pair with
// the lowest merge rank, leftmost first on ties (what `tokenizers` does with
// its priority queue). Short words scan a rank array; long ones use a heap so
// that a megabyte-long word stays O(n log n).
void Tokenizer::Impl::Bpe(std::string_view word, std::vector<int32_t>* ids) const {
  const size_t n = word.size();
  const auto* w = reinterpret_cast<const uint8_t*>(word.data());
  if (n == 1) {
    ids->push_back(byte_id[w[0]]);
    return;
  }
  if (ignore_merges) {
    // Llama-3 style: a pre-token that is itself in the vocabulary is one token.
    auto it = bytes_to_id.find(std::string(word));
    if (it != bytes_to_id.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  BpeScratch& s = ThreadBpeScratch();
  s.id.resize(n);
  for (size_t i = 0; i < n; ++i) s.id[i] = byte_id[w[i]];
  MergeSymbols(s, ids);
}

// SentencePiece-style BPE over the characters of one pre-token (`tokenizers`'
// BPE::merge_word): a character in the vocabulary is its token; otherwise its
// UTF-8 bytes as <0xNN> tokens (byte_fallback, when all exist), else the unk
// token (one for a run of unknown characters with fuse_unk), else nothing.
void Tokenizer::Impl::BpeChars(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    auto it = text_to_id.find(std::string(word));
    if (it != text_to_id.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  BpeScratch& s = ThreadBpeScratch();
  s.id.clear();
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    const int32_t id = CharId(NextCodePoint(word, &i));
    if (id >= 0) {
      s.id.push_back(id);
      last_unk = false;
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (size_t k = begin; k < i; ++k)
        all = all && fallback_id[static_cast<uint8_t>(word[k])] >= 0;
      if (all) {
        for (size_t k = begin; k < i; ++k)
          s.id.push_back(fallback_id[static_cast<uint8_t>(word[k])]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id >= 0 && !(fuse_unk && last_unk)) s.id.push_back(unk_id);
    last_unk = unk_id >= 0;
  }
  if (s.id.size() <= 1) {
    ids->insert(ids->end(), s.id.begin(), s.id.end());
    return;
  }
  MergeSymbols(s, ids);
}

// Repeatedly merges the adjacent pair of s.id with the lowest merge rank,
// leftmost first on ties, and appends the result to *ids.
void Tokenizer::Impl::MergeSymbols(BpeScratch& s, std::vector<int32_t>* ids) const {
  const size_t n = s.id.size();
  s.prev.resize(n);
  s.next.resize(n);
  s.rank.resize(n);
  const int32_t last = static_cast<int32_t>(n) - 1;
  for (int32_t i = 0; i <= last; ++i) {
    s.prev[i] = i - 1;
    s.next[i] = i + 1;  // n marks the end
  }
  for (int32_t i = 0; i < last; ++i) s.rank[i] = PairRank(s.id[i], s.id[i + 1]);
  s.rank[last] = INT32_MAX;

  // Merges symbol i with its right neighbour and refreshes the two affected
  // pair ranks; returns the positions whose rank changed (-1 if none).
  auto merge_at = [&](int32_t i, int32_t* changed_left) {
    const int32_t j = s.next[i];
    s.id[i] = merges.Find(MergeTable::Key(s.id[i], s.id[j]))->merged;
    s.next[i] = s.next[j];
    if (s.next[i] <= last) s.prev[s.next[i]] = i;
    s.rank[i] = s.next[i] <= last ? PairRank(s.id[i], s.id[s.next[i]]) : INT32_MAX;
    *changed_left = s.prev[i];
    if (s.prev[i] >= 0) s.rank[s.prev[i]] = PairRank(s.id[s.prev[i]], s.id[i]);
  };

  constexpr size_t kScanLimit = 64;
  if (n <= kScanLimit) {
    for (;;) {
      int32_t best = -1, best_rank = INT32_MAX;
      for (int32_t i = 0; i <= last; i = s.next[i]) {
        if (s.rank[i] < best_rank) best_rank = s.rank[i], best = i;
      }
      if (best < 0) break;
      int32_t unused;
      merge_at(best, &unused);
    }
  } else {
    auto& heap = s.heap;
    heap.clear();
    auto push = [&heap](int32_t rank, int32_t pos) {
      heap.push_back((static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos));
      std::push_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    };
    for (int32_t i = 0; i < last; ++i) {
      if (s.rank[i] != INT32_MAX) push(s.rank[i], i);
    }
    std::vector<uint8_t>& dead = s.dead;
    dead.assign(n, 0);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
      const uint64_t top = heap.back();
      heap.pop_back();
      const int32_t rank = static_cast<int32_t>(top >> 32);
      const int32_t i = static_cast<int32_t>(top & 0xFFFFFFFFu);
      if (dead[i] || s.rank[i] != rank) continue;  // stale entry
      dead[s.next[i]] = 1;
      int32_t left;
      merge_at(i, &left);
      if (s.rank[i] != INT32_MAX) push(s.rank[i], i);
      if (left >= 0 && s.rank[left] != INT32_MAX) push(s.rank[left], left);
    }
  }
  for (int32_t i = 0; i <= last; i = s.next[i]) ids->push_back(s.id[i]);
}

// ---------------------------------------------------------------------------
Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  auto tokenizer = FromJson(*text);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view text) {
  const json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Invalid("not valid JSON");
  auto impl = std::make_unique<Impl>();
  try {
    KVL_RETURN_IF_ERROR(impl->Load(root));
  } catch (const json::exception& e) {
    return Invalid(absl::StrCat("unexpected structure: ", e.what()));
  }
  impl->hash = Sha256Hex(text);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  EncodeTo(text, parse_special, &ids);
  return ids;
}

void Tokenizer::EncodeTo(std::string_view text, bool parse_special,
                         std::vector<int32_t>* ids) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    AppendUtf8Lossy(text, /*final=*/true, &repaired);
    text = repaired;
  }
  const Impl& m = *impl_;
  const AddedTokenMatcher& norm_matcher = m.norm_matcher[parse_special ? 1 : 0];
  if (m.byte_level) {
    m.SplitAdded(text, m.raw_matcher[parse_special ? 1 : 0], ids, [&](std::string_view piece) {
      std::string normalized;
      piece = m.Normalize(piece, &normalized);
      if (norm_matcher.empty()) {
        m.PreTokenize(piece, 0, ids);
      } else {
        m.SplitAdded(piece, norm_matcher, ids,
                     [&](std::string_view rest) { m.PreTokenize(rest, 0, ids); });
      }
    });
    return;
  }
  // SentencePiece-style: Metaspace's prepend_scheme "first" needs to know
  // which piece starts the input text.
  m.SplitAdded(text, m.raw_matcher[parse_special ? 1 : 0], ids, [&](std::string_view raw) {
    const bool raw_at_start = raw.data() == text.data();
    std::string normalized;
    const std::string_view piece = m.Normalize(raw, &normalized);
    if (norm_matcher.empty()) {
      m.PreTokenizeSp(piece, 0, raw_at_start, ids);
    } else {
      m.SplitAdded(piece, norm_matcher, ids, [&](std::string_view rest) {
        m.PreTokenizeSp(rest, 0, raw_at_start && rest.data() == piece.data(), ids);
      });
    }
  });
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  bool leading = true;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !impl_->defined[id]) continue;
    if (skip_special && impl_->is_special[id]) continue;
    if (leading) {
      bytes += LeadingTokenBytes(id);
      leading = impl_->token_bytes[id].empty();
    } else {
      bytes += impl_->token_bytes[id];
    }
  }
  std::string text;
  text.reserve(bytes.size());
  AppendUtf8Lossy(bytes, /*final=*/true, &text);
  return text;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = impl_->text_to_id.find(std::string(token));
  if (it == impl_->text_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->defined[id]) return std::nullopt;
  return impl_->token_text[id];
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->defined[id]) return {};
  return impl_->token_bytes[id];
}

std::string_view Tokenizer::LeadingTokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->defined[id]) return {};
  return impl_->leading_bytes.empty() ? impl_->token_bytes[id] : impl_->leading_bytes[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->token_text.size()); }

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->is_special[id] != 0;
}

std::optional<int32_t> Tokenizer::AddedTokenId(std::string_view content) const {
  for (const AddedToken& t : impl_->added) {
    if (impl_->token_text[t.id] == content) return t.id;
  }
  return std::nullopt;
}

std::vector<int32_t> Tokenizer::SpecialTokenIds() const {
  std::vector<int32_t> ids;
  for (const AddedToken& t : impl_->added) {
    if (t.special) ids.push_back(t.id);
  }
  return ids;
}

const std::string& Tokenizer::content_hash() const { return impl_->hash; }

// ---------------------------------------------------------------------------
StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
  std::string_view bytes = tokenizer_.TokenBytes(id);
  if (bytes.empty()) return {};
  if (leading_) {
    bytes = tokenizer_.LeadingTokenBytes(id);
    leading_ = false;
  }
  std::string text;
  if (pending_.empty()) {
    const size_t used = AppendUtf8Lossy(bytes, /*final=*/false, &text);
    pending_.assign(bytes.substr(used));
  } else {
    pending_.append(bytes);
    const size_t used = AppendUtf8Lossy(pending_, /*final=*/false, &text);
    pending_.erase(0, used);
  }
  return text;
}

std::string StreamDecoder::Flush() {
  std::string text;
  AppendUtf8Lossy(pending_, /*final=*/true, &text);
  pending_.clear();
  leading_ = true;
  return text;
}

}  // namespace kvl
