// BPE tokenizer loaded from a Hugging Face `tokenizer.json`: byte-level
// (Qwen2/Qwen3, GPT-2 and Llama-3 files) or SentencePiece-style with byte
// fallback (Gemma-3, Llama-2 and Mistral files). Encode reproduces the Rust
// `tokenizers` library (the reference behind transformers' fast tokenizers)
// with add_special_tokens=False; docs/tokenizer.md lists the supported
// components and the few documented edge cases.
//
// Thread safety: a loaded Tokenizer is immutable; Encode, Decode and the
// lookups may be called from any number of threads at once. A StreamDecoder
// holds per-stream state and belongs to one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvl {

class Tokenizer {
 public:
  // NotFound when the file does not exist, InvalidArgument naming the
  // offending component when the JSON is malformed or uses a component this
  // tokenizer does not implement (e.g. a WordPiece model).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text (UTF-8) to token ids. Added tokens are matched before normalization
  // and pre-tokenization; with parse_special=false the *special* added tokens
  // are encoded as plain text (non-special added tokens such as <think> still
  // match, as in `tokenizers` with encode_special_tokens=True). No BOS/EOS is
  // ever added. Invalid UTF-8 in `text` is replaced by U+FFFD first (maximal
  // subparts, as Rust's String::from_utf8_lossy does).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;
  // Appends to *ids instead of returning a new vector.
  void EncodeTo(std::string_view text, bool parse_special, std::vector<int32_t>* ids) const;

  // Ids to text. Unknown ids are skipped (as `tokenizers` does); with
  // skip_special the special added tokens are dropped. Byte sequences that are
  // not valid UTF-8 become U+FFFD (Python's errors="replace").
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special = false) const;

  // Token strings in tokenizer.json's form (byte-level symbols, e.g. "Ġthe"),
  // added tokens included.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // The raw bytes a token stands for when decoded anywhere but first (may be a
  // partial UTF-8 sequence): byte-level symbols mapped back to bytes, or for
  // SentencePiece-style files U+2581 "▁" (the metaspace) as ' ' and <0xNN> as
  // the byte NN. Empty for ids that are not in the vocabulary.
  std::string_view TokenBytes(int32_t id) const;
  // The bytes when the token is the first one a decode emits (the first id
  // with non-empty TokenBytes after skipping). Equal to TokenBytes except for
  // decoders that drop a leading space: Strip after Fuse (Llama-2, Mistral:
  // "▁Hello" -> "Hello") and Metaspace (every metaspace of the first token
  // dropped). Decode(ids) is the concatenation of LeadingTokenBytes(first) and
  // TokenBytes(rest), made valid UTF-8.
  std::string_view LeadingTokenBytes(int32_t id) const;

  // One more than the largest id (base vocabulary plus added tokens); this is
  // not the model's (often padded) embedding size.
  int32_t vocab_size() const;
  // Whether `id` is an added token marked "special" (e.g. <|im_end|>).
  bool IsSpecial(int32_t id) const;
  // Id of an added token by content, e.g. "<|im_start|>".
  std::optional<int32_t> AddedTokenId(std::string_view content) const;
  std::vector<int32_t> SpecialTokenIds() const;

  // Lower-case hex SHA-256 of the tokenizer.json bytes; ties translators and
  // caches to the exact tokenizer they were built with.
  const std::string& content_hash() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming generation: feed ids one at a time and
// get back only complete UTF-8 text. A trailing partial multi-byte sequence is
// held back until it completes; invalid bytes become U+FFFD exactly where the
// full Decode would put them, so the concatenation of all Push results and the
// final Flush equals Decode(all ids).
class StreamDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  // Text that became complete with this id (often empty mid-character).
  std::string Push(int32_t id);
  // Everything still held back (an unfinished sequence becomes U+FFFD); the
  // decoder is empty and reusable afterwards.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool leading_ = true;  // no token with bytes pushed since construction / Flush
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

// Appends `in` to *out as UTF-8, replacing each maximal invalid subpart by
// U+FFFD. When `final` is false, a trailing sequence that is incomplete but
// could still become valid is left unconsumed. Returns the bytes consumed.
size_t AppendUtf8Lossy(std::string_view in, bool final, std::string* out);

}  // namespace kvl
