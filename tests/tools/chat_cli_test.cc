// kvl chat against the real kvl-server serving the committed house models:
// the answer goes to stdout, one status line per turn to stderr naming the
// model, the switch and the cache path; a pinned model switch is translated.
#include <chrono>
#include <csignal>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using namespace std::chrono_literals;

TEST(ChatCliTest, TurnsStreamAndAPinnedSwitchIsTranslated) {
  const std::string src = KVL_SOURCE_DIR;
  testing::TempDir dir("chat-cli");
  const nlohmann::json config = {
      {"runtime", {{"threads", 1}}},
      {"models",
       {{{"name", "kvl-small"}, {"path", src + "/models/kvl-small"}},
        {{"name", "kvl-large"}, {"path", src + "/models/kvl-large"}}}},
      {"translators",
       {{{"source", "kvl-small"},
         {"target", "kvl-large"},
         {"path", src + "/models/translators/kvl-small__kvl-large.safetensors"}}}},
      // Turn 1 is a few words: a tail shorter than it, so that the switch
      // translates (the default, 32, would re-read all of it).
      {"routing", {{"policy", "fixed"}, {"default_model", "kvl-small"}, {"native_tail_tokens", 4}}}};
  const std::string config_path = dir.WriteFile("server.json", config.dump(2));
  auto port = testing::FindFreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string address = "127.0.0.1:" + std::to_string(*port);
  auto server = testing::Subprocess::Start({KVL_SERVER_BIN, "--config", config_path, "--listen",
                                            address, "--metrics-address", "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->WaitForLine(testing::Stream::kStdout, "listening on", 60s).ok())
      << (*server)->Describe();

  // Turn 1 on the fixed model, then '/model' pins kvl-large: turn 2 switches
  // and the history kvl-small wrote is translated.
  const std::string script = "printf 'Hello there.\\n/model kvl-large\\nAnd now?\\n/quit\\n' | '" +
                             std::string(KVL_CLI_BIN) + "' chat --server " + address +
                             " --max-tokens 4";
  auto run = testing::RunProcess({"/bin/sh", "-c", script}, 120s);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_NE(run->err.find("[kvl-small | no switch | native cache"), std::string::npos) << run->err;
  EXPECT_NE(run->err.find("[kvl-large | switch kvl-small -> kvl-large | translated cache"),
            std::string::npos)
      << run->err;
  EXPECT_TRUE(std::regex_search(run->err, std::regex(R"(TTFT [0-9]+\.[0-9] ms)"))) << run->err;
  // Two answers, one line each, on stdout.
  EXPECT_EQ(std::count(run->out.begin(), run->out.end(), '\n'), 2) << run->out;

  // An unknown session is the server's NOT_FOUND, reported in one line.
  auto missing = testing::RunProcess(
      {KVL_CLI_BIN, "chat", "--server", address, "--session", "no-such-session"}, 60s);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->exit_code, 1);
  EXPECT_NE(missing->err.find("kvl chat: " + address), std::string::npos) << missing->err;

  ASSERT_TRUE((*server)->Signal(SIGTERM).ok());
  auto code = (*server)->Wait(30s);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << (*server)->Describe();
}

}  // namespace
}  // namespace kvl
