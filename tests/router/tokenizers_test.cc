// Switches between models with different tokenizers (issue 54; router.h):
// a random model over the house tokenizer and one over the second house
// tokenizer (models/tokenizer-t2), with closed-form translators fitted across
// the two (training::FitFromCorpus). Checked: the switch translates, and its
// reply is the one driven by hand (the two renderings aligned, the writer's
// taps resampled onto the target's tokens, translated, the rest prefilled);
// after repair a later turn reads what a re-prefilled twin reads; the
// session's streams are each tokenizer's rendering of the same text; the
// cascade is refused; a restored session rebuilds the other rendering.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "cache_store/cache_store.h"
#include "model/chat_template.h"
#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/model_dir.h"
#include "router/loader.h"
#include "router/router.h"
#include "router/streams.h"
#include "tests/model/test_models.h"
#include "tests/testing/temp_dir.h"
#include "tests/training/tiny_lm_fixture.h"
#include "training/translator_fit.h"
#include "translator/resample.h"

namespace kvl::router {
namespace {

std::string Path(const std::string& rel) { return std::string(KVL_SOURCE_DIR) + "/" + rel; }

// A random model of `config` over the tokenizer in `tokenizer_dir`.
std::string WriteModel(const std::string& dir, const std::string& name, const std::string& config,
                       const std::string& tokenizer_dir, uint64_t seed) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromFile(Path("models/configs/" + config));
  EXPECT_TRUE(c.ok()) << c.status();
  c->max_position_embeddings = 2048;
  ModelWeights w = InitWeights(*c, seed);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 100);
  for (auto& [n, t] : w.Named(*c)) {
    if (n.find("norm") != std::string::npos) {
      t.normal_(1.0, 0.1, gen);
    } else {
      t.normal_(0.0, 0.25, gen);
    }
  }
  const std::string path = dir + "/" + name;
  EXPECT_TRUE(SaveCheckpoint(path, *c, w, DType::kFloat32, Path(tokenizer_dir + "/tokenizer.json"),
                             Path(tokenizer_dir + "/tokenizer_config.json"))
                  .ok());
  return path;
}

class TokenizersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("router-tokenizers");
    const std::string house = WriteModel(dir_->path(), "house", "kvl-small.json", "models/tokenizer", 1);
    const std::string t2 = WriteModel(dir_->path(), "t2", "kvl-small-t2.json", "models/tokenizer-t2", 2);
    const std::string corpus = dir_->WriteFile("corpus.txt", testing::TinyChatCorpus(1000, 24));
    for (const auto& [s, t] : {std::pair{house, t2}, std::pair{t2, house}}) {
      training::CorpusFitOptions o;
      o.source_dir = s;
      o.target_dir = t;
      o.data_path = corpus;
      o.seq_len = 96;
      o.max_sequences = 24;
      o.n_threads = 2;
      o.progress = false;
      absl::StatusOr<training::CorpusFit> fit = training::FitFromCorpus(o);
      ASSERT_TRUE(fit.ok()) << fit.status();
      ASSERT_TRUE(fit->fit.translator->Save(s + "__" + (t == t2 ? "t2" : "house") + ".safetensors").ok());
    }
  }
  static void TearDownTestSuite() { delete dir_; }

  void MakeRouter(RouterConfig routing) {
    RuntimeOptions options;
    options.n_threads = 2;
    std::vector<LoadedModel> models;
    std::vector<std::string> identity, hash;
    std::unique_ptr<Tokenizer> group0;
    for (const char* name : {"house", "t2"}) {
      auto model = LoadModelDir(dir_->path() + "/" + name, options);
      ASSERT_TRUE(model.ok()) << model.status();
      identity.push_back(model->identity);
      hash.push_back(model->tokenizer->content_hash());
      engines_.push_back(Engine::Create(model->checkpoint, options).value());
      LoadedModel m{name, model->path, std::move(model->engine)};
      if (group0 == nullptr) {
        group0 = std::move(model->tokenizer);
      } else {
        m.tokenizer = std::move(model->tokenizer);
      }
      models.push_back(std::move(m));
    }
    std::vector<LoadedTranslator> translators;
    for (int s = 0; s < 2; ++s) {
      const int t = 1 - s;
      const std::string path = dir_->path() + "/" + models[s].name + "__" + models[t].name +
                               ".safetensors";
      auto tr = Translator::Load(path, {identity[s], identity[t], hash[s], hash[t]});
      ASSERT_TRUE(tr.ok()) << tr.status();
      translators.push_back({models[s].name + "->" + models[t].name, path, s, t,
                             *std::move(tr), ""});
    }
    store_ = std::make_unique<CacheStore>(CacheStoreOptions{2, int64_t{1} << 30, nullptr});
    auto r = Router::Create(std::move(models), std::move(translators), std::move(group0),
                            std::move(routing), store_.get(), nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
  }

  static RouterConfig Explicit(int64_t native_tail = 0) {
    RouterConfig r;
    r.policy.policy = Policy::kExplicit;
    r.policy.order = {0, 1};
    r.switching.native_tail_tokens = native_tail;
    return r;
  }

  absl::StatusOr<TurnResult> Turn(const std::string& session, const std::string& text, int model,
                                  Strategy strategy = Strategy::kTranslate) {
    TurnOptions o;
    o.user_message = text;
    o.policy = Policy::kExplicit;
    o.explicit_model = model;
    o.strategy = strategy;
    o.max_tokens = 8;
    o.seed = 5;
    return router_->RunTurn(session, o, {});
  }

  ConversationState State(const std::string& session) {
    absl::StatusOr<SessionView> v = store_->View(session);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? v->state : ConversationState{};
  }

  static testing::TempDir* dir_;
  std::vector<std::unique_ptr<Engine>> engines_;  // the by-hand oracle's, per model
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<Router> router_;
};

testing::TempDir* TokenizersTest::dir_ = nullptr;

const char* const kFirst = "My cat Muffin lives at 12345 Long Road, flat 678.";
const char* const kSecond = "Where does Muffin live? Give the number 12345 twice.";

// Each segment of the two streams spells the same text: every rendering is
// the conversation in its tokenizer's tokens.
void ExpectSameText(const Router& router, const ConversationState& state) {
  ASSERT_EQ(state.renderings.size(), 1u);
  const Rendering& r = state.renderings[0];
  ASSERT_EQ(r.bounds.size(), state.bounds.size());
  for (size_t k = 0; k < state.bounds.size(); ++k) {
    const int64_t b0 = state.bounds[k], b1 = state.bounds[k];
    const int64_t e0 = k + 1 < state.bounds.size() ? state.bounds[k + 1]
                                                   : static_cast<int64_t>(state.history.size());
    const int64_t e1 =
        k + 1 < r.bounds.size() ? r.bounds[k + 1] : static_cast<int64_t>(r.ids.size());
    (void)b1;
    const std::string a = router.group_tokenizer(0).Decode(
        std::vector<int32_t>(state.history.begin() + b0, state.history.begin() + e0));
    const std::string b = router.group_tokenizer(1).Decode(
        std::vector<int32_t>(r.ids.begin() + r.bounds[k], r.ids.begin() + e1));
    EXPECT_EQ(a, b) << "segment " << k;
  }
}

TEST_F(TokenizersTest, ASwitchAcrossTokenizersTranslatesWhatAligns) {
  MakeRouter(Explicit());
  EXPECT_EQ(router_->n_groups(), 2);
  EXPECT_EQ(router_->group_of(1), 1);
  ASSERT_TRUE(store_->Create("s", "", router_->RenderPreamble("Answer briefly.")).ok());
  auto t1 = Turn("s", kFirst, 0);
  ASSERT_TRUE(t1.ok()) << t1.status();
  const ConversationState before = State("s");
  ExpectSameText(*router_, before);

  // The switch by hand, from the committed state: the house model's line
  // holds its stream but its unrun tail; the t2 model aligns its whole
  // stream, translates what aligns within the house line, prefills the rest
  // and the new turn, and decodes greedily.
  const Rendering& t2_stream = before.renderings[0];
  const int64_t n_t = static_cast<int64_t>(t2_stream.ids.size());
  std::unique_ptr<KvCache> source = engines_[0]->NewCache();
  ASSERT_TRUE(engines_[0]
                  ->Prefill(*source, std::vector<int64_t>(before.history.begin(),
                                                          before.history.begin() + before.tail_begin))
                  .ok());
  auto aligned = AlignAcross(StreamView{&router_->group_tokenizer(0), &before.history, &before.bounds},
                             StreamView{&router_->group_tokenizer(1), &t2_stream.ids, &t2_stream.bounds},
                             0, n_t, before.tail_begin);
  ASSERT_TRUE(aligned.ok()) << aligned.status();
  ASSERT_GT(aligned->target_end, n_t / 2);
  ASSERT_LT(aligned->target_end, n_t);  // the unrun tail is prefilled
  auto taps = source->Taps(aligned->source_begin, aligned->source_end);
  ASSERT_TRUE(taps.ok());
  auto resampled = ResampleTaps(*taps, aligned->runs);
  ASSERT_TRUE(resampled.ok());
  auto moved = router_->FindTranslator(0, 1)->Translate(*resampled);
  ASSERT_TRUE(moved.ok());
  std::unique_ptr<KvCache> line = engines_[1]->NewCache();
  ASSERT_TRUE(line->Accept(moved->keys, moved->values).ok());
  ChatTemplateOptions turn_options;
  std::vector<int64_t> prompt(t2_stream.ids.begin() + aligned->target_end, t2_stream.ids.end());
  for (int32_t id : router_->group_tokenizer(1).Encode(SessionUserTurn(kSecond, false, turn_options))) {
    prompt.push_back(id);
  }
  GenerateOptions g;
  g.max_tokens = 8;
  g.stop_token_ids = {*router_->group_tokenizer(1).AddedTokenId("<|im_end|>"),
                      *router_->group_tokenizer(1).AddedTokenId("<|endoftext|>")};
  auto want = engines_[1]->Generate(*line, prompt, g);
  ASSERT_TRUE(want.ok()) << want.status();

  auto t2 = Turn("s", kSecond, 1);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->routing.path, CachePath::kTranslated);
  EXPECT_EQ(t2->routing.tokens_translated, aligned->target_end);
  EXPECT_EQ(t2->tokens, want->tokens);
  const ConversationState after = State("s");
  ExpectSameText(*router_, after);
  // The reply is the t2 model's own tokens in its stream.
  const std::vector<int64_t>& t2_after = after.renderings[0].ids;
  const int64_t reply_at = after.renderings[0].bounds[after.bounds.size() - 2];
  EXPECT_TRUE(std::equal(t2->tokens.begin(), t2->tokens.end(), t2_after.begin() + reply_at));
  // Back to the house model: it translates the t2 model's turn.
  auto t3 = Turn("s", "And the flat?", 0);
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_EQ(t3->routing.path, CachePath::kTranslated);
  ExpectSameText(*router_, State("s"));
}

TEST_F(TokenizersTest, AfterRepairALaterTurnIsTheReprefilledTwins) {
  RouterConfig routing = Explicit(4);
  routing.switching.repair = RepairMode::kAfterTurn;
  MakeRouter(routing);
  // Sessions with the same conversation: the house model, then the t2 model
  // (given replies, so the histories stay equal), then the t2 model again,
  // generating. "s" translates at the switch and repairs after it; "twin"
  // re-prefills; "plain" translates on a router without repair, whose t2
  // line keeps the translation and reads otherwise (so the test can fail).
  std::vector<int64_t> last[3];
  std::vector<double> logprobs[3];
  for (int which = 0; which < 3; ++which) {
    if (which == 2) {
      RouterConfig no_repair = Explicit(4);
      no_repair.switching.repair = RepairMode::kOff;
      MakeRouter(no_repair);
    }
    const std::string session = which == 0 ? "s" : which == 1 ? "twin" : "plain";
    const Strategy strategy = which == 1 ? Strategy::kReprefill : Strategy::kTranslate;
    ASSERT_TRUE(store_->Create(session, "", router_->RenderPreamble("Answer briefly.")).ok());
    for (auto [text, model, reply] :
         {std::tuple{kFirst, 0, "Noted: Muffin, 12345 Long Road, flat 678."},
          std::tuple{kSecond, 1, "12345 Long Road. 12345 Long Road."}}) {
      TurnOptions o;
      o.user_message = text;
      o.policy = Policy::kExplicit;
      o.explicit_model = model;
      o.strategy = strategy;
      o.reply = reply;
      auto t = router_->RunTurn(session, o, {});
      ASSERT_TRUE(t.ok()) << t.status();
      if (model == 1) {
        EXPECT_EQ(t->routing.path,
                  which == 1 ? CachePath::kReprefill : CachePath::kTranslated);
      }
      ASSERT_TRUE(router_->WaitForRepairs(absl::Seconds(60)));
    }
    auto t3 = Turn(session, "Which flat?", 1, strategy);
    ASSERT_TRUE(t3.ok()) << t3.status();
    last[which] = t3->tokens;
    TurnOptions o;
    o.user_message = "And the road?";
    o.policy = Policy::kExplicit;
    o.explicit_model = 1;
    o.strategy = strategy;
    o.reply = "Long Road, 12345.";
    auto t4 = router_->RunTurn(session, o, {});
    ASSERT_TRUE(t4.ok()) << t4.status();
    logprobs[which] = t4->reply_logprobs;
    if (which != 1) {
      // "s": the t2 model's line was repaired, nothing translated is left;
      // "plain": its translated entries stay.
      const SessionView view = *store_->View(session);
      EXPECT_EQ(view.lines[1].translated_tokens > 0, which == 2);
      EXPECT_EQ(view.lines[1].repaired_tokens > 0, which == 0);
    }
  }
  // After the repair the t2 model's line is native: its later turns read what
  // the re-prefilled twin's read (up to the decoder's chunking).
  EXPECT_EQ(last[0], last[1]);
  ASSERT_EQ(logprobs[0].size(), logprobs[1].size());
  ASSERT_EQ(logprobs[2].size(), logprobs[1].size());
  double plain = 0;
  for (size_t i = 0; i < logprobs[0].size(); ++i) {
    EXPECT_NEAR(logprobs[0][i], logprobs[1][i], 1e-4) << i;
    plain = std::max(plain, std::abs(logprobs[2][i] - logprobs[1][i]));
  }
  EXPECT_GT(plain, 1e-3);
}

// What kvl-server does: LoadRouter groups the models by tokenizer, and the
// session view gives each line's spans in its own tokens.
TEST_F(TokenizersTest, TheLoaderGroupsModelsByTokenizerAndTheViewIsInEachLinesTokens) {
  std::vector<ModelSource> models = {{"house", dir_->path() + "/house"},
                                     {"t2", dir_->path() + "/t2"}};
  std::vector<TranslatorSource> translators(2);
  translators[0].source = 0;
  translators[0].target = 1;
  translators[0].path = dir_->path() + "/house__t2.safetensors";
  translators[1].source = 1;
  translators[1].target = 0;
  translators[1].path = dir_->path() + "/t2__house.safetensors";
  store_ = std::make_unique<CacheStore>(CacheStoreOptions{2, int64_t{1} << 30, nullptr});
  auto r = LoadRouter(models, translators, Explicit(), 2, store_.get(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  router_ = *std::move(r);
  EXPECT_EQ(router_->n_groups(), 2);
  ASSERT_TRUE(store_->Create("s", "", router_->RenderPreamble("")).ok());
  ASSERT_TRUE(Turn("s", kFirst, 0).ok());
  auto t2 = Turn("s", kSecond, 1);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->routing.path, CachePath::kTranslated);
  const SessionView view = *store_->View("s");
  const Rendering& stream = view.state.renderings.at(0);
  // The t2 line: translated from the house model, then its own turn, all in
  // its tokens (the view's spans end where its line does, within its stream).
  const CacheLineInfo& line = view.lines[1];
  ASSERT_FALSE(line.spans.empty());
  EXPECT_EQ(line.spans.front().provenance, SpanProvenance::kTranslated);
  EXPECT_EQ(line.spans.front().source, 0);
  EXPECT_EQ(line.spans.back().end, line.tokens);
  EXPECT_LE(line.tokens, static_cast<int64_t>(stream.ids.size()));
  EXPECT_GT(line.tokens, static_cast<int64_t>(view.state.history.size()) / 2);
  EXPECT_EQ(t2->history_tokens, static_cast<int64_t>(stream.ids.size()));
}

TEST_F(TokenizersTest, TheCascadeNeedsOneTokenizer) {
  MakeRouter(Explicit());
  TurnOptions o;
  o.user_message = kFirst;
  o.policy = Policy::kCascade;
  EXPECT_EQ(router_->ValidateTurn(o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvl::router
