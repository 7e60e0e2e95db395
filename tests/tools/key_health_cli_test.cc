// kvl hash-key (checked against coreutils' sha256sum), kvl chat's warning for
// a key sent over plaintext, and kvl health (against a kvl-server without
// models, and against a port nobody listens on).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "absl/strings/ascii.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

using namespace std::chrono_literals;

std::string Bash(const std::string& script) {
  absl::StatusOr<testing::RunResult> run = testing::RunProcess({"bash", "-c", script}, 60s);
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return "";
  EXPECT_EQ(run->exit_code, 0) << run->err;
  return std::string(absl::StripAsciiWhitespace(run->out));
}

TEST(HashKeyCliTest, PrintsTheSha256OfTheKeyReadFromStdin) {
  const std::string cli = KVL_CLI_BIN;
  const std::string hash = Bash("printf 'kvl-secret-1\\n' | " + cli + " hash-key");
  EXPECT_EQ(hash.size(), 64u);
  EXPECT_EQ(hash, Bash("printf 'kvl-secret-1' | sha256sum | cut -c1-64"));
}

TEST(HashKeyCliTest, GenerateGivesAFreshKeyOnStderrAndItsHashOnStdout) {
  absl::StatusOr<testing::RunResult> run = testing::RunProcess({KVL_CLI_BIN, "hash-key", "--generate"}, 30s);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->err;
  const std::string key(absl::StripAsciiWhitespace(run->err));
  EXPECT_GE(key.size(), 40u);
  EXPECT_EQ(std::string(absl::StripAsciiWhitespace(run->out)),
            Bash("printf '%s' '" + key + "' | sha256sum | cut -c1-64"));
  absl::StatusOr<testing::RunResult> empty = testing::RunProcess(
      {"bash", "-c", std::string(KVL_CLI_BIN) + " hash-key </dev/null"}, 30s);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->exit_code, 2);  // no key on stdin
}

// kvl chat sends $KVL_API_KEY with every call; over plaintext it says so on
// stderr (the key is readable on the path). Nobody listens on the port, so
// the call fails fast after the warning.
TEST(ChatKeyCliTest, AKeySentOverPlaintextIsWarnedAbout) {
  testing::TempDir dir("chat-key");
  absl::StatusOr<int> port = testing::FindFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  const std::string chat = std::string(KVL_CLI_BIN) + " chat --server 127.0.0.1:" +
                           std::to_string(*port) + " --session s </dev/null";
  const std::string warning = "warning: sending KVL_API_KEY over plaintext";
  auto run = [](const std::string& script) {
    absl::StatusOr<testing::RunResult> r = testing::RunProcess({"bash", "-c", script}, 60s);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->err : std::string();
  };
  EXPECT_THAT(run("KVL_API_KEY=k-1 " + chat), ::testing::HasSubstr(warning));
  EXPECT_THAT(run("env -u KVL_API_KEY " + chat), ::testing::Not(::testing::HasSubstr(warning)));
  const std::string ca = dir.WriteFile("ca.pem", "not checked before the handshake\n");
  EXPECT_THAT(run("KVL_API_KEY=k-1 " + chat + " --ca " + ca),
              ::testing::Not(::testing::HasSubstr(warning)));
}

TEST(HealthCliTest, ServingIsExitZeroAndNoServerIsExitOne) {
  testing::TempDir dir("health");
  const std::string config = dir.WriteFile("server.json", R"({"models": []})");
  absl::StatusOr<int> port = testing::FindFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  const std::string address = "127.0.0.1:" + std::to_string(*port);
  auto server = testing::Subprocess::Start({KVL_SERVER_BIN, "--config", config, "--listen", address,
                                            "--metrics-address", "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->WaitForLine(testing::Stream::kStdout, "listening on", 30s).ok());
  absl::StatusOr<testing::RunResult> ok =
      testing::RunProcess({KVL_CLI_BIN, "health", "--server", address}, 30s);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->exit_code, 0) << ok->err;
  EXPECT_EQ(ok->out, "SERVING\n");
  absl::StatusOr<testing::RunResult> service = testing::RunProcess(
      {KVL_CLI_BIN, "health", "--server", address, "--service", "kvlingo.v1.ChatService"}, 30s);
  ASSERT_TRUE(service.ok());
  EXPECT_EQ(service->exit_code, 0) << service->err;

  absl::StatusOr<int> idle = testing::FindFreeLoopbackPort();
  ASSERT_TRUE(idle.ok());
  absl::StatusOr<testing::RunResult> down = testing::RunProcess(
      {KVL_CLI_BIN, "health", "--server", "127.0.0.1:" + std::to_string(*idle), "--timeout-ms",
       "500"},
      30s);
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->exit_code, 1);
  EXPECT_THAT(down->err, ::testing::HasSubstr("kvl health: 127.0.0.1:"));
}

}  // namespace
}  // namespace kvl
