# What a node gets: the file tree of scripts/package's tarball and of the image
# (deploy/image/Dockerfile), under the install prefix (/usr/local there). Each shipped target says
# so where it is defined, with gpuproxy_ship; `gpuproxy_shipped` builds exactly those, so that
# packaging needs neither the tests nor the benchmarks built.
add_custom_target(gpuproxy_shipped)

# Installs `target` (a program or a shared library) into `destination` under the prefix.
function(gpuproxy_ship target destination)
  install(TARGETS ${target} RUNTIME DESTINATION ${destination} LIBRARY DESTINATION ${destination})
  add_dependencies(gpuproxy_shipped ${target})
endfunction()

# What gpuproxyd, gpuproxyctl and the stub need from the system, as Debian 12 package names (the
# image installs them; tests/packaging checks the list against the shipped files).
install(FILES ${CMAKE_SOURCE_DIR}/deploy/image/runtime-packages DESTINATION share/gpuproxy)
# Examples an operator starts from.
install(FILES ${CMAKE_SOURCE_DIR}/deploy/examples/tenants.yaml
        DESTINATION share/gpuproxy/examples)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/gpuproxyd.service
        DESTINATION share/gpuproxy/systemd)
