// The router's configuration, one struct per concern, with one set of
// defaults: the ones a server gets when its configuration file is silent
// (server/config.h parses the file straight into a RouterConfig, and
// server/README.md documents the keys). A test or tool that wants other
// behaviour (the plain switch, no repair, one request at a time) says so.
//
// Router errors name router concepts; the setting an error is about travels
// with the status (SettingOf), for a caller to name it in its own terms (the
// server's ToGrpcStatus names its config key or request field).
//
// Thread-safe: plain values, immutable once the router is built.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "router/gate.h"
#include "router/policy.h"

namespace kvl::router {

// The incoming model's side of a switch (planner.h, repair.h).
struct SwitchConfig {
  // How a model that lacks part of the history gets it; a turn may override it.
  Strategy strategy = Strategy::kTranslate;
  // Strategy translate: the last native_tail_tokens tokens of the history at
  // a switch are prefilled by the target instead of translated (why 32:
  // docs/translators.md, "Deployment choices"). 0: the plain switch.
  int64_t native_tail_tokens = 32;
  // Background repair of translated lines (repair.h).
  RepairMode repair = RepairMode::kAfterTurn;
};

// The load-time quality gate (loader.h): a translator whose stamped
// evaluation recovers less than min_recovered of the prefix benefit, or has a
// gap above max_gap_nats, or carries no evaluation while either is set, is
// refused and its switches re-prefill. TranslatorSource's own minimum
// overrides these. Unset: no minimum.
struct LoadGateConfig {
  std::optional<double> min_recovered, max_gap_nats;
};

// Admission (0: no limit). A turn that would wait behind max_waiting_turns
// requests of its model's engine loop, or whose prompt would bring the
// session's history past max_history_tokens, fails with ResourceExhausted and
// changes nothing.
struct AdmissionLimits {
  int64_t max_waiting_turns = 64;
  int64_t max_history_tokens = 0;
};

// Each model's engine loop (model/scheduler.h). Enabled: its turns' decode
// steps are batched, up to max_running at once; disabled: the loop runs one
// request at a time (the unbatched arithmetic, for A/B runs and oracles).
struct BatchingConfig {
  bool enabled = true;
  int64_t max_step_tokens = 256;  // tokens one step runs, all requests together
  int64_t max_running = 64;
};

struct RouterConfig {
  PolicyConfig policy;       // which model answers a turn
  SwitchConfig switching;    // how the answering model gets the history
  GateConfig gate;           // the live quality gate (gate.h)
  LoadGateConfig load_gate;  // the load-time quality gate
  AdmissionLimits limits;
  BatchingConfig batching;
};

// The setting a router error is about.
enum class Setting {
  kTurnModel,         // TurnOptions::explicit_model
  kOrder,             // PolicyConfig::order
  kRules,             // PolicyConfig::rules
  kMaxWaitingTurns,   // AdmissionLimits::max_waiting_turns
  kMaxHistoryTokens,  // AdmissionLimits::max_history_tokens
  kNativeLayers,      // TurnOptions::native_layers
};

// `status` with `setting` attached (status unchanged when OK).
absl::Status WithSetting(absl::Status status, Setting setting);
// The setting attached to `status`, if any.
std::optional<Setting> SettingOf(const absl::Status& status);

}  // namespace kvl::router
