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
  // Devices reach it at the same address: the shared pinned heap's, or a cuMemHostRegister range
  // that gpuproxyd maps too.
  bool deviceMapped = false;
};

// The cuMemAllocHost / cuMemHostAlloc allocation or cuMemHostRegister range `pointer` points
// into, if any.
std::optional<HostAllocationRange> hostAllocationContaining(std::uint64_t pointer);

}  // namespace gpuproxy::stub
