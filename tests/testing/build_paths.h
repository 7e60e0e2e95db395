// Where this clone and its build are, for the tests and the fuzz targets:
// KVL_SOURCE_DIR (the source tree), KVL_BINARY_DIR (the build dir),
// KVL_SERVER_BIN and KVL_CLI_BIN (kvl-server and kvl in it), each a
// NUL-terminated `const char[]` (not a string literal: no literal
// concatenation).
//
// The values live in one file generated at configure time
// (BUILD/tests/build_paths.cc); every target that uses them gets this header
// as a forced include (tests/CMakeLists.txt). As -D flags they were part of
// every test's compile command, and ccache hashes those: a clone in another
// folder missed the cache for every test source. Now only the generated file
// compiles again.
#pragma once

namespace kvl::testing::build_paths {

extern const char kSourceDir[];
extern const char kBinaryDir[];
extern const char kServerBin[];
extern const char kCliBin[];

}  // namespace kvl::testing::build_paths

#define KVL_SOURCE_DIR (::kvl::testing::build_paths::kSourceDir)
#define KVL_BINARY_DIR (::kvl::testing::build_paths::kBinaryDir)
#define KVL_SERVER_BIN (::kvl::testing::build_paths::kServerBin)
#define KVL_CLI_BIN (::kvl::testing::build_paths::kCliBin)
