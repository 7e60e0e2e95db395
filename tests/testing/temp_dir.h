// A fresh directory for one test, removed with everything in it on destruction.
#pragma once

#include <string>

namespace kvl::testing {

class TempDir {
 public:
  // Created under $TMPDIR (or /tmp) as kvl-<prefix>-XXXXXX. Aborts the test
  // binary if that fails: no test can proceed without it.
  explicit TempDir(const std::string& prefix = "test");
  ~TempDir();

  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/relative.
  std::string Path(const std::string& relative) const;
  // Writes `contents` to path()/relative, creating parent directories; returns
  // the full path. Aborts on failure.
  std::string WriteFile(const std::string& relative, const std::string& contents) const;
  // Creates path()/relative (and parents); returns the full path.
  std::string MakeDir(const std::string& relative) const;

 private:
  std::string path_;
};

}  // namespace kvl::testing
