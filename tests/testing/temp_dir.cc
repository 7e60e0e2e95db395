#include "tests/testing/temp_dir.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace kvl::testing {
namespace fs = std::filesystem;

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/kvl-" + prefix + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    std::perror(("TempDir: mkdtemp " + pattern).c_str());
    std::abort();
  }
  path_ = buffer.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string TempDir::Path(const std::string& relative) const {
  return (fs::path(path_) / relative).string();
}

std::string TempDir::WriteFile(const std::string& relative, const std::string& contents) const {
  const fs::path full = fs::path(path_) / relative;
  fs::create_directories(full.parent_path());
  std::ofstream out(full, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) {
    std::perror(("TempDir: write " + full.string()).c_str());
    std::abort();
  }
  return full.string();
}

std::string TempDir::MakeDir(const std::string& relative) const {
  const fs::path full = fs::path(path_) / relative;
  fs::create_directories(full);
  return full.string();
}

}  // namespace kvl::testing
