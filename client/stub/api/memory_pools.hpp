#pragma once
// The default memory pool of each device, which cuMemAllocAsync allocates from: its handle and
// attributes (memory_pools.cpp), and the bookkeeping memory.cpp feeds it. The pool keeps nothing
// back: memory freed to it goes back to the device (and the tenant's limit) at once, so its
// reserved and used sizes are the same, and trimming has nothing to do.

#include <cuda.h>

#include <cstdint>
#include <optional>

namespace gpuproxy::stub {

// An allocation of `bytes` made from the default pool of `device` (cuMemAllocAsync).
void notePoolAllocation(std::uint32_t device, std::uint64_t pointer, std::uint64_t bytes);
// The device whose default pool `pool` is; nullopt for anything else.
std::optional<std::uint32_t> defaultPoolDevice(CUmemoryPool pool);
// Any device memory freed (cuMemFree or cuMemFreeAsync): forgotten if it came from a pool.
void notePoolFree(std::uint64_t pointer);

}  // namespace gpuproxy::stub
