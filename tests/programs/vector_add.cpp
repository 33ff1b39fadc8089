// An ordinary CUDA driver-API program: vector add, end to end. It knows nothing of gpuproxy: run
// it with the real libcuda.so.1 on a GPU, or with LD_LIBRARY_PATH pointing at the stub.
//
//   vector_add [--elements N] [--device D] [--iterations K] [--hold-ms MS] [--no-free]
//
// --hold-ms keeps the allocations alive for a while (so an operator, or a test, can watch it in
// `gpuproxyctl status`); --no-free exits without freeing anything.
#include <cuda.h>

#include "test_kernels_ptx.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void fail(const char* call, CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  std::fprintf(stderr, "vector_add: %s failed: %s (%d)\n", call, name, static_cast<int>(result));
  std::exit(1);
}

#define CHECK(call)                                    \
  do {                                                 \
    CUresult result_ = (call);                         \
    if (result_ != CUDA_SUCCESS) fail(#call, result_); \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  int elements = 1 << 20;
  int device = 0;
  int iterations = 1;
  int holdMs = 0;
  bool freeAtEnd = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (arg == "--elements")
      elements = next();
    else if (arg == "--device")
      device = next();
    else if (arg == "--iterations")
      iterations = next();
    else if (arg == "--hold-ms")
      holdMs = next();
    else if (arg == "--no-free")
      freeAtEnd = false;
    else {
      std::fprintf(stderr, "vector_add: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }

  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, device));
  char name[256];
  CHECK(cuDeviceGetName(name, sizeof(name), dev));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, dev));
  CHECK(cuCtxSetCurrent(context));

  std::size_t bytes = static_cast<std::size_t>(elements) * sizeof(float);
  std::vector<float> a(elements), b(elements), c(elements, -1.0f);
  for (int i = 0; i < elements; ++i) {
    a[i] = static_cast<float>(i) * 0.5f;
    b[i] = static_cast<float>(elements - i);
  }

  CUdeviceptr da, db, dc;
  CHECK(cuMemAlloc(&da, bytes));
  CHECK(cuMemAlloc(&db, bytes));
  CHECK(cuMemAlloc(&dc, bytes));

  CUmodule module;
  CHECK(cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
  CUfunction vectorAdd;
  CHECK(cuModuleGetFunction(&vectorAdd, module, "vector_add"));

  for (int iteration = 0; iteration < iterations; ++iteration) {
    CHECK(cuMemcpyHtoD(da, a.data(), bytes));
    CHECK(cuMemcpyHtoD(db, b.data(), bytes));
    CHECK(cuMemsetD32(dc, 0, static_cast<std::size_t>(elements)));
    int n = elements;
    void* params[] = {&da, &db, &dc, &n};
    unsigned block = 256;
    unsigned grid = (static_cast<unsigned>(elements) + block - 1) / block;
    CHECK(cuLaunchKernel(vectorAdd, grid, 1, 1, block, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
    for (int i = 0; i < elements; ++i) {
      if (c[i] != a[i] + b[i]) {
        std::fprintf(stderr, "vector_add: wrong result at %d: %f + %f gave %f\n", i, a[i], b[i],
                     c[i]);
        return 1;
      }
    }
  }

  if (holdMs > 0) {
    std::printf("vector_add: holding %zu bytes for %d ms\n", 3 * bytes, holdMs);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(holdMs));
  }

  if (freeAtEnd) {
    CHECK(cuModuleUnload(module));
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuDevicePrimaryCtxRelease(dev));
  }
  std::printf("vector_add: OK (%d elements x %d iterations on device %d: %s)\n", elements,
              iterations, device, name);
  return 0;
}
