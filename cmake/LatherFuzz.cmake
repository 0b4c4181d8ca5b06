# lather_add_fuzzer(<name> <source> [<libraries>...])
#
# One libFuzzer harness (a source defining LLVMFuzzerTestOneInput), in one of two forms:
#   * LATHER_FUZZ=ON (clang): a libFuzzer program, -fsanitize=fuzzer,address,undefined, against a
#     liblather instrumented with -fsanitize=fuzzer-no-link,address,undefined (top CMakeLists.txt).
#     scripts/run-fuzzers runs it.
#   * otherwise: the harness linked with tests/fuzz/replay_main.cpp, which feeds it every file of
#     its corpus once, so any compiler replays the corpora without libFuzzer.
# Either way, with the tests on, ctest runs `<name>` (label `fuzz`) over the committed inputs:
#   tests/fuzz/seeds/<name>/   hand-written seeds, named for what they hold (required);
#   tests/fuzz/corpus/<name>/  what the fuzzer found, minimised with -merge=1 (scripts/run-fuzzers).
# Every input that once mattered keeps being checked on every run.
set(LATHER_FUZZ_SEEDS_DIR "${PROJECT_SOURCE_DIR}/tests/fuzz/seeds")
set(LATHER_FUZZ_CORPUS_DIR "${PROJECT_SOURCE_DIR}/tests/fuzz/corpus")

function(lather_add_fuzzer name source)
  set(seeds "${LATHER_FUZZ_SEEDS_DIR}/${name}")
  if(NOT IS_DIRECTORY "${seeds}")
    message(FATAL_ERROR "lather_add_fuzzer(${name}): no seed corpus ${seeds}")
  endif()
  set(corpus "${seeds}")
  if(IS_DIRECTORY "${LATHER_FUZZ_CORPUS_DIR}/${name}")
    list(APPEND corpus "${LATHER_FUZZ_CORPUS_DIR}/${name}")
  endif()
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE lather ${ARGN})
  if(LATHER_FUZZ)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    # libFuzzer replays a corpus directory and stops with -runs=0.
    set(replay_command $<TARGET_FILE:${name}> -runs=0 ${corpus})
  else()
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_main.cpp)
    set(replay_command $<TARGET_FILE:${name}> ${corpus})
  endif()
  if(LATHER_ENABLE_TESTS)
    add_test(NAME ${name} COMMAND ${replay_command})
    set_tests_properties(${name} PROPERTIES LABELS fuzz TIMEOUT 300)
  endif()
endfunction()
