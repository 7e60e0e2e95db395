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
  // corpus's (scripts/train/train_house_models.sh), so that items are what the
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
  // The native-depth dial of the translate conditions (router::
  // TranslatorSource::native_layers); unset: the translator file's default.
  std::optional<int64_t> native_layers;
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

// The multi-turn evaluation (`kvl eval-conversation`, the paper's appendix
// Q on the house models): conversations about one key-value document (a
// datagen kv item's records) whose turns alternate between two models. Turn 1
// gives the document and the first lookup on the starting model; each later
// turn asks for another key's value on the other model, so every turn from
// the second on is a switch. The history is the reference's throughout (each
// turn's reply is given, as QuAC's gold history): per turn, the answering
// model's NLL of the reference value and its stop token, and whether greedy
// decoding would have written exactly that (every one of those tokens the
// model's first choice), under three strategies on routers of their own:
//   reprefill         each switch prefills the target's unseen spans natively
//   translate         each switch translates them (native tail W)
//   translate +repair the same, with background repair (after-turn) finishing
//                     between turns, as while the user types
// and a fourth run for live fidelity: translate +repair with the models'
// own greedy answers, whose repairs score each switch turn's reply
// (TurnObserver::OnSwitchFidelity: the server's
// kvlingo_switch_divergence_nats), set against the offline gap of the same
// switch (+repair's reference NLL minus reprefill's). Half the conversations
// start on each model.
struct ConversationEvalOptions {
  std::string first_dir, second_dir;
  std::string forward_translator, reverse_translator;  // first -> second, second -> first
  int64_t conversations = 20;  // per starting model
  int turns = 8;
  uint64_t seed = 33;
  datagen::DataOptions data = HouseCorpusKnobs();
  int64_t native_tail = 32;        // the server's default
  bool live = true;                // the fourth run
  int64_t max_new_tokens = 24;     // of the live run's answers
  int n_threads = 0;
  std::optional<DType> translate_dtype;  // unset: FastestTranslateDtype()
  bool progress = true;
};

// One turn of the conversations that start on one model, one strategy.
struct ConversationTurnCell {
  std::vector<double> correct;     // per conversation, 0 or 1
  std::vector<double> answer_nll;  // per conversation, nats/token
  std::vector<double> read_ms;     // the turn read up to its reply's stop token
};

struct ConversationEvalReport {
  std::vector<std::string> strategies;  // reprefill, translate, translate +repair
  std::string model_names[2];
  // [start model][strategy][turn - 1]
  std::map<int, std::map<std::string, std::vector<ConversationTurnCell>>> cells;
  // The live run, [start model][turn - 1]: its answers' accuracy, and per
  // switch the divergence its repair measured (NaN when none was reported)
  // and whether the first token differed.
  std::map<int, std::vector<std::vector<double>>> live_correct, live_divergence, live_first_differs;
  int64_t n_documents_redrawn = 0;  // kv items with fewer records than turns
  double wall_s = 0;
};

// Errors: the loaders' (FailedPrecondition for a translator built for other
// models), InvalidArgument for bad options.
absl::StatusOr<ConversationEvalReport> RunConversationEval(const ConversationEvalOptions& options);
// Markdown: per starting model a table of the turns, the strategies side by
// side; then per translator pair the live divergence against the offline gap
// over every switch.
std::string ConversationEvalTable(const ConversationEvalReport& report);
nlohmann::json ConversationEvalJson(const ConversationEvalOptions& options,
                                    const ConversationEvalReport& report);
// Two PNG plots through gnuplot: <prefix>-accuracy.png and <prefix>-nll.png,
// a line per strategy and starting model against the turn.
absl::Status PlotConversationEval(const ConversationEvalReport& report, const std::string& prefix);

}  // namespace kvl::training
