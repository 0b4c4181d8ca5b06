# cmake -DCOMMAND="a;b;c" -DEXPECT=<regex> [-DREJECT=<regex>] [-DEXIT_CODE=0] -P RunAndExpect.cmake
# Runs COMMAND; fails unless it exits with EXIT_CODE (default 0) and its output matches EXPECT
# (and does not match REJECT).
if(NOT DEFINED EXIT_CODE)
  set(EXIT_CODE 0)
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT code STREQUAL "${EXIT_CODE}")
  message(FATAL_ERROR "exit code ${code}, expected ${EXIT_CODE}")
endif()
if(DEFINED EXPECT AND NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}'")
endif()
if(DEFINED REJECT AND "${out}${err}" MATCHES "${REJECT}")
  message(FATAL_ERROR "output matches '${REJECT}'")
endif()
