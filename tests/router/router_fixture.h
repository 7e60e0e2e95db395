// The router tests' fixture: three small random models with fitted
// translators (model_fixture.h) loaded into a Router over a CacheStore, a
// second engine of each model for the by-hand oracles, and helpers to run
// turns. Shared by router_test.cc and repair_test.cc.
#pragma once

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "model/chat_template.h"
#include "router/loader.h"
#include "router/planner.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/model/test_models.h"
#include "tests/router/model_fixture.h"
#include "router/router.h"
#include "tests/testing/temp_dir.h"

namespace kvl::router {

using ::testing::HasSubstr;
using ::testing::Not;

class RouterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("router");
    ASSERT_TRUE(testing::WriteFixtureModels(dir_->path()).ok());
    ASSERT_TRUE(testing::WriteFixtureTranslators(
                    dir_->path(), {{"small", "large"}, {"large", "small"}, {"small", "small-b"},
                                   {"small-b", "large"}, {"large", "small-b"}})
                    .ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  // `adjust`, when given, may change each translator before the router takes it.
  void MakeRouter(RouterConfig routing, int64_t budget = int64_t{1} << 30,
                  DType translate_dtype = DType::kFloat32, TurnObserver* observer = nullptr,
                  const std::function<void(LoadedTranslator&)>& adjust = nullptr) {
    std::vector<LoadedModel> models;
    std::vector<std::string> identity;
    RuntimeOptions options;
    options.n_threads = 2;
    for (const auto& m : testing::FixtureModels()) {
      auto model = LoadModelDir(dir_->path() + "/" + m.name, options);
      ASSERT_TRUE(model.ok()) << model.status();
      identity.push_back(model->identity);
      // A second engine of the same weights drives the by-hand oracles.
      engines_.push_back(Engine::Create(model->checkpoint, options).value().release());
      models.push_back({m.name, model->path, std::move(model->engine)});
    }
    auto tokenizer = Tokenizer::FromFile(testing::TokenizerJsonPath());
    ASSERT_TRUE(tokenizer.ok());
    const std::string hash = (*tokenizer)->content_hash();
    std::vector<LoadedTranslator> translators;
    for (int s = 0; s < 3; ++s) {
      for (int t = 0; t < 3; ++t) {
        const std::string path =
            testing::TranslatorPath(dir_->path(), models[s].name, models[t].name);
        if (s == t || !std::filesystem::exists(path)) continue;
        auto tr = Translator::Load(path, {identity[s], identity[t], hash, hash}, translate_dtype);
        ASSERT_TRUE(tr.ok()) << tr.status();
        translators.push_back(
            {models[s].name + "->" + models[t].name, path, s, t, *std::move(tr), ""});
        if (adjust) adjust(translators.back());
      }
    }
    store_ = std::make_unique<CacheStore>(CacheStoreOptions{3, budget, clock_});
    auto r = Router::Create(std::move(models), std::move(translators), *std::move(tokenizer),
                            std::move(routing), store_.get(), observer);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
  }
  void TearDown() override {
    router_.reset();
    for (Engine* e : engines_) delete e;
  }

  absl::StatusOr<TurnResult> Turn(const std::string& session, const std::string& text, int model,
                                  Strategy strategy = Strategy::kTranslate,
                                  std::optional<Policy> policy = Policy::kExplicit,
                                  std::function<bool()> cancelled = nullptr) {
    TurnOptions o;
    o.user_message = text;
    o.policy = policy;
    o.explicit_model = model;
    o.strategy = strategy;
    o.max_tokens = 6;
    o.cancelled = std::move(cancelled);
    return router_->RunTurn(session, o, {});
  }

  std::vector<int64_t> TurnTokens(const std::string& text) {
    std::vector<int64_t> ids;
    for (int32_t id : router_->tokenizer().Encode(RenderUserTurn(text))) ids.push_back(id);
    return ids;
  }

  // Greedy generation of `engine` on `line` from `prompt`, as the router runs it.
  std::vector<int64_t> Generate(Engine& engine, KvCache& line, const std::vector<int64_t>& prompt) {
    GenerateOptions g;
    g.max_tokens = 6;
    auto im_end = router_->tokenizer().AddedTokenId("<|im_end|>");
    g.stop_token_ids = {*im_end, *router_->tokenizer().AddedTokenId("<|endoftext|>")};
    auto r = engine.Generate(line, prompt, g);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<int64_t>{};
  }

  // A small -> large switch under the translate strategy (router made with
  // Explicit() and `native_tail` tokens of native tail), checked against the
  // same switch driven by hand with the router's own small -> large translator,
  // which computes in `compute`; the router must translate all but the last
  // native_tail tokens of the history.
  void ExpectTranslateSwitchEqualsHandDriven(DType compute, int64_t native_tail = 0) {
    ASSERT_TRUE(store_->Create("s", "", router_->RenderPreamble("Be brief.")).ok());
    auto t1 = Turn("s", "Hello there, how are you?", 0);
    ASSERT_TRUE(t1.ok()) << t1.status();
    EXPECT_EQ(t1->routing.path, CachePath::kNative);
    const ConversationState after1 = store_->View("s")->state;
    EXPECT_EQ(after1.ledger.size(), 1u);

    auto t2 = Turn("s", "Tell me about caches.", 2);
    ASSERT_TRUE(t2.ok()) << t2.status();
    EXPECT_TRUE(t2->routing.switched);
    EXPECT_EQ(t2->routing.path, CachePath::kTranslated);
    // small holds [0, tail_begin) natively; the rest of the history is its
    // unrun tail.
    const int64_t n_history = static_cast<int64_t>(after1.history.size());
    const int64_t n_held = std::min(after1.tail_begin, n_history - native_tail);
    ASSERT_GT(n_held, 0);
    EXPECT_EQ(t2->routing.spans_translated, 1);
    EXPECT_EQ(t2->routing.tokens_translated, n_held);
    EXPECT_GT(t2->routing.translation_seconds, 0);

    // By hand: small prefills what it held natively, the translator moves the
    // part before the native tail to large, large runs the rest of the history
    // plus the new turn and decodes.
    Engine& small = *engines_[0];
    Engine& large = *engines_[2];
    auto small_line = small.NewCache();
    const std::vector<int64_t> held(after1.history.begin(), after1.history.begin() + n_held);
    ASSERT_TRUE(small.Prefill(*small_line, held).ok());
    auto taps = small_line->Taps(0, n_held);
    ASSERT_TRUE(taps.ok());
    std::unique_ptr<KvCache> large_line = large.NewCache();
    {
      SerialIntraOpScope serial;  // the router translates on one intra-op thread
      const Translator* translator = router_->FindTranslator(0, 2);
      ASSERT_EQ(translator->compute_dtype(), compute);
      auto moved = translator->Translate(*taps);
      ASSERT_TRUE(moved.ok());
      ASSERT_TRUE(large_line->Accept(moved->keys, moved->values).ok());
    }
    std::vector<int64_t> prompt(after1.history.begin() + n_held, after1.history.end());
    for (int64_t id : TurnTokens("Tell me about caches.")) prompt.push_back(id);
    EXPECT_EQ(t2->tokens, Generate(large, *large_line, prompt));
    EXPECT_FALSE(t2->tokens.empty());

    // The router's line of large holds the hand-made translation, and not the
    // one of the other dtype (relative Frobenius distance per layer).
    const DType other = compute == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    const Translator& own = *router_->FindTranslator(0, 2);
    auto other_translator = Translator::Create(own.spec(), own.key_maps(), own.value_maps(), other);
    ASSERT_TRUE(other_translator.ok()) << other_translator.status();
    auto moved_other = (*other_translator)->Translate(*taps);
    ASSERT_TRUE(moved_other.ok());
    auto other_line = large.NewCache();
    ASSERT_TRUE(other_line->Accept(moved_other->keys, moved_other->values).ok());
    auto lease = store_->Begin("s");
    ASSERT_TRUE(lease.ok()) << lease.status();
    KvCache* routed = (*lease)->line(2);
    ASSERT_NE(routed, nullptr);
    for (int64_t il = 0; il < routed->n_layer(); ++il) {
      const at::Tensor keys = routed->Keys(il).narrow(1, 0, n_held);
      const at::Tensor values = routed->Values(il).narrow(1, 0, n_held);
      auto rel = [](const at::Tensor& a, const at::Tensor& b) {
        return ((a - b).norm() / b.norm()).item<double>();
      };
      const double same_k = rel(keys, large_line->Keys(il).narrow(1, 0, n_held));
      const double same_v = rel(values, large_line->Values(il).narrow(1, 0, n_held));
      const double other_v = rel(values, other_line->Values(il));
      // Same dtype: the router's small line decoded its reply token by token,
      // the hand-made one prefilled it, so the taps differ by float32 rounding
      // (1e-6), which may flip a bfloat16 rounding here and there (measured
      // <= 3e-4). The other dtype is bfloat16 rounding everywhere (measured
      // 3.6e-3 to 3.9e-3).
      EXPECT_LT(same_k, 1e-3) << il;
      EXPECT_LT(same_v, 1e-3) << il;
      EXPECT_GT(other_v, 1.5e-3) << il;
    }
  }

  static inline testing::TempDir* dir_ = nullptr;
  std::unique_ptr<CacheStore> store_;
  std::function<int64_t()> clock_;  // the store's clock; null: the system clock
  std::unique_ptr<Router> router_;
  std::vector<Engine*> engines_;  // independent copies for the hand-driven oracles
};

// The router the hand-driven oracles compute: the plain switch (no native
// tail), no repair, one request at a time per model, no waiting limit. Tests
// turn on what they check.
inline RouterConfig Plain() {
  RouterConfig r;
  r.switching.native_tail_tokens = 0;
  r.switching.repair = RepairMode::kOff;
  r.batching.enabled = false;
  r.limits.max_waiting_turns = 0;
  return r;
}

inline RouterConfig Explicit() {
  RouterConfig r = Plain();
  r.policy.policy = Policy::kExplicit;
  r.policy.order = {0, 2};
  return r;
}

// Records the quality gate's events, in order.
struct GateLog : TurnObserver {
  std::mutex mu;
  std::vector<std::pair<std::pair<int, int>, bool>> events ABSL_GUARDED_BY(mu);
  void OnGate(int source, int target, bool open, const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({{source, target}, open});
  }
};

}  // namespace kvl::router
