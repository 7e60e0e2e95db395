// Continuous batching: Decoder::ForwardBatch against Forward row by row, and
// the batch scheduler against Engine::Generate / Prefill (the unbatched path
// is the oracle) for mixes of lengths, arrivals, stop conditions,
// cancellations and errors.
#include "model/scheduler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/decoder.h"
#include "tests/model/test_models.h"

namespace kvl {
namespace {

using testing::MaxAbsDiff;
using testing::RandomWeights;
using testing::TinyConfig;

// Logits of the batched and the unbatched path differ only by the GEMMs'
// summation order: float32 rounding on O(1) activations.
constexpr double kLogitTolerance = 1e-4;

// A context of 128 tokens; one intra-op thread, as the server's engine loops.
Checkpoint TinyCheckpoint() { return testing::TinyCheckpoint(128); }
std::unique_ptr<Engine> MakeEngine(const Checkpoint& c, int64_t chunk = 5) {
  return testing::MakeEngine(c, chunk, /*n_threads=*/1);
}

std::vector<int64_t> Ids(int64_t n, int64_t seed, int64_t vocab = 61) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back((seed * 7 + i * 13 + i * i) % vocab);
  return ids;
}

TEST(DecoderForwardBatch, EachRowMatchesItsOwnForward) {
  const Checkpoint c = TinyCheckpoint();
  DecoderOptions o;
  o.max_scores_bytes = 2048;  // several query blocks for the longer rows
  auto decoder = Decoder::Create(c.config, c.weights, o);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  // Rows: (history already in the line, tokens this forward, all logits).
  struct Case {
    int64_t history, n;
    bool all;
  };
  const std::vector<Case> cases = {{0, 1, false}, {9, 1, false}, {4, 7, true},
                                   {0, 12, false}, {30, 3, true}, {17, 1, false}};
  std::vector<std::unique_ptr<KvCache>> batched, single;
  std::vector<Decoder::Row> rows;
  std::vector<at::Tensor> expected;
  for (size_t i = 0; i < cases.size(); ++i) {
    batched.push_back((*decoder)->NewCache());
    single.push_back((*decoder)->NewCache());
    const at::Tensor history = at::tensor(Ids(cases[i].history + 1, i)).narrow(0, 0, cases[i].history);
    if (cases[i].history > 0) {
      (*decoder)->Forward(*batched[i], history, false);
      (*decoder)->Forward(*single[i], history, false);
    }
    const at::Tensor ids = at::tensor(Ids(cases[i].n, 100 + i));
    rows.push_back(Decoder::Row{batched[i].get(), ids, cases[i].all});
    expected.push_back((*decoder)->Forward(*single[i], ids, cases[i].all));
  }
  const std::vector<at::Tensor> got = (*decoder)->ForwardBatch(rows);
  ASSERT_EQ(got.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("row ", i));
    ASSERT_EQ(got[i].sizes(), expected[i].sizes());
    EXPECT_LT(MaxAbsDiff(got[i], expected[i]), kLogitTolerance);
    EXPECT_TRUE(at::equal(got[i].argmax(-1), expected[i].argmax(-1)));
    ASSERT_EQ(batched[i]->Length(), single[i]->Length());
    for (int64_t il = 0; il < c.config.n_layer; ++il) {
      EXPECT_LT(MaxAbsDiff(batched[i]->Keys(il), single[i]->Keys(il)), 1e-5);
      EXPECT_LT(MaxAbsDiff(batched[i]->Values(il), single[i]->Values(il)), 1e-5);
    }
    const auto taps_b = batched[i]->Taps(0, batched[i]->Length());
    const auto taps_s = single[i]->Taps(0, single[i]->Length());
    ASSERT_TRUE(taps_b.ok() && taps_s.ok());
    EXPECT_LT(MaxAbsDiff(taps_b->keys, taps_s->keys), 1e-5);
  }
  // Two rows on one line are refused, and the lines stay as they were.
  const int64_t before = batched[0]->Length();
  EXPECT_THROW((*decoder)->ForwardBatch({rows[0], rows[0]}), c10::Error);
  EXPECT_EQ(batched[0]->Length(), before);
}

// Decode rows of a float32 model take their attention from
// ops::DecodeAttention (loops over the line's memory); the tensor path, which
// CachedDecoderTest checks against the reference forward, is the oracle. For
// histories across the cache's growth (64 tokens), head sizes that are not a
// multiple of the loops' 8 lanes, a model without k-norm (no 1/rms kept) and
// the stored pre-norm taps, alone and in a batch with a prefill row. Layers
// after the first see the other path's rounding, hence tolerances, not
// equality (float32 on O(1) activations).
TEST(DecoderForwardBatch, RawDecodeAttentionMatchesTheTensorPath) {
  struct Variant {
    testing::TinyModel model;
    int64_t head_dim;
    KeyTapMode mode;
  };
  const std::vector<Variant> variants = {
      {{"qwen3", true, false, false, 4, 2}, 8, KeyTapMode::kInvert},
      {{"qwen3-d12", true, false, false, 6, 2}, 12, KeyTapMode::kInvert},
      {{"llama", false, true, true, 4, 4}, 8, KeyTapMode::kInvert},
      {{"qwen3-prenorm", true, false, false, 4, 2}, 8, KeyTapMode::kStorePreNorm}};
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.model.name);
    ModelConfig config = TinyConfig(v.model, 2, 32, v.head_dim);
    config.hidden_size = v.model.n_head * v.head_dim;
    config.intermediate_size = config.hidden_size * 3 / 2;
    const ModelWeights w = RandomWeights(config, 5);
    DecoderOptions raw_options, tensor_options;
    raw_options.tap_mode = tensor_options.tap_mode = v.mode;
    tensor_options.raw_decode_attention = false;
    auto raw = Decoder::Create(config, w, raw_options);
    auto tensor = Decoder::Create(config, w, tensor_options);
    ASSERT_TRUE(raw.ok() && tensor.ok());
    const std::vector<int64_t> histories = {0, 1, 9, 63, 64, 65, 200};
    std::vector<std::unique_ptr<KvCache>> raw_lines, tensor_lines;
    std::vector<Decoder::Row> raw_rows, tensor_rows;
    for (size_t i = 0; i < histories.size(); ++i) {
      raw_lines.push_back((*raw)->NewCache());
      tensor_lines.push_back((*tensor)->NewCache());
      if (histories[i] > 0) {
        const at::Tensor history = at::tensor(Ids(histories[i], 40 + i));
        (*raw)->Forward(*raw_lines[i], history, false);
        (*tensor)->Forward(*tensor_lines[i], history, false);
      }
      const at::Tensor token = at::tensor(Ids(1, 70 + i));
      raw_rows.push_back({raw_lines[i].get(), token, false});
      tensor_rows.push_back({tensor_lines[i].get(), token, false});
    }
    // A prefill row in the same batch keeps the tensor path.
    raw_lines.push_back((*raw)->NewCache());
    tensor_lines.push_back((*tensor)->NewCache());
    raw_rows.push_back({raw_lines.back().get(), at::tensor(Ids(6, 90)), true});
    tensor_rows.push_back({tensor_lines.back().get(), at::tensor(Ids(6, 90)), true});

    // Alone: the first decode row through Forward, then one more token each.
    const at::Tensor alone_raw = (*raw)->Forward(*raw_lines[3], raw_rows[3].ids, false);
    const at::Tensor alone_tensor = (*tensor)->Forward(*tensor_lines[3], tensor_rows[3].ids, false);
    EXPECT_LT(MaxAbsDiff(alone_raw, alone_tensor), 1e-5);
    const std::vector<at::Tensor> got = (*raw)->ForwardBatch(raw_rows);
    const std::vector<at::Tensor> want = (*tensor)->ForwardBatch(tensor_rows);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("row ", i));
      ASSERT_EQ(got[i].sizes(), want[i].sizes());
      EXPECT_LT(MaxAbsDiff(got[i], want[i]), 1e-5);
      EXPECT_TRUE(at::equal(got[i].argmax(-1), want[i].argmax(-1)));
      ASSERT_EQ(raw_lines[i]->Length(), tensor_lines[i]->Length());
      for (int64_t il = 0; il < config.n_layer; ++il) {
        EXPECT_LT(MaxAbsDiff(raw_lines[i]->Keys(il), tensor_lines[i]->Keys(il)), 1e-5);
        EXPECT_LT(MaxAbsDiff(raw_lines[i]->Values(il), tensor_lines[i]->Values(il)), 1e-5);
      }
      const auto taps_raw = raw_lines[i]->Taps(0, raw_lines[i]->Length());
      const auto taps_tensor = tensor_lines[i]->Taps(0, tensor_lines[i]->Length());
      ASSERT_TRUE(taps_raw.ok() && taps_tensor.ok());
      EXPECT_LT(MaxAbsDiff(taps_raw->keys, taps_tensor->keys), 1e-5);
    }
  }
}

// A step of one token multiplies the weights by vectors (at::mv, at::addmv
// with biases) instead of 1-row GEMMs; the GEMMs are the oracle. A model with
// biases and one without, token by token over a history that grows past the
// cache's first capacity, then a batched step of two decode rows (GEMMs on
// both sides) on the same lines: float32 paths differ by summation order only
// (1e-5 on O(1) values). In bfloat16 each product is rounded to 8 bits, and
// the two paths round differently; against the float32 model as the oracle
// the vectors' error must be no larger than the GEMMs' (within 1.5x: which
// one rounds closer differs token by token).
TEST(DecoderForwardBatch, MatrixVectorDecodeMatchesTheGemmPath) {
  for (const testing::TinyModel& m : {testing::TinyModel{"qwen3", true, false, false, 4, 2},
                                      testing::TinyModel{"llama-bias", false, true, true, 4, 4}}) {
    SCOPED_TRACE(m.name);
    const ModelConfig config = TinyConfig(m, 2, 32, 8);
    const ModelWeights w = RandomWeights(config, 6);
    // Per dtype: the vector path, the GEMM path, their lines.
    struct Pair {
      std::unique_ptr<Decoder> vector, gemm;
      std::unique_ptr<KvCache> vector_line, gemm_line;
      double vector_error = 0, gemm_error = 0;  // bfloat16 against float32
    };
    std::vector<Pair> pairs;
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      DecoderOptions vector_options, gemm_options;
      vector_options.dtype = gemm_options.dtype = dtype;
      gemm_options.matrix_vector_decode = false;
      auto vector = Decoder::Create(config, w, vector_options);
      auto gemm = Decoder::Create(config, w, gemm_options);
      ASSERT_TRUE(vector.ok() && gemm.ok());
      Pair p{*std::move(vector), *std::move(gemm), nullptr, nullptr};
      p.vector_line = p.vector->NewCache();
      p.gemm_line = p.gemm->NewCache();
      pairs.push_back(std::move(p));
    }
    Pair &f32 = pairs[0], &bf16 = pairs[1];
    for (int64_t id : Ids(70, 3)) {
      const at::Tensor token = at::tensor(std::vector<int64_t>{id});
      const at::Tensor want = f32.gemm->Forward(*f32.gemm_line, token, false);
      ASSERT_LT(MaxAbsDiff(f32.vector->Forward(*f32.vector_line, token, false), want), 1e-5);
      bf16.vector_error = std::max(
          bf16.vector_error, MaxAbsDiff(bf16.vector->Forward(*bf16.vector_line, token, false), want));
      bf16.gemm_error = std::max(
          bf16.gemm_error, MaxAbsDiff(bf16.gemm->Forward(*bf16.gemm_line, token, false), want));
    }
    EXPECT_LE(bf16.vector_error, 1.5 * bf16.gemm_error);
    for (int64_t il = 0; il < config.n_layer; ++il) {
      EXPECT_LT(MaxAbsDiff(f32.vector_line->Keys(il), f32.gemm_line->Keys(il)), 1e-5);
      EXPECT_LT(MaxAbsDiff(f32.vector_line->Values(il), f32.gemm_line->Values(il)), 1e-5);
    }
    // Two rows in one step: both decoders multiply matrices.
    std::unique_ptr<KvCache> vector_other = f32.vector->NewCache(),
                             gemm_other = f32.gemm->NewCache();
    const at::Tensor next = at::tensor(Ids(1, 9));
    const std::vector<at::Tensor> got = f32.vector->ForwardBatch(
        {{f32.vector_line.get(), next, false}, {vector_other.get(), next, false}});
    const std::vector<at::Tensor> want = f32.gemm->ForwardBatch(
        {{f32.gemm_line.get(), next, false}, {gemm_other.get(), next, false}});
    EXPECT_LT(MaxAbsDiff(got[0], want[0]), 1e-5);
    EXPECT_LT(MaxAbsDiff(got[1], want[1]), 1e-5);
  }
}

// One request of a mix: an existing history in the line, a prompt, options.
struct Job {
  std::vector<int64_t> history, prompt;
  GenerateOptions options;
  int delay_ms = 0;  // arrives this long after the others start
};

// Runs every job through Engine::Generate (the oracle) and through the
// scheduler from one thread per job, and compares.
// `between` runs after the oracle (to reset state the callbacks keep).
void ExpectSchedulerMatchesEngine(const Checkpoint& c, std::vector<Job> jobs,
                                  SchedulerOptions so = {},
                                  const std::function<void()>& between = {}) {
  auto engine = MakeEngine(c);
  std::vector<absl::StatusOr<GenerateResult>> expected;
  std::vector<int64_t> expected_length;
  for (const Job& j : jobs) {
    auto line = engine->NewCache();
    if (!j.history.empty()) {
      ASSERT_TRUE(engine->Prefill(*line, j.history).ok());
    }
    expected.push_back(engine->Generate(*line, j.prompt, j.options));
    expected_length.push_back(line->Length());
  }
  if (between) between();
  std::vector<std::unique_ptr<KvCache>> lines;
  for (const Job& j : jobs) {
    lines.push_back(engine->NewCache());
    if (!j.history.empty()) {
      ASSERT_TRUE(engine->Prefill(*lines.back(), j.history).ok());
    }
  }
  int64_t max_rows = 0;
  std::atomic<int64_t> steps{0};
  BatchScheduler::Callbacks callbacks;
  callbacks.on_step = [&](const StepStats& s) {
    max_rows = std::max(max_rows, s.rows);  // the loop thread alone writes it
    ++steps;
  };
  std::vector<absl::StatusOr<GenerateResult>> got(jobs.size(), absl::UnknownError("not run"));
  {
    BatchScheduler scheduler(*engine, so, callbacks);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < jobs.size(); ++i) {
      threads.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(jobs[i].delay_ms));
        GenerateOptions options = jobs[i].options;
        if (i == 0 && jobs.size() > 1) {
          // The first request's first step waits (briefly) for another to
          // queue, so that at least one step batches two requests whatever
          // the machine's speed. Engine::Generate ignores on_admitted.
          options.on_admitted = [&scheduler] {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            while (scheduler.waiting() == 0 && std::chrono::steady_clock::now() < until) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
          };
        }
        got[i] = scheduler.Generate(*lines[i], jobs[i].prompt, options);
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(scheduler.running(), 0);
    EXPECT_EQ(scheduler.waiting(), 0);
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("job ", i));
    ASSERT_EQ(got[i].ok(), expected[i].ok()) << got[i].status() << " vs " << expected[i].status();
    if (!got[i].ok()) {
      EXPECT_EQ(got[i].status().code(), expected[i].status().code());
      continue;
    }
    EXPECT_EQ(got[i]->tokens, expected[i]->tokens);
    EXPECT_EQ(got[i]->text, expected[i]->text);
    EXPECT_EQ(got[i]->finish_reason, expected[i]->finish_reason);
    EXPECT_EQ(got[i]->stop_token_id, expected[i]->stop_token_id);
    ASSERT_EQ(got[i]->logprobs.size(), expected[i]->logprobs.size());
    for (size_t t = 0; t < got[i]->logprobs.size(); ++t) {
      EXPECT_NEAR(got[i]->logprobs[t], expected[i]->logprobs[t], kLogitTolerance);
    }
    EXPECT_EQ(lines[i]->Length(), expected_length[i]);
  }
  if (jobs.size() > 1) {
    EXPECT_GE(max_rows, 2) << "no step batched two requests";
  }
}

// A pass runs on the engine loop's thread, its status comes back, and a
// cancelled one never runs.
TEST(BatchScheduler, PassesRunOnTheEngineLoopAndReturnTheirStatus) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  BatchScheduler scheduler(*engine, {});
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  Engine* seen = nullptr;
  const absl::Status s = scheduler.RunPass([&](Engine& e) {
    ran_on = std::this_thread::get_id();
    seen = &e;
    return absl::DataLossError("from the pass");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ran_on, caller);
  EXPECT_EQ(seen, engine.get());
  bool ran = false;
  BatchScheduler::Hooks hooks;
  hooks.cancelled = [] { return true; };
  EXPECT_EQ(scheduler.RunPass(
                [&](Engine&) {
                  ran = true;
                  return absl::OkStatus();
                },
                hooks)
                .code(),
            absl::StatusCode::kCancelled);
  EXPECT_FALSE(ran);
  // Between the steps of a running generation.
  auto line = engine->NewCache();
  GenerateOptions g;
  g.max_tokens = 20;
  std::thread generating([&] { EXPECT_TRUE(scheduler.Generate(*line, {1, 2, 3}, g).ok()); });
  int passes = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(scheduler
                    .RunPass([&](Engine&) {
                      ++passes;
                      return absl::OkStatus();
                    })
                    .ok());
  }
  generating.join();
  EXPECT_EQ(passes, 5);
}

TEST(BatchScheduler, GreedyMixOfLengthsAndArrivalsIsTokenIdenticalToTheEngine) {
  const Checkpoint c = TinyCheckpoint();
  std::vector<Job> jobs;
  for (int i = 0; i < 8; ++i) {
    Job j;
    j.history = Ids(i % 3 == 0 ? 0 : 3 + 5 * i, i);
    j.prompt = Ids(1 + (i * 5) % 17, 50 + i);  // 1 to 17 tokens, chunks of 5
    j.options.max_tokens = 4 + 3 * i;
    j.options.record_logprobs = true;
    j.delay_ms = (i % 4) * 15;
    jobs.push_back(std::move(j));
  }
  ExpectSchedulerMatchesEngine(c, jobs);
}

TEST(BatchScheduler, SampledStopTokensStopStringsAndSmallBudgets) {
  const Checkpoint c = TinyCheckpoint();
  auto text_of = [](int64_t id) { return absl::StrCat("<", id % 7, ">"); };
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) {
    Job j;
    j.prompt = Ids(2 + 3 * i, 9 + i);
    j.options.max_tokens = 20;
    j.options.sampling.temperature = 1.0;
    j.options.seed = 40 + i;
    if (i % 2 == 0) j.options.stop_token_ids = {3, 17};
    if (i % 3 == 0) {
      j.options.token_text = text_of;
      j.options.stop_strings = {"<2><", "5>"};
    }
    jobs.push_back(std::move(j));
  }
  SchedulerOptions so;
  so.max_step_tokens = 6;  // prompts split across steps, behind decode rows
  ExpectSchedulerMatchesEngine(c, jobs, so);
}

TEST(BatchScheduler, CancellationInsideABatchStopsOnlyThatRequest) {
  const Checkpoint c = TinyCheckpoint();
  std::vector<Job> jobs(4);
  for (int i = 0; i < 4; ++i) {
    jobs[i].prompt = Ids(4, i);
    jobs[i].options.max_tokens = 12;
  }
  // Job 1 cancels through on_token after its 3rd token, as in Engine::Generate.
  auto calls = std::make_shared<int>(0);
  jobs[1].options.on_token = [calls](int64_t, std::string_view) { return ++*calls < 3; };
  ExpectSchedulerMatchesEngine(c, jobs, {}, [calls] { *calls = 0; });

  // A request whose `cancelled` turns true while it waits never runs.
  auto engine = MakeEngine(c);
  SchedulerOptions so;
  so.max_running = 1;
  BatchScheduler scheduler(*engine, so);
  std::atomic<bool> first_started{false}, stop_second{false};
  GenerateOptions slow;
  slow.max_tokens = 30;
  slow.on_token = [&](int64_t, std::string_view) {
    first_started = true;
    while (!stop_second) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  };
  GenerateOptions second;
  second.max_tokens = 5;
  second.cancelled = [&] { return stop_second.load(); };
  auto line1 = engine->NewCache(), line2 = engine->NewCache();
  std::thread t([&] { ASSERT_TRUE(scheduler.Generate(*line1, Ids(3, 1), slow).ok()); });
  while (!first_started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread t2([&] {
    auto r = scheduler.Generate(*line2, Ids(3, 2), second);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->finish_reason, FinishReason::kCancelled);
    EXPECT_TRUE(r->tokens.empty());
  });
  while (scheduler.waiting() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop_second = true;
  t.join();
  t2.join();
  EXPECT_EQ(line2->Length(), 0);
}

TEST(BatchScheduler, AFullQueueRefusesAtOnceAndBadInputChangesNothing) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  SchedulerOptions so;
  so.max_running = 1;
  so.max_waiting = 1;
  BatchScheduler scheduler(*engine, so);
  std::atomic<bool> started{false}, release{false};
  GenerateOptions hold;
  hold.max_tokens = 2;
  hold.on_token = [&](int64_t, std::string_view) {
    started = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  };
  auto busy = engine->NewCache(), queued = engine->NewCache(), refused = engine->NewCache();
  std::thread t1([&] { EXPECT_TRUE(scheduler.Generate(*busy, Ids(3, 1), hold).ok()); });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  GenerateOptions quick;
  quick.max_tokens = 2;
  std::thread t2([&] { EXPECT_TRUE(scheduler.Generate(*queued, Ids(3, 2), quick).ok()); });
  while (scheduler.waiting() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = scheduler.Generate(*refused, Ids(3, 3), quick);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(BatchScheduler::IsQueueFull(r.status()));
  EXPECT_FALSE(BatchScheduler::IsQueueFull(absl::ResourceExhaustedError("cache budget")));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(refused->Length(), 0);
  release = true;
  t1.join();
  t2.join();

  // Bad ids and a context past max_position_embeddings: refused, line unchanged.
  auto line = engine->NewCache();
  EXPECT_EQ(scheduler.Generate(*line, {1, 999}, quick).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.Generate(*line, Ids(200, 1), quick).status().code(),
            absl::StatusCode::kOutOfRange);
  GenerateOptions bad = quick;
  bad.max_tokens = -1;
  EXPECT_EQ(scheduler.Generate(*line, Ids(2, 1), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(line->Length(), 0);
  // Decoding into the end of the context: OutOfRange and the line rolled back.
  GenerateOptions long_run = quick;
  long_run.max_tokens = 40;
  auto full = engine->NewCache();
  ASSERT_TRUE(engine->Prefill(*full, Ids(100, 4)).ok());
  auto expected = engine->Generate(*engine->NewCache(), Ids(100, 4), long_run);
  auto r2 = scheduler.Generate(*full, {5}, long_run);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kOutOfRange) << r2.status();
  EXPECT_EQ(full->Length(), 100);
}

TEST(BatchScheduler, PrefillMatchesTheEngineInTheForegroundAndTheBackground) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  const std::vector<int64_t> history = Ids(9, 3), ids = Ids(23, 4);
  auto oracle = engine->NewCache();
  ASSERT_TRUE(engine->Prefill(*oracle, history).ok());
  const auto expected = engine->Prefill(*oracle, ids, /*all_logits=*/true);
  ASSERT_TRUE(expected.ok());
  BatchScheduler scheduler(*engine, {});
  for (Priority p : {Priority::kInteractive, Priority::kBackground}) {
    auto line = engine->NewCache();
    ASSERT_TRUE(engine->Prefill(*line, history).ok());
    // A generation runs beside it in the same steps.
    auto other = engine->NewCache();
    GenerateOptions g;
    g.max_tokens = 10;
    std::thread t([&] { EXPECT_TRUE(scheduler.Generate(*other, Ids(6, 8), g).ok()); });
    const auto all = scheduler.Prefill(*line, ids, /*all_logits=*/true, p);
    t.join();
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->sizes(), expected->sizes());
    EXPECT_LT(MaxAbsDiff(*all, *expected), kLogitTolerance);
    EXPECT_EQ(line->Length(), oracle->Length());
  }
  // Cancelled before it runs: the line is as it was.
  auto line = engine->NewCache();
  const auto cancelled =
      scheduler.Prefill(*line, ids, false, Priority::kInteractive, {nullptr, [] { return true; }});
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(line->Length(), 0);
}

// The scheduler's own concurrency: many threads submit, cancel and finish at
// once against one loop (run under ThreadSanitizer by scripts/ci/tsan_check.sh;
// experiments/tsan_scheduler/README.md).
TEST(BatchScheduler, ManyThreadsSubmittingAndCancellingAtOnce) {
  const Checkpoint c = TinyCheckpoint();
  auto engine = MakeEngine(c);
  SchedulerOptions so;
  so.max_running = 5;
  so.max_step_tokens = 16;
  std::atomic<int64_t> steps{0};
  std::atomic<int> reported{0};
  BatchScheduler::Callbacks callbacks;
  callbacks.on_step = [&](const StepStats& s) { steps += s.rows > 0 ? 1 : 0; };
  callbacks.on_queue = [&](int running, int waiting) {
    EXPECT_GE(running, 0);
    EXPECT_GE(waiting, 0);
    ++reported;
  };
  BatchScheduler scheduler(*engine, so, callbacks);
  constexpr int kThreads = 12, kRounds = 4;
  std::atomic<int> ok{0}, cancelled{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto line = engine->NewCache();
      for (int round = 0; round < kRounds; ++round) {
        GenerateOptions g;
        g.max_tokens = 3 + (t + round) % 5;
        int seen = 0;
        if ((t + round) % 3 == 0) g.on_token = [&seen](int64_t, std::string_view) {
          return ++seen < 2;
        };
        const int64_t before = line->Length();
        if (round % 2 == 1) {
          auto p = scheduler.Prefill(*line, Ids(4, t), false, Priority::kBackground);
          ASSERT_TRUE(p.ok()) << p.status();
          ++ok;
          EXPECT_EQ(line->Length(), before + 4);
          continue;
        }
        auto r = scheduler.Generate(*line, Ids(1 + (t * 3 + round) % 9, t + round), g);
        ASSERT_TRUE(r.ok()) << r.status();
        (r->finish_reason == FinishReason::kCancelled ? cancelled : ok)++;
        EXPECT_GT(line->Length(), before);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok + cancelled, kThreads * kRounds);
  EXPECT_GT(cancelled.load(), 0);
  EXPECT_GT(steps.load(), 0);
  EXPECT_GT(reported.load(), 0);
  EXPECT_EQ(scheduler.running(), 0);
  EXPECT_EQ(scheduler.waiting(), 0);
}

}  // namespace
}  // namespace kvl
