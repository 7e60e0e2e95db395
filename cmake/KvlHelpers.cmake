# Shared warning flags for kvlingo's own targets (third-party headers are SYSTEM).
set(KVL_WARNINGS -Wall -Wextra -Werror -Wno-unused-parameter)

# kvl_library(<folder> SOURCES ... DEPS ...): one library per top-level folder,
# named kvl_<folder> with the alias kvl::<folder>.
function(kvl_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  if(ARG_SOURCES)
    add_library(kvl_${name} STATIC ${ARG_SOURCES})
    target_include_directories(kvl_${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_compile_options(kvl_${name} PRIVATE ${KVL_WARNINGS})
    target_link_libraries(kvl_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  else()
    add_library(kvl_${name} INTERFACE)
    target_include_directories(kvl_${name} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(kvl_${name} INTERFACE ${ARG_PUBLIC_DEPS})
  endif()
  add_library(kvl::${name} ALIAS kvl_${name})
endfunction()

# kvl_executable(<name> SOURCES ... DEPS ...): thin binaries that wire libraries.
# In a TSan build (KVL_SANITIZE=thread) every binary also links KVL_TSAN_SYNC,
# which shows TSan what Abseil's uninstrumented locks order.
function(kvl_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${KVL_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} ${KVL_TSAN_SYNC})
endfunction()

# kvl_test(<name> SOURCES ... DEPS ... [LABELS ...]): a GoogleTest binary whose
# cases are registered with ctest one by one. Tests run from the source tree root
# and see KVL_SOURCE_DIR / KVL_BINARY_DIR in their environment, and
# OMP_WAIT_POLICY=PASSIVE as kvl, kvl-server and the benchmarks set it for
# themselves (model/omp_wait.h).
function(kvl_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${KVL_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main ${KVL_TSAN_SYNC})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  # Sanitizers slow the code several times over (the training tests most), and
  # a per-test TIMEOUT is not overridden by ctest's --timeout: in a sanitizer
  # build every test gets three times its Release limit.
  if(NOT KVL_SANITIZE STREQUAL "")
    math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * 3")
  endif()
  # Discovery runs each binary with --gtest_list_tests as part of the build. It
  # takes under a second here, but a CI build once had the first two binaries
  # that load LibTorch time out at 60 s while listing (cause not found; the
  # same listing takes under a second on a cold page cache here). A binary that
  # truly hangs still fails the build, only later.
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DISCOVERY_TIMEOUT 600
    PROPERTIES
      TIMEOUT ${ARG_TIMEOUT}
      LABELS "${ARG_LABELS}"
      ENVIRONMENT
        "KVL_SOURCE_DIR=${PROJECT_SOURCE_DIR};KVL_BINARY_DIR=${PROJECT_BINARY_DIR};OMP_WAIT_POLICY=PASSIVE")
endfunction()

# kvl_link_closure(<target> <out-var>): every target <target> links, directly
# or through other targets (aliases resolved, generator expressions skipped).
function(kvl_link_closure target out)
  set(_seen)
  set(_todo ${target})
  while(_todo)
    list(POP_FRONT _todo _t)
    if(NOT TARGET ${_t})
      continue()
    endif()
    get_target_property(_aliased ${_t} ALIASED_TARGET)
    if(_aliased)
      set(_t ${_aliased})
    endif()
    if(_t IN_LIST _seen)
      continue()
    endif()
    list(APPEND _seen ${_t})
    get_target_property(_type ${_t} TYPE)
    set(_deps)
    if(NOT _type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(_direct ${_t} LINK_LIBRARIES)
      if(_direct)
        list(APPEND _deps ${_direct})
      endif()
    endif()
    get_target_property(_iface ${_t} INTERFACE_LINK_LIBRARIES)
    if(_iface)
      list(APPEND _deps ${_iface})
    endif()
    foreach(_d ${_deps})
      if(NOT _d MATCHES "^\\$<" AND TARGET ${_d})
        list(APPEND _todo ${_d})
      endif()
    endforeach()
  endwhile()
  set(${out} ${_seen} PARENT_SCOPE)
endfunction()

# kvl_forbid_links(<target> <forbidden>...): a configure-time error when
# <target>'s link closure holds any of <forbidden> (DESIGN: the server links no
# training or data-generation code).
function(kvl_forbid_links target)
  kvl_link_closure(${target} _closure)
  foreach(_f ${ARGN})
    if(_f IN_LIST _closure)
      message(FATAL_ERROR "${target} links ${_f} (through: ${_closure}); "
                          "training/ and datagen/ must stay out of the server")
    endif()
  endforeach()
endfunction()
