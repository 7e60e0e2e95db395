// Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/
// (or the directory given as the first argument): small valid inputs of every
// kind each parser accepts, plus a few near-misses. Deterministic: running it
// again rewrites the same files. Usage: fuzz_make_seeds [corpus-dir]
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "kvlingo/v1/chat.pb.h"
#include "kvlingo/v1/session.pb.h"
#include "model/safetensors.h"
#include "translator/translator.h"

namespace fs = std::filesystem;
namespace {

fs::path root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const fs::path kSource = KVL_SOURCE_DIR;

void TokenizerSeeds() {
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"ascii", "Hello, world! The key is 7F3A-19. It's 42 degrees."},
      {"unicode", "na\xc3\xafve caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x99\x82 \xd0\x9f\xd1\x80\xd0\xb8"},
      {"combining", "e\xcc\x81 A\xcc\x8a \xe2\x84\xab \xef\xac\x81"},  // NFC work
      {"invalid_utf8", "ok \xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 end"},
      {"chat_markup", "<|im_start|>user\nWhere is Lisbon?<|im_end|>\n<|im_start|>assistant\n"},
      {"think", "<think>\nreasoning\n</think>\n\nanswer"},
      {"whitespace", "  a\t\tb\r\n\r\n  c   \n\n\n d\xc2\xa0" "e"},
      {"digits_punct", "3.14159, 1,000,000; (x+y)*z = 'it''s' -- \"q\" ..."},
  };
  for (const auto& [name, text] : texts) {
    Write("tokenizer", "text_" + name, std::string(1, '\0') + text);
    Write("tokenizer", "text_special_" + name, std::string(1, '\2') + text);
  }
  // Ids: little-endian 16-bit, some beyond the vocabulary, special ones.
  std::string ids = "\1";
  for (int id : {15, 300, 4095, 4090, 65535, 0, 1000, 4088, 200, 201}) {
    ids += static_cast<char>(id & 0xff);
    ids += static_cast<char>(id >> 8);
  }
  Write("tokenizer", "ids", ids);
  ids[0] = '\3';
  Write("tokenizer", "ids_skip_special", ids);
}

void TokenAlignmentSeeds() {
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"ascii", "Where is Lisbon? The key is 7F3A-19; it's 42 degrees."},
      {"unicode", "na\xc3\xafve caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x99\x82 \xd0\x9f\xd1\x80\xd0\xb8"},
      {"whitespace", "  a\t\tb\r\n\r\n  c   \n\n\n d\xc2\xa0" "e"},
      {"code", "for (int i = 0; i < n; ++i) { sum += x[i] * 0.5f; }  // done"},
  };
  for (const auto& [name, text] : texts) Write("token_alignment", "text_" + name, '\0' + text);
  // Byte lengths: equal totals (a run of merges on each side, an empty
  // token), then different totals.
  Write("token_alignment", "lengths_equal", std::string("\1\3\1\0\2\xff\2\1\3", 9));
  Write("token_alignment", "lengths_unequal", std::string("\1\3\1\xff\2\4", 6));
}

void SafetensorsSeeds() {
  const fs::path tmp = root / "safetensors.tmp";
  auto save = [&](const std::string& name, const std::map<std::string, at::Tensor>& tensors,
                  const std::map<std::string, std::string>& metadata) {
    if (!kvl::WriteSafetensors(tmp.string(), tensors, metadata).ok()) std::abort();
    Write("safetensors", name, Read(tmp));
    fs::remove(tmp);
  };
  save("f32_i64", {{"a", at::arange(6, at::kFloat).view({2, 3})}, {"b", at::arange(3, at::kLong)}},
       {{"format", "pt"}});
  save("half_types", {{"h", at::ones({2, 2}, at::kHalf)}, {"bf", at::ones({3}, at::kBFloat16)}}, {});
  save("small_ints", {{"i8", at::ones({4}, at::kChar)}, {"u8", at::ones({1, 1, 2}, at::kByte)},
                      {"bool", at::ones({2}, at::kBool)}, {"i16", at::ones({2}, at::kShort)},
                      {"i32", at::ones({2}, at::kInt)}, {"f64", at::ones({1}, at::kDouble)}}, {});
  save("empty_and_scalar", {{"empty", at::zeros({0, 4})}, {"scalar", at::ones({}, at::kFloat)}},
       {{"k", "v"}, {"unicode", "\xc3\xa9"}});
  save("no_tensors", {}, {{"only", "metadata"}});
  // Near-misses written by hand: a header length past the file, and a header
  // whose offsets overlap.
  std::string bad = std::string("\x40\x00\x00\x00\x00\x00\x00\x00", 8) + "{}";
  Write("safetensors", "header_past_end", bad);
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  Write("safetensors", "overlapping", len + header + std::string(8, '\1'));
}

void ModelConfigSeeds() {
  for (const char* model : {"kvl-small", "kvl-large", "kvl-small-b"}) {
    Write("model_config", std::string(model) + ".json",
          Read(kSource / "models" / model / "config.json"));
  }
  Write("model_config", "llama.json", R"({"architectures":["LlamaForCausalLM"],"model_type":"llama",
    "vocab_size":32000,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
    "num_attention_heads":4,"num_key_value_heads":2,"rms_norm_eps":1e-5,"rope_theta":10000,
    "max_position_embeddings":256,"tie_word_embeddings":false,"eos_token_id":[2,3],"bos_token_id":1,
    "torch_dtype":"bfloat16","rope_scaling":null,"hidden_act":"silu"})");
  Write("model_config", "qwen3_min.json", R"({"model_type":"qwen3","vocab_size":16,"hidden_size":8,
    "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,
    "head_dim":4,"eos_token_id":0})");
}

kvl::TranslatorEndpoint Endpoint(int64_t n_layer, int64_t n_head_kv, int64_t head_dim) {
  kvl::TranslatorEndpoint e;  // empty identity and tokenizer hash: what the fuzz target expects
  e.n_layer = n_layer;
  e.n_head_kv = n_head_kv;
  e.head_dim = head_dim;
  return e;
}

void TranslatorSeeds() {
  const fs::path tmp = root / "translator.tmp";
  at::manual_seed(7);
  for (const bool anchors : {false, true}) {
    for (const bool joint : {false, true}) {
      kvl::TranslatorSpec spec;
      spec.source = Endpoint(2, 1, 4);
      spec.target = Endpoint(3, 2, 2);
      spec.assignment_kind = "custom";
      spec.assignment.keys = {{0}, {0, 1}, {1}};
      spec.assignment.values = {{1}, {0}, {0, 1}};
      spec.inputs = joint ? kvl::MapInputs::kJoint : kvl::MapInputs::kSplit;
      spec.bias = !joint;
      spec.anchor_window = anchors ? 2 : 0;
      const int64_t vocab = 8, embed = 4;
      const int64_t out = 2 * 2, in = 1 * 4;
      kvl::TranslatorMaps keys, values;
      for (int side = 0; side < 2; ++side) {
        kvl::TranslatorMaps& maps = side == 0 ? keys : values;
        const auto& lists = side == 0 ? spec.assignment.keys : spec.assignment.values;
        for (size_t il = 0; il < lists.size(); ++il) {
          const int64_t blocks = joint ? static_cast<int64_t>(spec.assignment.keys[il].size() +
                                                              spec.assignment.values[il].size())
                                       : static_cast<int64_t>(lists[il].size());
          maps.weight.push_back(at::randn({out, in * blocks}));
          if (spec.bias) maps.bias.push_back(at::randn({out}));
          if (anchors) maps.anchor.push_back(at::randn({out, spec.anchor_window * embed}));
        }
      }
      at::Tensor table = anchors ? at::randn({vocab, embed}) : at::Tensor();
      auto t = kvl::Translator::Create(spec, keys, values, kvl::DType::kFloat32, table);
      if (!t.ok()) {
        std::fprintf(stderr, "translator seed: %s\n", t.status().ToString().c_str());
        std::abort();
      }
      if (!(*t)->Save(tmp.string()).ok()) std::abort();
      Write("translator",
            std::string(joint ? "joint" : "split") + (anchors ? "_anchors" : "") + ".safetensors",
            Read(tmp));
      fs::remove(tmp);
    }
  }
}

void ServerConfigSeeds() {
  // The example configuration with its paths relative to the source tree (the
  // fuzz target resolves against it).
  std::string example = Read(kSource / "configs" / "server.json");
  example = absl::StrReplaceAll(example, {{"../models/", "models/"}});
  Write("server_config", "example.json", example);
  Write("server_config", "empty.json", "{}");
  Write("server_config", "auth_tls.json", R"json({
  "server": {"listen_address": "0.0.0.0:0", "metrics_address": "127.0.0.1:0", "reflection": false,
             "tls": {"cert_file": "configs/server.json", "key_file": "configs/server.json"}},
  "models": [{"name": "a", "path": "models/kvl-small"}, {"name": "b", "path": "models/kvl-large"}],
  "translators": [{"source": "a", "target": "b",
                   "path": "models/translators/kvl-small__kvl-large.safetensors",
                   "min_recovered": 0.5, "compute_dtype": "float32"}],
  "routing": {"policy": "rules", "default_model": "a", "models": ["a", "b"],
              "rules": [{"pattern": "[Pp]rove (it|that)", "model": "b"},
                        {"contains": ["why"], "min_bytes": 3, "max_turn": 4, "model": "a"}],
              "repair": "idle-only",
              "gate": {"min_recovered": 0.5, "max_divergence_nats": 0.5, "window": 4,
                       "min_samples": 2}},
  "limits": {"max_concurrent_streams": 4, "max_sessions": 10, "max_history_tokens": 100},
  "batching": {"enabled": false},
  "sessions": {"idle_timeout_seconds": 0, "memory_budget_bytes": 1048576,
               "store": {"backend": "redis", "redis_address": "127.0.0.1:6379"}},
  "auth": {"keys": [{"name": "k", "tenant": "t",
                     "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                     "rights": ["chat", "admin"]}],
           "tenants": {"t": {"max_sessions": 2, "max_concurrent_turns": 1}}},
  "log": {"level": "debug"}, "runtime": {"threads": 2, "dtype": "bfloat16", "device": "cpu"}
})json");
}

std::string Conversation(uint8_t options,
                         const std::vector<std::pair<uint8_t, std::string>>& messages) {
  std::string out(1, static_cast<char>(options));
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) out += '\xff';
    out += static_cast<char>(messages[i].first);
    out += messages[i].second;
  }
  return out;
}

void ChatTemplateSeeds() {
  Write("chat_template", "user_only", Conversation(1, {{1, "Hello"}}));
  Write("chat_template", "system_user_assistant_user",
        Conversation(1, {{0, "You are brief."}, {1, "Hi"}, {2, "Hello!"}, {1, "Where is Lisbon?"}}));
  Write("chat_template", "reasoning",
        Conversation(0, {{1, "2+2?"}, {2, "<think>\nadd\n</think>\n\n4"}, {1, "and 3+3?"}}));
  Write("chat_template", "tool_response",
        Conversation(1, {{1, "q"}, {2, "a"}, {1, "<tool_response>\nr\n</tool_response>"}}));
  Write("chat_template", "assistant_last",
        Conversation(1, {{0, "s"}, {1, "u"}, {2, "reply"}}));
  Write("chat_template", "unsupported_role", Conversation(1, {{1, "u"}, {3, "tool output"}}));
}

void ChatRequestSeeds() {
  kvlingo::v1::ChatRequest chat;
  chat.set_session_id("s-1");
  chat.set_user_message("Where is Lisbon?");
  Write("chat_request", "chat_min", std::string(1, '\0') + chat.SerializeAsString());
  chat.set_request_id("req.7:a");
  chat.mutable_sampling()->set_max_tokens(16);
  chat.mutable_sampling()->set_temperature(0.7f);
  chat.mutable_sampling()->set_top_p(0.9f);
  chat.mutable_sampling()->set_top_k(5);
  chat.mutable_sampling()->set_seed(3);
  chat.mutable_sampling()->add_stop("\n\n");
  chat.mutable_sampling()->add_stop("END");
  chat.mutable_routing()->set_policy("explicit");
  chat.mutable_routing()->set_model("kvl-large");
  chat.mutable_routing()->set_strategy(kvlingo::v1::SWITCH_STRATEGY_REPREFILL_MISSING);
  Write("chat_request", "chat_full", std::string(1, '\0') + chat.SerializeAsString());
  chat.set_user_message("bad \xff utf-8");
  Write("chat_request", "chat_bad_utf8", std::string(1, '\0') + chat.SerializeAsString());

  kvlingo::v1::ImportSessionRequest import;
  import.set_session_id("imp");
  for (const char* model : {"", "kvl-large", "kvl-small-b"}) {
    kvlingo::v1::ImportedTurn* t = import.add_turns();
    t->set_user_message("question");
    t->set_reply("answer \xc3\xa9");
    t->set_model(model);
  }
  Write("chat_request", "import", std::string(1, '\1') + import.SerializeAsString());

  kvlingo::v1::CreateSessionRequest create;
  create.set_session_id("new");
  create.set_system_prompt("You are a terse assistant.");
  Write("chat_request", "create", std::string(1, '\2') + create.SerializeAsString());
  Write("chat_request", "utf8", std::string(1, '\3') + "ok \xe2\x82\xac \xf0\x9f\x99\x82 \xed\xa0\x80 \xc0\xaf");
}

}  // namespace

int main(int argc, char** argv) {
  root = argc > 1 ? fs::path(argv[1]) : kSource / "tests" / "fuzz" / "corpus";
  TokenizerSeeds();
  TokenAlignmentSeeds();
  SafetensorsSeeds();
  ModelConfigSeeds();
  TranslatorSeeds();
  ServerConfigSeeds();
  ChatTemplateSeeds();
  ChatRequestSeeds();
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
