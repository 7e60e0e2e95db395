// The house tokenizer (models/tokenizer/tokenizer.json, byte-level BPE with an
// NFC normalizer) on arbitrary bytes. The first byte picks the mode, the rest
// is the input.
//   even: the input is text. Encode never yields an unknown id; decoding
//         re-encodes to the same ids (encode is stable on its own output);
//         without added-token markup ('<'), Decode(Encode(text)) is the NFC of
//         the text with invalid UTF-8 replaced (the round trip loses nothing
//         else); streaming the ids equals decoding them at once.
//   odd:  the input is ids (little-endian 16-bit, some past the vocabulary).
//         Decode skips unknown ids and is valid UTF-8; streaming equals it.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/text_normalize.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const kvl::Tokenizer* tokenizer = nullptr;

bool IsValidUtf8(const std::string& s) {
  std::string repaired;
  kvl::AppendUtf8Lossy(s, /*final=*/true, &repaired);
  return repaired == s;
}

std::string Streamed(absl::Span<const int32_t> ids, bool skip_special) {
  kvl::StreamDecoder stream(*tokenizer, skip_special);
  std::string out;
  for (int32_t id : ids) out += stream.Push(id);
  return out + stream.Flush();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string path = std::string(KVL_SOURCE_DIR) + "/models/tokenizer/tokenizer.json";
  auto loaded = kvl::Tokenizer::FromFile(path);
  if (!loaded.ok()) kvl::fuzz::Violated("cannot load " + path + ": " + loaded.status().ToString());
  tokenizer = loaded->release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool flag = (mode & 2) != 0;  // parse_special / skip_special

  if (mode % 2 == 0) {
    const std::vector<int32_t> ids = tokenizer->Encode(input, /*parse_special=*/flag);
    for (int32_t id : ids) {
      KVL_FUZZ_CHECK(id >= 0 && id < tokenizer->vocab_size() && tokenizer->IdToToken(id),
                     "Encode yielded an unknown id " + std::to_string(id));
    }
    const std::string decoded = tokenizer->Decode(ids);
    KVL_FUZZ_CHECK(IsValidUtf8(decoded), "Decode is not valid UTF-8");
    KVL_FUZZ_CHECK(tokenizer->Encode(decoded, flag) == ids,
                   "Encode(Decode(Encode(x))) != Encode(x) for input of " +
                       std::to_string(input.size()) + " bytes");
    if (input.find('<') == std::string_view::npos) {
      std::string repaired;
      kvl::AppendUtf8Lossy(input, /*final=*/true, &repaired);
      KVL_FUZZ_CHECK(decoded == kvl::Nfc(repaired), "Decode(Encode(x)) != NFC(x)");
    }
    KVL_FUZZ_CHECK(Streamed(ids, false) == decoded, "streamed decode != Decode");
  } else {
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < input.size(); i += 2) {
      ids.push_back(static_cast<uint8_t>(input[i]) | (static_cast<uint8_t>(input[i + 1]) << 8));
    }
    const std::string decoded = tokenizer->Decode(ids, /*skip_special=*/flag);
    KVL_FUZZ_CHECK(IsValidUtf8(decoded), "Decode of ids is not valid UTF-8");
    KVL_FUZZ_CHECK(Streamed(ids, flag) == decoded, "streamed decode of ids != Decode");
  }
  return 0;
}
