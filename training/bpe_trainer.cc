// Byte-level BPE training; see bpe_trainer.h and docs/tokenizer-training.md.
#include "training/bpe_trainer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "model/text_normalize.h"
#include "model/tokenizer.h"

namespace kvl::training {
namespace {

using OrderedJson = nlohmann::ordered_json;

bool IsAsciiAlnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

}  // namespace


std::vector<AddedTokenSpec> DefaultAddedTokens() {
  return {{"<|endoftext|>", true},
          {"<|im_start|>", true},
          {"<|im_end|>", true},
          {"<think>", false},
          {"</think>", false}};
}

absl::StatusOr<Qwen3Reference> LoadQwen3Reference(const std::string& dir) {
  absl::StatusOr<std::string> tok_text = ReadTextFile(dir + "/tokenizer.json");
  if (!tok_text.ok()) return tok_text.status();
  absl::StatusOr<std::string> cfg_text = ReadTextFile(dir + "/tokenizer_config.json");
  if (!cfg_text.ok()) return cfg_text.status();

  Qwen3Reference ref;
  // Only two small members are needed from the 11 MB file: a SAX filter keeps
  // the vocabulary and merges from being built at all.
  auto keep = [](int depth, OrderedJson::parse_event_t event, OrderedJson& parsed) {
    if (depth == 1 && event == OrderedJson::parse_event_t::key) {
      const std::string key = parsed.get<std::string>();
      return key == "pre_tokenizer" || key == "post_processor";
    }
    return true;
  };
  const OrderedJson tok = OrderedJson::parse(*tok_text, keep, /*allow_exceptions=*/false);
  const std::string tok_path = dir + "/tokenizer.json";
  if (tok.is_discarded() || !tok.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(tok_path, ": not a JSON object"));
  }
  const auto pre = tok.find("pre_tokenizer");
  if (pre == tok.end() || !pre->is_object() || pre->value("type", "") != "Sequence" ||
      !pre->contains("pretokenizers") || !(*pre)["pretokenizers"].is_array() ||
      (*pre)["pretokenizers"].size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(tok_path, ": pre_tokenizer is not a Sequence of Split and ByteLevel"));
  }
  const OrderedJson& split = (*pre)["pretokenizers"][0];
  const OrderedJson& byte_level = (*pre)["pretokenizers"][1];
  if (split.value("type", "") != "Split" || split.value("behavior", "") != "Isolated" ||
      split.value("invert", false) || !split.contains("pattern") || !split["pattern"].is_object() ||
      !split["pattern"].contains("Regex") || !split["pattern"]["Regex"].is_string() ||
      byte_level.value("type", "") != "ByteLevel" || byte_level.value("use_regex", true) ||
      byte_level.value("add_prefix_space", true)) {
    return absl::InvalidArgumentError(absl::StrCat(
        tok_path, ": pre_tokenizer is not Split(Regex, Isolated) then ByteLevel without regex"));
  }
  ref.split_regex = split["pattern"]["Regex"].get<std::string>();
  ref.pre_tokenizer_json = pre->dump();
  const auto post = tok.find("post_processor");
  ref.post_processor_json = post == tok.end() ? "null" : post->dump();

  const OrderedJson cfg = OrderedJson::parse(*cfg_text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object() || !cfg.contains("chat_template") ||
      !cfg["chat_template"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/tokenizer_config.json: no chat_template string"));
  }
  ref.config_json = cfg.dump();
  return ref;
}

// ---------------------------------------------------------------------------
// PreTokenizer

namespace {

// Leftmost-longest added-token search (the runtime's rule) over one text. Each
// token's next occurrence is cached, so that scanning a text is linear in its
// length however many tokens it holds; `from` must not decrease.
class AddedScanner {
 public:
  AddedScanner(const std::vector<std::string>& tokens, std::string_view text)
      : tokens_(tokens), text_(text), next_(tokens.size(), 0), fresh_(tokens.size(), false) {}

  bool Next(size_t from, size_t* begin, size_t* length) {
    bool found = false;
    for (size_t k = 0; k < tokens_.size(); ++k) {
      if (!fresh_[k] || (next_[k] != std::string_view::npos && next_[k] < from)) {
        next_[k] = text_.find(tokens_[k], from);
        fresh_[k] = true;
      }
      const size_t p = next_[k];
      if (p == std::string_view::npos) continue;
      if (!found || p < *begin || (p == *begin && tokens_[k].size() > *length)) {
        *begin = p;
        *length = tokens_[k].size();
        found = true;
      }
    }
    return found;
  }

 private:
  const std::vector<std::string>& tokens_;
  std::string_view text_;
  std::vector<size_t> next_;
  std::vector<bool> fresh_;
};

}  // namespace

struct PreTokenizer::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  std::vector<std::string> added;

  ~Impl() {
    pcre2_match_data_free(match);
    if (context != nullptr) pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    pcre2_code_free(code);
  }

  // Next match at or after `start`; false when there is none.
  bool NextMatch(std::string_view subject, size_t start, size_t* begin, size_t* end) {
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    int rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, match, context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
        rc == PCRE2_ERROR_MATCHLIMIT) {
      // Very long pieces (whitespace runs) need more than the default stack.
      if (jit_stack == nullptr) {
        jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
        context = pcre2_match_context_create(nullptr);
        pcre2_jit_stack_assign(context, nullptr, jit_stack);
        pcre2_set_heap_limit(context, UINT32_MAX);
        pcre2_set_match_limit(context, UINT32_MAX);
      }
      rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, match, context);
    }
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    *begin = ov[0];
    *end = ov[1];
    return true;
  }
};

PreTokenizer::PreTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    std::string_view split_regex, std::vector<std::string> added_tokens) {
  auto impl = std::make_unique<Impl>();
  const std::string pattern = RewriteWhiteSpaceEscapes(split_regex);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (impl->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("split regex does not compile at offset ",
                                                   offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE);  // optional speed-up
  impl->match = pcre2_match_data_create(1, nullptr);
  for (std::string& t : added_tokens) {
    if (!t.empty()) impl->added.push_back(std::move(t));
  }
  return std::unique_ptr<PreTokenizer>(new PreTokenizer(std::move(impl)));
}

void PreTokenizer::Split(
    std::string_view text,
    const std::function<void(std::string_view piece, bool is_added)>& on_piece) const {
  std::string repaired;
  if (!IsAscii(text)) {
    repaired.reserve(text.size());
    AppendUtf8Lossy(text, /*final=*/true, &repaired);
    text = repaired;
  }
  auto split_segment = [&](std::string_view segment) {
    if (segment.empty()) return;
    std::string normalized;
    if (!IsAscii(segment)) {
      normalized = Nfc(segment);
      segment = normalized;
    }
    size_t prev = 0, search = 0, begin = 0, end = 0;
    while (search <= segment.size() && impl_->NextMatch(segment, search, &begin, &end)) {
      if (end == begin) {  // an empty match makes no piece; step one character
        if (begin >= segment.size()) break;
        size_t next = begin + 1;
        while (next < segment.size() && (static_cast<uint8_t>(segment[next]) & 0xC0) == 0x80)
          ++next;
        search = next;
        continue;
      }
      if (begin > prev) on_piece(segment.substr(prev, begin - prev), false);
      on_piece(segment.substr(begin, end - begin), false);
      prev = search = end;
    }
    if (prev < segment.size()) on_piece(segment.substr(prev), false);
  };
  AddedScanner scanner(impl_->added, text);
  size_t pos = 0, begin = 0, length = 0;
  while (scanner.Next(pos, &begin, &length)) {
    split_segment(text.substr(pos, begin - pos));
    on_piece(text.substr(begin, length), true);
    pos = begin + length;
  }
  split_segment(text.substr(pos));
}

size_t PreTokenizer::SafeCut(std::string_view text) const {
  size_t last_added_begin = 0, last_added_end = 0, pos = 0, begin = 0, length = 0;
  bool any_added = false;
  AddedScanner scanner(impl_->added, text);
  while (scanner.Next(pos, &begin, &length)) {
    any_added = true;
    last_added_begin = begin;
    pos = last_added_end = begin + length;
  }
  // "\n" then an ASCII letter or digit: no alternative of Qwen3's pattern
  // matches across it (letter runs cannot start with \n, newline runs stop
  // before letters, digits match alone), and neither character composes
  // under NFC with its other side.
  const size_t lowest = std::max<size_t>(last_added_end + 1, 1);
  for (size_t cut = text.size(); cut-- > lowest;) {
    if (text[cut - 1] == '\n' && IsAsciiAlnum(text[cut])) return cut;
  }
  return any_added ? last_added_begin : 0;
}

// ---------------------------------------------------------------------------
// Chunked reading

absl::Status ForEachSafeChunk(const std::string& path, const PreTokenizer& pre_tokenizer,
                              int64_t max_bytes,
                              const std::function<void(std::string_view chunk)>& on_chunk,
                              size_t block_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const size_t kBlock = std::max<size_t>(block_bytes, 1);
  // A file without any safe cut is still processed, cut at a character
  // boundary every kMaxBuffer bytes (the only inexact case; documented).
  constexpr size_t kMaxBuffer = size_t{64} << 20;
  std::string buffer;
  int64_t total = 0;
  std::vector<char> block(kBlock);
  while (in && (max_bytes <= 0 || total < max_bytes)) {
    size_t want = kBlock;
    if (max_bytes > 0) want = static_cast<size_t>(std::min<int64_t>(want, max_bytes - total));
    in.read(block.data(), static_cast<std::streamsize>(want));
    const size_t got = static_cast<size_t>(in.gcount());
    if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
    if (got == 0) break;
    total += static_cast<int64_t>(got);
    buffer.append(block.data(), got);
    size_t cut = pre_tokenizer.SafeCut(buffer);
    if (cut == 0 && buffer.size() >= kMaxBuffer) {
      cut = buffer.size();
      while (cut > 0 && (static_cast<uint8_t>(buffer[cut - 1]) & 0x80) != 0) --cut;
      if (cut == 0) cut = buffer.size();
    }
    if (cut > 0) {
      on_chunk(std::string_view(buffer).substr(0, cut));
      buffer.erase(0, cut);
    }
  }
  if (max_bytes > 0 && total >= max_bytes) {
    // Do not end on a character that the byte limit cut in half.
    const size_t n = buffer.size();
    size_t start = n;
    while (start > 0 && n - start < 4 && (static_cast<uint8_t>(buffer[start - 1]) & 0xC0) == 0x80) {
      --start;
    }
    if (start > 0) {
      const size_t lead = start - 1;
      const uint8_t c = static_cast<uint8_t>(buffer[lead]);
      const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (need > 1 && n - lead < need) buffer.resize(lead);
    }
  }
  if (!buffer.empty()) on_chunk(buffer);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Trainer

namespace {

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t PairLeft(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t PairRight(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
  int32_t stamp = -1;  // last merge that rewrote this word
};

struct HeapEntry {
  int64_t count;
  uint64_t pair;
};

}  // namespace

struct BpeTrainer::Impl {
  BpeTrainerOptions options;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unordered_map<std::string, int64_t> word_counts;
  int64_t n_pretokens = 0;
  int64_t n_bytes = 0;

  void Count(std::string_view text) {
    n_bytes += static_cast<int64_t>(text.size());
    pre_tokenizer->Split(text, [&](std::string_view piece, bool is_added) {
      if (is_added) return;
      ++n_pretokens;
      ++word_counts[std::string(piece)];
    });
  }
};

BpeTrainer::BpeTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTrainer::~BpeTrainer() = default;

absl::StatusOr<std::unique_ptr<BpeTrainer>> BpeTrainer::Create(const BpeTrainerOptions& options,
                                                               std::string_view split_regex) {
  const int64_t floor = 256 + static_cast<int64_t>(options.added_tokens.size());
  if (options.vocab_size < floor) {
    return absl::InvalidArgumentError(absl::StrCat("vocab size ", options.vocab_size,
                                                   " is below 256 byte symbols + ",
                                                   options.added_tokens.size(), " added tokens"));
  }
  if (options.min_frequency < 1) {
    return absl::InvalidArgumentError("min frequency must be at least 1");
  }
  std::vector<std::string> added;
  for (const AddedTokenSpec& t : options.added_tokens) {
    if (t.content.empty()) return absl::InvalidArgumentError("empty added token");
    added.push_back(t.content);
  }
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre = PreTokenizer::Create(split_regex, added);
  if (!pre.ok()) return pre.status();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->pre_tokenizer = std::move(*pre);
  return std::unique_ptr<BpeTrainer>(new BpeTrainer(std::move(impl)));
}

void BpeTrainer::AddText(std::string_view text) { impl_->Count(text); }

absl::Status BpeTrainer::AddFile(const std::string& path, int64_t max_bytes) {
  int64_t budget = 0;
  if (max_bytes > 0) {
    budget = max_bytes - impl_->n_bytes;
    if (budget <= 0) return absl::OkStatus();
  }
  return ForEachSafeChunk(path, *impl_->pre_tokenizer, budget,
                          [&](std::string_view chunk) { impl_->Count(chunk); });
}

int64_t BpeTrainer::bytes_read() const { return impl_->n_bytes; }

const PreTokenizer& BpeTrainer::pre_tokenizer() const { return *impl_->pre_tokenizer; }

TrainedBpe BpeTrainer::Train(const std::function<void(const BpeProgress&)>& on_progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const BpeTrainerOptions& opt = impl_->options;
  TrainedBpe out;
  out.added_tokens = opt.added_tokens;
  out.n_bytes = impl_->n_bytes;
  out.n_pretokens = impl_->n_pretokens;
  out.n_words = static_cast<int64_t>(impl_->word_counts.size());

  // Base vocabulary: the 256 bytes, ordered by their byte-level characters.
  std::vector<int> byte_order(256);
  for (int b = 0; b < 256; ++b) byte_order[b] = b;
  std::sort(byte_order.begin(), byte_order.end(),
            [](int x, int y) { return ByteLevelCodePoint(static_cast<uint8_t>(x)) < ByteLevelCodePoint(static_cast<uint8_t>(y)); });
  std::vector<std::string>& tokens = out.tokens;
  std::unordered_map<std::string, int32_t> token_ids;
  int32_t byte_id[256];
  for (int i = 0; i < 256; ++i) {
    tokens.push_back(std::string(1, static_cast<char>(byte_order[i])));
    token_ids.emplace(tokens.back(), i);
    byte_id[byte_order[i]] = i;
  }
  const size_t target = static_cast<size_t>(opt.vocab_size) - opt.added_tokens.size();
  const int merges_total = static_cast<int>(target - 256);

  // Words of two or more bytes (a single byte has no pair to merge), sorted so
  // that the internal order does not depend on hashing.
  std::vector<std::pair<std::string, int64_t>> sorted_words;
  sorted_words.reserve(impl_->word_counts.size());
  for (auto& [w, c] : impl_->word_counts) {
    if (w.size() >= 2) sorted_words.emplace_back(w, c);
  }
  std::sort(sorted_words.begin(), sorted_words.end());
  std::vector<Word> words(sorted_words.size());
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;
  for (size_t iw = 0; iw < sorted_words.size(); ++iw) {
    Word& w = words[iw];
    w.count = sorted_words[iw].second;
    for (char c : sorted_words[iw].first) w.symbols.push_back(byte_id[static_cast<uint8_t>(c)]);
    for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
      const uint64_t p = PairKey(w.symbols[i], w.symbols[i + 1]);
      pair_count[p] += w.count;
      std::vector<int32_t>& where = pair_words[p];
      if (where.empty() || where.back() != static_cast<int32_t>(iw))
        where.push_back(static_cast<int32_t>(iw));
    }
  }
  sorted_words.clear();
  sorted_words.shrink_to_fit();

  // Max-heap on count; equal counts: the smaller (left, right) raw bytes first.
  auto lower = [&tokens](const HeapEntry& x, const HeapEntry& y) {
    if (x.count != y.count) return x.count < y.count;
    const int c = tokens[PairLeft(x.pair)].compare(tokens[PairLeft(y.pair)]);
    if (c != 0) return c > 0;
    return tokens[PairRight(x.pair)] > tokens[PairRight(y.pair)];
  };
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, decltype(lower)> heap(lower);
  for (const auto& [p, c] : pair_count) heap.push({c, p});

  const int report_every = std::max(1, merges_total / 100);
  std::unordered_map<uint64_t, int64_t> delta;
  int32_t n_merges = 0;
  while (tokens.size() < target && !heap.empty()) {
    const HeapEntry top = heap.top();
    heap.pop();
    const auto it = pair_count.find(top.pair);
    if (it == pair_count.end() || it->second != top.count) continue;  // stale
    if (top.count < opt.min_frequency) break;

    const int32_t a = PairLeft(top.pair);
    const int32_t b = PairRight(top.pair);
    std::string merged = tokens[a] + tokens[b];
    int32_t id;
    if (auto found = token_ids.find(merged); found != token_ids.end()) {
      id = found->second;  // same bytes reached by another split: one token, two merges
    } else {
      id = static_cast<int32_t>(tokens.size());
      token_ids.emplace(merged, id);
      tokens.push_back(std::move(merged));
    }
    out.merges.emplace_back(tokens[a], tokens[b]);

    delta.clear();
    std::vector<int32_t> where = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    std::vector<int32_t> rewritten;
    for (int32_t iw : where) {
      Word& w = words[iw];
      if (w.stamp == n_merges) continue;
      std::vector<int32_t>& s = w.symbols;
      bool hit = false;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        if (s[i] == a && s[i + 1] == b) {
          hit = true;
          break;
        }
      }
      if (!hit) continue;  // a stale entry: the pair left this word earlier
      w.stamp = n_merges;
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[PairKey(s[i], s[i + 1])] -= w.count;
      size_t o = 0;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          s[o++] = id;
          i += 2;
        } else {
          s[o++] = s[i++];
        }
      }
      s.resize(o);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        delta[PairKey(s[i], s[i + 1])] += w.count;
        if (s[i] == id || s[i + 1] == id) {
          std::vector<int32_t>& pw = pair_words[PairKey(s[i], s[i + 1])];
          if (pw.empty() || pw.back() != iw) pw.push_back(iw);
        }
      }
    }
    for (const auto& [p, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count[p];
      c += d;
      if (c <= 0) {
        pair_count.erase(p);
      } else {
        heap.push({c, p});
      }
    }
    ++n_merges;
    const int done = static_cast<int>(tokens.size()) - 256;
    if (on_progress && (n_merges % report_every == 0)) {
      on_progress({done, merges_total,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
    }
  }
  if (on_progress) {
    on_progress({static_cast<int>(tokens.size()) - 256, merges_total,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
  }
  return out;
}

// ---------------------------------------------------------------------------
// Output

std::string TokenizerJson(const TrainedBpe& bpe, const Qwen3Reference& reference) {
  OrderedJson added = OrderedJson::array();
  const int32_t n_base = static_cast<int32_t>(bpe.tokens.size());
  for (size_t i = 0; i < bpe.added_tokens.size(); ++i) {
    OrderedJson t;
    t["id"] = n_base + static_cast<int32_t>(i);
    t["content"] = bpe.added_tokens[i].content;
    t["single_word"] = false;
    t["lstrip"] = false;
    t["rstrip"] = false;
    t["normalized"] = false;
    t["special"] = bpe.added_tokens[i].special;
    added.push_back(std::move(t));
  }
  OrderedJson vocab = OrderedJson::object();
  // ordered_map's own insert searches linearly; keys are unique by
  // construction, so append through its vector base instead.
  auto& entries = vocab.get_ref<OrderedJson::object_t&>();
  entries.reserve(bpe.tokens.size());
  for (int32_t id = 0; id < n_base; ++id) {
    entries.emplace_back(ByteLevelString(bpe.tokens[id]), OrderedJson(id));
  }
  OrderedJson merges = OrderedJson::array();
  for (const auto& [l, r] : bpe.merges) {
    merges.push_back(OrderedJson::array({ByteLevelString(l), ByteLevelString(r)}));
  }
  OrderedJson model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = "";
  model["end_of_word_suffix"] = "";
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  model["vocab"] = std::move(vocab);
  model["merges"] = std::move(merges);

  OrderedJson byte_level;
  byte_level["type"] = "ByteLevel";
  byte_level["add_prefix_space"] = false;
  byte_level["trim_offsets"] = false;
  byte_level["use_regex"] = false;

  OrderedJson doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = std::move(added);
  doc["normalizer"] = OrderedJson{{"type", "NFC"}};
  doc["pre_tokenizer"] = OrderedJson::parse(reference.pre_tokenizer_json);
  doc["post_processor"] = OrderedJson::parse(reference.post_processor_json);
  doc["decoder"] = byte_level;
  doc["model"] = std::move(model);
  return doc.dump(2) + "\n";
}

std::string TokenizerConfigJson(const TrainedBpe& bpe, const Qwen3Reference& reference) {
  OrderedJson cfg = OrderedJson::parse(reference.config_json);
  const int32_t n_base = static_cast<int32_t>(bpe.tokens.size());
  OrderedJson decoder = OrderedJson::object();
  OrderedJson additional = OrderedJson::array();
  bool has_endoftext = false, has_im_end = false;
  for (size_t i = 0; i < bpe.added_tokens.size(); ++i) {
    const AddedTokenSpec& t = bpe.added_tokens[i];
    OrderedJson e;
    e["content"] = t.content;
    e["lstrip"] = false;
    e["normalized"] = false;
    e["rstrip"] = false;
    e["single_word"] = false;
    e["special"] = t.special;
    decoder[std::to_string(n_base + static_cast<int32_t>(i))] = std::move(e);
    // As in Qwen3: every special token but the pad/end-of-text one.
    if (t.special && t.content != "<|endoftext|>") additional.push_back(t.content);
    has_endoftext = has_endoftext || t.content == "<|endoftext|>";
    has_im_end = has_im_end || t.content == "<|im_end|>";
  }
  cfg["added_tokens_decoder"] = std::move(decoder);
  cfg["additional_special_tokens"] = std::move(additional);
  cfg["bos_token"] = nullptr;
  cfg["eos_token"] = has_im_end ? OrderedJson("<|im_end|>") : OrderedJson(nullptr);
  cfg["pad_token"] = has_endoftext ? OrderedJson("<|endoftext|>") : OrderedJson(nullptr);
  return cfg.dump(2) + "\n";
}

absl::StatusOr<Compression> MeasureCompression(const Tokenizer& tokenizer,
                                               const PreTokenizer& pre_tokenizer,
                                               const std::vector<std::string>& files,
                                               int64_t max_bytes) {
  Compression c;
  std::vector<int32_t> ids;
  for (const std::string& f : files) {
    int64_t budget = 0;
    if (max_bytes > 0) {
      budget = max_bytes - c.n_bytes;
      if (budget <= 0) break;
    }
    absl::Status s = ForEachSafeChunk(f, pre_tokenizer, budget, [&](std::string_view chunk) {
      ids.clear();
      tokenizer.EncodeTo(chunk, /*parse_special=*/true, &ids);
      c.n_bytes += static_cast<int64_t>(chunk.size());
      c.n_tokens += static_cast<int64_t>(ids.size());
    });
    if (!s.ok()) return s;
  }
  return c;
}

}  // namespace kvl::training
