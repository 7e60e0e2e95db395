// Evaluation of a trained model (`kvl eval`, docs/training.md): per-task
// accuracy on evaluation suites (greedy decoding, exact match after the
// suite's normalisation) and held-out log-perplexity in nats per token.
//
// Legend: B=batch (windows), T=tokens per window.
//
// Thread safety: free functions; RunEvaluation sets LibTorch's process-wide
// intra-op thread count.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/weights.h"
#include "nlohmann/json_fwd.hpp"
#include "datagen/chat_data.h"

namespace kvl::training {

// One line of a suite file written by `kvl make-data` (docs/data.md).
struct SuiteItem {
  std::string id;
  std::string task;
  int difficulty = 0;
  std::vector<ChatMessage> messages;  // up to and including the final user question
  std::string answer;
  std::string scoring;  // "exact" | "exact_ci" | "numeric"
};

// NotFound for a missing file; InvalidArgument (naming file and line) for a
// malformed line or an unknown scoring rule.
absl::StatusOr<std::vector<SuiteItem>> LoadSuite(const std::string& path);

// The prompt exactly as the training corpus renders conversations
// (RenderChatMl: "<|im_start|>role\ncontent<|im_end|>\n" per message) followed
// by the generation prompt "<|im_start|>assistant\n". No empty think block: the
// corpus never contains one, so the model has never seen it.
std::string SuitePrompt(const SuiteItem& item);

// The documented normalisation (docs/data.md, scripts/oracles/check_suite.py): strip
// surrounding whitespace, drop one trailing period and the whitespace before
// it; exact_ci then lower-cases (ASCII).
std::string NormalizeAnswer(std::string_view text, std::string_view scoring);
// Whether a model output matches the expected answer under `scoring`. For
// "numeric" the normalised output must be an integer (-?[0-9]+) equal to the
// answer's value.
bool AnswerMatches(std::string_view output, std::string_view answer, std::string_view scoring);

struct NllResult {
  double nats_per_token = 0;  // mean negative log-likelihood
  int64_t n_tokens = 0;       // tokens predicted
  int64_t n_windows = 0;
};

// Mean next-token NLL of `tokens` in float32, under InferenceMode. The text is
// cut into windows of seq_len + 1 tokens that overlap by one token, so every
// token but the first is predicted exactly once, with context restarting every
// seq_len tokens (a short last window is kept). At most max_tokens tokens are
// predicted (0: all). Windows go through ReferenceForward `batch` at a time;
// weights are used in their own dtype (pass float32 weights for an fp32 score).
// InvalidArgument for fewer than two tokens or non-positive seq_len/batch.
absl::StatusOr<NllResult> MeanNll(const ModelConfig& config, const ModelWeights& weights,
                                  const std::vector<int32_t>& tokens, int64_t seq_len,
                                  int64_t batch, int64_t max_tokens = 0);

struct EvalOptions {
  std::string model_dir;            // Hub-format directory with tokenizer.json
  std::vector<std::string> suites;  // suite JSONL files
  std::string text_path;            // held-out text for log-perplexity; empty: none
  int64_t max_text_tokens = 65536;  // tokens predicted on text_path (0: all)
  int64_t seq_len = 512;            // perplexity window
  int64_t batch = 8;                // perplexity windows per forward
  int64_t limit = 0;                // items per suite file (0: all)
  int64_t max_new_tokens = 64;      // generated tokens per item
  int n_threads = 0;                // 0: all cores
  bool progress = true;             // progress bar on stderr
};

struct ItemResult {
  std::string id, task, answer, output;
  bool correct = false;
  bool over_context = false;  // prompt + max_new_tokens exceed max_position_embeddings
};

struct TaskResult {
  std::string task;
  int64_t n_items = 0, n_correct = 0, n_over_context = 0;
  double accuracy = 0;
};

struct EvalReport {
  std::string model_dir;
  std::vector<TaskResult> tasks;  // in first-seen order
  TaskResult overall;             // task "all"
  std::vector<ItemResult> items;
  bool has_nll = false;
  NllResult nll;
  double wall_s = 0;
};

// Errors: those of LoadCheckpoint/LoadSuite, NotFound for a missing tokenizer
// or text file, InvalidArgument for bad options.
absl::StatusOr<EvalReport> RunEvaluation(const EvalOptions& options);

nlohmann::json EvalReportToJson(const EvalReport& report, bool with_items);
std::string EvalReportTable(const EvalReport& report);

}  // namespace kvl::training
