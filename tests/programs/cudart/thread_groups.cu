// Cooperative groups' tiles as kernels use them, built for compute capability 8.0, where tiles of
// more than one warp keep their scratch in the shared memory a GPU reserves for each block
// (%reserved_smem_offset_1) rather than in memory the program gives them. `thread_groups` ends
// with "thread-groups: PASSED" (exit 0) or a line naming what went wrong (exit 1).
//
//   - tiles of 16, 32, 64, 128 and 256 threads each sum their threads' values (cg::reduce), take
//     a value from one of their threads (tile.shfl) and report their ranks, beside a __shared__
//     array of the kernel's own that the tiles' scratch must leave alone;
//   - warpSize, which nvcc writes as PTX's WARP_SZ.

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "checks.cuh"

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

// Per thread: its tile's sum, its rank in the tile and the tile's rank, the value of thread 3 of
// its tile, and the kernel's own shared value it read back after the tile's work.
struct Seen {
  int sum;
  int rank;
  int tileRank;
  int third;
  int own;
};

template <int TileSize>
__global__ void tiles(Seen* seen, int* warpSizeSeen) {
  __shared__ int own[kThreads];
  own[threadIdx.x] = 3 * static_cast<int>(threadIdx.x);
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<TileSize> tile = cg::tiled_partition<TileSize>(block);
  const int value = static_cast<int>(threadIdx.x) * 2 + 1;
  Seen mine;
  mine.sum = cg::reduce(tile, value, cg::plus<int>());
  mine.rank = static_cast<int>(tile.thread_rank());
  mine.tileRank = static_cast<int>(tile.meta_group_rank());
  mine.third = tile.shfl(value, 3);
  block.sync();
  mine.own = own[threadIdx.x];
  seen[threadIdx.x] = mine;
  if (threadIdx.x == 0) *warpSizeSeen = warpSize;
}

template <int TileSize>
int checkTiles(Seen* seen, int* warpSizeSeen) {
  tiles<TileSize><<<1, kThreads>>>(seen, warpSizeSeen);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<Seen> host(kThreads);
  int hostWarpSize = 0;
  CHECK(cudaMemcpy(host.data(), seen, sizeof(Seen) * kThreads, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&hostWarpSize, warpSizeSeen, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(hostWarpSize == 32, "warpSize %d", hostWarpSize);
  for (int t = 0; t < kThreads; ++t) {
    const int first = t / TileSize * TileSize;
    int sum = 0;
    for (int u = first; u < first + TileSize; ++u) sum += u * 2 + 1;
    const Seen& got = host[static_cast<std::size_t>(t)];
    EXPECT(got.sum == sum, "tile of %d, thread %d: sum %d, expected %d", TileSize, t, got.sum,
           sum);
    EXPECT(got.rank == t % TileSize && got.tileRank == t / TileSize,
           "tile of %d, thread %d: ranks %d and %d", TileSize, t, got.rank, got.tileRank);
    EXPECT(got.third == (first + 3) * 2 + 1, "tile of %d, thread %d: shfl gave %d", TileSize, t,
           got.third);
    EXPECT(got.own == 3 * t, "tile of %d, thread %d: the kernel's own shared value became %d",
           TileSize, t, got.own);
  }
  std::printf("tiles of %d: sums, ranks and shuffles as on the host\n", TileSize);
  return 0;
}

int main() {
  Seen* seen = nullptr;
  int* warpSizeSeen = nullptr;
  CHECK(cudaMalloc(&seen, sizeof(Seen) * kThreads));
  CHECK(cudaMalloc(&warpSizeSeen, sizeof(int)));
  if (checkTiles<16>(seen, warpSizeSeen) != 0 || checkTiles<32>(seen, warpSizeSeen) != 0 ||
      checkTiles<64>(seen, warpSizeSeen) != 0 || checkTiles<128>(seen, warpSizeSeen) != 0 ||
      checkTiles<256>(seen, warpSizeSeen) != 0) {
    return 1;
  }
  CHECK(cudaFree(seen));
  CHECK(cudaFree(warpSizeSeen));
  std::printf("thread-groups: PASSED\n");
  return 0;
}
