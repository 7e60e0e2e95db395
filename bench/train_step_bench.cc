// train_step_bench: one training step of `kvl train-lm` (ReferenceForward,
// cross-entropy, backward) on the house model shapes, with the eager attention
// and with the grouped attention (training/attention.h), alternating in one run so that
// the ratio between them comes from the same moment. Also times the float32
// forward that `kvl eval` runs, and a step shaped like `kvl distill`'s (the
// model as its own source: 255 prefix + 128 continuation tokens, frozen weights,
// the gradient into the prefix keys and values). Random weights (InitWeights)
// and random tokens: the time does not depend on them.
//
//   train_step_bench [--threads 2] [--batch 8] [--seq-len 512] [--rounds 5]
//                    [--block 128] [--config models/configs/kvl-large.json ...]
//                    [--out FILE]
// --block: GroupedAttention's block of queries (kDefaultAttentionBlock).
// --trace PREFIX: also one bf16-autocast step of each kind under LibTorch's
// profiler, written as Chrome traces PREFIX.<model>.{eager,grouped}.json
// (per-operator self times: bench/trace_ops.py FILE).
#include <ATen/ATen.h>
#include <malloc.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/flags.h"
#include "bench/bench_timing.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/omp_wait.h"
#include "model/reference.h"
#include "training/attention.h"
#include "training/train_lm.h"

namespace {

using kvl::bench::Seconds;

enum class Mode { kBf16Step, kFloat32Step, kFloat32Forward, kDistillStep };

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kBf16Step:
      return "bf16-autocast step";
    case Mode::kFloat32Step:
      return "float32 step";
    case Mode::kFloat32Forward:
      return "float32 forward";
    case Mode::kDistillStep:
      return "distill step (float32)";
  }
  return "?";
}

constexpr int64_t kDistillPrefix = 255, kDistillContinuation = 128;  // kvl distill's defaults

// A copy of weights that does not require gradients (kvl distill's models).
kvl::ModelWeights Frozen(const kvl::ModelConfig& config, const kvl::ModelWeights& weights) {
  std::map<std::string, at::Tensor> named = weights.Named(config);
  for (auto& [name, t] : named) t = t.detach().clone();
  return kvl::ModelWeights::FromNamed(config, std::move(named)).value();
}

// kvl distill's DistillKl with the model as source and target and no maps
// (their products are small next to the three forwards): the teacher on the
// window and the source on the prefix without a gradient, then the student on
// the continuation from the source's prefix, backward into that prefix.
void DistillStep(const kvl::ModelConfig& config, const kvl::ModelWeights& frozen,
                 const at::Tensor& inputs, const kvl::ReferenceOptions& options) {
  const int64_t n_prefix = kDistillPrefix, n_cont = kDistillContinuation;
  const at::Tensor ids = inputs.narrow(1, 0, n_prefix + n_cont);
  at::Tensor teacher_logp;
  kvl::ReferenceOutput source;
  {
    at::NoGradGuard no_grad;
    teacher_logp = at::log_softmax(
        kvl::ReferenceForward(config, frozen, ids, options).logits.narrow(1, n_prefix, n_cont), -1);
    kvl::ReferenceOptions capture = options;
    capture.capture_kv = true;
    capture.last_logits_only = true;
    source = kvl::ReferenceForward(config, frozen, ids.narrow(1, 0, n_prefix), capture);
  }
  kvl::ReferenceOptions student = options;
  for (size_t il = 0; il < source.keys_prenorm.size(); ++il) {
    student.prefix_keys.push_back(source.keys_prenorm[il].detach().requires_grad_(true));
    student.prefix_values.push_back(source.values[il].detach().requires_grad_(true));
  }
  const at::Tensor student_logp = at::log_softmax(
      kvl::ReferenceForward(config, frozen, ids.narrow(1, n_prefix, n_cont), student).logits, -1);
  (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1).mean().backward();
}

// One step as train-lm runs it: autocast on for the forward only, float32
// logits into the cross-entropy, backward into float32 master weights.
double Step(const kvl::ModelConfig& config, const kvl::ModelWeights& weights,
            const kvl::ModelWeights& frozen, const std::vector<at::Tensor>& params,
            const at::Tensor& inputs, const at::Tensor& targets, Mode mode, bool grouped,
            int64_t block) {
  kvl::ReferenceOptions options;
  if (grouped) options.attention = kvl::training::GroupedAttention(block);
  return Seconds([&] {
    if (mode == Mode::kDistillStep) {
      DistillStep(config, frozen, inputs, options);
      return;
    }
    if (mode == Mode::kFloat32Forward) {
      at::NoGradGuard no_grad;
      kvl::ReferenceForward(config, weights, inputs, options);
      return;
    }
    at::Tensor logits;
    if (mode == Mode::kBf16Step) {
      kvl::training::Bf16AutocastScope autocast;
      logits = kvl::ReferenceForward(config, weights, inputs, options).logits;
    } else {
      logits = kvl::ReferenceForward(config, weights, inputs, options).logits;
    }
    at::cross_entropy_loss(logits.reshape({-1, config.vocab_size}), targets.reshape({-1}))
        .backward();
    for (const at::Tensor& p : params) p.mutable_grad().reset();
  });
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  kvl::ReexecWithPassiveOpenMpWait(argv);
  int n_threads = 2, rounds = 5;
  int64_t batch = 8, seq_len = 512, block = kvl::training::kDefaultAttentionBlock;
  std::vector<std::string> configs;
  std::string out_path, trace_prefix;
  kvl::FlagSet flags("train_step_bench",
                     "Times training steps with the eager and the grouped attention, alternating\n"
                     "in one run (docs/training.md). Default configs: the house models'.");
  flags.Add("threads", &n_threads, "N", "intra-op threads");
  flags.Add("batch", &batch, "B", "windows per step");
  flags.Add("seq-len", &seq_len, "T", "tokens per window");
  flags.Add("rounds", &rounds, "R", "alternating rounds");
  flags.Add("block", &block, "N", "the grouped attention's block of queries");
  flags.Add("config", &configs, "FILE", "a model config.json");
  flags.Add("out", &out_path, "FILE", "also write the report here");
  flags.Add("trace", &trace_prefix, "PREFIX", "Chrome traces of one step each");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  if (configs.empty()) configs = {"models/configs/kvl-small.json", "models/configs/kvl-large.json"};
  if (batch < 1 || seq_len < 2 || rounds < 1 || block < 1) {
    return flags.UsageError("--batch, --seq-len, --rounds and --block must be positive");
  }
  // As train-lm sets them up (training/train_lm.cc).
  n_threads = kvl::training::SetIntraOpThreads(n_threads);
  kvl::TuneMallocForTensors();
  mallopt(M_MMAP_MAX, 0);

  kvl::bench::Report emit;
  const kvl::bench::MachineShare share;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "# train_step_bench: batch %lld x %lld tokens, %d intra-op threads, %d rounds "
                "(eager and grouped alternating; 1 warm-up each), grouped in query blocks of %lld",
                static_cast<long long>(batch), static_cast<long long>(seq_len), n_threads, rounds,
                static_cast<long long>(block));
  emit(buf);
  emit("| model | what | eager s median (min) | grouped s median (min) | speed-up (medians) |");
  emit("|---|---|---|---|---|");
  for (const std::string& path : configs) {
    const absl::StatusOr<kvl::ModelConfig> config = kvl::ModelConfig::FromFile(path);
    if (!config.ok()) {
      std::fprintf(stderr, "train_step_bench: %s\n", config.status().ToString().c_str());
      return 1;
    }
    const kvl::ModelWeights weights = kvl::InitWeights(*config, 1);
    const kvl::ModelWeights frozen = Frozen(*config, weights);
    std::vector<at::Tensor> params = weights.All();
    for (at::Tensor& p : params) p.requires_grad_(true);
    const at::Tensor window = at::randint(0, config->vocab_size, {batch, seq_len + 1}, at::kLong);
    const at::Tensor inputs = window.narrow(1, 0, seq_len);
    const at::Tensor targets = window.narrow(1, 1, seq_len);
    const std::string name = std::filesystem::path(path).stem().string();
    for (Mode mode :
         {Mode::kBf16Step, Mode::kFloat32Step, Mode::kFloat32Forward, Mode::kDistillStep}) {
      if (mode == Mode::kDistillStep && seq_len < kDistillPrefix + kDistillContinuation) continue;
      std::vector<double> eager, grouped;
      Step(*config, weights, frozen, params, inputs, targets, mode, false, block);
      Step(*config, weights, frozen, params, inputs, targets, mode, true, block);
      for (int r = 0; r < rounds; ++r) {
        eager.push_back(
            Step(*config, weights, frozen, params, inputs, targets, mode, false, block));
        grouped.push_back(
            Step(*config, weights, frozen, params, inputs, targets, mode, true, block));
      }
      std::snprintf(buf, sizeof buf, "| %s | %s | %.3f (%.3f) | %.3f (%.3f) | %.2fx |",
                    name.c_str(), ModeName(mode), Median(eager),
                    *std::min_element(eager.begin(), eager.end()), Median(grouped),
                    *std::min_element(grouped.begin(), grouped.end()),
                    Median(eager) / Median(grouped));
      emit(buf);
    }
    for (bool grouped : {false, true}) {
      if (trace_prefix.empty()) break;
      const std::string file =
          trace_prefix + "." + name + (grouped ? ".grouped" : ".eager") + ".json";
      torch::autograd::profiler::RecordProfile profile(file);
      Step(*config, weights, frozen, params, inputs, targets, Mode::kBf16Step, grouped, block);
    }
  }
  emit(share.Line());
  if (!out_path.empty() && !emit.WriteTo(out_path)) return 1;
  return 0;
}
