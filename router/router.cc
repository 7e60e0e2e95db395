#include "router/router.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/chat_template.h"
#include "router/streams.h"
#include "spdlog/spdlog.h"
#include "translator/resample.h"

namespace kvl::router {
namespace {

using Clock = std::chrono::steady_clock;

// Generated tokens a turn's cache line has room for from the start; past them
// the line grows (geometrically) while decoding, after the first token. Not
// max_tokens itself: the server defaults it to its limit (4096 tokens), and
// idle sessions are charged for their lines' capacity.
constexpr int64_t kDecodeRoom = 256;

uint64_t RandomSeed() {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  return counter.fetch_add(0x9E3779B97F4A7C15ULL);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<int64_t> Encode(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int64_t> ids;
  for (int32_t id : tokenizer.Encode(text, /*parse_special=*/true)) ids.push_back(id);
  return ids;
}

}  // namespace

struct Router::Work {
  TurnLease* lease = nullptr;
  const TurnOptions* options = nullptr;
  Policy policy = Policy::kFixed;
  Strategy strategy = Strategy::kTranslate;
  // The committed streams + this turn's tokens so far: history (group 0),
  // ledger (covers history), bounds and the other groups' renderings.
  ConversationState state;
  // This turn's new tokens per group (the first turn's start with the system
  // preamble); the first `consumed` of group 0's are already in `history` (a
  // cascade level scored them; the cascade runs with one group only).
  std::vector<std::vector<int64_t>> fresh;
  size_t consumed = 0;
  int cascade_level = 0;
  HandoverPlan plan;
  TurnResult result;
  bool started = false;  // an engine loop admitted its first request (queue time measured)
  // A translated turn's generated reply, for the repair's fidelity score
  // (filled by Commit when the generation recorded log-probabilities).
  std::optional<FidelityProbe> probe;

  bool Cancelled() const { return options->cancelled && options->cancelled(); }
  // The turn's first engine work starts: its queue time ends.
  void MarkStarted() {
    if (started) return;
    started = true;
    result.queue_seconds = Seconds(options->received, Clock::now());
  }
};

absl::Status Router::QueueFull(int model, int64_t waiting) {
  observer_->OnRejected(Setting::kMaxWaitingTurns);
  return WithSetting(
      absl::ResourceExhaustedError(absl::StrCat(
          "model ", names_[model], " already has ",
          waiting >= 0
              ? absl::StrCat(waiting, " turns waiting (the limit is ",
                             config_.limits.max_waiting_turns, ")")
              : absl::StrCat("its limit of ", config_.limits.max_waiting_turns, " turns waiting"),
          "; retry later or on another replica")),
      Setting::kMaxWaitingTurns);
}

absl::StatusOr<std::unique_ptr<Router>> Router::Create(std::vector<LoadedModel> models,
                                                       std::vector<LoadedTranslator> translators,
                                                       std::unique_ptr<Tokenizer> tokenizer,
                                                       RouterConfig config, CacheStore* store,
                                                       TurnObserver* observer) {
  if (models.empty()) return absl::InvalidArgumentError("the router needs at least one model");
  if (tokenizer == nullptr) return absl::InvalidArgumentError("the router needs a tokenizer");
  if (store == nullptr || store->n_models() != static_cast<int>(models.size())) {
    return absl::InvalidArgumentError("the cache store must be sized for the models");
  }
  const int n = static_cast<int>(models.size());
  const auto in_range = [n](int m) { return m >= 0 && m < n; };
  bool policy_ok = in_range(config.policy.default_model);
  for (int m : config.policy.order) policy_ok = policy_ok && in_range(m);
  for (const Rule& rule : config.policy.rules) policy_ok = policy_ok && in_range(rule.model);
  if (!policy_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("the routing policy names a model index outside [0, ", n, ")"));
  }
  std::unique_ptr<Router> r(new Router());
  r->tokenizer_ = std::move(tokenizer);
  r->groups_.emplace_back();
  r->groups_.back().tokenizer = r->tokenizer_.get();
  const std::string first_name = models.empty() ? std::string() : models.front().name;
  if (!models.empty()) r->chat_template_ = models.front().chat_template;
  for (LoadedModel& m : models) {
    if (m.engine == nullptr) return absl::InvalidArgumentError(m.name + ": no engine");
    if (m.chat_template != r->chat_template_) {
      return absl::InvalidArgumentError(absl::StrCat(
          m.name, ": its chat template (", ChatTemplateKindName(m.chat_template), ") differs from ",
          first_name, "'s (", ChatTemplateKindName(r->chat_template_),
          "); the models of one router render a session with one template family"));
    }
    // The model's tokenizer group: the first with the same tokenizer, or a new one.
    int group = 0;
    if (m.tokenizer != nullptr) {
      group = -1;
      for (size_t g = 0; g < r->groups_.size(); ++g) {
        if (r->groups_[g].tokenizer->content_hash() == m.tokenizer->content_hash()) {
          group = static_cast<int>(g);
        }
      }
      if (group < 0) {
        group = static_cast<int>(r->groups_.size());
        r->groups_.emplace_back();
        r->groups_.back().tokenizer = m.tokenizer.get();
        r->tokenizers_.push_back(std::move(m.tokenizer));
      }
      m.tokenizer.reset();
    }
    Group& g = r->groups_[group];
    const Tokenizer& tok = *g.tokenizer;
    // Ids past a model's embedding are admitted only for special added
    // tokens (Gemma-3-1B's 262,144 rows and its tokenizer's image token at
    // 262,144), which a turn then refuses (FirstOutsideVocabulary).
    const int64_t vocab = m.engine->config().vocab_size;
    for (int64_t id = vocab; id < tok.vocab_size(); ++id) {
      if (!tok.IsSpecial(static_cast<int32_t>(id))) {
        return absl::InvalidArgumentError(absl::StrCat(
            m.name, ": vocab_size ", vocab, " is smaller than its tokenizer's ", tok.vocab_size(),
            " ids, and id ", id, " is not a special token"));
      }
    }
    g.min_vocab = g.min_vocab == 0 ? vocab : std::min(g.min_vocab, vocab);
    for (int64_t id : m.engine->generation_defaults().eos_token_ids) g.stop_ids.push_back(id);
    for (int64_t id : m.engine->config().eos_token_ids) g.stop_ids.push_back(id);
    auto slot = std::make_unique<Slot>();
    slot->bytes_per_token = m.engine->NewCache()->BytesPerToken();
    r->names_.push_back(m.name);
    r->group_of_.push_back(group);
    slot->loaded = std::move(m);
    r->models_.push_back(std::move(slot));
  }
  const absl::string_view stop_token = StopToken(r->chat_template_);
  for (Group& g : r->groups_) {
    g.sample_vocab = std::min<int64_t>(g.min_vocab, g.tokenizer->vocab_size());
    if (std::optional<int32_t> stop =
            g.tokenizer->AddedTokenId(std::string_view(stop_token.data(), stop_token.size()))) {
      g.turn_stop = *stop;
      g.stop_ids.push_back(*stop);
    }
    std::sort(g.stop_ids.begin(), g.stop_ids.end());
    g.stop_ids.erase(std::unique(g.stop_ids.begin(), g.stop_ids.end()), g.stop_ids.end());
  }
  r->by_pair_.assign(n, std::vector<const LoadedTranslator*>(n, nullptr));
  r->translators_ = std::move(translators);
  for (const LoadedTranslator& t : r->translators_) {
    if (t.source < 0 || t.source >= n || t.target < 0 || t.target >= n || t.source == t.target ||
        t.translator == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("translator ", t.name, ": bad models"));
    }
    r->by_pair_[t.source][t.target] = &t;
  }
  r->config_ = std::move(config);
  r->store_ = store;
  store->SetModelGroups(r->group_of_);
  r->observer_ = observer != nullptr ? observer : &r->null_observer_;
  r->gate_ = std::make_unique<QualityGate>(n, r->config_.gate);
  for (const LoadedTranslator& t : r->translators_) {
    if (t.refused.empty()) continue;
    const std::string reason = absl::StrCat("refused at load by the quality gate: ", t.refused);
    r->gate_->Refuse(t.source, t.target, reason);
    r->observer_->OnGate(t.source, t.target, false, reason);
  }
  // One engine loop per model, the only way a model runs. Without batching
  // it runs one request at a time (the unbatched engine's arithmetic).
  SchedulerOptions so;
  const BatchingConfig& batching = r->config_.batching;
  so.max_step_tokens = batching.max_step_tokens;
  so.max_running = batching.enabled ? batching.max_running : 1;
  so.max_waiting = r->config_.limits.max_waiting_turns;
  so.background_step_tokens = std::min<int64_t>(so.max_step_tokens, 64);
  Repairer::Context repair;
  repair.store = store;
  repair.model_names = r->names_;
  repair.model_groups = r->group_of_;
  repair.observer = r->observer_;
  for (int m = 0; m < n; ++m) {
    Router* router = r.get();
    BatchScheduler::Callbacks callbacks;
    callbacks.on_step = [router, m](const StepStats& s) {
      router->observer_->OnBatchStep(m, s.rows, s.decode_rows, s.tokens, s.seconds);
    };
    callbacks.on_queue = [router, m](int, int) { router->ReportQueue(m); };
    r->models_[m]->scheduler =
        std::make_unique<BatchScheduler>(*r->models_[m]->loaded.engine, so, callbacks);
    repair.schedulers.push_back(r->models_[m]->scheduler.get());
  }
  repair.on_fidelity = [router = r.get()](int source, int target, double nats, int64_t tokens,
                                          bool differs) {
    router->OnFidelity(source, target, nats, tokens, differs);
  };
  r->repair_ = std::make_unique<Repairer>(r->config_.switching.repair, std::move(repair));
  return r;
}

void Router::ReportQueue(int model) {
  const BatchScheduler& scheduler = *models_[model]->scheduler;
  observer_->OnModelQueue(model, scheduler.running(), scheduler.waiting());
}

absl::Status Router::RunPrefill(Work& work, int model, KvCache& line,
                                const std::vector<int64_t>& ids) {
  BatchScheduler::Hooks hooks;
  hooks.on_admitted = [&work] { work.MarkStarted(); };
  hooks.cancelled = [&work] { return work.Cancelled(); };
  absl::Status s = models_[model]
                       ->scheduler->Prefill(line, ids, /*all_logits=*/false,
                                            Priority::kInteractive, hooks)
                       .status();
  return BatchScheduler::IsQueueFull(s) ? QueueFull(model, -1) : s;
}

absl::StatusOr<Engine::ContinuationScore> Router::RunScore(Work& work, int model, KvCache& line,
                                                           const std::vector<int64_t>& ids) {
  BatchScheduler& scheduler = *models_[model]->scheduler;
  BatchScheduler::Hooks hooks;
  hooks.on_admitted = [&work] { work.MarkStarted(); };
  hooks.cancelled = [&work] { return work.Cancelled(); };
  absl::StatusOr<Engine::ContinuationScore> score = Engine::ScoreContinuation(
      line, ids, [&](KvCache& on, const std::vector<int64_t>& run, bool all_logits) {
        return scheduler.Prefill(on, run, all_logits, Priority::kInteractive, hooks);
      });
  if (!score.ok() && BatchScheduler::IsQueueFull(score.status())) return QueueFull(model, -1);
  return score;
}

absl::Status Router::Admit(int model) {
  const BatchScheduler& scheduler = *models_[model]->scheduler;
  if (const int64_t limit = config_.limits.max_waiting_turns;
      limit > 0 && scheduler.waiting() >= limit) {
    return QueueFull(model, scheduler.waiting());
  }
  return absl::OkStatus();
}

bool Router::GateOpen(int source, int target, std::string* why) const {
  bool reopened = false;
  const bool open = gate_->Open(source, target, why, &reopened);
  if (reopened) {
    spdlog::info("quality gate: translator {} -> {} is used again after its cool-down, on "
                 "probation", names_[source], names_[target]);
    observer_->OnGate(source, target, true, "cool-down over");
  }
  return open;
}

void Router::OnFidelity(int source, int target, double nats_per_token, int64_t tokens,
                        bool first_token_differs) {
  observer_->OnSwitchFidelity(source, target, nats_per_token, tokens, first_token_differs);
  if (std::optional<std::string> closed = gate_->Feed(source, target, nats_per_token)) {
    spdlog::warn("quality gate: translator {} -> {} {}; its switches re-prefill", names_[source],
                 names_[target], *closed);
    observer_->OnGate(source, target, false, *closed);
  }
}

Router::~Router() { repair_.reset(); }

int Router::ModelIndex(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return static_cast<int>(i);
  }
  return -1;
}

const Translator* Router::FindTranslator(int source, int target) const {
  const LoadedTranslator* t = by_pair_[source][target];
  return t == nullptr ? nullptr : t->translator.get();
}

absl::Status Router::FirstOutsideVocabulary(const std::vector<int64_t>& ids,
                                            absl::string_view what, int group) const {
  const Group& g = groups_[group];
  for (int64_t id : ids) {
    if (id >= g.min_vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " holds the special token ",
          g.tokenizer->IdToToken(static_cast<int32_t>(id)).value_or("?"), " (id ", id,
          "), which is outside the models' vocabularies of ", g.min_vocab, " ids"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> Router::RenderPreamble(const std::string& system_prompt) const {
  const std::string text = SessionPreamble(system_prompt, chat_template_);
  return text.empty() ? std::vector<int64_t>{} : Encode(*tokenizer_, text);
}

absl::Status Router::Handover(Work& work, int model, int64_t upto, int64_t extra_tokens,
                              int64_t line_tokens, int64_t* run_from) {
  const Strategy strategy = work.strategy;
  TurnLease& lease = *work.lease;
  Engine& engine = *models_[model]->loaded.engine;
  const ConversationState& committed = lease.state();

  // The plan is in the model's own tokens (its group's stream and ledger).
  const int group = group_of_[model];
  const std::vector<int64_t>& stream = StreamIds(work.state, group);
  const std::vector<LedgerSpan> ledger = LedgerInRendering(work.state, group);
  PlannerInput in;
  in.target = model;
  in.strategy = strategy;
  in.n_history = upto;
  in.ledger = &ledger;
  in.line_spans.resize(models_.size());
  for (int m = 0; m < n_models(); ++m) {
    const KvCache* line = lease.line(m);
    if (line == nullptr) continue;
    if (group_of_[m] == group) {
      in.line_spans[m] = line->Spans();
    } else if (line->Length() > 0) {
      // A writer on another tokenizer: its line's spans are in its own
      // tokens. The plan takes it as holding the history; the translate step
      // aligns the two streams and prefills what its line does not hold
      // natively (Handover's cross-tokenizer step).
      in.line_spans[m] = {KvSpan{0, upto}};
    }
  }
  // Within a turn, the answering model of the last turn keeps its unrun tail
  // (in its own tokens: the planner reads it only when it is the target).
  in.last_model = committed.last_model;
  in.tail_begin = committed.tail_begin;
  in.tail_end = static_cast<int64_t>(StreamIds(committed, group).size());
  in.has_translator = [this](int s, int t) {
    return by_pair_[s][t] != nullptr && GateOpen(s, t, nullptr);
  };
  in.why_no_translator = [this](int s, int t) {
    std::string why;
    if (by_pair_[s][t] != nullptr) GateOpen(s, t, &why);
    return why;
  };
  in.native_tail_tokens = config_.switching.native_tail_tokens;
  in.model_names = names_;
  HandoverPlan plan = PlanHandover(in);

  KvCache* line = lease.line(model);
  const int64_t held_bytes = (line != nullptr && !plan.fresh_line) ? line->Bytes() : 0;
  const int64_t need = (upto + extra_tokens) * models_[model]->bytes_per_token - held_bytes;
  KVL_RETURN_IF_ERROR(lease.Reserve(need));
  if (line == nullptr || plan.fresh_line) {
    lease.ReplaceLine(model, engine.NewCache());
    line = lease.line(model);
  }
  TORCH_CHECK(line->Length() == plan.keep, "line of ", names_[model], " holds ", line->Length(),
              " tokens, plan keeps ", plan.keep);
  // Room up front for what the turn runs before its first token and a
  // little decoding. A line grows by copying what it holds, and a fresh line
  // that a switch translated into would otherwise grow at the very next
  // prefill (the native tail or the turn): at ~3.8k tokens, 23 MB of
  // kvl-large's keys and values copied inside the first token
  // (docs/server-bench.md).
  KVL_RETURN_IF_ERROR(line->Reserve(line_tokens));

  // A last prefill step left to the caller (see router.h). Under the reprefill
  // strategies a hand-over prefill stays here, so that switch_seconds keeps
  // reporting what re-prefilling cost.
  size_t n_steps = plan.steps.size();
  int64_t stop = upto;
  if (run_from != nullptr && n_steps > 0) {
    const PlanStep& last = plan.steps.back();
    if (last.end == upto &&
        (last.kind == PlanStep::kNativePrefill ||
         (last.kind == PlanStep::kPrefill && strategy == Strategy::kTranslate))) {
      --n_steps;
      stop = last.begin;
    }
  }
  if (run_from != nullptr) *run_from = stop;

  RoutingEvent& ev = work.result.routing;
  bool hybrid = false;
  for (size_t i = 0; i < n_steps; ++i) {
    const PlanStep& step = plan.steps[i];
    if (work.Cancelled()) return absl::CancelledError("the client cancelled the turn");
    const Clock::time_point t0 = Clock::now();
    if (step.kind == PlanStep::kTranslate) {
      // Across tokenizers only [begin, end) of the span aligns with the
      // writer's tokens; the target prefills the rest around it.
      int64_t begin = step.begin, end = step.end;
      KvTaps taps;
      if (group_of_[step.source] != group) {
        absl::StatusOr<CrossSpan> cross = AlignWriter(work, step, model);
        if (!cross.ok()) return cross.status();
        begin = cross->aligned.target_begin;
        end = cross->aligned.target_end;
        taps = std::move(cross->taps);
        const int64_t prefilled = (step.end - step.begin) - (end - begin);
        plan.tokens_translated -= prefilled;
        plan.tokens_reprefilled += prefilled;
        if (prefilled > 0) {
          plan.notes.push_back(absl::StrCat(
              "across tokenizers ", names_[step.source], "->", names_[model], ": [", step.begin,
              ", ", step.end, ") translated [", begin, ", ", end, "), the rest prefilled"));
        }
        if (begin > step.begin) {
          KVL_RETURN_IF_ERROR(RunPrefill(
              work, model, *line,
              std::vector<int64_t>(stream.begin() + step.begin, stream.begin() + begin)));
        }
      } else {
        SerialIntraOpScope serial;
        absl::StatusOr<KvTaps> own = lease.line(step.source)->Taps(step.begin, step.end);
        if (!own.ok()) return own.status();
        taps = *std::move(own);
      }
      if (end > begin) {
        KVL_RETURN_IF_ERROR(TranslateInto(work, step.source, model, *line, begin, end, taps,
                                          &hybrid));
      }
      const double dt = Seconds(t0, Clock::now());
      ev.translation_seconds += dt;
      work.result.switch_seconds += dt;
      observer_->OnTranslation(step.source, model, dt, end - begin);
      if (end < step.end) {
        const Clock::time_point t1 = Clock::now();
        KVL_RETURN_IF_ERROR(RunPrefill(
            work, model, *line, std::vector<int64_t>(stream.begin() + end, stream.begin() + step.end)));
        observer_->OnPrefillTokens(model, step.end - end);
        work.result.prefill_tokens += step.end - end;
        work.result.switch_seconds += Seconds(t1, Clock::now());
      }
      continue;
    }
    const std::vector<int64_t> ids(stream.begin() + step.begin, stream.begin() + step.end);
    KVL_RETURN_IF_ERROR(RunPrefill(work, model, *line, ids));
    observer_->OnPrefillTokens(model, step.end - step.begin);
    work.result.prefill_tokens += step.end - step.begin;
    (step.kind == PlanStep::kNativePrefill ? work.result.prefill_seconds
                                           : work.result.switch_seconds) +=
        Seconds(t0, Clock::now());
  }
  ev.spans_translated += plan.spans_translated;
  ev.tokens_translated += plan.tokens_translated;
  ev.tokens_reprefilled += plan.tokens_reprefilled;
  if (hybrid && plan.path == CachePath::kTranslated) plan.path = CachePath::kHybrid;
  TORCH_CHECK(line->Length() == stop);
  work.plan = std::move(plan);
  return absl::OkStatus();
}

absl::Status Router::TranslateInto(Work& work, int source, int model, KvCache& line,
                                   int64_t begin, int64_t end, KvTaps& taps, bool* hybrid) {
  SerialIntraOpScope serial;
  const Engine& engine = *models_[model]->loaded.engine;
  const std::vector<int64_t>& stream = StreamIds(work.state, group_of_[model]);
  const LoadedTranslator& entry = *by_pair_[source][model];
  const Translator& translator = *entry.translator;
  const bool overridden = work.options != nullptr && work.options->native_layers.has_value();
  const int64_t native_layers = overridden ? *work.options->native_layers : entry.native_layers;
  if (overridden) {
    if (absl::Status s = CheckNativeLayers(translator, native_layers); !s.ok()) {
      return WithSetting(
          absl::InvalidArgumentError(absl::StrCat("translator ", entry.name, ": ", s.message())),
          Setting::kNativeLayers);
    }
  }
  // Token-anchored maps read the span's ids and up to W-1 before it (the
  // target's own tokens).
  std::vector<int64_t> ids;
  if (const int64_t w = translator.spec().anchor_window; w > 0) {
    ids.assign(stream.begin() + std::max<int64_t>(0, begin - (w - 1)), stream.begin() + end);
  }
  // The translator lives on the target model's device (LoadRouter), so the
  // span crosses devices only when the two models are on different ones;
  // its products land where the target's line is.
  if (taps.keys.device() != translator.device()) {
    taps = KvTaps{taps.keys.to(translator.device()), taps.values.to(translator.device())};
  }
  // A sliding layer's entries that no query after the span reads are neither
  // computed nor stored (the line's span is thin).
  const std::vector<int64_t> unread = engine.config().UnreadTokens(begin, end);
  absl::StatusOr<KvTaps> moved = translator.Translate(taps, Translator::Output::kProduct, ids, unread);
  if (!moved.ok()) return moved.status();
  KVL_RETURN_IF_ERROR(line.Accept(moved->keys, moved->values, unread));
  if (native_layers > 0) {
    // The native-depth dial: the top layers computed by the target from the
    // predicted residual stream (k >= L: from its embeddings), on its engine
    // loop.
    const int64_t n_layer = translator.spec().target.n_layer;
    const int64_t first = std::max<int64_t>(0, n_layer - native_layers);
    at::Tensor hidden;
    absl::Status s;
    if (first > 0) {
      absl::StatusOr<at::Tensor> predicted = translator.PredictResidual(taps, first, ids);
      if (predicted.ok()) hidden = *std::move(predicted);
      s = predicted.status();
    }
    if (s.ok()) {
      const std::vector<int64_t> span(stream.begin() + begin, stream.begin() + end);
      BatchScheduler::Hooks hooks;
      hooks.on_admitted = [&work] { work.MarkStarted(); };
      hooks.cancelled = [&work] { return work.Cancelled(); };
      s = models_[model]->scheduler->RunPass(
          [&](Engine& e) { return e.ForwardLayers(line, begin, span, hidden, first); }, hooks);
    }
    if (!s.ok()) {
      (void)line.Rollback(begin);
      return s;
    }
    RoutingEvent& ev = work.result.routing;
    ev.native_layers = std::max(ev.native_layers, std::min(native_layers, n_layer));
    *hybrid = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<Router::CrossSpan> Router::AlignWriter(Work& work, const PlanStep& step,
                                                      int model) {
  const int sg = group_of_[step.source], tg = group_of_[model];
  const std::vector<int64_t>& s_ids = StreamIds(work.state, sg);
  const std::vector<int64_t>& s_bounds = StreamBounds(work.state, sg);
  const std::vector<int64_t>& t_ids = StreamIds(work.state, tg);
  const std::vector<int64_t>& t_bounds = StreamBounds(work.state, tg);
  KvCache& source = *work.lease->line(step.source);
  // The writer's line holds natively the run from the start of the segment
  // the step begins in (in the writer's tokens): the alignment stops there.
  CrossSpan out;
  if (t_bounds.empty()) return out;
  size_t k = static_cast<size_t>(
      std::upper_bound(t_bounds.begin(), t_bounds.end(), step.begin) - t_bounds.begin());
  k = k == 0 ? 0 : k - 1;
  const int64_t at = s_bounds[k];
  int64_t limit = at;
  for (const KvSpan& span : source.Spans()) {
    if (span.t0 <= at && at < span.t1) limit = span.native ? span.t1 : at;
  }
  SerialIntraOpScope serial;
  absl::StatusOr<AlignedSpan> aligned =
      AlignAcross(StreamView{groups_[sg].tokenizer, &s_ids, &s_bounds},
                  StreamView{groups_[tg].tokenizer, &t_ids, &t_bounds}, step.begin, step.end, limit);
  if (!aligned.ok()) return aligned.status();
  out.aligned = *std::move(aligned);
  if (out.aligned.target_end > out.aligned.target_begin) {
    absl::StatusOr<KvTaps> taps = source.Taps(out.aligned.source_begin, out.aligned.source_end);
    if (!taps.ok()) return taps.status();
    absl::StatusOr<KvTaps> resampled = ResampleTaps(*taps, out.aligned.runs);
    if (!resampled.ok()) return resampled.status();
    out.taps = *std::move(resampled);
  }
  return out;
}

absl::Status CheckNativeLayers(const Translator& translator, int64_t k) {
  const int64_t n_layer = translator.spec().target.n_layer;
  if (k < 0) return absl::InvalidArgumentError(absl::StrCat("native layers ", k, " < 0"));
  if (k == 0 || k >= n_layer || translator.ResidualFor(n_layer - k) != nullptr) {
    return absl::OkStatus();
  }
  std::string have;
  for (const ResidualMap& m : translator.residual_maps()) {
    absl::StrAppend(&have, have.empty() ? "" : ", ", n_layer - m.layer);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      k, " native layers need the residual map of target layer ", n_layer - k,
      ", which the translator file lacks (it serves k = 0, ", have.empty() ? "" : have + ", ",
      n_layer, " and more; kvl fit-residual adds maps)"));
}

absl::Status Router::ValidateTurn(const TurnOptions& options) const {
  if (options.native_layers && *options.native_layers < 0) {
    return WithSetting(absl::InvalidArgumentError(absl::StrCat(
                           "native layers must be >= 0, got ", *options.native_layers)),
                       Setting::kNativeLayers);
  }
  const Policy policy = options.policy.value_or(config_.policy.policy);
  if (options.explicit_model >= n_models()) {
    return WithSetting(absl::InvalidArgumentError(absl::StrCat("the turn names model index ",
                                                               options.explicit_model, "; ",
                                                               n_models(), " models are loaded")),
                       Setting::kTurnModel);
  }
  if (policy == Policy::kExplicit && options.explicit_model < 0) {
    return WithSetting(
        absl::InvalidArgumentError("the 'explicit' policy needs the turn to name a model"),
        Setting::kTurnModel);
  }
  if ((policy == Policy::kCascade || policy == Policy::kAlternate) &&
      config_.policy.order.size() < 2) {
    return WithSetting(absl::InvalidArgumentError(absl::StrCat(
                           "the '", PolicyName(policy),
                           "' policy needs an order of at least two models; the router has ",
                           config_.policy.order.size())),
                       Setting::kOrder);
  }
  if (policy == Policy::kCascade && groups_.size() > 1) {
    // A level scores the turn's tokens into its line and the next level
    // takes them over (router.h): one stream (v1).
    return WithSetting(absl::InvalidArgumentError(
                           "the 'cascade' policy needs models that share one tokenizer; this "
                           "router's read several"),
                       Setting::kOrder);
  }
  if (policy == Policy::kRules && config_.policy.rules.empty()) {
    return WithSetting(
        absl::InvalidArgumentError("the 'rules' policy needs rules; the router has none"),
        Setting::kRules);
  }
  return absl::OkStatus();
}

absl::StatusOr<TurnResult> Router::RunTurn(const std::string& session_id,
                                           const TurnOptions& options,
                                           const TurnCallbacks& callbacks) {
  KVL_RETURN_IF_ERROR(ValidateTurn(options));
  // Declared before the lease: the turn ends for the repair after its lease does.
  repair_->TurnStarted();
  absl::Cleanup ended = [this] { repair_->TurnEnded(); };
  absl::StatusOr<std::unique_ptr<TurnLease>> lease = repair_->BeginTurn(session_id);
  if (!lease.ok()) return lease.status();
  const ConversationState& committed = (*lease)->state();

  Work work;
  work.lease = lease->get();
  work.options = &options;
  work.policy = options.policy.value_or(config_.policy.policy);
  work.strategy = options.strategy.value_or(config_.switching.strategy);
  work.state.history = committed.history;
  work.state.ledger = committed.ledger;
  work.state.bounds = committed.bounds;
  work.state.renderings = committed.renderings;
  work.state.renderings.resize(groups_.size() - 1);  // a session's first turn here
  work.cascade_level = committed.cascade_level;
  const bool first_turn = work.state.history.empty();
  ChatTemplateOptions turn_options;
  turn_options.kind = chat_template_;
  const std::string turn_text = SessionUserTurn(options.user_message, first_turn, turn_options);
  // The preamble's text, for the other groups' renderings (group 0's tokens
  // came with the session).
  const std::string preamble_text =
      first_turn && !committed.preamble.empty()
          ? tokenizer_->Decode(std::vector<int32_t>(committed.preamble.begin(),
                                                    committed.preamble.end()))
          : std::string();
  work.fresh.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<int64_t>& fresh = work.fresh[g];
    if (first_turn) {
      fresh = g == 0 ? committed.preamble : Encode(*groups_[g].tokenizer, preamble_text);
    }
    const std::vector<int64_t> turn = Encode(*groups_[g].tokenizer, turn_text);
    KVL_RETURN_IF_ERROR(FirstOutsideVocabulary(turn, "the message", static_cast<int>(g)));
    fresh.insert(fresh.end(), turn.begin(), turn.end());
  }
  work.result.prompt_tokens =
      static_cast<int64_t>(work.state.history.size() + work.fresh[0].size());
  if (const int64_t limit = config_.limits.max_history_tokens; limit > 0) {
    // The longest of the groups' streams.
    for (size_t g = 0; g < groups_.size(); ++g) {
      const int64_t held = static_cast<int64_t>(StreamIds(work.state, static_cast<int>(g)).size());
      const int64_t adds = static_cast<int64_t>(work.fresh[g].size());
      if (held + adds > limit) {
        observer_->OnRejected(Setting::kMaxHistoryTokens);
        return WithSetting(absl::ResourceExhaustedError(absl::StrCat(
                               "the session holds ", held, " history tokens and this turn adds ",
                               adds, ": ", held + adds, " is past the history limit of ", limit,
                               "; start a new session")),
                           Setting::kMaxHistoryTokens);
      }
    }
  }

  // 1. Route.
  RoutingEvent& ev = work.result.routing;
  ev.policy = work.policy;
  ev.previous_model = committed.last_model;
  ev.strategy = work.strategy;
  const RouteChoice choice =
      ChooseModel(config_.policy, work.policy, options.user_message, committed.turns + 1,
                  options.explicit_model, committed.cascade_level, names_);
  int model = choice.model;
  ev.reason = choice.reason;

  // 2. Score: the cascade's levels read the turn and escalate while unsure.
  if (work.policy == Policy::kCascade) {
    absl::StatusOr<int> confident = Escalate(work);
    if (!confident.ok()) return confident.status();
    model = *confident;
  }

  // 3 and 4. Hand over and generate.
  absl::StatusOr<GenerateResult> generated = HandOverAndGenerate(work, model, callbacks);
  if (!generated.ok()) return generated.status();

  // 5. Commit.
  KVL_RETURN_IF_ERROR(Commit(work, model, *std::move(generated)));
  std::vector<int> to_repair;
  if (config_.switching.repair != RepairMode::kOff) {
    for (int m = 0; m < n_models(); ++m) {
      if ((*lease)->HasForeignSpans(m)) to_repair.push_back(m);
    }
  }
  lease->reset();  // the session is free again: a repair may take it
  if (!to_repair.empty()) repair_->Queue(session_id, to_repair, std::move(work.probe));
  work.result.total_seconds = Seconds(options.received, Clock::now());
  return std::move(work.result);
}

absl::StatusOr<int> Router::Escalate(Work& work) {
  const int last_level = static_cast<int>(config_.policy.order.size()) - 1;
  work.cascade_level = std::min(work.cascade_level, last_level);
  const int64_t upto = static_cast<int64_t>(work.lease->state().history.size());
  const std::vector<int64_t>& fresh = work.fresh[0];  // one group (ValidateTurn)
  while (work.cascade_level < last_level && fresh.size() >= 2) {
    const int m = config_.policy.order[work.cascade_level];
    KVL_RETURN_IF_ERROR(Admit(m));
    // Every level scores the turn natively, so it takes over the history
    // before the turn only; the turn's tokens stay attributed to the first
    // model that ran them. The line gets room for the turn and, should this
    // level answer, its first kDecodeRoom tokens: the answering hand-over then
    // finds it sized.
    const int64_t n_fresh = static_cast<int64_t>(fresh.size());
    const int64_t line_tokens =
        upto + n_fresh + std::min(work.options->max_tokens, kDecodeRoom);
    KVL_RETURN_IF_ERROR(Handover(work, m, upto, n_fresh, line_tokens));
    // All of the turn but its last token is scored into the line; the
    // answering model runs that token itself, to sample from.
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<Engine::ContinuationScore> score =
        RunScore(work, m, *work.lease->line(m), fresh);
    if (!score.ok()) return score.status();
    work.result.prefill_seconds += Seconds(t0, Clock::now());
    work.result.prefill_tokens += score->n_scored;
    observer_->OnPrefillTokens(m, score->n_scored);
    if (work.consumed == 0) {
      const int64_t begin = static_cast<int64_t>(work.state.history.size());
      work.state.bounds.push_back(begin);  // the ledger span below starts a segment
      work.state.history.insert(work.state.history.end(), fresh.begin(), fresh.end() - 1);
      AppendLedgerSpan(&work.state.ledger, begin, static_cast<int64_t>(work.state.history.size()), m);
      work.consumed = fresh.size() - 1;
      work.result.routing.reason.clear();
    } else {
      work.result.routing.reason += "; ";
    }
    const CascadeVerdict verdict =
        JudgeCascade(config_.policy, score->next_entropy, score->mean_logprob, score->n_scored,
                     names_[m], names_[config_.policy.order[work.cascade_level + 1]]);
    work.result.routing.reason += verdict.reason;
    if (verdict.confident) return m;
    ++work.cascade_level;
  }
  return config_.policy.order[work.cascade_level];
}

absl::StatusOr<GenerateResult> Router::HandOverAndGenerate(Work& work, int model,
                                                           const TurnCallbacks& callbacks) {
  const ConversationState& committed = work.lease->state();
  const TurnOptions& options = *work.options;
  RoutingEvent& ev = work.result.routing;
  ev.model = model;
  ev.switched = committed.last_model >= 0 && committed.last_model != model;
  Engine& engine = *models_[model]->loaded.engine;
  // Everything below is in the model's own tokens (its group's stream).
  const int group = group_of_[model];
  const Group& tokens = groups_[group];
  const std::vector<int64_t>& fresh = work.fresh[group];
  const std::vector<int64_t> prompt(fresh.begin() + (group == 0 ? work.consumed : 0), fresh.end());
  const std::vector<int64_t>& stream = StreamIds(work.state, group);
  const int64_t upto = static_cast<int64_t>(stream.size());
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  work.result.prompt_tokens = upto + n_prompt;
  const int64_t room = engine.config().max_position_embeddings - upto - n_prompt;
  if (room < 0) {
    return absl::OutOfRangeError(absl::StrCat(
        "the conversation (", upto + n_prompt, " tokens with this turn) exceeds ", names_[model],
        "'s context of ", engine.config().max_position_embeddings,
        " tokens; start a new session"));
  }
  // A given reply is read with its stop token; otherwise up to max_tokens are
  // sampled.
  std::vector<int64_t> reply;
  if (options.reply) {
    reply = Encode(*tokens.tokenizer, *options.reply);
    KVL_RETURN_IF_ERROR(FirstOutsideVocabulary(reply, "the given reply", group));
    if (tokens.stop_ids.empty()) {
      return absl::FailedPreconditionError("a given reply needs a stop token; the models have none");
    }
    if (static_cast<int64_t>(reply.size()) + 1 > room) {
      return absl::OutOfRangeError(absl::StrCat("the given reply does not fit ", names_[model],
                                                "'s context"));
    }
  }
  const int64_t max_tokens =
      options.reply ? static_cast<int64_t>(reply.size()) + 1 : std::min(options.max_tokens, room);

  KVL_RETURN_IF_ERROR(Admit(model));
  int64_t run_from = upto;
  KVL_RETURN_IF_ERROR(Handover(work, model, upto, n_prompt + max_tokens,
                               upto + n_prompt + std::min(max_tokens, kDecodeRoom), &run_from));
  // The history's last tokens the hand-over left to run with the prompt.
  std::vector<int64_t> to_run(stream.begin() + run_from, stream.begin() + upto);
  to_run.insert(to_run.end(), prompt.begin(), prompt.end());
  if (work.Cancelled()) return absl::CancelledError("the client cancelled the turn");
  // A session brought back from the durable store has no cache lines: its
  // first turn here rebuilds one by prefill, whatever the strategy.
  if (committed.restored && !work.state.history.empty()) work.plan.path = CachePath::kRestored;
  ev.path = work.plan.path;
  if (!work.plan.notes.empty()) {
    absl::StrAppend(&ev.reason, "; ", absl::StrJoin(work.plan.notes, "; "));
  }
  if (ev.switched) {
    absl::StrAppend(&ev.reason, "; hand-over ", names_[committed.last_model], " -> ",
                    names_[model], " by ", StrategyName(work.strategy), " (",
                    CachePathName(work.plan.path), ")");
  }
  if (callbacks.on_routing) callbacks.on_routing(ev);
  if (options.reply) return ReadGivenReply(work, model, to_run, std::move(reply));

  StreamDecoder decoder(*tokens.tokenizer);
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling = options.sampling;
  g.seed = options.seed ? *options.seed : RandomSeed();
  g.stop_token_ids = tokens.stop_ids;
  g.vocab_limit = tokens.sample_vocab;
  g.stop_strings = options.stop;
  g.token_text = [&](int64_t id) { return decoder.Push(static_cast<int32_t>(id)); };
  const Clock::time_point t_prefill = Clock::now();
  Clock::time_point t_last = t_prefill, t_first = t_prefill;
  int64_t n_emitted = 0;
  const CachePath path = work.plan.path;
  // A translated turn keeps what the translated line gave its tokens, for the
  // repair to compare with the native line (OnSwitchFidelity).
  g.record_logprobs = config_.switching.repair != RepairMode::kOff &&
                      (path == CachePath::kTranslated || path == CachePath::kHybrid) &&
                      committed.last_model >= 0 &&
                      committed.last_model != model;
  g.on_token = [&](int64_t id, std::string_view text) {
    const Clock::time_point now = Clock::now();
    if (id >= 0) {
      if (n_emitted == 0) {
        work.result.time_to_first_token_seconds = Seconds(options.received, now);
        work.result.prefill_seconds += Seconds(t_prefill, now);
        t_first = now;
        observer_->OnTimeToFirstToken(model, path, work.result.time_to_first_token_seconds);
      } else {
        observer_->OnInterTokenLatency(model, Seconds(t_last, now));
      }
      ++n_emitted;
      t_last = now;
    }
    if (callbacks.on_token) callbacks.on_token(id, text);
    return !work.Cancelled();
  };
  g.on_admitted = [&work] { work.MarkStarted(); };
  g.cancelled = [&work] { return work.Cancelled(); };
  absl::StatusOr<GenerateResult> gen =
      models_[model]->scheduler->Generate(*work.lease->line(model), to_run, g);
  if (!gen.ok()) {
    if (BatchScheduler::IsQueueFull(gen.status())) return QueueFull(model, -1);
    return gen.status();
  }
  const Clock::time_point t_end = Clock::now();
  if (gen->finish_reason == FinishReason::kCancelled || work.Cancelled()) {
    return absl::CancelledError("the client cancelled the turn");
  }
  if (n_emitted == 0) {
    work.result.time_to_first_token_seconds = Seconds(options.received, t_end);
    work.result.prefill_seconds += Seconds(t_prefill, t_end);
    observer_->OnTimeToFirstToken(model, path, work.result.time_to_first_token_seconds);
  } else {
    work.result.decode_seconds = Seconds(t_first, t_end);
  }
  work.result.prefill_tokens += static_cast<int64_t>(to_run.size());
  observer_->OnPrefillTokens(model, static_cast<int64_t>(to_run.size()));
  observer_->OnGeneratedTokens(model, static_cast<int64_t>(gen->tokens.size()));
  if (ev.switched) observer_->OnSwitch(committed.last_model, model, work.strategy);
  return gen;
}

absl::StatusOr<GenerateResult> Router::ReadGivenReply(Work& work, int model,
                                                      const std::vector<int64_t>& to_run,
                                                      std::vector<int64_t> reply) {
  // The stop token the router would have stopped on: the chat template's
  // end of turn when the tokenizer has it, else the models' first
  // end-of-sequence id.
  const Group& tokens = groups_[group_of_[model]];
  const int64_t stop = tokens.turn_stop ? *tokens.turn_stop : tokens.stop_ids.front();
  std::vector<int64_t> ids = to_run;
  ids.insert(ids.end(), reply.begin(), reply.end());
  ids.push_back(stop);
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<Engine::ContinuationScore> score =
      RunScore(work, model, *work.lease->line(model), ids);
  if (!score.ok()) return score.status();
  if (work.Cancelled()) return absl::CancelledError("the client cancelled the turn");
  const Clock::time_point t_end = Clock::now();
  work.result.prefill_seconds += Seconds(t0, t_end);
  work.result.time_to_first_token_seconds = Seconds(work.options->received, t_end);
  // logprobs[i] is of ids[i + 1]: the reply starts at ids[to_run.size()].
  work.result.reply_logprobs.assign(score->logprobs.begin() + (to_run.size() - 1),
                                    score->logprobs.end());
  work.result.reply_greedy.assign(score->greedy.begin() + (to_run.size() - 1),
                                  score->greedy.end());
  work.result.prefill_tokens += static_cast<int64_t>(ids.size()) - 1;
  observer_->OnPrefillTokens(model, static_cast<int64_t>(ids.size()) - 1);
  GenerateResult gen;
  gen.text = *work.options->reply;
  gen.tokens = std::move(reply);
  gen.finish_reason = FinishReason::kStopToken;
  gen.stop_token_id = stop;
  return gen;
}

absl::Status Router::Commit(Work& work, int model, GenerateResult gen) {
  const ConversationState& committed = work.lease->state();
  const int answering = group_of_[model];
  // The reply as text: what every other group renders.
  std::string generated_text = gen.text;
  const bool stopped = gen.finish_reason == FinishReason::kStopToken;
  if (stopped) {
    const std::optional<std::string> token =
        groups_[answering].tokenizer->IdToToken(static_cast<int32_t>(gen.stop_token_id));
    if (token) generated_text += *token;
  }
  const std::string close_text = CloseAssistantTurn(generated_text, chat_template_);
  // Each group's stream takes three segments: the prompt, the reply with its
  // stop token (the answering group: the generated tokens themselves), the
  // closing template. Group 0's turn starts at `begin`: the ledger's span.
  int64_t begin = 0, begin_answering = 0;
  size_t prompt_answering = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Tokenizer& tok = *groups_[g].tokenizer;
    std::vector<int64_t>& ids = g == 0 ? work.state.history : work.state.renderings[g - 1].ids;
    std::vector<int64_t>& bounds =
        g == 0 ? work.state.bounds : work.state.renderings[g - 1].bounds;
    const std::vector<int64_t>& fresh = work.fresh[g];
    const std::vector<int64_t> prompt(fresh.begin() + (g == 0 ? work.consumed : 0), fresh.end());
    const int64_t at = static_cast<int64_t>(ids.size());
    if (g == 0) begin = at;
    if (static_cast<int>(g) == answering) {
      begin_answering = at;
      prompt_answering = prompt.size();
    }
    bounds.push_back(at);
    ids.insert(ids.end(), prompt.begin(), prompt.end());
    bounds.push_back(static_cast<int64_t>(ids.size()));
    if (static_cast<int>(g) == answering) {
      ids.insert(ids.end(), gen.tokens.begin(), gen.tokens.end());
      if (stopped) ids.push_back(gen.stop_token_id);
    } else {
      const std::vector<int64_t> reply = Encode(tok, generated_text);
      ids.insert(ids.end(), reply.begin(), reply.end());
    }
    bounds.push_back(static_cast<int64_t>(ids.size()));
    const std::vector<int64_t> close = Encode(tok, close_text);
    ids.insert(ids.end(), close.begin(), close.end());
  }
  AppendLedgerSpan(&work.state.ledger, begin, static_cast<int64_t>(work.state.history.size()),
                   model);
  if (!gen.logprobs.empty()) {
    // In the answering model's tokens, as its repair reads them.
    FidelityProbe probe;
    probe.source = committed.last_model;
    probe.target = model;
    probe.begin = begin_answering + static_cast<int64_t>(prompt_answering);
    probe.tokens = gen.tokens;
    if (stopped) probe.tokens.push_back(gen.stop_token_id);
    probe.translated = gen.logprobs;
    probe.first_greedy = gen.first_greedy;
    if (probe.tokens.size() == probe.translated.size()) work.probe = std::move(probe);
  }

  ConversationState next = std::move(work.state);
  next.preamble = committed.preamble;
  next.turns = committed.turns + 1;
  next.last_model = model;
  next.tail_begin = work.lease->line(model)->Length();
  next.cascade_level =
      work.policy == Policy::kCascade ? work.cascade_level : committed.cascade_level;
  work.result.history_tokens = static_cast<int64_t>(StreamIds(next, answering).size());
  work.result.finish_reason = gen.finish_reason;
  work.result.generated_tokens = static_cast<int64_t>(gen.tokens.size());
  work.result.tokens = std::move(gen.tokens);
  work.result.text = std::move(gen.text);
  if (work.options->on_commit) {
    KVL_RETURN_IF_ERROR(work.options->on_commit(committed, next, work.result));
  }
  work.lease->Commit(std::move(next));
  return absl::OkStatus();
}

}  // namespace kvl::router
