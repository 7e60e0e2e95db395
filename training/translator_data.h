// Shared plumbing of the translator commands (kvl logits --translator, kvl
// distill, kvl eval-translator, kvl fit): loading a model together with what a
// translator file is checked against, reading a corpus as one token stream,
// cutting it into fixed windows, and the switch itself (source prefill ->
// taps -> translation -> target cache).
//
// Legend: L=n_layer, H=n_head_kv, T=tokens, D=head_dim.
//
// Thread safety: free functions; a TranslatorModel is driven by one thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/kv_cache.h"
#include "model/model_dir.h"
#include "model/tokenizer.h"
#include "datagen/chat_data.h"
#include "translator/translator.h"

namespace kvl::training {

// One model directory, loaded for translator work: a float32 engine and a
// float32 copy of the weights for the training forward.
struct TranslatorModel : ModelDir {
  ModelWeights weights32;  // float32 CPU copy for ReferenceForward

  TranslatorEndpoint Endpoint() const;
};

// Loads dir (config, weights, tokenizer.json) and creates a float32 engine
// with `options` (its dtype is forced to float32: translators and their
// evaluation work in float32). Errors as LoadCheckpoint / Tokenizer::FromFile.
absl::StatusOr<TranslatorModel> LoadTranslatorModel(const std::string& dir,
                                                    RuntimeOptions options = {});

// A source and a target model for translator work (LoadTranslatorModel each),
// checked to share one tokenizer (CheckSameTokenizer's FailedPrecondition)
// unless `tokenizers` allows them to differ (the work that handles switches
// across tokenizers: TranslatedCacheAcross).
struct TranslatorPair {
  TranslatorModel source, target;
  bool SameTokenizer() const;
};
enum class Tokenizers { kSame, kMayDiffer };
absl::StatusOr<TranslatorPair> LoadTranslatorPair(const std::string& source_dir,
                                                  const std::string& target_dir,
                                                  const RuntimeOptions& options = {},
                                                  Tokenizers tokenizers = Tokenizers::kSame);

// What a translator from `source` to `target` must have been built for.
TranslatorExpectation ExpectationFor(const TranslatorModel& source, const TranslatorModel& target);

// FailedPrecondition unless both models use the same tokenizer (cross-
// tokenizer translation is not supported).
absl::Status CheckSameTokenizer(const TranslatorModel& source, const TranslatorModel& target);

// One line of a chat .jsonl file ({"messages": [{"role", "content"}, ...]});
// InvalidArgument naming path:line_no when it is malformed.
absl::StatusOr<std::vector<ChatMessage>> ParseChatLine(const std::string& line,
                                                       const std::string& path, int64_t line_no);

// A corpus as one token stream. .jsonl: one chat per line ({"messages":
// [{"role","content"}...]}), each rendered as ChatML followed by one "\n" —
// byte for byte what `kvl make-data` writes to the .txt split; anything else:
// the file's text. Special tokens are parsed. NotFound for a missing file,
// InvalidArgument for a malformed line.
absl::StatusOr<std::vector<int32_t>> ReadTokenStream(const std::string& path,
                                                     const Tokenizer& tokenizer);

// Sequences for a closed-form fit. .jsonl: each chat rendered as ChatML
// (without the trailing "\n" of ReadTokenStream) cut to its first seq_len
// tokens, chats under 2 tokens skipped; anything else: consecutive windows of
// seq_len tokens of the file's text. At most max_sequences (0: all). NotFound
// for a missing file, InvalidArgument for a malformed line or when no
// sequence results.
absl::StatusOr<std::vector<std::vector<int64_t>>> ReadSequences(const std::string& path,
                                                                const Tokenizer& tokenizer,
                                                                int64_t seq_len,
                                                                int64_t max_sequences);

// Consecutive, non-overlapping windows of `length` tokens from the start of
// the stream, at most max_windows (0: all that fit).
std::vector<std::vector<int64_t>> ConsecutiveWindows(const std::vector<int32_t>& stream,
                                                     int64_t length, int64_t max_windows);

// The switch: source prefills prefix into a fresh cache line, the taps of all
// its tokens are translated (token anchors read the prefix's ids) and
// accepted into a fresh cache line of target.
// Errors as Engine::Prefill / KvCache::Accept / Translator::Translate.
absl::StatusOr<std::unique_ptr<KvCache>> TranslatedCache(Engine& source, Engine& target,
                                                         const Translator& translator,
                                                         const std::vector<int64_t>& prefix);

// The switch across tokenizers (issue 54; the paper's appendix K): the
// target's cache of its tokens target_ids[0, n_translated) translated from
// the source. The text those ids spell is encoded by the source's tokenizer
// and prefilled by the source; the two tokenizations are aligned into
// minimal matching groups (model/token_alignment.h), the source's taps
// resampled onto the target's tokens (AssignWithinGroups, ResampleTaps) and
// translated (token anchors read the target's ids). n_translated is the last
// group boundary at or before `limit` (no group is split: the target's tokens
// past it are the caller's to prefill), 0 when the first group ends after it
// (then the cache is empty). With one tokenizer on both sides this is
// TranslatedCache of the text's tokens. Errors: TokenByteLengths' and
// AlignByBytes' InvalidArgument (a text a tokenizer cannot spell), and
// TranslatedCache's.
// `uneven`: kPrefill fills the entries of every group that is not one token
// to one token by the target's own prefill of its tokens, in place (the
// alternative to the paper's rule that issue 54 measures; one forward pass
// per such group, so for evaluation only).
enum class UnevenGroups { kTranslate, kPrefill };
struct CrossTranslated {
  std::unique_ptr<KvCache> cache;
  int64_t n_translated = 0;  // target tokens in the cache
  int64_t n_source = 0;      // source tokens prefilled for them
  int64_t n_groups = 0, n_one_to_one = 0;  // the translated groups
};
absl::StatusOr<CrossTranslated> TranslatedCacheAcross(const TranslatorModel& source,
                                                      const TranslatorModel& target,
                                                      const Translator& translator,
                                                      const std::vector<int64_t>& target_ids,
                                                      int64_t limit,
                                                      UnevenGroups uneven = UnevenGroups::kTranslate);

// Per-position negative log-likelihood: logits [T, V] float32, labels T ids;
// returns T values (double).
std::vector<double> TokenNll(const at::Tensor& logits, const std::vector<int64_t>& labels);

}  // namespace kvl::training
