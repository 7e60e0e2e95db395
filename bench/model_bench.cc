// model_bench: prefill throughput, decode latency and KV cache bytes of the
// cached decoder on a random-init Qwen3-style model (E=512, 8 layers), next to
// this machine's fp32 GEMM rate. A plain driver: one run prints one table (and
// writes it to --out) so that every ratio in it comes from the same moment.
//
//   model_bench [--threads 2] [--out docs/results/model_bench.txt]
//   model_bench --threads 2 --profile-prefill 2048 [--trace FILE]
//     only prefills, 10 times (for perf); --trace: one more under LibTorch's
//     profiler, written as a Chrome trace (per-operator times)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <malloc.h>
#include <unistd.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/decoder.h"
#include "base/flags.h"
#include "bench/bench_timing.h"
#include "model/engine.h"
#include "model/omp_wait.h"

namespace {


using kvl::bench::Best;
using kvl::bench::Seconds;

kvl::ModelConfig BenchConfig() {
  kvl::ModelConfig c;
  c.vocab_size = 32000;
  c.hidden_size = 512;
  c.intermediate_size = 1536;
  c.n_layer = 8;
  c.n_head = 8;
  c.n_head_kv = 4;
  c.head_dim = 64;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 16384;
  c.qk_norm = true;
  return c;
}

// Matmul FLOPs of one token through the layers (q,k,v,o + gate,up,down).
double LayerFlopsPerToken(const kvl::ModelConfig& c) {
  const double e = c.hidden_size, f = c.intermediate_size, d = c.head_dim;
  const double per_layer = e * (c.n_head + 2 * c.n_head_kv) * d + c.n_head * d * e + 3 * e * f;
  return 2.0 * per_layer * c.n_layer;
}

// Prefill of T tokens from an empty cache, logits of the last token only:
// 2 * layer_params * T + causal attention (QK^T and PV: 2 * 2 * D FLOPs per
// query head and visible key, T(T+1)/2 pairs) * n_head * L + lm_head 2 * E * V.
double PrefillFlops(const kvl::ModelConfig& c, double t) {
  const double attention = 4.0 * c.head_dim * c.n_head * c.n_layer * t * (t + 1) / 2;
  return LayerFlopsPerToken(c) * t + attention + 2.0 * c.hidden_size * c.vocab_size;
}

// glibc's documented defaults (fixed rather than its dynamic threshold), to
// compare against TuneMallocForTensors in the same process.
void MallocDefaults() {
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  mallopt(M_TOP_PAD, 128 * 1024);
}

// Prefill of ids into a fresh cache, chunk tokens per Forward.
void PrefillInChunks(kvl::Decoder& decoder, const at::Tensor& ids, int64_t chunk) {
  auto cache = decoder.NewCache();
  for (int64_t i0 = 0; i0 < ids.numel(); i0 += chunk)
    decoder.Forward(*cache, ids.narrow(0, i0, std::min(chunk, ids.numel() - i0)), false);
}

}  // namespace

int main(int argc, char** argv) {
  kvl::ReexecWithPassiveOpenMpWait(argv);
  int n_threads = 2;
  std::string out_path;
  int64_t profile_prefill = 0;
  std::string trace_path;
  kvl::FlagSet flags("model_bench",
                     "Times the decoder's prefill and decode on the bench model (docs/model-runtime.md).");
  flags.Add("threads", &n_threads, "N", "intra-op threads");
  flags.Add("out", &out_path, "FILE", "also write the report here");
  flags.Add("profile-prefill", &profile_prefill, "T", "profile one prefill of T tokens instead");
  flags.Add("trace", &trace_path, "FILE", "with --profile-prefill: a Chrome trace");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  at::set_num_threads(n_threads);
  c10::InferenceMode inference;
  kvl::bench::Report emit;
  const kvl::bench::MachineShare share;
  char buf[512];

  const kvl::ModelConfig config = BenchConfig();
  kvl::Checkpoint checkpoint;
  checkpoint.config = config;
  checkpoint.weights = kvl::InitWeights(config, 0);
  std::snprintf(
      buf, sizeof buf,
      "model: Qwen3-style random init, E=%lld L=%lld Hq=%lld H=%lld D=%lld F=%lld V=%lld, "
      "%.1fM params (%.1fM in layers), fp32, %d intra-op threads",
      (long long)config.hidden_size, (long long)config.n_layer, (long long)config.n_head,
      (long long)config.n_head_kv, (long long)config.head_dim, (long long)config.intermediate_size,
      (long long)config.vocab_size, config.ParameterCount() / 1e6,
      LayerFlopsPerToken(config) / 2 / 1e6, at::get_num_threads());
  emit(buf);

  // 1. The machine's fp32 GEMM rate (square 2048, best of 3). The machine is
  // shared, so it is re-measured next to every prefill measurement and each
  // ratio uses the GEMM rate measured just before it.
  const kvl::bench::GemmRate gemm;
  auto gemm_rate = [&] { return gemm.Measure(); };
  double gemm_gflops = gemm_rate();
  std::snprintf(buf, sizeof buf, "fp32 GEMM 2048x2048x2048 (torch::mm) at start: %.1f GFLOP/s",
                gemm_gflops);
  emit(buf);

  std::vector<int64_t> ids(8192);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>((i * 7919) % config.vocab_size);
  const at::Tensor ids_t = at::tensor(ids);

  if (profile_prefill > 0) {
    kvl::RuntimeOptions o;
    o.n_threads = n_threads;
    auto engine = *kvl::Engine::Create(checkpoint, o);
    const std::vector<int64_t> prompt(ids.begin(),
                                      ids.begin() + std::min<int64_t>(profile_prefill, 8192));
    for (int i = 0; i < 10; ++i) {
      const double s = Seconds([&] { (void)engine->Prefill(*engine->NewCache(), prompt); });
      std::printf("prefill %zu tokens: %.3f s, %.1f%% of the GEMM rate at start\n", prompt.size(),
                  s, 100.0 * PrefillFlops(config, prompt.size()) / s / 1e9 / gemm_gflops);
    }
    if (!trace_path.empty()) {
      torch::autograd::profiler::RecordProfile guard(trace_path);
      (void)engine->Prefill(*engine->NewCache(), prompt);
    }
    return 0;
  }

  // 1b. The OpenMP wait policy. This process runs with OMP_WAIT_POLICY as
  // ReexecWithPassiveOpenMpWait left it (PASSIVE unless it was set); a child
  // process runs the same prefills with the variable empty, which libgomp
  // ignores (with a warning, discarded): its default, spinning before it sleeps.
  {
    kvl::RuntimeOptions o;
    o.n_threads = n_threads;
    auto engine = *kvl::Engine::Create(checkpoint, o);
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 2048);
    auto run = [&] { (void)engine->Prefill(*engine->NewCache(), prompt); };
    run();
    const double here = Best(3, run);
    char self[4096] = {0};
    double child = 0;
    if (readlink("/proc/self/exe", self, sizeof self - 1) > 0) {
      const std::string command = "OMP_WAIT_POLICY= '" + std::string(self) + "' --threads " +
                                  std::to_string(n_threads) + " --profile-prefill 2048 2>/dev/null";
      if (FILE* pipe = popen(command.c_str(), "r")) {
        char line[256];
        double seconds = 0;
        while (std::fgets(line, sizeof line, pipe)) {
          if (std::sscanf(line, "prefill 2048 tokens: %lf s", &seconds) == 1) {
            child = child > 0 ? std::min(child, seconds) : seconds;
          }
        }
        pclose(pipe);
      }
    }
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    std::snprintf(buf, sizeof buf,
                  "OpenMP wait: prefill 2048 (chunk 512) %.0f tok/s with OMP_WAIT_POLICY=%s, "
                  "%.0f tok/s with libgomp's default in a child process (x%.2f)",
                  2048 / here, policy ? policy : "(unset)", child > 0 ? 2048 / child : 0.0,
                  child > 0 ? child / here : 0.0);
    emit(buf);
  }

  // 2. malloc tuning: prefill 2048 alternating glibc defaults and the tuned
  // settings, best of 3 each.
  {
    auto decoder = *kvl::Decoder::Create(config, checkpoint.weights, kvl::DecoderOptions());
    auto run = [&] { PrefillInChunks(*decoder, ids_t.narrow(0, 0, 2048), 512); };
    double untuned = 1e300, tuned = 1e300;
    for (int i = 0; i < 3; ++i) {
      MallocDefaults();
      malloc_trim(0);
      untuned = std::min(untuned, Seconds(run));
      kvl::TuneMallocForTensors();
      run();
      tuned = std::min(tuned, Seconds(run));
    }
    std::snprintf(
        buf, sizeof buf,
        "malloc: prefill 2048 (chunk 512) %.0f tok/s with glibc defaults, %.0f tok/s with "
        "TuneMallocForTensors' settings (x%.2f)",
        2048 / untuned, 2048 / tuned, untuned / tuned);
    emit(buf);
  }

  // 3. Prefill chunk size at 2048 tokens.
  emit("");
  emit("prefill chunk sweep, 2048 tokens:");
  emit("| chunk | tokens/s | GEMM GFLOP/s just before | % of GEMM rate |");
  emit("|---|---|---|---|");
  for (int64_t chunk : {128, 256, 512, 1024, 2048}) {
    kvl::RuntimeOptions o;
    o.n_threads = n_threads;
    o.prefill_chunk = chunk;
    auto engine = *kvl::Engine::Create(checkpoint, o);
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 2048);
    auto run = [&] { (void)engine->Prefill(*engine->NewCache(), prompt); };
    run();
    gemm_gflops = gemm_rate();
    const double s = Best(3, run);
    std::snprintf(buf, sizeof buf, "| %lld | %.0f | %.1f | %.1f%% |", (long long)chunk, 2048 / s,
                  gemm_gflops, 100.0 * PrefillFlops(config, 2048) / s / 1e9 / gemm_gflops);
    emit(buf);
  }

  // 3b. Attention query-block size: the scores buffer bound (DecoderOptions::
  // max_scores_bytes) at 2048 tokens, chunk 512.
  emit("");
  emit("attention scores buffer sweep, prefill 2048 tokens in chunks of 512:");
  emit("| max_scores_bytes | query rows per block at 2048 keys | tokens/s | % of GEMM rate |");
  emit("|---|---|---|---|");
  for (int64_t mib : {1, 4, 16, 64}) {
    kvl::DecoderOptions o;
    o.max_scores_bytes = mib << 20;
    auto decoder = *kvl::Decoder::Create(config, checkpoint.weights, o);
    auto run = [&] { PrefillInChunks(*decoder, ids_t.narrow(0, 0, 2048), 512); };
    run();
    gemm_gflops = gemm_rate();
    const double s = Best(3, run);
    std::snprintf(buf, sizeof buf, "| %lld MiB | %lld | %.0f | %.1f%% |", (long long)mib,
                  (long long)std::min<int64_t>(512, o.max_scores_bytes / (config.n_head * 2048 * 4)),
                  2048 / s, 100.0 * PrefillFlops(config, 2048) / s / 1e9 / gemm_gflops);
    emit(buf);
  }

  // 4. Prefill and decode at each context length (default chunk 512).
  kvl::RuntimeOptions options;
  options.n_threads = n_threads;
  auto engine = *kvl::Engine::Create(checkpoint, options);
  emit("");
  std::snprintf(buf, sizeof buf,
                "prefill (chunk %lld) and decode, fp32:", (long long)options.prefill_chunk);
  emit(buf);
  emit(
      "| context T | prefill tok/s | prefill GFLOP/s | GEMM GFLOP/s just before | % of GEMM rate | "
      "decode ms/token at T (median of 16) | cache MiB at T |");
  emit("|---|---|---|---|---|---|---|");
  for (int64_t t : {64, 512, 2048, 8192}) {
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + t);
    std::unique_ptr<kvl::KvCache> cache;
    auto run = [&] {
      cache = engine->NewCache();
      (void)engine->Prefill(*cache, prompt);
    };
    run();
    gemm_gflops = gemm_rate();
    const double s = Best(t >= 8192 ? 2 : 3, run);
    // Decode 16 tokens after a T-token context; median step; roll back after.
    std::vector<double> steps;
    for (int i = 0; i < 16; ++i) {
      steps.push_back(Seconds([&] { (void)engine->Decode(*cache, ids[i]); }));
    }
    std::sort(steps.begin(), steps.end());
    (void)cache->Rollback(t);
    const double gflops = PrefillFlops(config, static_cast<double>(t)) / s / 1e9;
    std::snprintf(buf, sizeof buf, "| %lld | %.0f | %.1f | %.1f | %.1f%% | %.2f | %.1f |",
                  (long long)t, t / s, gflops, gemm_gflops, 100.0 * gflops / gemm_gflops,
                  1e3 * steps[steps.size() / 2], cache->Bytes() / 1048576.0);
    emit(buf);
  }

  // 5. Cache bytes per token for both tap modes.
  emit("");
  emit("KV cache bytes per token (all layers):");
  for (kvl::KeyTapMode mode : {kvl::KeyTapMode::kInvert, kvl::KeyTapMode::kStorePreNorm}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      kvl::DecoderOptions o;
      o.tap_mode = mode;
      o.dtype = dtype;
      auto decoder = *kvl::Decoder::Create(config, checkpoint.weights, o);
      auto cache = decoder->NewCache();
      const int64_t kv_only = 2 * config.n_layer * config.n_head_kv * config.head_dim *
                              static_cast<int64_t>(c10::elementSize(dtype));
      std::snprintf(buf, sizeof buf, "  %-15s %-9s %6lld bytes/token (K+V alone %lld: +%.1f%%)",
                    mode == kvl::KeyTapMode::kInvert ? "invert (1/rms)" : "store pre-norm",
                    dtype == at::kFloat ? "float32" : "bfloat16", (long long)cache->BytesPerToken(),
                    (long long)kv_only, 100.0 * (cache->BytesPerToken() - kv_only) / kv_only);
      emit(buf);
    }
  }
  std::snprintf(
      buf, sizeof buf,
      "FLOPs: prefill(T) = 2*%.2fM*T + 4*D*Hq*L*T(T+1)/2 + 2*E*V (layer matmuls, causal attention, "
      "last-token lm_head)",
      LayerFlopsPerToken(config) / 2 / 1e6);
  emit(buf);

  emit(share.Line());
  if (!out_path.empty() && !emit.WriteTo(out_path)) return 1;
  return 0;
}
