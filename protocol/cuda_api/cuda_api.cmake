# Placeholder until the generator lands: defines gpuproxy_generate_cuda_api(OUT_DIR
#   GENERATED_SOURCES <var> VERSION_SCRIPT <var>).
function(gpuproxy_generate_cuda_api out_dir)
  cmake_parse_arguments(ARG "" "GENERATED_SOURCES;VERSION_SCRIPT" "" ${ARGN})
  file(MAKE_DIRECTORY ${out_dir})
  file(WRITE ${out_dir}/exports.map "{ global: cu*; local: *; };\n")
  set(${ARG_GENERATED_SOURCES} "" PARENT_SCOPE)
  set(${ARG_VERSION_SCRIPT} ${out_dir}/exports.map PARENT_SCOPE)
endfunction()
