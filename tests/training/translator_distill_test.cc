// Stage-2 distillation (training/translator_distill.h): the differentiable
// translation equals the inference one, the KL objective is zero exactly when
// the translated cache is the native one, a short run lowers the
// validation KL and keeps the best maps (also with bf16 autocast steps), and
// windows can be placed so that the prefix ends where a chat hands over.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/training/translator_fixture.h"
#include "model/reference.h"
#include "model/tokenizer.h"
#include "training/attention.h"
#include "training/translator_distill.h"
#include "training/translator_data.h"
#include "training/translator_fit.h"

namespace kvl::training {
namespace {

using testing::TempDir;

TEST(TranslateBatchTest, EqualsTranslatorTranslateForEveryBatchRow) {
  for (MapInputs inputs : {MapInputs::kSplit, MapInputs::kJoint}) {
    TranslatorSpec spec;
    spec.source = {"s", "t", 3, 2, 4};
    spec.target = {"t", "t", 2, 3, 2};
    spec.assignment_kind = "custom";
    spec.assignment.keys = {{2, 0}, {1}};
    spec.assignment.values = {{1, 2}, {0, 1}};
    spec.inputs = inputs;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
    TranslatorMaps keys, values;
    for (const auto& [lists, maps] :
         {std::pair{&spec.assignment.keys, &keys}, std::pair{&spec.assignment.values, &values}}) {
      for (size_t il = 0; il < 2; ++il) {
        const size_t blocks = inputs == MapInputs::kJoint
                                  ? spec.assignment.keys[il].size() + spec.assignment.values[il].size()
                                  : (*lists)[il].size();
        maps->weight.push_back(at::randn({6, 8 * static_cast<int64_t>(blocks)}, gen));
        maps->bias.push_back(at::randn({6}, gen));
      }
    }
    auto tr = Translator::Create(spec, keys, values);
    ASSERT_TRUE(tr.ok()) << tr.status();
    const at::Tensor k = at::randn({3, 2, 2, 5, 4}, gen);  // [L_s, B, H_s, T, D_s]
    const at::Tensor v = at::randn({3, 2, 2, 5, 4}, gen);
    std::vector<at::Tensor> kl, vl;
    for (int64_t l = 0; l < 3; ++l) {
      kl.push_back(k[l]);
      vl.push_back(v[l]);
    }
    const training::TranslatedBatch got = training::TranslateBatchKv(spec, keys, values, kl, vl);
    ASSERT_EQ(got.keys.size(), 2u);
    ASSERT_EQ(got.values.size(), 2u);
    for (int64_t b = 0; b < 2; ++b) {
      auto want = (*tr)->Translate({k.select(1, b), v.select(1, b)});  // [L_s, H_s, T, D_s]
      ASSERT_TRUE(want.ok()) << want.status();
      for (int64_t il = 0; il < 2; ++il) {
        EXPECT_LT(testing::MaxAbsDiff(got.keys[il][b], want->keys[il]), 1e-5);
        EXPECT_LT(testing::MaxAbsDiff(got.values[il][b], want->values[il]), 1e-5);
      }
    }
  }
}

// The differentiable translation of token-anchored maps (distillation's)
// equals the runtime's Translator::Translate of each window, its ids given
// from the window's start.
TEST(TranslateBatchTest, TokenAnchoredMapsMatchTheRuntimeTranslation) {
  TranslatorSpec spec;
  spec.source = {"s", "t", 2, 2, 4};
  spec.target = {"t", "t", 2, 3, 2};
  spec.assignment_kind = "custom";
  spec.assignment.keys = {{0}, {1}};
  spec.assignment.values = {{1}, {0}};
  spec.anchor_window = 3;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor table = at::randn({11, 4}, gen);
  TranslatorMaps keys, values;
  for (TranslatorMaps* maps : {&keys, &values}) {
    for (int il = 0; il < 2; ++il) {
      maps->weight.push_back(at::randn({6, 8}, gen));
      maps->bias.push_back(at::randn({6}, gen));
      maps->anchor.push_back(at::randn({6, 12}, gen));
    }
  }
  auto tr = Translator::Create(spec, keys, values, DType::kFloat32, table);
  ASSERT_TRUE(tr.ok()) << tr.status();
  const at::Tensor k = at::randn({2, 2, 2, 5, 4}, gen);  // [L_s, B, H_s, T, D_s]
  const at::Tensor v = at::randn({2, 2, 2, 5, 4}, gen);
  const at::Tensor ids = at::randint(11, {2, 5}, gen, at::kLong);
  const training::TranslatedBatch got = training::TranslateBatchKv(
      spec, keys, values, {k[0], k[1]}, {v[0], v[1]}, training::AnchorBatch(table, ids, 3));
  for (int64_t b = 0; b < 2; ++b) {
    const std::vector<int64_t> window(ids[b].data_ptr<int64_t>(), ids[b].data_ptr<int64_t>() + 5);
    auto want = (*tr)->Translate({k.select(1, b), v.select(1, b)},
                                 Translator::Output::kFloat32, window);
    ASSERT_TRUE(want.ok()) << want.status();
    for (int64_t il = 0; il < 2; ++il) {
      EXPECT_LT(testing::MaxAbsDiff(got.keys[il][b], want->keys[il]), 1e-5);
      EXPECT_LT(testing::MaxAbsDiff(got.values[il][b], want->values[il]), 1e-5);
    }
  }
}

TEST(DistillKlTest, ZeroForAnIdentitySelfTranslationAndPositiveOtherwise) {
  TempDir dir("distill-kl");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 9);
  auto model = training::LoadTranslatorModel(a);
  ASSERT_TRUE(model.ok()) << model.status();
  const at::Tensor ids = testing::RandomIds(4096, {2, 20}, 4);
  c10::AutoGradMode no_grad(false);
  for (bool identity : {true, false}) {
    std::unique_ptr<Translator> tr = testing::MakeTranslator(a, a, identity, 8);
    const double kl = training::DistillKl(model->config(), model->weights32, model->config(),
                                       model->weights32, tr->spec(), tr->key_maps(),
                                       tr->value_maps(), ids, 12)
                          .item<double>();
    if (identity) {
      EXPECT_LT(std::abs(kl), 1e-6);
    } else {
      EXPECT_GT(kl, 1e-3);
    }
  }
}

// A random model over the second house tokenizer (models/tokenizer-t2,
// 3,072 ids), for the cases across tokenizers (issue 54).
std::string WriteT2Model(const TempDir& dir, const std::string& name, uint64_t seed,
                         double std = 0.25) {
  const std::string t2 = std::string(KVL_SOURCE_DIR) + "/models/tokenizer-t2";
  const ModelConfig config =
      testing::TinyConfig({"qwen3", true, false, true, 4, 2}, 2, 32, 8, /*vocab=*/3072);
  const std::string path = dir.Path(name);
  const absl::Status s =
      SaveCheckpoint(path, config, testing::RandomWeights(config, seed, std), DType::kFloat32,
                     t2 + "/tokenizer.json", t2 + "/tokenizer_config.json");
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// Across tokenizers the objective is the KL of the switch the engines make
// (TranslatedCacheAcross, then the target reads the rest itself) against the
// target's own prefill: two independent computations of one quantity.
TEST(DistillKlTest, AcrossTokenizersIsTheKlOfTheEnginesSwitch) {
  TempDir dir("distill-kl-across");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 9);
  const std::string c = WriteT2Model(dir, "c", 10);
  auto source = training::LoadTranslatorModel(a);
  auto target = training::LoadTranslatorModel(c);
  ASSERT_TRUE(source.ok() && target.ok());
  std::unique_ptr<Translator> tr = testing::MakeTranslator(a, c, false, 8);
  auto stream = training::ReadTokenStream(
      dir.WriteFile("chats.txt", testing::TinyChatCorpus(4000, 12)), *target->tokenizer);
  ASSERT_TRUE(stream.ok());
  const int64_t p = 22, n = 30;
  std::vector<at::Tensor> rows;
  for (const auto& w : training::ConsecutiveWindows(*stream, n, 2)) rows.push_back(at::tensor(w));
  ASSERT_EQ(rows.size(), 2u);
  const training::AcrossTokenizers across{source->tokenizer.get(), target->tokenizer.get()};
  c10::AutoGradMode no_grad(false);
  const double kl = training::DistillKl(source->config(), source->weights32, target->config(),
                                        target->weights32, tr->spec(), tr->key_maps(),
                                        tr->value_maps(), at::stack(rows), p, at::Tensor(),
                                        at::Tensor(), &across)
                        .item<double>();
  double want = 0;
  int64_t not_one_to_one = 0;
  for (const at::Tensor& row : rows) {
    const std::vector<int64_t> ids(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + n);
    auto x = training::TranslatedCacheAcross(*source, *target, *tr,
                                             std::vector<int64_t>(ids.begin(), ids.begin() + p), p);
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_EQ(x->n_translated, p);
    not_one_to_one += x->n_groups - x->n_one_to_one;
    auto student = target->engine->Prefill(
        *x->cache, std::vector<int64_t>(ids.begin() + p, ids.end()), true);
    auto own = target->engine->NewCache();
    auto teacher = target->engine->Prefill(*own, ids, true);
    ASSERT_TRUE(student.ok() && teacher.ok());
    const at::Tensor lp = at::log_softmax(teacher->narrow(0, p, n - p).to(at::kDouble), -1);
    const at::Tensor lq = at::log_softmax(student->to(at::kDouble), -1);
    want += (lp.exp() * (lp - lq)).sum(-1).mean().item<double>() / 2;
  }
  EXPECT_GT(not_one_to_one, 0) << "the two tokenizers split these windows alike";
  EXPECT_GT(want, 1e-3);
  EXPECT_NEAR(kl, want, 1e-4 * std::max(1.0, want));
}

// The attention-weighted fit's forward is the reference model (same logits),
// and the mass it reports is a share of each continuation query's attention.
TEST(AttentionMassTest, ForwardIsTheReferenceModelAndMassIsBounded) {
  const testing::TinyModel shape{"qwen3", true, false, true, 4, 2};
  const ModelConfig config = testing::TinyConfig(shape, 3);
  const ModelWeights weights = testing::RandomWeights(config, 31);
  const at::Tensor ids = testing::RandomIds(config.vocab_size, {1, 24}, 32);
  const std::vector<int64_t> v(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 24);
  const training::AttentionMass mass = training::PrefixAttentionMass(config, weights, v, 16);
  c10::AutoGradMode no_grad(false);
  const at::Tensor want = ReferenceForward(config, weights, ids).logits[0];
  EXPECT_LT(testing::MaxAbsDiff(mass.logits, want), 1e-4);
  ASSERT_EQ(mass.received.size(0), 16);
  EXPECT_GE(mass.received.min().item<double>(), 0.0);
  const double total = mass.received.sum().item<double>();
  EXPECT_GT(total, 0.0);
  EXPECT_LE(total, 8.0 + 1e-9);  // 8 continuation queries, each distributing 1
  // One query: its attention over the prefix, averaged over layers and heads, is below 1.
  const training::AttentionMass last = training::PrefixAttentionMass(config, weights, v, 23);
  EXPECT_LE(last.received.sum().item<double>(), 1.0 + 1e-9);
  EXPECT_GT(last.received.sum().item<double>(), 0.5);  // the prefix is 23 of 24 keys
}

// A quiet one-thread run of `kvl distill` from `init`; tests set the sizes.
training::DistillOptions QuietOptions(const std::string& source, const std::string& target,
                                   const std::string& init, const std::string& train,
                                   const std::string& valid, const std::string& out) {
  training::DistillOptions o;
  o.source_dir = source;
  o.target_dir = target;
  o.init_path = init;
  o.train_path = train;
  o.valid_path = valid;
  o.out_path = out;
  o.n_threads = 1;
  o.progress = false;
  o.plot = false;
  return o;
}

// Mean over `rows` (windows of ids) of DistillKl with `t`'s maps, 4 at a time.
double MeanKlOf(const training::TranslatorModel& source, const training::TranslatorModel& target,
                const Translator& t, const std::vector<at::Tensor>& rows, int64_t n_prefix) {
  c10::AutoGradMode no_grad(false);
  double sum = 0;
  for (size_t i = 0; i < rows.size(); i += 4) {
    const size_t j = std::min(rows.size(), i + 4);
    sum += training::DistillKl(source.config(), source.weights32, target.config(), target.weights32,
                            t.spec(), t.key_maps(), t.value_maps(),
                            at::stack(std::vector<at::Tensor>(rows.begin() + i, rows.begin() + j)),
                            n_prefix)
               .item<double>() *
           static_cast<double>(j - i);
  }
  return sum / static_cast<double>(rows.size());
}

// Oracle for HandOverPoints: token positions p such that the text of tokens
// [0, p] (reply: up to and including p; turn: before p) ends at one of the
// given byte offsets of `text`.
std::vector<int64_t> TokensEndingAt(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                    const std::set<size_t>& bytes, bool inclusive) {
  std::vector<int64_t> out;
  for (size_t p = 0; p < ids.size(); ++p) {
    const size_t n = tok.Decode(absl::Span<const int32_t>(ids.data(), p + (inclusive ? 1 : 0))).size();
    if (bytes.count(n)) out.push_back(static_cast<int64_t>(p));
  }
  return out;
}

TEST(HandOverTest, PointsAreReplyStartsAndUserTurnsAfterAReply) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromFile(testing::HouseTokenizerDir() + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  // Three conversations as the data generator writes them (an empty line
  // between): a system turn, a user turn at a conversation's start, and user
  // turns that follow a reply (only those are switch points).
  const std::string text =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nI have 3 pens.<|im_end|>\n"
      "<|im_start|>assistant\nOkay.<|im_end|>\n<|im_start|>user\nHow many pens?<|im_end|>\n"
      "<|im_start|>assistant\n3<|im_end|>\n\n"
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n\n"
      "<|im_start|>user\nReverse abc.<|im_end|>\n<|im_start|>assistant\ncba<|im_end|>\n"
      "<|im_start|>user\nAgain.<|im_end|>\n";
  const std::vector<int32_t> ids = (*tok)->Encode(text, /*parse_special=*/true);
  std::set<size_t> reply_bytes, turn_bytes;
  const std::string head = "<|im_start|>assistant\n";
  for (size_t at = text.find(head); at != std::string::npos; at = text.find(head, at + 1)) {
    reply_bytes.insert(at + head.size());
  }
  for (const std::string after : {"Okay.<|im_end|>\n", "cba<|im_end|>\n"}) {
    turn_bytes.insert(text.find(after) + after.size());
  }
  const std::vector<int64_t> reply = TokensEndingAt(**tok, ids, reply_bytes, true);
  const std::vector<int64_t> turn = TokensEndingAt(**tok, ids, turn_bytes, false);
  ASSERT_EQ(reply.size(), 4u);
  ASSERT_EQ(turn.size(), 2u);
  EXPECT_EQ(training::HandOverPoints(**tok, ids, training::HandOver::kReply), reply);
  EXPECT_EQ(training::HandOverPoints(**tok, ids, training::HandOver::kTurn), turn);
  std::vector<int64_t> chat = reply;
  chat.insert(chat.end(), turn.begin(), turn.end());
  std::sort(chat.begin(), chat.end());
  EXPECT_EQ(training::HandOverPoints(**tok, ids, training::HandOver::kChat), chat);
  EXPECT_TRUE(training::HandOverPoints(**tok, ids, training::HandOver::kAny).empty());

  for (training::HandOver h : {training::HandOver::kAny, training::HandOver::kReply,
                            training::HandOver::kTurn, training::HandOver::kChat}) {
    absl::StatusOr<training::HandOver> back = training::ParseHandOver(training::HandOverName(h));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, h);
  }
  EXPECT_EQ(training::ParseHandOver("replies").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DistillTest, ReplyHandOverValidatesOnWindowsEndingAtReplies) {
  TempDir dir("distill_hand_over");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 31, 0.12);
  const std::string b = testing::WriteRandomModel(dir, "b", 2, 1, 32, 0.12);
  const std::string train = dir.WriteFile("train.txt", testing::TinyChatCorpus(7000, 60));
  const std::string valid = dir.WriteFile("valid.txt", testing::TinyChatCorpus(907000, 30));
  const std::string init = dir.Path("init.safetensors");
  ASSERT_TRUE(testing::MakeTranslator(a, b, /*identity=*/false, 3)->Save(init).ok());

  training::DistillOptions o = QuietOptions(a, b, init, train, valid, dir.Path("distilled.safetensors"));
  o.prefix = 24;
  o.continuation = 8;
  o.batch = 4;
  o.steps = 2;
  o.valid_windows = 6;
  o.hand_over = training::HandOver::kReply;
  auto r = training::Distill(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n_valid_windows, 6);

  // The validation KL before training is that of the init maps on the first
  // six non-overlapping windows whose prefix ends just before the newline of
  // an "<|im_start|>assistant\n", found here from the decoded text.
  auto source = training::LoadTranslatorModel(a);
  auto target = training::LoadTranslatorModel(b);
  ASSERT_TRUE(source.ok() && target.ok());
  const std::string valid_text = testing::TinyChatCorpus(907000, 30);
  auto vstream = training::ReadTokenStream(valid, *source->tokenizer);
  ASSERT_TRUE(vstream.ok());
  std::set<size_t> reply_bytes;
  const std::string head = "<|im_start|>assistant\n";
  for (size_t at = valid_text.find(head); at != std::string::npos;
       at = valid_text.find(head, at + 1)) {
    reply_bytes.insert(at + head.size());
  }
  std::vector<at::Tensor> rows;
  int64_t free_from = 0;
  for (int64_t p : TokensEndingAt(*source->tokenizer, *vstream, reply_bytes, true)) {
    const int64_t off = p - o.prefix;
    if (off < free_from || rows.size() == 6) continue;
    rows.push_back(at::tensor(std::vector<int64_t>(vstream->begin() + off,
                                                   vstream->begin() + off + 32)));
    free_from = off + 32;
  }
  ASSERT_EQ(rows.size(), 6u);
  auto maps = Translator::Load(init, training::ExpectationFor(*source, *target));
  ASSERT_TRUE(maps.ok()) << maps.status();
  const double kl = MeanKlOf(*source, *target, **maps, rows, o.prefix);
  EXPECT_NEAR(kl, r->initial_valid_kl, 1e-5 * std::max(1.0, kl));
  nlohmann::json summary;
  std::ifstream(dir.Path("distilled.distill.json")) >> summary;
  EXPECT_EQ(summary["hand_over"], "reply");
  EXPECT_EQ(summary["score"], "all");

  // Scoring the reply only: the same windows, each position up to the one
  // that predicts the reply's <|im_end|>. With causal attention that is the KL
  // of the window cut after that position.
  o.score_assistant = true;
  auto scored = training::Distill(o);
  ASSERT_TRUE(scored.ok()) << scored.status();
  const int32_t im_end = *source->tokenizer->AddedTokenId("<|im_end|>");
  double sum = 0, n = 0;
  for (const at::Tensor& row : rows) {
    int64_t k = 0;  // scored positions: 0 .. k
    while (k + 1 < o.continuation && row[o.prefix + k + 1].item<int64_t>() != im_end) ++k;
    const at::Tensor cut = row.narrow(0, 0, o.prefix + k + 1).unsqueeze(0);
    sum += training::DistillKl(source->config(), source->weights32, target->config(),
                            target->weights32, (*maps)->spec(), (*maps)->key_maps(),
                            (*maps)->value_maps(), cut, o.prefix)
               .item<double>() *
           static_cast<double>(k + 1);
    n += static_cast<double>(k + 1);
  }
  EXPECT_LT(n, 6.0 * static_cast<double>(o.continuation));  // some replies end inside
  EXPECT_NEAR(sum / n, scored->initial_valid_kl, 1e-5 * std::max(1.0, sum / n));
  o.score_assistant = false;

  // Scoring replies on windows cut anywhere is refused (many hold no reply).
  o.hand_over = training::HandOver::kAny;
  o.score_assistant = true;
  EXPECT_EQ(training::Distill(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.hand_over = training::HandOver::kReply;
  o.score_assistant = false;

  // A corpus without chat turns has no hand-over point: a clear error.
  o.train_path = dir.WriteFile("plain.txt", std::string(4000, 'a'));
  EXPECT_EQ(training::Distill(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// Stage 1 on the training text, as kvl fit does it (relative depth, band 1,
// ridge 1e-4, 40 windows of 64 tokens), saved to `out`.
void FitClosedForm(const training::TranslatorModel& source, const training::TranslatorModel& target,
                   const std::string& train, const std::string& out) {
  auto stream = training::ReadTokenStream(train, *source.tokenizer);
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto moments = MomentAccumulator::Create(source.Endpoint(), target.Endpoint());
  ASSERT_TRUE(moments.ok());
  for (const std::vector<int64_t>& w : training::ConsecutiveWindows(*stream, 64, 40)) {
    ASSERT_TRUE(AccumulateSequence(*source.engine, *target.engine, w, **moments).ok());
  }
  TranslatorSpec spec;
  spec.source = source.Endpoint();
  spec.target = target.Endpoint();
  spec.assignment_kind = "relative_depth";
  spec.assignment = *RelativeDepthAssignment(source.config().n_layer, target.config().n_layer, 1);
  auto fit = (*moments)->Fit(spec, 1e-4);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_TRUE(fit->translator->Save(out).ok());
}

TEST(DistillTest, ShortRunLowersValidationKlAndKeepsTheBestMaps) {
  TempDir dir("distill");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 21, 0.12);
  const std::string b = testing::WriteRandomModel(dir, "b", 3, 1, 22, 0.12);
  const std::string train = dir.WriteFile("train.txt", testing::TinyChatCorpus(5000, 120));
  const std::string valid = dir.WriteFile("valid.txt", testing::TinyChatCorpus(905000, 20));
  auto source = training::LoadTranslatorModel(a);
  auto target = training::LoadTranslatorModel(b);
  ASSERT_TRUE(source.ok() && target.ok());
  const std::string init = dir.Path("init.safetensors");
  FitClosedForm(*source, *target, train, init);

  training::DistillOptions o = QuietOptions(a, b, init, train, valid, dir.Path("distilled.safetensors"));
  o.prefix = 32;
  o.continuation = 16;
  o.batch = 4;
  o.steps = 60;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup = 5;
  o.eval_every = 10;
  o.valid_windows = 8;
  auto r = training::Distill(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->initial_valid_kl, 0.0);
  EXPECT_LT(r->best_valid_kl, 0.85 * r->initial_valid_kl)
      << "initial " << r->initial_valid_kl << " best " << r->best_valid_kl;
  EXPECT_GT(r->best_step, 0);
  ASSERT_EQ(r->log.size(), 60u);

  // The file holds the best maps: recomputing the validation KL with them
  // gives the best value, and it is marked as distilled for these models.
  auto saved = Translator::Load(o.out_path, training::ExpectationFor(*source, *target));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ((*saved)->spec().training.method, "distilled");
  EXPECT_EQ((*saved)->spec().training.steps, r->best_step);
  // The closed form it started from is kept as the file's earlier stage.
  ASSERT_EQ((*saved)->spec().history.size(), 1u);
  EXPECT_EQ((*saved)->spec().history[0].method, "closed_form");
  EXPECT_GT((*saved)->spec().history[0].n_tokens, 0);
  auto vstream = training::ReadTokenStream(valid, *source->tokenizer);
  std::vector<at::Tensor> rows;
  for (const auto& w : training::ConsecutiveWindows(*vstream, 48, 8)) rows.push_back(at::tensor(w));
  const double kl = MeanKlOf(*source, *target, **saved, rows, 32);
  EXPECT_NEAR(kl, r->best_valid_kl, 1e-5 * std::max(1.0, kl));

  // An init translator built for other models is refused.
  o.init_path = init;
  o.source_dir = b;
  o.target_dir = a;
  EXPECT_EQ(training::Distill(o).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Stage 2 across tokenizers (issue 54), from the closed-form fit across them
// (FitFromCorpus): a short run lowers the validation KL, whitened as the
// joint maps' recipe runs.
TEST(DistillTest, AcrossTokenizersAShortRunLowersValidationKl) {
  TempDir dir("distill-across");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 41, 0.12);
  const std::string c = WriteT2Model(dir, "c", 42, 0.12);
  const std::string train = dir.WriteFile("train.txt", testing::TinyChatCorpus(6000, 80));
  const std::string valid = dir.WriteFile("valid.txt", testing::TinyChatCorpus(906000, 20));
  CorpusFitOptions fit_options;
  fit_options.source_dir = a;
  fit_options.target_dir = c;
  fit_options.data_path = train;
  fit_options.seq_len = 64;
  fit_options.max_sequences = 40;
  fit_options.n_threads = 1;
  fit_options.progress = false;
  auto fit = FitFromCorpus(fit_options);
  ASSERT_TRUE(fit.ok()) << fit.status();
  const std::string init = dir.Path("init.safetensors");
  ASSERT_TRUE(fit->fit.translator->Save(init).ok());

  training::DistillOptions o =
      QuietOptions(a, c, init, train, valid, dir.Path("distilled.safetensors"));
  o.prefix = 32;
  o.continuation = 16;
  o.batch = 4;
  o.steps = 40;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup = 5;
  o.eval_every = 10;
  o.valid_windows = 6;
  o.whiten = true;
  o.whiten_windows = 16;
  auto r = training::Distill(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->initial_valid_kl, 0.0);
  EXPECT_LT(r->best_valid_kl, 0.9 * r->initial_valid_kl)
      << "initial " << r->initial_valid_kl << " best " << r->best_valid_kl;
  auto source = training::LoadTranslatorModel(a);
  auto target = training::LoadTranslatorModel(c);
  ASSERT_TRUE(source.ok() && target.ok());
  auto saved = Translator::Load(o.out_path, training::ExpectationFor(*source, *target));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ((*saved)->spec().training.method, "distilled");
}

TEST(WhiteningTest, WhitensCorrelatedInputsAndInvertsItself) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(51);
  // Rows with a mean and strongly unequal, correlated directions (scales 1e-2..30).
  const at::Tensor mix = at::randn({6, 6}, gen, at::kDouble);
  const at::Tensor scales = at::tensor({30.0, 10.0, 3.0, 1.0, 0.1, 0.01}, at::kDouble);
  const at::Tensor x = at::randn({20000, 6}, gen, at::kDouble).mul(scales).matmul(mix) + 5.0;
  const at::Tensor xx = x.t().matmul(x), x_sum = x.sum(0);
  const at::Tensor centred = x - x.mean(0);
  const at::Tensor cov = centred.t().matmul(centred) / 20000.0;
  const training::Whitening w = training::WhiteningOf(xx, x_sum, 20000, /*floor=*/1e-12);
  ASSERT_EQ(w.p.sizes(), at::IntArrayRef({6, 6}));
  EXPECT_EQ(w.p.scalar_type(), at::kFloat);
  // P C P = I and P P⁻¹ = I (float32 results of a float64 solve).
  const at::Tensor p = w.p.to(at::kDouble);
  EXPECT_LT(testing::MaxAbsDiff(p.matmul(cov).matmul(p), at::eye(6, at::kDouble)), 1e-3);
  EXPECT_LT(testing::MaxAbsDiff(p.matmul(w.p_inv.to(at::kDouble)), at::eye(6, at::kDouble)), 1e-3);
  // A floor of 1e-2·tr(C)/d lifts the smallest directions: P C P < I there.
  const training::Whitening floored = training::WhiteningOf(xx, x_sum, 20000, 1e-2);
  const at::Tensor white = floored.p.to(at::kDouble).matmul(cov).matmul(floored.p.to(at::kDouble));
  const at::Tensor eig = at::linalg_eigvalsh(white);
  EXPECT_LT(eig.min().item<double>(), 0.01);
  EXPECT_GT(eig.max().item<double>(), 0.99);
  EXPECT_LE(eig.max().item<double>(), 1.0 + 1e-6);
}

TEST(DistillTest, WhitenedStepsStartWhereTheInitIsAndLowerValidationKl) {
  TempDir dir("distill_whiten");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 61, 0.12);
  const std::string b = testing::WriteRandomModel(dir, "b", 3, 1, 62, 0.12);
  const std::string train = dir.WriteFile("train.txt", testing::TinyChatCorpus(7000, 120));
  const std::string valid = dir.WriteFile("valid.txt", testing::TinyChatCorpus(907000, 20));
  auto source = training::LoadTranslatorModel(a);
  auto target = training::LoadTranslatorModel(b);
  ASSERT_TRUE(source.ok() && target.ok());
  const std::string init = dir.Path("init.safetensors");
  FitClosedForm(*source, *target, train, init);

  auto run = [&](bool whiten) {
    training::DistillOptions o = QuietOptions(
        a, b, init, train, valid, dir.Path(whiten ? "white.safetensors" : "plain.safetensors"));
    o.prefix = 32;
    o.continuation = 16;
    o.batch = 4;
    o.steps = 60;
    o.lr = 1e-2;
    o.min_lr = 1e-3;
    o.warmup = 5;
    o.eval_every = 10;
    o.valid_windows = 8;
    o.whiten = whiten;
    o.whiten_windows = 16;
    return training::Distill(o);
  };
  auto plain = run(false);
  auto white = run(true);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(white.ok()) << white.status();
  // V·P reproduces the init's maps: the same starting validation KL.
  EXPECT_NEAR(white->initial_valid_kl, plain->initial_valid_kl, 1e-4 * plain->initial_valid_kl);
  // Whitened steps are different steps, and they lower the validation KL.
  EXPECT_NE(white->log[0].grad_norm, plain->log[0].grad_norm);
  EXPECT_LT(white->best_valid_kl, 0.95 * white->initial_valid_kl)
      << "initial " << white->initial_valid_kl << " best " << white->best_valid_kl;
  // The file holds W = V·P: recomputing the validation KL from it gives the
  // best value.
  auto saved = Translator::Load(dir.Path("white.safetensors"), training::ExpectationFor(*source, *target));
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto vstream = training::ReadTokenStream(valid, *source->tokenizer);
  ASSERT_TRUE(vstream.ok());
  std::vector<at::Tensor> rows;
  for (const auto& w : training::ConsecutiveWindows(*vstream, 48, 8)) rows.push_back(at::tensor(w));
  const double kl = MeanKlOf(*source, *target, **saved, rows, 32);
  EXPECT_NEAR(kl, white->best_valid_kl, 1e-5 * std::max(1.0, kl));
  std::ifstream summary(dir.Path("white.distill.json"));
  const nlohmann::json j = nlohmann::json::parse(summary);
  EXPECT_EQ(j.at("whiten").at("windows").get<int64_t>(), 16);
}

TEST(DistillTest, Bf16AutocastStepsTrainLikeFloat32AndValidateInFloat32) {
  TempDir dir("distill_bf16");
  const std::string a = testing::WriteRandomModel(dir, "a", 2, 2, 41, 0.12);
  const std::string b = testing::WriteRandomModel(dir, "b", 3, 1, 42, 0.12);
  const std::string train = dir.WriteFile("train.txt", testing::TinyChatCorpus(8000, 80));
  const std::string valid = dir.WriteFile("valid.txt", testing::TinyChatCorpus(908000, 20));
  const std::string init = dir.Path("init.safetensors");
  ASSERT_TRUE(testing::MakeTranslator(a, b, /*identity=*/false, 5)->Save(init).ok());
  auto run = [&](bool bf16) {
    training::DistillOptions o = QuietOptions(a, b, init, train, valid,
                                           dir.Path(bf16 ? "bf16.safetensors" : "f32.safetensors"));
    o.prefix = 32;
    o.continuation = 16;
    o.batch = 4;
    o.steps = 40;
    o.lr = 1e-2;
    o.min_lr = 1e-3;
    o.warmup = 5;
    o.eval_every = 10;
    o.valid_windows = 8;
    o.bf16 = bf16;
    return training::Distill(o);
  };
  // bf16 first, so that autocast left on would also change the float32 run.
  auto bf16 = run(true);
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  auto f32 = run(false);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  // Validation is float32 either way: the same starting value.
  EXPECT_NEAR(bf16->initial_valid_kl, f32->initial_valid_kl, 1e-9 * f32->initial_valid_kl);
  // The first step's training KL (same batch, same maps) agrees to bf16
  // rounding, and differs (autocast engaged).
  ASSERT_FALSE(f32->log.empty());
  ASSERT_FALSE(bf16->log.empty());
  EXPECT_NEAR(bf16->log[0].kl, f32->log[0].kl, 0.03 * f32->log[0].kl);
  EXPECT_NE(bf16->log[0].kl, f32->log[0].kl);
  // And bf16 steps lower the validation KL as float32 ones do.
  EXPECT_LT(f32->best_valid_kl, 0.85 * f32->initial_valid_kl);
  EXPECT_LT(bf16->best_valid_kl, 0.85 * bf16->initial_valid_kl);
  EXPECT_LT(bf16->best_valid_kl, 1.2 * f32->best_valid_kl);
  EXPECT_GT(bf16->best_step, 0);
  // The later validations were float32 too: the saved best maps give the
  // recorded best KL when recomputed in float32.
  auto source = training::LoadTranslatorModel(a);
  auto target = training::LoadTranslatorModel(b);
  ASSERT_TRUE(source.ok() && target.ok());
  auto saved = Translator::Load(dir.Path("bf16.safetensors"), training::ExpectationFor(*source, *target));
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto vstream = training::ReadTokenStream(valid, *source->tokenizer);
  ASSERT_TRUE(vstream.ok());
  std::vector<at::Tensor> rows;
  for (const auto& w : training::ConsecutiveWindows(*vstream, 48, 8)) rows.push_back(at::tensor(w));
  const double kl = MeanKlOf(*source, *target, **saved, rows, 32);
  EXPECT_NEAR(kl, bf16->best_valid_kl, 1e-5 * std::max(1.0, kl));
  std::ifstream summary(dir.Path("bf16.distill.json"));
  ASSERT_TRUE(summary.good());
  EXPECT_EQ(nlohmann::json::parse(summary).at("bf16_autocast"), true);
}

// The committed translators say how they were made: every stage from the
// closed-form fit on, as the stage summaries committed beside them record it
// (the summaries are checked against the files by the script that stamped
// translators made before kvl distill kept its init's record). Each is
// token-anchored (W = 8) and distilled after its closed form.
TEST(CommittedTranslatorsTest, RecordEveryTrainingStage) {
  const std::string src = KVL_SOURCE_DIR;
  const std::pair<const char*, const char*> pairs[] = {{"kvl-small", "kvl-large"},
                                                       {"kvl-large", "kvl-small"},
                                                       {"kvl-small", "kvl-small-b"},
                                                       {"kvl-small-b", "kvl-small"}};
  for (const auto& [s, t] : pairs) {
    auto source = training::LoadTranslatorModel(src + "/models/" + s);
    auto target = training::LoadTranslatorModel(src + "/models/" + t);
    ASSERT_TRUE(source.ok() && target.ok());
    const std::string path = absl::StrCat(src, "/models/translators/", s, "__", t, ".safetensors");
    auto tr = Translator::Load(path, training::ExpectationFor(*source, *target));
    ASSERT_TRUE(tr.ok()) << tr.status();
    const TranslatorSpec& spec = (*tr)->spec();
    EXPECT_EQ(spec.anchor_window, 8) << path;
    ASSERT_GE(spec.history.size(), 1u) << path;
    EXPECT_EQ(spec.history[0].method, "closed_form") << path;
    EXPECT_GT(spec.history[0].n_tokens, 0) << path;
    int64_t distilled_steps = spec.training.steps;
    for (size_t i = 1; i < spec.history.size(); ++i) {
      EXPECT_EQ(spec.history[i].method, "distilled") << path;
      distilled_steps += spec.history[i].steps;
    }
    EXPECT_EQ(spec.training.method, "distilled") << path;
    EXPECT_GE(distilled_steps, 500) << path;
  }
  auto check = testing::RunProcess(
      {KVL_SYSTEM_PYTHON, src + "/scripts/train/restamp_translator_history.py", "--check",
       src + "/models/translators"},
      std::chrono::seconds(60));
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(check->exit_code, 0) << check->out << check->err;
}

}  // namespace
}  // namespace kvl::training
