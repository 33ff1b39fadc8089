# The CUDA driver API surface, generated at build time from the toolkit's cuda.h, cudaProfiler.h and
# their PFN typedef headers by gen.py: one table, no hand-kept lists that can drift
# (docs/adding-a-cuda-call.md).
# Included from protocol/ and client/stub/; the functions find gen.py relative to this file.

option(GPUPROXY_STUB_PLACEHOLDERS
  "Give every implemented.txt entry point a weak NOT_SUPPORTED definition (local development \
only: lets the stub link while hand-written entry points are still missing)" OFF)

find_path(GPUPROXY_CUDA_INCLUDE_DIR NAMES cuda.h cudaTypedefs.h
  PATHS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH REQUIRED)

# gpuproxy_generate_cuda_api(<out_dir> GENERATED_SOURCES <var> VERSION_SCRIPT <var>)
#   <var> for GENERATED_SOURCES receives the sources to add to the stub (the NOT_SUPPORTED entry
#   points and the cuGetProcAddress table, which client/stub/proc_address.cpp includes);
#   VERSION_SCRIPT the linker version script exporting exactly the functions cuda.h declares.
#   <out_dir> also receives cuda_api_symbols.txt (the export list, for tests) and
#   mapping_warnings.txt.
function(gpuproxy_generate_cuda_api out_dir)
  cmake_parse_arguments(ARG "" "GENERATED_SOURCES;VERSION_SCRIPT" "" ${ARGN})
  if(NOT ARG_GENERATED_SOURCES OR NOT ARG_VERSION_SCRIPT)
    message(FATAL_ERROR "gpuproxy_generate_cuda_api: GENERATED_SOURCES and VERSION_SCRIPT needed")
  endif()
  set(api_dir ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  set(placeholders_flag "")
  if(GPUPROXY_STUB_PLACEHOLDERS)
    set(placeholders_flag --placeholders)
  endif()
  set(sources
    ${out_dir}/unsupported_entry_points.cpp
    ${out_dir}/implemented_placeholders.cpp
    ${out_dir}/proc_address_table.inc)
  set(outputs ${sources}
    ${out_dir}/exports.map
    ${out_dir}/cuda_api_symbols.txt
    ${out_dir}/cuda_result_table.inc
    ${out_dir}/mapping_warnings.txt)
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND ${Python3_EXECUTABLE} ${api_dir}/gen.py
      --cc ${CMAKE_C_COMPILER}
      --cuda-include ${GPUPROXY_CUDA_INCLUDE_DIR}
      --implemented ${api_dir}/implemented.txt
      --out-dir ${out_dir}
      ${placeholders_flag}
    DEPENDS ${api_dir}/gen.py ${api_dir}/implemented.txt
      ${GPUPROXY_CUDA_INCLUDE_DIR}/cuda.h ${GPUPROXY_CUDA_INCLUDE_DIR}/cudaTypedefs.h
      ${GPUPROXY_CUDA_INCLUDE_DIR}/cudaProfiler.h ${GPUPROXY_CUDA_INCLUDE_DIR}/cudaProfilerTypedefs.h
    COMMENT "Generating the CUDA driver API surface from cuda.h"
    VERBATIM)
  set(${ARG_GENERATED_SOURCES} ${sources} PARENT_SCOPE)
  set(${ARG_VERSION_SCRIPT} ${out_dir}/exports.map PARENT_SCOPE)
endfunction()

# gpuproxy_generate_cuda_result_table(<out_dir> OUTPUT <var>)
#   Writes <out_dir>/cuda_result_table.inc ({CUresult, name, description} rows) and sets <var>
#   to its path, for protocol/cuda_result.cpp.
function(gpuproxy_generate_cuda_result_table out_dir)
  cmake_parse_arguments(ARG "" "OUTPUT" "" ${ARGN})
  set(api_dir ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  set(table ${out_dir}/cuda_result_table.inc)
  add_custom_command(
    OUTPUT ${table}
    COMMAND ${Python3_EXECUTABLE} ${api_dir}/gen.py --result-table-only
      --cuda-include ${GPUPROXY_CUDA_INCLUDE_DIR} --out-dir ${out_dir}
    DEPENDS ${api_dir}/gen.py ${GPUPROXY_CUDA_INCLUDE_DIR}/cuda.h
    COMMENT "Generating the CUresult table from cuda.h"
    VERBATIM)
  set(${ARG_OUTPUT} ${table} PARENT_SCOPE)
endfunction()
