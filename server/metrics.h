// The server's Prometheus registry. Every family is built once here, with a
// unit suffix and help text (kvlingo_<what>_<unit>), and every series a handler
// touches is resolved up front, so that counting an RPC is an array index and
// an atomic add: no label lookup by string on a request path.
//
// Thread-safe: all methods may be called from any thread.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "cache_store/cache_store.h"
#include "router/router.h"

namespace kvl::server {

// Every RPC the server implements; the label value is the full gRPC method name.
enum class RpcMethod {
  kChat,
  kCreateSession,
  kGetSession,
  kListSessions,
  kDeleteSession,
  kListModels,
  kListTranslators,
  kGetTranscript,
  kImportSession,
};
inline constexpr int kNumRpcMethods = 9;
// "kvlingo.v1.ChatService/Chat", ...
absl::string_view RpcMethodName(RpcMethod method);

// gRPC status codes 0..16 and their canonical names ("OK", "NOT_FOUND", ...).
inline constexpr int kNumGrpcCodes = 17;
absl::string_view GrpcCodeName(int code);

// vLLM's time-to-first-token bucket boundaries, in seconds.
extern const std::vector<double> kTtftBuckets;

// Also the router's metric sink: every (model, path), (source, target) and
// (from, to, strategy) series exists from the start.
class ServerMetrics final : public router::TurnObserver {
 public:
  // `version` becomes the label of kvlingo_build_info; `models` are the loaded
  // models' names, in the router's order.
  explicit ServerMetrics(const std::string& version, std::vector<std::string> models = {});

  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // kvlingo_grpc_requests_total{method, code}; `code` is a grpc::StatusCode
  // value. Codes outside [0, 16] count as UNKNOWN.
  void CountRpc(RpcMethod method, int code);
  // kvlingo_up: 1 while serving, 0 while draining.
  void SetUp(bool up);

  // kvlingo_sessions_active, kvlingo_cache_bytes{model},
  // kvlingo_sessions_evicted, kvlingo_cache_evicted_lines_total from the
  // store's accounting.
  void SetCacheStats(const CacheStoreStats& stats);

  // router::TurnObserver.
  void OnSwitch(int from, int to, router::Strategy strategy) override;
  void OnTranslation(int source, int target, double seconds, int64_t tokens) override;
  void OnPrefillTokens(int model, int64_t n) override;
  void OnGeneratedTokens(int model, int64_t n) override;
  void OnTimeToFirstToken(int model, router::CachePath path, double seconds) override;
  void OnInterTokenLatency(int model, double seconds) override;
  void OnRepair(int model, int64_t tokens, double seconds) override;
  void OnRepairBacklog(int64_t lines) override;
  void OnGate(int source, int target, bool open, const std::string& reason) override;
  void OnSwitchFidelity(int source, int target, double nats_per_token, int64_t tokens,
                        bool first_token_differs) override;
  void OnModelQueue(int model, int running, int waiting) override;
  void OnBatchStep(int model, int64_t rows, int64_t decode_rows, int64_t tokens,
                   double seconds) override;
  // A Chat turn that completed (its TurnSummary was sent): end-to-end
  // latency, queue time, time per output token and its finish reason.
  void OnTurnDone(const router::TurnResult& result);
  // A refusal by the router's admission limits, counted under its key in
  // "limits" (ServerKey).
  void OnRejected(router::Setting limit) override;
  // The server's own refusals (max_concurrent_streams, max_sessions, ...).
  void OnRejected(const std::string& limit);

  // The OpenAI API (server/openai_http.h).
  // kvlingo_http_requests_total{route, status}: every request, with the
  // HTTP status it was answered with (a stream that failed after its first
  // byte counts as 200 and its error in the stream).
  void CountHttpRequest(const std::string& route, int status);
  // kvlingo_prompt_tokens_total{model, source}: a served request's prompt
  // tokens by how they reached the answering model: own_cache, translated,
  // prefilled.
  void OnPromptTokens(int model, int64_t own_cache, int64_t translated, int64_t prefilled);
  // kvlingo_prefix_cache_lookups_total{result="hit"|"miss"},
  // kvlingo_prefix_cache_evictions_total, kvlingo_prefix_cache_conversations.
  void OnPrefixLookup(bool hit);
  void OnPrefixEvictions(int64_t n);
  void SetPrefixConversations(int64_t n);

  // The registry in the Prometheus text exposition format (version 0.0.4).
  std::string RenderText() const;

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::array<std::array<prometheus::Counter*, kNumGrpcCodes>, kNumRpcMethods> rpc_requests_{};
  prometheus::Gauge* sessions_active_ = nullptr;
  prometheus::Gauge* up_ = nullptr;

  // Per model (index as in the router), and per ordered model pair.
  int n_models_ = 0;
  std::vector<std::array<prometheus::Histogram*, router::kNumCachePaths>> ttft_;
  std::vector<prometheus::Histogram*> inter_token_;
  std::vector<prometheus::Counter*> prefill_tokens_, generated_tokens_;
  std::vector<prometheus::Gauge*> cache_bytes_;
  std::vector<prometheus::Histogram*> translation_seconds_;  // [source * n + target]
  std::vector<prometheus::Counter*> translated_tokens_;      // [source * n + target]
  std::vector<std::array<prometheus::Counter*, router::kNumStrategies>> switches_;  // [from*n+to]
  prometheus::Gauge* sessions_evicted_ = nullptr;
  prometheus::Gauge* cache_budget_ = nullptr;
  prometheus::Counter* evicted_lines_ = nullptr;
  std::vector<prometheus::Counter*> repaired_tokens_, repair_seconds_, repairs_;
  prometheus::Gauge* repair_backlog_ = nullptr;
  std::vector<prometheus::Histogram*> switch_divergence_;   // [source * n + target]
  std::vector<prometheus::Counter*> first_token_differs_;   // [source * n + target]
  std::vector<prometheus::Gauge*> gate_open_;                // [source * n + target]
  std::vector<prometheus::Counter*> gate_closures_;          // [source * n + target]
  std::vector<prometheus::Gauge*> requests_running_, requests_waiting_;  // per model
  std::vector<prometheus::Histogram*> batch_size_, batch_tokens_;        // per model
  std::vector<prometheus::Histogram*> e2e_latency_, queue_time_, time_per_output_token_;
  // [model][FinishReason]
  std::vector<std::array<prometheus::Counter*, 4>> request_success_;
  prometheus::Family<prometheus::Counter>* rejected_ = nullptr;          // by limit
  prometheus::Family<prometheus::Counter>* http_requests_ = nullptr;     // by route, status
  std::vector<std::array<prometheus::Counter*, 3>> prompt_tokens_;       // [model][source]
  prometheus::Counter* prefix_hits_ = nullptr;
  prometheus::Counter* prefix_misses_ = nullptr;
  prometheus::Counter* prefix_evictions_ = nullptr;
  prometheus::Gauge* prefix_conversations_ = nullptr;
};

}  // namespace kvl::server
