#pragma once
// What the example programs' host sides share: the driver-API calls every CUDA program makes
// (initialise, load a module, allocate, copy, launch), with errors reported and fatal. Nothing
// here knows about gpuproxy: these programs run on a GPU with the real driver too.

#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace gpuproxy::programs {

[[noreturn]] inline void fail(const char* program, const char* call, CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  std::fprintf(stderr, "%s: %s failed: %s (%d)\n", program, call, name, static_cast<int>(result));
  std::exit(1);
}

#define CUDA_PROGRAM_CHECK(program, call)                                             \
  do {                                                                                \
    const CUresult result_ = (call);                                                  \
    if (result_ != CUDA_SUCCESS) ::gpuproxy::programs::fail(program, #call, result_); \
  } while (0)

// Device 0's primary context, made current, and one module loaded from PTX text.
class Program {
public:
  Program(const char* name, const char* ptx) : name_(name) {
    CUDA_PROGRAM_CHECK(name_, cuInit(0));
    CUDA_PROGRAM_CHECK(name_, cuDeviceGet(&device_, 0));
    CUDA_PROGRAM_CHECK(name_, cuDevicePrimaryCtxRetain(&context_, device_));
    CUDA_PROGRAM_CHECK(name_, cuCtxSetCurrent(context_));
    CUDA_PROGRAM_CHECK(name_, cuModuleLoadData(&module_, ptx));
  }
  ~Program() {
    cuModuleUnload(module_);
    cuDevicePrimaryCtxRelease(device_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  const char* name() const { return name_; }
  CUdevice device() const { return device_; }

  CUfunction function(const char* kernel) const {
    CUfunction function = nullptr;
    CUDA_PROGRAM_CHECK(name_, cuModuleGetFunction(&function, module_, kernel));
    return function;
  }

  template <typename T>
  CUdeviceptr upload(const std::vector<T>& host) const {
    CUdeviceptr device = 0;
    CUDA_PROGRAM_CHECK(name_,
                       cuMemAlloc(&device, std::max<std::size_t>(host.size(), 1) * sizeof(T)));
    if (!host.empty()) {
      CUDA_PROGRAM_CHECK(name_, cuMemcpyHtoD(device, host.data(), host.size() * sizeof(T)));
    }
    return device;
  }

  template <typename T>
  CUdeviceptr allocate(std::size_t count) const {
    CUdeviceptr device = 0;
    CUDA_PROGRAM_CHECK(name_, cuMemAlloc(&device, std::max<std::size_t>(count, 1) * sizeof(T)));
    CUDA_PROGRAM_CHECK(name_, cuMemsetD8(device, 0, std::max<std::size_t>(count, 1) * sizeof(T)));
    return device;
  }

  template <typename T>
  std::vector<T> download(CUdeviceptr device, std::size_t count) const {
    std::vector<T> host(count);
    if (count > 0) CUDA_PROGRAM_CHECK(name_, cuMemcpyDtoH(host.data(), device, count * sizeof(T)));
    return host;
  }

  void free(CUdeviceptr device) const { CUDA_PROGRAM_CHECK(name_, cuMemFree(device)); }

  // Launches `kernel` with `arguments` (pointers to each argument's value) and waits for it.
  void run(CUfunction kernel, unsigned grid, unsigned block, std::vector<void*> arguments,
           unsigned sharedBytes = 0) const {
    CUDA_PROGRAM_CHECK(name_, cuLaunchKernel(kernel, grid, 1, 1, block, 1, 1, sharedBytes, nullptr,
                                             arguments.data(), nullptr));
    CUDA_PROGRAM_CHECK(name_, cuCtxSynchronize());
  }

private:
  const char* name_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
};

}  // namespace gpuproxy::programs
