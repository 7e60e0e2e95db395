#include "training/train_lm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/files.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/reference.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "training/attention.h"
#include "training/eval_lm.h"
#include "training/jsonl_log.h"
#include "training/plot.h"
#include "training/progress.h"

namespace kvl::training {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kStateDir[] = "train_state";
constexpr char kStateJson[] = "state.json";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kLogFile[] = "train_log.jsonl";
constexpr char kPlotFile[] = "loss.png";
constexpr char kSummaryFile[] = "summary.json";

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// splitmix64: a counter-based generator, so batch (seed, step) needs no state.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct TokenizerFiles {
  std::string json_path;
  std::string config_path;  // empty when there is none next to it
};

TokenizerFiles ResolveTokenizer(const std::string& path) {
  TokenizerFiles files;
  files.json_path = fs::is_directory(path) ? (fs::path(path) / "tokenizer.json").string() : path;
  const fs::path sibling = fs::path(files.json_path).parent_path() / "tokenizer_config.json";
  if (fs::exists(sibling)) files.config_path = sibling.string();
  return files;
}

absl::StatusOr<std::vector<int32_t>> TokenizeFile(const Tokenizer& tokenizer,
                                                  const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  return tokenizer.Encode(*text, /*parse_special=*/true);
}

// The settings a resumed run must share with the run it continues: anything
// that changes the batches, the schedule or the update rule.
json RunIdentity(const TrainOptions& o, const ModelConfig& config, const std::string& tokenizer_hash,
                 int64_t n_train_tokens, const std::string& init_hash) {
  json identity{{"seed", o.seed},
                {"init_from_sha256", init_hash},
                {"steps", o.n_steps},
                {"batch", o.batch},
                {"seq_len", o.seq_len},
                {"align_to_conversations", o.align_to_conversations},
                {"assistant_weight", o.assistant_weight},
                {"lr", o.lr},
                {"warmup", o.warmup},
                {"min_lr_ratio", o.min_lr_ratio},
                {"weight_decay", o.weight_decay},
                {"betas", {o.beta1, o.beta2}},
                {"eps", o.eps},
                {"clip", o.clip},
                {"model_config", config.ToJson()},
                {"tokenizer_sha256", tokenizer_hash},
                {"train_tokens", n_train_tokens}};
  // Only when set, so that runs from before the option keep their identity.
  if (o.router_aux_loss > 0) identity["router_aux_loss"] = o.router_aux_loss;
  return identity;
}

struct Param {
  std::string name;
  at::Tensor value;       // float32 master weight, requires grad
  at::Tensor exp_avg;     // AdamW first moment
  at::Tensor exp_avg_sq;  // AdamW second moment
  bool decay = false;     // matrices only
};

}  // namespace

at::Tensor LoadBalancingLoss(const std::vector<at::Tensor>& probs,
                             const std::vector<at::Tensor>& experts, int64_t n_expert) {
  const at::Tensor all_probs = at::cat(probs, 0);      // [L*N, E]
  const at::Tensor all_experts = at::cat(experts, 0);  // [L*N, k]
  const at::Tensor chosen = at::one_hot(all_experts, n_expert).to(at::kFloat);  // [L*N, k, E]
  const at::Tensor tokens_per_expert = chosen.mean(0);  // [k, E]
  const at::Tensor prob_per_expert = all_probs.mean(0);  // [E]
  return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * static_cast<double>(n_expert);
}

namespace {

double StepLossMean(const std::vector<StepRecord>& log, size_t last_n) {
  if (log.empty()) return 0;
  const size_t n = std::min(last_n, log.size());
  double sum = 0;
  for (size_t i = log.size() - n; i < log.size(); ++i) sum += log[i].loss;
  return sum / static_cast<double>(n);
}

json StepJson(const StepRecord& r) {
  json j = {{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
            {"tokens_per_s", r.tokens_per_s}};
  if (r.valid_loss >= 0) j["valid_loss"] = r.valid_loss;
  if (r.router_aux >= 0) j["router_aux"] = r.router_aux;
  return j;
}

// Keeps the log lines of steps <= last_step (a resumed run rewrites the rest)
// and returns their records.
absl::StatusOr<std::vector<StepRecord>> TrimLog(const fs::path& path, int64_t last_step) {
  std::vector<StepRecord> records;
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step")) continue;
    StepRecord r;
    r.step = j.value("step", int64_t{0});
    if (r.step > last_step) continue;
    r.loss = j.value("loss", 0.0);
    r.lr = j.value("lr", 0.0);
    r.grad_norm = j.value("grad_norm", 0.0);
    r.tokens_per_s = j.value("tokens_per_s", 0.0);
    r.valid_loss = j.value("valid_loss", -1.0);
    records.push_back(r);
    absl::StrAppend(&kept, line, "\n");
  }
  KVL_RETURN_IF_ERROR(WriteTextFile(path.string(), kept));
  return records;
}

absl::Status PlotLoss(const fs::path& out_dir, const std::vector<StepRecord>& history,
                      double initial_valid) {
  PlotSeries train{"train loss (per step)", {}, false};
  PlotSeries smooth{"train loss (trailing mean of 20)", {}, false};
  PlotSeries valid{"valid loss (fp32)", {}, true};
  if (initial_valid >= 0) valid.points.emplace_back(0, initial_valid);
  double window_sum = 0;
  for (size_t i = 0; i < history.size(); ++i) {
    const StepRecord& r = history[i];
    train.points.emplace_back(r.step, r.loss);
    window_sum += r.loss;
    if (i >= 20) window_sum -= history[i - 20].loss;
    smooth.points.emplace_back(r.step, window_sum / std::min<double>(i + 1, 20));
    if (r.valid_loss >= 0) valid.points.emplace_back(r.step, r.valid_loss);
  }
  PlotSpec spec;
  spec.title = absl::StrCat("kvl train-lm: ", out_dir.filename().string());
  spec.x_label = "step";
  spec.y_label = "cross-entropy (nats/token)";
  spec.series = {train, smooth, valid};
  return PlotLines(spec, (out_dir / kPlotFile).string());
}

}  // namespace

int SetIntraOpThreads(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(n_threads);
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(n_threads);
  }
  return n_threads;
}

Bf16AutocastScope::Bf16AutocastScope() : dtype_before_(at::autocast::get_autocast_cpu_dtype()) {
  TORCH_CHECK(!at::autocast::is_cpu_enabled(), "Bf16AutocastScope: autocast is already on");
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::set_cpu_enabled(true);
}

Bf16AutocastScope::~Bf16AutocastScope() {
  at::autocast::set_cpu_enabled(false);
  at::autocast::clear_cache();
  at::autocast::set_autocast_cpu_dtype(dtype_before_);
}

double LearningRate(const TrainOptions& o, int64_t step) {
  if (o.warmup > 0 && step <= o.warmup) {
    return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup);
  }
  const double span = static_cast<double>(std::max<int64_t>(o.n_steps - o.warmup, 1));
  const double progress = std::clamp(static_cast<double>(step - o.warmup) / span, 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine);
}

std::vector<int64_t> BatchOffsets(uint64_t seed, int64_t step, int64_t batch, int64_t seq_len,
                                  int64_t n_tokens) {
  // Windows of seq_len + 1 tokens start anywhere in [0, n_tokens - seq_len - 1].
  const uint64_t n_starts = static_cast<uint64_t>(n_tokens - seq_len);
  std::vector<int64_t> offsets(batch);
  const uint64_t base = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(step)));
  for (int64_t b = 0; b < batch; ++b) {
    // The modulo bias is below n_starts / 2^64: negligible.
    offsets[b] = static_cast<int64_t>(SplitMix64(base + static_cast<uint64_t>(b)) % n_starts);
  }
  return offsets;
}

std::vector<int64_t> BatchOffsets(uint64_t seed, int64_t step, int64_t batch,
                                  const std::vector<int64_t>& starts) {
  std::vector<int64_t> offsets(batch);
  const uint64_t base = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(step)));
  for (int64_t b = 0; b < batch; ++b) {
    offsets[b] = starts[SplitMix64(base + static_cast<uint64_t>(b)) % starts.size()];
  }
  return offsets;
}

std::vector<ChatRoleLine> ChatRoleLines(const Tokenizer& tokenizer,
                                        const std::vector<int32_t>& tokens) {
  std::vector<ChatRoleLine> lines;
  const std::optional<int32_t> im_start = tokenizer.AddedTokenId("<|im_start|>");
  const std::optional<int32_t> im_end = tokenizer.AddedTokenId("<|im_end|>");
  if (!im_start || !im_end) return lines;
  const size_t n = tokens.size();
  for (size_t p = 0; p < n; ++p) {
    if (tokens[p] != *im_start) continue;
    // The role line: tokens up to and including the first one whose text ends
    // the line (a role is a handful of tokens; give up after 8).
    std::string role;
    size_t q = p + 1;
    for (; q < n && q <= p + 8 && tokens[q] != *im_end && tokens[q] != *im_start; ++q) {
      role += tokenizer.Decode(absl::Span<const int32_t>(&tokens[q], 1));
      if (role.find('\n') != std::string::npos) break;
    }
    if (q >= n || q > p + 8 || role.find('\n') == std::string::npos) continue;
    lines.push_back({static_cast<int64_t>(p), static_cast<int64_t>(q),
                     role.substr(0, role.find('\n'))});
    p = q;
  }
  return lines;
}

std::vector<uint8_t> AssistantTokenMask(const Tokenizer& tokenizer,
                                        const std::vector<int32_t>& tokens) {
  std::vector<uint8_t> mask(tokens.size(), 0);
  const std::optional<int32_t> im_start = tokenizer.AddedTokenId("<|im_start|>");
  const std::optional<int32_t> im_end = tokenizer.AddedTokenId("<|im_end|>");
  if (!im_start || !im_end) return mask;
  for (const ChatRoleLine& line : ChatRoleLines(tokenizer, tokens)) {
    if (line.role != "assistant") continue;
    // Content bytes that share the newline's token are rare (the pre-tokenizer
    // splits newlines off); the mask starts after it.
    for (size_t r = static_cast<size_t>(line.end) + 1;
         r < tokens.size() && tokens[r] != *im_start; ++r) {
      mask[r] = 1;
      if (tokens[r] == *im_end) break;
    }
  }
  return mask;
}

std::vector<int64_t> ConversationStarts(const Tokenizer& tokenizer,
                                        const std::vector<int32_t>& tokens, int64_t seq_len) {
  std::vector<int64_t> starts;
  const std::optional<int32_t> im_start = tokenizer.AddedTokenId("<|im_start|>");
  if (!im_start) return starts;
  const int64_t last = static_cast<int64_t>(tokens.size()) - seq_len - 1;
  for (int64_t p = 0; p <= last; ++p) {
    if (tokens[p] != *im_start) continue;
    if (p > 0) {
      // Two tokens of text suffice: the separator is "<|im_end|>\n\n".
      const int64_t from = std::max<int64_t>(p - 2, 0);
      const std::string before = tokenizer.Decode(
          absl::Span<const int32_t>(tokens.data() + from, static_cast<size_t>(p - from)));
      if (!absl::EndsWith(before, "\n\n")) continue;
    }
    starts.push_back(p);
  }
  return starts;
}

absl::StatusOr<TrainResult> TrainLm(const TrainOptions& o) {
  const Clock::time_point t_start = Clock::now();
  if (o.n_steps <= 0 || o.batch <= 0 || o.seq_len <= 0) {
    return absl::InvalidArgumentError("steps, batch and seq-len must be positive");
  }
  if (!(o.lr > 0) || o.warmup < 0 || o.min_lr_ratio < 0 || o.min_lr_ratio > 1 ||
      !(o.assistant_weight > 0) || o.weight_decay < 0 || o.eval_every < 0 || o.checkpoint_every < 0 || o.stop_after < 0 ||
      o.eval_tokens <= 0) {
    return absl::InvalidArgumentError(
        "need lr > 0, assistant-weight > 0, warmup >= 0, 0 <= min-lr-ratio <= 1, weight-decay >= 0, eval-tokens > 0 "
        "and non-negative eval-every, checkpoint-every, stop-after");
  }
  if (o.out_dir.empty()) return absl::InvalidArgumentError("an output directory is required");
  if (o.router_aux_loss < 0) return absl::InvalidArgumentError("router-aux-loss must be >= 0");

  absl::StatusOr<ModelConfig> loaded_config = ModelConfig::FromFile(o.config_path);
  if (!loaded_config.ok()) return loaded_config.status();
  ModelConfig config = *std::move(loaded_config);
  if (o.seq_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq-len ", o.seq_len, " exceeds max_position_embeddings ",
                     config.max_position_embeddings, " of ", o.config_path));
  }
  if (o.router_aux_loss > 0 && config.n_expert == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "router-aux-loss needs a mixture of experts; ", o.config_path, " has no num_experts"));
  }

  const TokenizerFiles tok_files = ResolveTokenizer(o.tokenizer_path);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromFile(tok_files.json_path);
  if (!tokenizer.ok()) return tokenizer.status();
  if ((*tokenizer)->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer has ", (*tokenizer)->vocab_size(), " tokens but ",
                     o.config_path, " has vocab_size ", config.vocab_size));
  }
  // A chat model stops at <|im_end|>: make it the end-of-sequence token of the
  // written config when the given one names none (Qwen3's configs do the same).
  if (config.eos_token_ids.empty()) {
    if (std::optional<int32_t> im_end = (*tokenizer)->AddedTokenId("<|im_end|>")) {
      config.eos_token_ids = {*im_end};
    }
  }

  const int n_threads = SetIntraOpThreads(o.n_threads);
  TuneMallocForTensors();
  // Training allocates tensors above glibc's largest mmap threshold (32 MiB;
  // the logits alone are B*T*V*4 bytes, 64 MiB at 8x512x4096), which
  // TuneMallocForTensors cannot keep on the heap: every step would map fresh
  // zeroed pages and fault them in. Serve everything from the heap instead.
  mallopt(M_MMAP_MAX, 0);

  absl::StatusOr<std::vector<int32_t>> train_tokens = TokenizeFile(**tokenizer, o.train_path);
  if (!train_tokens.ok()) return train_tokens.status();
  const int64_t n_train = static_cast<int64_t>(train_tokens->size());
  if (n_train < o.seq_len + 2) {
    return absl::InvalidArgumentError(absl::StrCat(o.train_path, " has ", n_train,
                                                   " tokens, fewer than one window of ",
                                                   o.seq_len + 1, " plus one"));
  }
  std::vector<int32_t> valid_tokens;
  if (!o.valid_path.empty()) {
    absl::StatusOr<std::vector<int32_t>> v = TokenizeFile(**tokenizer, o.valid_path);
    if (!v.ok()) return v.status();
    valid_tokens = *std::move(v);
    if (valid_tokens.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(o.valid_path, ": fewer than two tokens"));
    }
  }
  const std::vector<int64_t> window_starts =
      o.align_to_conversations ? ConversationStarts(**tokenizer, *train_tokens, o.seq_len)
                               : std::vector<int64_t>();
  // Per-target loss weights, indexed like the tokens (weight of predicting
  // token p); undefined when all are 1.
  at::Tensor train_weights;
  if (o.assistant_weight != 1.0) {
    const std::vector<uint8_t> mask = AssistantTokenMask(**tokenizer, *train_tokens);
    train_weights = at::from_blob(const_cast<uint8_t*>(mask.data()), {n_train},
                                  at::TensorOptions().dtype(at::kByte))
                        .to(at::kFloat)
                        .mul_(o.assistant_weight - 1.0)
                        .add_(1.0);
  }
  const at::Tensor train_ids =
      at::from_blob(train_tokens->data(), {n_train}, at::TensorOptions().dtype(at::kInt))
          .to(at::kLong);

  const fs::path out_dir(o.out_dir);
  const fs::path state_dir = out_dir / kStateDir;
  // --init-from: the starting weights, identified by their file's hash. With
  // --resume they only identify the run (the checkpoint holds the weights), so
  // a curriculum stage resumes only from the weights it started from.
  std::optional<ModelWeights> init_weights;
  std::string init_hash;
  if (!o.init_from.empty()) {
    absl::StatusOr<Checkpoint> init = LoadCheckpoint(o.init_from);
    if (!init.ok()) return init.status();
    const json want = config.ToJson(), have = init->config.ToJson();
    for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                            "tie_word_embeddings", "attention_bias"}) {
      if (want.value(key, json()) != have.value(key, json())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--init-from ", o.init_from, ": ", key, " = ", have.value(key, json()).dump(),
            " but ", o.config_path, " has ", want.value(key, json()).dump()));
      }
    }
    absl::StatusOr<std::string> bytes =
        ReadTextFile((fs::path(o.init_from) / "model.safetensors").string());
    if (!bytes.ok()) return bytes.status();
    init_hash = Sha256Hex(*bytes);
    init_weights = std::move(init->weights);
  }
  const json identity =
      RunIdentity(o, config, (*tokenizer)->content_hash(), n_train, init_hash);

  // Parameters: fresh, or the master weights and moments of a checkpoint.
  ModelWeights weights;
  int64_t start_step = 0;
  double prior_wall_s = 0, initial_valid = -1;
  std::map<std::string, at::Tensor> saved_moments;
  if (o.resume) {
    absl::StatusOr<std::string> state_text = ReadTextFile((state_dir / kStateJson).string());
    if (!state_text.ok()) {
      return absl::NotFoundError(absl::StrCat("--resume: no checkpoint in ", state_dir.string()));
    }
    const json state = json::parse(*state_text, nullptr, /*allow_exceptions=*/false);
    if (state.is_discarded() || !state.contains("run") || !state.contains("step")) {
      return absl::InvalidArgumentError(
          absl::StrCat((state_dir / kStateJson).string(), ": malformed"));
    }
    for (const auto& [key, value] : identity.items()) {
      if (!state["run"].contains(key) || state["run"][key] != value) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--resume: ", state_dir.string(), " was trained with ", key, " = ",
            state["run"].value(key, json()).dump(), ", this run has ", value.dump()));
      }
    }
    start_step = state["step"].get<int64_t>();
    prior_wall_s = state.value("wall_s", 0.0);
    initial_valid = state.value("initial_valid_loss", -1.0);
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors((state_dir / kOptimizerFile).string());
    if (!file.ok()) return file.status();
    std::map<std::string, at::Tensor> params;
    for (auto& [name, tensor] : file->tensors) {
      if (name.rfind("param.", 0) == 0) {
        params[name.substr(6)] = tensor;
      } else {
        saved_moments[name] = tensor;
      }
    }
    absl::StatusOr<ModelWeights> w = ModelWeights::FromNamed(config, std::move(params));
    if (!w.ok()) return w.status();
    weights = *std::move(w);
  } else {
    weights = init_weights ? *std::move(init_weights) : InitWeights(config, o.seed);
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat(o.out_dir, ": ", ec.message()));
    fs::remove_all(state_dir, ec);
  }
  weights = weights.To(at::kFloat, "cpu");

  std::vector<Param> params;
  for (auto& [name, tensor] : weights.Named(config)) {
    Param p;
    p.name = name;
    p.value = tensor;
    p.value.set_requires_grad(true);
    p.decay = tensor.dim() >= 2;
    const auto m = saved_moments.find("exp_avg." + name);
    const auto v = saved_moments.find("exp_avg_sq." + name);
    if (o.resume) {
      if (m == saved_moments.end() || v == saved_moments.end() ||
          !m->second.sizes().equals(tensor.sizes()) || !v->second.sizes().equals(tensor.sizes())) {
        return absl::InvalidArgumentError(absl::StrCat(
            (state_dir / kOptimizerFile).string(), ": missing or misshapen moments of ", name));
      }
      p.exp_avg = m->second.to(at::kFloat).clone();
      p.exp_avg_sq = v->second.to(at::kFloat).clone();
    } else {
      p.exp_avg = at::zeros_like(tensor);
      p.exp_avg_sq = at::zeros_like(tensor);
    }
    params.push_back(std::move(p));
  }

  TrainResult result;
  result.start_step = start_step;
  result.n_params = config.ParameterCount();
  result.n_train_tokens = n_train;

  std::vector<StepRecord> history;  // the whole run, for the plot
  const fs::path log_path = out_dir / kLogFile;
  if (o.resume) {
    absl::StatusOr<std::vector<StepRecord>> kept = TrimLog(log_path, start_step);
    if (!kept.ok()) return kept.status();
    history = *std::move(kept);
  }
  // Resumed: the trimmed log continues; otherwise it starts empty.
  absl::StatusOr<JsonlLog> log = JsonlLog::Open(
      log_path.string(), o.resume ? JsonlLog::Mode::kAppend : JsonlLog::Mode::kTruncate);
  if (!log.ok()) return log.status();

  auto valid_loss = [&]() -> absl::StatusOr<double> {
    // float32 master weights, no autocast, no autograd.
    absl::StatusOr<NllResult> r =
        MeanNll(config, weights, valid_tokens, o.seq_len, o.batch, o.eval_tokens);
    if (!r.ok()) return r.status();
    return r->nats_per_token;
  };
  if (!o.resume && !valid_tokens.empty()) {
    absl::StatusOr<double> v = valid_loss();
    if (!v.ok()) return v.status();
    initial_valid = *v;
  }
  result.initial_valid_loss = initial_valid;

  double wall_at_save = 0;
  auto save_checkpoint = [&](int64_t step) -> absl::Status {
    const ModelWeights detached = weights.To(at::kFloat, "cpu");
    KVL_RETURN_IF_ERROR(SaveCheckpoint(o.out_dir, config, detached, o.save_dtype,
                                       tok_files.json_path, tok_files.config_path));
    // Written to a fresh directory, then renamed over the old one, so that a
    // crash mid-write leaves the previous checkpoint whole.
    const fs::path tmp = out_dir / (std::string(kStateDir) + ".tmp");
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat(tmp.string(), ": ", ec.message()));
    std::map<std::string, at::Tensor> tensors;
    for (const Param& p : params) {
      tensors["param." + p.name] = p.value.detach();
      tensors["exp_avg." + p.name] = p.exp_avg;
      tensors["exp_avg_sq." + p.name] = p.exp_avg_sq;
    }
    KVL_RETURN_IF_ERROR(WriteSafetensors((tmp / kOptimizerFile).string(), tensors));
    wall_at_save = prior_wall_s + Seconds(t_start, Clock::now());
    const json state = {{"step", step},
                        {"run", identity},
                        {"wall_s", wall_at_save},
                        {"initial_valid_loss", initial_valid},
                        {"tokens_seen", step * o.batch * o.seq_len}};
    KVL_RETURN_IF_ERROR(WriteTextFile((tmp / kStateJson).string(), state.dump(2) + "\n"));
    fs::remove_all(state_dir, ec);
    fs::rename(tmp, state_dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat(state_dir.string(), ": ", ec.message()));
    return absl::OkStatus();
  };

  const int64_t end_step =
      o.stop_after > 0 ? std::min(o.stop_after, o.n_steps) : o.n_steps;
  if (start_step >= end_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        state_dir.string(), " is already at step ", start_step, " (of ", o.n_steps, ")"));
  }
  ProgressOptions popts;
  popts.label = "train-lm";
  popts.total = o.n_steps;
  popts.unit = "step";
  popts.out = o.progress ? stderr : nullptr;
  ProgressBar bar(popts, start_step);

  const int64_t tokens_per_step = o.batch * o.seq_len;
  double step_seconds = 0;
  int64_t n_timed_steps = 0;
  double last_valid = -1;
  for (int64_t step = start_step + 1; step <= end_step; ++step) {
    const Clock::time_point t0 = Clock::now();
    const std::vector<int64_t> offsets =
        window_starts.empty() ? BatchOffsets(o.seed, step, o.batch, o.seq_len, n_train)
                              : BatchOffsets(o.seed, step, o.batch, window_starts);
    std::vector<at::Tensor> rows;
    rows.reserve(offsets.size());
    for (int64_t off : offsets) rows.push_back(train_ids.narrow(0, off, o.seq_len + 1));
    const at::Tensor window = at::stack(rows);                // [B, T+1]
    const at::Tensor inputs = window.narrow(1, 0, o.seq_len);   // [B, T]
    const at::Tensor targets = window.narrow(1, 1, o.seq_len);  // [B, T]

    ReferenceOptions forward;
    if (o.grouped_attention) forward.attention = GroupedAttention();
    forward.capture_router = o.router_aux_loss > 0;
    std::optional<Bf16AutocastScope> autocast;
    if (o.bf16) autocast.emplace();
    ReferenceOutput out = ReferenceForward(config, weights, inputs, forward);
    const at::Tensor& logits = out.logits;  // [B, T, V]
    autocast.reset();  // the loss, backward and update run without autocast
    at::Tensor loss;
    if (train_weights.defined()) {
      std::vector<at::Tensor> weight_rows;
      weight_rows.reserve(offsets.size());
      for (int64_t off : offsets) weight_rows.push_back(train_weights.narrow(0, off + 1, o.seq_len));
      const at::Tensor w = at::stack(weight_rows).reshape({-1});  // [B*T]
      const at::Tensor nll = at::cross_entropy_loss(logits.reshape({-1, config.vocab_size}),
                                                    targets.reshape({-1}), {},
                                                    at::Reduction::None);
      loss = (nll * w).sum() / w.sum();
    } else {
      loss = at::cross_entropy_loss(logits.reshape({-1, config.vocab_size}), targets.reshape({-1}));
    }
    at::Tensor router_aux;
    if (o.router_aux_loss > 0) {
      router_aux = LoadBalancingLoss(out.router_probs, out.router_experts, config.n_expert);
      (loss + o.router_aux_loss * router_aux).backward();
    } else {
      loss.backward();
    }

    const double lr = LearningRate(o, step);
    double grad_norm = 0;
    {
      c10::AutoGradMode no_grad(false);
      std::vector<at::Tensor> norms;
      norms.reserve(params.size());
      // A parameter no token reached this step (an expert the router chose for
      // none of the batch's tokens) has no gradient; as PyTorch's AdamW does
      // with a None gradient, it is left as it is, moments included (its later
      // bias correction counts the run's steps, where PyTorch counts its own).
      for (const Param& p : params) {
        if (p.value.grad().defined()) norms.push_back(p.value.grad().norm().pow(2));
      }
      grad_norm = std::sqrt(at::stack(norms).sum().item<double>());
      const double clip_scale =
          (o.clip > 0 && grad_norm > o.clip) ? o.clip / (grad_norm + 1e-6) : 1.0;
      // PyTorch's AdamW (decoupled weight decay), bias-corrected moments.
      const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
      const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
      for (Param& p : params) {
        at::Tensor g = p.value.grad();
        if (!g.defined()) continue;
        if (clip_scale != 1.0) g.mul_(clip_scale);
        if (p.decay && o.weight_decay > 0) p.value.mul_(1.0 - lr * o.weight_decay);
        p.exp_avg.mul_(o.beta1).add_(g, 1.0 - o.beta1);
        p.exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
        const at::Tensor denom = (p.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(o.eps);
        p.value.addcdiv_(p.exp_avg, denom, -lr / bc1);
        p.value.mutable_grad().reset();
      }
    }
    StepRecord rec;
    rec.step = step;
    rec.loss = loss.item<double>();
    if (router_aux.defined()) rec.router_aux = router_aux.item<double>();
    rec.lr = lr;
    rec.grad_norm = grad_norm;
    const double dt = Seconds(t0, Clock::now());
    rec.tokens_per_s = static_cast<double>(tokens_per_step) / dt;
    step_seconds += dt;
    ++n_timed_steps;
    if (!std::isfinite(rec.loss)) {
      return absl::InternalError(absl::StrCat("training diverged: loss ", rec.loss, " at step ", step));
    }

    const bool last = step == end_step;
    if (!valid_tokens.empty() && (last || (o.eval_every > 0 && step % o.eval_every == 0))) {
      absl::StatusOr<double> v = valid_loss();
      if (!v.ok()) return v.status();
      rec.valid_loss = last_valid = *v;
    }
    KVL_RETURN_IF_ERROR(log->Append(StepJson(rec)));
    history.push_back(rec);
    result.log.push_back(rec);

    std::string status = absl::StrFormat("loss %.4f | lr %.2e | %s tok/s", rec.loss, lr,
                                         FormatCount(rec.tokens_per_s));
    if (last_valid >= 0) absl::StrAppend(&status, absl::StrFormat(" | valid %.4f", last_valid));
    bar.Update(step, status);

    if (last || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0)) {
      KVL_RETURN_IF_ERROR(save_checkpoint(step));
      if (o.plot) {
        KVL_RETURN_IF_ERROR(PlotLoss(out_dir, history, initial_valid));
      }
    }
  }
  bar.Finish();

  result.steps_done = end_step;
  result.tokens_seen = end_step * tokens_per_step;
  result.wall_s = Seconds(t_start, Clock::now());
  result.mean_step_s = n_timed_steps ? step_seconds / static_cast<double>(n_timed_steps) : 0;
  result.final_train_loss = StepLossMean(result.log, 20);
  result.final_valid_loss = last_valid;

  const json summary = {
      {"steps", result.steps_done},
      {"total_steps", o.n_steps},
      {"finished", result.steps_done == o.n_steps},
      {"tokens_seen", result.tokens_seen},
      {"train_tokens", n_train},
      {"parameters", result.n_params},
      {"wall_s_total", wall_at_save},
      {"wall_s_this_run", result.wall_s},
      {"mean_step_s", result.mean_step_s},
      {"bf16_autocast", o.bf16},
      {"attention", o.grouped_attention ? "grouped" : "eager"},
      {"threads", n_threads},
      {"initial_valid_loss", initial_valid},
      {"final_train_loss", result.final_train_loss},
      {"final_valid_loss", result.final_valid_loss},
      {"run", identity}};
  KVL_RETURN_IF_ERROR(WriteTextFile((out_dir / kSummaryFile).string(), summary.dump(2) + "\n"));
  return result;
}

}  // namespace kvl::training
