# Warning flags applied privately to our own targets (never forced on consumers).
add_library(gpuproxy_warnings INTERFACE)
target_compile_options(gpuproxy_warnings INTERFACE
  -Wall -Wextra -Wimplicit-fallthrough -Wsuggest-override
  $<$<BOOL:${GPUPROXY_WERROR}>:-Werror>)
add_library(gpuproxy::warnings ALIAS gpuproxy_warnings)

# Generated Cap'n Proto code and third-party headers are not held to our warning set.
function(gpuproxy_target_defaults target)
  target_link_libraries(${target} PRIVATE gpuproxy_warnings)
endfunction()
