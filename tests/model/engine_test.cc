// The engine: chunked prefill, decode and generation with stop conditions,
// checked against the reference forward.
#include "model/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/model_dir.h"
#include "model/reference.h"
#include "tests/model/test_models.h"

namespace kvl {
namespace {

using testing::MaxAbsDiff;
using testing::RandomWeights;
using testing::TinyConfig;

using testing::MakeEngine;
using testing::TinyCheckpoint;

// Greedy continuation computed with the reference forward alone.
std::vector<int64_t> ReferenceGreedy(const Checkpoint& c, std::vector<int64_t> ids, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    const at::Tensor logits =
        ReferenceForward(c.config, c.weights, at::tensor(ids).unsqueeze(0)).logits;
    out.push_back(logits[0][-1].argmax().item<int64_t>());
    ids.push_back(out.back());
  }
  return out;
}

// The cascade's score of a turn, against log-probabilities and an entropy
// computed from the reference forward over history + turn in one pass.
TEST(Engine, ScoreContinuationMatchesTheReferenceAndKeepsAllButTheLastToken) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c, 3);
  const std::vector<int64_t> history = {1, 5, 9, 2};
  const std::vector<int64_t> turn = {33, 60, 0, 7, 41};
  auto cache = engine->NewCache();
  ASSERT_TRUE(engine->Prefill(*cache, history).ok());
  auto score = engine->ScoreContinuation(*cache, turn);
  ASSERT_TRUE(score.ok()) << score.status();
  EXPECT_EQ(score->n_scored, 4);
  EXPECT_EQ(cache->Length(), 4 + 4);  // the turn's last token is left to the caller

  std::vector<int64_t> all = history;
  all.insert(all.end(), turn.begin(), turn.end());
  const at::Tensor lp = at::log_softmax(
      ReferenceForward(c.config, c.weights, at::tensor(all).unsqueeze(0)).logits[0].to(at::kDouble),
      -1);
  double mean = 0;
  for (size_t i = 1; i < turn.size(); ++i) {
    mean += lp[history.size() + i - 1][turn[i]].item<double>();
  }
  mean /= static_cast<double>(turn.size() - 1);
  const at::Tensor last = lp[all.size() - 1];
  const double entropy = -(last.exp() * last).sum().item<double>();
  // float32 decoder against a float32 reference, in nats.
  EXPECT_NEAR(score->mean_logprob, mean, 1e-4);
  EXPECT_NEAR(score->next_entropy, entropy, 1e-4);
  // Greedy flags against the reference's argmax (a random tiny model: the
  // given tokens are mostly not its choice).
  ASSERT_EQ(score->greedy.size(), 4u);
  for (size_t i = 1; i < turn.size(); ++i) {
    const int64_t best = lp[history.size() + i - 1].argmax().item<int64_t>();
    EXPECT_EQ(score->greedy[i - 1], best == turn[i]) << i;
  }
  // A continuation made of the model's own choices is greedy throughout.
  std::vector<int64_t> own = {turn[0]};
  {
    auto probe = engine->NewCache();
    std::vector<int64_t> ids = history;
    ids.push_back(turn[0]);
    for (int i = 0; i < 3; ++i) {
      auto logits = engine->Prefill(*probe, ids, true);
      ASSERT_TRUE(logits.ok());
      own.push_back(logits->select(0, logits->size(0) - 1).argmax().item<int64_t>());
      ids.push_back(own.back());
      probe = engine->NewCache();
    }
  }
  auto own_cache = engine->NewCache();
  ASSERT_TRUE(engine->Prefill(*own_cache, history).ok());
  auto own_score = engine->ScoreContinuation(*own_cache, own);
  ASSERT_TRUE(own_score.ok());
  EXPECT_EQ(own_score->greedy, std::vector<bool>(3, true));
  EXPECT_EQ(engine->ScoreContinuation(*cache, {3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Length(), 8);
}

TEST(Engine, PrefillInChunksMatchesReference) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c, 4);
  EXPECT_EQ(engine->options().n_threads, 2);
  const std::vector<int64_t> ids = {1, 5, 9, 2, 33, 60, 0, 7, 7, 8, 41};
  auto cache = engine->NewCache();
  auto all = engine->Prefill(*cache, ids, /*all_logits=*/true);
  ASSERT_TRUE(all.ok()) << all.status();
  const at::Tensor ref =
      ReferenceForward(c.config, c.weights, at::tensor(ids).unsqueeze(0)).logits[0];
  EXPECT_LT(MaxAbsDiff(*all, ref), 1e-4);
  auto next = engine->Decode(*cache, 3);
  ASSERT_TRUE(next.ok());
  std::vector<int64_t> longer = ids;
  longer.push_back(3);
  const at::Tensor ref2 =
      ReferenceForward(c.config, c.weights, at::tensor(longer).unsqueeze(0)).logits[0][-1];
  EXPECT_LT(MaxAbsDiff(*next, ref2), 1e-4);
  EXPECT_EQ(cache->Length(), 12);
}

TEST(Engine, GreedyGenerationFollowsTheReference) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  const std::vector<int64_t> prompt = {4, 8, 15, 16, 23, 42};
  GenerateOptions opts;
  opts.max_tokens = 8;
  auto cache = engine->NewCache();
  auto result = engine->Generate(*cache, prompt, opts);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tokens, ReferenceGreedy(c, prompt, 8));
  EXPECT_EQ(result->finish_reason, FinishReason::kLength);
  // The last sampled token is not in the cache yet.
  EXPECT_EQ(cache->Length(), 6 + 8 - 1);
}

TEST(Engine, StopsAtStopTokens) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  const std::vector<int64_t> prompt = {4, 8, 15, 16, 23, 42};
  const std::vector<int64_t> greedy = ReferenceGreedy(c, prompt, 6);
  // Stop at the first occurrence of greedy[3].
  const int64_t stop = greedy[3];
  size_t first = 0;
  while (greedy[first] != stop) ++first;
  GenerateOptions opts;
  opts.max_tokens = 20;
  opts.stop_token_ids = {stop, c.config.vocab_size + 5};
  auto cache = engine->NewCache();
  auto result = engine->Generate(*cache, prompt, opts);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(result->stop_token_id, stop);
  EXPECT_EQ(result->tokens, std::vector<int64_t>(greedy.begin(), greedy.begin() + first));
  EXPECT_EQ(cache->Length(), static_cast<int64_t>(prompt.size() + first));
}

// Ids at or past vocab_limit are never sampled, greedy or not, and the
// log-probabilities are over the ids below it.
TEST(Engine, IdsPastTheVocabLimitAreNeverSampled) {
  // [8]: the best ids are 6 and 7, past the limit of 6; below it, 2.
  const at::Tensor logits = at::tensor({0.f, 1.f, 3.f, 2.f, 0.f, 1.f, 9.f, 8.f});
  GenerateOptions opts;
  opts.max_tokens = 1;
  opts.record_logprobs = true;
  GenerationState unlimited(opts);
  ASSERT_TRUE(unlimited.Step(logits).ok());
  EXPECT_EQ(unlimited.Finish().tokens, std::vector<int64_t>({6}));
  opts.vocab_limit = 6;
  GenerationState greedy(opts);
  ASSERT_TRUE(greedy.Step(logits).ok());
  const GenerateResult g = greedy.Finish();
  EXPECT_EQ(g.tokens, std::vector<int64_t>({2}));
  ASSERT_EQ(g.logprobs.size(), 1u);
  const at::Tensor below = at::log_softmax(logits.narrow(0, 0, 6), 0);
  EXPECT_NEAR(g.logprobs[0], below[2].item<double>(), 1e-6);
  // Sampled at a high temperature, many seeds: never 6 or 7.
  opts.sampling.temperature = 2.0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    opts.seed = seed;
    GenerationState sampled(opts);
    ASSERT_TRUE(sampled.Step(logits).ok());
    EXPECT_LT(sampled.Finish().tokens.at(0), 6) << "seed " << seed;
  }
}

TEST(Engine, MaxTokensAndCancellation) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  GenerateOptions opts;
  opts.sampling.temperature = 1.0;
  opts.seed = 5;
  opts.max_tokens = 3;
  auto cache = engine->NewCache();
  auto r = engine->Generate(*cache, {1, 2, 3}, opts);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 3u);
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);

  int calls = 0;
  opts.max_tokens = 10;
  opts.on_token = [&](int64_t, std::string_view) { return ++calls < 4; };
  auto cancelled = engine->Generate(*engine->NewCache(), {1, 2, 3}, opts);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(cancelled->tokens.size(), 4u);
  EXPECT_EQ(calls, 4);

  opts.max_tokens = 0;
  auto none = engine->Generate(*engine->NewCache(), {1, 2, 3}, opts);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->tokens.empty());
}

TEST(Engine, SampledGenerationIsDeterministicPerSeed) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  auto run = [&](uint64_t seed) {
    GenerateOptions opts;
    opts.sampling.temperature = 1.5;  // flat enough that seeds diverge
    opts.sampling.top_p = 0.95;
    opts.seed = seed;
    opts.max_tokens = 12;
    return engine->Generate(*engine->NewCache(), {9, 9, 9}, opts)->tokens;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST(Engine, StopStringsCutTheTextAndHoldBackPrefixes) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  const std::vector<int64_t> prompt = {4, 8, 15};
  const std::vector<int64_t> greedy = ReferenceGreedy(c, prompt, 5);
  auto text_of = [](int64_t id) { return absl::StrCat("<", id, ">"); };
  // Stop at the text of the 3rd and 4th tokens, split across tokens' text.
  const std::string t2 = text_of(greedy[2]);
  const std::string stop = t2.substr(1) + text_of(greedy[3]);  // starts inside token 3
  GenerateOptions opts;
  opts.max_tokens = 10;
  opts.token_text = text_of;
  opts.stop_strings = {stop};
  std::string streamed;
  opts.on_token = [&](int64_t, std::string_view t) {
    streamed += t;
    return true;
  };
  auto r = engine->Generate(*engine->NewCache(), prompt, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->finish_reason, FinishReason::kStopString);
  // Expected: the tokens up to the first whose text completes the stop string.
  std::string full;
  size_t n_tokens = 0;
  while (full.find(stop) == std::string::npos) full += text_of(greedy[n_tokens++]);
  EXPECT_EQ(r->text, full.substr(0, full.find(stop)));
  EXPECT_EQ(streamed, r->text);  // nothing of the stop string was streamed
  EXPECT_EQ(r->tokens, std::vector<int64_t>(greedy.begin(), greedy.begin() + n_tokens));

  opts.stop_strings = {"x"};
  opts.token_text = nullptr;
  EXPECT_EQ(engine->Generate(*engine->NewCache(), prompt, opts).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The native-depth dial's engine pass: from the residual stream a native
// prefill had at layer j's input (PrefillResiduals), ForwardLayers rewrites
// layers j..L-1 of a span exactly as that prefill wrote them, and leaves the
// layers below it alone; from layer 0 (the embeddings) the whole span is as
// a prefill's, so the next token's logits match the reference forward.
TEST(Engine, LayerPassRewritesTheTopLayersAsThePrefillWroteThem) {
  Checkpoint c;
  c.config = TinyConfig({"qwen3", true, false, false, 4, 2}, /*n_layer=*/4);
  c.config.max_position_embeddings = 64;
  c.weights = RandomWeights(c.config, 5);
  auto engine = MakeEngine(c, /*chunk=*/5);
  const std::vector<int64_t> ids = {3, 17, 9, 44, 2, 8, 60, 31, 5, 5, 12, 40, 7, 1};
  const int64_t n = static_cast<int64_t>(ids.size()), p = 4, m = n - p;
  const std::vector<int64_t> span(ids.begin() + p, ids.end());

  auto native = engine->NewCache();
  auto residuals = engine->PrefillResiduals(*native, ids);
  ASSERT_TRUE(residuals.ok()) << residuals.status();
  ASSERT_EQ(residuals->sizes(), (at::IntArrayRef{5, n, 32}));
  EXPECT_EQ(native->Length(), n);
  // Layer 0's input is the embeddings.
  EXPECT_LT(MaxAbsDiff((*residuals)[0], c.weights.embed_tokens.index_select(
                                            0, at::tensor(ids, at::kLong))),
            1e-6);
  // The line is the one Prefill writes.
  auto prefilled = engine->NewCache();
  ASSERT_TRUE(engine->Prefill(*prefilled, ids).ok());
  for (int64_t il = 0; il < 4; ++il) {
    EXPECT_LT(MaxAbsDiff(native->Keys(il), prefilled->Keys(il)), 1e-6);
  }

  // A line whose span [p, n) holds foreign entries (random), then the pass.
  const auto foreign_line = [&] {
    auto line = engine->NewCache();
    EXPECT_TRUE(engine->Prefill(*line, std::vector<int64_t>(ids.begin(), ids.begin() + p)).ok());
    at::manual_seed(3);
    EXPECT_TRUE(line->Accept(at::randn({4, 2, m, 8}), at::randn({4, 2, m, 8})).ok());
    return line;
  };
  for (int64_t first : {2, 3, 0}) {
    SCOPED_TRACE(absl::StrCat("from layer ", first));
    auto line = foreign_line();
    const auto untouched = foreign_line();
    const at::Tensor hidden =
        first == 0 ? at::Tensor() : (*residuals)[first].narrow(0, p, m).clone();
    ASSERT_TRUE(engine->ForwardLayers(*line, p, span, hidden, first).ok());
    EXPECT_EQ(line->Length(), n);
    EXPECT_EQ(line->FirstForeignToken(), p);  // spans unchanged
    for (int64_t il = 0; il < 4; ++il) {
      const KvCache& expected = il >= first ? *native : *untouched;
      EXPECT_LT(MaxAbsDiff(line->Keys(il), expected.Keys(il)), 1e-5) << "layer " << il;
      EXPECT_LT(MaxAbsDiff(line->Values(il), expected.Values(il)), 1e-5) << "layer " << il;
    }
    if (first == 0) {
      auto next = engine->Decode(*line, 6);
      ASSERT_TRUE(next.ok());
      std::vector<int64_t> longer = ids;
      longer.push_back(6);
      const at::Tensor ref =
          ReferenceForward(c.config, c.weights, at::tensor(longer).unsqueeze(0)).logits[0][-1];
      EXPECT_LT(MaxAbsDiff(*next, ref), 1e-4);
    }
  }

  auto line = foreign_line();
  const at::Tensor hidden = (*residuals)[2].narrow(0, p, m);
  for (const auto& [position, first, h] :
       {std::tuple{p, int64_t{4}, hidden}, {p, int64_t{-1}, hidden}, {p, int64_t{2}, at::Tensor()},
        {p + 1, int64_t{2}, hidden}, {p, int64_t{2}, hidden.narrow(0, 0, m - 1)},
        {int64_t{-1}, int64_t{2}, hidden}}) {
    EXPECT_EQ(engine->ForwardLayers(*line, position, span, h, first).code(),
              absl::StatusCode::kInvalidArgument)
        << position << " " << first;
  }
  EXPECT_EQ(engine->ForwardLayers(*line, p, {}, at::Tensor(), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(line->Length(), n);
}

TEST(Engine, RejectsBadInput) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  auto cache = engine->NewCache();
  EXPECT_EQ(engine->Prefill(*cache, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Prefill(*cache, {1, c.config.vocab_size}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Prefill(*cache, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Prefill(*cache, std::vector<int64_t>(65, 1)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(cache->Length(), 0);
  GenerateOptions bad;
  bad.sampling.top_p = 0.0;
  EXPECT_EQ(engine->Generate(*cache, {1}, bad).status().code(), absl::StatusCode::kInvalidArgument);

  RuntimeOptions o;
  o.prefill_chunk = 0;
  EXPECT_EQ(Engine::Create(c, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.prefill_chunk = 16;
  o.device = "tpu";
  EXPECT_EQ(Engine::Create(c, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadModelDir("/nonexistent/model", RuntimeOptions()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvl
