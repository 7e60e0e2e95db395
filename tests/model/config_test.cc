// ModelConfig parsing of real Hugging Face config.json files, refusals of what
// the decoder does not implement, and the config.json it writes back.
#include "model/config.h"

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvl {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kData = std::string(KVL_SOURCE_DIR) + "/tests/data/checkpoint/";

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(ModelConfigTest, ParsesQwen3_0_6B) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromFile(kData + "qwen3_0.6b_config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_EQ(c->architecture_name, "Qwen3ForCausalLM");
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->intermediate_size, 3072);
  EXPECT_EQ(c->n_layer, 28);
  EXPECT_EQ(c->n_head, 16);
  EXPECT_EQ(c->n_head_kv, 8);
  EXPECT_EQ(c->head_dim, 128);  // explicit: not hidden/heads (= 64)
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->max_position_embeddings, 40960);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
  // Published size of Qwen3-0.6B: 0.6B in total, 0.44B without embeddings;
  // its model.safetensors holds 751,632,384 values because it also stores the
  // tied lm_head (151936 * 1024 = 155,582,464) once more.
  EXPECT_EQ(c->ParameterCount(), 751632384 - 151936 * 1024);
  EXPECT_EQ(c->ParameterCount() - c->vocab_size * c->hidden_size, 440467456);
}

TEST(ModelConfigTest, ParsesLlamaWithDefaults) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromFile(kData + "tinyllama_1.1b_config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->head_dim, 64);  // no head_dim key: hidden_size / num_attention_heads
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);  // absent: Llama's default
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->n_head_kv, 4);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  // TinyLlama-1.1B's published parameter count.
  EXPECT_EQ(c->ParameterCount(), 1100048384);
}

// Mistral-7B-Instruct-v0.3's config.json (the paper's App. K pair): Llama's
// math, untied head, BOS 1 / EOS 2, and a window key that is null there.
TEST(ModelConfigTest, ParsesMistralAndItsWindow) {
  const json real = ReadJson(kData + "mistral_7b_instruct_v0.3_config.json");
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(real);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->sliding_window, 0);  // null: every layer sees every earlier key
  EXPECT_EQ(c->AttentionWindow(0), 0);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  // Mistral-7B-v0.3's published parameter count.
  EXPECT_EQ(c->ParameterCount(), 7248023552);
  // Written back, every key of the real file with its value.
  const json written = c->ToJson();
  for (const auto& [key, value] : real.items()) {
    if (key == "transformers_version") continue;
    ASSERT_TRUE(written.contains(key)) << key;
    EXPECT_EQ(written[key], value) << key;
  }

  // v0.1's window of 4096 tokens applies to every layer.
  json windowed = real;
  windowed["sliding_window"] = 4096;
  absl::StatusOr<ModelConfig> w = ModelConfig::FromJson(windowed);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->sliding_window, 4096);
  EXPECT_EQ(w->AttentionWindow(31), 4096);
  EXPECT_EQ(w->ToJson()["sliding_window"], 4096);
  for (const json& bad : {json(0), json(-1), json("4096")}) {
    windowed["sliding_window"] = bad;
    absl::StatusOr<ModelConfig> refused = ModelConfig::FromJson(windowed);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("sliding_window"));
  }
  // model_type mistral under another class name is a mismatch.
  json mismatch = real;
  mismatch["architectures"] = json::array({"LlamaForCausalLM"});
  EXPECT_FALSE(ModelConfig::FromJson(mismatch).ok());
}

// Each (key, value) set into `real` is refused with InvalidArgument naming the key.
void ExpectRefusalsNameTheKey(const json& real,
                              const std::vector<std::pair<std::string, json>>& changes) {
  for (const auto& [key, value] : changes) {
    json bad = real;
    bad[key] = value;
    absl::StatusOr<ModelConfig> refused = ModelConfig::FromJson(bad);
    ASSERT_FALSE(refused.ok()) << key;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(key));
  }
}

// Gemma-3-1B-it's config.json: Gemma3ForCausalLM with five sliding layers
// (window 512, RoPE base 10000) before each global one (base 1e6), the
// attention scalar, GELU-tanh and its norms.
TEST(ModelConfigTest, ParsesGemma3TextAndItsLayerKinds) {
  const json real = ReadJson(kData + "gemma3_1b_it_config.json");
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(real);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGemma3);
  EXPECT_EQ(c->architecture_name, "Gemma3ForCausalLM");
  EXPECT_FALSE(c->text_of_multimodal);
  EXPECT_EQ(c->hidden_act, Activation::kGeluTanh);
  EXPECT_TRUE(c->qk_norm && c->norm_weight_offset && c->sandwich_norms && c->scale_embeddings);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_DOUBLE_EQ(c->AttentionScale(), 1.0 / 16);
  for (int64_t il = 0; il < 26; ++il) {
    const bool global = (il + 1) % 6 == 0;  // layers 5, 11, 17, 23
    EXPECT_EQ(c->AttentionWindow(il), global ? 0 : 512) << il;
    EXPECT_DOUBLE_EQ(c->RopeTheta(il), global ? 1e6 : 1e4) << il;
    EXPECT_DOUBLE_EQ(c->RopeFactor(il), 1.0) << il;
  }
  EXPECT_EQ(c->bos_token_id, 2);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1, 106));
  // Gemma-3-1B's published parameter count (four norms per layer, q/k norms,
  // tied head).
  EXPECT_EQ(c->ParameterCount(), 999885952);
  // Written back as transformers writes it (the layer kinds as layer_types),
  // it reads as the same model.
  const json written = c->ToJson();
  EXPECT_EQ(written["model_type"], "gemma3_text");
  EXPECT_EQ(written["layer_types"][5], "full_attention");
  EXPECT_EQ(written["layer_types"][4], "sliding_attention");
  absl::StatusOr<ModelConfig> again = ModelConfig::FromJson(written);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToJson(), written);

  // The newer rope_parameters, per layer kind.
  json newer = real;
  newer.erase("rope_theta");
  newer.erase("rope_local_base_freq");
  newer["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  absl::StatusOr<ModelConfig> n = ModelConfig::FromJson(newer);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_DOUBLE_EQ(n->RopeTheta(5), 1e6);
  EXPECT_DOUBLE_EQ(n->RopeFactor(5), 8.0);
  EXPECT_DOUBLE_EQ(n->RopeTheta(0), 1e4);
  EXPECT_DOUBLE_EQ(n->RopeFactor(0), 1.0);

  ExpectRefusalsNameTheKey(real, {{"attn_logit_softcapping", 50.0},
                                  {"layer_types", json::array({"sliding_attention"})},
                                  {"sliding_window", 0},
                                  {"hidden_activation", "relu"},
                                  {"query_pre_attn_scalar", 0}});
}

// Gemma-3-4B-it: a vision-language checkpoint whose text_config gives six
// keys; the rest are Gemma3TextConfig's defaults, and its global layers
// scale RoPE linearly by 8.
TEST(ModelConfigTest, ParsesTheTextHalfOfAMultimodalGemma3) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromFile(kData + "gemma3_4b_it_config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGemma3);
  EXPECT_TRUE(c->text_of_multimodal);
  EXPECT_EQ(c->vocab_size, 262208);
  EXPECT_EQ(c->hidden_size, 2560);
  EXPECT_EQ(c->n_layer, 34);
  EXPECT_EQ(c->n_head, 8);
  EXPECT_EQ(c->n_head_kv, 4);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->AttentionWindow(0), 1024);
  EXPECT_EQ(c->AttentionWindow(5), 0);
  EXPECT_DOUBLE_EQ(c->RopeFactor(5), 8.0);
  EXPECT_DOUBLE_EQ(c->RopeFactor(0), 1.0);
  EXPECT_DOUBLE_EQ(c->RopeTheta(0), 1e4);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1, 106));  // the outer config's
  // The text model's parameters: 3,209M outside the embedding, as the
  // Gemma 3 report lists for 4B, plus a 262,208 x 2,560 embedding.
  EXPECT_EQ(c->ParameterCount(), 3880263168);
  // Written back, it is the Gemma3ForCausalLM it holds.
  const json written = c->ToJson();
  EXPECT_EQ(written["architectures"], json::array({"Gemma3ForCausalLM"}));
  EXPECT_EQ(written["rope_scaling"], json({{"rope_type", "linear"}, {"factor", 8.0}}));
  absl::StatusOr<ModelConfig> again = ModelConfig::FromJson(written);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ParameterCount(), c->ParameterCount());
  EXPECT_FALSE(again->text_of_multimodal);

  json no_text = ReadJson(kData + "gemma3_4b_it_config.json");
  no_text.erase("text_config");
  absl::StatusOr<ModelConfig> refused = ModelConfig::FromJson(no_text);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("text_config"));
}

// Qwen3-30B-A3B's config.json (the paper's App. N pair): 128 experts of
// which 8 run per token on every layer, renormalized.
// A span's tokens no later query reads: a sliding layer reads its last W - 1
// from the span's end on, a global layer all of them; a model without
// windows none to skip (an empty list).
TEST(ModelConfigTest, UnreadTokensAreASlidingLayersTokensBeforeItsWindow) {
  ModelConfig c;
  c.n_layer = 3;
  EXPECT_TRUE(c.UnreadTokens(0, 100).empty());
  c.sliding_window = 8;  // Mistral: every layer
  EXPECT_EQ(c.UnreadTokens(10, 110), (std::vector<int64_t>{93, 93, 93}));
  EXPECT_EQ(c.UnreadTokens(10, 17), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(c.UnreadTokens(10, 18), (std::vector<int64_t>{1, 1, 1}));
  c.sliding_layers = {true, false, true};  // Gemma-3: some layers global
  EXPECT_EQ(c.UnreadTokens(0, 20), (std::vector<int64_t>{13, 0, 13}));
  EXPECT_EQ(c.UnreadTokens(5, 5), (std::vector<int64_t>{0, 0, 0}));
}

TEST(ModelConfigTest, ParsesQwen3MoeAndItsExperts) {
  const json real = ReadJson(kData + "qwen3_30b_a3b_config.json");
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(real);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3Moe);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->n_expert, 128);
  EXPECT_EQ(c->n_expert_used, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_TRUE(c->norm_topk_prob);
  for (int64_t il : {0, 23, 47}) EXPECT_TRUE(c->IsMoeLayer(il)) << il;
  // Qwen3-30B-A3B's published parameter count.
  EXPECT_EQ(c->ParameterCount(), 30532122624);
  // Written back: exactly the keys of the real file with their values.
  const json written = c->ToJson();
  for (const auto& [key, value] : real.items()) {
    if (key == "transformers_version") continue;
    ASSERT_TRUE(written.contains(key)) << key;
    EXPECT_EQ(written[key], value) << key;
  }
  for (const auto& [key, value] : written.items()) EXPECT_TRUE(real.contains(key)) << key;

  // Dense layers: those in mlp_only_layers, and all but every k-th with
  // decoder_sparse_step k.
  json pattern = real;
  pattern["mlp_only_layers"] = {0, 5};
  pattern["decoder_sparse_step"] = 2;
  absl::StatusOr<ModelConfig> p = ModelConfig::FromJson(pattern);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->IsMoeLayer(0));
  EXPECT_TRUE(p->IsMoeLayer(1));
  EXPECT_FALSE(p->IsMoeLayer(2));
  EXPECT_TRUE(p->IsMoeLayer(3));
  EXPECT_FALSE(p->IsMoeLayer(5));
  EXPECT_EQ(ModelConfig::FromJson(p->ToJson())->ParameterCount(), p->ParameterCount());

  ExpectRefusalsNameTheKey(real, {{"num_experts_per_tok", 129},
                                  {"num_experts", nullptr},
                                  {"moe_intermediate_size", 0},
                                  {"decoder_sparse_step", 0},
                                  {"mlp_only_layers", json::array({48})}});
}

TEST(ModelConfigTest, EosListAndMissingKvHeads) {
  json j = ReadJson(kData + "tiny_qwen3_config.json");
  j.erase("num_key_value_heads");
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2, 3));
  EXPECT_EQ(c->n_head_kv, c->n_head);  // plain multi-head attention
}

TEST(ModelConfigTest, ParameterCountCountsBiasesAndUntiedHead) {
  json j = ReadJson(kData + "tiny_qwen3_config.json");
  absl::StatusOr<ModelConfig> tied = ModelConfig::FromJson(j);
  j["tie_word_embeddings"] = false;
  j["attention_bias"] = true;
  absl::StatusOr<ModelConfig> untied = ModelConfig::FromJson(j);
  ASSERT_TRUE(tied.ok() && untied.ok());
  // q: 4*16, k and v: 2*16 each, o: 32 (hidden) per layer.
  const int64_t biases = 2 * (64 + 32 + 32 + 32);
  EXPECT_EQ(untied->ParameterCount() - tied->ParameterCount(), 211 * 32 + biases);
}

TEST(ModelConfigTest, ToJsonHasEveryKeyOfARealQwen3Config) {
  const json real = ReadJson(kData + "qwen3_0.6b_config.json");
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(real);
  ASSERT_TRUE(c.ok()) << c.status();
  const json written = c->ToJson();
  for (const auto& [key, value] : real.items()) {
    if (key == "transformers_version") continue;  // says who wrote the file
    ASSERT_TRUE(written.contains(key)) << key;
    EXPECT_EQ(written[key], value) << key;
  }
  for (const auto& [key, value] : written.items()) EXPECT_TRUE(real.contains(key)) << key;
}

TEST(ModelConfigTest, ToJsonRoundTripsLlama) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromFile(kData + "tinyllama_1.1b_config.json");
  ASSERT_TRUE(c.ok());
  const json written = c->ToJson();
  EXPECT_EQ(written["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(written["mlp_bias"], false);
  EXPECT_FALSE(written.contains("use_sliding_window"));
  absl::StatusOr<ModelConfig> again = ModelConfig::FromJson(written);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToJson(), written);
  EXPECT_EQ(again->head_dim, 64);
  EXPECT_FALSE(again->qk_norm);
  EXPECT_EQ(again->ParameterCount(), c->ParameterCount());
}

// Each refusal: InvalidArgument, naming the key and the offending value.
struct Refusal {
  const char* name;
  const char* key;
  json value;  // null: erase the key
  const char* expect_in_message;
};

class RefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(RefusalTest, IsInvalidArgumentNamingKeyAndValue) {
  const Refusal& r = GetParam();
  json j = ReadJson(kData + "tiny_qwen3_config.json");
  if (r.value.is_null()) {
    j.erase(r.key);
  } else {
    j[r.key] = r.value;
  }
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              AllOf(HasSubstr(r.key), HasSubstr(r.expect_in_message)));
}

INSTANTIATE_TEST_SUITE_P(
    Refusals, RefusalTest,
    ::testing::Values(
        Refusal{"Qwen2", "architectures", json::array({"Qwen2ForCausalLM"}), "Qwen2ForCausalLM"},
        Refusal{"MoE", "architectures", json::array({"Qwen2MoeForCausalLM"}), "unsupported"},
        Refusal{"ModelTypeMismatch", "model_type", "llama", "Qwen3ForCausalLM"},
        Refusal{"Yarn", "rope_scaling",
                json{{"rope_type", "yarn"},
                     {"factor", 4.0},
                     {"original_max_position_embeddings", 32768}},
                "yarn"},
        Refusal{"LinearWithoutFactor", "rope_scaling", json{{"type", "linear"}}, "factor"},
        Refusal{"Llama3", "rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}}, "llama3"},
        Refusal{"Gelu", "hidden_act", "gelu", "gelu"},
        Refusal{"AttentionSoftcap", "attn_logit_softcapping", 50.0, "50"},
        Refusal{"SlidingWindow", "use_sliding_window", true, "sliding"},
        Refusal{"LayerTypes", "layer_types", json::array({"full_attention", "sliding_attention"}),
                "sliding_attention"},
        Refusal{"MlpBias", "mlp_bias", true, "true"},
        Refusal{"Quantized", "quantization_config", json{{"quant_method", "awq"}, {"bits", 4}},
                "awq"},
        Refusal{"KvHeads", "num_key_value_heads", 3, "3"},
        Refusal{"MissingHidden", "hidden_size", nullptr, "missing"},
        Refusal{"ZeroLayers", "num_hidden_layers", 0, "positive"},
        Refusal{"HiddenAsString", "hidden_size", "1024", "integer"},
        Refusal{"OddHeadDim", "head_dim", 15, "15"},
        Refusal{"Float64", "torch_dtype", "float64", "float64"},
        Refusal{"EosOutsideVocab", "eos_token_id", 5000, "5000"}),
    [](const ::testing::TestParamInfo<Refusal>& info) { return info.param.name; });

TEST(ModelConfigTest, AcceptsDefaultRopeScalingAndNewDtypeKey) {
  json j = ReadJson(kData + "tiny_qwen3_config.json");
  j["rope_scaling"] = {{"rope_type", "default"}};
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  j["sliding_window"] = 4096;  // present but disabled by use_sliding_window = false
  j["layer_types"] = json::array({"full_attention", "full_attention"});
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ModelConfigTest, HeadDimDerivationNeedsDivisibleHidden) {
  json j = ReadJson(kData + "tiny_qwen3_config.json");
  j.erase("head_dim");
  j["num_attention_heads"] = 6;
  j["num_key_value_heads"] = 2;
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("hidden_size"));
}

TEST(ModelConfigTest, FileErrors) {
  absl::StatusOr<ModelConfig> missing = ModelConfig::FromFile(kData + "no_such_config.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no_such_config.json"));

  const std::string path = ::testing::TempDir() + "/malformed_config.json";
  std::ofstream(path) << "{\"hidden_size\": 12,";
  absl::StatusOr<ModelConfig> malformed = ModelConfig::FromFile(path);
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(malformed.status().message()), HasSubstr("malformed JSON"));
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bfloat16");
  absl::StatusOr<DType> bad = ParseDType("int8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("int8"));
}

}  // namespace
}  // namespace kvl
