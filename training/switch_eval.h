// The recall evaluation (`kvl eval-switch`): does the incoming model still know
// what the conversation said after a switch? Generated conversations
// (datagen) whose turns state facts, a key-value document or numbers run
// natively on the source model, through the router exactly as a server runs
// them; then the conversation switches to the target model for the question.
// Per task and condition it reports the answer accuracy (greedy, scored as
// `kvl eval` scores) and the answer's mean negative log-likelihood (the
// reference answer and its stop token read as a given reply), with standard
// errors over the items. A final message that holds a document and its
// question ("doc\n\nquestion", half the kv items) is split: the source reads
// the document (with the reply datagen gives such turns), the target gets the
// question.
//
// Conditions, each on its own router (so the items see identical histories):
//   source      no switch: the source model answers (for context)
//   reprefill   the target re-reads the whole history natively (the ceiling)
//   translate   the target reads the history through the translator, with a
//               native tail of W tokens (the router's native_tail_tokens) for
//               each W asked for (0: the translator alone; the server's default
//               is 32)
//   translate +repair
//               (hand_over_turn and repair) the same, the switch a turn before
//               the question, whose line background repair has recomputed
//               natively by the time the question comes
//
// Thread safety: a free function; it drives its routers from the calling thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "datagen/chat_data.h"
#include "model/config.h"
#include "nlohmann/json.hpp"

namespace kvl::training {

// datagen's knobs as the house corpus was made with.
datagen::DataOptions HouseCorpusKnobs();

struct SwitchEvalOptions {
  std::string source_dir, target_dir, translator_path;
  // datagen task names: facts, kv, arith, lists, strings.
  std::vector<std::string> tasks = {"facts", "kv", "arith"};
  int64_t items_per_task = 50;
  // Items are datagen::GenerateItem(task, difficulty, hash(seed, task, i)):
  // a seed of its own, not the training corpus' splits.
  uint64_t seed = 32;
  int difficulty = 0;  // 1..3; 0: items cycle through 1, 2, 3
  // The generator's difficulty knobs at level 3: by default the house
  // corpus's (scripts/train_house_models.sh), so that items are what the
  // house models were trained on.
  datagen::DataOptions data = HouseCorpusKnobs();
  std::vector<int64_t> native_tails = {0, 32};
  // The switch one turn before the question: after the source's turns the
  // answering model takes a hand-over turn (kHandOverTurn, its reply given),
  // then reads the question without a switch. What a turn after a switch turn
  // sees.
  bool hand_over_turn = false;
  // With hand_over_turn: each translate condition also runs with background
  // repair ("translate W=.. +repair"), the question waiting for the repair
  // of the hand-over turn's line (routing.repair after-turn).
  bool repair = false;
  int64_t max_new_tokens = 24;
  int n_threads = 0;
  std::optional<DType> translate_dtype;  // unset: FastestTranslateDtype()
  bool progress = true;
};

struct SwitchEvalCell {
  int64_t n_items = 0, n_correct = 0;
  std::vector<double> correct;     // per item, 0 or 1
  std::vector<double> answer_nll;  // per item: mean NLL of the answer's tokens and stop token
  double Accuracy() const;
  double AccuracyStandardError() const;
  double MeanNll() const;
  double NllStandardError() const;
};

struct SwitchEvalReport {
  std::vector<std::string> conditions;  // column order: source, reprefill, translate W...
  // task -> condition -> cell; items over a model's context are skipped.
  std::map<std::string, std::map<std::string, SwitchEvalCell>> cells;
  std::map<std::string, int64_t> n_skipped;  // per task: items over a model's context
  std::string source_name, target_name;
  double wall_s = 0;
};

// Errors: the loaders' (models, translator: FailedPrecondition for one built
// for other models), InvalidArgument for bad options or an unknown task.
absl::StatusOr<SwitchEvalReport> RunSwitchEval(const SwitchEvalOptions& options);

// Markdown: per task, accuracy ± SE and answer NLL ± SE per condition, and
// each translate condition's recall as a fraction of reprefill's (± SE,
// paired over the items) and its NLL excess over reprefill (± SE, paired).
std::string SwitchEvalTable(const SwitchEvalReport& report);
nlohmann::json SwitchEvalJson(const SwitchEvalOptions& options, const SwitchEvalReport& report);

}  // namespace kvl::training
