// Memory pools: each device's default pool, the one cudaMallocAsync uses (PyTorch's and RAPIDS'
// allocators ask for it to set its release threshold and read its usage). Explicit pools
// (cuMemPoolCreate) are not offered.

#include "client/stub/api/memory_pools.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::guarded;
using gpuproxy::stub::Runtime;

namespace {

// At most this many devices have a pool: more than any node has GPUs.
constexpr std::size_t kMaxDevices = 64;

struct DefaultPool {
  std::uint32_t device = 0;
  // Attributes as set; the release threshold is kept and answered, and changes nothing (the pool
  // keeps no memory back to release).
  std::uint64_t releaseThreshold = 0;
  int reuseFollowEventDependencies = 1;
  int reuseAllowOpportunistic = 1;
  int reuseAllowInternalDependencies = 1;
  std::uint64_t usedBytes = 0;
  std::uint64_t usedHigh = 0;
};

class DefaultPools {
public:
  static DefaultPools& instance() {
    static auto* pools = new DefaultPools();  // handles stay valid through static destruction
    return *pools;
  }

  CUmemoryPool handleOf(std::uint32_t device) {
    return reinterpret_cast<CUmemoryPool>(&pools_.at(device));
  }
  // Null for anything that is not one of these pools.
  DefaultPool* find(CUmemoryPool handle) {
    const auto address = reinterpret_cast<std::uintptr_t>(handle);
    const auto first = reinterpret_cast<std::uintptr_t>(pools_.data());
    if (address < first || (address - first) % sizeof(DefaultPool) != 0) return nullptr;
    const std::size_t index = (address - first) / sizeof(DefaultPool);
    return index < pools_.size() ? &pools_[index] : nullptr;
  }
  std::mutex& mutex() { return mutex_; }

  void allocated(std::uint32_t device, std::uint64_t pointer, std::uint64_t bytes) {
    if (device >= pools_.size()) return;
    std::lock_guard lock(mutex_);
    DefaultPool& pool = pools_[device];
    pool.usedBytes += bytes;
    pool.usedHigh = std::max(pool.usedHigh, pool.usedBytes);
    live_[pointer] = Live{device, bytes};
  }
  void freed(std::uint64_t pointer) {
    std::lock_guard lock(mutex_);
    auto found = live_.find(pointer);
    if (found == live_.end()) return;
    pools_[found->second.device].usedBytes -= found->second.bytes;
    live_.erase(found);
  }

private:
  DefaultPools() {
    for (std::uint32_t device = 0; device < pools_.size(); ++device) pools_[device].device = device;
  }

  struct Live {
    std::uint32_t device;
    std::uint64_t bytes;
  };
  std::mutex mutex_;
  std::array<DefaultPool, kMaxDevices> pools_{};
  std::unordered_map<std::uint64_t, Live> live_;  // pool allocations by address
};

CUresult getPool(const char* entryPoint, CUmemoryPool* pool, CUdevice dev) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(dev) == nullptr || static_cast<std::size_t>(dev) >= kMaxDevices) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    *pool = DefaultPools::instance().handleOf(static_cast<std::uint32_t>(dev));
    return CUDA_SUCCESS;
  });
}

}  // namespace

namespace gpuproxy::stub {

void notePoolAllocation(std::uint32_t device, std::uint64_t pointer, std::uint64_t bytes) {
  DefaultPools::instance().allocated(device, pointer, bytes);
}

void notePoolFree(std::uint64_t pointer) {
  DefaultPools::instance().freed(pointer);
}

std::optional<std::uint32_t> defaultPoolDevice(CUmemoryPool pool) {
  DefaultPool* found = DefaultPools::instance().find(pool);
  if (found == nullptr) return std::nullopt;
  return found->device;
}

}  // namespace gpuproxy::stub

GPUPROXY_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  return getPool(__func__, pool_out, dev);
}

// Every device's current pool is its default pool: no other pool can be made here.
GPUPROXY_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  return getPool(__func__, pool, dev);
}

GPUPROXY_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    DefaultPool* found = DefaultPools::instance().find(pool);
    if (found == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Making a device's own default pool current again is all there is to do.
    return found->device == static_cast<std::uint32_t>(dev) ? CUDA_SUCCESS
                                                            : CUDA_ERROR_INVALID_DEVICE;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                               void* value) {
  return guarded(__func__, [&](Runtime&) {
    DefaultPool* found = DefaultPools::instance().find(pool);
    if (found == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(DefaultPools::instance().mutex());
    auto answer = [value](auto number) {
      std::memcpy(value, &number, sizeof(number));
      return CUDA_SUCCESS;
    };
    switch (gpuproxy::stub::enumValue(attr)) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        return answer(found->reuseFollowEventDependencies);
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        return answer(found->reuseAllowOpportunistic);
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        return answer(found->reuseAllowInternalDependencies);
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        return answer(cuuint64_t{found->releaseThreshold});
      // Nothing is kept back, so what the pool reserves is what is in use.
      case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        return answer(cuuint64_t{found->usedBytes});
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        return answer(cuuint64_t{found->usedHigh});
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                               void* value) {
  return guarded(__func__, [&](Runtime&) {
    DefaultPool* found = DefaultPools::instance().find(pool);
    if (found == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(DefaultPools::instance().mutex());
    int flag = 0;
    cuuint64_t number = 0;
    switch (gpuproxy::stub::enumValue(attr)) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        std::memcpy(&flag, value, sizeof(flag));
        if (flag != 0 && flag != 1) return CUDA_ERROR_INVALID_VALUE;
        (attr == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
             ? found->reuseFollowEventDependencies
         : attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
             ? found->reuseAllowOpportunistic
             : found->reuseAllowInternalDependencies) = flag;
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        std::memcpy(&number, value, sizeof(number));
        found->releaseThreshold = number;
        return CUDA_SUCCESS;
      // The high watermarks can only be reset, to the current use.
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        std::memcpy(&number, value, sizeof(number));
        if (number != 0) return CUDA_ERROR_INVALID_VALUE;
        found->usedHigh = found->usedBytes;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

// The pool keeps no freed memory, so there is never anything to release.
GPUPROXY_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t /*minBytesToKeep*/) {
  return guarded(__func__, [&](Runtime&) {
    return DefaultPools::instance().find(pool) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}
