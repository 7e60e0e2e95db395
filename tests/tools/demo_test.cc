// The README's main job, scripts/run_demo.sh, on the committed house models and
// translators: the server starts, the scripted chat runs through the gRPC API,
// the cascade keeps the first turns on kvl-small and escalates mid-conversation
// with a translated hand-over, one line says the models are tiny house models
// with their accuracy from the committed results, and the server drains
// cleanly on SIGTERM.
// Guards the demo against a retrained model or a changed threshold that would
// make it escalate at once, never, or not by translation.
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"

namespace kvl {
namespace {

using namespace std::chrono_literals;

struct TurnRow {
  int turn = 0;
  std::string model, path, switched;
};

// Rows of the demo's table: "   4  kvl-large    translated  yes   ...".
std::vector<TurnRow> ParseTurns(const std::string& out) {
  std::vector<TurnRow> rows;
  const std::regex row(R"(^\s*([0-9]+)\s+(\S+)\s+(native|translated|reprefill)\s+(yes|no)\s)");
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) {
      rows.push_back({std::stoi(m[1].str()), m[2].str(), m[3].str(), m[4].str()});
    }
  }
  return rows;
}

TEST(DemoTest, CascadeEscalatesMidConversationByTranslation) {
  auto grpc_port = testing::FindFreeLoopbackPort();
  ASSERT_TRUE(grpc_port.ok()) << grpc_port.status();
  auto metrics_port = testing::FindFreeLoopbackPort();
  ASSERT_TRUE(metrics_port.ok()) << metrics_port.status();
  auto http_port = testing::FindFreeLoopbackPort();
  ASSERT_TRUE(http_port.ok()) << http_port.status();
  testing::SubprocessOptions options;
  options.cwd = KVL_SOURCE_DIR;
  options.env = {{"KVL_SKIP_SETUP", "1"},
                 {"KVL_BUILD_DIR", KVL_BINARY_DIR},
                 {"KVL_LISTEN", "127.0.0.1:" + std::to_string(*grpc_port)},
                 {"KVL_METRICS", "127.0.0.1:" + std::to_string(*metrics_port)},
                 {"KVL_HTTP", "127.0.0.1:" + std::to_string(*http_port)}};
  auto run = testing::RunProcess({"bash", "scripts/run_demo.sh"}, 300s, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->out << run->err;
  EXPECT_NE(run->out.find("kvl-server exited with status 0 after SIGTERM"), std::string::npos)
      << run->out;

  EXPECT_TRUE(std::regex_search(
      run->out, std::regex(R"(tiny house models.* kvl-small \(\d+\.\d M parameters\) \d+-\d+%.*)"
                           R"(\(docs/results/house_models\.json\))")))
      << run->out;

  const std::vector<TurnRow> rows = ParseTurns(run->out);
  ASSERT_GE(rows.size(), 3u) << run->out;
  EXPECT_EQ(rows.front().model, "kvl-small") << run->out;
  EXPECT_EQ(rows.front().switched, "no") << run->out;
  int escalations = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].switched != "yes") continue;
    ++escalations;
    EXPECT_EQ(rows[i].model, "kvl-large") << run->out;
    EXPECT_EQ(rows[i].path, "translated") << run->out;
    // The cascade never goes back down: every later turn stays on kvl-large.
    for (size_t j = i; j < rows.size(); ++j) EXPECT_EQ(rows[j].model, "kvl-large") << run->out;
  }
  EXPECT_EQ(escalations, 1) << run->out;
  // The metrics excerpt shows a translated first token on kvl-large.
  EXPECT_TRUE(std::regex_search(
      run->out, std::regex(R"(kvlingo_time_to_first_token_seconds_count\{model="kvl-large",path="translated"\} [1-9])")))
      << run->out;
  // Background repair recomputed kvl-large's translated line after the switch
  // and scored the switch turn's reply on it.
  EXPECT_TRUE(std::regex_search(run->out, std::regex(R"(kvlingo_repairs_total\{model="kvl-large"\} [1-9])")))
      << run->out;
  EXPECT_TRUE(std::regex_search(
      run->out,
      std::regex(R"(kvlingo_switch_divergence_nats_count\{source="kvl-small",target="kvl-large"\} [1-9])")))
      << run->out;
  EXPECT_NE(run->out.find("kvlingo_repair_backlog_lines 0"), std::string::npos) << run->out;
  // GetSession's provenance: kvl-large's line starts with what repair
  // recomputed natively in place of the translation from kvl-small.
  EXPECT_TRUE(std::regex_search(run->out, std::regex(R"(  kvl-large: \d+ tokens: \[0, \d+\) repaired)")))
      << run->out;

  // The OpenAI API part: four stateless requests alternating the models; the
  // first prefills, the first switch (kvl-small's long first turn) is
  // translated, and every later one reuses the answering model's own cache.
  const size_t api = run->out.find("The OpenAI API: one stateless conversation");
  ASSERT_NE(api, std::string::npos) << run->out;
  const std::string part = run->out.substr(api);
  EXPECT_TRUE(std::regex_search(part, std::regex(R"(\n +1  kvl-small +native +0 +0 +[1-9])")))
      << part;
  EXPECT_TRUE(std::regex_search(part, std::regex(R"(\n +2  kvl-large +translated +0 +[1-9]\d{2,})")))
      << part;
  EXPECT_TRUE(std::regex_search(part, std::regex(R"(\n +4  kvl-large +\S+ +[1-9]\d{2,} )")))
      << part;
}

}  // namespace
}  // namespace kvl
