// Cooperative launches: a grid that synchronises as a whole
// (cooperative_groups::this_grid().sync()), launched as CUDA programs do it. `cooperative` prints
// what it computed and ends with "cooperative: PASSED" (exit 0) or a line naming what went wrong
// (exit 1).
//
//   - the device says it has cooperative launches;
//   - a grid of one block per multiprocessor sums an array in two phases around grid.sync() (each
//     block its part, then block 0 the blocks' sums), then runs rounds of a smoothing stencil that
//     reads its neighbours' values of the round before, a grid.sync() between rounds; launched by
//     cudaLaunchCooperativeKernel and again by cudaLaunchKernelEx with the cooperative attribute;
//   - a grid larger than the device holds at once is cudaErrorCooperativeLaunchTooLarge, and the
//     next launch runs.

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "checks.cuh"

namespace cg = cooperative_groups;

constexpr int kThreads = 128;
constexpr int kRounds = 3;

// sums[b] is block b's part of `in`; *total the whole; smooth[] after kRounds rounds of
// x[i] = (x[i-1] + x[i] + x[i+1]) / 4 (ends held), computed in place through two buffers.
__global__ void sumAndSmooth(const float* in, float* sums, float* total, float* a, float* b,
                             int n) {
  cg::grid_group grid = cg::this_grid();
  __shared__ float partial[kThreads];
  float mine = 0.0f;
  for (int i = static_cast<int>(grid.thread_rank()); i < n; i += static_cast<int>(grid.size())) {
    mine += in[i];
    a[i] = in[i];
  }
  partial[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = partial[0];
  grid.sync();  // every block's sum is written
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    float all = 0.0f;
    for (unsigned block = 0; block < gridDim.x; ++block) all += sums[block];
    *total = all;
  }
  float* from = a;
  float* to = b;
  for (int round = 0; round < kRounds; ++round) {
    for (int i = static_cast<int>(grid.thread_rank()); i < n; i += static_cast<int>(grid.size())) {
      to[i] = (i == 0 || i == n - 1) ? from[i] : (from[i - 1] + 2.0f * from[i] + from[i + 1]) / 4;
    }
    grid.sync();  // the round is written everywhere before any thread reads it
    float* swap = from;
    from = to;
    to = swap;
  }
}

int check(const std::vector<float>& input, const float* total, const float* smoothed, int blocks,
          const char* how) {
  const int n = static_cast<int>(input.size());
  float expectedTotal = 0.0f;
  for (float value : input) expectedTotal += value;
  float gotTotal = 0.0f;
  CHECK(cudaMemcpy(&gotTotal, total, sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(gotTotal == expectedTotal, "%s: total %f, expected %f", how, gotTotal, expectedTotal);
  std::vector<float> from = input, to(n);
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < n; ++i) {
      to[i] = (i == 0 || i == n - 1) ? from[i] : (from[i - 1] + 2.0f * from[i] + from[i + 1]) / 4;
    }
    from.swap(to);
  }
  std::vector<float> got(n);
  CHECK(cudaMemcpy(got.data(), smoothed, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    EXPECT(got[i] == from[i], "%s: smoothed[%d] = %f, expected %f", how, i, got[i], from[i]);
  }
  std::printf("%s: %d blocks, total %.1f, %d rounds of smoothing\n", how, blocks, gotTotal,
              kRounds);
  return 0;
}

int main() {
  int device = 0;
  CHECK(cudaGetDevice(&device));
  int cooperative = 0;
  CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  EXPECT(cooperative == 1, "cudaDevAttrCooperativeLaunch is %d", cooperative);
  int multiprocessors = 0;
  CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  int perMultiprocessor = 0;
  CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perMultiprocessor, sumAndSmooth, kThreads, 0));
  EXPECT(perMultiprocessor > 0, "no block of %d threads fits a multiprocessor", kThreads);

  const int n = 40000;
  std::vector<float> input(n);
  for (int i = 0; i < n; ++i) input[i] = static_cast<float>((i * 37) % 101) * 0.25f;
  float *in = nullptr, *sums = nullptr, *total = nullptr, *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&in, n * sizeof(float)));
  CHECK(cudaMalloc(&sums, multiprocessors * perMultiprocessor * sizeof(float)));
  CHECK(cudaMalloc(&total, sizeof(float)));
  CHECK(cudaMalloc(&a, n * sizeof(float)));
  CHECK(cudaMalloc(&b, n * sizeof(float)));
  CHECK(cudaMemcpy(in, input.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  // After an odd number of rounds the result is in b.
  float* smoothed = kRounds % 2 == 1 ? b : a;

  int length = n;
  void* arguments[] = {&in, &sums, &total, &a, &b, &length};
  const int blocks = multiprocessors;
  CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(sumAndSmooth), dim3(blocks),
                                    dim3(kThreads), arguments, 0, nullptr));
  CHECK(cudaDeviceSynchronize());
  if (check(input, total, smoothed, blocks, "cudaLaunchCooperativeKernel") != 0) return 1;

  CHECK(cudaMemset(total, 0, sizeof(float)));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks / 2);
  config.blockDim = dim3(kThreads);
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&config, sumAndSmooth, static_cast<const float*>(in), sums, total, a, b,
                           length));
  CHECK(cudaDeviceSynchronize());
  if (check(input, total, smoothed, blocks / 2, "cudaLaunchKernelEx(cooperative)") != 0) return 1;

  const cudaError_t tooLarge = cudaLaunchCooperativeKernel(
      reinterpret_cast<void*>(sumAndSmooth), dim3(multiprocessors * perMultiprocessor + 1),
      dim3(kThreads), arguments, 0, nullptr);
  EXPECT(tooLarge == cudaErrorCooperativeLaunchTooLarge,
         "a grid of %d blocks (the device holds %d) gave %s",
         multiprocessors * perMultiprocessor + 1, multiprocessors * perMultiprocessor,
         cudaGetErrorName(tooLarge));
  (void)cudaGetLastError();  // the refusal was the last error: cleared
  std::printf("a grid of %d blocks refused: the device holds %d at once\n",
              multiprocessors * perMultiprocessor + 1, multiprocessors * perMultiprocessor);

  CHECK(cudaFree(in));
  CHECK(cudaFree(sums));
  CHECK(cudaFree(total));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  std::printf("cooperative: PASSED\n");
  return 0;
}
