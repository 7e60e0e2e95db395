// The switch planner: how a target model comes to hold the history it lacks.
//
// The target's line holds a prefix [0, c) of the history [0, n). The tokens
// [c, n) are split by the ledger into spans, each with its native writer, and
// each span becomes a step:
//   translate  the span from its writer's line through the (writer -> target)
//              translator (strategy "translate", when that translator is loaded
//              and the writer's line still holds the span natively; a writer's
//              line that holds only the start of the span gives that part, the
//              rest is prefilled);
//   prefill    the span with the target itself (every other case, and the
//              last `native_tail_tokens` of the history whoever wrote them:
//              the target reads the most recent tokens itself, on top of the
//              translation of the ones before, docs/translators.md).
// Steps are in token order, so each translated span is accepted by a line that
// holds exactly the tokens before it (what KvCache::Accept needs).
//
// Strategy "reprefill" starts the target from an empty line (when it switches
// in); "reprefill-missing" prefills all of [c, n).
//
// Tokens the target wrote itself at the end of the history and simply has not
// run yet (its last sampled token and the turn's closing template, see
// ConversationState::tail_begin) are not a hand-over: they go with the new
// turn's prompt, and the path stays native.
//
// Legend: T=tokens.
//
// Thread-safe: a pure function.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache_store/cache_store.h"
#include "model/kv_cache.h"
#include "router/policy.h"

namespace kvl::router {

struct PlanStep {
  // kNativePrefill: the target's own unrun tail (see above), not a hand-over.
  enum Kind { kTranslate, kPrefill, kNativePrefill };
  Kind kind = kPrefill;
  int64_t begin = 0, end = 0;
  int source = -1;  // translate: the writer whose line is tapped
};

struct HandoverPlan {
  bool fresh_line = false;  // drop the target's line and start empty
  int64_t keep = 0;         // tokens of the target's line kept
  std::vector<PlanStep> steps;  // cover [keep, n) in order
  int64_t spans_translated = 0, tokens_translated = 0, tokens_reprefilled = 0;
  std::vector<std::string> notes;  // fallbacks to prefill, in words
  CachePath path = CachePath::kNative;
};

struct PlannerInput {
  int target = 0;
  Strategy strategy = Strategy::kTranslate;
  int64_t n_history = 0;                      // n
  const std::vector<LedgerSpan>* ledger = nullptr;  // covers [0, n)
  // Per model: the spans its line holds (KvCache::Spans); empty when the model
  // has no line.
  std::vector<std::vector<KvSpan>> line_spans;
  int last_model = -1;
  // ConversationState::tail_begin and the committed history length: the
  // last model's unrun tail is [tail_begin, tail_end).
  int64_t tail_begin = 0, tail_end = 0;
  std::function<bool(int source, int target)> has_translator;
  // Why has_translator is false for a pair that has a translator file (e.g.
  // "closed by the quality gate ..."); null or empty: "no translator".
  std::function<std::string(int source, int target)> why_no_translator;
  // Tokens at the end of the history [0, n) prefilled rather than translated
  // (SwitchConfig::native_tail_tokens); 0: translate up to n. The last
  // model's unrun tail, prefilled in any case, counts toward them.
  int64_t native_tail_tokens = 0;
  std::vector<std::string> model_names;  // for notes
};

HandoverPlan PlanHandover(const PlannerInput& in);

}  // namespace kvl::router
