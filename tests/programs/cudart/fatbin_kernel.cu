// One kernel, built into fatbins of different shapes (tests/programs/cudart/CMakeLists.txt):
// prints which architecture's code ran (__CUDA_ARCH__ as the kernel saw it) and checks the sum.
#include <cuda_runtime.h>

#include <cstdio>

__global__ void tagAndSum(const int* values, int n, int* sum, int* arch) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(sum, values[i]);
  if (i == 0) {
#ifdef __CUDA_ARCH__
    *arch = __CUDA_ARCH__;
#endif
  }
}

int main() {
  const int n = 1000;
  int host[n];
  for (int i = 0; i < n; ++i) host[i] = i;
  int* values = nullptr;
  int* results = nullptr;
  if (cudaMalloc(&values, sizeof(host)) != cudaSuccess ||
      cudaMalloc(&results, 2 * sizeof(int)) != cudaSuccess) {
    std::printf("FAILED: cudaMalloc\n");
    return 1;
  }
  cudaMemcpy(values, host, sizeof(host), cudaMemcpyHostToDevice);
  cudaMemset(results, 0, 2 * sizeof(int));
  tagAndSum<<<(n + 127) / 128, 128>>>(values, n, results, results + 1);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t finished = cudaDeviceSynchronize();
  if (launched != cudaSuccess || finished != cudaSuccess) {
    const cudaError_t status = launched != cudaSuccess ? launched : finished;
    std::printf("FAILED: the kernel did not run: %s (%s)\n", cudaGetErrorName(status),
                cudaGetErrorString(status));
    return 1;
  }
  int answer[2] = {};
  cudaMemcpy(answer, results, sizeof(answer), cudaMemcpyDeviceToHost);
  std::printf("sum %d, code for compute %d\n", answer[0], answer[1]);
  if (answer[0] != n * (n - 1) / 2) {
    std::printf("FAILED: wrong sum\n");
    return 1;
  }
  std::printf("fatbin_kernel: PASSED\n");
  return 0;
}
