// `kvl align-tokens`: two tokenizers on the same texts, aligned in minimal
// matching groups (model/token_alignment.h); JSON lines in, JSON lines out.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/flags.h"
#include "model/token_alignment.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace kvl::tools {

int RunAlignTokens(const Args& args) {
  std::string a_path, b_path;
  FlagSet flags("kvl align-tokens",
                "Reads one JSON string per line on stdin, encodes it with both tokenizers and\n"
                "writes one JSON object per line: {\"a_tokens\", \"b_tokens\", \"groups\",\n"
                "\"one_to_one\"} (minimal matching groups, docs/tokenizer.md); then a last line\n"
                "{\"total\": {...}} summing them, with the share of one-to-one groups.");
  flags.Required("a", &a_path, "FILE", "the first tokenizer.json");
  flags.Required("b", &b_path, "FILE", "the second tokenizer.json");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  std::unique_ptr<Tokenizer> tokenizers[2];
  const std::string* paths[2] = {&a_path, &b_path};
  for (int k = 0; k < 2; ++k) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromFile(*paths[k]);
    if (!t.ok()) {
      std::fprintf(stderr, "kvl align-tokens: %s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    tokenizers[k] = *std::move(t);
  }
  std::ios::sync_with_stdio(false);
  int64_t total[4] = {0, 0, 0, 0};  // a tokens, b tokens, groups, one to one
  std::string line;
  for (size_t line_no = 1; std::getline(std::cin, line); ++line_no) {
    const nlohmann::json in = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!in.is_string()) {
      std::fprintf(stderr, "kvl align-tokens: line %zu: expected a JSON string\n", line_no);
      return 1;
    }
    const std::string& text = in.get_ref<const std::string&>();
    std::vector<int64_t> lengths[2];
    int64_t n_tokens[2];
    for (int k = 0; k < 2; ++k) {
      const std::vector<int32_t> ids = tokenizers[k]->Encode(text);
      n_tokens[k] = static_cast<int64_t>(ids.size());
      absl::StatusOr<std::vector<int64_t>> l = TokenByteLengths(*tokenizers[k], ids, text);
      if (!l.ok()) {
        std::fprintf(stderr, "kvl align-tokens: line %zu: tokenizer %s: %s\n", line_no,
                     k == 0 ? "a" : "b", std::string(l.status().message()).c_str());
        return 1;
      }
      lengths[k] = *std::move(l);
    }
    absl::StatusOr<std::vector<AlignedGroup>> groups = AlignByBytes(lengths[0], lengths[1]);
    if (!groups.ok()) {
      std::fprintf(stderr, "kvl align-tokens: line %zu: %s\n", line_no,
                   std::string(groups.status().message()).c_str());
      return 1;
    }
    int64_t one_to_one = 0;
    for (const AlignedGroup& g : *groups) one_to_one += g.one_to_one();
    const int64_t row[4] = {n_tokens[0], n_tokens[1], static_cast<int64_t>(groups->size()),
                            one_to_one};
    for (int k = 0; k < 4; ++k) total[k] += row[k];
    std::cout << nlohmann::json{{"a_tokens", row[0]},
                                {"b_tokens", row[1]},
                                {"groups", row[2]},
                                {"one_to_one", row[3]}}
                     .dump()
              << '\n';
  }
  std::cout << nlohmann::json{{"total",
                               {{"a_tokens", total[0]},
                                {"b_tokens", total[1]},
                                {"groups", total[2]},
                                {"one_to_one", total[3]},
                                {"one_to_one_share",
                                 total[2] > 0 ? static_cast<double>(total[3]) / total[2] : 0.0}}}}
                   .dump()
            << '\n';
  return 0;
}

}  // namespace kvl::tools
