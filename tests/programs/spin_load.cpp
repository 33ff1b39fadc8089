// An ordinary driver-API program that keeps the GPU saturated with `spin` kernels, for the
// scheduling tests: it keeps --depth kernels of --kernel-us microseconds queued on one stream for
// --seconds, then prints how many it launched and exits 0.
//
//   spin_load [--kernel-us U] [--depth D] [--seconds S] [--device N]
//
// Any CUDA error: a message on stderr and exit code 1.
#include <cuda.h>

#include "test_kernels_ptx.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void check(const char* call, CUresult result) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  std::fprintf(stderr, "spin_load: %s failed: %s (%d)\n", call, name, static_cast<int>(result));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned long long kernelUs = 1000;
  int depth = 16;
  double seconds = 2;
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "spin_load: %s needs a value\n", arg.c_str());
      return 2;
    }
    const char* value = argv[++i];
    if (arg == "--kernel-us") {
      kernelUs = std::strtoull(value, nullptr, 10);
    } else if (arg == "--depth") {
      depth = std::max(1, std::atoi(value));
    } else if (arg == "--seconds") {
      seconds = std::strtod(value, nullptr);
    } else if (arg == "--device") {
      device = std::atoi(value);
    } else {
      std::fprintf(stderr, "spin_load: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }

  check("cuInit", cuInit(0));
  CUdevice dev = 0;
  check("cuDeviceGet", cuDeviceGet(&dev, device));
  CUcontext context = nullptr;
  check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&context, dev));
  check("cuCtxSetCurrent", cuCtxSetCurrent(context));
  CUmodule module = nullptr;
  check("cuModuleLoadData", cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
  CUfunction spin = nullptr;
  check("cuModuleGetFunction", cuModuleGetFunction(&spin, module, "spin"));
  CUstream stream = nullptr;
  check("cuStreamCreate", cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  // One event per queue slot: before reusing a slot, wait for the kernel it followed.
  std::vector<CUevent> slots(static_cast<std::size_t>(depth));
  for (CUevent& slot : slots) check("cuEventCreate", cuEventCreate(&slot, CU_EVENT_DISABLE_TIMING));

  unsigned long long ns = kernelUs * 1000;
  void* parameters[] = {&ns};
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  unsigned long long launched = 0;
  while (std::chrono::steady_clock::now() < end) {
    CUevent slot = slots[launched % slots.size()];
    if (launched >= slots.size()) check("cuEventSynchronize", cuEventSynchronize(slot));
    check("cuLaunchKernel", cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, parameters, nullptr));
    check("cuEventRecord", cuEventRecord(slot, stream));
    ++launched;
  }
  check("cuStreamSynchronize", cuStreamSynchronize(stream));
  for (CUevent slot : slots) cuEventDestroy(slot);
  cuStreamDestroy(stream);
  cuModuleUnload(module);
  cuDevicePrimaryCtxRelease(dev);
  std::printf("launched %llu\n", launched);
  return 0;
}
