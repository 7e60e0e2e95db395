// KV cache line bookkeeping: byte accounting, growth, rollback, spans, and the
// errors of the translation taps / accept path.
#include "model/kv_cache.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <vector>

#include "model/decoder.h"
#include "tests/model/test_models.h"

namespace kvl {
namespace {

using testing::RandomIds;
using testing::RandomWeights;
using testing::TinyConfig;
using testing::TinyModel;

std::unique_ptr<Decoder> MakeDecoder(const ModelConfig& config, KeyTapMode mode,
                                     at::ScalarType dtype = at::kFloat) {
  DecoderOptions o;
  o.tap_mode = mode;
  o.dtype = dtype;
  return *Decoder::Create(config, RandomWeights(config, 1), o);
}

void RunTokens(Decoder& decoder, KvCache& cache, int64_t n) {
  c10::InferenceMode guard;
  decoder.Forward(cache, RandomIds(decoder.config().vocab_size, {n}, 101), false);
}

TEST(KvCache, BytesPerTokenByModeAndDtype) {
  const ModelConfig qwen = TinyConfig({"qwen3", true, false, false, 4, 2});  // L=2 H=2 D=8
  const ModelConfig llama = TinyConfig({"llama", false, false, false, 4, 2});
  const int64_t kv = 2 * 2 * 8;  // L * H * D elements per token, per K or V
  EXPECT_EQ(MakeDecoder(qwen, KeyTapMode::kInvert)->NewCache()->BytesPerToken(),
            2 * kv * 4 + 2 * 2 * 4);
  EXPECT_EQ(MakeDecoder(qwen, KeyTapMode::kStorePreNorm)->NewCache()->BytesPerToken(), 3 * kv * 4);
  EXPECT_EQ(MakeDecoder(llama, KeyTapMode::kInvert)->NewCache()->BytesPerToken(), 2 * kv * 4);
  EXPECT_EQ(MakeDecoder(qwen, KeyTapMode::kInvert, at::kBFloat16)->NewCache()->BytesPerToken(),
            2 * kv * 2 + 2 * 2 * 4);
}

TEST(KvCache, BytesAreExactAndGrowthIsGeometric) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  for (KeyTapMode mode : {KeyTapMode::kInvert, KeyTapMode::kStorePreNorm}) {
    auto decoder = MakeDecoder(config, mode);
    auto cache = decoder->NewCache();
    EXPECT_EQ(cache->Bytes(), 0);
    EXPECT_EQ(cache->Capacity(), 0);
    RunTokens(*decoder, *cache, 3);
    EXPECT_EQ(cache->Capacity(), 64);
    EXPECT_EQ(cache->Bytes(), 64 * cache->BytesPerToken());
    RunTokens(*decoder, *cache, 62);  // 65 tokens: doubles
    EXPECT_EQ(cache->Length(), 65);
    EXPECT_EQ(cache->Capacity(), 128);
    EXPECT_EQ(cache->Bytes(), 128 * cache->BytesPerToken());
    RunTokens(*decoder, *cache, 200);  // past 2x: grows to what is needed
    EXPECT_EQ(cache->Capacity(), 265);
    ASSERT_TRUE(cache->Reserve(1000).ok());
    EXPECT_EQ(cache->Capacity(), 1000);
    EXPECT_EQ(cache->Bytes(), 1000 * cache->BytesPerToken());
    // Rollback keeps the allocation.
    ASSERT_TRUE(cache->Rollback(10).ok());
    EXPECT_EQ(cache->Bytes(), 1000 * cache->BytesPerToken());
    // The attention views see exactly Length() tokens.
    EXPECT_EQ(cache->Keys(0).sizes(), (std::vector<int64_t>{2, 10, 8}));
    EXPECT_EQ(cache->Values(1).sizes(), (std::vector<int64_t>{2, 10, 8}));
  }
}

TEST(KvCache, GrowthKeepsContents) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  auto decoder = MakeDecoder(config, KeyTapMode::kInvert);
  auto cache = decoder->NewCache();
  RunTokens(*decoder, *cache, 60);
  const at::Tensor keys = cache->Keys(1).clone(), values = cache->Values(0).clone();
  RunTokens(*decoder, *cache, 100);
  EXPECT_TRUE(at::equal(cache->Keys(1).narrow(1, 0, 60), keys));
  EXPECT_TRUE(at::equal(cache->Values(0).narrow(1, 0, 60), values));
}

TEST(KvCache, RollbackTruncatesSpans) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  auto decoder = MakeDecoder(config, KeyTapMode::kInvert);
  auto cache = decoder->NewCache();
  RunTokens(*decoder, *cache, 10);
  KvTaps taps = *cache->Taps(2, 6);
  ASSERT_TRUE(cache->Accept(taps.keys, taps.values).ok());  // [10, 14) foreign
  RunTokens(*decoder, *cache, 5);                           // [14, 19) native
  ASSERT_EQ(cache->Spans().size(), 3u);
  EXPECT_EQ(cache->Spans()[1].t0, 10);
  EXPECT_EQ(cache->Spans()[1].t1, 14);
  EXPECT_FALSE(cache->Spans()[1].native);

  EXPECT_EQ(cache->Rollback(20).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(cache->Rollback(-1).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(cache->Rollback(12).ok());
  ASSERT_EQ(cache->Spans().size(), 2u);
  EXPECT_EQ(cache->Spans()[1].t1, 12);
  ASSERT_TRUE(cache->Rollback(10).ok());
  ASSERT_EQ(cache->Spans().size(), 1u);
  EXPECT_TRUE(cache->Spans()[0].native);
  EXPECT_TRUE(cache->Taps(0, 10).ok());
  RunTokens(*decoder, *cache, 1);  // appending native merges into the native span
  ASSERT_EQ(cache->Spans().size(), 1u);
  EXPECT_EQ(cache->Spans()[0].t1, 11);
}

// The repair's copy: a native head cloned, the rest recomputed natively and
// marked repaired; later tokens start a native span of their own.
TEST(KvCache, MarkRepairedSplitsAtItsStartAndCloneKeepsTheMark) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  auto decoder = MakeDecoder(config, KeyTapMode::kInvert);
  auto cache = decoder->NewCache();
  RunTokens(*decoder, *cache, 10);  // [0, 10) native
  auto copy = *cache->ClonePrefix(6, 0);
  RunTokens(*decoder, *copy, 6);  // [6, 12): merges into [0, 12) native
  ASSERT_EQ(copy->Spans().size(), 1u);
  copy->MarkRepaired(6);
  ASSERT_EQ(copy->Spans().size(), 2u);
  EXPECT_EQ(copy->Spans()[0].t1, 6);
  EXPECT_FALSE(copy->Spans()[0].repaired);
  EXPECT_EQ(copy->Spans()[1].t0, 6);
  EXPECT_EQ(copy->Spans()[1].t1, 12);
  EXPECT_TRUE(copy->Spans()[1].native);
  EXPECT_TRUE(copy->Spans()[1].repaired);
  RunTokens(*decoder, *copy, 2);  // new tokens: native, not repaired
  ASSERT_EQ(copy->Spans().size(), 3u);
  EXPECT_EQ(copy->Spans()[2].t0, 12);
  EXPECT_FALSE(copy->Spans()[2].repaired);
  auto clone = *copy->ClonePrefix(9, 0);
  ASSERT_EQ(clone->Spans().size(), 2u);
  EXPECT_TRUE(clone->Spans()[1].repaired);
  EXPECT_EQ(clone->Spans()[1].t1, 9);
  // A foreign span is left foreign.
  KvTaps taps = *cache->Taps(0, 3);
  ASSERT_TRUE(cache->Accept(taps.keys, taps.values).ok());  // [10, 13) foreign
  cache->MarkRepaired(0);
  ASSERT_EQ(cache->Spans().size(), 2u);
  EXPECT_TRUE(cache->Spans()[0].repaired);
  EXPECT_FALSE(cache->Spans()[1].native);
  EXPECT_FALSE(cache->Spans()[1].repaired);
}

TEST(KvCache, TapAndAcceptErrors) {
  const ModelConfig config = TinyConfig({"qwen3", true, false, false, 4, 2});
  auto decoder = MakeDecoder(config, KeyTapMode::kInvert);
  auto cache = decoder->NewCache();
  RunTokens(*decoder, *cache, 8);
  EXPECT_EQ(cache->Taps(5, 9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Taps(5, 4).status().code(), absl::StatusCode::kInvalidArgument);
  KvTaps taps = *cache->Taps(0, 8);
  EXPECT_EQ(taps.keys.sizes(), (std::vector<int64_t>{2, 2, 8, 8}));
  EXPECT_EQ(cache->Accept(taps.keys.narrow(0, 0, 1), taps.values).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Accept(taps.keys, taps.values.narrow(2, 0, 3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Accept(taps.keys.to(at::kLong), taps.values).code(),
            absl::StatusCode::kInvalidArgument);
  // A span on another device (meta stands in for a GPU) is refused, naming
  // both devices, rather than copied across.
  const absl::Status elsewhere =
      cache->Accept(taps.keys, taps.values.to(at::Device("meta")));
  EXPECT_EQ(elsewhere.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(elsewhere.message().find("meta"), std::string::npos) << elsewhere;
  EXPECT_EQ(cache->Length(), 8);
  // Unread counts: one per layer, each within the span.
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0}, std::vector<int64_t>{0, 9},
                                          std::vector<int64_t>{-1, 0}}) {
    EXPECT_EQ(cache->Accept(taps.keys, taps.values, bad).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(cache->Length(), 8);
  // Float64 input (e.g. from a translator) is converted.
  ASSERT_TRUE(cache->Accept(taps.keys.to(at::kDouble), taps.values.to(at::kDouble)).ok());
  EXPECT_EQ(cache->Length(), 16);
  EXPECT_EQ(cache->Taps(7, 9).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvl
