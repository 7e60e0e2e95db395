# Every third-party dependency comes from Debian 12's packages (scripts/setup.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

# Debian's LibTorch (CPU) by default; another one, e.g. an upstream CUDA build,
# with -DTorch_DIR=<libtorch>/share/cmake/Torch (deploy/README.md, "GPU").
find_package(Torch REQUIRED)
option(KVL_REQUIRE_CUDA "Fail the configure unless the LibTorch found has CUDA" OFF)
if(CAFFE2_USE_CUDA)
  message(STATUS "LibTorch ${Torch_VERSION} at ${Torch_DIR}: with CUDA (runtime.device cuda works)")
elseif(KVL_REQUIRE_CUDA)
  message(FATAL_ERROR "KVL_REQUIRE_CUDA: the LibTorch at ${Torch_DIR} has no CUDA; "
                      "pass -DTorch_DIR=<a CUDA LibTorch>/share/cmake/Torch")
else()
  message(STATUS "LibTorch ${Torch_VERSION} at ${Torch_DIR}: CPU only")
endif()
# One interface target for LibTorch, with SYSTEM includes so that -Werror
# applies to kvlingo's code only.
add_library(kvl_torch INTERFACE)
target_link_libraries(kvl_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(kvl_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
separate_arguments(_kvl_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(kvl_torch INTERFACE ${_kvl_torch_flags})
# LibTorch's intra-op threads are libgomp's; model/engine.cc sets a thread's
# OpenMP thread count directly (SerialIntraOpScope). It links the runtime only:
# no -fopenmp, so that ATen's inline parallel_for compiles the same way in
# every folder.
# Clang's FindOpenMP result would be LLVM's libomp: point it at libgomp.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND NOT OpenMP_CXX_FLAGS)
  execute_process(COMMAND gcc -print-file-name=libgomp.so
                  OUTPUT_VARIABLE _kvl_gomp OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(OpenMP_CXX_FLAGS "-fopenmp=libgomp" CACHE STRING "")
  set(OpenMP_CXX_LIB_NAMES "gomp" CACHE STRING "")
  set(OpenMP_gomp_LIBRARY "${_kvl_gomp}" CACHE FILEPATH "")
endif()
find_package(OpenMP REQUIRED COMPONENTS CXX)
if(NOT OpenMP_CXX_LIBRARIES MATCHES "gomp")
  message(FATAL_ERROR "kvlingo expects GNU libgomp, the OpenMP runtime of Debian's "
                      "LibTorch; CMake found: ${OpenMP_CXX_LIBRARIES}")
endif()

find_package(OpenSSL REQUIRED)  # libcrypto: random API keys (kvl hash-key --generate)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_program(KVL_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
if(KVL_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
  include(GoogleTest)
endif()
if(KVL_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()

pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)

# The tests run these as oracles and clients; a test never skips for want of
# one (scripts/setup.sh installs them), so a missing one stops the configure.
# KVL_TEST_TOOLS=OFF: a build of the tests that run none of them (the device
# tests scripts/gpu_check.sh builds on a GPU machine without them).
option(KVL_TEST_TOOLS "Require the programs the whole suite runs (promtool, node, redis, ...)" ON)
if(KVL_BUILD_TESTS AND KVL_TEST_TOOLS)
  find_program(KVL_PROMTOOL promtool REQUIRED)
  find_program(KVL_PROMETHEUS prometheus REQUIRED)
  find_program(KVL_NODE node REQUIRED)
  find_program(KVL_SYSTEM_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH REQUIRED)
  find_program(KVL_REDIS_SERVER redis-server REQUIRED)
  find_program(KVL_NGINX nginx PATHS /usr/sbin REQUIRED)
  find_program(KVL_DOCKER_COMPOSE docker-compose REQUIRED)
endif()
