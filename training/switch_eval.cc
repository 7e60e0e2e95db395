#include "training/switch_eval.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache_store/cache_store.h"
#include "datagen/chat_data.h"
#include "router/loader.h"
#include "router/router.h"
#include "training/eval_lm.h"
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

absl::StatusOr<ConditionRouter> MakeConditionRouter(const SwitchEvalOptions& o, std::string name,
                                                    int answer_model, router::Strategy strategy,
                                                    int64_t native_tail, bool repair = false) {
  ConditionRouter c;
  c.name = std::move(name);
  c.answer_model = answer_model;
  c.strategy = strategy;
  c.repair = repair;
  const std::vector<router::ModelSource> models = {
      {std::filesystem::path(o.source_dir).filename().string(), o.source_dir, DType::kFloat32},
      {std::filesystem::path(o.target_dir).filename().string(), o.target_dir, DType::kFloat32}};
  std::vector<router::TranslatorSource> translators;
  if (!o.translator_path.empty()) {
    translators.push_back({"source->target", 0, 1, o.translator_path, o.translate_dtype});
  }
  router::RoutingConfig routing;
  routing.policy = router::Policy::kExplicit;
  routing.strategy = strategy;
  routing.native_tail_tokens = native_tail;
  routing.repair = repair ? router::RepairMode::kAfterTurn : router::RepairMode::kOff;
  CacheStoreOptions store_options;
  store_options.n_models = 2;
  c.store = std::make_unique<CacheStore>(store_options);
  absl::StatusOr<std::unique_ptr<router::Router>> r = router::LoadRouter(
      models, translators, std::move(routing), o.n_threads, c.store.get(), nullptr);
  if (!r.ok()) return r.status();
  c.router = *std::move(r);
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

}  // namespace kvl::training
