# gpuproxy_add_gtest(NAME SOURCES a.cpp... LINK libs... LABELS labels... [ENVIRONMENT k=v...])
# One ctest entry per test executable; tests run with a short private temp dir so Unix socket
# paths stay under the 107-byte limit. Tests labelled `unit` are also what the target
# gpuproxy_unit_tests builds (the ThreadSanitizer stage runs only those and builds nothing else).
if(NOT TARGET gpuproxy_unit_tests)
  add_custom_target(gpuproxy_unit_tests)
endif()
function(gpuproxy_add_gtest name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LINK;LABELS;ENVIRONMENT" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  target_link_libraries(${name} PRIVATE ${ARG_LINK} GTest::gtest GTest::gtest_main)
  gpuproxy_target_defaults(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES
    LABELS "${ARG_LABELS}"
    TIMEOUT ${ARG_TIMEOUT}
    SKIP_RETURN_CODE 77
    ENVIRONMENT "GPUPROXY_BUILD_DIR=${CMAKE_BINARY_DIR};${ARG_ENVIRONMENT}")
  if("unit" IN_LIST ARG_LABELS)
    add_dependencies(gpuproxy_unit_tests ${name})
  endif()
endfunction()
