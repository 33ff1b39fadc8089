#pragma once
// Managed memory (cuMemAllocManaged), kept in the shared pinned heap (managed_memory.cpp).

#include <cuda.h>

#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

// Frees the managed allocation `range` (cuMemFree of its start), once the work queued before has
// completed, as cuMemFree does.
CUresult freeManaged(Runtime& runtime, const AllocationRange& range);

// cuMemAllocManaged's work: `bytes` of managed memory of `context` at `start`, in the pinned heap
// when it has room, else in a mapping of its own, shared with gpuproxyd either way.
CUresult allocateManaged(Runtime& runtime, std::uint64_t context, std::uint64_t bytes,
                         CUdeviceptr& start);

}  // namespace gpuproxy::stub
