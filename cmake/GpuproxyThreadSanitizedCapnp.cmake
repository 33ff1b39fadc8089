# ThreadSanitizer builds link kj and Cap'n Proto compiled here with -fsanitize=thread, from the
# source package of the version Debian's shared libraries are (GpuproxyCapnpFromSource.cmake),
# instead of those libraries: kj hands work from one thread to another (kj::Executor, cross-thread
# promises) under a mutex and reference counts of its own, which TSan sees only in instrumented
# code. Without it, every message between a GPU's thread and another
# (server/gpu/gpu_messages.hpp) would be reported as a race.
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=thread")
  return()
endif()

include(GpuproxyCapnpFromSource)
set(gpuproxy_tsan_capnp_libs capnp-rpc capnp kj-http kj-async kj)  # every one gpuproxy links
gpuproxy_capnp_from_source(gpuproxy_capnproto_tsan DIR capnproto-tsan
  LIBS ${gpuproxy_tsan_capnp_libs}
  # Position-independent: the stub, a shared library, links them too.
  CMAKE_ARGS "-DCMAKE_CXX_FLAGS=-g -fsanitize=thread" -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  ARCHIVES gpuproxy_tsan_capnp_archives
  HINT "a build without -fsanitize=thread")
# The imported targets keep their names, dependencies and headers (libcapnp-dev's, the same
# version's); only the file linked changes, which Ninja builds first (the archives are the
# external project's byproducts).
foreach(lib archive IN ZIP_LISTS gpuproxy_tsan_capnp_libs gpuproxy_tsan_capnp_archives)
  set_property(TARGET CapnProto::${lib} PROPERTY IMPORTED_LOCATION ${archive})
  set_property(TARGET CapnProto::${lib} PROPERTY IMPORTED_SONAME)
endforeach()
