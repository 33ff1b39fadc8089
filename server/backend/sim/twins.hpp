#pragma once
// CPU twins of the kernels in tests/programs/kernels/test_kernels.cu. A twin does exactly what its
// CUDA kernel does for a given launch configuration (same thread coverage, same faults), so a
// program gets the same results on `sim` as on a GPU.

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "server/backend/backend.hpp"

namespace gpuproxy::server::sim {

// What a twin sees of its launch.
class KernelContext {
public:
  virtual ~KernelContext() = default;
  virtual const backend::LaunchConfig& config() const = 0;
  // The bytes of parameter `index` in the packed buffer (its size was checked at module load).
  virtual std::span<const std::byte> parameter(std::size_t index) const = 0;
  // Host address of device range [address, address + bytes) when it lies inside one live
  // allocation; nullptr otherwise, and the twin must then fault with CUDA_ERROR_ILLEGAL_ADDRESS.
  virtual std::byte* translate(CUdeviceptr address, std::size_t bytes) = 0;
  // Sleeps until `deadline`; false when the device is being reset or destroyed first.
  virtual bool sleepUntil(std::chrono::steady_clock::time_point deadline) = 0;

  template <typename T>
  T parameterAs(std::size_t index) const {
    T value{};
    const std::span<const std::byte> bytes = parameter(index);
    std::memcpy(&value, bytes.data(), std::min(sizeof(T), bytes.size()));
    return value;
  }
};

using TwinFunction = CUresult (*)(KernelContext& context);

struct Twin {
  std::string_view name;                      // the kernel's entry name in PTX
  std::vector<std::uint32_t> parameterSizes;  // must match the PTX declaration
  bool touchesMemory = false;                 // needs device memory (held stable while it runs)
  TwinFunction run = nullptr;
};

// The twin registered under `name`, or nullptr.
const Twin* findTwin(std::string_view name);
const std::vector<Twin>& allTwins();

}  // namespace gpuproxy::server::sim
