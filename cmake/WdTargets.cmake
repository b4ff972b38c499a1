# Shared target helpers: one INTERFACE target for warnings and flags, one precompiled header
# for <torch/torch.h>, and the helpers every folder uses to declare its library and its tests.

add_library(wd_warnings INTERFACE)
target_compile_options(wd_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>)

# WD_SANITIZE=address (launch/asan.sh): every target links wd_warnings, so all of our code is
# instrumented; the prebuilt LibTorch, HDF5 and MPI are not, which ASan tolerates (README).
if(WD_SANITIZE)
  target_compile_options(wd_warnings INTERFACE -fsanitize=${WD_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(wd_warnings INTERFACE -fsanitize=${WD_SANITIZE})
endif()

# One object library owns the precompiled torch header; every target reuses it. A fuzz tree
# (WD_FUZZ) has no Torch and no use for it.
if(NOT WD_FUZZ)
  add_library(wd_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/pch_anchor.cpp)
  target_link_libraries(wd_pch PUBLIC torch PRIVATE wd_warnings)
  if(WD_USE_PCH)
    target_precompile_headers(wd_pch PRIVATE <torch/torch.h>)
  endif()
endif()

# wd_add_library(NAME wd_core SOURCES ... PUBLIC_LIBS ... PRIVATE_LIBS ...)
function(wd_add_library)
  cmake_parse_arguments(A "" "NAME" "SOURCES;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  add_library(${A_NAME} STATIC ${A_SOURCES})
  target_include_directories(${A_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${A_NAME} PUBLIC ${A_PUBLIC_LIBS} PRIVATE ${A_PRIVATE_LIBS} wd_warnings)
  wd_use_pch(${A_NAME})
  wd_use_unity(${A_NAME})
endfunction()

# Compiles TARGET's sources in unity batches of WD_UNITY_BATCH (option WD_UNITY): the sources
# of a batch share one translation unit, so they must not define the same internal names.
function(wd_use_unity TARGET)
  if(WD_UNITY)
    set_target_properties(${TARGET} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${WD_UNITY_BATCH})
  endif()
endfunction()

function(wd_use_pch TARGET)
  if(WD_USE_PCH)
    target_precompile_headers(${TARGET} REUSE_FROM wd_pch)
  endif()
endfunction()
