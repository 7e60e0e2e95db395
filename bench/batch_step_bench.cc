// batch_step_bench: the time of one batched decode step (Decoder::ForwardBatch
// with R rows of one token each, every row on its own cache line of L tokens)
// against R, on a real model directory, one intra-op thread as the server's
// engine loops run. It isolates the model's share of continuous batching from
// gRPC, sampling and the client (bench/load_bench.py measures the whole).
//
//   batch_step_bench [--model models/kvl-large] [--history 32,128,512]
//                    [--rows 1,2,4,8,16,32] [--steps 40] [--out FILE]
//
// Each cell: every line prefilled to L tokens, then `steps` decode steps;
// the step time is the median (the machine is shared). tok/s = R / step.
// Both decode attention paths are timed in the same run, step by step in turns,
// so that their ratio is measured at one moment.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
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
              rows_list = "1,2,4,8,16,32", out_path;
  int steps = 40;
  kvl::FlagSet flags("batch_step_bench",
                     "Times one batched decode step against the number of rows.");
  flags.Add("model", &model, "DIR", "model directory");
  flags.Add("history", &history_list, "L,...", "tokens already in each line");
  flags.Add("rows", &rows_list, "R,...", "rows (sessions) per step");
  flags.Add("steps", &steps, "N", "decode steps per cell");
  flags.Add("out", &out_path, "FILE", "also write the table here");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  at::set_num_threads(1);
  kvl::TuneMallocForTensors();
  absl::StatusOr<kvl::Checkpoint> checkpoint = kvl::LoadCheckpoint(model);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "%s\n", checkpoint.status().ToString().c_str());
    return 1;
  }
  // The same weights twice: decode attention as loops over the lines' memory
  // (the default) and as per-head GEMMs (the tensor path), timed in turns.
  std::vector<std::unique_ptr<kvl::Decoder>> decoders;
  for (bool raw : {false, true}) {
    kvl::DecoderOptions options;
    options.raw_decode_attention = raw;
    absl::StatusOr<std::unique_ptr<kvl::Decoder>> decoder =
        kvl::Decoder::Create(checkpoint->config, checkpoint->weights, options);
    if (!decoder.ok()) {
      std::fprintf(stderr, "%s\n", decoder.status().ToString().c_str());
      return 1;
    }
    decoders.push_back(*std::move(decoder));
  }
  c10::InferenceMode inference;
  const int64_t vocab = checkpoint->config.vocab_size;
  kvl::bench::Report emit;
  emit(absl::StrFormat("batch_step_bench: %s, float32, 1 intra-op thread, median of %d steps",
                       model, steps));
  emit("decode attention: tensor = per-head GEMMs, raw = ops::DecodeAttention (default)");
  emit("                   ---- tensor path ----   ------ raw path -----");
  emit("history  rows    step ms   tok/s vs 1 row    step ms   tok/s vs 1 row   raw/tensor tok/s");
  for (int64_t history : ParseList(history_list)) {
    double one_row_rate[2] = {0, 0};
    for (int64_t n_rows : ParseList(rows_list)) {
      std::vector<std::unique_ptr<kvl::KvCache>> lines[2];
      for (int path = 0; path < 2; ++path) {
        for (int64_t r = 0; r < n_rows; ++r) {
          lines[path].push_back(decoders[path]->NewCache());
          decoders[path]->Forward(*lines[path].back(), at::randint(vocab, {history}, at::kLong),
                                  false);
        }
      }
      std::vector<double> times[2];
      for (int s = 0; s < steps + 3; ++s) {
        for (int path = 0; path < 2; ++path) {
          std::vector<kvl::Decoder::Row> rows;
          for (auto& line : lines[path]) {
            rows.push_back({line.get(), at::randint(vocab, {1}, at::kLong), false});
          }
          const double t = kvl::bench::Seconds([&] { decoders[path]->ForwardBatch(rows); });
          if (s >= 3) times[path].push_back(t);  // the first steps warm the allocator
        }
      }
      std::string line = absl::StrFormat("%7d %5d", history, n_rows);
      double rate[2];
      for (int path = 0; path < 2; ++path) {
        const double step = Median(times[path]);
        rate[path] = n_rows / step;
        if (n_rows == 1) one_row_rate[path] = rate[path];
        absl::StrAppendFormat(&line, " %10.3f %7.0f %6.2fx", step * 1e3, rate[path],
                              rate[path] / one_row_rate[path]);
      }
      absl::StrAppendFormat(&line, "   %15.2fx", rate[1] / rate[0]);
      emit(line);
    }
  }
  if (!out_path.empty() && !emit.WriteTo(out_path)) return 1;
  return 0;
}
