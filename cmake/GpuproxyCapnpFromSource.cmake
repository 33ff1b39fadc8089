# Cap'n Proto and kj compiled here from Debian's source package of the version the daemon links
# (libcapnp-dev's), for the builds that need them compiled otherwise than Debian did: the portable
# stub's position-independent archives (GpuproxyPortableStub.cmake) and the ThreadSanitizer
# build's instrumented ones (GpuproxyThreadSanitizedCapnp.cmake). scripts/install-deps fetches the
# source package; the build never reaches the network.
#
# The same upstream version as the daemon's shared libraries: gpuproxy's code is compiled against
# libcapnp-dev's headers, and the protocol's generated code is capnp 0.9.2's, so the archives must
# be that version's code (Debian's revision too, for its patches).
include_guard(GLOBAL)
include(ExternalProject)

set(gpuproxy_sources_default /usr/local/src/gpuproxy)
if(DEFINED ENV{GPUPROXY_SOURCES_DIR})
  set(gpuproxy_sources_default $ENV{GPUPROXY_SOURCES_DIR})
endif()
set(GPUPROXY_SOURCES_DIR ${gpuproxy_sources_default} CACHE PATH
  "Where scripts/install-deps puts the source packages the build compiles (Cap'n Proto)")
# Parallel jobs for the Cap'n Proto builds (external CMake projects, which Ninja's -j does not
# reach); empty: their generator's default.
set(GPUPROXY_THIRD_PARTY_JOBS "" CACHE STRING "Parallel jobs for the Cap'n Proto build")

# gpuproxy_capnp_from_source(<target> DIR <folder under third_party/> LIBS <libraries...>
#                            [CMAKE_ARGS <arguments...>] ARCHIVES <variable> HINT <text>)
# Adds <target>, which extracts the source package (dpkg-source checks it against its .dsc and
# applies Debian's patches) and builds only LIBS, as static archives, with CMAKE_ARGS besides the
# compiler and launcher; sets <variable> to the archives, in LIBS's order. HINT says, when the
# source package is missing, what else the caller could do.
function(gpuproxy_capnp_from_source target)
  cmake_parse_arguments(ARG "" "DIR;ARCHIVES;HINT" "LIBS;CMAKE_ARGS" ${ARGN})
  file(GLOB dsc ${GPUPROXY_SOURCES_DIR}/capnproto_${CapnProto_VERSION}-*.dsc)
  if(dsc)
    list(SORT dsc)
    list(GET dsc -1 dsc)
  else()
    message(FATAL_ERROR
      "Cap'n Proto ${CapnProto_VERSION}'s Debian source package is not in "
      "${GPUPROXY_SOURCES_DIR}: run scripts/install-deps (or -DGPUPROXY_SOURCES_DIR=..., or "
      "${ARG_HINT})")
  endif()
  find_program(GPUPROXY_DPKG_SOURCE dpkg-source REQUIRED)

  set(dir ${CMAKE_BINARY_DIR}/third_party/${ARG_DIR})
  set(archives "")
  foreach(lib IN LISTS ARG_LIBS)
    string(REGEX MATCH "^[a-z]+" folder ${lib})
    list(APPEND archives ${dir}/build/src/${folder}/lib${lib}.a)
  endforeach()
  set(jobs "")
  if(GPUPROXY_THIRD_PARTY_JOBS)
    set(jobs --parallel ${GPUPROXY_THIRD_PARTY_JOBS})
  endif()
  ExternalProject_Add(${target}
    PREFIX ${dir}
    SOURCE_DIR ${dir}/source
    BINARY_DIR ${dir}/build
    DOWNLOAD_COMMAND ${CMAKE_COMMAND} -E rm -rf <SOURCE_DIR>
    COMMAND ${GPUPROXY_DPKG_SOURCE} --no-copy -x ${dsc} <SOURCE_DIR>
    LOG_DOWNLOAD ON
    CMAKE_ARGS
      -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
      -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
      -DCMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER}
      -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
      -DBUILD_SHARED_LIBS=OFF
      -DBUILD_TESTING=OFF
      -DWITH_OPENSSL=OFF
      -DWITH_ZLIB=OFF
      ${ARG_CMAKE_ARGS}
    LOG_CONFIGURE ON
    # Only the libraries asked for: not the compiler or the tests.
    BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> ${jobs} --target ${ARG_LIBS}
    LOG_BUILD ON
    LOG_OUTPUT_ON_FAILURE ON
    INSTALL_COMMAND ""
    BUILD_BYPRODUCTS ${archives})
  set(${ARG_ARCHIVES} ${archives} PARENT_SCOPE)
endfunction()
