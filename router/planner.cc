#include "router/planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvl::router {
namespace {

int64_t Covered(const std::vector<KvSpan>& spans) { return spans.empty() ? 0 : spans.back().t1; }

// The end of the native run of `spans` that starts at or before `t0` and
// contains it; t0 when t0 is not held natively.
int64_t NativeRunEnd(const std::vector<KvSpan>& spans, int64_t t0) {
  for (const KvSpan& s : spans) {
    if (s.t0 <= t0 && t0 < s.t1) return s.native ? s.t1 : t0;
  }
  return t0;
}

void AddStep(HandoverPlan* plan, PlanStep::Kind kind, int64_t begin, int64_t end, int source) {
  if (end <= begin) return;
  // Adjacent prefills of one kind merge: they run as one Prefill call.
  if (kind != PlanStep::kTranslate && !plan->steps.empty() && plan->steps.back().kind == kind &&
      plan->steps.back().end == begin) {
    plan->steps.back().end = end;
    return;
  }
  plan->steps.push_back({kind, begin, end, source});
}

}  // namespace

HandoverPlan PlanHandover(const PlannerInput& in) {
  HandoverPlan plan;
  const int64_t n = in.n_history;
  const auto& own = in.line_spans[in.target];
  const bool switched = in.last_model >= 0 && in.last_model != in.target;
  plan.keep = std::min(Covered(own), n);
  if (in.strategy == Strategy::kReprefill && switched && plan.keep > 0) {
    plan.fresh_line = true;
    plan.keep = 0;
  }
  const bool native_tail = in.last_model == in.target && plan.keep >= in.tail_begin;

  for (const LedgerSpan& span : *in.ledger) {
    int64_t b = std::max(span.begin, plan.keep);
    const int64_t e = std::min(span.end, n);
    if (native_tail && b < in.tail_end) {
      const int64_t tail_stop = std::min(e, in.tail_end);
      AddStep(&plan, PlanStep::kNativePrefill, b, tail_stop, -1);
      b = std::max(b, tail_stop);
    }
    if (e <= b) continue;
    const int w = span.model;
    int64_t translated_end = b;
    if (in.strategy == Strategy::kTranslate && w >= 0 && w != in.target) {
      if (!in.has_translator || !in.has_translator(w, in.target)) {
        const std::string why = in.why_no_translator ? in.why_no_translator(w, in.target) : "";
        plan.notes.push_back(absl::StrCat(
            why.empty() ? "no translator " : "translator ", in.model_names[w], "->",
            in.model_names[in.target], why.empty() ? "" : " ", why, ": prefilled [", b, ", ", e,
            ")"));
      } else {
        const int64_t held_end = std::min(e, NativeRunEnd(in.line_spans[w], b));
        const bool unrun_tail = w == in.last_model && b >= in.tail_begin;
        if (held_end == b && !unrun_tail) {
          plan.notes.push_back(absl::StrCat(in.model_names[w], "'s line no longer holds [", b,
                                            ", ", e, ") (evicted or rolled back): prefilled"));
        } else if (held_end < e && held_end < Covered(in.line_spans[w])) {
          plan.notes.push_back(absl::StrCat(in.model_names[w], " holds [", b, ", ", held_end,
                                            ") natively only: rest prefilled"));
        }
        // The last native_tail tokens of the history are the target's own.
        translated_end = std::min(held_end, std::max(b, n - in.native_tail_tokens));
      }
    }
    if (translated_end > b) {
      AddStep(&plan, PlanStep::kTranslate, b, translated_end, w);
      ++plan.spans_translated;
      plan.tokens_translated += translated_end - b;
    }
    if (e > translated_end) {
      AddStep(&plan, PlanStep::kPrefill, translated_end, e, -1);
      plan.tokens_reprefilled += e - translated_end;
    }
  }
  // A prefill on top of a kept start is a native tail, one from token 0 a
  // full re-prefill: their TTFTs differ by the length of the history.
  plan.path = plan.tokens_translated > 0    ? CachePath::kTranslated
              : plan.tokens_reprefilled > 0 ? (plan.keep > 0 ? CachePath::kNativeTail
                                                             : CachePath::kReprefill)
                                            : CachePath::kNative;
  return plan;
}

}  // namespace kvl::router
