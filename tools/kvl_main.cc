// kvl: the kvlingo command line. Thin: it only dispatches to tools/*_cmd.cc.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "model/omp_wait.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const kvl::tools::Args&);
};

constexpr Command kCommands[] = {
    {"tokenize", "tokenize JSON strings from stdin (or --decode id arrays)", kvl::tools::RunTokenize},
    {"align-tokens", "align two tokenizers' encodings of JSON strings from stdin in matching groups", kvl::tools::RunAlignTokens},
    {"logits", "print a model's logits for a list of token ids as JSON", kvl::tools::RunLogits},
    {"generate", "stream a model's continuation of a prompt", kvl::tools::RunGenerate},
    {"init-model", "write a randomly initialised checkpoint", kvl::tools::RunInitModel},
    {"make-data", "write the synthetic chat data set and evaluation suites", kvl::tools::RunMakeData},
    {"train-tokenizer", "train a byte-level BPE tokenizer.json on a corpus", kvl::tools::RunTrainTokenizer},
    {"train-lm", "train a Qwen3-architecture model from scratch", kvl::tools::RunTrainLm},
    {"eval", "suite accuracy and held-out log-perplexity of a model", kvl::tools::RunEval},
    {"fit", "closed-form fit of a KV-cache translator between two models", kvl::tools::RunFit},
    {"fit-residual", "closed-form residual maps of a translator (the native-depth dial)",
     kvl::tools::RunFitResidual},
    {"distill-residual", "self-distillation of one residual map (the native-depth dial)",
     kvl::tools::RunDistillResidual},
    {"distill", "self-distil a KV-cache translator (stage 2) from a closed-form one", kvl::tools::RunDistill},
    {"eval-translator", "log-perplexity, accuracy and multi-turn runs through translators", kvl::tools::RunEvalTranslator},
    {"stamp-translator", "write an eval-translator report's figures into a translator file", kvl::tools::RunStampTranslator},
    {"eval-switch", "recall after a switch: generated conversations through the router", kvl::tools::RunEvalSwitch},
    {"eval-conversation", "lookups over conversations alternating two models, per turn", kvl::tools::RunEvalConversation},
    {"ablate-translator", "which target layers' translated keys/values cost the most", kvl::tools::RunAblateTranslator},
    {"chat", "talk to a running kvl-server, one turn per line, showing switches and TTFT", kvl::tools::RunChat},
    {"health", "ask a running kvl-server whether it serves (grpc.health.v1; exit 0 = serving)", kvl::tools::RunHealth},
    {"hash-key", "print the SHA-256 of an API key (stdin) for auth.keys, or --generate one", kvl::tools::RunHashKey},
};

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: kvl <command> [flags]   (kvl <command> --help for its flags)\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  kvl::ReexecWithPassiveOpenMpWait(argv);
  // Logs go to stderr: stdout carries each command's results (tables, JSON).
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvl"));
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      return c.run(kvl::tools::Args(argv + 2, argv + argc));
    }
  }
  std::fprintf(stderr, "kvl: unknown command '%s'\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
