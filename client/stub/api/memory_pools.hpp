#pragma once
// Memory pools, which cuMemAllocAsync and cuMemAllocFromPoolAsync allocate from: each device's
// default pool and the pools an application creates (cuMemPoolCreate: RAPIDS' RMM makes its own),
// their handles and attributes (memory_pools.cpp), and the bookkeeping memory.cpp feeds them. A
// pool keeps nothing back: memory freed to it goes back to the device (and the tenant's limit) at
// once, so its reserved and used sizes are the same, and trimming has nothing to do.

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

// The device whose memory `pool` holds, for a pool that exists (not destroyed); else nullopt.
std::optional<std::uint32_t> poolDevice(CUmemoryPool pool);
// The pool cuMemAllocAsync allocates from on `device` (cuDeviceSetMemPool), or null when the
// device has none (an ordinal past any node's GPU count).
CUmemoryPool currentPool(std::uint32_t device);
// Whether `pool` may grow by `bytes` more (its cuMemPoolCreate maxSize): CUDA_SUCCESS, or
// CUDA_ERROR_OUT_OF_MEMORY.
CUresult poolRoomFor(CUmemoryPool pool, std::uint64_t bytes);
// An allocation of `bytes` at `pointer` made from `pool`.
void notePoolAllocation(CUmemoryPool pool, std::uint64_t pointer, std::uint64_t bytes);
// Any device memory freed (cuMemFree or cuMemFreeAsync): forgotten if it came from a pool; a
// destroyed pool goes with its last allocation.
void notePoolFree(std::uint64_t pointer);
// Whether [pointer] lies in memory a pool handed out (or imported): CUDA's legacy interprocess
// handles (cuIpcGetMemHandle) are not for it.
bool fromPool(std::uint64_t pointer);
// cuMemFree or cuMemFreeAsync of a pointer imported from another process's pool
// (cuMemPoolImportPointer): its import given back. nullopt for any other pointer.
std::optional<CUresult> freeImportedPoolPointer(Runtime& runtime, std::uint64_t pointer);
// The context a pool of `poolDevice` gets its memory through: `preferred` when it is on that
// device, else the device's primary context, which the stub retains for the rest of the process if
// the program has not.
CUresult contextForPool(Runtime& runtime, std::uint32_t poolDevice, std::uint64_t preferred,
                        std::uint64_t& context);

}  // namespace gpuproxy::stub
