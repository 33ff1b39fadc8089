// A kernel writes past the end of its buffer: the launch fails with CUDA_ERROR_ILLEGAL_ADDRESS at
// the next synchronisation, and the context stays unusable (a sticky error), as on a GPU.
#include "out_of_bounds_ptx.hpp"
#include "tests/programs/cuda_program.hpp"

#include <cstdio>

using gpuproxy::programs::Program;

int main() {
  Program program("out_of_bounds", gpuproxy::testing::kOutOfBoundsPtx);
  constexpr int kAllocated = 1000;
  CUdeviceptr data = program.allocate<int>(kAllocated);
  int n = kAllocated + 24;  // 24 ints past the end
  std::vector<void*> arguments{&data, &n};
  CUDA_PROGRAM_CHECK("out_of_bounds",
                     cuLaunchKernel(program.function("fill_past_the_end"), (n + 255) / 256, 1, 1,
                                    256, 1, 1, 0, nullptr, arguments.data(), nullptr));
  const CUresult synchronized = cuCtxSynchronize();
  const CUresult after = cuMemAlloc(&data, 16);
  const char* name = nullptr;
  cuGetErrorName(synchronized, &name);
  std::printf("cuCtxSynchronize: %s\n", name != nullptr ? name : "?");
  cuGetErrorName(after, &name);
  std::printf("cuMemAlloc after the fault: %s\n", name != nullptr ? name : "?");
  const bool ok = synchronized == CUDA_ERROR_ILLEGAL_ADDRESS && after == CUDA_ERROR_ILLEGAL_ADDRESS;
  std::printf("out_of_bounds: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
