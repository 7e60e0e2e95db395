#include "server/metrics.h"

#include <prometheus/text_serializer.h>

#include "server/status.h"

namespace kvl::server {
namespace {

constexpr std::array<absl::string_view, kNumRpcMethods> kMethodNames = {
    "kvlingo.v1.ChatService/Chat",
    "kvlingo.v1.SessionService/CreateSession",
    "kvlingo.v1.SessionService/GetSession",
    "kvlingo.v1.SessionService/ListSessions",
    "kvlingo.v1.SessionService/DeleteSession",
    "kvlingo.v1.ModelService/ListModels",
    "kvlingo.v1.ModelService/ListTranslators",
    "kvlingo.v1.SessionService/GetTranscript",
    "kvlingo.v1.SessionService/ImportSession",
};

// Indexed by grpc::StatusCode value.
constexpr std::array<absl::string_view, kNumGrpcCodes> kCodeNames = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

constexpr int kUnknownCode = 2;

}  // namespace

absl::string_view RpcMethodName(RpcMethod method) { return kMethodNames[static_cast<int>(method)]; }

absl::string_view GrpcCodeName(int code) {
  return kCodeNames[code >= 0 && code < kNumGrpcCodes ? code : kUnknownCode];
}

const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                          0.25,  0.5,   0.75, 1,    2.5,  5,    7.5,  10,
                                          20,    40,    80,   160,  640,  2560};

namespace {
// vLLM's inter-token latency buckets, with two finer ones for small models.
const std::vector<double> kInterTokenBuckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                                0.15,  0.2,   0.3,  0.4,   0.5,  0.75,  1.0,
                                                2.5,   5.0,   7.5,  10.0,  20.0, 40.0,  80.0};
// vLLM's request latency buckets (e2e, queue time), seconds.
const std::vector<double> kRequestLatencyBuckets = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,
                                                    5.0,  10.0, 15.0, 20.0,  30.0,  40.0,  50.0,
                                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// vLLM's time-per-output-token buckets, with two finer ones for small models.
const std::vector<double> kTimePerOutputTokenBuckets = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,  0.4,
    0.5,   0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
const std::vector<double> kTranslationBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                 0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                 1,      2.5,     5,      10};
// Nats per token of a switch turn's reply (negative: the native cache liked
// the reply better).
const std::vector<double> kDivergenceBuckets = {-0.1, 0, 0.01, 0.03, 0.1, 0.3, 1, 3};
constexpr std::array<router::CachePath, router::kNumCachePaths> kPaths = {
    router::CachePath::kNative, router::CachePath::kTranslated, router::CachePath::kReprefill,
    router::CachePath::kRestored, router::CachePath::kNativeTail, router::CachePath::kHybrid};
constexpr std::array<router::Strategy, router::kNumStrategies> kStrategies = {
    router::Strategy::kTranslate, router::Strategy::kReprefill,
    router::Strategy::kReprefillMissing};
}  // namespace

ServerMetrics::ServerMetrics(const std::string& version, std::vector<std::string> models)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& requests = prometheus::BuildCounter()
                       .Name("kvlingo_grpc_requests_total")
                       .Help("gRPC requests handled, by full method name and final status code.")
                       .Register(*registry_);
  // Every (method, code) series exists from the start, so that rate() and
  // ratios over codes never see a series appear mid-way.
  for (int m = 0; m < kNumRpcMethods; ++m) {
    for (int c = 0; c < kNumGrpcCodes; ++c) {
      rpc_requests_[m][c] = &requests.Add(
          {{"method", std::string(kMethodNames[m])}, {"code", std::string(kCodeNames[c])}});
    }
  }
  sessions_active_ = &prometheus::BuildGauge()
                          .Name("kvlingo_sessions_active")
                          .Help("Sessions currently held by the server.")
                          .Register(*registry_)
                          .Add({});
  prometheus::BuildGauge()
      .Name("kvlingo_build_info")
      .Help("Always 1; the labels describe the running build.")
      .Register(*registry_)
      .Add({{"version", version}})
      .Set(1);
  up_ = &prometheus::BuildGauge()
             .Name("kvlingo_up")
             .Help("1 while the server accepts new chat turns, 0 while it drains for shutdown.")
             .Register(*registry_)
             .Add({});
  up_->Set(1);

  const int n = static_cast<int>(models.size());
  n_models_ = n;
  auto& ttft = prometheus::BuildHistogram()
                   .Name("kvlingo_time_to_first_token_seconds")
                   .Help("From receipt of a Chat request to its first token, by answering model "
                         "and by how its cache of the history was produced.")
                   .Register(*registry_);
  auto& itl = prometheus::BuildHistogram()
                  .Name("kvlingo_inter_token_latency_seconds")
                  .Help("Time between consecutive streamed tokens, by model.")
                  .Register(*registry_);
  auto& prefill = prometheus::BuildCounter()
                      .Name("kvlingo_prefill_tokens_total")
                      .Help("Tokens run through a model by prefill (history and new turns).")
                      .Register(*registry_);
  auto& generated = prometheus::BuildCounter()
                        .Name("kvlingo_generated_tokens_total")
                        .Help("Tokens generated by a model.")
                        .Register(*registry_);
  auto& bytes = prometheus::BuildGauge()
                    .Name("kvlingo_cache_bytes")
                    .Help("KV cache bytes held for all sessions, by model (capacity included).")
                    .Register(*registry_);
  auto& translation = prometheus::BuildHistogram()
                          .Name("kvlingo_translation_seconds")
                          .Help("Wall time of translating one span of cache, by source and "
                                "target model.")
                          .Register(*registry_);
  auto& translated = prometheus::BuildCounter()
                         .Name("kvlingo_translated_tokens_total")
                         .Help("Tokens of cache translated, by source and target model.")
                         .Register(*registry_);
  auto& switches = prometheus::BuildCounter()
                       .Name("kvlingo_switches_total")
                       .Help("Turns answered by a different model than the previous turn, by "
                             "models and hand-over strategy.")
                       .Register(*registry_);
  for (int m = 0; m < n; ++m) {
    std::array<prometheus::Histogram*, router::kNumCachePaths> per_path{};
    for (int p = 0; p < router::kNumCachePaths; ++p) {
      per_path[p] = &ttft.Add({{"model", models[m]}, {"path", router::CachePathName(kPaths[p])}},
                              kTtftBuckets);
    }
    ttft_.push_back(per_path);
    inter_token_.push_back(&itl.Add({{"model", models[m]}}, kInterTokenBuckets));
    prefill_tokens_.push_back(&prefill.Add({{"model", models[m]}}));
    generated_tokens_.push_back(&generated.Add({{"model", models[m]}}));
    cache_bytes_.push_back(&bytes.Add({{"model", models[m]}}));
  }
  auto& repaired = prometheus::BuildCounter()
                       .Name("kvlingo_repaired_tokens_total")
                       .Help("Tokens of translated cache recomputed natively by background "
                             "repair, by model.")
                       .Register(*registry_);
  auto& repair_seconds = prometheus::BuildCounter()
                             .Name("kvlingo_repair_seconds_total")
                             .Help("Engine time spent by background repair, by model.")
                             .Register(*registry_);
  auto& repairs = prometheus::BuildCounter()
                      .Name("kvlingo_repairs_total")
                      .Help("Repaired cache lines swapped in, by model.")
                      .Register(*registry_);
  for (int m = 0; m < n; ++m) {
    repaired_tokens_.push_back(&repaired.Add({{"model", models[m]}}));
    repair_seconds_.push_back(&repair_seconds.Add({{"model", models[m]}}));
    repairs_.push_back(&repairs.Add({{"model", models[m]}}));
  }
  auto& running = prometheus::BuildGauge()
                     .Name("kvlingo_requests_running")
                     .Help("Chat turns running on a model now, by model (with batching, the "
                           "turns in its engine loop; without, 0 or 1).")
                     .Register(*registry_);
  auto& waiting = prometheus::BuildGauge()
                      .Name("kvlingo_requests_waiting")
                      .Help("Chat turns waiting for a model's engine, by model "
                            "(limits.max_waiting_turns_per_model bounds it).")
                      .Register(*registry_);
  for (int m = 0; m < n; ++m) {
    requests_running_.push_back(&running.Add({{"model", models[m]}}));
    requests_waiting_.push_back(&waiting.Add({{"model", models[m]}}));
  }
  auto& batch = prometheus::BuildHistogram()
                    .Name("kvlingo_batch_size")
                    .Help("Requests in one batched engine step (decoding turns, prompt "
                          "chunks, repair chunks), by model.")
                    .Register(*registry_);
  auto& step_tokens = prometheus::BuildHistogram()
                          .Name("kvlingo_batch_tokens")
                          .Help("Tokens one batched engine step ran, all requests together, "
                                "by model.")
                          .Register(*registry_);
  const prometheus::Histogram::BucketBoundaries size_buckets = {1, 2, 4, 8, 16, 32, 64, 128};
  const prometheus::Histogram::BucketBoundaries token_buckets = {1,   2,   4,   8,    16,  32,
                                                                 64,  128, 256, 512, 1024};
  for (int m = 0; m < n; ++m) {
    batch_size_.push_back(&batch.Add({{"model", models[m]}}, size_buckets));
    batch_tokens_.push_back(&step_tokens.Add({{"model", models[m]}}, token_buckets));
  }
  auto& e2e = prometheus::BuildHistogram()
                  .Name("kvlingo_e2e_request_latency_seconds")
                  .Help("Receipt of a Chat request to its TurnSummary, completed turns, by the "
                        "model that answered (vLLM's buckets).")
                  .Register(*registry_);
  auto& queue = prometheus::BuildHistogram()
                    .Name("kvlingo_request_queue_time_seconds")
                    .Help("Receipt of a Chat request to its turn first driving a model's "
                          "engine, completed turns, by model.")
                    .Register(*registry_);
  auto& tpot = prometheus::BuildHistogram()
                   .Name("kvlingo_time_per_output_token_seconds")
                   .Help("A completed turn's decode time per generated token after the "
                         "first (turns of two or more tokens), by model.")
                   .Register(*registry_);
  auto& success = prometheus::BuildCounter()
                      .Name("kvlingo_request_success_total")
                      .Help("Completed Chat turns by model and finish reason (stop_token, "
                            "stop_string, length).")
                      .Register(*registry_);
  for (int m = 0; m < n; ++m) {
    e2e_latency_.push_back(&e2e.Add({{"model", models[m]}}, kRequestLatencyBuckets));
    queue_time_.push_back(&queue.Add({{"model", models[m]}}, kRequestLatencyBuckets));
    time_per_output_token_.push_back(
        &tpot.Add({{"model", models[m]}}, kTimePerOutputTokenBuckets));
    std::array<prometheus::Counter*, 4> by_reason{};
    for (FinishReason reason :
         {FinishReason::kStopToken, FinishReason::kStopString, FinishReason::kLength}) {
      by_reason[static_cast<int>(reason)] = &success.Add(
          {{"model", models[m]}, {"finished_reason", FinishReasonName(reason)}});
    }
    request_success_.push_back(by_reason);
  }
  rejected_ = &prometheus::BuildCounter()
                   .Name("kvlingo_requests_rejected_total")
                   .Help("Requests refused with RESOURCE_EXHAUSTED by an admission limit, "
                         "by the limit (the key under \"limits\" in the configuration).")
                   .Register(*registry_);
  for (const char* limit : {"max_concurrent_streams", "max_waiting_turns_per_model",
                            "max_sessions", "max_history_tokens"}) {
    rejected_->Add({{"limit", limit}});
  }
  http_requests_ = &prometheus::BuildCounter()
                        .Name("kvlingo_http_requests_total")
                        .Help("Requests to the OpenAI-compatible HTTP API by route and HTTP "
                              "status.")
                        .Register(*registry_);
  for (const char* route : {"/v1/chat/completions", "/v1/models"}) {
    for (const char* status : {"200", "400", "401", "403", "404", "413", "429", "500", "503"}) {
      http_requests_->Add({{"route", route}, {"status", status}});
    }
  }
  auto& prompt = prometheus::BuildCounter()
                     .Name("kvlingo_prompt_tokens_total")
                     .Help("Prompt tokens of OpenAI API requests by the answering model and by "
                           "how they reached it: own_cache (already in its cache line), "
                           "translated (from another model's cache), prefilled.")
                     .Register(*registry_);
  for (int m = 0; m < n; ++m) {
    std::array<prometheus::Counter*, 3> by_source{};
    const char* sources[] = {"own_cache", "translated", "prefilled"};
    for (int k = 0; k < 3; ++k) {
      by_source[k] = &prompt.Add({{"model", models[m]}, {"source", sources[k]}});
    }
    prompt_tokens_.push_back(by_source);
  }
  auto& lookups = prometheus::BuildCounter()
                      .Name("kvlingo_prefix_cache_lookups_total")
                      .Help("OpenAI API requests that found a cached prefix of their "
                            "conversation (hit) or none (miss).")
                      .Register(*registry_);
  prefix_hits_ = &lookups.Add({{"result", "hit"}});
  prefix_misses_ = &lookups.Add({{"result", "miss"}});
  prefix_evictions_ = &prometheus::BuildCounter()
                           .Name("kvlingo_prefix_cache_evictions_total")
                           .Help("Conversations removed from the prefix cache to stay within "
                                 "server.http_max_conversations.")
                           .Register(*registry_)
                           .Add({});
  prefix_conversations_ = &prometheus::BuildGauge()
                               .Name("kvlingo_prefix_cache_conversations")
                               .Help("Conversations the prefix cache indexes (each a session; "
                                     "their cache bytes count in kvlingo_cache_bytes).")
                               .Register(*registry_)
                               .Add({});
  repair_backlog_ = &prometheus::BuildGauge()
                         .Name("kvlingo_repair_backlog_lines")
                         .Help("Cache lines with translated spans queued for background repair "
                               "or being repaired.")
                         .Register(*registry_)
                         .Add({});
  auto& divergence = prometheus::BuildHistogram()
                         .Name("kvlingo_switch_divergence_nats")
                         .Help("Per translated switch turn, once its line is repaired: mean over "
                               "the reply's tokens of log p(translated cache) - log p(native "
                               "cache), nats/token, by source and target model.")
                         .Register(*registry_);
  auto& differs = prometheus::BuildCounter()
                      .Name("kvlingo_switch_first_token_differs_total")
                      .Help("Repaired translated switch turns whose most likely first token on "
                            "the native cache differs from the translated cache's, by source and "
                            "target model.")
                      .Register(*registry_);
  auto& gate_open = prometheus::BuildGauge()
                        .Name("kvlingo_translator_gate_open")
                        .Help("1 while a translator pair may be used, 0 while the quality gate "
                              "(routing.gate) has closed it, live or at load, and its switches "
                              "re-prefill.")
                        .Register(*registry_);
  auto& gate_closures = prometheus::BuildCounter()
                            .Name("kvlingo_translator_gate_closures_total")
                            .Help("Times the quality gate closed a translator pair (a refusal at load "
                                  "counts once).")
                            .Register(*registry_);
  gate_open_.assign(n * n, nullptr);
  gate_closures_.assign(n * n, nullptr);
  switch_divergence_.assign(n * n, nullptr);
  first_token_differs_.assign(n * n, nullptr);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      switch_divergence_[a * n + b] =
          &divergence.Add({{"source", models[a]}, {"target", models[b]}}, kDivergenceBuckets);
      first_token_differs_[a * n + b] = &differs.Add({{"source", models[a]}, {"target", models[b]}});
      gate_open_[a * n + b] = &gate_open.Add({{"source", models[a]}, {"target", models[b]}});
      gate_open_[a * n + b]->Set(1);
      gate_closures_[a * n + b] = &gate_closures.Add({{"source", models[a]}, {"target", models[b]}});
    }
  }
  translation_seconds_.assign(n * n, nullptr);
  translated_tokens_.assign(n * n, nullptr);
  switches_.assign(n * n, {});
  for (int s = 0; s < n; ++s) {
    for (int t = 0; t < n; ++t) {
      if (s == t) continue;
      translation_seconds_[s * n + t] =
          &translation.Add({{"source", models[s]}, {"target", models[t]}}, kTranslationBuckets);
      translated_tokens_[s * n + t] =
          &translated.Add({{"source", models[s]}, {"target", models[t]}});
      for (int k = 0; k < router::kNumStrategies; ++k) {
        switches_[s * n + t][k] = &switches.Add(
            {{"from", models[s]}, {"to", models[t]}, {"strategy", router::StrategyName(kStrategies[k])}});
      }
    }
  }
  sessions_evicted_ = &prometheus::BuildGauge()
                           .Name("kvlingo_sessions_evicted")
                           .Help("Sessions with at least one evicted cache line (rebuilt by "
                                 "prefill when next used).")
                           .Register(*registry_)
                           .Add({});
  cache_budget_ = &prometheus::BuildGauge()
                       .Name("kvlingo_cache_budget_bytes")
                       .Help("The KV cache memory budget (sessions.memory_budget_bytes).")
                       .Register(*registry_)
                       .Add({});
  evicted_lines_ = &prometheus::BuildCounter()
                        .Name("kvlingo_cache_evicted_lines_total")
                        .Help("Cache lines evicted to stay within the memory budget.")
                        .Register(*registry_)
                        .Add({});
}

void ServerMetrics::SetCacheStats(const CacheStoreStats& stats) {
  for (int m = 0; m < n_models_ && m < static_cast<int>(stats.bytes_per_model.size()); ++m) {
    cache_bytes_[m]->Set(static_cast<double>(stats.bytes_per_model[m]));
  }
  sessions_active_->Set(static_cast<double>(stats.sessions));
  sessions_evicted_->Set(static_cast<double>(stats.sessions_with_evicted_lines));
  cache_budget_->Set(static_cast<double>(stats.budget_bytes));
  const double delta = static_cast<double>(stats.lines_evicted_total) - evicted_lines_->Value();
  if (delta > 0) evicted_lines_->Increment(delta);
}

void ServerMetrics::OnSwitch(int from, int to, router::Strategy strategy) {
  if (from < 0 || to < 0 || from == to) return;
  switches_[from * n_models_ + to][static_cast<int>(strategy)]->Increment();
}

void ServerMetrics::OnTranslation(int source, int target, double seconds, int64_t tokens) {
  translation_seconds_[source * n_models_ + target]->Observe(seconds);
  translated_tokens_[source * n_models_ + target]->Increment(static_cast<double>(tokens));
}

void ServerMetrics::OnPrefillTokens(int model, int64_t n) {
  prefill_tokens_[model]->Increment(static_cast<double>(n));
}

void ServerMetrics::OnGeneratedTokens(int model, int64_t n) {
  generated_tokens_[model]->Increment(static_cast<double>(n));
}

void ServerMetrics::OnTimeToFirstToken(int model, router::CachePath path, double seconds) {
  ttft_[model][static_cast<int>(path)]->Observe(seconds);
}

void ServerMetrics::OnInterTokenLatency(int model, double seconds) {
  inter_token_[model]->Observe(seconds);
}

void ServerMetrics::OnRepair(int model, int64_t tokens, double seconds) {
  repaired_tokens_[model]->Increment(static_cast<double>(tokens));
  repair_seconds_[model]->Increment(seconds);
  repairs_[model]->Increment();
}

void ServerMetrics::OnSwitchFidelity(int source, int target, double nats_per_token,
                                     int64_t tokens, bool first_token_differs) {
  if (source < 0 || target < 0 || source == target) return;
  switch_divergence_[source * n_models_ + target]->Observe(nats_per_token);
  if (first_token_differs) first_token_differs_[source * n_models_ + target]->Increment();
}

void ServerMetrics::OnGate(int source, int target, bool open, const std::string& reason) {
  if (source < 0 || target < 0 || source == target) return;
  gate_open_[source * n_models_ + target]->Set(open ? 1 : 0);
  if (!open) gate_closures_[source * n_models_ + target]->Increment();
}

void ServerMetrics::OnModelQueue(int model, int running, int waiting) {
  if (model < 0 || model >= n_models_) return;
  requests_running_[model]->Set(running);
  requests_waiting_[model]->Set(waiting);
}

void ServerMetrics::OnBatchStep(int model, int64_t rows, int64_t decode_rows, int64_t tokens,
                                double seconds) {
  if (model < 0 || model >= n_models_) return;
  batch_size_[model]->Observe(static_cast<double>(rows));
  batch_tokens_[model]->Observe(static_cast<double>(tokens));
}

void ServerMetrics::OnTurnDone(const router::TurnResult& r) {
  const int m = r.routing.model;
  if (m < 0 || m >= n_models_) return;
  e2e_latency_[m]->Observe(r.total_seconds);
  queue_time_[m]->Observe(r.queue_seconds);
  if (r.generated_tokens >= 2) {
    time_per_output_token_[m]->Observe(r.decode_seconds /
                                       static_cast<double>(r.generated_tokens - 1));
  }
  if (prometheus::Counter* c = request_success_[m][static_cast<int>(r.finish_reason)]) {
    c->Increment();
  }
}

void ServerMetrics::OnRejected(router::Setting limit) {
  absl::string_view key = ServerKey(limit);
  key.remove_prefix(key.find('.') + 1);  // "limits.max_history_tokens" -> "max_history_tokens"
  OnRejected(std::string(key));
}

void ServerMetrics::OnRejected(const std::string& limit) {
  rejected_->Add({{"limit", limit}}).Increment();
}

void ServerMetrics::CountHttpRequest(const std::string& route, int status) {
  http_requests_->Add({{"route", route}, {"status", std::to_string(status)}}).Increment();
}

void ServerMetrics::OnPromptTokens(int model, int64_t own_cache, int64_t translated,
                                   int64_t prefilled) {
  if (model < 0 || model >= n_models_) return;
  prompt_tokens_[model][0]->Increment(static_cast<double>(own_cache));
  prompt_tokens_[model][1]->Increment(static_cast<double>(translated));
  prompt_tokens_[model][2]->Increment(static_cast<double>(prefilled));
}

void ServerMetrics::OnPrefixLookup(bool hit) { (hit ? prefix_hits_ : prefix_misses_)->Increment(); }

void ServerMetrics::OnPrefixEvictions(int64_t n) {
  prefix_evictions_->Increment(static_cast<double>(n));
}

void ServerMetrics::SetPrefixConversations(int64_t n) {
  prefix_conversations_->Set(static_cast<double>(n));
}

void ServerMetrics::OnRepairBacklog(int64_t lines) {
  repair_backlog_->Set(static_cast<double>(lines));
}

void ServerMetrics::CountRpc(RpcMethod method, int code) {
  rpc_requests_[static_cast<int>(method)][code >= 0 && code < kNumGrpcCodes ? code : kUnknownCode]
      ->Increment();
}


void ServerMetrics::SetUp(bool up) { up_->Set(up ? 1 : 0); }

std::string ServerMetrics::RenderText() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace kvl::server
