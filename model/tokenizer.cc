// Byte-level BPE tokenizer; see model/tokenizer.h and docs/tokenizer.md.
//
// Encode pipeline (the order of the Rust `tokenizers` library):
//   text -> repair invalid UTF-8 -> split out added tokens (raw text)
//        -> per remaining piece: normalizer (NFC) -> split out normalized
//           added tokens -> pre-tokenizer stages (regex splits, byte-level)
//        -> BPE per pre-token -> ids
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
#include "absl/strings/str_cat.h"
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

// Leftmost-longest matching over a small set of added tokens (the semantics of
// the aho-corasick automaton `tokenizers` builds). Sets are tens of tokens, so
// a first-byte index and memcmp suffice.
class AddedTokenMatcher {
 public:
  void Add(const AddedToken* token) {
    if (token->content.empty()) return;
    by_first_byte_[static_cast<uint8_t>(token->content[0])].push_back(token);
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Next match at or after `from`: returns the token and sets *pos, or nullptr.
  const AddedToken* Find(std::string_view text, size_t from, size_t* pos) const {
    for (size_t i = from; i < text.size(); ++i) {
      const auto& candidates = by_first_byte_[static_cast<uint8_t>(text[i])];
      if (candidates.empty()) continue;
      const AddedToken* best = nullptr;
      for (const AddedToken* t : candidates) {
        if (t->content.size() <= text.size() - i &&
            std::memcmp(text.data() + i, t->content.data(), t->content.size()) == 0 &&
            (best == nullptr || t->content.size() > best->content.size())) {
          best = t;
        }
      }
      if (best != nullptr) {
        *pos = i;
        return best;
      }
    }
    return nullptr;
  }

 private:
  std::vector<const AddedToken*> by_first_byte_[256];
  bool empty_ = true;
};

struct PreTokenizerStage {
  Pcre2CodePtr regex;             // null: no split at this stage
  bool add_prefix_space = false;  // ByteLevel's option, applied per piece
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
  bool nfc = false;
  std::vector<PreTokenizerStage> stages;
  std::vector<AddedToken> added;
  // [parse_special]: raw-text and normalized-text matchers.
  AddedTokenMatcher raw_matcher[2];
  AddedTokenMatcher norm_matcher[2];

  absl::Status Load(const json& root);
  absl::Status LoadModel(const json& model);
  absl::Status LoadPreTokenizer(const json& node, bool* saw_byte_level);
  absl::Status LoadNormalizer(const json& node);

  void SplitAdded(std::string_view text, const AddedTokenMatcher& matcher,
                  std::vector<int32_t>* ids,
                  const std::function<void(std::string_view)>& on_text) const;
  void PreTokenize(std::string_view piece, size_t stage, std::vector<int32_t>* ids) const;
  void Bpe(std::string_view word, std::vector<int32_t>* ids) const;
  int32_t PairRank(int32_t a, int32_t b) const {
    const MergeTable::Entry* e = merges.Find(MergeTable::Key(a, b));
    return e == nullptr ? INT32_MAX : e->rank;
  }
};

absl::Status Tokenizer::Impl::LoadNormalizer(const json& node) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(node);
  if (type == "NFC") {
    nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (const json& n : node["normalizers"]) {
      KVL_RETURN_IF_ERROR(LoadNormalizer(n));
    }
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat("normalizer type '", type, "' is not supported (only NFC)"));
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
    if (behavior != "Isolated") {
      return Invalid(absl::StrCat("pre_tokenizer Split behavior '", behavior,
                                  "' is not supported (only Isolated)"));
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
    stages.push_back(PreTokenizerStage{std::move(*code), false});
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
  return Invalid(absl::StrCat("pre_tokenizer type '", type,
                              "' is not supported (Sequence, Split, ByteLevel)"));
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
  if (GetBool(model, "byte_fallback", false)) {
    return Invalid("model BPE byte_fallback is not supported (byte-level BPE only)");
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
  for (const auto& [text, id_json] : model["vocab"].items()) {
    const int32_t id = id_json.get<int32_t>();
    token_text[id] = text;
    defined[id] = 1;
    text_to_id.emplace(text, id);
    // Byte-level form -> raw bytes; a symbol outside the alphabet makes the
    // token unreachable by BPE and decodes as its own UTF-8 (as in `tokenizers`).
    std::string bytes;
    bool byte_level = true;
    for (size_t i = 0; i < text.size();) {
      const uint32_t cp = NextCodePoint(text, &i);
      const int b = cp < 512 ? alphabet.cp_to_byte[cp] : -1;
      if (b < 0) {
        byte_level = false;
        break;
      }
      bytes.push_back(static_cast<char>(b));
    }
    if (byte_level) {
      token_bytes[id] = bytes;
      bytes_to_id.emplace(std::move(bytes), id);
    } else {
      token_bytes[id] = text;
    }
  }
  for (int b = 0; b < 256; ++b) {
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

absl::Status Tokenizer::Impl::Load(const json& root) {
  if (!root.is_object()) return Invalid("top level is not an object");
  KVL_RETURN_IF_ERROR(LoadModel(root.contains("model") ? root["model"] : json()));
  KVL_RETURN_IF_ERROR(LoadNormalizer(root.value("normalizer", json())));
  const json pre = root.value("pre_tokenizer", json());
  bool saw_byte_level = false;
  if (!pre.is_null()) {
    KVL_RETURN_IF_ERROR(LoadPreTokenizer(pre, &saw_byte_level));
  }
  if (!saw_byte_level) {
    return Invalid("pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
  }
  const json decoder = root.value("decoder", json());
  if (TypeOf(decoder) != "ByteLevel") {
    return Invalid(absl::StrCat("decoder type '", decoder.is_null() ? "null" : TypeOf(decoder),
                                "' is not supported (only ByteLevel)"));
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
    // The ByteLevel decoder maps each symbol back to a byte, falling back to
    // the token's own UTF-8 when a character is outside the alphabet.
    std::string bytes;
    bool byte_level = true;
    for (size_t i = 0; i < token.content.size();) {
      const uint32_t cp = NextCodePoint(token.content, &i);
      const int b = cp < 512 ? Alphabet().cp_to_byte[cp] : -1;
      if (b < 0) {
        byte_level = false;
        break;
      }
      bytes.push_back(static_cast<char>(b));
    }
    token_bytes[token.id] = byte_level ? bytes : token.content;
    if (token.normalized && nfc) token.content = Nfc(token.content);
    added.push_back(std::move(token));
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
  s.prev.resize(n);
  s.next.resize(n);
  s.rank.resize(n);
  const int32_t last = static_cast<int32_t>(n) - 1;
  for (int32_t i = 0; i <= last; ++i) {
    s.id[i] = byte_id[w[i]];
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
  m.SplitAdded(text, m.raw_matcher[parse_special ? 1 : 0], ids, [&](std::string_view piece) {
    std::string normalized;
    if (m.nfc && !IsAscii(piece)) {
      normalized = Nfc(piece);
      piece = normalized;
    }
    if (norm_matcher.empty()) {
      m.PreTokenize(piece, 0, ids);
    } else {
      m.SplitAdded(piece, norm_matcher, ids,
                   [&](std::string_view rest) { m.PreTokenize(rest, 0, ids); });
    }
  });
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !impl_->defined[id]) continue;
    if (skip_special && impl_->is_special[id]) continue;
    bytes += impl_->token_bytes[id];
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
  const std::string_view bytes = tokenizer_.TokenBytes(id);
  if (bytes.empty()) return {};
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
  return text;
}

}  // namespace kvl
