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

set(gpuproxy_sources_default /usr/local/src/gpuproxy)
if(DEFINED ENV{GPUPROXY_SOURCES_DIR})
  set(gpuproxy_sources_default $ENV{GPUPROXY_SOURCES_DIR})
endif()
set(GPUPROXY_SOURCES_DIR ${gpuproxy_sources_default} CACHE PATH
  "Where scripts/install-deps puts the source packages the build compiles (Cap'n Proto)")
# Parallel jobs for the Cap'n Proto build (an external CMake project, which Ninja's -j does not
# reach); empty: its generator's default.
set(GPUPROXY_THIRD_PARTY_JOBS "" CACHE STRING "Parallel jobs for the Cap'n Proto build")

# The same upstream version as the daemon's shared libraries: the stub's own code is compiled
# against libcapnp-dev's headers, and the protocol's generated code is capnp 0.9.2's, so the
# archives must be that version's code (Debian's revision too, for its patches).
file(GLOB gpuproxy_capnp_dsc ${GPUPROXY_SOURCES_DIR}/capnproto_${CapnProto_VERSION}-*.dsc)
if(gpuproxy_capnp_dsc)
  list(SORT gpuproxy_capnp_dsc)
  list(GET gpuproxy_capnp_dsc -1 gpuproxy_capnp_dsc)
else()
  message(FATAL_ERROR
    "Cap'n Proto ${CapnProto_VERSION}'s Debian source package is not in ${GPUPROXY_SOURCES_DIR}: "
    "run scripts/install-deps (or -DGPUPROXY_SOURCES_DIR=..., or -DGPUPROXY_PORTABLE_STUB=OFF for "
    "a stub that needs the build machine's libraries)")
endif()
find_program(GPUPROXY_DPKG_SOURCE dpkg-source REQUIRED)

include(ExternalProject)
set(gpuproxy_capnp_dir ${CMAKE_BINARY_DIR}/third_party/capnproto)
set(gpuproxy_capnp_libs capnp-rpc capnp kj-async kj)  # in link order
set(gpuproxy_capnp_archives "")
foreach(lib IN LISTS gpuproxy_capnp_libs)
  string(REGEX MATCH "^[a-z]+" folder ${lib})
  list(APPEND gpuproxy_capnp_archives ${gpuproxy_capnp_dir}/build/src/${folder}/lib${lib}.a)
endforeach()
set(gpuproxy_capnp_jobs "")
if(GPUPROXY_THIRD_PARTY_JOBS)
  set(gpuproxy_capnp_jobs --parallel ${GPUPROXY_THIRD_PARTY_JOBS})
endif()
ExternalProject_Add(gpuproxy_capnproto_pic
  PREFIX ${gpuproxy_capnp_dir}
  SOURCE_DIR ${gpuproxy_capnp_dir}/source
  BINARY_DIR ${gpuproxy_capnp_dir}/build
  # dpkg-source checks the files against the .dsc and applies Debian's patches.
  DOWNLOAD_COMMAND ${CMAKE_COMMAND} -E rm -rf <SOURCE_DIR>
  COMMAND ${GPUPROXY_DPKG_SOURCE} --no-copy -x ${gpuproxy_capnp_dsc} <SOURCE_DIR>
  LOG_DOWNLOAD ON
  CMAKE_ARGS
    -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
    -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DCMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER}
    -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DBUILD_TESTING=OFF
    -DWITH_OPENSSL=OFF
    -DWITH_ZLIB=OFF
  LOG_CONFIGURE ON
  # Only the four libraries the stub links: not the compiler, kj-http or the tests.
  BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> ${gpuproxy_capnp_jobs} --target
    ${gpuproxy_capnp_libs}
  LOG_BUILD ON
  LOG_OUTPUT_ON_FAILURE ON
  INSTALL_COMMAND ""
  BUILD_BYPRODUCTS ${gpuproxy_capnp_archives})

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
