# What makes the client stub (build/lib/gpuproxy/libcuda.so.1) load in any image a CUDA program
# runs in, where nothing of gpuproxy's build machine is installed (docs/architecture.md, "What the
# stub needs from an image"):
#
# - Cap'n Proto and kj are linked in, built here from Debian's source package of the version the
#   daemon links (libcapnp-dev), as position-independent archives: Debian's own .a files are not.
#   scripts/install-deps fetches the source package; the build never reaches the network.
# - libstdc++ and libgcc are linked in too (-static-libstdc++ -static-libgcc), and the version
#   script keeps every symbol but the CUDA entry points local, so that an application's own Cap'n
#   Proto, protobuf or C++ runtime neither sees nor replaces the stub's.
# - No glibc symbol version newer than GLIBC_2.28 is referenced (client/stub/portable/).
#
# GPUPROXY_PORTABLE_STUB is off in sanitizer and fuzz builds: their stub is only ever loaded into
# instrumented programs on the build machine, and the sanitizer runtimes expect the shared C++
# runtime.
set(gpuproxy_portable_default ON)
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize" OR GPUPROXY_FUZZ)
  set(gpuproxy_portable_default OFF)
endif()
option(GPUPROXY_PORTABLE_STUB
  "Link the client stub's dependencies statically and against glibc 2.28 symbols (docs/architecture.md)"
  ${gpuproxy_portable_default})

if(NOT GPUPROXY_PORTABLE_STUB)
  return()
endif()

include(GpuproxyCapnpFromSource)
# Only the four libraries the stub links (in link order): not kj-http.
gpuproxy_capnp_from_source(gpuproxy_capnproto_pic DIR capnproto
  LIBS capnp-rpc capnp kj-async kj
  CMAKE_ARGS -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  ARCHIVES gpuproxy_capnp_archives
  HINT "-DGPUPROXY_PORTABLE_STUB=OFF for a stub that needs the build machine's libraries")

# The archives, for the stub only. Its code and the protocol library are compiled against
# libcapnp-dev's headers, the same version's.
add_library(capnproto_pic INTERFACE)
target_link_libraries(capnproto_pic INTERFACE ${gpuproxy_capnp_archives})
add_dependencies(capnproto_pic gpuproxy_capnproto_pic)

# gpuproxy_link_for_old_glibc(<target>): <target> (the stub, or a test program meant for an older
# system) refers to no glibc symbol version newer than GLIBC_2.28 and needs no C++ runtime from the
# system: the symbols glibc_symbols.def lists are wrapped (client/stub/portable/glibc_compat.cpp),
# libstdc++ and libgcc are linked in.
function(gpuproxy_link_for_old_glibc target)
  set(portable ${CMAKE_SOURCE_DIR}/client/stub/portable)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${portable}/glibc_symbols.def)
  file(STRINGS ${portable}/glibc_symbols.def entries REGEX "^GPUPROXY_(FORWARD|STAND_IN)\\(")
  set(options -static-libstdc++ -static-libgcc)
  foreach(entry IN LISTS entries)
    string(REGEX REPLACE "^GPUPROXY_[A-Z_]+\\(([A-Za-z0-9_]+).*" "\\1" symbol "${entry}")
    list(APPEND options "LINKER:--wrap=${symbol}")
  endforeach()
  target_sources(${target} PRIVATE ${portable}/glibc_compat.cpp)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_sources(${target} PRIVATE ${portable}/program_start.cpp)
    list(APPEND options "LINKER:--wrap=__libc_start_main")
  endif()
  target_link_options(${target} PRIVATE ${options})
  # glibc's libpthread.so.0, libdl.so.2 and librt.so.1 are empty since glibc 2.34, but before it
  # they defined pthread_*, dl* and shm_open: what uses those at their old versions needs them.
  # -l: names the file (libpthread.so, the link-time name, is gone); --no-as-needed keeps the
  # DT_NEEDED entries of libraries that define nothing the linker needs here.
  target_link_libraries(${target} PRIVATE -Wl,--push-state,--no-as-needed -l:libpthread.so.0
    -l:libdl.so.2 -l:librt.so.1 -Wl,--pop-state)
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${portable}/glibc_symbols.def)
endfunction()
