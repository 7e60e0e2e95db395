#include "training/eval_lm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/files.h"
#include "model/checkpoint.h"
#include "model/engine.h"
#include "model/model_dir.h"
#include "model/reference.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "training/attention.h"
#include "training/progress.h"
#include "training/train_lm.h"

namespace kvl::training {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool IsInteger(std::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Integer equality of two decimal strings of any length ("007" == "7").
bool SameInteger(std::string_view a, std::string_view b) {
  auto canonical = [](std::string_view s) {
    bool negative = !s.empty() && s[0] == '-';
    if (negative) s.remove_prefix(1);
    while (s.size() > 1 && s[0] == '0') s.remove_prefix(1);
    if (s == "0") negative = false;
    return std::string(negative ? "-" : "") + std::string(s);
  };
  return canonical(a) == canonical(b);
}

absl::StatusOr<SuiteItem> ParseItem(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("not an object");
  for (const char* key : {"messages", "answer", "scoring"}) {
    if (!j.contains(key)) return absl::InvalidArgumentError(absl::StrCat("no \"", key, "\""));
  }
  SuiteItem item;
  item.id = j.value("id", std::string());
  item.task = j.value("task", std::string("unknown"));
  item.difficulty = j.value("difficulty", 0);
  if (!j["answer"].is_string() || !j["scoring"].is_string() || !j["messages"].is_array()) {
    return absl::InvalidArgumentError("answer and scoring must be strings, messages an array");
  }
  item.answer = j["answer"].get<std::string>();
  item.scoring = j["scoring"].get<std::string>();
  if (item.scoring != "exact" && item.scoring != "exact_ci" && item.scoring != "numeric") {
    return absl::InvalidArgumentError(absl::StrCat("unknown scoring \"", item.scoring, "\""));
  }
  for (const json& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content") ||
        !m["role"].is_string() || !m["content"].is_string()) {
      return absl::InvalidArgumentError("a message needs string role and content");
    }
    item.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  if (item.messages.empty()) return absl::InvalidArgumentError("no messages");
  return item;
}

TaskResult& FindTask(std::vector<TaskResult>& tasks, const std::string& task) {
  for (TaskResult& t : tasks) {
    if (t.task == task) return t;
  }
  tasks.push_back(TaskResult{task});
  return tasks.back();
}

void Finalize(TaskResult& t) {
  t.accuracy = t.n_items ? static_cast<double>(t.n_correct) / static_cast<double>(t.n_items) : 0;
}

json TaskJson(const TaskResult& t) {
  return json{{"task", t.task},
              {"items", t.n_items},
              {"correct", t.n_correct},
              {"accuracy", t.accuracy},
              {"over_context", t.n_over_context}};
}

}  // namespace

absl::StatusOr<std::vector<SuiteItem>> LoadSuite(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<SuiteItem> items;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": malformed JSON"));
    }
    absl::StatusOr<SuiteItem> item = ParseItem(j);
    if (!item.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": ", item.status().message()));
    }
    items.push_back(*std::move(item));
  }
  return items;
}

std::string SuitePrompt(const SuiteItem& item) {
  return datagen::RenderChatMl(item.messages) + "<|im_start|>assistant\n";
}

std::string NormalizeAnswer(std::string_view text, std::string_view scoring) {
  std::string a(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  if (!a.empty() && a.back() == '.') {
    a.pop_back();
    a = std::string(absl::StripTrailingAsciiWhitespace(a));
  }
  if (scoring == "exact_ci") absl::AsciiStrToLower(&a);
  return a;
}

bool AnswerMatches(std::string_view output, std::string_view answer, std::string_view scoring) {
  const std::string got = NormalizeAnswer(output, scoring);
  const std::string want = NormalizeAnswer(answer, scoring);
  if (scoring == "numeric") return IsInteger(got) && IsInteger(want) && SameInteger(got, want);
  return got == want;
}

absl::StatusOr<NllResult> MeanNll(const ModelConfig& config, const ModelWeights& weights,
                                  const std::vector<int32_t>& tokens, int64_t seq_len,
                                  int64_t batch, int64_t max_tokens) {
  if (tokens.size() < 2) return absl::InvalidArgumentError("perplexity needs at least two tokens");
  if (seq_len <= 0 || batch <= 0) {
    return absl::InvalidArgumentError("seq_len and batch must be positive");
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  int64_t budget = max_tokens > 0 ? std::min(max_tokens, n - 1) : n - 1;
  // (start, predicted tokens) per window.
  std::vector<std::pair<int64_t, int64_t>> windows;
  for (int64_t start = 0; budget > 0; start += seq_len) {
    const int64_t len = std::min({seq_len, n - 1 - start, budget});
    windows.emplace_back(start, len);
    budget -= len;
  }
  c10::InferenceMode guard;
  const at::Tensor all = at::from_blob(const_cast<int32_t*>(tokens.data()), {n},
                                       at::TensorOptions().dtype(at::kInt));
  NllResult result;
  double nll_sum = 0;
  for (size_t i = 0; i < windows.size();) {
    // Full-length windows go in batches; a short last window goes alone.
    size_t j = i;
    while (j < windows.size() && j - i < static_cast<size_t>(batch) &&
           windows[j].second == windows[i].second) {
      ++j;
    }
    const int64_t len = windows[i].second;
    std::vector<at::Tensor> rows;
    for (size_t w = i; w < j; ++w) rows.push_back(all.narrow(0, windows[w].first, len + 1));
    const at::Tensor ids = at::stack(rows).to(at::kLong);  // [B, T+1]
    ReferenceOptions forward;
    forward.attention = GroupedAttention();
    const at::Tensor logits =
        ReferenceForward(config, weights, ids.narrow(1, 0, len), forward).logits;  // [B, T, V]
    const at::Tensor nll = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                  ids.narrow(1, 1, len).reshape({-1}), {},
                                                  at::Reduction::Sum);
    nll_sum += nll.item<double>();
    result.n_tokens += len * static_cast<int64_t>(j - i);
    result.n_windows += static_cast<int64_t>(j - i);
    i = j;
  }
  result.nats_per_token = nll_sum / static_cast<double>(result.n_tokens);
  return result;
}

absl::StatusOr<EvalReport> RunEvaluation(const EvalOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  if (o.suites.empty() && o.text_path.empty()) {
    return absl::InvalidArgumentError("nothing to evaluate: give a suite or a text file");
  }
  if (o.max_new_tokens <= 0 || o.seq_len <= 0 || o.batch <= 0 || o.limit < 0 ||
      o.max_text_tokens < 0) {
    return absl::InvalidArgumentError(
        "max-new-tokens, seq-len and batch must be positive; limit and max-tokens non-negative");
  }
  // Read every input before the (slower) model work.
  std::vector<SuiteItem> items;
  for (const std::string& path : o.suites) {
    absl::StatusOr<std::vector<SuiteItem>> suite = LoadSuite(path);
    if (!suite.ok()) return suite.status();
    const size_t keep = o.limit > 0 ? std::min<size_t>(o.limit, suite->size()) : suite->size();
    items.insert(items.end(), suite->begin(), suite->begin() + keep);
  }
  std::string text;
  if (!o.text_path.empty()) {
    absl::StatusOr<std::string> t = ReadTextFile(o.text_path);
    if (!t.ok()) return t.status();
    text = *std::move(t);
  }

  RuntimeOptions runtime;
  runtime.dtype = DType::kFloat32;
  runtime.n_threads = o.n_threads;
  absl::StatusOr<ModelDir> model = LoadModelDir(o.model_dir, runtime);
  if (!model.ok()) return model.status();
  // After Engine::Create, which sets LibTorch's count but not OpenBLAS's.
  SetIntraOpThreads(o.n_threads);
  const ModelConfig& config = model->checkpoint.config;

  EvalReport report;
  report.model_dir = o.model_dir;
  report.overall.task = "all";

  std::vector<int64_t> stop_ids = model->checkpoint.generation.eos_token_ids;
  if (std::optional<int32_t> im_end = model->tokenizer->AddedTokenId("<|im_end|>")) {
    stop_ids.push_back(*im_end);
  }
  GenerateOptions gen;
  gen.max_tokens = o.max_new_tokens;
  gen.stop_token_ids = stop_ids;

  if (!items.empty()) {
    ProgressOptions popts;
    popts.label = "eval";
    popts.total = static_cast<int64_t>(items.size());
    popts.unit = "item";
    popts.out = o.progress ? stderr : nullptr;
    ProgressBar bar(popts);
    for (size_t i = 0; i < items.size(); ++i) {
      const SuiteItem& item = items[i];
      ItemResult r;
      r.id = item.id;
      r.task = item.task;
      r.answer = item.answer;
      const std::vector<int32_t> ids32 = model->tokenizer->Encode(SuitePrompt(item), true);
      if (static_cast<int64_t>(ids32.size()) + o.max_new_tokens > config.max_position_embeddings) {
        r.over_context = true;
      } else {
        std::unique_ptr<KvCache> cache = model->engine->NewCache();
        absl::StatusOr<GenerateResult> out =
            model->engine->Generate(*cache, std::vector<int64_t>(ids32.begin(), ids32.end()), gen);
        if (!out.ok()) {
          return absl::Status(out.status().code(),
                              absl::StrCat("item ", item.id, ": ", out.status().message()));
        }
        r.output = model->tokenizer->Decode(
            std::vector<int32_t>(out->tokens.begin(), out->tokens.end()), /*skip_special=*/false);
        r.correct = AnswerMatches(r.output, item.answer, item.scoring);
      }
      for (TaskResult* t : {&FindTask(report.tasks, item.task), &report.overall}) {
        ++t->n_items;
        t->n_correct += r.correct ? 1 : 0;
        t->n_over_context += r.over_context ? 1 : 0;
      }
      report.items.push_back(std::move(r));
      bar.Update(static_cast<int64_t>(i + 1),
                 absl::StrFormat("accuracy %.3f", static_cast<double>(report.overall.n_correct) /
                                                      static_cast<double>(i + 1)));
    }
    bar.Finish();
    for (TaskResult& t : report.tasks) Finalize(t);
    Finalize(report.overall);
  }

  if (!text.empty()) {
    const std::vector<int32_t> tokens = model->tokenizer->Encode(text, /*parse_special=*/true);
    const ModelWeights weights = model->checkpoint.weights.To(at::kFloat, "cpu");
    absl::StatusOr<NllResult> nll =
        MeanNll(config, weights, tokens, std::min(o.seq_len, config.max_position_embeddings),
                o.batch, o.max_text_tokens);
    if (!nll.ok()) return nll.status();
    report.has_nll = true;
    report.nll = *nll;
  }
  report.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return report;
}

json EvalReportToJson(const EvalReport& report, bool with_items) {
  json j = {{"model", report.model_dir}, {"wall_s", report.wall_s}};
  if (report.overall.n_items > 0) {
    json tasks = json::object();
    for (const TaskResult& t : report.tasks) tasks[t.task] = TaskJson(t);
    j["tasks"] = tasks;
    j["overall"] = TaskJson(report.overall);
  }
  if (report.has_nll) {
    j["perplexity"] = {{"nats_per_token", report.nll.nats_per_token},
                       {"perplexity", std::exp(report.nll.nats_per_token)},
                       {"tokens", report.nll.n_tokens},
                       {"windows", report.nll.n_windows}};
  }
  if (with_items) {
    json items = json::array();
    for (const ItemResult& r : report.items) {
      items.push_back({{"id", r.id},
                       {"task", r.task},
                       {"answer", r.answer},
                       {"output", r.output},
                       {"correct", r.correct},
                       {"over_context", r.over_context}});
    }
    j["items"] = items;
  }
  return j;
}

std::string EvalReportTable(const EvalReport& report) {
  std::string out;
  if (report.overall.n_items > 0) {
    absl::StrAppend(&out, absl::StrFormat("%-12s %7s %8s %9s %13s\n", "task", "items", "correct",
                                          "accuracy", "over_context"));
    std::vector<const TaskResult*> rows;
    for (const TaskResult& t : report.tasks) rows.push_back(&t);
    rows.push_back(&report.overall);
    for (const TaskResult* t : rows) {
      absl::StrAppend(&out, absl::StrFormat("%-12s %7d %8d %9.3f %13d\n", t->task, t->n_items,
                                            t->n_correct, t->accuracy, t->n_over_context));
    }
  }
  if (report.has_nll) {
    absl::StrAppend(&out, absl::StrFormat(
                              "held-out log-perplexity: %.4f nats/token (perplexity %.2f) over "
                              "%d tokens in %d windows\n",
                              report.nll.nats_per_token, std::exp(report.nll.nats_per_token),
                              report.nll.n_tokens, report.nll.n_windows));
  }
  return out;
}

}  // namespace kvl::training
