// A tiny language-model setup shared by the train-lm and eval tests: a ChatML
// corpus from the data generator, a small BPE tokenizer trained on it, and a
// 2-layer Qwen3 config sized to the tokenizer.
#pragma once

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "training/bpe_trainer.h"
#include "datagen/chat_data.h"

namespace kvl::testing {

// ChatML conversations of short generated tasks, items [first, first + n)
// (disjoint seeds give held-out text).
inline std::string TinyChatCorpus(uint64_t first, int n) {
  datagen::DataOptions o;
  o.prose_sources = {};
  std::string text;
  const datagen::Task tasks[] = {datagen::Task::kArith, datagen::Task::kLists, datagen::Task::kStrings,
                               datagen::Task::kChat};
  for (int i = 0; i < n; ++i) {
    const datagen::Task task = tasks[i % 4];
    const int difficulty = task == datagen::Task::kChat ? 0 : 1;
    text += datagen::RenderChatMl(
        datagen::GenerateItem(task, difficulty, first + static_cast<uint64_t>(i), o).messages);
    text += "\n";
  }
  return text;
}

struct TinyLmFiles {
  std::string train, valid, tokenizer_dir, config;
  int64_t vocab_size = 0;
  int32_t im_end = -1;
};

// Writes train.txt, valid.txt, tok/{tokenizer.json,tokenizer_config.json} and
// config.json under dir. Fails the current test on error.
inline TinyLmFiles MakeTinyLm(const TempDir& dir, int n_train = 400, int vocab_size = 320,
                              bool tied = true) {
  TinyLmFiles f;
  const std::string train_text = TinyChatCorpus(1000, n_train);
  f.train = dir.WriteFile("train.txt", train_text);
  f.valid = dir.WriteFile("valid.txt", TinyChatCorpus(900000, 40));

  absl::StatusOr<training::Qwen3Reference> ref = training::LoadQwen3Reference(
      std::string(KVL_SOURCE_DIR) + "/" + training::kQwen3ReferenceDir);
  EXPECT_TRUE(ref.ok()) << ref.status();
  if (!ref.ok()) return f;
  training::BpeTrainerOptions options;
  options.vocab_size = vocab_size;
  absl::StatusOr<std::unique_ptr<training::BpeTrainer>> trainer =
      training::BpeTrainer::Create(options, ref->split_regex);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return f;
  (*trainer)->AddText(train_text);
  const training::TrainedBpe bpe = (*trainer)->Train();
  dir.WriteFile("tok/tokenizer.json", training::TokenizerJson(bpe, *ref));
  dir.WriteFile("tok/tokenizer_config.json", training::TokenizerConfigJson(bpe, *ref));
  f.tokenizer_dir = dir.Path("tok");
  f.vocab_size = static_cast<int64_t>(bpe.tokens.size() + bpe.added_tokens.size());
  f.im_end = -1;
  for (size_t i = 0; i < bpe.added_tokens.size(); ++i) {
    if (bpe.added_tokens[i].content == "<|im_end|>") {
      f.im_end = static_cast<int32_t>(bpe.tokens.size() + i);
    }
  }

  const nlohmann::json config = {
      {"architectures", {"Qwen3ForCausalLM"}},
      {"model_type", "qwen3"},
      {"vocab_size", f.vocab_size},
      {"hidden_size", 64},
      {"intermediate_size", 128},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 16},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},
      {"max_position_embeddings", 256},
      {"tie_word_embeddings", tied},
      {"attention_bias", false},
      {"hidden_act", "silu"},
      {"torch_dtype", "float32"},
      {"eos_token_id", f.im_end}};
  f.config = dir.WriteFile("config.json", config.dump(2));
  return f;
}

}  // namespace kvl::testing
