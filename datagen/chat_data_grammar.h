// A small English grammar (a few hundred words) for the chat-data generator:
// filler turns between facts and questions, and short chit-chat conversations.
//
// Contract relied on by the task generators and by scripts/oracles/check_suite.py:
// generated text contains no digits, no first-person "I"/"my", no "key-", no
// double quotes and none of the phrases the task templates use ("lives in",
// "number is", "is on", "called", "named", "the list", "the code"), so filler
// can never be mistaken for a fact, a record or an instruction.
#pragma once

#include <string>

#include "datagen/chat_data_rng.h"

namespace kvl::datagen {

std::string GrammarSentence(Rng& rng);
std::string GrammarQuestion(Rng& rng);
// 2..n_max sentences joined by spaces.
std::string GrammarParagraph(Rng& rng, int n_max);
// A user turn that carries no task content (a remark or an unrelated question).
std::string FillerUserTurn(Rng& rng);
// An assistant reply to a filler turn.
std::string FillerAssistantTurn(Rng& rng);

}  // namespace kvl::datagen
