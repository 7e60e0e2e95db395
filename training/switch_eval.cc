#include "training/switch_eval.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "cache_store/cache_store.h"
#include "datagen/chat_data.h"
#include "router/loader.h"
#include "router/router.h"
#include "training/eval_lm.h"
#include "training/plot.h"
#include "training/progress.h"
#include "training/translator_eval.h"
#include "translator/translator.h"

namespace kvl::training {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kSource[] = "source";
constexpr char kDocumentAck[] = "Okay, I have them.";  // one of datagen's kv acks
constexpr char kReprefill[] = "reprefill";

std::string TranslateCondition(int64_t tail) { return absl::StrCat("translate W=", tail); }
std::string RepairCondition(int64_t tail) { return absl::StrCat("translate W=", tail, " +repair"); }
// The hand-over turn of SwitchEvalOptions::hand_over_turn and its given reply.
constexpr char kHandOverTurn[] = "Thanks. One more question.";
constexpr char kHandOverReply[] = "Sure, go ahead.";

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

double StandardError(const std::vector<double>& v) {
  const size_t n = v.size();
  if (n < 2) return 0;
  const double mean = Mean(v);
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
}

absl::StatusOr<datagen::Task> ParseTask(const std::string& name) {
  for (int i = 0; i < datagen::kNumExactTasks; ++i) {
    const datagen::Task task = static_cast<datagen::Task>(i);
    if (name == datagen::TaskName(task)) return task;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown task '", name, "' (facts, kv, arith, lists, strings)"));
}

// splitmix64: item seeds that differ in every bit for neighbouring inputs.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// One condition's router over the pair, with its own session registry.
struct ConditionRouter {
  std::string name;
  int answer_model = 1;  // 0: the source answers
  router::Strategy strategy = router::Strategy::kTranslate;
  bool repair = false;
  std::unique_ptr<CacheStore> store;
  std::unique_ptr<router::Router> router;
};

// A router over two model directories (float32, explicit routing) with its
// own session registry.
absl::Status LoadPairRouter(const std::string& first_dir, const std::string& second_dir,
                            std::vector<router::TranslatorSource> translators,
                            router::Strategy strategy, int64_t native_tail, bool repair,
                            int n_threads, router::TurnObserver* observer,
                            std::unique_ptr<CacheStore>* store,
                            std::unique_ptr<router::Router>* out) {
  const std::vector<router::ModelSource> models = {
      {std::filesystem::path(first_dir).filename().string(), first_dir, DType::kFloat32},
      {std::filesystem::path(second_dir).filename().string(), second_dir, DType::kFloat32}};
  router::RouterConfig config;
  config.policy.policy = router::Policy::kExplicit;
  config.switching.strategy = strategy;
  config.switching.native_tail_tokens = native_tail;
  config.switching.repair = repair ? router::RepairMode::kAfterTurn : router::RepairMode::kOff;
  // One request at a time, no waiting limit: the evaluation's turns run one
  // after another, and its figures were measured so.
  config.batching.enabled = false;
  config.limits.max_waiting_turns = 0;
  CacheStoreOptions store_options;
  store_options.n_models = 2;
  *store = std::make_unique<CacheStore>(store_options);
  absl::StatusOr<std::unique_ptr<router::Router>> r =
      router::LoadRouter(models, translators, std::move(config), n_threads, store->get(), observer);
  if (!r.ok()) return r.status();
  *out = *std::move(r);
  return absl::OkStatus();
}

absl::StatusOr<ConditionRouter> MakeConditionRouter(const SwitchEvalOptions& o, std::string name,
                                                    int answer_model, router::Strategy strategy,
                                                    int64_t native_tail, bool repair = false) {
  ConditionRouter c;
  c.name = std::move(name);
  c.answer_model = answer_model;
  c.strategy = strategy;
  c.repair = repair;
  std::vector<router::TranslatorSource> translators;
  if (!o.translator_path.empty()) {
    translators.push_back(
        {"source->target", 0, 1, o.translator_path, o.translate_dtype, {}, {}, o.native_layers});
  }
  absl::Status s = LoadPairRouter(o.source_dir, o.target_dir, std::move(translators), strategy,
                                  native_tail, repair, o.n_threads, nullptr, &c.store, &c.router);
  if (!s.ok()) return s;
  return c;
}

struct ItemRun {
  bool over_context = false;
  std::string output;              // the greedy answer
  std::vector<double> logprobs;    // of the reference answer and its stop token
};

// The conversation on `c`: its turns but the last on the source model with
// their replies given, then the question on the answering model, once
// generating (greedy) and once reading the reference answer.
absl::StatusOr<ItemRun> RunItem(ConditionRouter& c, const datagen::Conversation& item,
                                const SwitchEvalOptions& o, int64_t serial) {
  std::vector<ChatMessage> m = item.messages;
  // A document and its question in one message (half the kv items) become a
  // document turn the source reads and a question turn after the switch.
  if (m.size() >= 2 && m[m.size() - 2].role == "user") {
    const std::string& last_user = m[m.size() - 2].content;
    const size_t cut = last_user.rfind("\n\n");
    if (cut != std::string::npos) {
      const ChatMessage question{"user", last_user.substr(cut + 2)};
      m[m.size() - 2].content = last_user.substr(0, cut);
      m.insert(m.end() - 1, ChatMessage{"assistant", kDocumentAck});
      m.insert(m.end() - 1, question);
    }
  }
  size_t first = 0;
  std::string system;
  if (!m.empty() && m[0].role == "system") {
    system = m[0].content;
    first = 1;
  }
  if (m.size() < first + 2 || m.back().role != "assistant" || m[m.size() - 2].role != "user") {
    return absl::InvalidArgumentError(absl::StrCat("item ", item.id, ": not a question and answer"));
  }
  ItemRun run;
  for (int pass = 0; pass < 2; ++pass) {
    const std::string id = absl::StrCat("item-", serial, "-", pass);
    absl::StatusOr<SessionView> session =
        c.store->Create(id, system, c.router->RenderPreamble(system));
    if (!session.ok()) return session.status();
    absl::Status status;
    for (size_t i = first; i + 2 < m.size() && status.ok(); i += 2) {
      if (m[i].role != "user" || m[i + 1].role != "assistant") {
        status = absl::InvalidArgumentError(absl::StrCat("item ", item.id, ": turns out of order"));
        break;
      }
      router::TurnOptions turn;
      turn.user_message = m[i].content;
      turn.explicit_model = 0;
      turn.reply = m[i + 1].content;
      status = c.router->RunTurn(id, turn, {}).status();
    }
    if (status.ok() && o.hand_over_turn) {
      router::TurnOptions hand_over;
      hand_over.user_message = kHandOverTurn;
      hand_over.explicit_model = c.answer_model;
      hand_over.strategy = c.strategy;
      hand_over.reply = kHandOverReply;
      status = c.router->RunTurn(id, hand_over, {}).status();
      if (status.ok() && c.repair && !c.router->WaitForRepairs(absl::Minutes(5))) {
        status = absl::DeadlineExceededError("the repair did not finish in 5 minutes");
      }
    }
    if (status.ok()) {
      router::TurnOptions question;
      question.user_message = m[m.size() - 2].content;
      question.explicit_model = c.answer_model;
      question.strategy = c.strategy;
      if (pass == 0) {
        question.max_tokens = o.max_new_tokens;
      } else {
        question.reply = m.back().content;
      }
      absl::StatusOr<router::TurnResult> answer = c.router->RunTurn(id, question, {});
      status = answer.status();
      if (answer.ok() && pass == 0) run.output = answer->text;
      if (answer.ok() && pass == 1) run.logprobs = answer->reply_logprobs;
    }
    (void)c.store->Remove(id);
    if (status.code() == absl::StatusCode::kOutOfRange) {
      run.over_context = true;
      return run;
    }
    if (!status.ok()) return status;
  }
  return run;
}

}  // namespace

datagen::DataOptions HouseCorpusKnobs() {
  datagen::DataOptions o;
  o.facts_max_distractors = 3;
  o.facts_max_filler = 4;
  o.kv_max_bytes = 2000;
  o.arith_max_steps = 5;
  o.list_max_len = 8;
  o.string_max_len = 10;
  return o;
}

double SwitchEvalCell::Accuracy() const { return Mean(correct); }
double SwitchEvalCell::AccuracyStandardError() const { return StandardError(correct); }
double SwitchEvalCell::MeanNll() const { return Mean(answer_nll); }
double SwitchEvalCell::NllStandardError() const { return StandardError(answer_nll); }

absl::StatusOr<SwitchEvalReport> RunSwitchEval(const SwitchEvalOptions& o) {
  const Clock::time_point t_start = Clock::now();
  if (o.items_per_task < 1 || o.max_new_tokens < 1 || o.difficulty < 0 || o.difficulty > 3) {
    return absl::InvalidArgumentError("need items >= 1, max-new-tokens >= 1, difficulty in [0, 3]");
  }
  for (int64_t tail : o.native_tails) {
    if (tail < 0) return absl::InvalidArgumentError("native tails must be >= 0");
  }
  if (!o.native_tails.empty() && o.translator_path.empty()) {
    return absl::InvalidArgumentError("translate conditions need a translator");
  }
  if (o.repair && !o.hand_over_turn) {
    return absl::InvalidArgumentError(
        "repair conditions need the hand-over turn: a repair helps the turns after a switch");
  }
  std::vector<datagen::Task> tasks;
  for (const std::string& name : o.tasks) {
    absl::StatusOr<datagen::Task> task = ParseTask(name);
    if (!task.ok()) return task.status();
    tasks.push_back(*task);
  }

  std::vector<ConditionRouter> routers;
  for (auto [name, answer_model, strategy, tail] :
       std::vector<std::tuple<std::string, int, router::Strategy, int64_t>>{
           {kSource, 0, router::Strategy::kReprefill, 0},
           {kReprefill, 1, router::Strategy::kReprefill, 0}}) {
    absl::StatusOr<ConditionRouter> c = MakeConditionRouter(o, name, answer_model, strategy, tail);
    if (!c.ok()) return c.status();
    routers.push_back(*std::move(c));
  }
  for (int64_t tail : o.native_tails) {
    absl::StatusOr<ConditionRouter> c =
        MakeConditionRouter(o, TranslateCondition(tail), 1, router::Strategy::kTranslate, tail);
    if (!c.ok()) return c.status();
    routers.push_back(*std::move(c));
    if (o.repair) {
      absl::StatusOr<ConditionRouter> repaired = MakeConditionRouter(
          o, RepairCondition(tail), 1, router::Strategy::kTranslate, tail, /*repair=*/true);
      if (!repaired.ok()) return repaired.status();
      routers.push_back(*std::move(repaired));
    }
  }

  SwitchEvalReport report;
  report.source_name = routers[0].router->model_names()[0];
  report.target_name = routers[0].router->model_names()[1];
  for (const ConditionRouter& c : routers) report.conditions.push_back(c.name);

  ProgressOptions po;
  po.label = "eval-switch";
  po.total = static_cast<int64_t>(tasks.size()) * o.items_per_task;
  po.unit = "item";
  std::unique_ptr<ProgressBar> bar = o.progress ? std::make_unique<ProgressBar>(po) : nullptr;
  int64_t serial = 0;
  for (datagen::Task task : tasks) {
    const std::string task_name = datagen::TaskName(task);
    std::map<std::string, SwitchEvalCell>& cells = report.cells[task_name];
    report.n_skipped[task_name] = 0;
    for (int64_t i = 0; i < o.items_per_task; ++i, ++serial) {
      const int difficulty = o.difficulty > 0 ? o.difficulty : 1 + static_cast<int>(i % 3);
      const uint64_t item_seed = Mix(o.seed ^ Mix(static_cast<uint64_t>(task) << 32 | i));
      const datagen::Conversation item =
          datagen::GenerateItem(task, difficulty, item_seed, o.data);
      std::vector<ItemRun> runs;
      bool over_context = false;
      for (ConditionRouter& c : routers) {
        absl::StatusOr<ItemRun> run = RunItem(c, item, o, serial);
        if (!run.ok()) return run.status();
        over_context = over_context || run->over_context;
        runs.push_back(*std::move(run));
      }
      if (over_context) {
        ++report.n_skipped[task_name];
      } else {
        for (size_t k = 0; k < routers.size(); ++k) {
          SwitchEvalCell& cell = cells[routers[k].name];
          const bool correct = AnswerMatches(runs[k].output, item.messages.back().content,
                                             item.scoring);
          ++cell.n_items;
          cell.n_correct += correct ? 1 : 0;
          cell.correct.push_back(correct ? 1.0 : 0.0);
          cell.answer_nll.push_back(-Mean(runs[k].logprobs));
        }
      }
      if (bar) bar->Update(serial + 1, task_name);
    }
  }
  if (bar) bar->Finish();
  report.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  return report;
}

std::string SwitchEvalTable(const SwitchEvalReport& r) {
  std::string out = absl::StrFormat(
      "%s -> %s: greedy answer accuracy and the reference answer's NLL (nats/token), "
      "mean ± standard error over the items\n\n",
      r.source_name, r.target_name);
  for (const auto& [task, cells] : r.cells) {
    const SwitchEvalCell& base = cells.at(kReprefill);
    absl::StrAppendFormat(&out, "### %s (%d items, %d over a model's context skipped)\n\n", task,
                          base.n_items, r.n_skipped.at(task));
    absl::StrAppend(&out,
                    "| condition | accuracy | recall / reprefill's | answer NLL | NLL - reprefill's |\n"
                    "|---|---|---|---|---|\n");
    for (const std::string& name : r.conditions) {
      const SwitchEvalCell& c = cells.at(name);
      std::string ratio = "—", excess = "—";
      if (name != kReprefill && base.Accuracy() > 0) {
        ratio = absl::StrFormat("%.2f ± %.2f", c.Accuracy() / base.Accuracy(),
                                RatioOfMeansStandardError(c.correct, base.correct));
      }
      if (name != kReprefill) {
        excess = absl::StrFormat("%+.3f ± %.3f", c.MeanNll() - base.MeanNll(),
                                 PairedDifferenceStandardError(c.answer_nll, base.answer_nll));
      }
      absl::StrAppendFormat(&out, "| %s | %.3f ± %.3f | %s | %.3f ± %.3f | %s |\n", name,
                            c.Accuracy(), c.AccuracyStandardError(), ratio, c.MeanNll(),
                            c.NllStandardError(), excess);
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

nlohmann::json SwitchEvalJson(const SwitchEvalOptions& o, const SwitchEvalReport& r) {
  nlohmann::json cells = nlohmann::json::object();
  for (const auto& [task, by_condition] : r.cells) {
    for (const auto& [name, c] : by_condition) {
      cells[task][name] = {{"n_items", c.n_items},
                           {"n_correct", c.n_correct},
                           {"accuracy", c.Accuracy()},
                           {"accuracy_se", c.AccuracyStandardError()},
                           {"answer_nll", c.MeanNll()},
                           {"answer_nll_se", c.NllStandardError()}};
    }
  }
  return {{"source", o.source_dir},
          {"target", o.target_dir},
          {"translator", o.translator_path},
          {"tasks", o.tasks},
          {"items_per_task", o.items_per_task},
          {"seed", o.seed},
          {"difficulty", o.difficulty},
          {"knobs",
           {{"facts_distractors", o.data.facts_max_distractors},
            {"facts_filler", o.data.facts_max_filler},
            {"kv_max_bytes", o.data.kv_max_bytes},
            {"arith_steps", o.data.arith_max_steps},
            {"list_len", o.data.list_max_len},
            {"string_len", o.data.string_max_len}}},
          {"native_tails", o.native_tails},
          {"hand_over_turn", o.hand_over_turn},
          {"repair", o.repair},
          {"max_new_tokens", o.max_new_tokens},
          {"translate_dtype", DTypeName(o.translate_dtype.value_or(FastestTranslateDtype()))},
          {"conditions", r.conditions},
          {"n_skipped", r.n_skipped},
          {"cells", cells},
          {"wall_s", r.wall_s}};
}

// ------------------------------------------------------------ conversations

namespace {

constexpr char kTranslate[] = "translate";
constexpr char kTranslateRepair[] = "translate +repair";

// A conversation about one key-value document: turn 1 gives the document and
// the first lookup, each later turn one more lookup.
struct KvConversation {
  std::string document;
  std::vector<std::pair<std::string, std::string>> turns;  // question, reference value
};

// The "key-xxxx: value" records of a datagen kv item, and the document
// holding them (without a question appended to it).
std::pair<std::string, std::vector<std::pair<std::string, std::string>>> RecordsOf(
    const datagen::Conversation& item) {
  for (const ChatMessage& m : item.messages) {
    if (m.role != "user" || m.content.find("\nkey-") == std::string::npos) continue;
    std::string document = m.content;
    if (const size_t cut = document.rfind("\n\n"); cut != std::string::npos) document.resize(cut);
    std::vector<std::pair<std::string, std::string>> records;
    for (absl::string_view line : absl::StrSplit(document, '\n')) {
      const size_t colon = line.find(": ");
      if (!absl::StartsWith(line, "key-") || colon == absl::string_view::npos) continue;
      records.emplace_back(std::string(line.substr(0, colon)), std::string(line.substr(colon + 2)));
    }
    return {document, records};
  }
  return {};
}

// The lookup wordings of datagen's kv items.
std::string LookupQuestion(const std::string& key, uint64_t variant) {
  switch (variant % 4) {
    case 0: return "What is the value of " + key + "?";
    case 1: return "What value does " + key + " have?";
    case 2: return "Look up " + key + " and tell me its value.";
    default: return "Which value is stored under " + key + "?";
  }
}

// Conversation i: a kv item of difficulty 1..3 (cycling) with at least
// `turns` records, redrawn until it has; `turns` distinct keys asked in a
// seeded order.
KvConversation DrawConversation(const ConversationEvalOptions& o, int64_t i, int64_t* redrawn) {
  const int difficulty = 1 + static_cast<int>(i % 3);
  for (uint64_t attempt = 0;; ++attempt) {
    const uint64_t seed = Mix(o.seed ^ Mix(static_cast<uint64_t>(i) << 20 | attempt));
    auto [document, records] =
        RecordsOf(datagen::GenerateItem(datagen::Task::kKv, difficulty, seed, o.data));
    if (static_cast<int>(records.size()) < o.turns) {
      ++*redrawn;
      continue;
    }
    // A seeded Fisher-Yates shuffle of the records; the first `turns` are asked.
    uint64_t state = Mix(seed);
    for (size_t k = records.size() - 1; k > 0; --k) {
      state = Mix(state);
      std::swap(records[k], records[state % (k + 1)]);
    }
    KvConversation c;
    c.document = std::move(document);
    for (int t = 0; t < o.turns; ++t) {
      state = Mix(state);
      c.turns.emplace_back(LookupQuestion(records[t].first, state), records[t].second);
    }
    return c;
  }
}

// Collects the repair's fidelity reports (from the repair thread).
class FidelityLog : public router::TurnObserver {
 public:
  void OnSwitchFidelity(int source, int target, double nats_per_token, int64_t tokens,
                        bool first_token_differs) override {
    std::lock_guard<std::mutex> lock(mu_);
    reports_.push_back({nats_per_token, first_token_differs});
  }
  std::vector<std::pair<double, bool>> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(reports_, {});
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<double, bool>> reports_ ABSL_GUARDED_BY(mu_);
};

struct StrategyRouter {
  std::string name;
  router::Strategy strategy = router::Strategy::kTranslate;
  bool repair = false, live = false;
  std::unique_ptr<FidelityLog> log;
  std::unique_ptr<CacheStore> store;
  std::unique_ptr<router::Router> router;
};

// One conversation's turns on one router, per turn.
struct ConversationRun {
  bool over_context = false;
  std::vector<double> correct, nll, read_ms, divergence, first_differs;
};

absl::StatusOr<ConversationRun> RunConversation(StrategyRouter& r, const KvConversation& c,
                                                const ConversationEvalOptions& o, int start,
                                                const std::string& id) {
  ConversationRun run;
  if (absl::StatusOr<SessionView> s = r.store->Create(id, "", {}); !s.ok()) return s.status();
  absl::Status status;
  for (int t = 0; t < o.turns && status.ok(); ++t) {
    const auto& [question, value] = c.turns[static_cast<size_t>(t)];
    router::TurnOptions turn;
    turn.user_message = t == 0 ? c.document + "\n\n" + question : question;
    turn.explicit_model = (start + t) % 2;
    turn.strategy = r.strategy;
    if (r.live) {
      turn.max_tokens = o.max_new_tokens;
    } else {
      turn.reply = value;
    }
    absl::StatusOr<router::TurnResult> result = r.router->RunTurn(id, turn, {});
    status = result.status();
    if (!status.ok()) break;
    if (r.live) {
      run.correct.push_back(AnswerMatches(result->text, value, "exact") ? 1 : 0);
    } else {
      bool greedy = true;
      for (bool g : result->reply_greedy) greedy = greedy && g;
      run.correct.push_back(greedy ? 1 : 0);
      run.nll.push_back(-Mean(result->reply_logprobs));
      run.read_ms.push_back(1e3 * result->time_to_first_token_seconds);
    }
    if (r.repair && !r.router->WaitForRepairs(absl::Minutes(5))) {
      status = absl::DeadlineExceededError("a repair did not finish in 5 minutes");
    }
    if (r.log != nullptr) {
      const std::vector<std::pair<double, bool>> reports = r.log->Take();
      run.divergence.push_back(reports.empty() ? std::nan("") : reports.back().first);
      run.first_differs.push_back(reports.empty() ? std::nan("") : reports.back().second);
    }
  }
  (void)r.store->Remove(id);
  if (status.code() == absl::StatusCode::kOutOfRange) {
    run.over_context = true;
    return run;
  }
  if (!status.ok()) return status;
  return run;
}

double Pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double mx = Mean(x), my = Mean(y);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : std::nan("");
}

}  // namespace

absl::StatusOr<ConversationEvalReport> RunConversationEval(const ConversationEvalOptions& o) {
  const Clock::time_point t_start = Clock::now();
  if (o.conversations < 1 || o.turns < 2 || o.native_tail < 0 || o.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        "need conversations >= 1, turns >= 2, native tail >= 0, max-new-tokens >= 1");
  }
  if (o.forward_translator.empty() || o.reverse_translator.empty()) {
    return absl::InvalidArgumentError("the conversations switch both ways: give both translators");
  }
  const std::vector<router::TranslatorSource> translators = {
      {"first->second", 0, 1, o.forward_translator, o.translate_dtype, {}, {}, {}},
      {"second->first", 1, 0, o.reverse_translator, o.translate_dtype, {}, {}, {}}};
  std::vector<StrategyRouter> routers;
  for (auto [name, strategy, repair, live] :
       std::vector<std::tuple<std::string, router::Strategy, bool, bool>>{
           {kReprefill, router::Strategy::kReprefill, false, false},
           {kTranslate, router::Strategy::kTranslate, false, false},
           {kTranslateRepair, router::Strategy::kTranslate, true, false},
           {"live", router::Strategy::kTranslate, true, true}}) {
    if (live && !o.live) continue;
    StrategyRouter r;
    r.name = name;
    r.strategy = strategy;
    r.repair = repair;
    r.live = live;
    if (live) r.log = std::make_unique<FidelityLog>();
    KVL_RETURN_IF_ERROR(LoadPairRouter(o.first_dir, o.second_dir, translators, strategy,
                                       o.native_tail, repair, o.n_threads, r.log.get(), &r.store,
                                       &r.router));
    routers.push_back(std::move(r));
  }

  ConversationEvalReport report;
  report.model_names[0] = routers[0].router->model_names()[0];
  report.model_names[1] = routers[0].router->model_names()[1];
  report.strategies = {kReprefill, kTranslate, kTranslateRepair};
  for (int start = 0; start < 2; ++start) {
    for (const std::string& name : report.strategies) {
      report.cells[start][name].resize(static_cast<size_t>(o.turns));
    }
    for (auto* m : {&report.live_correct, &report.live_divergence, &report.live_first_differs}) {
      (*m)[start].resize(static_cast<size_t>(o.turns));
    }
  }
  ProgressOptions po;
  po.label = "eval-conversation";
  po.total = 2 * o.conversations;
  po.unit = "conversation";
  std::unique_ptr<ProgressBar> bar = o.progress ? std::make_unique<ProgressBar>(po) : nullptr;
  int64_t done = 0;
  for (int64_t i = 0; i < o.conversations; ++i) {
    const KvConversation conversation = DrawConversation(o, i, &report.n_documents_redrawn);
    for (int start = 0; start < 2; ++start, ++done) {
      std::vector<ConversationRun> runs;
      bool over_context = false;
      for (StrategyRouter& r : routers) {
        absl::StatusOr<ConversationRun> run =
            RunConversation(r, conversation, o, start, absl::StrCat("conversation-", i, "-", start));
        if (!run.ok()) return run.status();
        over_context = over_context || run->over_context;
        runs.push_back(*std::move(run));
      }
      if (over_context) {
        return absl::InvalidArgumentError(absl::StrCat(
            "conversation ", i, " does not fit a model's context; lower the document size"));
      }
      for (size_t k = 0; k < routers.size(); ++k) {
        for (size_t t = 0; t < static_cast<size_t>(o.turns); ++t) {
          if (routers[k].live) {
            report.live_correct[start][t].push_back(runs[k].correct[t]);
            report.live_divergence[start][t].push_back(runs[k].divergence[t]);
            report.live_first_differs[start][t].push_back(runs[k].first_differs[t]);
          } else {
            ConversationTurnCell& cell = report.cells[start][routers[k].name][t];
            cell.correct.push_back(runs[k].correct[t]);
            cell.answer_nll.push_back(runs[k].nll[t]);
            cell.read_ms.push_back(runs[k].read_ms[t]);
          }
        }
      }
      if (bar) bar->Update(done + 1, absl::StrCat("starting on ", report.model_names[start]));
    }
  }
  if (bar) bar->Finish();
  report.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  return report;
}

namespace {

// The finite values of v.
std::vector<double> Finite(const std::vector<double>& v) {
  std::vector<double> out;
  for (double x : v) {
    if (std::isfinite(x)) out.push_back(x);
  }
  return out;
}

// Per conversation, the mean of a per-turn quantity over turns [from, to).
std::vector<double> TurnMean(const std::vector<ConversationTurnCell>& turns,
                             std::vector<double> ConversationTurnCell::*field, size_t from,
                             size_t to) {
  std::vector<double> out((turns[from].*field).size(), 0.0);
  for (size_t t = from; t < to; ++t) {
    for (size_t c = 0; c < out.size(); ++c) out[c] += (turns[t].*field)[c] / double(to - from);
  }
  return out;
}

}  // namespace

std::string ConversationEvalTable(const ConversationEvalReport& r) {
  std::string out = absl::StrFormat(
      "Conversations about one key-value document, the turns alternating between %s and %s; "
      "mean ± standard error over the conversations. accuracy: greedy decoding would have "
      "written exactly the reference value and stopped; NLL: of the value and its stop token "
      "(nats/token); read: ms until the turn's reply was read (its TTFT plus the few reply "
      "tokens); gap: translate +repair's NLL minus reprefill's; live: the run with the models' "
      "own answers, its repair's divergence (nats/token) and share of switches whose first "
      "token differs.\n\n",
      r.model_names[0], r.model_names[1]);
  const std::vector<std::string>& names = r.strategies;
  for (const auto& cell : r.cells) {
    // Named references, not a structured binding: the lambda below captures
    // them (C++20 for a binding; clang 14 refuses it).
    const auto& start = cell.first;
    const auto& by_strategy = cell.second;
    const size_t turns = by_strategy.at(names[0]).size();
    const size_t n = by_strategy.at(names[0])[0].correct.size();
    absl::StrAppendFormat(&out, "### Starting on %s (%d conversations)\n\n",
                          r.model_names[start], n);
    std::string header = "| turn | model |", rule = "|---|---|";
    for (const char* what : {"accuracy", "NLL", "read ms"}) {
      for (const std::string& name : names) {
        absl::StrAppend(&header, " ", what, ": ", name, " |");
        absl::StrAppend(&rule, "---|");
      }
    }
    absl::StrAppend(&header, " gap | live accuracy | live divergence | first token differs |\n");
    absl::StrAppend(&rule, "---|---|---|---|\n");
    absl::StrAppend(&out, header, rule);
    auto row = [&](const std::string& label, const std::string& model, size_t from, size_t to) {
      std::string line = absl::StrCat("| ", label, " | ", model, " |");
      for (auto field : {&ConversationTurnCell::correct, &ConversationTurnCell::answer_nll,
                         &ConversationTurnCell::read_ms}) {
        for (const std::string& name : names) {
          const std::vector<double> v = TurnMean(by_strategy.at(name), field, from, to);
          const bool ms = field == &ConversationTurnCell::read_ms;
          absl::StrAppend(&line, ms ? absl::StrFormat(" %.0f |", Mean(v))
                                    : absl::StrFormat(" %.3f ± %.3f |", Mean(v), StandardError(v)));
        }
      }
      const std::vector<double> repaired =
          TurnMean(by_strategy.at(kTranslateRepair), &ConversationTurnCell::answer_nll, from, to);
      const std::vector<double> base =
          TurnMean(by_strategy.at(kReprefill), &ConversationTurnCell::answer_nll, from, to);
      absl::StrAppendFormat(&line, " %+.3f ± %.3f |", Mean(repaired) - Mean(base),
                            PairedDifferenceStandardError(repaired, base));
      const auto& live = r.live_correct.at(start);
      if (live[0].empty()) {
        absl::StrAppend(&line, " — | — | — |\n");
        return line;
      }
      std::vector<double> acc, div, differs;
      for (size_t t = from; t < to; ++t) {
        for (double x : live[t]) acc.push_back(x);
        for (double x : Finite(r.live_divergence.at(start)[t])) div.push_back(x);
        for (double x : Finite(r.live_first_differs.at(start)[t])) differs.push_back(x);
      }
      absl::StrAppendFormat(&line, " %.3f |", Mean(acc));
      absl::StrAppend(&line, div.empty() ? std::string(" — |")
                                         : absl::StrFormat(" %.4f ± %.4f (%d) |", Mean(div),
                                                           StandardError(div), div.size()));
      absl::StrAppend(&line, differs.empty() ? std::string(" — |\n")
                                             : absl::StrFormat(" %.3f |\n", Mean(differs)));
      return line;
    };
    for (size_t t = 0; t < turns; ++t) {
      absl::StrAppend(&out, row(absl::StrCat(t + 1), r.model_names[(start + t) % 2], t, t + 1));
    }
    if (turns > 2) {
      absl::StrAppend(&out, row(absl::StrCat("3–", turns), "both", 2, turns));
    }
    absl::StrAppend(&out, "\n");
  }
  // Per pair, every switch: the live divergence against the offline gap.
  if (!r.live_divergence.empty() && !r.live_divergence.begin()->second[0].empty()) {
    absl::StrAppend(&out,
                    "### Live divergence against the offline gap, per switch\n\n"
                    "Over the switches that translated (those within the native tail prefill "
                    "and report nothing); the offline gaps are the same switches' reference NLL "
                    "minus reprefill's.\n\n"
                    "| pair | switches | live divergence | first token differs | offline gap "
                    "(+repair) | offline gap (translate) | correlation live vs +repair gap |\n"
                    "|---|---|---|---|---|---|---|\n");
    for (int target = 0; target < 2; ++target) {
      std::vector<double> live, differs, gap, gap_translate;
      for (const auto& [start, by_strategy] : r.cells) {
        for (size_t t = 1; t < by_strategy.at(kReprefill).size(); ++t) {
          if (static_cast<int>((start + t) % 2) != target) continue;
          for (size_t c = 0; c < by_strategy.at(kReprefill)[t].answer_nll.size(); ++c) {
            // Only the switches that translated (a live report): within the
            // native tail a switch prefills and has nothing to compare.
            const double d = r.live_divergence.at(start)[t][c];
            if (!std::isfinite(d)) continue;
            const double base = by_strategy.at(kReprefill)[t].answer_nll[c];
            gap.push_back(by_strategy.at(kTranslateRepair)[t].answer_nll[c] - base);
            gap_translate.push_back(by_strategy.at(kTranslate)[t].answer_nll[c] - base);
            live.push_back(d);
            differs.push_back(r.live_first_differs.at(start)[t][c]);
          }
        }
      }
      absl::StrAppendFormat(
          &out, "| %s -> %s | %d | %.4f ± %.4f | %.3f | %+.4f ± %.4f | %+.4f ± %.4f | %.2f |\n",
          r.model_names[1 - target], r.model_names[target], live.size(), Mean(live),
          StandardError(live), Mean(differs), Mean(gap), StandardError(gap), Mean(gap_translate),
          StandardError(gap_translate), Pearson(live, gap));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppendFormat(&out, "%d documents redrawn for having fewer records than turns; %.0f s\n",
                        r.n_documents_redrawn, r.wall_s);
  return out;
}

nlohmann::json ConversationEvalJson(const ConversationEvalOptions& o,
                                    const ConversationEvalReport& r) {
  nlohmann::json starts = nlohmann::json::object();
  for (const auto& [start, by_strategy] : r.cells) {
    nlohmann::json s = nlohmann::json::object();
    for (const auto& [name, turns] : by_strategy) {
      nlohmann::json per_turn = nlohmann::json::array();
      for (const ConversationTurnCell& c : turns) {
        per_turn.push_back({{"accuracy", Mean(c.correct)},
                            {"accuracy_se", StandardError(c.correct)},
                            {"answer_nll", Mean(c.answer_nll)},
                            {"answer_nll_se", StandardError(c.answer_nll)},
                            {"read_ms", Mean(c.read_ms)},
                            {"correct", c.correct},
                            {"nll", c.answer_nll}});
      }
      s[name] = std::move(per_turn);
    }
    nlohmann::json live = nlohmann::json::array();
    for (size_t t = 0; t < r.live_correct.at(start).size(); ++t) {
      const std::vector<double> div = Finite(r.live_divergence.at(start)[t]);
      live.push_back({{"accuracy", Mean(r.live_correct.at(start)[t])},
                      {"divergence", div.empty() ? nlohmann::json() : nlohmann::json(Mean(div))},
                      {"n_divergence", div.size()},
                      {"first_token_differs",
                       Mean(Finite(r.live_first_differs.at(start)[t]))}});
    }
    s["live"] = std::move(live);
    starts[r.model_names[start]] = std::move(s);
  }
  return {{"first", o.first_dir},
          {"second", o.second_dir},
          {"forward_translator", o.forward_translator},
          {"reverse_translator", o.reverse_translator},
          {"conversations_per_start", o.conversations},
          {"turns", o.turns},
          {"seed", o.seed},
          {"kv_max_bytes", o.data.kv_max_bytes},
          {"native_tail", o.native_tail},
          {"max_new_tokens", o.max_new_tokens},
          {"translate_dtype", DTypeName(o.translate_dtype.value_or(FastestTranslateDtype()))},
          {"starting_on", starts},
          {"n_documents_redrawn", r.n_documents_redrawn},
          {"wall_s", r.wall_s}};
}

absl::Status PlotConversationEval(const ConversationEvalReport& r, const std::string& prefix) {
  for (const auto& [what, field, y_label] :
       std::vector<std::tuple<std::string, std::vector<double> ConversationTurnCell::*, std::string>>{
           {"accuracy", &ConversationTurnCell::correct, "greedy exact-match accuracy"},
           {"nll", &ConversationTurnCell::answer_nll, "reference answer NLL (nats/token)"}}) {
    PlotSpec spec;
    spec.title = absl::StrFormat("Lookups over a conversation alternating %s and %s",
                                 r.model_names[0], r.model_names[1]);
    spec.x_label = "turn (the second and later turns are switches)";
    spec.y_label = y_label;
    for (const auto& [start, by_strategy] : r.cells) {
      for (const std::string& name : r.strategies) {
        PlotSeries series;
        series.title = absl::StrCat(name, ", starting on ", r.model_names[start]);
        series.with_points = true;
        const std::vector<ConversationTurnCell>& turns = by_strategy.at(name);
        for (size_t t = 0; t < turns.size(); ++t) {
          series.points.emplace_back(static_cast<double>(t + 1), Mean(turns[t].*field));
        }
        spec.series.push_back(std::move(series));
      }
    }
    KVL_RETURN_IF_ERROR(PlotLines(spec, absl::StrCat(prefix, "-", what, ".png")));
  }
  return absl::OkStatus();
}

}  // namespace kvl::training
