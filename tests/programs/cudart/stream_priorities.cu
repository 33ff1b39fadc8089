// Stream priorities as programs use them (cudaDeviceGetStreamPriorityRange,
// cudaStreamCreateWithPriority): a kernel launched on the most urgent stream after a long kernel
// of the least urgent one runs before the long kernel's blocks still waiting to start, as a GPU
// dispatches a higher-priority stream's blocks first. The long kernel's blocks wait for the
// host's go, given only once both kernels have been launched, so it is surely still running;
// each block counts itself done, and the urgent kernel reads the count. Ends
// "stream_priorities: PASSED".
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "checks.cuh"

// blocksDone[0] counts the blocks done; blocksDone[1] only keeps the busy work from being
// optimised away.
__global__ void waitForGo(const volatile int* go, unsigned* blocksDone) {
  if (threadIdx.x != 0) return;
  while (*go == 0) {
  }
  // Some work, so that the kernel is still far from done when the go comes.
  unsigned state = blockIdx.x;
  for (int i = 0; i < 10000; ++i) state = state * 1664525u + static_cast<unsigned>(*go);
  if (state == 0) atomicAdd(&blocksDone[1], 1u);
  atomicAdd(&blocksDone[0], 1u);
}

__global__ void readBlocksDone(const unsigned* blocksDone, unsigned* seen) {
  *seen = *static_cast<const volatile unsigned*>(blocksDone);
}

int main() {
  int least = 0;
  int greatest = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT(greatest < least, "the priority range %d..%d has one level", least, greatest);
  cudaStream_t lessUrgent = nullptr;
  cudaStream_t moreUrgent = nullptr;
  CHECK(cudaStreamCreateWithPriority(&lessUrgent, cudaStreamNonBlocking, least));
  CHECK(cudaStreamCreateWithPriority(&moreUrgent, cudaStreamNonBlocking, greatest));
  int priority = 0;
  CHECK(cudaStreamGetPriority(moreUrgent, &priority));
  EXPECT(priority == greatest, "the urgent stream's priority is %d, not %d", priority, greatest);

  int* go = nullptr;
  CHECK(cudaHostAlloc(&go, sizeof(int), cudaHostAllocMapped));
  *go = 0;
  int* goOnDevice = nullptr;
  CHECK(cudaHostGetDevicePointer(&goOnDevice, go, 0));
  unsigned* blocksDone = nullptr;
  unsigned* seen = nullptr;
  CHECK(cudaMalloc(&blocksDone, 2 * sizeof(unsigned)));
  CHECK(cudaMalloc(&seen, sizeof(unsigned)));
  CHECK(cudaMemset(blocksDone, 0, 2 * sizeof(unsigned)));
  CHECK(cudaDeviceSynchronize());

  // More blocks than any GPU holds at once, so most of them are still to start when the urgent
  // kernel arrives.
  constexpr unsigned kBlocks = 8192;
  waitForGo<<<kBlocks, 32, 0, lessUrgent>>>(goOnDevice, blocksDone);
  CHECK(cudaGetLastError());
  readBlocksDone<<<1, 1, 0, moreUrgent>>>(blocksDone, seen);
  CHECK(cudaGetLastError());
  // Both kernels reach the device meanwhile; the urgent one never waits for the go itself.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  *reinterpret_cast<volatile int*>(go) = 1;
  CHECK(cudaStreamSynchronize(moreUrgent));
  CHECK(cudaStreamSynchronize(lessUrgent));

  unsigned seenDone = 0;
  unsigned allDone = 0;
  CHECK(cudaMemcpy(&seenDone, seen, sizeof(unsigned), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&allDone, blocksDone, sizeof(unsigned), cudaMemcpyDeviceToHost));
  EXPECT(allDone == kBlocks, "%u of %u blocks of the long kernel ran", allDone, kBlocks);
  EXPECT(seenDone < kBlocks / 2,
         "the urgent kernel ran after %u of the long kernel's %u blocks: it waited for them",
         seenDone, kBlocks);
  std::printf("the urgent kernel ran after %u of %u blocks of the earlier, less urgent kernel\n",
              seenDone, kBlocks);

  CHECK(cudaStreamDestroy(lessUrgent));
  CHECK(cudaStreamDestroy(moreUrgent));
  CHECK(cudaFreeHost(go));
  CHECK(cudaFree(blocksDone));
  CHECK(cudaFree(seen));
  std::printf("stream_priorities: PASSED\n");
  return 0;
}
