#include "model/engine.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <new>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/decoder.h"

namespace kvl {
namespace {

at::ScalarType ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat16:
      return at::kHalf;
  }
  return at::kFloat;
}

// Runs f, turning LibTorch exceptions into statuses at the model/ edge.
template <typename F>
auto Guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  }
}

}  // namespace

void TuneMallocForTensors() {
  // Serve tensor buffers up to glibc's maximum mmap threshold (32 MiB on
  // 64-bit) from the heap, and do not trim it: otherwise each large free is an
  // munmap/trim and the next allocation page-faults fresh zeroed memory.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  // One arena for every thread. glibc otherwise gives each thread that
  // allocates its own arena, whose memory is fresh (page-faulting) pages and
  // is not covered by the settings above: a server turn runs on whichever
  // pool thread is free, and per-thread arenas made its translations markedly
  // slower (measured: docs/model-runtime.md). Tensor allocations are few and
  // large, so the shared arena's lock is not a cost.
  mallopt(M_ARENA_MAX, 1);
}

void PrepareIntraOpThread() { at::internal::lazy_init_num_threads(); }

SerialIntraOpScope::SerialIntraOpScope() {
  PrepareIntraOpThread();  // else ATen's lazy set-up would undo the setting below
  saved_ = omp_get_max_threads();
  omp_set_num_threads(1);
}

SerialIntraOpScope::~SerialIntraOpScope() { omp_set_num_threads(saved_); }

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Checkpoint& checkpoint,
                                                       const RuntimeOptions& options) {
  if (options.prefill_chunk <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk must be positive, got ", options.prefill_chunk));
  }
  if (options.n_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_threads must be >= 0, got ", options.n_threads));
  }
  TuneMallocForTensors();
  const int n_threads = options.n_threads > 0
                            ? options.n_threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(n_threads);

  DecoderOptions decoder_options;
  decoder_options.dtype = ToScalarType(options.dtype);
  decoder_options.device = options.device;
  absl::StatusOr<std::unique_ptr<Decoder>> decoder =
      Decoder::Create(checkpoint.config, checkpoint.weights, decoder_options);
  if (!decoder.ok()) return decoder.status();
  std::unique_ptr<Engine> engine(new Engine());
  engine->config_ = checkpoint.config;
  engine->generation_ = checkpoint.generation;
  engine->options_ = options;
  engine->options_.n_threads = n_threads;
  engine->decoder_ = *std::move(decoder);
  return engine;
}

KeyTapMode Engine::tap_mode() const { return decoder_->tap_mode(); }

std::unique_ptr<KvCache> Engine::NewCache() const { return decoder_->NewCache(); }

absl::Status Engine::CheckIds(const KvCache& cache, const std::vector<int64_t>& ids) const {
  if (ids.empty()) return absl::InvalidArgumentError("no token ids to run");
  for (int64_t id : ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  const int64_t n_ctx = cache.Length() + static_cast<int64_t>(ids.size());
  if (n_ctx > config_.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("context of ", n_ctx,
                                              " tokens exceeds max_position_embeddings ",
                                              config_.max_position_embeddings));
  }
  return absl::OkStatus();
}

namespace {

// A prefill's frame: ids through `chunk_forward` one chunk of at most
// `chunk` tokens at a time under InferenceMode, the per-chunk results
// combined by `combine`; LibTorch errors caught and the line rolled back.
template <class Forward, class Combine>
absl::StatusOr<at::Tensor> InChunks(KvCache& cache, const std::vector<int64_t>& ids,
                                    int64_t chunk, Forward&& chunk_forward, Combine&& combine) {
  const int64_t n_start = cache.Length();
  absl::StatusOr<at::Tensor> result = Guarded("prefill", [&]() -> absl::StatusOr<at::Tensor> {
    c10::InferenceMode inference;
    const int64_t n = static_cast<int64_t>(ids.size());
    const at::Tensor all = at::from_blob(const_cast<int64_t*>(ids.data()), {n}, at::kLong);
    std::vector<at::Tensor> parts;
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
      parts.push_back(chunk_forward(all.narrow(0, i0, std::min(chunk, n - i0))));
    }
    return combine(parts);
  });
  if (!result.ok()) (void)cache.Rollback(n_start);
  return result;
}

}  // namespace

absl::StatusOr<at::Tensor> Engine::Prefill(KvCache& cache, const std::vector<int64_t>& ids,
                                           bool all_logits) {
  KVL_RETURN_IF_ERROR(CheckIds(cache, ids));
  return InChunks(
      cache, ids, options_.prefill_chunk,
      [&](const at::Tensor& chunk) { return decoder_->Forward(cache, chunk, all_logits); },
      [&](const std::vector<at::Tensor>& logits) {
        return all_logits ? at::cat(logits, 0) : logits.back().squeeze(0);
      });
}

absl::Status Engine::ForwardLayers(KvCache& cache, int64_t position,
                                   const std::vector<int64_t>& ids, const at::Tensor& hidden,
                                   int64_t first_layer) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n == 0) return absl::InvalidArgumentError("a layer pass needs at least one token");
  if (position < 0 || position + n > cache.Length()) {
    return absl::InvalidArgumentError(absl::StrCat("a layer pass over tokens [", position, ", ",
                                                   position + n, ") of a line of ",
                                                   cache.Length()));
  }
  if (first_layer < 0 || first_layer >= config_.n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("a layer pass from layer ", first_layer,
                                                   " of a model of ", config_.n_layer));
  }
  if (hidden.defined() ? (hidden.dim() != 2 || hidden.size(0) != n ||
                          hidden.size(1) != config_.hidden_size)
                       : first_layer != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a layer pass from layer ", first_layer, " over ", n, " tokens needs a residual stream [",
        n, ", ", config_.hidden_size, "], got ",
        hidden.defined() ? c10::str(hidden.sizes()) : std::string("none")));
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside the vocabulary"));
    }
  }
  return Guarded("layer pass", [&]() -> absl::StatusOr<at::Tensor> {
           c10::InferenceMode inference;
           const at::Tensor all =
               at::from_blob(const_cast<int64_t*>(ids.data()), {n}, at::kLong);
           for (int64_t i0 = 0; i0 < n; i0 += options_.prefill_chunk) {
             const int64_t nc = std::min(options_.prefill_chunk, n - i0);
             decoder_->ForwardLayers(cache, position + i0, all.narrow(0, i0, nc),
                                     hidden.defined() ? hidden.narrow(0, i0, nc) : at::Tensor(),
                                     first_layer);
           }
           return at::Tensor();
         })
      .status();
}

absl::StatusOr<at::Tensor> Engine::PrefillResiduals(KvCache& cache,
                                                    const std::vector<int64_t>& ids) {
  KVL_RETURN_IF_ERROR(CheckIds(cache, ids));
  return InChunks(
      cache, ids, options_.prefill_chunk,
      [&](const at::Tensor& chunk) { return decoder_->ForwardResiduals(cache, chunk).cpu(); },
      [](const std::vector<at::Tensor>& parts) { return at::cat(parts, 1); });
}

absl::StatusOr<at::Tensor> Engine::Decode(KvCache& cache, int64_t id) {
  return Prefill(cache, {id});
}

absl::StatusOr<Engine::ContinuationScore> Engine::ScoreContinuation(
    KvCache& cache, const std::vector<int64_t>& ids) {
  return ScoreContinuation(
      cache, ids, [this](KvCache& line, const std::vector<int64_t>& run, bool all_logits) {
        return Prefill(line, run, all_logits);
      });
}

absl::StatusOr<Engine::ContinuationScore> Engine::ScoreContinuation(
    KvCache& cache, const std::vector<int64_t>& ids, const PrefillFn& prefill) {
  if (ids.size() < 2) return absl::InvalidArgumentError("scoring needs at least two tokens");
  const int64_t n_start = cache.Length();
  const std::vector<int64_t> head(ids.begin(), ids.end() - 1);
  absl::StatusOr<at::Tensor> logits = prefill(cache, head, /*all_logits=*/true);
  if (!logits.ok()) return logits.status();
  ContinuationScore score;
  score.n_scored = static_cast<int64_t>(head.size());
  {
    c10::InferenceMode guard;
    // Row i predicts ids[i + 1].
    // Scored on the host: the logits may live on a GPU (runtime.device).
    const at::Tensor next =
        at::from_blob(const_cast<int64_t*>(ids.data()) + 1, {score.n_scored}, at::kLong);
    const at::Tensor all = at::log_softmax(logits->to(at::kCPU, at::kFloat), -1);
    const at::Tensor is_argmax = all.argmax(-1).eq(next).contiguous();
    score.greedy.assign(is_argmax.data_ptr<bool>(), is_argmax.data_ptr<bool>() + score.n_scored);
    const at::Tensor lp = all.gather(1, next.unsqueeze(1))
                              .squeeze(1)
                              .to(at::kDouble)
                              .contiguous();
    score.logprobs.assign(lp.data_ptr<double>(), lp.data_ptr<double>() + score.n_scored);
    score.mean_logprob = lp.mean().item<double>();
  }
  // The last token run once to read what follows it, then rolled back.
  absl::StatusOr<at::Tensor> last = prefill(cache, {ids.back()}, /*all_logits=*/false);
  if (!last.ok()) {
    (void)cache.Rollback(n_start);
    return last.status();
  }
  KVL_RETURN_IF_ERROR(cache.Rollback(cache.Length() - 1));
  c10::InferenceMode guard;
  const at::Tensor lp = at::log_softmax(last->to(at::kFloat).reshape({-1}), -1);
  score.next_entropy = -(lp.exp() * lp).sum().item<double>();
  return score;
}

absl::StatusOr<std::vector<at::Tensor>> Engine::ForwardBatch(const std::vector<BatchRow>& rows) {
  return Guarded("batched forward", [&]() -> absl::StatusOr<std::vector<at::Tensor>> {
    c10::InferenceMode inference;
    std::vector<Decoder::Row> batch;
    batch.reserve(rows.size());
    for (const BatchRow& row : rows) {
      batch.push_back(Decoder::Row{
          row.cache, at::from_blob(const_cast<int64_t*>(row.ids), {row.n_ids}, at::kLong),
          row.all_logits});
    }
    return decoder_->ForwardBatch(batch);
  });
}

absl::Status ValidateGenerateOptions(const GenerateOptions& options) {
  KVL_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 0, got ", options.max_tokens));
  }
  if (!options.stop_strings.empty() && !options.token_text) {
    return absl::InvalidArgumentError("stop strings need token_text (a detokenizer)");
  }
  for (const std::string& s : options.stop_strings) {
    if (s.empty()) return absl::InvalidArgumentError("empty stop string");
  }
  return absl::OkStatus();
}

GenerationState::GenerationState(const GenerateOptions& options)
    : options_(options), sampler_(options.sampling, options.seed) {
  result_.finish_reason = FinishReason::kLength;
  done_ = options.max_tokens == 0;
}

absl::StatusOr<bool> GenerationState::Step(const at::Tensor& all_logits) {
  const int64_t limit = options_.vocab_limit;
  const at::Tensor logits = limit > 0 && all_logits.size(-1) > limit
                                ? all_logits.narrow(-1, 0, limit)
                                : all_logits;
  absl::StatusOr<int64_t> sampled =
      Guarded("sampling", [&]() -> absl::StatusOr<int64_t> { return sampler_.Sample(logits); });
  if (!sampled.ok()) return sampled.status();
  const int64_t id = *sampled;
  if (options_.record_logprobs) {
    absl::Status recorded = Guarded("logprobs", [&]() -> absl::Status {
      c10::InferenceMode guard;
      const at::Tensor lp = at::log_softmax(logits.to(at::kFloat).reshape({-1}), -1);
      result_.logprobs.push_back(lp[id].item<double>());
      if (steps_ == 0) result_.first_greedy = lp.argmax().item<int64_t>();
      return absl::OkStatus();
    });
    if (!recorded.ok()) return recorded;
  }
  ++steps_;
  if (std::find(options_.stop_token_ids.begin(), options_.stop_token_ids.end(), id) !=
      options_.stop_token_ids.end()) {
    result_.finish_reason = FinishReason::kStopToken;
    result_.stop_token_id = id;
    return done_ = true, false;
  }
  result_.tokens.push_back(id);
  const size_t old_size = result_.text.size();
  if (options_.token_text) result_.text += options_.token_text(id);

  // A new stop-string match must end inside the new text.
  size_t match = std::string::npos;
  for (const std::string& s : options_.stop_strings) {
    const size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
    match = std::min(match, result_.text.find(s, from));
  }
  if (match != std::string::npos) {
    result_.text.resize(match);
    if (options_.on_token && match > emitted_) {
      (void)options_.on_token(id, std::string_view(result_.text).substr(emitted_));
    }
    emitted_ = result_.text.size();
    result_.finish_reason = FinishReason::kStopString;
    return done_ = true, false;
  }
  // Hold back the longest tail that could still grow into a stop string.
  size_t held = 0;
  for (const std::string& s : options_.stop_strings) {
    for (size_t len = std::min(s.size() - 1, result_.text.size()); len > held; --len) {
      if (result_.text.compare(result_.text.size() - len, len, s, 0, len) == 0) {
        held = len;
        break;
      }
    }
  }
  const size_t final_end = std::max(emitted_, result_.text.size() - held);
  const std::string_view piece =
      std::string_view(result_.text).substr(emitted_, final_end - emitted_);
  emitted_ = final_end;
  if (options_.on_token && !options_.on_token(id, piece)) {
    result_.finish_reason = FinishReason::kCancelled;
    return done_ = true, false;
  }
  if (steps_ >= options_.max_tokens) return done_ = true, false;
  return true;
}

GenerateResult GenerationState::Finish() {
  if (options_.on_token && emitted_ < result_.text.size()) {
    (void)options_.on_token(-1, std::string_view(result_.text).substr(emitted_));
    emitted_ = result_.text.size();
  }
  return std::move(result_);
}

absl::StatusOr<GenerateResult> Engine::Generate(KvCache& cache,
                                                const std::vector<int64_t>& prompt_ids,
                                                const GenerateOptions& options) {
  KVL_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  const int64_t n_start = cache.Length();
  absl::StatusOr<at::Tensor> logits = Prefill(cache, prompt_ids);
  if (!logits.ok()) return logits.status();

  GenerationState state(options);
  while (!state.done()) {
    absl::StatusOr<bool> more = state.Step(*logits);
    if (!more.ok()) {
      (void)cache.Rollback(n_start);
      return more.status();
    }
    if (!*more) break;
    logits = Decode(cache, state.last_token());
    if (!logits.ok()) {
      (void)cache.Rollback(n_start);
      return logits.status();
    }
  }
  return state.Finish();
}

}  // namespace kvl
