# Fails unless PROGRAM's --gtest_list_tests, for the driver's suites (FILTER, a --gtest_filter),
# names exactly the cases in the file CASES (one GoogleTest full name a line): the entries
# wd_add_launch_test registered from the driver's sources.
# Usage: cmake -DPROGRAM=<program> -DFILTER=<filter> -DCASES=<file> -P check_cases.cmake
execute_process(COMMAND ${PROGRAM} --gtest_list_tests --gtest_filter=${FILTER} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests exited with ${rc}:\n${out}")
endif()
# "Suite." (or "Prefix/Suite.") on its own line, then "  Case" or "  Case/param  # GetParam() = ..."
string(REPLACE "\n" ";" lines "${out}")
set(listed)
set(suite)
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.")
    set(suite ${CMAKE_MATCH_1})
  elseif(line MATCHES "^  ([A-Za-z0-9_/]+)")
    list(APPEND listed "${suite}.${CMAKE_MATCH_1}")
  endif()
endforeach()
file(STRINGS ${CASES} registered)
set(missing ${listed})
list(REMOVE_ITEM missing ${registered})
set(stale ${registered})
list(REMOVE_ITEM stale ${listed})
if(missing OR stale)
  foreach(v missing stale)
    if(${v})
      list(JOIN ${v} "\n  " ${v})
    else()
      set(${v} "(none)")
    endif()
  endforeach()
  message(FATAL_ERROR "the CTest entries of ${PROGRAM} differ from its cases "
    "(tests/launch/CMakeLists.txt, wd_add_launch_test):\n"
    "cases without an entry:\n  ${missing}\nentries without a case:\n  ${stale}\n")
endif()
list(LENGTH listed n)
message(STATUS "${n} cases, one CTest entry each")
