// batch_step_bench: the time of one batched decode step (Decoder::ForwardBatch
// with R rows of one token each, every row on its own cache line of L tokens)
// against R, on a real model directory, one intra-op thread as the server's
// engine loops run. It isolates the model's share of continuous batching from
// gRPC, sampling and the client (bench/load_bench.py measures the whole).
//
//   batch_step_bench [--model models/kvl-large] [--history 32,128,512]
//                    [--rows 1,2,4,8,16,32] [--steps 40] [--out FILE]
//
//                    [--compare attention|matvec] [--dtype float32|bfloat16]
//                    [--threads 1] [--limits] [--device cpu|cuda[:N]]
//
// Each cell: every line filled with L tokens (random keys and values), then
// `steps` decode steps;
// the step time is the median (the machine is shared). tok/s = R / step.
// Two ways of running a step are timed in the same run, step by step in turns,
// so that their ratio is measured at one moment: --compare attention (the
// default) sets decode attention as per-head GEMMs against the loops over the
// lines' memory (DecoderOptions::raw_decode_attention); --compare matvec sets
// one-token steps' projections as 1-row GEMMs against matrix-vector products
// (DecoderOptions::matrix_vector_decode). The second of each pair is the
// default.
//
// --limits adds what the machine can do, measured in the same run: its read
// bandwidth and its GEMM rate at the model's shapes (the gate/up projection
// with R rows, and a 2048-row prefill chunk) in float32 and bfloat16; each
// cell's default path is then given as a fraction of its limit, the longer of
// two times: the bytes a step must read (every weight once, plus the lines'
// keys and values) over the bandwidth, and the projections' FLOPs at the
// prefill-chunk GEMM rate (one row is bound by the first, many by the second).
// --device puts the weights and lines on a GPU (scripts/gpu_check.sh): each
// step is timed to the end of the device's work, and the limits are the
// device's (its memory's read bandwidth, its GEMM rates).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "bench/bench_timing.h"
#include "model/checkpoint.h"
#include "model/decoder.h"
#include "model/engine.h"
#include "model/omp_wait.h"

namespace {

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      std::fprintf(stderr, "not a positive number: %s\n", std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  kvl::ReexecWithPassiveOpenMpWait(argv);
  std::string model = "models/kvl-large", history_list = "32,128,512",
              rows_list = "1,2,4,8,16,32", out_path, compare = "attention", dtype_name = "float32",
              device_name = "cpu";
  int steps = 40, threads = 1;
  bool limits = false;
  kvl::FlagSet flags("batch_step_bench",
                     "Times one batched decode step against the number of rows.");
  flags.Add("model", &model, "DIR", "model directory");
  flags.Add("history", &history_list, "L,...", "tokens already in each line");
  flags.Add("rows", &rows_list, "R,...", "rows (sessions) per step");
  flags.Add("steps", &steps, "N", "decode steps per cell");
  flags.Choice("compare", &compare, {"attention", "matvec"}, "the two paths timed in turns");
  flags.Choice("dtype", &dtype_name, {"float32", "bfloat16"}, "the model's runtime dtype");
  flags.Add("threads", &threads, "N", "intra-op threads (the server's engine loops use 1)");
  flags.Add("device", &device_name, "D", "cpu (default) or cuda[:N]: the weights' and lines' device");
  flags.Switch("limits", &limits, "also measure bandwidth and GEMM rates, give fractions");
  flags.Add("out", &out_path, "FILE", "also write the table here");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  const at::ScalarType dtype = dtype_name == "float32" ? at::kFloat : at::kBFloat16;
  const at::Device device(device_name);
  at::set_num_threads(std::max(threads, 1));
  kvl::TuneMallocForTensors();
  std::optional<absl::StatusOr<kvl::Checkpoint>> checkpoint(kvl::LoadCheckpoint(model));
  if (!checkpoint->ok()) {
    std::fprintf(stderr, "%s\n", checkpoint->status().ToString().c_str());
    return 1;
  }
  const kvl::ModelConfig config = (*checkpoint)->config;
  // The same weights twice, the first path then the second (the default).
  std::vector<std::unique_ptr<kvl::Decoder>> decoders;
  for (bool second : {false, true}) {
    kvl::DecoderOptions options;
    options.dtype = dtype;
    options.device = device_name;
    if (compare == "attention") options.raw_decode_attention = second;
    if (compare == "matvec") options.matrix_vector_decode = second;
    absl::StatusOr<std::unique_ptr<kvl::Decoder>> decoder =
        kvl::Decoder::Create(config, (*checkpoint)->weights, options);
    if (!decoder.ok()) {
      std::fprintf(stderr, "%s\n", decoder.status().ToString().c_str());
      return 1;
    }
    decoders.push_back(*std::move(decoder));
  }
  checkpoint.reset();  // the decoders hold what they need; a real model is GBs
  c10::InferenceMode inference;
  const int64_t vocab = config.vocab_size;
  const double e = config.hidden_size, f = config.intermediate_size, d = config.head_dim;
  // Multiply-adds of one token through the projections and the head, which
  // is also the number of weights a step reads once.
  const double weights_per_token =
      config.n_layer * (e * (config.n_head + 2 * config.n_head_kv) * d + config.n_head * d * e +
                        3 * e * f) +
      e * vocab;
  const double dtype_bytes = dtype == at::kFloat ? 4 : 2;
  kvl::bench::Report emit;
  emit(absl::StrFormat("batch_step_bench: %s, %s on %s, %d intra-op thread%s, median of %d steps",
                       model, dtype_name, device_name, threads, threads == 1 ? "" : "s", steps));
  emit(absl::StrFormat("%d layers, hidden %d, %.0fM weights in the projections and head (%.2f GB)",
                       config.n_layer, config.hidden_size, weights_per_token / 1e6,
                       weights_per_token * dtype_bytes / 1e9));
  const char* names[2];
  if (compare == "attention") {
    emit("decode attention: tensor = per-head GEMMs, raw = ops::DecodeAttention (default)");
    names[0] = "tensor";
    names[1] = "raw";
  } else {
    emit("one-token steps' projections: gemm = 1-row GEMMs, matvec = at::mv (default)");
    names[0] = "gemm";
    names[1] = "matvec";
  }
  double bandwidth = 0, prefill_gemm = 0;
  if (limits) {
    // OpenBLAS runs its own threads whatever LibTorch's count: the limit is
    // the bandwidth of every core.
    if (device.is_cpu()) {
      const double one_thread = kvl::bench::ReadBandwidth();
      at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
      bandwidth = std::max(one_thread, kvl::bench::ReadBandwidth());
      at::set_num_threads(std::max(threads, 1));
      emit(absl::StrFormat("limits: read bandwidth %.1f GB/s on one thread, %.1f on all %u",
                           one_thread, bandwidth, std::thread::hardware_concurrency()));
    } else {
      bandwidth = kvl::bench::ReadBandwidth(int64_t{4} << 30, device);
      emit(absl::StrFormat("limits: %s read bandwidth %.1f GB/s", device_name, bandwidth));
    }
    std::string rates = "limits: GEMM GFLOP/s, [R, hidden] x [hidden, 2 x intermediate]:";
    std::vector<int64_t> gemm_rows = ParseList(rows_list);
    gemm_rows.push_back(2048);
    for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
      absl::StrAppend(&rates, t == at::kFloat ? "\n  float32 " : "\n  bfloat16");
      for (int64_t r : gemm_rows) {
        const double rate = kvl::bench::GemmRate(r, config.hidden_size,
                                                 2 * config.intermediate_size, t, device)
                                .Measure();
        if (r == 2048 && t == dtype) prefill_gemm = rate;
        absl::StrAppendFormat(&rates, "  R=%d %.1f", r, rate);
      }
    }
    emit(rates);
    emit(absl::StrFormat("limit of a step: the longer of (weight bytes + line bytes) over %.1f "
                         "GB/s and 2 x weights x R FLOPs at %.1f GFLOP/s (R=2048)",
                         bandwidth, prefill_gemm));
  }
  emit(absl::StrFormat("                   ---- %6s path ----   ---- %6s path ----", names[0],
                       names[1]));
  emit(std::string("history  rows    step ms   tok/s vs 1 row    step ms   tok/s vs 1 row   ") +
       names[1] + "/" + names[0] + " tok/s" + (limits ? "   of limit" : ""));
  for (int64_t history : ParseList(history_list)) {
    double one_row_rate[2] = {0, 0};
    for (int64_t n_rows : ParseList(rows_list)) {
      std::vector<std::unique_ptr<kvl::KvCache>> lines[2];
      for (int path = 0; path < 2; ++path) {
        for (int64_t r = 0; r < n_rows; ++r) {
          // Random keys and values: a step's time does not depend on them,
          // and a real model's prefill of R lines would take minutes.
          lines[path].push_back(decoders[path]->NewCache());
          const at::Tensor kv = at::randn(
              {config.n_layer, config.n_head_kv, history, config.head_dim},
              at::TensorOptions().device(device));
          if (absl::Status s = lines[path].back()->Accept(kv, kv); !s.ok()) {
            std::fprintf(stderr, "%s\n", s.ToString().c_str());
            return 1;
          }
        }
      }
      std::vector<double> times[2];
      for (int s = 0; s < steps + 3; ++s) {
        for (int path = 0; path < 2; ++path) {
          std::vector<kvl::Decoder::Row> rows;
          for (auto& line : lines[path]) {
            rows.push_back({line.get(), at::randint(vocab, {1}, at::kLong), false});
          }
          const double t =
              kvl::bench::Seconds([&] { decoders[path]->ForwardBatch(rows); }, device);
          if (s >= 3) times[path].push_back(t);  // the first steps warm the allocator
        }
      }
      std::string line = absl::StrFormat("%7d %5d", history, n_rows);
      double rate[2], step[2];
      for (int path = 0; path < 2; ++path) {
        step[path] = Median(times[path]);
        rate[path] = n_rows / step[path];
        if (n_rows == 1) one_row_rate[path] = rate[path];
        absl::StrAppendFormat(&line, " %10.3f %7.1f %6.2fx", step[path] * 1e3, rate[path],
                              rate[path] / one_row_rate[path]);
      }
      absl::StrAppendFormat(&line, "   %15.2fx", rate[1] / rate[0]);
      if (limits) {
        // The bound a step cannot beat (a roofline): reading the weights
        // once and every line, or their arithmetic at the best GEMM rate,
        // whichever takes longer.
        const double line_bytes = 2.0 * config.n_layer * config.n_head_kv * d * (history + 1) *
                                  dtype_bytes * n_rows;
        const double bound =
            std::max((weights_per_token * dtype_bytes + line_bytes) / (bandwidth * 1e9),
                     2.0 * weights_per_token * n_rows / (prefill_gemm * 1e9));
        absl::StrAppendFormat(&line, "   %8.0f%%", 100.0 * bound / step[1]);
      }
      emit(line);
    }
  }
  if (!out_path.empty() && !emit.WriteTo(out_path)) return 1;
  return 0;
}
