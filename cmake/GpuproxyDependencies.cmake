# Every third-party dependency, found in one place. All of them come from Debian packages
# (scripts/install-deps lists them); the CUDA toolkit provides headers and nvcc only: nothing
# links the CUDA driver at build time.
find_package(Threads REQUIRED)
find_package(CapnProto CONFIG REQUIRED)
include(GpuproxyThreadSanitizedCapnp)  # kj instrumented in TSan builds
find_package(spdlog CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(CUDAToolkit REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing)
# Fatbin entries nvcc compressed (server/backend/fatbin): LZ4 blocks and zstd frames.
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
# The Kubernetes device plugin (client/deviceplugin) speaks the kubelet's gRPC; nothing else links
# gRPC or protobuf.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)

# The CUDA headers, without any CUDA library: the daemon dlopens libcuda.so.1 at run time and the
# stub *is* libcuda.so.1.
add_library(gpuproxy_cuda_headers INTERFACE)
target_include_directories(gpuproxy_cuda_headers SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
add_library(gpuproxy::cuda_headers ALIAS gpuproxy_cuda_headers)

if(GPUPROXY_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(GPUPROXY_BUILD_BENCHMARKS)
  find_package(benchmark CONFIG REQUIRED)
endif()
