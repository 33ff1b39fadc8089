// __managed__ variables as CUDA tutorials use them: module-scope variables that the host reads
// and writes by name and kernels use in place, with no copy in between. Ends
// "managed_variables: PASSED" (exit 0) or a line naming what went wrong (exit 1).

#include <cuda_runtime.h>

#include <cstdio>

#include "checks.cuh"

__managed__ int counter = 5;
__managed__ float samples[256];

__global__ void countAndScale(float factor) {
  atomicAdd(&counter, 1);
  samples[threadIdx.x] *= factor;
}

int main() {
  // The initial value is there before any kernel ran, where the host reads the variable.
  EXPECT(counter == 5, "counter starts at %d", counter);
  for (int i = 0; i < 256; ++i) samples[i] = static_cast<float>(i);
  counter = 100;
  countAndScale<<<1, 256>>>(0.5f);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  EXPECT(counter == 356, "counter is %d after 256 increments from 100", counter);
  for (int i = 0; i < 256; ++i) {
    EXPECT(samples[i] == 0.5f * static_cast<float>(i), "samples[%d] = %f", i, samples[i]);
  }
  // The runtime's symbol calls reach the same memory.
  int copied = 0;
  CHECK(cudaMemcpyFromSymbol(&copied, counter, sizeof(copied)));
  EXPECT(copied == 356, "cudaMemcpyFromSymbol read %d", copied);
  void* address = nullptr;
  CHECK(cudaGetSymbolAddress(&address, counter));
  EXPECT(address == &counter, "the symbol's address %p is not the variable's %p", address,
         static_cast<void*>(&counter));
  cudaPointerAttributes attributes{};
  CHECK(cudaPointerGetAttributes(&attributes, &counter));
  EXPECT(attributes.type == cudaMemoryTypeManaged, "the variable is memory of type %d",
         static_cast<int>(attributes.type));
  std::printf("counter %d, samples[255] %.1f\n", counter, samples[255]);
  std::printf("managed_variables: PASSED\n");
  return 0;
}
