#include "server/chat_request.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/utf8.h"

namespace kvl::server {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::Status CheckUtf8(absl::string_view field, absl::string_view text) {
  size_t offset = 0;
  if (!IsValidUtf8(std::string_view(text.data(), text.size()), &offset)) {
    return Bad(field, absl::StrCat("not valid UTF-8 (first bad byte at offset ", offset, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSystemPrompt(absl::string_view prompt, const TurnLimits& limits,
                                  int64_t preamble_tokens, int64_t context_tokens) {
  if (static_cast<int64_t>(prompt.size()) > limits.max_system_prompt_bytes) {
    return Bad("system_prompt",
               absl::StrCat(prompt.size(), " bytes is over the server's limit of ",
                            limits.max_system_prompt_bytes, " (server.max_system_prompt_bytes)"));
  }
  KVL_RETURN_IF_ERROR(CheckUtf8("system_prompt", prompt));
  if (context_tokens > 0 && preamble_tokens >= context_tokens) {
    return Bad("system_prompt",
               absl::StrCat("renders to ", preamble_tokens,
                            " tokens, which leaves no room for a turn in the smallest model "
                            "context (", context_tokens, " tokens)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ImportTurn>> ParseImportTurns(
    const kvlingo::v1::ImportSessionRequest& request, const TurnLimits& limits,
    const std::vector<std::string>& model_names, int default_model) {
  std::vector<ImportTurn> turns;
  int64_t total = 0;
  for (int i = 0; i < request.turns_size(); ++i) {
    const kvlingo::v1::ImportedTurn& t = request.turns(i);
    const std::string at = absl::StrCat("turns[", i, "]");
    total += static_cast<int64_t>(t.user_message().size() + t.reply().size());
    if (total > limits.max_import_bytes) {
      return Bad(at, absl::StrCat("the messages and replies up to here take ", total,
                                  " bytes, over the server's limit of ", limits.max_import_bytes,
                                  " (server.max_import_bytes)"));
    }
    for (const auto& [field, text] : {std::pair<const char*, const std::string&>{
                                          "user_message", t.user_message()},
                                      {"reply", t.reply()}}) {
      const std::string name = absl::StrCat(at, ".", field);
      if (std::string(field) == "user_message" && text.empty()) return Bad(name, "must not be empty");
      if (static_cast<int64_t>(text.size()) > limits.max_turn_bytes) {
        return Bad(name, absl::StrCat(text.size(), " bytes is over the server's limit of ",
                                      limits.max_turn_bytes, " (server.max_turn_bytes)"));
      }
      KVL_RETURN_IF_ERROR(CheckUtf8(name, text));
    }
    ImportTurn turn;
    turn.user_message = t.user_message();
    turn.reply = t.reply();
    if (t.model().empty()) {
      turn.model = default_model;
    } else {
      auto it = std::find(model_names.begin(), model_names.end(), t.model());
      if (it == model_names.end()) {
        return absl::NotFoundError(
            absl::StrCat(at, ".model: no loaded model is named '", t.model(), "'"));
      }
      turn.model = static_cast<int>(it - model_names.begin());
    }
    turns.push_back(std::move(turn));
  }
  return turns;
}

absl::StatusOr<TurnRequest> ParseChatRequest(const kvlingo::v1::ChatRequest& request,
                                             const TurnLimits& limits,
                                             const std::vector<std::string>& model_names) {
  TurnRequest turn;
  if (request.session_id().empty()) return Bad("session_id", "required");
  if (!IsValidSessionId(request.session_id())) {
    return Bad("session_id", "expected 1-128 characters of [A-Za-z0-9._:-]");
  }
  turn.session_id = request.session_id();
  if (!request.request_id().empty() && !IsValidSessionId(request.request_id())) {
    return Bad("request_id", "expected 1-128 characters of [A-Za-z0-9._:-] (or empty)");
  }
  turn.request_id = request.request_id();

  const std::string& message = request.user_message();
  if (message.empty()) return Bad("user_message", "must not be empty");
  if (static_cast<int64_t>(message.size()) > limits.max_turn_bytes) {
    return Bad("user_message", absl::StrCat(message.size(), " bytes is over the server's limit of ",
                                            limits.max_turn_bytes, " (server.max_turn_bytes)"));
  }
  KVL_RETURN_IF_ERROR(CheckUtf8("user_message", message));
  router::TurnOptions& out = turn.options;
  out.user_message = message;

  const kvlingo::v1::SamplingParams& sp = request.sampling();
  if (sp.max_tokens() > limits.max_new_tokens_limit) {
    return Bad("sampling.max_tokens",
               absl::StrCat(sp.max_tokens(), " is over the server's limit of ",
                            limits.max_new_tokens_limit));
  }
  out.max_tokens = sp.max_tokens() == 0 ? limits.max_new_tokens_limit : sp.max_tokens();
  // Written as !(in range) so that NaN is rejected too.
  if (!(sp.temperature() >= 0 && sp.temperature() <= 2)) {
    return Bad("sampling.temperature",
               absl::StrCat("expected a value in [0, 2], got ", sp.temperature()));
  }
  out.sampling.temperature = sp.temperature();
  out.sampling.top_k = sp.top_k();
  if (!(sp.top_p() >= 0 && sp.top_p() <= 1)) {
    return Bad("sampling.top_p",
               absl::StrCat("expected a value in (0, 1] or 0 for unset, got ", sp.top_p()));
  }
  out.sampling.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  if (sp.has_seed()) out.seed = sp.seed();
  if (static_cast<size_t>(sp.stop_size()) > kMaxStopStrings) {
    return Bad("sampling.stop",
               absl::StrCat("at most ", kMaxStopStrings, " strings, got ", sp.stop_size()));
  }
  for (int i = 0; i < sp.stop_size(); ++i) {
    const std::string field = absl::StrCat("sampling.stop[", i, "]");
    if (sp.stop(i).empty()) return Bad(field, "must not be empty");
    KVL_RETURN_IF_ERROR(CheckUtf8(field, sp.stop(i)));
    out.stop.push_back(sp.stop(i));
  }

  const kvlingo::v1::RoutingHints& hints = request.routing();
  if (!hints.policy().empty()) {
    absl::StatusOr<router::Policy> policy = router::ParsePolicy(hints.policy());
    if (!policy.ok()) return Bad("routing.policy", policy.status().message());
    out.policy = *policy;
  }
  // Without loaded models there is nothing to resolve: the server answers
  // UNIMPLEMENTED for the turn itself.
  if (!hints.model().empty() && !model_names.empty()) {
    if (!IsValidUtf8(hints.model())) return Bad("routing.model", "not valid UTF-8");
    const auto it = std::find(model_names.begin(), model_names.end(), hints.model());
    if (it == model_names.end()) {
      return absl::NotFoundError(absl::StrCat(
          "routing.model: no model named '", hints.model(), "' is loaded (loaded: ",
          model_names.empty() ? "none" : absl::StrJoin(model_names, ", "), ")"));
    }
    out.explicit_model = static_cast<int>(it - model_names.begin());
  }
  if (hints.has_native_layers()) out.native_layers = hints.native_layers();
  switch (hints.strategy()) {
    case kvlingo::v1::SWITCH_STRATEGY_UNSPECIFIED:
      break;
    case kvlingo::v1::SWITCH_STRATEGY_TRANSLATE:
      out.strategy = router::Strategy::kTranslate;
      break;
    case kvlingo::v1::SWITCH_STRATEGY_REPREFILL:
      out.strategy = router::Strategy::kReprefill;
      break;
    case kvlingo::v1::SWITCH_STRATEGY_REPREFILL_MISSING:
      out.strategy = router::Strategy::kReprefillMissing;
      break;
    default:
      return Bad("routing.strategy",
                 absl::StrCat("unknown value ", static_cast<int>(hints.strategy())));
  }
  return turn;
}

}  // namespace kvl::server
