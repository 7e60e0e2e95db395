#include "training/translator_distill.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "model/reference.h"
#include "model/token_alignment.h"
#include "nlohmann/json.hpp"
#include "training/attention.h"
#include "training/jsonl_log.h"
#include "training/plot.h"
#include "training/progress.h"
#include "training/train_lm.h"
#include "training/translator_data.h"
#include "translator/resample.h"

namespace kvl::training {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string Sibling(const std::string& path, const std::string& suffix) {
  return fs::path(path).replace_extension(suffix).string();
}

// Validation windows: ids [P + C] each and, when only some positions are
// scored, their weights [C].
struct Windows {
  std::vector<at::Tensor> ids, weights;
};

// Mean KL per scored position over `windows`, `batch` at a time, without autograd.
double MeanKl(const TranslatorModel& source, const TranslatorModel& target,
              const TranslatorSpec& spec, const TranslatorMaps& keys, const TranslatorMaps& values,
              const Windows& windows, int64_t batch, int64_t n_prefix,
              const at::Tensor& anchor_table, const AcrossTokenizers* across) {
  c10::AutoGradMode no_grad(false);
  const std::vector<at::Tensor>& all = windows.ids;
  double sum = 0, n = 0;
  for (size_t i = 0; i < all.size(); i += static_cast<size_t>(batch)) {
    const size_t j = std::min(all.size(), i + static_cast<size_t>(batch));
    const at::Tensor ids = at::stack(std::vector<at::Tensor>(all.begin() + i, all.begin() + j));
    at::Tensor w;
    if (!windows.weights.empty()) {
      w = at::stack(std::vector<at::Tensor>(windows.weights.begin() + i, windows.weights.begin() + j));
    }
    const double kl = DistillKl(source.config(), source.weights32, target.config(), target.weights32,
                                spec, keys, values, ids, n_prefix, w, anchor_table, across)
                          .item<double>();
    const double scored = w.defined() ? w.sum().item<double>() : static_cast<double>(j - i);
    sum += kl * scored;
    n += scored;
  }
  return sum / n;
}

// Per token of a stream, plus one trailing 0: 1 where the token is part of an
// assistant reply (AssistantTokenMask). The weights of a window's continuation
// positions [t, t + C) are mask[t + 1, t + C + 1): each position predicts the next token.
at::Tensor ReplyTokenMask(const Tokenizer& tokenizer, const std::vector<int32_t>& stream) {
  std::vector<uint8_t> mask = AssistantTokenMask(tokenizer, stream);
  mask.push_back(0);
  return at::tensor(std::vector<float>(mask.begin(), mask.end()));
}

absl::Status PlotCurve(const std::string& png, const std::vector<DistillRecord>& log,
                       double initial_valid) {
  PlotSeries train{"train KL (per step)", {}, false};
  PlotSeries smooth{"train KL (trailing mean of 20)", {}, false};
  PlotSeries valid{"validation KL", {}, true};
  valid.points.emplace_back(0, initial_valid);
  double window_sum = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    train.points.emplace_back(log[i].step, log[i].kl);
    window_sum += log[i].kl;
    if (i >= 20) window_sum -= log[i - 20].kl;
    smooth.points.emplace_back(log[i].step, window_sum / std::min<double>(i + 1, 20));
    if (log[i].valid_kl >= 0) valid.points.emplace_back(log[i].step, log[i].valid_kl);
  }
  PlotSpec spec;
  spec.title = absl::StrCat("kvl distill: ", fs::path(png).stem().string());
  spec.x_label = "step";
  spec.y_label = "KL(native || translated), nats/token";
  spec.log_y = true;
  spec.series = {train, smooth, valid};
  return PlotLines(spec, png);
}

}  // namespace

at::Tensor AnchorBatch(const at::Tensor& table, const at::Tensor& ids, int64_t window) {
  const int64_t n_batch = ids.size(0), n_tokens = ids.size(1), e = table.size(1);
  const at::Tensor rows = at::embedding(table.to(at::kFloat), ids);  // [B, T, E]
  std::vector<at::Tensor> parts;
  for (int64_t k = 0; k < window; ++k) {
    at::Tensor shifted = at::zeros({n_batch, n_tokens, e}, rows.options());
    if (k < n_tokens) shifted.narrow(1, k, n_tokens - k).copy_(rows.narrow(1, 0, n_tokens - k));
    parts.push_back(shifted);
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, -1);
}

std::vector<at::Tensor> TranslateBatch(const std::vector<at::Tensor>& source,
                                       const std::vector<std::vector<int64_t>>& lists,
                                       const TranslatorMaps& maps,
                                       const TranslatorEndpoint& target,
                                       const at::Tensor& anchors) {
  std::vector<at::Tensor> out;
  out.reserve(lists.size());
  for (size_t il = 0; il < lists.size(); ++il) {
    std::vector<at::Tensor> parts;
    for (int64_t s : lists[il]) {
      const at::Tensor& x = source[static_cast<size_t>(s)];  // [B, H_s, T, D_s]
      parts.push_back(x.permute({0, 2, 1, 3}).reshape({x.size(0), x.size(2), -1}));
    }
    const at::Tensor x = parts.size() == 1 ? parts[0] : at::cat(parts, -1);  // [B, T, ν*H_s*D_s]
    at::Tensor y = maps.bias.empty() ? at::linear(x, maps.weight[il])
                                     : at::linear(x, maps.weight[il], maps.bias[il]);
    if (anchors.defined() && !maps.anchor.empty()) y = y + at::linear(anchors, maps.anchor[il]);
    out.push_back(y.view({x.size(0), x.size(1), target.n_head_kv, target.head_dim})
                      .transpose(1, 2));  // [B, H_t, T, D_t]
  }
  return out;
}

Whitening WhiteningOf(const at::Tensor& xx, const at::Tensor& x_sum, int64_t n, double floor) {
  const at::Tensor mean = x_sum / static_cast<double>(n);
  const at::Tensor cov = xx / static_cast<double>(n) - at::outer(mean, mean);
  const int64_t d = cov.size(0);
  auto [lambda, u] = at::linalg_eigh(cov);
  const at::Tensor l =
      lambda.clamp_min(0) + floor * cov.trace().item<double>() / static_cast<double>(d);
  Whitening w;
  w.p = u.matmul(at::diag(l.rsqrt())).matmul(u.t()).to(at::kFloat).contiguous();
  w.p_inv = u.matmul(at::diag(l.sqrt())).matmul(u.t()).to(at::kFloat).contiguous();
  return w;
}

TranslatedBatch TranslateBatchKv(const TranslatorSpec& spec, const TranslatorMaps& keys,
                                 const TranslatorMaps& values,
                                 const std::vector<at::Tensor>& source_keys,
                                 const std::vector<at::Tensor>& source_values,
                                 const at::Tensor& anchors) {
  std::vector<at::Tensor> blocks = source_keys;  // InputBlocks order: keys, then values
  blocks.insert(blocks.end(), source_values.begin(), source_values.end());
  const InputBlocks lists = InputBlocksOf(spec.assignment, spec.inputs, spec.source.n_layer);
  return {TranslateBatch(blocks, lists.keys, keys, spec.target, anchors),
          TranslateBatch(blocks, lists.values, values, spec.target, anchors)};
}

SourcePrefixKv SourcePrefixTaps(const ModelConfig& source_config,
                                const ModelWeights& source_weights, const at::Tensor& ids,
                                const AcrossTokenizers* across) {
  c10::AutoGradMode no_grad(false);
  ReferenceOptions capture;
  capture.attention = GroupedAttention();
  capture.capture_kv = true;
  capture.last_logits_only = true;
  if (across == nullptr) {
    ReferenceOutput out = ReferenceForward(source_config, source_weights, ids, capture);
    return {std::move(out.keys_prenorm), std::move(out.values)};
  }
  const int64_t n_layer = source_config.n_layer;
  std::vector<std::vector<at::Tensor>> keys(n_layer), values(n_layer);
  const at::Tensor rows = ids.to(at::kCPU).to(at::kLong).contiguous();
  for (int64_t b = 0; b < rows.size(0); ++b) {
    const int64_t* p = rows[b].data_ptr<int64_t>();
    const std::vector<int32_t> t32(p, p + rows.size(1));
    const std::string text = across->target->Decode(t32);
    const std::vector<int32_t> s32 = across->source->Encode(text);
    absl::StatusOr<std::vector<AlignedGroup>> groups =
        AlignSpellings(*across->source, s32, *across->target, t32, text);
    TORCH_CHECK(groups.ok(), "window ", b, ": a tokenizer does not spell the prefix's text back (",
                groups.status().ToString(), ")");
    absl::StatusOr<std::vector<TokenRun>> runs = AssignWithinGroups(*groups);
    TORCH_CHECK(runs.ok(), runs.status().ToString());
    const at::Tensor s_ids =
        at::tensor(std::vector<int64_t>(s32.begin(), s32.end()), at::kLong).unsqueeze(0);
    const ReferenceOutput out = ReferenceForward(source_config, source_weights, s_ids, capture);
    // All layers at once: [L, H, T_s, D] -> [L, H, P, D].
    absl::StatusOr<KvTaps> resampled =
        ResampleTaps({at::cat(out.keys_prenorm, 0), at::cat(out.values, 0)}, *runs);
    TORCH_CHECK(resampled.ok(), resampled.status().ToString());
    for (int64_t il = 0; il < n_layer; ++il) {
      keys[il].push_back(resampled->keys.narrow(0, il, 1));
      values[il].push_back(resampled->values.narrow(0, il, 1));
    }
  }
  SourcePrefixKv kv;
  for (int64_t il = 0; il < n_layer; ++il) {
    kv.keys.push_back(at::cat(keys[il], 0));
    kv.values.push_back(at::cat(values[il], 0));
  }
  return kv;
}

at::Tensor DistillKl(const ModelConfig& source_config, const ModelWeights& source_weights,
                     const ModelConfig& target_config, const ModelWeights& target_weights,
                     const TranslatorSpec& spec, const TranslatorMaps& keys,
                     const TranslatorMaps& values, const at::Tensor& ids, int64_t n_prefix,
                     const at::Tensor& position_weights, const at::Tensor& anchor_table,
                     const AcrossTokenizers* across) {
  const int64_t n_cont = ids.size(1) - n_prefix;
  TORCH_CHECK(n_prefix >= 1 && n_cont >= 1, "DistillKl needs a prefix and a continuation");
  at::Tensor teacher_logp;
  SourcePrefixKv source_out;
  ReferenceOptions plain;
  plain.attention = GroupedAttention();  // the fast attention, in all three
  {
    c10::AutoGradMode no_grad(false);
    const at::Tensor teacher = ReferenceForward(target_config, target_weights, ids, plain)
                                   .logits.narrow(1, n_prefix, n_cont);
    teacher_logp = at::log_softmax(teacher, -1);  // [B, C, V]
    source_out = SourcePrefixTaps(source_config, source_weights, ids.narrow(1, 0, n_prefix), across);
  }
  ReferenceOptions to = plain;
  TORCH_CHECK(spec.anchor_window == 0 || anchor_table.defined(),
              "token-anchored maps need their anchor table");
  const at::Tensor anchors =
      spec.anchor_window > 0
          ? AnchorBatch(anchor_table, ids.narrow(1, 0, n_prefix), spec.anchor_window)
          : at::Tensor();
  TranslatedBatch translated =
      TranslateBatchKv(spec, keys, values, source_out.keys, source_out.values, anchors);
  to.prefix_keys = std::move(translated.keys);
  to.prefix_values = std::move(translated.values);
  const at::Tensor student =
      ReferenceForward(target_config, target_weights, ids.narrow(1, n_prefix, n_cont), to).logits;
  const at::Tensor student_logp = at::log_softmax(student, -1);
  const at::Tensor kl = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1);  // [B, C]
  if (!position_weights.defined()) return kl.mean();
  TORCH_CHECK(position_weights.sizes() == kl.sizes(), "position weights must be [B, C]");
  return (kl * position_weights).sum() / position_weights.sum().clamp_min(1e-12);
}

absl::StatusOr<HandOver> ParseHandOver(std::string_view name) {
  for (HandOver h : {HandOver::kAny, HandOver::kReply, HandOver::kTurn, HandOver::kChat}) {
    if (name == HandOverName(h)) return h;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("hand-over \"", std::string(name), "\": expected any, reply, turn or chat"));
}

std::string HandOverName(HandOver h) {
  switch (h) {
    case HandOver::kAny: return "any";
    case HandOver::kReply: return "reply";
    case HandOver::kTurn: return "turn";
    case HandOver::kChat: return "chat";
  }
  return "?";
}

std::vector<int64_t> HandOverPoints(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens,
                                    HandOver h) {
  std::vector<int64_t> points;
  if (h == HandOver::kAny) return points;
  const bool reply = h == HandOver::kReply || h == HandOver::kChat;
  const bool turn = h == HandOver::kTurn || h == HandOver::kChat;
  const std::vector<int64_t> starts = ConversationStarts(tokenizer, tokens, /*seq_len=*/0);
  const std::vector<ChatRoleLine> lines = ChatRoleLines(tokenizer, tokens);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (reply && lines[i].role == "assistant") points.push_back(lines[i].end);
    if (turn && i > 0 && lines[i].role == "user" && lines[i - 1].role == "assistant" &&
        !std::binary_search(starts.begin(), starts.end(), lines[i].start)) {
      points.push_back(lines[i].start);
    }
  }
  return points;
}

std::vector<int64_t> HandOverWindowStarts(const Tokenizer& tokenizer,
                                          const std::vector<int32_t>& stream, HandOver h,
                                          int64_t n_prefix, int64_t window) {
  const int64_t n = static_cast<int64_t>(stream.size());
  std::vector<int64_t> starts;
  if (h == HandOver::kAny) {
    for (int64_t off = 0; off + window <= n; ++off) starts.push_back(off);
    return starts;
  }
  for (int64_t p : HandOverPoints(tokenizer, stream, h)) {
    if (p - n_prefix >= 0 && p - n_prefix + window <= n) starts.push_back(p - n_prefix);
  }
  return starts;
}

std::vector<int64_t> FirstDisjointWindows(const std::vector<int64_t>& starts, int64_t window,
                                          int64_t max_windows,
                                          const std::function<bool(int64_t)>& keep) {
  std::vector<int64_t> out;
  int64_t free_from = 0;
  for (int64_t off : starts) {
    if (static_cast<int64_t>(out.size()) >= max_windows) break;
    if (off < free_from || (keep && !keep(off))) continue;
    out.push_back(off);
    free_from = off + window;
  }
  return out;
}

absl::StatusOr<DistillResult> Distill(const DistillOptions& o) {
  const Clock::time_point t_start = Clock::now();
  if (o.prefix < 1 || o.continuation < 1 || o.batch < 1 || o.steps < 1 || o.warmup < 0 ||
      !(o.lr > 0) || o.min_lr < 0 || o.min_lr > o.lr || o.weight_decay < 0 || o.eval_every < 0 ||
      o.valid_windows < 1) {
    return absl::InvalidArgumentError(
        "need prefix, continuation, batch, steps, valid-windows >= 1; lr > 0; 0 <= min-lr <= lr; "
        "warmup, eval-every, weight-decay >= 0");
  }
  if (o.out_path.empty()) return absl::InvalidArgumentError("an output path is required");
  if (o.whiten && (o.whiten_windows < 1 || !(o.whiten_floor > 0))) {
    return absl::InvalidArgumentError("whitening needs whiten-windows >= 1 and whiten-floor > 0");
  }
  if (o.score_assistant && o.hand_over == HandOver::kAny) {
    // Windows cut anywhere often hold no reply to score.
    return absl::InvalidArgumentError("scoring assistant replies needs a hand-over other than any");
  }
  RuntimeOptions runtime;
  runtime.n_threads = o.n_threads;
  absl::StatusOr<TranslatorPair> pair =
      LoadTranslatorPair(o.source_dir, o.target_dir, runtime, Tokenizers::kMayDiffer);
  if (!pair.ok()) return pair.status();
  TranslatorModel* source = &pair->source;
  TranslatorModel* target = &pair->target;
  // The windows are the target's tokens; across tokenizers (issue 54) the
  // source reads their text in its own (SourcePrefixTaps).
  const Tokenizer& stream_tokenizer = *target->tokenizer;
  const AcrossTokenizers across_tokenizers{source->tokenizer.get(), target->tokenizer.get()};
  const AcrossTokenizers* across = pair->SameTokenizer() ? nullptr : &across_tokenizers;
  const int64_t window = o.prefix + o.continuation;
  for (const TranslatorModel* m : {&*source, &*target}) {
    if (window > m->config().max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("prefix + continuation = ", window,
                                                     " exceeds max_position_embeddings of ",
                                                     m->path));
    }
  }
  absl::StatusOr<std::unique_ptr<Translator>> init =
      Translator::Load(o.init_path, ExpectationFor(*source, *target));
  if (!init.ok()) return init.status();
  const at::Tensor anchor_table = (*init)->anchor_table();  // undefined without anchors
  SetIntraOpThreads(o.n_threads);
  // As train_lm: keep the large per-step transients on the heap.
  mallopt(M_MMAP_MAX, 0);

  absl::StatusOr<std::vector<int32_t>> train = ReadTokenStream(o.train_path, stream_tokenizer);
  if (!train.ok()) return train.status();
  absl::StatusOr<std::vector<int32_t>> valid = ReadTokenStream(o.valid_path, stream_tokenizer);
  if (!valid.ok()) return valid.status();
  const int64_t n_train = static_cast<int64_t>(train->size());
  if (n_train < window + 1) {
    return absl::InvalidArgumentError(absl::StrCat(o.train_path, " has ", n_train,
                                                   " tokens, fewer than one window of ", window,
                                                   " plus one"));
  }
  const at::Tensor train_weights =
      o.score_assistant ? ReplyTokenMask(stream_tokenizer, *train) : at::Tensor();
  std::vector<int64_t> train_starts;  // empty: windows start anywhere
  if (o.hand_over != HandOver::kAny) {
    // Windows without a scored position would make steps that learn nothing.
    for (int64_t off :
         HandOverWindowStarts(stream_tokenizer, *train, o.hand_over, o.prefix, window)) {
      if (!train_weights.defined() ||
          train_weights.narrow(0, off + o.prefix + 1, o.continuation).sum().item<double>() > 0) {
        train_starts.push_back(off);
      }
    }
    if (train_starts.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.train_path, ": no ", HandOverName(o.hand_over),
          " hand-over point with room for a window of ", window, " tokens",
          o.score_assistant ? " and a reply to score" : ""));
    }
  }
  // Validation: the first non-overlapping windows placed as the training ones,
  // keeping only those with a scored position.
  Windows valid_windows;
  {
    const at::Tensor valid_weights =
        o.score_assistant ? ReplyTokenMask(stream_tokenizer, *valid) : at::Tensor();
    auto scored = [&](int64_t off) {
      return !valid_weights.defined() ||
             valid_weights.narrow(0, off + o.prefix + 1, o.continuation).sum().item<double>() > 0;
    };
    for (int64_t off : FirstDisjointWindows(
             HandOverWindowStarts(stream_tokenizer, *valid, o.hand_over, o.prefix, window),
             window, o.valid_windows, scored)) {
      valid_windows.ids.push_back(
          at::tensor(std::vector<int64_t>(valid->begin() + off, valid->begin() + off + window),
                     at::kLong));
      if (valid_weights.defined()) {
        valid_windows.weights.push_back(valid_weights.narrow(0, off + o.prefix + 1, o.continuation));
      }
    }
  }
  if (valid_windows.ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.valid_path, ": not one window of ", window, " tokens",
        o.hand_over == HandOver::kAny ? "" : " that hands over at a " + HandOverName(o.hand_over) +
                                                 " point",
        o.score_assistant ? " with a reply to score" : ""));
  }
  const at::Tensor train_ids =
      at::from_blob(train->data(), {n_train}, at::TensorOptions().dtype(at::kInt)).to(at::kLong);

  // The windows of training step `step` (1-based).
  auto step_offsets = [&](int64_t step) {
    return train_starts.empty() ? BatchOffsets(o.seed, step, o.batch, window - 1, n_train)
                                : BatchOffsets(o.seed, step, o.batch, train_starts);
  };
  TranslatorSpec spec = (*init)->spec();
  const InputBlocks blocks = InputBlocksOf(spec.assignment, spec.inputs, spec.source.n_layer);
  // --whiten: one preconditioner per distinct input list (with --band all,
  // one for all maps), from the source's prefixes of the first steps' windows.
  std::map<std::vector<int64_t>, Whitening> whitening;
  if (o.whiten) {
    c10::AutoGradMode no_grad(false);
    struct Moments {
      at::Tensor xx, x_sum;
      int64_t n = 0;
    };
    std::map<std::vector<int64_t>, Moments> moments;
    for (const auto* lists : {&blocks.keys, &blocks.values}) {
      for (const std::vector<int64_t>& l : *lists) moments[l];
    }
    for (int64_t step = 1, taken = 0; taken < o.whiten_windows; ++step) {
      std::vector<at::Tensor> rows;
      for (int64_t off : step_offsets(step)) {
        if (taken++ < o.whiten_windows) rows.push_back(train_ids.narrow(0, off, o.prefix));
      }
      const SourcePrefixKv out =
          SourcePrefixTaps(source->config(), source->weights32, at::stack(rows), across);
      std::vector<at::Tensor> layers = out.keys;  // InputBlocks order
      layers.insert(layers.end(), out.values.begin(), out.values.end());
      for (auto& [list, m] : moments) {
        std::vector<at::Tensor> parts;
        for (int64_t b : list) {
          const at::Tensor& x = layers[static_cast<size_t>(b)];  // [B, H_s, T, D_s]
          parts.push_back(x.permute({0, 2, 1, 3}).reshape({x.size(0) * x.size(2), -1}));
        }
        const at::Tensor x = at::cat(parts, 1).to(at::kDouble);  // [B*T, d]
        m.xx = m.xx.defined() ? m.xx.addmm_(x.t(), x) : x.t().matmul(x);
        m.x_sum = m.x_sum.defined() ? m.x_sum.add_(x.sum(0)) : x.sum(0);
        m.n += x.size(0);
      }
    }
    for (const auto& [list, m] : moments) {
      whitening[list] = WhiteningOf(m.xx, m.x_sum, m.n, o.whiten_floor);
    }
  }
  // Trainable float32 copies of the init maps (whitened: V = W·P⁻¹).
  TranslatorMaps keys, values;
  std::vector<at::Tensor> params, exp_avg, exp_avg_sq;
  std::vector<bool> decay;
  for (const auto& [from, to, lists] :
       {std::tuple{&(*init)->key_maps(), &keys, &blocks.keys},
        std::tuple{&(*init)->value_maps(), &values, &blocks.values}}) {
    for (size_t il = 0; il < from->weight.size(); ++il) {
      at::Tensor w = from->weight[il].to(at::kFloat).clone();
      if (o.whiten) w = w.matmul(whitening.at((*lists)[il]).p_inv);
      to->weight.push_back(w.set_requires_grad(true));
      params.push_back(to->weight.back());
      decay.push_back(true);
    }
    for (const at::Tensor& b : from->bias) {
      to->bias.push_back(b.to(at::kFloat).clone().set_requires_grad(true));
      params.push_back(to->bias.back());
      decay.push_back(false);
    }
    // Anchor weights train as they are (not whitened: their rows are RMS-normalised).
    for (const at::Tensor& a : from->anchor) {
      to->anchor.push_back(a.to(at::kFloat).clone().set_requires_grad(true));
      params.push_back(to->anchor.back());
      decay.push_back(true);
    }
  }
  for (const at::Tensor& p : params) {
    exp_avg.push_back(at::zeros_like(p));
    exp_avg_sq.push_back(at::zeros_like(p));
  }
  // Frozen models.
  for (TranslatorModel* m : {&*source, &*target}) {
    for (at::Tensor& t : m->weights32.All()) t.set_requires_grad(false);
  }

  // The maps W the translator applies: the trained tensors, or V·P when
  // whitening (in the autograd graph when grad mode is on).
  auto applied = [&](const TranslatorMaps& trained, const std::vector<std::vector<int64_t>>& lists) {
    if (!o.whiten) return trained;
    TranslatorMaps w;
    w.bias = trained.bias;
    w.anchor = trained.anchor;
    for (size_t il = 0; il < trained.weight.size(); ++il) {
      w.weight.push_back(trained.weight[il].matmul(whitening.at(lists[il]).p));
    }
    return w;
  };

  DistillResult result;
  result.n_train_tokens = n_train;
  result.n_valid_windows = static_cast<int64_t>(valid_windows.ids.size());
  auto valid_kl = [&] {
    c10::AutoGradMode no_grad(false);
    return MeanKl(*source, *target, spec, applied(keys, blocks.keys),
                  applied(values, blocks.values), valid_windows, o.batch, o.prefix, anchor_table,
                  across);
  };
  auto save = [&](int64_t step) -> absl::Status {
    TranslatorSpec out = spec;
    // The init's own record joins its history; this stage's record replaces it
    // (weighting and ridge stay those of the fit the maps started from).
    out.history.push_back(spec.training);
    out.training.method = "distilled";
    out.training.corpus = o.train_path;
    out.training.steps = step;
    out.training.n_sequences = step * o.batch;
    out.training.n_tokens = step * o.batch * window;
    TranslatorMaps k, v;
    c10::AutoGradMode no_grad(false);
    for (const auto& [from, to] : {std::pair{applied(keys, blocks.keys), &k},
                                   std::pair{applied(values, blocks.values), &v}}) {
      for (const at::Tensor& w : from.weight) to->weight.push_back(w.detach().clone());
      for (const at::Tensor& b : from.bias) to->bias.push_back(b.detach().clone());
      for (const at::Tensor& a : from.anchor) to->anchor.push_back(a.detach().clone());
    }
    absl::StatusOr<std::unique_ptr<Translator>> t = Translator::Create(
        std::move(out), std::move(k), std::move(v), DType::kFloat32, anchor_table);
    if (!t.ok()) return t.status();
    return (*t)->Save(o.out_path);
  };

  // Across tokenizers a window whose text a tokenizer cannot spell back
  // throws in SourcePrefixTaps (below: in the steps too).
  try {
    result.initial_valid_kl = result.best_valid_kl = valid_kl();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(o.valid_path, ": ", e.what_without_backtrace()));
  }
  KVL_RETURN_IF_ERROR(save(0));
  absl::StatusOr<JsonlLog> log =
      JsonlLog::Open(Sibling(o.out_path, ".distill.jsonl"), JsonlLog::Mode::kTruncate);
  if (!log.ok()) return log.status();
  KVL_RETURN_IF_ERROR(log->Append({{"step", 0}, {"valid_kl", result.initial_valid_kl}}));

  TrainOptions schedule;  // LearningRate's warm-up + cosine
  schedule.n_steps = o.steps;
  schedule.lr = o.lr;
  schedule.warmup = o.warmup;
  schedule.min_lr_ratio = o.min_lr / o.lr;

  ProgressOptions popts;
  popts.label = "distill";
  popts.total = o.steps;
  popts.unit = "step";
  popts.out = o.progress ? stderr : nullptr;
  ProgressBar bar(popts);
  double step_seconds = 0, last_valid = result.initial_valid_kl;
  c10::AutoGradMode grad_on(true);  // even when the caller turned grad mode off
  for (int64_t step = 1; step <= o.steps; ++step) {
    const Clock::time_point t0 = Clock::now();
    std::vector<at::Tensor> rows, weights;
    for (int64_t off : step_offsets(step)) {
      rows.push_back(train_ids.narrow(0, off, window));
      if (train_weights.defined()) {
        weights.push_back(train_weights.narrow(0, off + o.prefix + 1, o.continuation));
      }
    }
    at::Tensor loss;
    {
      // W = V·P in float32, before autocast would round P to bfloat16.
      const TranslatorMaps step_keys = applied(keys, blocks.keys);
      const TranslatorMaps step_values = applied(values, blocks.values);
      std::optional<Bf16AutocastScope> autocast;
      if (o.bf16) autocast.emplace();
      try {
        loss = DistillKl(source->config(), source->weights32, target->config(), target->weights32,
                         spec, step_keys, step_values, at::stack(rows), o.prefix,
                         weights.empty() ? at::Tensor() : at::stack(weights), anchor_table, across);
      } catch (const c10::Error& e) {
        return absl::InvalidArgumentError(
            absl::StrCat(o.train_path, ", step ", step, ": ", e.what_without_backtrace()));
      }
    }
    loss.backward();
    DistillRecord rec;
    rec.step = step;
    rec.kl = loss.item<double>();
    rec.lr = LearningRate(schedule, step);
    if (!std::isfinite(rec.kl)) {
      return absl::InternalError(absl::StrCat("distillation diverged: KL ", rec.kl, " at step ", step));
    }
    {
      c10::AutoGradMode no_grad(false);
      double sq = 0;
      for (const at::Tensor& p : params) sq += p.grad().pow(2).sum().item<double>();
      rec.grad_norm = std::sqrt(sq);
      const double scale = (o.clip > 0 && rec.grad_norm > o.clip) ? o.clip / (rec.grad_norm + 1e-6) : 1.0;
      const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
      const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor p = params[i];
        at::Tensor g = p.grad();
        if (scale != 1.0) g.mul_(scale);
        if (decay[i] && o.weight_decay > 0) p.mul_(1.0 - rec.lr * o.weight_decay);
        exp_avg[i].mul_(o.beta1).add_(g, 1.0 - o.beta1);
        exp_avg_sq[i].mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
        const at::Tensor denom = (exp_avg_sq[i].sqrt() / std::sqrt(bc2)).add_(o.eps);
        p.addcdiv_(exp_avg[i], denom, -rec.lr / bc1);
        p.mutable_grad().reset();
      }
    }
    rec.step_s = Seconds(t0, Clock::now());
    step_seconds += rec.step_s;
    if (step == o.steps || (o.eval_every > 0 && step % o.eval_every == 0)) {
      rec.valid_kl = last_valid = valid_kl();
      if (rec.valid_kl < result.best_valid_kl) {
        result.best_valid_kl = rec.valid_kl;
        result.best_step = step;
        KVL_RETURN_IF_ERROR(save(step));
      }
    }
    nlohmann::json line = {{"step", step}, {"kl", rec.kl}, {"lr", rec.lr},
                           {"grad_norm", rec.grad_norm}, {"step_s", rec.step_s}};
    if (rec.valid_kl >= 0) line["valid_kl"] = rec.valid_kl;
    KVL_RETURN_IF_ERROR(log->Append(line));
    result.log.push_back(rec);
    bar.Update(step, absl::StrFormat("KL %.4f | lr %.2e | valid %.4f (best %.4f @%d)", rec.kl,
                                     rec.lr, last_valid, result.best_valid_kl, result.best_step));
  }
  bar.Finish();
  result.final_valid_kl = last_valid;
  result.mean_step_s = step_seconds / static_cast<double>(o.steps);
  result.wall_s = Seconds(t_start, Clock::now());

  if (o.plot) {
    KVL_RETURN_IF_ERROR(
        PlotCurve(Sibling(o.out_path, ".distill.png"), result.log, result.initial_valid_kl));
  }
  const nlohmann::json summary = {
      {"translator", o.out_path},      {"init", o.init_path},
      {"source", o.source_dir},        {"target", o.target_dir},
      {"train", o.train_path},         {"valid", o.valid_path},
      {"prefix", o.prefix},            {"continuation", o.continuation},
      {"hand_over", HandOverName(o.hand_over)},
      {"score", o.score_assistant ? "assistant" : "all"},
      {"train_windows", train_starts.empty() ? n_train - window + 1
                                              : static_cast<int64_t>(train_starts.size())},
      {"batch", o.batch},              {"steps", o.steps},
      {"lr", o.lr},                    {"min_lr", o.min_lr},
      {"warmup", o.warmup},            {"weight_decay", o.weight_decay},
      {"clip", o.clip},                {"seed", o.seed},
      {"bf16_autocast", o.bf16},
      {"whiten", o.whiten ? nlohmann::json{{"floor", o.whiten_floor},
                                           {"windows", o.whiten_windows}}
                          : nlohmann::json(false)},
      {"valid_windows", result.n_valid_windows},
      {"initial_valid_kl", result.initial_valid_kl},
      {"best_valid_kl", result.best_valid_kl},
      {"best_step", result.best_step}, {"final_valid_kl", result.final_valid_kl},
      {"mean_step_s", result.mean_step_s}, {"wall_s", result.wall_s}};
  KVL_RETURN_IF_ERROR(WriteTextFile(Sibling(o.out_path, ".distill.json"), summary.dump(2) + "\n"));
  return result;
}

}  // namespace kvl::training
