#include <cstdio>
#include <cuda_runtime.h>
__global__ void add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
int main() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  printf("count %d err %s\n", count, cudaGetErrorString(e));
  if (e) return 1;
  const int n = 1000;
  float *a, *b, *c;
  cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&c, n * 4);
  float h[n];
  for (int i = 0; i < n; ++i) h[i] = i;
  cudaMemcpy(a, h, n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(b, h, n * 4, cudaMemcpyHostToDevice);
  add<<<(n + 255) / 256, 256>>>(a, b, c, n);
  e = cudaGetLastError();
  printf("launch %s\n", cudaGetErrorString(e));
  cudaMemcpy(h, c, n * 4, cudaMemcpyDeviceToHost);
  printf("c[999]=%f\n", h[999]);
  return 0;
}
