// The cached decoder against the reference forward, and the reference against
// hand-written per-element loops (an oracle sharing no tensor code with it).
#include "model/decoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/reference.h"
#include "tests/model/test_models.h"

namespace kvl {
namespace {

using testing::MaxAbsDiff;
using testing::RandomIds;
using testing::RandomWeights;
using testing::TinyConfig;
using testing::GemmaConfig;
using testing::MoeConfig;
using testing::TinyModel;

// A Mistral-style tiny model: Llama's math, 4 query heads over 2 kv heads,
// every layer attending to the last `window` tokens.
ModelConfig MistralConfig(int64_t window, int64_t n_layer = 2, int64_t hidden = 32,
                          int64_t head_dim = 8, int64_t vocab = 61) {
  ModelConfig c = TinyConfig({"mistral", false, false, false, 4, 2}, n_layer, hidden, head_dim, vocab);
  c.architecture = Architecture::kMistral;
  c.architecture_name = "MistralForCausalLM";
  c.model_type = "mistral";
  c.sliding_window = window;
  return c;
}

ReferenceOptions Capture() {
  ReferenceOptions o;
  o.capture_kv = true;
  return o;
}

DecoderOptions WithMode(KeyTapMode mode) {
  DecoderOptions o;
  o.tap_mode = mode;
  return o;
}

DecoderOptions WithDtype(at::ScalarType dtype) {
  DecoderOptions o;
  o.dtype = dtype;
  return o;
}

DecoderOptions WithDevice(const std::string& device) {
  DecoderOptions o;
  o.device = device;
  return o;
}

// ---------------------------------------------------------------------------
// Oracle: the HF Qwen3/Llama forward written as loops over doubles.
using Vec = std::vector<double>;

Vec ToVec(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return Vec(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// y = W x (+ b), W: [out, in] row-major.
Vec MatVec(const at::Tensor& w, const Vec& x, const at::Tensor& b = at::Tensor()) {
  const Vec wv = ToVec(w);
  const size_t n_out = static_cast<size_t>(w.size(0)), n_in = x.size();
  Vec y(n_out, 0.0);
  const Vec bv = b.defined() ? ToVec(b) : Vec(n_out, 0.0);
  for (size_t o = 0; o < n_out; ++o) {
    double acc = bv[o];
    for (size_t i = 0; i < n_in; ++i) acc += wv[o * n_in + i] * x[i];
    y[o] = acc;
  }
  return y;
}

// Gemma (offset): the scale is 1 + w.
Vec RmsNormLoop(const Vec& x, const Vec& w, double eps, bool offset = false) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (offset ? 1.0 + w[i] : w[i]);
  return y;
}

// Rotates one head vector (dims i and i + D/2 paired) to position pos / factor.
Vec RopeLoop(const Vec& x, int64_t pos, double theta, double factor = 1.0) {
  const size_t d = x.size(), half = d / 2;
  Vec y(d);
  for (size_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) / factor /
                         std::pow(theta, 2.0 * i / static_cast<double>(d));
    y[i] = x[i] * std::cos(angle) - x[i + half] * std::sin(angle);
    y[i + half] = x[i + half] * std::cos(angle) + x[i] * std::sin(angle);
  }
  return y;
}

// GELU with the tanh approximation.
double GeluTanh(double g) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g)));
}

// logits [T][V] for one sequence. The Gemma-3 parts (norms scaling by
// 1 + w, four per layer, scaled embeddings, GELU-tanh, per-layer RoPE and
// windows, the attention scalar, soft-capped logits) follow the config.
std::vector<Vec> OracleForward(const ModelConfig& c, const ModelWeights& w,
                               const std::vector<int64_t>& ids) {
  const size_t n = ids.size(), e = c.hidden_size, d = c.head_dim;
  const size_t n_head = c.n_head, n_head_kv = c.n_head_kv, group = n_head / n_head_kv;
  const bool offset = c.norm_weight_offset;
  const double eps = c.rms_norm_eps;
  const double scale = 1.0 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar
                                                                    : static_cast<double>(d));
  const Vec embed = ToVec(w.embed_tokens);
  std::vector<Vec> x(n);
  for (size_t t = 0; t < n; ++t) {
    x[t] = Vec(embed.begin() + ids[t] * e, embed.begin() + (ids[t] + 1) * e);
    if (c.scale_embeddings) {
      for (double& v : x[t]) v *= std::sqrt(static_cast<double>(e));
    }
  }
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const LayerWeights& l = w.layers[il];
    // A windowed layer: the query at t sees keys t - W + 1 .. t.
    const int64_t window = c.AttentionWindow(static_cast<int64_t>(il));
    const double theta = c.RopeTheta(static_cast<int64_t>(il));
    const double factor = c.RopeFactor(static_cast<int64_t>(il));
    std::vector<Vec> q(n), k(n), v(n);  // [T][heads * D] after norm and RoPE
    for (size_t t = 0; t < n; ++t) {
      const Vec h = RmsNormLoop(x[t], ToVec(l.input_layernorm), eps, offset);
      q[t] = MatVec(l.q_proj, h, l.q_bias);
      k[t] = MatVec(l.k_proj, h, l.k_bias);
      v[t] = MatVec(l.v_proj, h, l.v_bias);
      auto per_head = [&](Vec& all, size_t n_heads, const at::Tensor& norm) {
        for (size_t hd = 0; hd < n_heads; ++hd) {
          Vec head(all.begin() + hd * d, all.begin() + (hd + 1) * d);
          if (c.qk_norm) head = RmsNormLoop(head, ToVec(norm), eps, offset);
          head = RopeLoop(head, static_cast<int64_t>(t), theta, factor);
          std::copy(head.begin(), head.end(), all.begin() + hd * d);
        }
      };
      per_head(q[t], n_head, l.q_norm);
      per_head(k[t], n_head_kv, l.k_norm);
    }
    for (size_t t = 0; t < n; ++t) {
      Vec attn(n_head * d, 0.0);
      for (size_t hq = 0; hq < n_head; ++hq) {
        const size_t hk = hq / group;
        const size_t j0 =
            window > 0 ? static_cast<size_t>(std::max<int64_t>(0, static_cast<int64_t>(t) - window + 1))
                       : 0;
        Vec scores(t + 1 - j0);
        double max_score = -1e300;
        for (size_t j = j0; j <= t; ++j) {
          double s = 0.0;
          for (size_t i = 0; i < d; ++i) s += q[t][hq * d + i] * k[j][hk * d + i];
          scores[j - j0] = s * scale;
          max_score = std::max(max_score, scores[j - j0]);
        }
        double total = 0.0;
        for (double& s : scores) total += (s = std::exp(s - max_score));
        for (size_t j = j0; j <= t; ++j) {
          for (size_t i = 0; i < d; ++i) {
            attn[hq * d + i] += scores[j - j0] / total * v[j][hk * d + i];
          }
        }
      }
      Vec o = MatVec(l.o_proj, attn, l.o_bias);
      if (c.sandwich_norms) o = RmsNormLoop(o, ToVec(l.post_attention_layernorm), eps, offset);
      for (size_t i = 0; i < e; ++i) x[t][i] += o[i];
      const Vec h2 = RmsNormLoop(
          x[t], ToVec(c.sandwich_norms ? l.pre_feedforward_layernorm : l.post_attention_layernorm),
          eps, offset);
      auto mlp = [&](const at::Tensor& gate_w, const at::Tensor& up_w, const at::Tensor& down_w) {
        const Vec gate = MatVec(gate_w, h2), up = MatVec(up_w, h2);
        Vec act(gate.size());
        for (size_t i = 0; i < gate.size(); ++i) {
          const double g = c.hidden_act == Activation::kGeluTanh
                               ? GeluTanh(gate[i])
                               : gate[i] / (1.0 + std::exp(-gate[i]));
          act[i] = g * up[i];
        }
        return MatVec(down_w, act);
      };
      Vec down;
      if (c.IsMoeLayer(static_cast<int64_t>(il))) {
        // Softmax over the router's logits, the top k experts, their
        // probabilities (renormalized with norm_topk_prob) weighting outputs.
        const Vec logit = MatVec(l.router, h2);
        const double top = *std::max_element(logit.begin(), logit.end());
        Vec prob(logit.size());
        double total = 0.0;
        for (size_t x = 0; x < logit.size(); ++x) total += (prob[x] = std::exp(logit[x] - top));
        for (double& p : prob) p /= total;
        std::vector<size_t> order(prob.size());
        for (size_t x = 0; x < order.size(); ++x) order[x] = x;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] > prob[b]; });
        order.resize(static_cast<size_t>(c.n_expert_used));
        double chosen = 0.0;
        for (size_t x : order) chosen += prob[x];
        down.assign(e, 0.0);
        for (size_t x : order) {
          const Vec y = mlp(l.expert_gate[x], l.expert_up[x], l.expert_down[x]);
          const double weight = c.norm_topk_prob ? prob[x] / chosen : prob[x];
          for (size_t i = 0; i < e; ++i) down[i] += weight * y[i];
        }
      } else {
        down = mlp(l.gate_proj, l.up_proj, l.down_proj);
      }
      if (c.sandwich_norms) down = RmsNormLoop(down, ToVec(l.post_feedforward_layernorm), eps, offset);
      for (size_t i = 0; i < e; ++i) x[t][i] += down[i];
    }
  }
  std::vector<Vec> logits(n);
  for (size_t t = 0; t < n; ++t) {
    logits[t] = MatVec(w.lm_head, RmsNormLoop(x[t], ToVec(w.norm), eps, offset));
    if (c.final_logit_softcapping > 0) {
      for (double& z : logits[t]) {
        z = c.final_logit_softcapping * std::tanh(z / c.final_logit_softcapping);
      }
    }
  }
  return logits;
}

TEST(ReferenceForward, MatchesHandWrittenLoops) {
  // fp32 reference vs float64 loops on O(1) activations: 1e-5 covers fp32
  // rounding through 2 layers (observed ~1e-6).
  for (const TinyModel& m : {TinyModel{"qwen3_gqa_bias", true, true, false, 4, 2},
                             TinyModel{"llama_tied", false, false, true, 4, 4}}) {
    SCOPED_TRACE(m.name);
    const ModelConfig config =
        TinyConfig(m, /*n_layer=*/2, /*hidden=*/8, /*head_dim=*/4, /*vocab=*/13);
    const ModelWeights w = RandomWeights(config, 7);
    const std::vector<int64_t> ids = {3, 11, 0, 7, 7, 12};
    const std::vector<Vec> want = OracleForward(config, w, ids);
    const at::Tensor got = ReferenceForward(config, w, at::tensor(ids).unsqueeze(0)).logits[0];
    ASSERT_EQ(got.size(0), static_cast<int64_t>(ids.size()));
    double max_diff = 0.0, max_abs = 0.0;
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t j = 0; j < config.vocab_size; ++j) {
        max_diff = std::max(max_diff, std::abs(got[t][j].item<double>() - want[t][j]));
        max_abs = std::max(max_abs, std::abs(want[t][j]));
      }
    }
    EXPECT_LT(max_diff, 1e-5);
    EXPECT_GT(max_abs, 0.1);  // the comparison is not between near-zero numbers
  }
}

TEST(ReferenceForward, TheWindowMatchesHandWrittenLoops) {
  // Window 3 over 9 tokens: from position 3 on, the first keys drop out.
  const ModelConfig config = MistralConfig(3, /*n_layer=*/2, /*hidden=*/8, /*head_dim=*/4, 13);
  const ModelWeights w = RandomWeights(config, 7);
  const std::vector<int64_t> ids = {3, 11, 0, 7, 7, 12, 5, 1, 9};
  const std::vector<Vec> want = OracleForward(config, w, ids);
  const at::Tensor got = ReferenceForward(config, w, at::tensor(ids).unsqueeze(0)).logits[0];
  double max_diff = 0.0;
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t j = 0; j < config.vocab_size; ++j) {
      max_diff = std::max(max_diff, std::abs(got[t][j].item<double>() - want[t][j]));
    }
  }
  EXPECT_LT(max_diff, 1e-5);
  // The window matters: without it the logits past position 2 differ.
  ModelConfig full = config;
  full.sliding_window = 0;
  const std::vector<Vec> unwindowed = OracleForward(full, w, ids);
  double window_effect = 0.0;
  for (int64_t j = 0; j < config.vocab_size; ++j) {
    EXPECT_DOUBLE_EQ(unwindowed[2][j], want[2][j]);  // position 2 sees all 3 keys either way
    window_effect = std::max(window_effect, std::abs(unwindowed[8][j] - want[8][j]));
  }
  EXPECT_GT(window_effect, 1e-2);
}

TEST(ReferenceForward, GemmaMatchesHandWrittenLoops) {
  // Twelve tokens: the sliding layers' window (3) drops keys from position 3 on.
  const ModelConfig config = GemmaConfig(/*n_layer=*/4, /*hidden=*/8, /*head_dim=*/4, 13);
  const ModelWeights w = RandomWeights(config, 7);
  const std::vector<int64_t> ids = {3, 11, 0, 7, 7, 12, 5, 1, 9, 2, 4, 10};
  const std::vector<Vec> want = OracleForward(config, w, ids);
  const at::Tensor got = ReferenceForward(config, w, at::tensor(ids).unsqueeze(0)).logits[0];
  double max_diff = 0.0, max_abs = 0.0;
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t j = 0; j < config.vocab_size; ++j) {
      max_diff = std::max(max_diff, std::abs(got[t][j].item<double>() - want[t][j]));
      max_abs = std::max(max_abs, std::abs(want[t][j]));
    }
  }
  EXPECT_LT(max_diff, 1e-5);
  EXPECT_GT(max_abs, 0.5);
  EXPECT_LE(max_abs, config.final_logit_softcapping);
  // Each Gemma-3 part changes the result: the oracle without it differs.
  auto effect = [&](const ModelConfig& changed) {
    const std::vector<Vec> other = OracleForward(changed, w, ids);
    double diff = 0.0;
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t j = 0; j < config.vocab_size; ++j) {
        diff = std::max(diff, std::abs(other[t][j] - want[t][j]));
      }
    }
    return diff;
  };
  ModelConfig c = config;
  c.sliding_layers.assign(4, false);
  EXPECT_GT(effect(c), 1e-3) << "windows";
  c = config;
  c.rope_local_theta = 0;
  EXPECT_GT(effect(c), 1e-3) << "local RoPE base";
  c = config;
  c.rope_scaling_factor = 1;
  EXPECT_GT(effect(c), 1e-3) << "linear RoPE scaling";
  c = config;
  c.norm_weight_offset = false;
  EXPECT_GT(effect(c), 1e-3) << "1 + w";
  c = config;
  c.query_pre_attn_scalar = 0;
  EXPECT_GT(effect(c), 1e-3) << "attention scalar";
  c = config;
  c.hidden_act = Activation::kSilu;
  EXPECT_GT(effect(c), 1e-3) << "GELU";
  c = config;
  c.scale_embeddings = false;
  EXPECT_GT(effect(c), 1e-3) << "embedding scale";
}

TEST(ReferenceForward, MixtureOfExpertsMatchesHandWrittenLoops) {
  const ModelConfig config = MoeConfig(/*n_layer=*/3, /*hidden=*/8, /*head_dim=*/4, 13);
  const ModelWeights w = RandomWeights(config, 7);
  ASSERT_TRUE(w.layers[0].router.defined());
  ASSERT_FALSE(w.layers[1].router.defined());  // mlp_only_layers
  const std::vector<int64_t> ids = {3, 11, 0, 7, 7, 12, 5, 1, 9};
  for (bool renormalize : {true, false}) {
    SCOPED_TRACE(renormalize);
    ModelConfig c = config;
    c.norm_topk_prob = renormalize;
    const std::vector<Vec> want = OracleForward(c, w, ids);
    const at::Tensor got = ReferenceForward(c, w, at::tensor(ids).unsqueeze(0)).logits[0];
    double max_diff = 0.0, max_abs = 0.0;
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t j = 0; j < c.vocab_size; ++j) {
        max_diff = std::max(max_diff, std::abs(got[t][j].item<double>() - want[t][j]));
        max_abs = std::max(max_abs, std::abs(want[t][j]));
      }
    }
    EXPECT_LT(max_diff, 1e-5);
    EXPECT_GT(max_abs, 0.1);
  }
}

// ---------------------------------------------------------------------------
// Cached path vs reference.

struct CachedCase {
  TinyModel model;
  int64_t chunk;             // prefill chunk (awkward on purpose)
  int64_t max_scores_bytes;  // small values force several query blocks per chunk
};

class CachedDecoderTest : public ::testing::TestWithParam<CachedCase> {};

// Runs ids[0, n_prefill) in chunks, then one token at a time; returns [T, V].
at::Tensor RunCached(Decoder& decoder, KvCache& cache, const at::Tensor& ids, int64_t n_prefill,
                     int64_t chunk) {
  std::vector<at::Tensor> rows;
  for (int64_t i0 = 0; i0 < n_prefill; i0 += chunk) {
    rows.push_back(
        decoder.Forward(cache, ids.narrow(0, i0, std::min(chunk, n_prefill - i0)), true));
  }
  for (int64_t t = n_prefill; t < ids.numel(); ++t) {
    rows.push_back(decoder.Forward(cache, ids.narrow(0, t, 1), false));
  }
  return at::cat(rows, 0);
}

// A decoder made with `opts` runs ids as RunCached does (27 prefill tokens
// in `chunk`s, then one at a time): every position's logits are within 1e-4
// of `ref_logits` [T, V] (the fused and chunked path reorders float32 sums
// only). *line, when given, receives the cache line, for its taps.
void ExpectCachedMatchesReference(const ModelConfig& config, const ModelWeights& w,
                                  const at::Tensor& ids, const at::Tensor& ref_logits,
                                  const DecoderOptions& opts, int64_t chunk,
                                  std::unique_ptr<KvCache>* line = nullptr) {
  auto decoder = Decoder::Create(config, w, opts);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  auto cache = (*decoder)->NewCache();
  at::Tensor logits;
  {
    c10::InferenceMode guard;
    logits = RunCached(**decoder, *cache, ids, 27, chunk);
  }
  ASSERT_EQ(logits.sizes(), ref_logits.sizes());
  for (int64_t t = 0; t < ids.numel(); ++t) {
    ASSERT_LT(MaxAbsDiff(logits[t], ref_logits[t]), 1e-4) << "position " << t;
  }
  if (line != nullptr) *line = std::move(cache);
}

TEST_P(CachedDecoderTest, MatchesReferenceAtEveryPosition) {
  const CachedCase& p = GetParam();
  const ModelConfig config = TinyConfig(p.model);
  const ModelWeights w = RandomWeights(config, 11);
  const at::Tensor ids = RandomIds(config.vocab_size, {41}, 101);
  const ReferenceOutput ref = ReferenceForward(config, w, ids.unsqueeze(0), Capture());

  for (KeyTapMode mode : {KeyTapMode::kInvert, KeyTapMode::kStorePreNorm}) {
    DecoderOptions opts;
    opts.max_scores_bytes = p.max_scores_bytes;
    opts.tap_mode = mode;
    std::unique_ptr<KvCache> cache;
    ASSERT_NO_FATAL_FAILURE(
        ExpectCachedMatchesReference(config, w, ids, ref.logits[0], opts, p.chunk, &cache));

    // Taps give the keys the forward computed before k-norm/RoPE. kStorePreNorm
    // keeps them (so only the fused-vs-separate projection rounding, ~1e-7,
    // separates them from the reference); kInvert reconstructs them in float32
    // (a few ulp of the head vector more).
    auto taps = cache->Taps(0, ids.numel());
    ASSERT_TRUE(taps.ok()) << taps.status();
    for (int64_t il = 0; il < config.n_layer; ++il) {
      EXPECT_LT(MaxAbsDiff(taps->keys[il], ref.keys_prenorm[il][0]), 1e-5) << "layer " << il;
      EXPECT_LT(MaxAbsDiff(taps->values[il], ref.values[il][0]), 1e-5) << "layer " << il;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, CachedDecoderTest,
    ::testing::Values(CachedCase{{"qwen3_gqa", true, false, false, 4, 2}, 7, 16 << 20},
                      CachedCase{{"qwen3_gqa_blocks", true, false, true, 4, 2}, 11, 2048},
                      CachedCase{{"qwen3_mqa_bias", true, true, false, 4, 1}, 5, 4096},
                      CachedCase{{"llama_mha", false, false, false, 4, 4}, 7, 16 << 20},
                      CachedCase{{"llama_gqa_bias", false, true, true, 4, 2}, 9, 3000}),
    [](const auto& info) { return std::string(info.param.model.name); });

// A windowed model's cached decoder equals the reference at every position,
// across the window's boundary: chunks shorter and longer than the window,
// query blocks that straddle it, one-token steps by the raw loops and by the
// tensor path.
TEST(CachedDecoderWindow, MatchesReferenceAtEveryPosition) {
  struct Case {
    int64_t window, chunk, max_scores_bytes;
    bool raw_decode;
  };
  for (const Case& p : {Case{5, 7, 16 << 20, true}, Case{5, 3, 16 << 20, false},
                        Case{8, 11, 2048, true}, Case{1, 4, 16 << 20, true},
                        Case{64, 9, 16 << 20, true}}) {
    SCOPED_TRACE(::testing::Message() << "window " << p.window << " chunk " << p.chunk
                                      << " scores " << p.max_scores_bytes << " raw "
                                      << p.raw_decode);
    const ModelConfig config = MistralConfig(p.window);
    const ModelWeights w = RandomWeights(config, 11);
    const at::Tensor ids = RandomIds(config.vocab_size, {41}, 101);
    const ReferenceOutput ref = ReferenceForward(config, w, ids.unsqueeze(0));
    DecoderOptions opts;
    opts.max_scores_bytes = p.max_scores_bytes;
    opts.raw_decode_attention = p.raw_decode;
    ASSERT_NO_FATAL_FAILURE(
        ExpectCachedMatchesReference(config, w, ids, ref.logits[0], opts, p.chunk));
  }
}

// Rows of one batch step (a prefill chunk and decode steps on lines of
// different lengths) equal each row run alone: per-row positions, windows,
// RoPE tables and (mixture of experts) routing.
void ExpectBatchedRowsEqualRowsAlone(const ModelConfig& config, uint64_t seed) {
  const ModelWeights w = RandomWeights(config, seed);
  auto decoder = Decoder::Create(config, w, {});
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  c10::InferenceMode guard;
  const at::Tensor ids = RandomIds(config.vocab_size, {30}, 5);
  const std::vector<int64_t> history = {3, 17, 9};  // tokens already in each line
  const std::vector<int64_t> step = {1, 1, 8};      // tokens each row runs in the step
  std::vector<std::unique_ptr<KvCache>> batched, alone;
  std::vector<Decoder::Row> rows;
  for (size_t r = 0; r < history.size(); ++r) {
    for (auto* lines : {&batched, &alone}) {
      lines->push_back((*decoder)->NewCache());
      (*decoder)->Forward(*lines->back(), ids.narrow(0, 0, history[r]), true);
    }
    rows.push_back({batched[r].get(), ids.narrow(0, history[r], step[r]), true});
  }
  const std::vector<at::Tensor> got = (*decoder)->ForwardBatch(rows);
  for (size_t r = 0; r < history.size(); ++r) {
    const at::Tensor want = (*decoder)->Forward(*alone[r], ids.narrow(0, history[r], step[r]), true);
    EXPECT_LT(MaxAbsDiff(got[r], want), 1e-5) << "row " << r;
  }
}

TEST(CachedDecoderWindow, BatchedRowsEqualRowsAlone) {
  ExpectBatchedRowsEqualRowsAlone(MistralConfig(6), 12);
}

// A Gemma-3-style model's cached decoder equals the reference at every
// position, in both key tap modes, with chunks and query blocks across the
// sliding layers' window and both decode paths; its taps are the
// reference's keys before k-norm and RoPE, through each layer's own RoPE.
TEST(CachedDecoderGemma, MatchesReferenceAtEveryPosition) {
  const ModelConfig config = GemmaConfig();
  const ModelWeights w = RandomWeights(config, 11);
  const at::Tensor ids = RandomIds(config.vocab_size, {41}, 101);
  const ReferenceOutput ref = ReferenceForward(config, w, ids.unsqueeze(0), Capture());
  struct Case {
    int64_t chunk, max_scores_bytes;
    bool raw_decode;
    KeyTapMode mode;
  };
  for (const Case& p : {Case{7, 16 << 20, true, KeyTapMode::kInvert},
                        Case{2, 16 << 20, false, KeyTapMode::kStorePreNorm},
                        Case{11, 2048, true, KeyTapMode::kStorePreNorm}}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << p.chunk << " scores " << p.max_scores_bytes
                                      << " raw " << p.raw_decode);
    DecoderOptions opts;
    opts.max_scores_bytes = p.max_scores_bytes;
    opts.raw_decode_attention = p.raw_decode;
    opts.tap_mode = p.mode;
    std::unique_ptr<KvCache> cache;
    ASSERT_NO_FATAL_FAILURE(
        ExpectCachedMatchesReference(config, w, ids, ref.logits[0], opts, p.chunk, &cache));
    // Relative to each layer's largest element: Gemma's scaled embeddings
    // and (1 + w) norms make keys and values several times larger.
    auto taps = cache->Taps(0, ids.numel());
    ASSERT_TRUE(taps.ok()) << taps.status();
    for (int64_t il = 0; il < config.n_layer; ++il) {
      const at::Tensor& keys = ref.keys_prenorm[il][0];
      const at::Tensor& values = ref.values[il][0];
      EXPECT_LT(MaxAbsDiff(taps->keys[il], keys), 2e-6 * keys.abs().max().item<double>())
          << "layer " << il;
      EXPECT_LT(MaxAbsDiff(taps->values[il], values), 2e-6 * values.abs().max().item<double>())
          << "layer " << il;
    }
  }
}

TEST(CachedDecoderGemma, BatchedRowsEqualRowsAlone) {
  ExpectBatchedRowsEqualRowsAlone(GemmaConfig(), 12);
}

// A Qwen3-MoE-style model's cached decoder equals the reference at every
// position (prefill chunks route many tokens per expert, decode steps one),
// and rows of one batch step, routed together, equal each row alone.
TEST(CachedDecoderMoe, MatchesReferenceAndBatchesRowByRow) {
  const ModelConfig config = MoeConfig();
  const ModelWeights w = RandomWeights(config, 11);
  const at::Tensor ids = RandomIds(config.vocab_size, {41}, 101);
  const ReferenceOutput ref = ReferenceForward(config, w, ids.unsqueeze(0));
  for (bool matrix_vector : {true, false}) {
    DecoderOptions opts;
    opts.matrix_vector_decode = matrix_vector;
    ASSERT_NO_FATAL_FAILURE(ExpectCachedMatchesReference(config, w, ids, ref.logits[0], opts, 7));
  }
  ExpectBatchedRowsEqualRowsAlone(config, 11);
}

TEST(DecoderTaps, InvertedKeysMatchStoredKeys) {
  // Both modes run identical forward arithmetic; the difference is the
  // inversion error alone: float32 rounding of k-norm/RoPE and their inverse,
  // a few ulp relative to the largest element of the head vector.
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  const ModelWeights w = RandomWeights(config, 3);
  const at::Tensor ids = RandomIds(config.vocab_size, {300}, 102);
  std::vector<at::Tensor> keys;
  for (KeyTapMode mode : {KeyTapMode::kInvert, KeyTapMode::kStorePreNorm}) {
    auto decoder = Decoder::Create(config, w, WithMode(mode));
    ASSERT_TRUE(decoder.ok());
    auto cache = (*decoder)->NewCache();
    {
      c10::InferenceMode guard;
      (*decoder)->Forward(*cache, ids, false);
    }
    keys.push_back(cache->Taps(0, 300)->keys);
  }
  const at::Tensor scale = keys[1].abs().amax(-1, /*keepdim=*/true);
  const double rel = ((keys[0] - keys[1]).abs() / scale).max().item<double>();
  EXPECT_LT(rel, 2e-6);
}

TEST(DecoderTaps, AcceptedSpanDecodesLikeNative) {
  for (const ModelConfig& config : {TinyConfig({"qwen3", true, false, false, 4, 2}),
                                    TinyConfig({"llama_bias", false, true, false, 4, 2}),
                                    GemmaConfig()}) {
    SCOPED_TRACE(config.model_type);
    const ModelWeights w = RandomWeights(config, 5);
    auto decoder = Decoder::Create(config, w, {});
    ASSERT_TRUE(decoder.ok());
    const at::Tensor ids = RandomIds(config.vocab_size, {32}, 103);
    c10::InferenceMode guard;
    auto native = (*decoder)->NewCache();
    const at::Tensor native_logits = RunCached(**decoder, *native, ids, 24, 24).narrow(0, 24, 8);

    auto taps = native->Taps(0, 24);
    ASSERT_TRUE(taps.ok());
    auto fresh = (*decoder)->NewCache();
    ASSERT_TRUE(fresh->Accept(taps->keys, taps->values).ok());
    ASSERT_EQ(fresh->Length(), 24);
    ASSERT_EQ(fresh->Spans().size(), 1u);
    EXPECT_FALSE(fresh->Spans()[0].native);
    std::vector<at::Tensor> rows;
    for (int64_t t = 24; t < 32; ++t)
      rows.push_back((*decoder)->Forward(*fresh, ids.narrow(0, t, 1), false));
    EXPECT_LT(MaxAbsDiff(at::cat(rows, 0), native_logits), 1e-5);

    // The accepted span is foreign: never tapped again. The native tail is.
    EXPECT_EQ(fresh->Taps(20, 26).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(fresh->Taps(24, 31).ok());
  }
}

// A span accepted thin (ModelConfig::UnreadTokens: a sliding layer keeps its
// last W - 1 tokens, zeros before) decodes exactly as the whole span does;
// one token fewer kept in any sliding layer changes what the next query
// reads, so the counts are the least that decodes unchanged.
TEST(DecoderTaps, AThinSpanDecodesExactlyLikeTheWholeOne) {
  for (const ModelConfig& config : {MistralConfig(5), GemmaConfig()}) {
    SCOPED_TRACE(config.model_type);
    const ModelWeights w = RandomWeights(config, 6);
    auto decoder = Decoder::Create(config, w, {});
    ASSERT_TRUE(decoder.ok());
    const at::Tensor ids = RandomIds(config.vocab_size, {32}, 105);
    c10::InferenceMode guard;
    auto native = (*decoder)->NewCache();
    RunCached(**decoder, *native, ids, 24, 24);
    auto taps = native->Taps(4, 24);  // a span after a native start
    ASSERT_TRUE(taps.ok());
    auto continued = [&](const std::vector<int64_t>& unread) {
      auto line = (*decoder)->NewCache();
      RunCached(**decoder, *line, ids.narrow(0, 0, 4), 4, 4);
      EXPECT_TRUE(line->Accept(taps->keys, taps->values, unread).ok());
      // A prefill chunk then single decoded tokens.
      std::vector<at::Tensor> rows = {
          (*decoder)->Forward(*line, ids.narrow(0, 24, 3), /*all_logits=*/true)};
      for (int64_t t = 27; t < 32; ++t)
        rows.push_back((*decoder)->Forward(*line, ids.narrow(0, t, 1), false));
      return std::pair{at::cat(rows, 0), std::move(line)};
    };
    const auto [whole, whole_line] = continued({});
    const std::vector<int64_t> unread = config.UnreadTokens(4, 24);
    ASSERT_EQ(static_cast<int64_t>(unread.size()), config.n_layer);
    for (int64_t il = 0; il < config.n_layer; ++il) {
      EXPECT_EQ(unread[il], config.IsSlidingLayer(il) ? 20 - (config.sliding_window - 1) : 0);
    }
    const auto [thin, thin_line] = continued(unread);
    EXPECT_TRUE(at::equal(thin, whole));
    ASSERT_EQ(thin_line->Spans().size(), 3u);
    EXPECT_TRUE(thin_line->Spans()[1].thin);
    EXPECT_FALSE(whole_line->Spans()[1].thin);
    // The unread entries are zeros, the read ones the whole span's.
    for (int64_t il = 0; il < config.n_layer; ++il) {
      const int64_t u = unread[il];
      if (u > 0) {
        EXPECT_EQ(thin_line->Keys(il).narrow(1, 4, u).abs().max().item<float>(), 0.0f);
        EXPECT_EQ(thin_line->Values(il).narrow(1, 4, u).abs().max().item<float>(), 0.0f);
      }
      EXPECT_TRUE(at::equal(thin_line->Keys(il).narrow(1, 4 + u, 20 - u),
                            whole_line->Keys(il).narrow(1, 4 + u, 20 - u)));
    }
    // One more token unread in the first sliding layer: the query at 24 reads
    // a zero there, and the logits change.
    std::vector<int64_t> more = unread;
    for (int64_t il = 0; il < config.n_layer; ++il) {
      if (config.IsSlidingLayer(il)) {
        ++more[il];
        break;
      }
    }
    EXPECT_FALSE(at::allclose(continued(more).first, whole, 1e-4, 1e-4));
    // Nothing goes on from inside the thin span; from its ends it may.
    EXPECT_EQ(thin_line->ExtendablePrefix(30), 30);
    EXPECT_EQ(thin_line->ExtendablePrefix(24), 24);
    EXPECT_EQ(thin_line->ExtendablePrefix(23), 4);
    EXPECT_EQ(thin_line->ExtendablePrefix(4), 4);
    EXPECT_EQ(whole_line->ExtendablePrefix(23), 23);
    // Neither a copy nor a rollback may end inside it either.
    EXPECT_EQ(thin_line->ClonePrefix(23, 23).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(thin_line->Rollback(23).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(thin_line->Length(), 32);
    auto copy = thin_line->ClonePrefix(24, 24);
    ASSERT_TRUE(copy.ok());
    EXPECT_TRUE((*copy)->Spans().back().thin);
    // A second translated span after it stays apart: the line may be cut
    // back to where it starts.
    ASSERT_TRUE(thin_line->Rollback(24).ok());
    ASSERT_TRUE(thin_line->Accept(taps->keys, taps->values).ok());
    ASSERT_EQ(thin_line->Spans().size(), 3u);
    EXPECT_FALSE(thin_line->Spans()[2].native);
    EXPECT_FALSE(thin_line->Spans()[2].thin);
    EXPECT_TRUE(thin_line->Rollback(24).ok());
    EXPECT_TRUE(thin_line->Rollback(4).ok());
    EXPECT_EQ(thin_line->Spans().size(), 1u);
  }
}

TEST(DecoderRollback, RedecodeEqualsStraightRun) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  const ModelWeights w = RandomWeights(config, 9);
  auto decoder = Decoder::Create(config, w, {});
  ASSERT_TRUE(decoder.ok());
  const at::Tensor ids = RandomIds(config.vocab_size, {30}, 104);
  const at::Tensor other = (ids + 1).remainder(config.vocab_size);
  c10::InferenceMode guard;
  auto cache = (*decoder)->NewCache();
  const at::Tensor straight = RunCached(**decoder, *cache, ids, 12, 12);
  // Rewind, take a different path, rewind again and redo the original one.
  ASSERT_TRUE(cache->Rollback(18).ok());
  for (int64_t t = 18; t < 25; ++t) (*decoder)->Forward(*cache, other.narrow(0, t, 1), false);
  ASSERT_TRUE(cache->Rollback(18).ok());
  std::vector<at::Tensor> rows;
  for (int64_t t = 18; t < 30; ++t)
    rows.push_back((*decoder)->Forward(*cache, ids.narrow(0, t, 1), false));
  EXPECT_LT(MaxAbsDiff(at::cat(rows, 0), straight.narrow(0, 18, 12)), 1e-6);
  EXPECT_EQ(cache->Length(), 30);
}

TEST(DecoderBf16, StaysCloseToFloat32) {
  // bf16 keeps 8 significant bits (relative rounding 2^-9); through 2 layers
  // of O(1) activations the logit error grows to a few % of the logit scale.
  // HF's own bf16 arithmetic (the bf16 reference) and the cached bf16 path,
  // as a share of the largest |logit| away from float32 (the test prints
  // them): the Qwen3-style model 3.9% and 2.6% on an Intel Xeon with AMX,
  // 2.5% and 3.0% on an AMD EPYC without AVX-512; the windowed Mistral-style
  // one (window 5 of 24 tokens) 1.8% and 4.9% on the EPYC. Bound: 6%, and the
  // greedy choice agrees at >= 90% of positions. The Gemma-3-style one loses
  // more to bfloat16 in HF's own arithmetic (8.3% and 8.7% on the EPYC: its
  // soft-capped logits are at most 5, and its activations are several times
  // larger): bound 10%.
  for (const ModelConfig& config :
       {TinyConfig({"qwen3", true, false, false, 4, 2}), MistralConfig(5), GemmaConfig()}) {
    SCOPED_TRACE(config.model_type);
    const ModelWeights w = RandomWeights(config, 13);
    const at::Tensor ids = RandomIds(config.vocab_size, {24}, 105);
    const at::Tensor ref = ReferenceForward(config, w, ids.unsqueeze(0)).logits[0];
    const double scale = ref.abs().max().item<double>();
    const double bound = config.architecture == Architecture::kGemma3 ? 0.10 : 0.06;
    auto decoder = Decoder::Create(config, w, WithDtype(at::kBFloat16));
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    auto cache = (*decoder)->NewCache();
    at::Tensor logits;
    {
      c10::InferenceMode guard;
      logits = RunCached(**decoder, *cache, ids, 16, 5);
    }
    EXPECT_EQ(logits.scalar_type(), at::kFloat);
    EXPECT_LT(MaxAbsDiff(logits, ref), bound * scale) << "logit scale " << scale;
    const double agree =
        (logits.argmax(-1) == ref.argmax(-1)).to(at::kDouble).mean().item<double>();
    EXPECT_GE(agree, 0.9);
    // The bf16 reference (HF's bf16 arithmetic) is as close to both.
    const at::Tensor ref_bf16 =
        ReferenceForward(config, w.To(at::kBFloat16, "cpu"), ids.unsqueeze(0)).logits[0];
    EXPECT_LT(MaxAbsDiff(logits, ref_bf16), bound * scale);
    EXPECT_LT(MaxAbsDiff(ref_bf16, ref), bound * scale);
    std::printf("%s: bf16 reference %.1f%%, cached bf16 %.1f%% of the largest |logit|\n",
                config.model_type.c_str(), 100 * MaxAbsDiff(ref_bf16, ref) / scale,
                100 * MaxAbsDiff(logits, ref) / scale);
  }
}

// A bfloat16 mixture of experts: where two router probabilities lie within
// bfloat16's rounding, the chosen experts differ from float32's and that
// position's logits jump (HF's own bf16 arithmetic does the same: on this
// model 41.5% of the largest |logit| at worst), so the bounds are on the
// greedy choice and on the share of positions within 6%. Measured on an AMD
// EPYC without AVX-512: 92% and 79% (worst position 42.6%); bounds 80% and
// 50%, as the flips depend on the CPU's bfloat16 rounding.
TEST(DecoderBf16, MixtureOfExpertsKeepsTheGreedyChoice) {
  const ModelConfig config = MoeConfig();
  const ModelWeights w = RandomWeights(config, 13);
  const at::Tensor ids = RandomIds(config.vocab_size, {24}, 105);
  const at::Tensor ref = ReferenceForward(config, w, ids.unsqueeze(0)).logits[0];
  const double scale = ref.abs().max().item<double>();
  auto decoder = Decoder::Create(config, w, WithDtype(at::kBFloat16));
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  auto cache = (*decoder)->NewCache();
  at::Tensor logits;
  {
    c10::InferenceMode guard;
    logits = RunCached(**decoder, *cache, ids, 16, 5);
  }
  const double agree = (logits.argmax(-1) == ref.argmax(-1)).to(at::kDouble).mean().item<double>();
  const at::Tensor per_position = (logits - ref).abs().amax(-1) / scale;  // [T]
  const double close = (per_position < 0.06).to(at::kDouble).mean().item<double>();
  std::printf("qwen3_moe bf16: greedy agreement %.0f%%, positions within 6%%: %.0f%%, worst %.1f%%\n",
              100 * agree, 100 * close, 100 * per_position.max().item<double>());
  EXPECT_GE(agree, 0.8);
  EXPECT_GE(close, 0.5);
}

TEST(ReferenceForward, TrainsUnderAutogradOnBatches) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  ModelWeights w = RandomWeights(config, 17);
  for (at::Tensor& t : w.All()) t.requires_grad_(true);
  const at::Tensor ids = RandomIds(config.vocab_size, {3, 10}, 106);
  const ReferenceOutput out = ReferenceForward(config, w, ids);
  ASSERT_EQ(out.logits.sizes(), (std::vector<int64_t>{3, 10, config.vocab_size}));
  // Rows of a batch are independent sequences.
  const at::Tensor single = ReferenceForward(config, w, ids.narrow(0, 1, 1)).logits;
  EXPECT_LT(MaxAbsDiff(out.logits.narrow(0, 1, 1).detach(), single.detach()), 1e-5);
  at::Tensor loss =
      at::cross_entropy_loss(out.logits.reshape({-1, config.vocab_size}).narrow(0, 0, 29),
                             ids.reshape({-1}).narrow(0, 1, 29));
  loss.backward();
  for (const at::Tensor& t : w.All()) {
    ASSERT_TRUE(t.grad().defined());
    EXPECT_TRUE(at::isfinite(t.grad()).all().item<bool>());
  }
  EXPECT_GT(w.layers[0].k_proj.grad().abs().sum().item<double>(), 0.0);
}

TEST(ReferenceForward, InjectedPrefixActsLikeNativeKeysAndCarriesGradients) {
  // The distillation setting: frozen weights, a prefix of pre-norm keys and
  // values given from outside. Fed the model's own prefix, the suffix logits
  // equal those of the full sequence; gradients reach the injected tensors.
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  const ModelWeights w = RandomWeights(config, 19);
  const at::Tensor ids = RandomIds(config.vocab_size, {2, 16}, 107);
  const ReferenceOutput full = ReferenceForward(config, w, ids, Capture());
  ReferenceOptions opts;
  for (int64_t il = 0; il < config.n_layer; ++il) {
    opts.prefix_keys.push_back(
        full.keys_prenorm[il].narrow(2, 0, 10).detach().clone().requires_grad_(true));
    opts.prefix_values.push_back(
        full.values[il].narrow(2, 0, 10).detach().clone().requires_grad_(true));
  }
  const ReferenceOutput suffix = ReferenceForward(config, w, ids.narrow(1, 10, 6), opts);
  EXPECT_LT(MaxAbsDiff(suffix.logits.detach(), full.logits.narrow(1, 10, 6).detach()), 1e-5);
  suffix.logits.logsumexp(-1).sum().backward();
  for (int64_t il = 0; il < config.n_layer; ++il) {
    ASSERT_TRUE(opts.prefix_keys[il].grad().defined());
    EXPECT_GT(opts.prefix_keys[il].grad().abs().sum().item<double>(), 0.0);
    EXPECT_GT(opts.prefix_values[il].grad().abs().sum().item<double>(), 0.0);
  }
  EXPECT_FALSE(w.layers[0].q_proj.grad().defined());
}

TEST(Decoder, CreateRejectsBadOptions) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  const ModelWeights w = RandomWeights(config, 1);
  EXPECT_EQ(Decoder::Create(config, w, WithDevice("cuda")).status().code(),
            at::hasCUDA() ? absl::StatusCode::kOk : absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Decoder::Create(config, w, WithDevice("nonsense")).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig odd = config;
  odd.n_head_kv = 3;
  EXPECT_EQ(Decoder::Create(odd, w, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Decoder, ZeroKNormWeightFallsBackToStoredKeys) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  ModelWeights w = RandomWeights(config, 1);
  w.layers[1].k_norm[3] = 0.0;  // k-norm no longer invertible
  auto decoder = Decoder::Create(config, w, WithMode(KeyTapMode::kInvert));
  ASSERT_TRUE(decoder.ok());
  EXPECT_EQ((*decoder)->tap_mode(), KeyTapMode::kStorePreNorm);
  const at::Tensor ids = RandomIds(config.vocab_size, {6}, 108);
  const ReferenceOutput ref = ReferenceForward(config, w, ids.unsqueeze(0), Capture());
  auto cache = (*decoder)->NewCache();
  {
    c10::InferenceMode guard;
    (*decoder)->Forward(*cache, ids, false);
  }
  EXPECT_LT(MaxAbsDiff(cache->Taps(0, 6)->keys[1], ref.keys_prenorm[1][0]), 1e-5);
}

}  // namespace
}  // namespace kvl
