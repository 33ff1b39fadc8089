# cmake -DPTX=<file.ptx> -DHEADER=<out.hpp> -DSYMBOL=<kName> -DSOURCE=<file.cu> -DFLAGS=<text>
#       -P embed_ptx.cmake
# Wraps nvcc's PTX in a C++ header so tests can load it without finding files at run time.
file(READ "${PTX}" ptx_text)
string(FIND "${ptx_text}" ")PTX\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${PTX} contains the raw-string delimiter )PTX\"")
endif()
file(WRITE "${HEADER}.tmp"
  "// Generated from ${SOURCE} by tests/programs/kernels/CMakeLists.txt: do not edit.\n"
  "#pragma once\n\n"
  "namespace gpuproxy::testing {\n\n"
  "// PTX of ${SOURCE}, as nvcc ${FLAGS} emits it.\n"
  "inline constexpr const char ${SYMBOL}[] = R\"PTX(${ptx_text})PTX\";\n\n"
  "// The same PTX as a file in the build tree.\n"
  "inline constexpr const char ${SYMBOL}Path[] = \"${PTX}\";\n\n"
  "}  // namespace gpuproxy::testing\n")
file(COPY_FILE "${HEADER}.tmp" "${HEADER}" ONLY_IF_DIFFERENT)
file(REMOVE "${HEADER}.tmp")
