// The `kvl` subcommands. Each takes the arguments after its name and returns
// the process exit code; errors are printed as one clear line on stderr.
#pragma once

#include <string>
#include <vector>

namespace kvl::tools {

using Args = std::vector<std::string>;

int RunTokenize(const Args& args);   // tools/tokenize_cmd.cc
int RunAlignTokens(const Args& args);  // tools/align_tokens_cmd.cc
int RunLogits(const Args& args);     // tools/logits_cmd.cc
int RunGenerate(const Args& args);   // tools/generate_cmd.cc
int RunInitModel(const Args& args);  // tools/init_model_cmd.cc
int RunMakeData(const Args& args);   // tools/make_data_cmd.cc
int RunTrainTokenizer(const Args& args);  // tools/train_tokenizer_cmd.cc
int RunTrainLm(const Args& args);    // tools/train_lm_cmd.cc
int RunEval(const Args& args);       // tools/eval_cmd.cc
int RunFit(const Args& args);        // tools/fit_cmd.cc
int RunFitResidual(const Args& args);  // tools/fit_residual_cmd.cc
int RunDistillResidual(const Args& args);  // tools/distill_residual_cmd.cc
int RunDistill(const Args& args);    // tools/distill_cmd.cc
int RunEvalTranslator(const Args& args);  // tools/eval_translator_cmd.cc
int RunEvalSwitch(const Args& args);      // tools/eval_switch_cmd.cc
int RunEvalConversation(const Args& args);  // tools/eval_conversation_cmd.cc
int RunStampTranslator(const Args& args);   // tools/stamp_translator_cmd.cc
int RunAblateTranslator(const Args& args);  // tools/ablate_translator_cmd.cc
int RunChat(const Args& args);       // tools/chat_cmd.cc
int RunHealth(const Args& args);     // tools/health_cmd.cc
int RunHashKey(const Args& args);    // tools/hash_key_cmd.cc

}  // namespace kvl::tools
