// model/utf8.h: the one UTF-8 validator (the tokenizer's and the server's),
// checked on Unicode's boundary cases, and against the repair
// (AppendUtf8Lossy): text is valid exactly when repair leaves it unchanged.
#include "model/utf8.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "model/tokenizer.h"

namespace kvl {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("ascii"));
  EXPECT_TRUE(IsValidUtf8("\xC2\x80"));              // U+0080
  EXPECT_TRUE(IsValidUtf8("\xED\x9F\xBF"));          // U+D7FF
  EXPECT_TRUE(IsValidUtf8("\xEE\x80\x80"));          // U+E000
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));      // U+10FFFF
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));  // NUL is a valid code point
}

TEST(Utf8Test, RejectsMalformedTextAndReportsTheOffset) {
  struct Case {
    std::string text;
    size_t offset;
  };
  const Case cases[] = {
      {"ab\x80", 2},                // lone continuation byte
      {"a\xC0\xAF", 1},             // overlong '/'
      {"\xE0\x80\xAF", 0},          // overlong, 3 bytes
      {"xy\xED\xA0\x80", 2},        // surrogate U+D800
      {"\xF4\x90\x80\x80", 0},      // above U+10FFFF
      {"\xF8\x88\x80\x80\x80", 0},  // 5-byte form
      {"ok\xE4\xB8", 2},            // truncated
      {"\xC3\x28", 0},              // bad continuation
  };
  for (const Case& c : cases) {
    size_t offset = 999;
    EXPECT_FALSE(IsValidUtf8(c.text, &offset)) << ::testing::PrintToString(c.text);
    EXPECT_EQ(offset, c.offset) << ::testing::PrintToString(c.text);
  }
}

TEST(Utf8Test, ValidExactlyWhenRepairLeavesTheTextUnchanged) {
  // Short strings over the bytes where the rules change (ASCII, continuation
  // bytes, each lead-byte range's edges), so that every rule is hit.
  const uint8_t kBytes[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1,
                            0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3,
                            0xF4, 0xF5, 0xFF};
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> pick(0, sizeof(kBytes) - 1);
  std::uniform_int_distribution<int> length(0, 6);
  int n_valid = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text;
    for (int i = length(rng); i > 0; --i) text.push_back(static_cast<char>(kBytes[pick(rng)]));
    std::string repaired;
    AppendUtf8Lossy(text, /*final=*/true, &repaired);
    const bool valid = IsValidUtf8(text);
    EXPECT_EQ(valid, repaired == text) << ::testing::PrintToString(text);
    n_valid += valid;
  }
  EXPECT_GT(n_valid, 1000);  // both outcomes were exercised
}

}  // namespace
}  // namespace kvl
