// `kvl tokenize`: JSON lines in, JSON lines out, one output line per input line.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "base/flags.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace kvl::tools {

int RunTokenize(const Args& args) {
  std::string tokenizer_path;
  bool decode = false;
  bool no_special = false;
  FlagSet flags("kvl tokenize",
                "Encode (default): reads one JSON string per line on stdin and writes one JSON\n"
                "array of token ids per line.\n"
                "Decode (--decode): reads one JSON array of ids per line and writes one JSON\n"
                "string per line.");
  flags.Required("tokenizer", &tokenizer_path, "FILE",
                 "a Hugging Face tokenizer.json (byte-level BPE)");
  flags.Switch("decode", &decode, "ids -> text instead of text -> ids");
  flags.Switch("no-special", &no_special,
               "encode: special tokens such as <|im_end|> are plain text; decode: leave them out");
  if (std::optional<int> exit = flags.ParseOrExit(args)) return *exit;
  const bool special = !no_special;

  auto tokenizer = Tokenizer::FromFile(tokenizer_path);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "kvl tokenize: %s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  const Tokenizer& tok = **tokenizer;

  std::ios::sync_with_stdio(false);
  std::string line;
  std::vector<int32_t> ids;
  for (size_t line_no = 1; std::getline(std::cin, line); ++line_no) {
    const nlohmann::json in = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!decode) {
      if (!in.is_string()) {
        std::fprintf(stderr, "kvl tokenize: line %zu: expected a JSON string\n", line_no);
        return 1;
      }
      ids.clear();
      tok.EncodeTo(in.get_ref<const std::string&>(), special, &ids);
      std::cout << nlohmann::json(ids).dump() << '\n';
    } else {
      bool ok = in.is_array();
      ids.clear();
      for (size_t k = 0; ok && k < in.size(); ++k) {
        ok = in[k].is_number_integer() && in[k].get<int64_t>() >= 0 &&
             in[k].get<int64_t>() <= INT32_MAX;
        if (ok) ids.push_back(static_cast<int32_t>(in[k].get<int64_t>()));
      }
      if (!ok) {
        std::fprintf(stderr, "kvl tokenize: line %zu: expected a JSON array of token ids\n",
                     line_no);
        return 1;
      }
      // Invalid UTF-8 was already replaced by U+FFFD, so dump() cannot throw.
      std::cout << nlohmann::json(tok.Decode(ids, /*skip_special=*/!special)).dump() << '\n';
    }
    std::cout.flush();
  }
  return 0;
}

}  // namespace kvl::tools
