// The generation engine of one model: a prepared decoder plus chunked prefill,
// single-token decode and sampled generation with stop conditions, returning
// absl::Status at the edge (LibTorch exceptions are caught here).
//
// Legend: T=tokens, V=vocab_size.
//
// Thread-safety: an Engine and the cache lines it creates are driven by ONE
// thread at a time; the engine itself takes no lock. In kvl-server (and every
// Router) that thread is the model's engine loop (model/scheduler.h), the
// only caller of Generate, Prefill and ForwardBatch; tools and tests without a
// router drive an engine from their own thread. Create and the const
// accessors may be called from any thread.
// Create calls at::set_num_threads, which sets the calling thread's intra-op
// thread count and the default that other threads take when they are set up
// (at their first parallel operation, or PrepareIntraOpThread): create every
// engine before starting the threads that run model work (kvl-server loads
// its models before it builds its TurnPool).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/sampling.h"

namespace kvl {

class Decoder;

// Keeps glibc from returning large tensor buffers to the OS on every free (and
// faulting them back in on the next allocation), with one malloc arena for all
// threads. Process-wide and idempotent; Engine::Create calls it, and a
// multi-threaded program should call it before starting threads. See
// docs/model-runtime.md for the measured effect.
void TuneMallocForTensors();

// Runs LibTorch's per-thread intra-op set-up on the calling thread now. ATen
// does it lazily, at a thread's first parallel operation, by calling
// at::set_num_threads, which also destroys and recreates caffe2's pthreadpool;
// the new pool's workers then busy-wait for tens of milliseconds. A server
// thread whose first turn is a switch used to pay that inside the turn, where
// the workers and OpenBLAS's spinning thread crowded out the translation on a
// 2-core machine (measured: docs/server-bench.md). Threads that will run model
// work should call this once when they start.
void PrepareIntraOpThread();

// While alive, LibTorch operations started by the calling thread run on that
// thread alone (OpenMP's per-thread setting: other threads keep theirs; BLAS
// calls keep OpenBLAS's own threads). For stretches of many thin operations,
// such as applying a translator and re-normalising and rotating the keys it
// writes, where waking a sleeping OpenMP worker for each operation costs more
// than the work it takes over (docs/server-bench.md).
class SerialIntraOpScope {
 public:
  SerialIntraOpScope();
  ~SerialIntraOpScope();
  SerialIntraOpScope(const SerialIntraOpScope&) = delete;
  SerialIntraOpScope& operator=(const SerialIntraOpScope&) = delete;

 private:
  int saved_;
};

enum class FinishReason {
  kStopToken,   // a stop token was sampled
  kStopString,  // the text reached a stop string
  kLength,      // max_tokens generated
  kCancelled,   // the callback returned false
};
const char* FinishReasonName(FinishReason reason);

struct GenerateOptions {
  int64_t max_tokens = 256;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<int64_t> stop_token_ids;
  // Ids at or past this are never sampled (0: no limit): the logits past it
  // are left out, of the log-probabilities too. A model's embedding is often
  // padded past its tokenizer's ids, and another model that reads the reply
  // may have a smaller one (router/router.h).
  int64_t vocab_limit = 0;
  std::vector<std::string> stop_strings;
  // The text a generated token completes (a streaming detokenizer: it may be
  // empty while a UTF-8 sequence is incomplete). Required for stop_strings;
  // optional otherwise (then no text is produced).
  std::function<std::string(int64_t id)> token_text;
  // Called for each generated token except a stop token, with the text that
  // became final with it (text that could still begin a stop string is held
  // back until it cannot; what is still held when generation ends comes in one
  // last call with id -1). Returning false cancels generation.
  std::function<bool(int64_t id, std::string_view text)> on_token;
  // Fill GenerateResult::logprobs and first_greedy (a log-softmax per step).
  bool record_logprobs = false;
  // Batched generation only (model/scheduler.h): called on the scheduler's
  // thread when the request's first tokens run (its wait in the queue ends),
  // and polled before each of its steps: true stops it as the client
  // cancelling would (FinishReason::kCancelled).
  std::function<void()> on_admitted;
  std::function<bool()> cancelled;
};

struct GenerateResult {
  // Generated tokens, without a final stop token. The cache line holds the
  // prompt and every sampled token except the last one sampled (the stop token
  // for kStopToken, else tokens.back()): it has not been run through the model
  // yet; that happens when the conversation continues.
  std::vector<int64_t> tokens;
  std::string text;  // concatenated token text, cut before a stop string
  FinishReason finish_reason = FinishReason::kLength;
  int64_t stop_token_id = -1;  // the stop token sampled, for kStopToken
  // GenerateOptions::record_logprobs only: the model's log-probability (nats,
  // of its unscaled distribution) of each sampled token, tokens then the stop
  // token; and the most likely first token (argmax of the first step).
  std::vector<double> logprobs;
  int64_t first_greedy = -1;
};

// One sequence's generation after its prompt: samples each step's token from
// the logits, applies the stop tokens, stop strings and max_tokens, streams
// text through on_token. Engine::Generate drives one; the batch scheduler
// drives one per request. Options must have been validated
// (ValidateGenerateOptions); they must outlive the state.
class GenerationState {
 public:
  explicit GenerationState(const GenerateOptions& options);
  // Takes the next token from logits ([V] or [1, V], float32). Returns true
  // when generation goes on: last_token() must then run through the model
  // and its logits come to the next Step. False when it has finished (then
  // call Finish). InternalError when sampling fails.
  absl::StatusOr<bool> Step(const at::Tensor& logits);
  int64_t last_token() const { return result_.tokens.back(); }
  // True before any Step when max_tokens is 0.
  bool done() const { return done_; }
  // Flushes held-back text through on_token; the result.
  GenerateResult Finish();

 private:
  const GenerateOptions& options_;
  Sampler sampler_;
  GenerateResult result_;
  int64_t steps_ = 0;
  size_t emitted_ = 0;  // bytes of result_.text already given to on_token
  bool done_ = false;
};

// InvalidArgument for options Generate refuses (bad sampling parameters,
// negative max_tokens, stop strings without token_text, an empty stop string).
absl::Status ValidateGenerateOptions(const GenerateOptions& options);

class Engine {
 public:
  // Prepares the decoder (dtype, device, fused weights), sets the intra-op
  // thread count and tunes malloc. InvalidArgument for bad runtime options.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const Checkpoint& checkpoint,
                                                        const RuntimeOptions& options);
  ~Engine();

  const ModelConfig& config() const { return config_; }
  const GenerationDefaults& generation_defaults() const { return generation_; }
  const RuntimeOptions& options() const { return options_; }
  KeyTapMode tap_mode() const;

  std::unique_ptr<KvCache> NewCache() const;

  // Runs ids through the model in chunks of options().prefill_chunk, appending
  // them to cache. Returns the float32 logits of the last token, [V] (or of
  // every token, [T, V], when all_logits). InvalidArgument for empty ids or ids
  // outside the vocabulary, OutOfRange past max_position_embeddings.
  absl::StatusOr<at::Tensor> Prefill(KvCache& cache, const std::vector<int64_t>& ids,
                                     bool all_logits = false);
  // One token: appends it and returns the next token's logits [V].
  absl::StatusOr<at::Tensor> Decode(KvCache& cache, int64_t id);
  // Prefills prompt_ids — the tokens the cache line lacks, at least one (a new
  // turn, preceded when continuing a conversation by the last sampled token
  // of the previous one) — then samples up to max_tokens. Errors as Prefill's,
  // InvalidArgument for bad options; the line is rolled back on error.
  absl::StatusOr<GenerateResult> Generate(KvCache& cache, const std::vector<int64_t>& prompt_ids,
                                          const GenerateOptions& options);

  // How confidently the model reads `ids` (at least 2 tokens) after what the
  // cache holds, for the router's cascade: prefills all but the last token
  // (the cache then holds them; the caller runs the last one itself, to sample
  // from), scoring each against the token that follows it, then reads the
  // next-token distribution after the last token without keeping it. Errors
  // as Prefill's; the cache is rolled back on error.
  struct ContinuationScore {
    std::vector<double> logprobs;  // [T-1]: of ids[1..T), each given what precedes it, nats
    // [T-1]: whether ids[i + 1] was the most likely token there (what greedy
    // decoding would have picked; a tie counts for the lower id, as argmax).
    std::vector<bool> greedy;
    double mean_logprob = 0;       // their mean
    double next_entropy = 0;       // of the token after ids, nats
    int64_t n_scored = 0;          // T - 1
  };
  absl::StatusOr<ContinuationScore> ScoreContinuation(KvCache& cache,
                                                     const std::vector<int64_t>& ids);
  // The same with the two prefills run by `prefill`, which has Prefill's
  // contract (the logits, [V] or [T, V] with all_logits; the line rolled back
  // on error): a batch scheduler's, so that scoring shares the engine loop's
  // steps with other requests (model/scheduler.h).
  using PrefillFn = std::function<absl::StatusOr<at::Tensor>(
      KvCache& cache, const std::vector<int64_t>& ids, bool all_logits)>;
  static absl::StatusOr<ContinuationScore> ScoreContinuation(KvCache& cache,
                                                            const std::vector<int64_t>& ids,
                                                            const PrefillFn& prefill);

  // One forward over several lines at once (Decoder::ForwardBatch), for the
  // batch scheduler (model/scheduler.h): rows[i].ids run against
  // *rows[i].cache; returns each row's float32 logits, [1, V] or [T, V] with
  // all_logits. The ids must have passed CheckIds and each chunk must fit
  // options().prefill_chunk. InternalError / ResourceExhausted when LibTorch
  // fails; the lines are then as they were.
  struct BatchRow {
    KvCache* cache = nullptr;
    const int64_t* ids = nullptr;
    int64_t n_ids = 0;
    bool all_logits = false;
  };
  absl::StatusOr<std::vector<at::Tensor>> ForwardBatch(const std::vector<BatchRow>& rows);

  // The native-depth dial (Decoder::ForwardLayers), in chunks of
  // options().prefill_chunk: layers [first_layer, L) of the line's tokens
  // ids at [position, position + T), from their residual stream `hidden`
  // [T, E] at first_layer's input (undefined at layer 0: the embeddings of
  // ids). InvalidArgument for a bad range, layer, ids or shape; the line's
  // length and spans never change (on an error its top layers at those
  // positions may hold part of the pass: the caller drops the span).
  absl::Status ForwardLayers(KvCache& cache, int64_t position, const std::vector<int64_t>& ids,
                             const at::Tensor& hidden, int64_t first_layer);
  // Prefills ids (one chunk per options().prefill_chunk) and returns the
  // residual stream at the input of every layer and of the final norm,
  // [L + 1, T, E] float32 (Decoder::ForwardResiduals). Errors as Prefill's.
  absl::StatusOr<at::Tensor> PrefillResiduals(KvCache& cache, const std::vector<int64_t>& ids);

  // InvalidArgument for empty ids or ids outside the vocabulary, OutOfRange
  // when cache plus ids would pass max_position_embeddings.
  absl::Status CheckIds(const KvCache& cache, const std::vector<int64_t>& ids) const;

 private:
  Engine() = default;

  ModelConfig config_;
  GenerationDefaults generation_;
  RuntimeOptions options_;
  std::unique_ptr<Decoder> decoder_;
};

}  // namespace kvl
