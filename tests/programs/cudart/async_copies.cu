// Asynchronous copies from global to shared memory (cp.async, compute capability 8.0 and later),
// the three ways programs write them, built for sm_80. `async_copies` prints what it computed and
// ends with "async-copies: PASSED" (exit 0) or a line naming what went wrong (exit 1).
//
//   - a double-buffered loop over tiles with cuda::pipeline (the next tile is copied while the
//     current one is summed): 4-byte copies, commit and wait by stage;
//   - __pipeline_memcpy_async of 16-byte pieces whose last one runs past the end of the input
//     and is zero-filled (the copy's source size smaller than its size);
//   - cooperative_groups::memcpy_async of a whole tile by the block, then cooperative_groups::wait;
//   - copies that complete on a cuda::barrier (an mbarrier object), the barrier reused round after
//     round, with split arrive and wait; threads that leave with arrive_and_drop.

#include <cooperative_groups.h>
#include <cooperative_groups/memcpy_async.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <cuda/barrier>
#include <cuda/pipeline>

#include <cmath>
#include <cstdio>
#include <vector>

#include "checks.cuh"

namespace cg = cooperative_groups;

constexpr int kTile = 128;  // threads per block, elements per tile

// Block b sums tiles b, b + gridDim.x, ...: thread t owns element t of each tile and adds up its
// column; the sums of all threads of all blocks are written to out[block * kTile + t].
__global__ void columnSumsDoubleBuffered(const float* in, float* out, int tiles) {
  __shared__ float stage[2][kTile];
  cuda::pipeline<cuda::thread_scope_thread> pipe = cuda::make_pipeline();
  const int t = threadIdx.x;
  int tile = blockIdx.x;
  if (tile < tiles) {
    pipe.producer_acquire();
    cuda::memcpy_async(&stage[0][t], &in[tile * kTile + t], sizeof(float), pipe);
    pipe.producer_commit();
  }
  float sum = 0.0f;
  for (int buffer = 0; tile < tiles; tile += gridDim.x, buffer ^= 1) {
    const int next = tile + gridDim.x;
    if (next < tiles) {
      pipe.producer_acquire();
      cuda::memcpy_async(&stage[buffer ^ 1][t], &in[next * kTile + t], sizeof(float), pipe);
      pipe.producer_commit();
      cuda::pipeline_consumer_wait_prior<1>(pipe);
    } else {
      cuda::pipeline_consumer_wait_prior<0>(pipe);
    }
    __syncthreads();
    sum += stage[buffer][(t + 1) % kTile];  // a neighbour's element: the tile is the block's
    __syncthreads();
    pipe.consumer_release();
  }
  out[blockIdx.x * kTile + t] = sum;
}

// Each thread copies 16 bytes (four floats) into shared memory; the piece that runs past `n`
// copies only what exists and the rest of it reads as zeros. out[i] = 2 * in[i], and the padding
// past n is written as the zeros the copy filled in.
__global__ void doubleWithZeroFill(const float* in, float* out, int n, int padded) {
  __shared__ __align__(16) float staged[4 * kTile];
  const int first = (blockIdx.x * kTile + threadIdx.x) * 4;
  if (first < padded) {
    const int available = n - first;
    const size_t bytes = available >= 4 ? 16 : (available > 0 ? available * sizeof(float) : 0);
    __pipeline_memcpy_async(&staged[threadIdx.x * 4], &in[first < n ? first : 0], 16, 16 - bytes);
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  if (first < padded) {
    for (int k = 0; k < 4; ++k) out[first + k] = 2.0f * staged[threadIdx.x * 4 + k];
  }
}

// The block copies its tile with one collective call, then each thread reads a reversed element.
__global__ void reverseTiles(const float* in, float* out) {
  __shared__ __align__(16) float tile[kTile];
  cg::thread_block block = cg::this_thread_block();
  cg::memcpy_async(block, tile, in + blockIdx.x * kTile, sizeof(float) * kTile);
  cg::wait(block);
  out[blockIdx.x * kTile + threadIdx.x] = tile[kTile - 1 - threadIdx.x];
}

// Block b reads `rounds` tiles through one barrier: each round's copies complete on it, every
// thread reads a neighbour's element, and a split arrive/wait keeps the tile from being overwritten
// before all have read it. out[b * kTile + t] is thread t's sum.
__global__ void roundsThroughABarrier(const float* in, float* out, int rounds) {
  __shared__ float tile[kTile];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ cuda::barrier<cuda::thread_scope_block> ready;
  const int t = threadIdx.x;
  if (t == 0) init(&ready, blockDim.x);
  __syncthreads();
  float sum = 0.0f;
  for (int round = 0; round < rounds; ++round) {
    cuda::memcpy_async(&tile[t], &in[(blockIdx.x * rounds + round) * kTile + t], sizeof(float),
                       ready);
    ready.arrive_and_wait();
    sum += tile[(t + round + 1) % kTile];
    cuda::barrier<cuda::thread_scope_block>::arrival_token token = ready.arrive();
    ready.wait(std::move(token));
  }
  out[blockIdx.x * kTile + t] = sum;
}

// Odd threads leave at once (arrive_and_drop); the even ones count three rounds through the
// barrier, which from then on waits for them only. out[b] is what thread 0 counted.
__global__ void leavingTheBarrier(int* out) {
  __shared__ int counter;
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ cuda::barrier<cuda::thread_scope_block> step;
  const int t = threadIdx.x;
  if (t == 0) {
    init(&step, blockDim.x);
    counter = 0;
  }
  __syncthreads();
  if (t % 2 == 1) {
    (void)step.arrive_and_drop();
    return;
  }
  for (int round = 0; round < 3; ++round) {
    atomicAdd(&counter, 1);
    step.arrive_and_wait();
  }
  if (t == 0) out[blockIdx.x] = counter;
}

int main() {
  constexpr int kTiles = 37, kBlocks = 8;
  std::vector<float> input(kTiles * kTile);
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(i % 1000) * 0.25f;
  float* in = nullptr;
  float* out = nullptr;
  CHECK(cudaMalloc(&in, input.size() * sizeof(float)));
  CHECK(cudaMalloc(&out, (input.size() + 4 * kTile) * sizeof(float)));
  CHECK(cudaMemcpy(in, input.data(), input.size() * sizeof(float), cudaMemcpyHostToDevice));

  columnSumsDoubleBuffered<<<kBlocks, kTile>>>(in, out, kTiles);
  CHECK(cudaGetLastError());
  std::vector<float> sums(kBlocks * kTile);
  CHECK(cudaMemcpy(sums.data(), out, sums.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (int b = 0; b < kBlocks; ++b) {
    for (int t = 0; t < kTile; ++t) {
      float expected = 0.0f;
      for (int tile = b; tile < kTiles; tile += kBlocks)
        expected += input[tile * kTile + (t + 1) % kTile];
      const float got = sums[b * kTile + t];
      EXPECT(std::fabs(got - expected) <= 1e-3f * std::fabs(expected),
             "double-buffered column sum of block %d, thread %d: %f, expected %f", b, t, got,
             expected);
    }
  }
  std::printf("double-buffered pipeline: %d tiles summed by %d blocks\n", kTiles, kBlocks);

  const int n = 1001, padded = 1004;  // the last 16-byte piece holds one element and zero-fill
  std::vector<float> poison(padded, -1.0f);
  CHECK(cudaMemcpy(out, poison.data(), padded * sizeof(float), cudaMemcpyHostToDevice));
  doubleWithZeroFill<<<(padded / 4 + kTile - 1) / kTile, kTile>>>(in, out, n, padded);
  CHECK(cudaGetLastError());
  std::vector<float> doubled(padded);
  CHECK(cudaMemcpy(doubled.data(), out, padded * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < padded; ++i) {
    const float expected = i < n ? 2.0f * input[i] : 0.0f;
    EXPECT(doubled[i] == expected, "zero-filled copy, element %d: %f, expected %f", i, doubled[i],
           expected);
  }
  std::printf("zero-filled copies: %d elements and %d of zero fill\n", n, padded - n);

  reverseTiles<<<kTiles, kTile>>>(in, out);
  CHECK(cudaGetLastError());
  std::vector<float> reversed(input.size());
  CHECK(cudaMemcpy(reversed.data(), out, reversed.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (int tile = 0; tile < kTiles; ++tile) {
    for (int t = 0; t < kTile; ++t) {
      const float expected = input[tile * kTile + kTile - 1 - t];
      EXPECT(reversed[tile * kTile + t] == expected,
             "reversed tile %d, element %d: %f, expected %f", tile, t, reversed[tile * kTile + t],
             expected);
    }
  }
  std::printf("block-wide copies: %d tiles reversed\n", kTiles);

  const int rounds = kTiles / kBlocks;
  roundsThroughABarrier<<<kBlocks, kTile>>>(in, out, rounds);
  CHECK(cudaGetLastError());
  std::vector<float> barrierSums(kBlocks * kTile);
  CHECK(cudaMemcpy(barrierSums.data(), out, barrierSums.size() * sizeof(float),
                   cudaMemcpyDeviceToHost));
  for (int b = 0; b < kBlocks; ++b) {
    for (int t = 0; t < kTile; ++t) {
      float expected = 0.0f;
      for (int round = 0; round < rounds; ++round) {
        expected += input[(b * rounds + round) * kTile + (t + round + 1) % kTile];
      }
      EXPECT(barrierSums[b * kTile + t] == expected,
             "rounds through a barrier, block %d, thread %d: %f, expected %f", b, t,
             barrierSums[b * kTile + t], expected);
    }
  }
  leavingTheBarrier<<<kBlocks, kTile>>>(reinterpret_cast<int*>(out));
  CHECK(cudaGetLastError());
  std::vector<int> counted(kBlocks);
  CHECK(cudaMemcpy(counted.data(), out, counted.size() * sizeof(int), cudaMemcpyDeviceToHost));
  for (int b = 0; b < kBlocks; ++b) {
    EXPECT(counted[b] == 3 * kTile / 2, "block %d counted %d through the barrier, expected %d", b,
           counted[b], 3 * kTile / 2);
  }
  std::printf("cuda::barrier: %d rounds of copies, split arrive and wait, arrive_and_drop\n",
              rounds);

  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  std::printf("async-copies: PASSED\n");
  return 0;
}
