// ReexecWithPassiveOpenMpWait: unset OMP_WAIT_POLICY -> the program runs again
// with PASSIVE (same argv); an explicit value is left alone. The re-executed
// program is this test binary, filtered to this test, which reports the
// variable it sees to a file.
#include "model/omp_wait.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"

namespace kvl {
namespace {

constexpr char kReportVar[] = "KVL_OMP_WAIT_TEST_REPORT";
constexpr char kFilter[] = "--gtest_filter=OmpWaitTest.UnsetPolicyReexecutesWithPassive";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Forks; the child sets up the environment, calls the function and, if it
// returns, writes "returned" and exits 0. Returns the child's exit status.
int RunChild(const char* policy, const std::string& report) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (policy == nullptr) {
      unsetenv("OMP_WAIT_POLICY");
    } else {
      setenv("OMP_WAIT_POLICY", policy, 1);
    }
    setenv(kReportVar, report.c_str(), 1);
    std::string self = "/proc/self/exe", filter = kFilter;
    char* argv[] = {self.data(), filter.data(), nullptr};
    ReexecWithPassiveOpenMpWait(argv);
    std::ofstream(report) << "returned";
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(OmpWaitTest, UnsetPolicyReexecutesWithPassive) {
  if (const char* report = std::getenv(kReportVar)) {  // the re-executed child
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    std::ofstream(report) << "policy=" << (policy ? policy : "(unset)");
    return;
  }
  kvl::testing::TempDir dir("omp-wait");
  const std::string report = dir.Path("report.txt");
  ASSERT_EQ(RunChild(nullptr, report), 0);
  EXPECT_EQ(ReadAll(report), "policy=PASSIVE");
}

TEST(OmpWaitTest, ExplicitPolicyIsRespected) {
  kvl::testing::TempDir dir("omp-wait");
  for (const char* policy : {"ACTIVE", "PASSIVE", ""}) {
    const std::string report = dir.Path(std::string("report-") + policy + ".txt");
    ASSERT_EQ(RunChild(policy, report), 0);
    EXPECT_EQ(ReadAll(report), "returned") << "OMP_WAIT_POLICY=" << policy;
  }
}

}  // namespace
}  // namespace kvl
