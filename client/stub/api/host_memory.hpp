#pragma once
// Page-locked host memory as the pointer queries see it (memory.cpp keeps the table), and the
// shared pinned heap's ranges as page-locked and managed memory both take them.

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "client/stub/pinned_heap.hpp"
#include "ipc/unique_fd.hpp"

namespace gpuproxy::stub {

class Runtime;

struct HostAllocationRange {
  std::uint64_t start = 0;
  std::uint64_t bytes = 0;    // as mapped: whole pages
  std::uint64_t context = 0;  // current when it was allocated
  std::uint64_t bufferId = 0;
  // Devices reach it at the same address: the shared pinned heap's, or a cuMemHostRegister range
  // that gpuproxyd maps too.
  bool deviceMapped = false;
  // The flags cuMemAllocHost (0) or cuMemHostAlloc was given; nullopt for a cuMemHostRegister
  // range, whose flags cuMemHostGetFlags does not report.
  std::optional<unsigned> allocationFlags;
};

// The cuMemAllocHost / cuMemHostAlloc allocation or cuMemHostRegister range `pointer` points
// into, if any.
std::optional<HostAllocationRange> hostAllocationContaining(std::uint64_t pointer);

// A range of `bytes` of the shared pinned heap, its pages faulted in by this process, then
// registered with gpuproxyd, which charges it to the tenant's pinned memory and maps it for every
// GPU at the same address. CUDA_ERROR_OUT_OF_MEMORY when the heap has no room (logged, naming
// `entryPoint`, unless that is null: a caller with somewhere else to go), the daemon's error when
// it refuses (the tenant's limit).
CUresult allocateSharedPinned(Runtime& runtime, PinnedHeap& heap, const char* entryPoint,
                              std::uint64_t bytes, PinnedHeap::Allocation& allocation);
// Unregisters the range at `offset` from gpuproxyd, which answers once the work queued before has
// completed; the caller then gives it back to the heap.
CUresult unregisterSharedPinned(Runtime& runtime, std::uint64_t offset);

// Has gpuproxyd map `[fileOffset, fileOffset + bytes)` of `file` (a memfd sealed against
// shrinking, mapped shared here at `address`) at the same address, charge it to the tenant's
// pinned memory and register it with every GPU. CUDA_ERROR_ALREADY_MAPPED when gpuproxyd has
// that address in use, CUDA_ERROR_INVALID_VALUE for a file it refuses.
CUresult registerSharedRange(Runtime& runtime, ipc::UniqueFd file, std::uint64_t fileOffset,
                             std::uint64_t address, std::uint64_t bytes);
// Undoes it, once the work queued before has completed.
CUresult unregisterSharedRange(Runtime& runtime, std::uint64_t address);

}  // namespace gpuproxy::stub
