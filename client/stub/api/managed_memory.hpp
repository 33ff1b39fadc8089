#pragma once
// Managed memory (cuMemAllocManaged), kept in the shared pinned heap (managed_memory.cpp).

#include <cuda.h>

#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

// Frees the managed allocation `range` (cuMemFree of its start), once the work queued before has
// completed, as cuMemFree does.
CUresult freeManaged(Runtime& runtime, const AllocationRange& range);

}  // namespace gpuproxy::stub
