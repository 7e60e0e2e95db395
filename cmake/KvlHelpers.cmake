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

# kvl_test(<name> SOURCES ... DEPS ... [LABELS ...] [TIER fast|slow]
#          [SLOW_CASES <gtest filter>] [TIMEOUT <s>]): a GoogleTest binary whose
# cases are registered with ctest one by one, each labelled with LABELS and
# its tier (docs/testing.md, "Tiers"): TIER (default fast) for every case, or,
# with SLOW_CASES, slow for the cases the filter selects and fast for the rest.
# Tests run from the source tree root and see KVL_SOURCE_DIR / KVL_BINARY_DIR
# in their environment, and OMP_WAIT_POLICY=PASSIVE as kvl, kvl-server and the
# benchmarks set it for themselves (model/omp_wait.h).
function(kvl_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;TIER;SLOW_CASES" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${KVL_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main ${KVL_TSAN_SYNC})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  if(NOT ARG_TIER)
    set(ARG_TIER fast)
  endif()
  if(NOT ARG_TIER MATCHES "^(fast|slow)$")
    message(FATAL_ERROR "kvl_test(${name}): TIER must be fast or slow, got '${ARG_TIER}'")
  endif()
  # Sanitizers slow the code several times over (the training tests most), and
  # a per-test TIMEOUT is not overridden by ctest's --timeout: in a sanitizer
  # build every test gets three times its Release limit.
  if(NOT KVL_SANITIZE STREQUAL "")
    math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * 3")
  endif()
  if(ARG_SLOW_CASES)
    _kvl_discover_tests(${name} fast "-${ARG_SLOW_CASES}" "${ARG_LABELS}" ${ARG_TIMEOUT})
    _kvl_discover_tests(${name} slow "${ARG_SLOW_CASES}" "${ARG_LABELS}" ${ARG_TIMEOUT})
  else()
    _kvl_discover_tests(${name} ${ARG_TIER} "" "${ARG_LABELS}" ${ARG_TIMEOUT})
  endif()
endfunction()

# The cases of <name> that <filter> selects (all when empty), registered when
# ctest runs (DISCOVERY_MODE PRE_TEST): building never runs a test binary.
# (Listing them at build time once timed out at 60 s for the first two binaries
# that load LibTorch on a CI machine; the cause was not found.) ctest lists a
# binary again only when it is newer than its last listing. A binary that
# cannot list its cases stops ctest with an error naming it.
# The properties are set by an include file of our own, run after the
# listing: CMake 3.25's PRE_TEST mode writes a list-valued PROPERTIES entry
# (LABELS "a;b", ENVIRONMENT) unquoted, which splits it.
function(_kvl_discover_tests name tier filter labels timeout)
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 600
    TEST_FILTER "${filter}"
    TEST_LIST ${name}_${tier}_TESTS)
  set(_labels ${labels} ${tier})
  set(_env KVL_SOURCE_DIR=${PROJECT_SOURCE_DIR} KVL_BINARY_DIR=${PROJECT_BINARY_DIR}
           OMP_WAIT_POLICY=PASSIVE)
  set(_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_${tier}_properties.cmake)
  file(WRITE ${_file}
    "foreach(_t IN LISTS ${name}_${tier}_TESTS)\n"
    "  set_tests_properties(\"\${_t}\" PROPERTIES TIMEOUT ${timeout}\n"
    "    LABELS \"${_labels}\" ENVIRONMENT \"${_env}\")\n"
    "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_file})
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
