#include "training/translator_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <memory>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/reference.h"
#include "nlohmann/json.hpp"
#include "training/eval_lm.h"
#include "training/progress.h"
#include "training/train_lm.h"
#include "training/translator_data.h"
#include "translator/translator.h"

namespace kvl::training {
namespace {

using nlohmann::json;

struct LoadedTranslator {
  std::string file;
  std::unique_ptr<Translator> translator;
};

double Mean(const std::vector<double>& sums, int64_t first, int64_t last, int64_t n_windows) {
  double s = 0;
  for (int64_t i = first; i < last; ++i) s += sums[static_cast<size_t>(i)];
  return s / static_cast<double>((last - first) * n_windows);
}

void AddTo(std::vector<double>& sums, const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) sums[i] += v[i];
}

double MeanOfRange(const std::vector<double>& v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += v[static_cast<size_t>(i)];
  return s / static_cast<double>(n);
}

// Pre-norm keys and values of a span, [L, H, T, D]; undefined: empty.
struct Kv {
  at::Tensor keys, values;
  int64_t Length() const { return keys.defined() ? keys.size(2) : 0; }
};

Kv Cat(const Kv& a, const Kv& b) {
  if (!a.keys.defined()) return b;
  if (!b.keys.defined()) return a;
  return {at::cat({a.keys, b.keys}, 2), at::cat({a.values, b.values}, 2)};
}

std::vector<int64_t> Slice(const std::vector<int64_t>& v, int64_t a, int64_t b) {
  return std::vector<int64_t>(v.begin() + a, v.begin() + b);
}

// Translates kv, the cache of tokens [begin, begin + kv.Length()) of ids; a
// token-anchored translator also reads those ids and up to W-1 before them.
absl::StatusOr<Kv> TranslateKv(const Translator& translator, const Kv& kv,
                               const std::vector<int64_t>& ids, int64_t begin) {
  std::vector<int64_t> span_ids;
  if (const int64_t w = translator.spec().anchor_window; w > 0) {
    span_ids = Slice(ids, std::max<int64_t>(0, begin - (w - 1)), begin + kv.Length());
  }
  absl::StatusOr<KvTaps> t =
      translator.Translate({kv.keys, kv.values}, Translator::Output::kFloat32, span_ids);
  if (!t.ok()) return t.status();
  return Kv{t->keys, t->values};
}

// model on ids (one sequence) attending to prefix; returns logits [T, V] and
// the captured pre-norm keys/values of ids.
std::pair<at::Tensor, Kv> RunWithPrefix(const TranslatorModel& m, const Kv& prefix,
                                        const std::vector<int64_t>& ids) {
  ReferenceOptions o;
  o.capture_kv = true;
  if (prefix.keys.defined()) {
    for (int64_t il = 0; il < prefix.keys.size(0); ++il) {
      o.prefix_keys.push_back(prefix.keys[il].unsqueeze(0));
      o.prefix_values.push_back(prefix.values[il].unsqueeze(0));
    }
  }
  ReferenceOutput out =
      ReferenceForward(m.config(), m.weights32, at::tensor(ids, at::kLong).unsqueeze(0), o);
  Kv kv{at::stack(out.keys_prenorm).squeeze(1), at::stack(out.values).squeeze(1)};
  return {out.logits[0], kv};
}

double MeanOf(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

std::vector<int64_t> StopIds(const TranslatorModel& m) {
  std::vector<int64_t> ids = m.checkpoint.generation.eos_token_ids;
  for (int64_t id : m.config().eos_token_ids) ids.push_back(id);
  if (std::optional<int32_t> im_end = m.tokenizer->AddedTokenId("<|im_end|>")) ids.push_back(*im_end);
  return ids;
}

}  // namespace

double PairedDifferenceStandardError(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  if (n < 2 || b.size() != n) return 0;
  double mean = 0;
  for (size_t i = 0; i < n; ++i) mean += a[i] - b[i];
  mean /= static_cast<double>(n);
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += (a[i] - b[i] - mean) * (a[i] - b[i] - mean);
  return std::sqrt(ss / static_cast<double>(n * (n - 1)));
}

double RatioOfMeansStandardError(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  if (n < 2 || b.size() != n) return 0;
  double mean_a = 0, mean_b = 0;
  for (size_t i = 0; i < n; ++i) {
    mean_a += a[i];
    mean_b += b[i];
  }
  mean_a /= static_cast<double>(n);
  mean_b /= static_cast<double>(n);
  const double ratio = mean_a / mean_b;
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += (a[i] - ratio * b[i]) * (a[i] - ratio * b[i]);
  return std::sqrt(ss / static_cast<double>(n * (n - 1))) / std::abs(mean_b);
}

absl::StatusOr<TranslatorEvalReport> RunTranslatorEval(const TranslatorEvalOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  if (o.prefix < 1 || o.continuation < 1 || o.max_windows < 0 || o.first_k < 1 ||
      o.suite_limit < 0 || o.max_new_tokens < 1 || o.n_switches < 1 || o.turn_len < 2 ||
      o.multi_turn_runs < 0) {
    return absl::InvalidArgumentError(
        "need prefix, continuation, first-k, max-new-tokens >= 1, switches >= 1, turn-len >= 2 "
        "and non-negative max-windows, limit, multi-turn-runs");
  }
  if (o.native_tail < 0 || o.native_tail >= o.prefix) {
    return absl::InvalidArgumentError("native-tail must be in [0, prefix)");
  }
  if (o.multi_turn_forward.empty() != o.multi_turn_reverse.empty()) {
    return absl::InvalidArgumentError("multi-turn needs a forward and a reverse translator");
  }
  RuntimeOptions runtime;
  runtime.n_threads = o.n_threads;
  absl::StatusOr<TranslatorPair> pair =
      LoadTranslatorPair(o.source_dir, o.target_dir, runtime, Tokenizers::kMayDiffer);
  if (!pair.ok()) return pair.status();
  // Across tokenizers (issue 54) the windows and prompts are the target's
  // tokens; the source reads their text in its own (TranslatedCacheAcross).
  const bool cross = !pair->SameTokenizer();
  if (cross && !o.multi_turn_forward.empty()) {
    return absl::InvalidArgumentError(
        "the multi-turn run needs models with one tokenizer (these two differ)");
  }
  if (!cross && o.prefill_uneven_groups) {
    return absl::InvalidArgumentError(
        "uneven groups are prefilled only across tokenizers (these two models share one)");
  }
  const UnevenGroups uneven =
      o.prefill_uneven_groups ? UnevenGroups::kPrefill : UnevenGroups::kTranslate;
  TranslatorModel* source = &pair->source;
  TranslatorModel* target = &pair->target;
  SetIntraOpThreads(o.n_threads);
  const int64_t max_pos =
      std::min(source->config().max_position_embeddings, target->config().max_position_embeddings);

  std::vector<LoadedTranslator> translators;
  for (const std::string& file : o.translators) {
    absl::StatusOr<std::unique_ptr<Translator>> t =
        Translator::Load(file, ExpectationFor(*source, *target), o.translate_dtype);
    if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(file, ": ", t.status().message()));
    translators.push_back({file, *std::move(t)});
  }
  std::unique_ptr<Translator> forward, reverse;
  if (!o.multi_turn_forward.empty()) {
    absl::StatusOr<std::unique_ptr<Translator>> f =
        Translator::Load(o.multi_turn_forward, ExpectationFor(*source, *target), o.translate_dtype);
    if (!f.ok()) return f.status();
    absl::StatusOr<std::unique_ptr<Translator>> r =
        Translator::Load(o.multi_turn_reverse, ExpectationFor(*target, *source), o.translate_dtype);
    if (!r.ok()) return r.status();
    forward = *std::move(f);
    reverse = *std::move(r);
  }
  std::vector<SuiteItem> items;
  for (const std::string& path : o.suites) {
    absl::StatusOr<std::vector<SuiteItem>> suite = LoadSuite(path);
    if (!suite.ok()) return suite.status();
    const size_t keep =
        o.suite_limit > 0 ? std::min<size_t>(o.suite_limit, suite->size()) : suite->size();
    items.insert(items.end(), suite->begin(), suite->begin() + keep);
  }
  absl::StatusOr<std::vector<int32_t>> stream = ReadTokenStream(o.data_path, *target->tokenizer);
  if (!stream.ok()) return stream.status();
  const int64_t window = o.prefix + o.continuation + 1;
  if (window > max_pos) {
    return absl::InvalidArgumentError(absl::StrCat("prefix + continuation + 1 = ", window,
                                                   " exceeds max_position_embeddings ", max_pos));
  }
  const std::vector<std::vector<int64_t>> windows =
      ConsecutiveWindows(*stream, window, o.max_windows);
  if (windows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.data_path, ": fewer tokens than one window of ", window));
  }

  TranslatorEvalReport report;
  report.n_windows = static_cast<int64_t>(windows.size());
  report.prefix = o.prefix;
  report.continuation = o.continuation;
  report.first_k = std::min(o.first_k, o.continuation);
  Engine& se = *source->engine;
  Engine& te = *target->engine;

  // 1. Continuation log-perplexity.
  {
    const size_t n_cond = 3 + translators.size();  // native, no_prefix, source, translated...
    std::vector<std::vector<double>> sums(n_cond, std::vector<double>(o.continuation, 0.0));
    // Each window's mean NLL over the whole continuation and its first tokens.
    std::vector<std::vector<double>> per_window(n_cond), per_window_first(n_cond);
    auto add = [&](size_t c, const std::vector<double>& nll) {
      AddTo(sums[c], nll);
      per_window[c].push_back(MeanOfRange(nll, o.continuation));
      per_window_first[c].push_back(MeanOfRange(nll, report.first_k));
    };
    ProgressOptions popts;
    popts.label = "eval-translator ppl";
    popts.total = report.n_windows;
    popts.unit = "window";
    popts.out = o.progress ? stderr : nullptr;
    ProgressBar bar(popts);
    for (size_t w = 0; w < windows.size(); ++w) {
      const std::vector<int64_t>& ids = windows[w];
      const std::vector<int64_t> labels = Slice(ids, o.prefix + 1, window);
      const std::vector<int64_t> rest = Slice(ids, o.prefix, window - 1);
      // Translated: the last native_tail prefix tokens are the target's own.
      const int64_t cut = o.prefix - o.native_tail;
      for (size_t c = 0; c < 3; ++c) {
        if (c == 2 && cross) continue;  // the source's NLL is over other tokens
        Engine& e = c == 2 ? se : te;
        std::unique_ptr<KvCache> cache = e.NewCache();
        absl::StatusOr<at::Tensor> logits =
            c == 1 ? e.Prefill(*cache, rest, true) : e.Prefill(*cache, Slice(ids, 0, window - 1), true);
        if (!logits.ok()) return logits.status();
        const at::Tensor rows = c == 1 ? *logits : logits->narrow(0, o.prefix, o.continuation);
        add(c, TokenNll(rows, labels));
      }
      for (size_t i = 0; i < translators.size(); ++i) {
        // The target's own tokens start at `from`: the cut, or across
        // tokenizers the last group boundary before it.
        int64_t from = cut;
        std::unique_ptr<KvCache> cache;
        if (cross) {
          absl::StatusOr<CrossTranslated> x =
              TranslatedCacheAcross(*source, *target, *translators[i].translator,
                                    Slice(ids, 0, o.prefix), cut, uneven);
          if (!x.ok()) return x.status();
          from = x->n_translated;
          cache = std::move(x->cache);
          report.align_groups += x->n_groups;
          report.align_one_to_one += x->n_one_to_one;
        } else {
          absl::StatusOr<std::unique_ptr<KvCache>> c =
              TranslatedCache(se, te, *translators[i].translator, Slice(ids, 0, cut));
          if (!c.ok()) return c.status();
          cache = *std::move(c);
        }
        absl::StatusOr<at::Tensor> logits = te.Prefill(*cache, Slice(ids, from, window - 1), true);
        if (!logits.ok()) return logits.status();
        add(3 + i, TokenNll(logits->narrow(0, o.prefix - from, o.continuation), labels));
      }
      bar.Update(static_cast<int64_t>(w + 1));
    }
    bar.Finish();
    const char* names[] = {"target_native", "no_prefix", "source_native"};
    auto whole = [&](size_t c) { return Mean(sums[c], 0, o.continuation, report.n_windows); };
    auto first = [&](size_t c) { return Mean(sums[c], 0, report.first_k, report.n_windows); };
    for (size_t c = 0; c < 3; ++c) {
      if (c != 2 || !cross) report.conditions.push_back({names[c], whole(c), first(c)});
    }
    for (size_t i = 0; i < translators.size(); ++i) {
      TranslatedPpl t;
      t.file = translators[i].file;
      t.method = translators[i].translator->spec().training.method;
      t.log_ppl = whole(3 + i);
      t.log_ppl_first = first(3 + i);
      t.gap = t.log_ppl - whole(0);
      t.gap_first = t.log_ppl_first - first(0);
      t.recovered = (whole(1) - t.log_ppl) / (whole(1) - whole(0));
      t.recovered_first = (first(1) - t.log_ppl_first) / (first(1) - first(0));
      // Paired per window: gap = T - native; share = mean(none - T) / mean(none - native).
      for (const auto& [pw, gap_se, rec_se] :
           {std::tuple{&per_window, &t.gap_se, &t.recovered_se},
            std::tuple{&per_window_first, &t.gap_first_se, &t.recovered_first_se}}) {
        const std::vector<double>& native = (*pw)[0];
        const std::vector<double>& none = (*pw)[1];
        const std::vector<double>& translated = (*pw)[3 + i];
        std::vector<double> gained(native.size()), benefit(native.size());
        for (size_t w = 0; w < native.size(); ++w) {
          gained[w] = none[w] - translated[w];
          benefit[w] = none[w] - native[w];
        }
        *gap_se = PairedDifferenceStandardError(translated, native);
        *rec_se = RatioOfMeansStandardError(gained, benefit);
      }
      report.conditions.push_back({"translated:" + t.file, t.log_ppl, t.log_ppl_first});
      report.translated.push_back(t);
    }
  }

  // 2. Suite accuracy.
  if (!items.empty()) {
    report.accuracy_conditions = {"target_native", "source_native"};
    for (const LoadedTranslator& t : translators) {
      report.accuracy_conditions.push_back("translated:" + t.file);
    }
    GenerateOptions target_gen, source_gen;
    target_gen.max_tokens = source_gen.max_tokens = o.max_new_tokens;
    target_gen.stop_token_ids = StopIds(*target);
    source_gen.stop_token_ids = StopIds(*source);
    ProgressOptions popts;
    popts.label = "eval-translator suites";
    popts.total = static_cast<int64_t>(items.size());
    popts.unit = "item";
    popts.out = o.progress ? stderr : nullptr;
    ProgressBar bar(popts);
    for (size_t n = 0; n < items.size(); ++n) {
      const SuiteItem& item = items[n];
      const std::vector<int32_t> ids32 = target->tokenizer->Encode(SuitePrompt(item), true);
      const std::vector<int64_t> prompt(ids32.begin(), ids32.end());
      const int64_t n_prompt = static_cast<int64_t>(prompt.size());
      const bool over = n_prompt + o.max_new_tokens > max_pos || n_prompt < 2;
      // Translated: the source's share of the prompt (none when the native tail
      // covers all but the last token: then the target reads it all itself).
      const int64_t cut = std::max<int64_t>(0, n_prompt - 1 - o.native_tail);
      for (size_t c = 0; c < report.accuracy_conditions.size(); ++c) {
        bool correct = false;
        if (!over) {
          absl::StatusOr<GenerateResult> out;
          // The source reads and writes in its own tokens.
          const Tokenizer& reader = c == 1 ? *source->tokenizer : *target->tokenizer;
          if (c == 0) {
            std::unique_ptr<KvCache> cache = te.NewCache();
            out = te.Generate(*cache, prompt, target_gen);
          } else if (c == 1) {
            const std::vector<int32_t> s32 = reader.Encode(SuitePrompt(item), true);
            std::unique_ptr<KvCache> cache = se.NewCache();
            out = se.Generate(*cache, std::vector<int64_t>(s32.begin(), s32.end()), source_gen);
          } else if (cut == 0) {
            std::unique_ptr<KvCache> cache = te.NewCache();
            out = te.Generate(*cache, prompt, target_gen);
          } else if (cross) {
            absl::StatusOr<CrossTranslated> x =
                TranslatedCacheAcross(*source, *target, *translators[c - 2].translator,
                                      Slice(prompt, 0, cut), cut, uneven);
            if (!x.ok()) return x.status();
            out = te.Generate(*x->cache, Slice(prompt, x->n_translated, n_prompt), target_gen);
          } else {
            absl::StatusOr<std::unique_ptr<KvCache>> cache =
                TranslatedCache(se, te, *translators[c - 2].translator, Slice(prompt, 0, cut));
            if (!cache.ok()) return cache.status();
            out = te.Generate(**cache, Slice(prompt, cut, n_prompt), target_gen);
          }
          if (!out.ok()) return out.status();
          const std::string text =
              reader.Decode(std::vector<int32_t>(out->tokens.begin(), out->tokens.end()), false);
          correct = AnswerMatches(text, item.answer, item.scoring);
        }
        for (const std::string& task : {item.task, std::string("all")}) {
          AccuracyCell& cell = report.accuracy[report.accuracy_conditions[c]][task];
          ++cell.n_items;
          cell.n_correct += correct ? 1 : 0;
          cell.n_over_context += over ? 1 : 0;
        }
      }
      bar.Update(static_cast<int64_t>(n + 1));
    }
    bar.Finish();
  }

  // 3. Multi-turn.
  if (forward && o.multi_turn_runs > 0) {
    c10::InferenceMode guard;
    const int64_t n_turns = o.n_switches + 1, len = o.turn_len;
    if (n_turns * len > max_pos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multi-turn: ", n_turns, " turns of ", len, " tokens exceed max_position_embeddings ",
          max_pos));
    }
    const std::vector<std::vector<int64_t>> runs =
        ConsecutiveWindows(*stream, n_turns * len, o.multi_turn_runs);
    if (runs.empty()) {
      return absl::InvalidArgumentError("multi-turn: data shorter than one run");
    }
    report.multi_turn_runs = static_cast<int64_t>(runs.size());
    report.turn_len = len;
    const TranslatorModel* models[2] = {&*source, &*target};
    const Translator* into[2] = {reverse.get(), forward.get()};  // into[m]: other -> m
    std::vector<MultiTurnRow> rows(static_cast<size_t>(o.n_switches));
    ProgressOptions popts;
    popts.label = "eval-translator multi-turn";
    popts.total = report.multi_turn_runs;
    popts.unit = "run";
    popts.out = o.progress ? stderr : nullptr;
    ProgressBar bar(popts);
    for (size_t r = 0; r < runs.size(); ++r) {
      const std::vector<int64_t>& ids = runs[r];
      Kv cache_a[2], last_native[2], cache_b[2];
      int64_t last_native_begin[2] = {0, 0};  // the position of last_native's first token
      // Turn 0: the source writes [0, len - 1) natively.
      auto [logits0, kv0] = RunWithPrefix(*models[0], Kv{}, Slice(ids, 0, len - 1));
      (void)logits0;
      cache_a[0] = last_native[0] = cache_b[0] = kv0;
      for (int64_t k = 1; k <= o.n_switches; ++k) {
        const int m = static_cast<int>(k % 2), other = 1 - m;
        const int64_t b = k * len;  // the turn's first token
        const std::vector<int64_t> inputs = Slice(ids, b - 1, b + len - 1);
        const std::vector<int64_t> labels = Slice(ids, b, b + len);
        MultiTurnRow& row = rows[static_cast<size_t>(k - 1)];
        row.turn = k;
        row.model = m == 0 ? "source" : "target";
        // (a) translate only the span the other model wrote natively, but its
        // last `tail` tokens, which the model reads itself with the turn.
        const int64_t tail = std::min(o.native_tail, last_native[other].Length());
        const int64_t n_span = last_native[other].Length() - tail;
        if (n_span > 0) {
          absl::StatusOr<Kv> span =
              TranslateKv(*into[m], {last_native[other].keys.narrow(2, 0, n_span),
                                     last_native[other].values.narrow(2, 0, n_span)},
                          ids, last_native_begin[other]);
          if (!span.ok()) return span.status();
          cache_a[m] = Cat(cache_a[m], *span);
        }
        if (cache_a[m].Length() != b - 1 - tail) {
          return absl::InternalError("multi-turn: span bookkeeping is inconsistent");
        }
        auto [logits_a, kv_a] =
            RunWithPrefix(*models[m], cache_a[m], Slice(ids, b - 1 - tail, b + len - 1));
        row.span_wise += MeanOf(TokenNll(logits_a.narrow(0, tail, len), labels));
        cache_a[m] = Cat(cache_a[m], kv_a);
        // What the other model lacks: [b - 1, b + len - 1).
        last_native[m] = {kv_a.keys.narrow(2, tail, len), kv_a.values.narrow(2, tail, len)};
        last_native_begin[m] = b - 1;
        // (b) translate the other model's whole line.
        absl::StatusOr<Kv> whole = TranslateKv(*into[m], cache_b[other], ids, 0);
        if (!whole.ok()) return whole.status();
        auto [logits_b, kv_b] = RunWithPrefix(*models[m], *whole, inputs);
        row.whole_prefix += MeanOf(TokenNll(logits_b, labels));
        cache_b[m] = Cat(*whole, kv_b);
        // (c) the model's native cache of everything before.
        auto [logits_c, kv_c] = RunWithPrefix(*models[m], Kv{}, Slice(ids, 0, b + len - 1));
        (void)kv_c;
        row.reprefill += MeanOf(TokenNll(logits_c.narrow(0, b - 1, len), labels));
      }
      bar.Update(static_cast<int64_t>(r + 1));
    }
    bar.Finish();
    for (MultiTurnRow& row : rows) {
      const double n = static_cast<double>(runs.size());
      row.span_wise /= n;
      row.whole_prefix /= n;
      row.reprefill /= n;
    }
    report.multi_turn = rows;
  }
  report.translate_dtype = o.translate_dtype;
  report.native_tail = o.native_tail;
  report.prefill_uneven_groups = o.prefill_uneven_groups;
  report.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return report;
}

json TranslatorEvalJson(const TranslatorEvalOptions& o, const TranslatorEvalReport& r) {
  json j = {{"source", o.source_dir},    {"target", o.target_dir},     {"data", o.data_path},
            {"prefix", r.prefix},        {"continuation", r.continuation},
            {"first_k", r.first_k},      {"windows", r.n_windows},     {"wall_s", r.wall_s},
            {"translate_dtype", DTypeName(o.translate_dtype)},
            {"native_tail", o.native_tail}};
  if (r.align_groups > 0) {
    j["prefill_uneven_groups"] = r.prefill_uneven_groups;
    j["alignment"] = {{"groups", r.align_groups},
                      {"one_to_one", r.align_one_to_one},
                      {"one_to_one_share", static_cast<double>(r.align_one_to_one) /
                                               static_cast<double>(r.align_groups)}};
  }
  json ppl = json::object();
  for (const PplCondition& c : r.conditions) {
    ppl[c.name] = {{"log_ppl", c.log_ppl}, {"log_ppl_first", c.log_ppl_first}};
  }
  j["log_ppl"] = ppl;
  json tr = json::array();
  for (const TranslatedPpl& t : r.translated) {
    tr.push_back({{"file", t.file},
                  {"method", t.method},
                  {"log_ppl", t.log_ppl},
                  {"log_ppl_first", t.log_ppl_first},
                  {"gap", t.gap},
                  {"gap_first", t.gap_first},
                  {"recovered", t.recovered},
                  {"recovered_first", t.recovered_first},
                  {"gap_se", t.gap_se},
                  {"gap_first_se", t.gap_first_se},
                  {"recovered_se", t.recovered_se},
                  {"recovered_first_se", t.recovered_first_se}});
  }
  j["translators"] = tr;
  if (!r.accuracy.empty()) {
    json acc = json::object();
    for (const std::string& c : r.accuracy_conditions) {
      json tasks = json::object();
      for (const auto& [task, cell] : r.accuracy.at(c)) {
        tasks[task] = {{"items", cell.n_items},
                       {"correct", cell.n_correct},
                       {"over_context", cell.n_over_context},
                       {"accuracy", cell.Accuracy()}};
      }
      acc[c] = tasks;
    }
    j["accuracy"] = acc;
  }
  if (!r.multi_turn.empty()) {
    json rows = json::array();
    for (const MultiTurnRow& row : r.multi_turn) {
      rows.push_back({{"turn", row.turn},
                      {"model", row.model},
                      {"span_wise", row.span_wise},
                      {"whole_prefix", row.whole_prefix},
                      {"reprefill", row.reprefill}});
    }
    j["multi_turn"] = {{"forward", o.multi_turn_forward},
                       {"reverse", o.multi_turn_reverse},
                       {"runs", r.multi_turn_runs},
                       {"turn_len", r.turn_len},
                       {"turns", rows}};
  }
  return j;
}

std::string TranslatorEvalTable(const TranslatorEvalReport& r) {
  std::string out = absl::StrFormat(
      "continuation log-perplexity (nats/token), %d windows, prefix %d, continuation %d, "
      "translated in %s, native tail %d\n"
      "%-44s %9s %9s %9s %9s %9s %9s\n",
      r.n_windows, r.prefix, r.continuation, DTypeName(r.translate_dtype), r.native_tail,
      "condition", "all",
      absl::StrCat("first", r.first_k), "gap", absl::StrCat("gap", r.first_k), "recov",
      absl::StrCat("recov", r.first_k));
  if (r.align_groups > 0) {
    absl::StrAppend(&out, absl::StrFormat(
                              "across tokenizers: the translated spans' %d minimal matching groups, "
                              "%.1f%% one token to one token%s (source_native is not "
                              "comparable: other tokens)\n",
                              r.align_groups,
                              100.0 * static_cast<double>(r.align_one_to_one) /
                                  static_cast<double>(r.align_groups),
                              r.prefill_uneven_groups ? ", the others prefilled by the target"
                                                      : ""));
  }
  for (const PplCondition& c : r.conditions) {
    if (c.name.rfind("translated:", 0) == 0) continue;
    absl::StrAppend(&out, absl::StrFormat("%-44s %9.4f %9.4f\n", c.name, c.log_ppl, c.log_ppl_first));
  }
  for (const TranslatedPpl& t : r.translated) {
    std::string name = absl::StrCat("translated (", t.method, ") ", t.file);
    if (name.size() > 44) name = "..." + name.substr(name.size() - 41);
    absl::StrAppend(&out, absl::StrFormat("%-44s %9.4f %9.4f %9.4f %9.4f %8.1f%% %8.1f%%\n", name,
                                          t.log_ppl, t.log_ppl_first, t.gap, t.gap_first,
                                          100 * t.recovered, 100 * t.recovered_first));
    absl::StrAppend(&out, absl::StrFormat("%-44s %9s %9s %9.4f %9.4f %8.1f%% %8.1f%%\n",
                                          "  +- standard error over the windows", "", "",
                                          t.gap_se, t.gap_first_se, 100 * t.recovered_se,
                                          100 * t.recovered_first_se));
  }
  if (!r.accuracy.empty()) {
    absl::StrAppend(&out, "\naccuracy (greedy, kvl eval scoring)\n", absl::StrFormat("%-10s", "task"));
    for (size_t c = 0; c < r.accuracy_conditions.size(); ++c) {
      absl::StrAppend(&out, absl::StrFormat(" %14s", c < 2 ? r.accuracy_conditions[c]
                                                           : absl::StrCat("translated#", c - 1)));
    }
    absl::StrAppend(&out, "\n");
    for (const auto& [task, cell] : r.accuracy.at(r.accuracy_conditions[0])) {
      absl::StrAppend(&out, absl::StrFormat("%-10s", task));
      for (const std::string& c : r.accuracy_conditions) {
        const AccuracyCell& x = r.accuracy.at(c).at(task);
        absl::StrAppend(&out, absl::StrFormat(" %8.3f (%3d)", x.Accuracy(), x.n_items));
      }
      absl::StrAppend(&out, "\n");
    }
    for (size_t c = 2; c < r.accuracy_conditions.size(); ++c) {
      absl::StrAppend(&out, absl::StrFormat("translated#%d = %s\n", c - 1, r.accuracy_conditions[c]));
    }
  }
  if (!r.multi_turn.empty()) {
    absl::StrAppend(&out,
                    absl::StrFormat("\nmulti-turn: mean NLL of each turn's %d tokens over %d runs\n"
                                    "%-5s %-7s %12s %12s %12s\n",
                                    r.turn_len, r.multi_turn_runs, "turn", "model",
                                    "(a) spans", "(b) whole", "(c) prefill"));
    double a = 0, b = 0, c = 0;
    for (const MultiTurnRow& row : r.multi_turn) {
      absl::StrAppend(&out, absl::StrFormat("%-5d %-7s %12.4f %12.4f %12.4f\n", row.turn, row.model,
                                            row.span_wise, row.whole_prefix, row.reprefill));
      a += row.span_wise;
      b += row.whole_prefix;
      c += row.reprefill;
    }
    const double n = static_cast<double>(r.multi_turn.size());
    absl::StrAppend(&out, absl::StrFormat("%-13s %12.4f %12.4f %12.4f\n", "mean", a / n, b / n, c / n));
  }
  return out;
}

}  // namespace kvl::training
