// The device path end to end: a router loaded as kvl-server loads it
// (LoadRouter), every model on the device KVL_TEST_DEVICE names (default
// "cpu"), with the server's routing defaults (batched engine loops, the
// 32-token native tail, repair after the turn), runs a conversation that
// switches small -> large -> small by translation and must answer token for
// token as the same router on the CPU does, with every model's line and both
// translators on the device.
//
// scripts/gpu_check.sh runs it with KVL_TEST_DEVICE=cuda: the device against
// the CPU. In the suite (the CPU) it checks that the configuration's device
// reaches the engines, the translators and every line through the loader, and
// that a router so loaded answers as it did before. The device-agnostic parts
// are also tested on their own with a device stand-in (translator_test.cc,
// kv_cache_test.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cache_store/cache_store.h"
#include "model/chat_template.h"
#include "router/loader.h"
#include "router/router.h"
#include "tests/router/model_fixture.h"
#include "tests/testing/temp_dir.h"

namespace kvl::router {
namespace {

std::string TestDevice() {
  const char* device = std::getenv("KVL_TEST_DEVICE");
  return device != nullptr && *device != '\0' ? device : "cpu";
}

class DeviceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("device");
    ASSERT_TRUE(testing::WriteFixtureModels(dir_->path()).ok());
    ASSERT_TRUE(
        testing::WriteFixtureTranslators(dir_->path(), {{"small", "large"}, {"large", "small"}})
            .ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  // A router over small (0) and large (1) on `device`. The translators
  // compute in float32 on every device, so that the CPU's and the device's
  // routers differ only by where they run (unset, a GPU would pick bfloat16).
  struct Served {
    std::unique_ptr<CacheStore> store;
    std::unique_ptr<Router> router;
  };
  static Served Load(const std::string& device) {
    std::vector<ModelSource> models;
    for (const char* name : {"small", "large"}) {
      models.push_back({name, dir_->path() + "/" + name, DType::kFloat32, device});
    }
    std::vector<TranslatorSource> translators;
    for (auto [s, t] : {std::pair{0, 1}, std::pair{1, 0}}) {
      TranslatorSource source;
      source.source = s;
      source.target = t;
      source.path = testing::TranslatorPath(dir_->path(), models[s].name, models[t].name);
      source.compute_dtype = DType::kFloat32;
      translators.push_back(source);
    }
    RouterConfig config;  // the server's defaults
    config.policy.policy = Policy::kExplicit;
    Served served;
    CacheStoreOptions store;
    store.n_models = 2;
    store.memory_budget_bytes = int64_t{1} << 30;
    served.store = std::make_unique<CacheStore>(store);
    auto router = LoadRouter(models, translators, config, 2, served.store.get(), nullptr);
    EXPECT_TRUE(router.ok()) << router.status();
    if (router.ok()) served.router = *std::move(router);
    return served;
  }

  // The conversation: small answers, large takes over by translation, large
  // again once the repair has run, then small by translation. The tokens of
  // every answer, in order, and each turn's path.
  static void Converse(Served& served, std::vector<std::vector<int64_t>>& answers,
                       std::vector<CachePath>& paths) {
    Router& router = *served.router;
    ASSERT_TRUE(served.store->Create("s", "", router.RenderPreamble("Be brief.")).ok());
    const std::vector<std::pair<const char*, int>> turns = {
        {"Hello there, how are you?", 0},
        {"Tell me about caches.", 1},
        {"And about translation between models?", 1},
        {"Thanks. One more question, then.", 0}};
    for (const auto& [text, model] : turns) {
      TurnOptions o;
      o.user_message = text;
      o.policy = Policy::kExplicit;
      o.explicit_model = model;
      o.max_tokens = 8;
      absl::StatusOr<TurnResult> turn = router.RunTurn("s", o, {});
      ASSERT_TRUE(turn.ok()) << turn.status();
      answers.push_back(turn->tokens);
      paths.push_back(turn->routing.path);
      // The next turn reads the repaired line, whenever the repair would
      // otherwise have finished.
      ASSERT_TRUE(router.WaitForRepairs(absl::Seconds(60)));
    }
  }

  static inline testing::TempDir* dir_ = nullptr;
};

TEST_F(DeviceTest, ARouterOnTheDeviceAnswersAsOnTheCpuAndKeepsItsStateThere) {
  const std::string device = TestDevice();
  SCOPED_TRACE("KVL_TEST_DEVICE=" + device);
  Served cpu = Load("cpu");
  Served on_device = Load(device);
  ASSERT_NE(cpu.router, nullptr);
  ASSERT_NE(on_device.router, nullptr);

  for (auto [s, t] : {std::pair{0, 1}, std::pair{1, 0}}) {
    const Translator* translator = on_device.router->FindTranslator(s, t);
    ASSERT_NE(translator, nullptr);
    EXPECT_EQ(translator->device(), at::Device(device)) << s << "->" << t;
    EXPECT_EQ(translator->compute_dtype(), DType::kFloat32);
  }

  std::vector<std::vector<int64_t>> expected, answers;
  std::vector<CachePath> expected_paths, paths;
  Converse(cpu, expected, expected_paths);
  Converse(on_device, answers, paths);
  ASSERT_EQ(paths.size(), 4u);
  EXPECT_EQ(paths[0], CachePath::kNative);
  EXPECT_EQ(paths[1], CachePath::kTranslated);  // small -> large
  EXPECT_EQ(paths[3], CachePath::kTranslated);  // large -> small
  EXPECT_EQ(paths, expected_paths);
  for (size_t i = 0; i < answers.size(); ++i) {
    EXPECT_FALSE(answers[i].empty()) << "turn " << i;
    EXPECT_EQ(answers[i], expected[i]) << "turn " << i;
  }

  // Every line the session holds, native, translated or repaired, is on the
  // device, keys and values of every layer.
  auto lease = on_device.store->Begin("s");
  ASSERT_TRUE(lease.ok()) << lease.status();
  int lines = 0;
  for (int model = 0; model < 2; ++model) {
    KvCache* line = (*lease)->line(model);
    if (line == nullptr) continue;
    ++lines;
    for (int64_t il = 0; il < line->n_layer(); ++il) {
      EXPECT_EQ(line->Keys(il).device(), at::Device(device)) << model << " layer " << il;
      EXPECT_EQ(line->Values(il).device(), at::Device(device)) << model << " layer " << il;
    }
  }
  EXPECT_EQ(lines, 2);
}

}  // namespace
}  // namespace kvl::router
