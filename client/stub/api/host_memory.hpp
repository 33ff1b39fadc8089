#pragma once
// Page-locked host memory as the pointer queries see it (memory.cpp keeps the table).

#include <cstdint>
#include <optional>

namespace gpuproxy::stub {

struct HostAllocationRange {
  std::uint64_t start = 0;
  std::uint64_t bytes = 0;    // as mapped: whole pages
  std::uint64_t context = 0;  // current when it was allocated
  std::uint64_t bufferId = 0;
  bool deviceMapped = false;  // from the shared pinned heap: devices reach it at the same address
};

// The cuMemAllocHost / cuMemHostAlloc allocation `pointer` points into, if any.
std::optional<HostAllocationRange> hostAllocationContaining(std::uint64_t pointer);

}  // namespace gpuproxy::stub
