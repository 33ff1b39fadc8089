// Memory pools: each device's default pool, the one cudaMallocAsync uses (PyTorch's and RAPIDS'
// allocators ask for it to set its release threshold and read its usage), and pools the
// application creates (cuMemPoolCreate, as RMM's cuda_async_memory_resource does). Pools live in
// the stub: an allocation from any of them is an ordinary allocation of the tenant's, which the
// pool counts. A pool created shareable (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) exports as a
// file descriptor another process of the tenant imports, and its allocations as interprocess
// handles of the daemon's (interprocess.hpp), which that process imports from the imported pool.
// Pools of host memory and other handle types are not offered.

#include "client/stub/api/memory_pools.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "client/stub/api/interprocess.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::guarded;
using gpuproxy::stub::Runtime;

namespace {

// At most this many devices have pools: more than any node has GPUs.
constexpr std::size_t kMaxDevices = 64;

struct Pool {
  std::uint32_t device = 0;
  bool isDefault = false;
  bool destroyed = false;      // cuMemPoolDestroy'd while allocations were still out
  std::uint64_t maxBytes = 0;  // cuMemPoolCreate's maxSize; 0: no limit but the tenant's
  // Attributes as set; the release threshold is kept and answered, and changes nothing (the pool
  // keeps no memory back to release).
  std::uint64_t releaseThreshold = 0;
  int reuseFollowEventDependencies = 1;
  int reuseAllowOpportunistic = 1;
  int reuseAllowInternalDependencies = 1;
  std::uint64_t usedBytes = 0;
  std::uint64_t usedHigh = 0;
  std::uint64_t liveAllocations = 0;
  bool shareable = false;  // created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
  bool imported = false;   // cuMemPoolImportFromShareableHandle: holds other processes' memory
};

// Every pool, by handle (the handle is the record's address). Callers hold mutex() around
// everything but instance().
class Pools {
public:
  static Pools& instance() {
    static auto* pools = new Pools();  // handles stay valid through static destruction
    return *pools;
  }
  std::mutex& mutex() { return mutex_; }

  static CUmemoryPool handleOf(Pool& pool) { return reinterpret_cast<CUmemoryPool>(&pool); }

  // A pool that exists (destroyed ones do not); null for anything else.
  Pool* find(CUmemoryPool handle) {
    auto* pool = reinterpret_cast<Pool*>(handle);
    const auto address = reinterpret_cast<std::uintptr_t>(handle);
    const auto first = reinterpret_cast<std::uintptr_t>(defaults_.data());
    if (address >= first && address < first + sizeof(defaults_)) {
      return (address - first) % sizeof(Pool) == 0 ? pool : nullptr;
    }
    const auto found = created_.find(pool);
    return found != created_.end() && !found->second->destroyed ? pool : nullptr;
  }
  Pool& defaultOf(std::uint32_t device) { return defaults_.at(device); }
  Pool*& current(std::uint32_t device) { return current_.at(device); }

  Pool& create(std::uint32_t device, std::uint64_t maxBytes) {
    auto pool = std::make_unique<Pool>();
    pool->device = device;
    pool->maxBytes = maxBytes;
    Pool& made = *pool;
    created_.emplace(&made, std::move(pool));
    return made;
  }
  // The device's current pool becomes its default again if it was this one; the record goes
  // once nothing allocated from it is left.
  void destroy(Pool& pool) {
    if (current_[pool.device] == &pool) current_[pool.device] = &defaults_[pool.device];
    pool.destroyed = true;
    if (pool.liveAllocations == 0) created_.erase(&pool);
  }

  // The pool an allocation (or imported pointer) at `pointer` came from; null for any other.
  Pool* poolOf(std::uint64_t pointer) {
    auto found = live_.find(pointer);
    return found == live_.end() ? nullptr : found->second.pool;
  }

  // The pool whose allocation holds `pointer` (anywhere inside it); null for any other.
  Pool* poolHolding(std::uint64_t pointer) {
    auto after = live_.upper_bound(pointer);
    if (after == live_.begin()) return nullptr;
    auto holding = std::prev(after);
    return pointer - holding->first < holding->second.bytes ? holding->second.pool : nullptr;
  }

  void allocated(Pool& pool, std::uint64_t pointer, std::uint64_t bytes) {
    pool.usedBytes += bytes;
    pool.usedHigh = std::max(pool.usedHigh, pool.usedBytes);
    ++pool.liveAllocations;
    live_[pointer] = Live{&pool, bytes};
  }
  void freed(std::uint64_t pointer) {
    auto found = live_.find(pointer);
    if (found == live_.end()) return;
    Pool& pool = *found->second.pool;
    pool.usedBytes -= found->second.bytes;
    --pool.liveAllocations;
    live_.erase(found);
    if (pool.destroyed && pool.liveAllocations == 0) created_.erase(&pool);
  }

private:
  Pools() {
    for (std::uint32_t device = 0; device < defaults_.size(); ++device) {
      defaults_[device].device = device;
      defaults_[device].isDefault = true;
      current_[device] = &defaults_[device];
    }
  }

  struct Live {
    Pool* pool;
    std::uint64_t bytes;
  };
  std::mutex mutex_;
  std::array<Pool, kMaxDevices> defaults_{};
  std::array<Pool*, kMaxDevices> current_{};
  std::unordered_map<Pool*, std::unique_ptr<Pool>> created_;
  std::map<std::uint64_t, Live> live_;  // pool allocations by address
};

// A device ordinal that has pools: a device of this client's, below kMaxDevices.
bool poolsFor(Runtime& runtime, CUdevice device) {
  return runtime.device(device) != nullptr && static_cast<std::size_t>(device) < kMaxDevices;
}

// A device's default (`current` false) or current pool.
CUresult getPool(Runtime& runtime, CUmemoryPool* pool, CUdevice dev, bool current) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!poolsFor(runtime, dev)) return CUDA_ERROR_INVALID_DEVICE;
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  const auto device = static_cast<std::uint32_t>(dev);
  *pool = Pools::handleOf(current ? *pools.current(device) : pools.defaultOf(device));
  return CUDA_SUCCESS;
}

CUresult setPool(Runtime& runtime, CUdevice dev, CUmemoryPool handle) {
  if (!poolsFor(runtime, dev)) return CUDA_ERROR_INVALID_DEVICE;
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  Pool* pool = pools.find(handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The pool must be the device's own.
  if (pool->device != static_cast<std::uint32_t>(dev)) return CUDA_ERROR_INVALID_DEVICE;
  pools.current(pool->device) = pool;
  return CUDA_SUCCESS;
}

// The device a pinned-memory pool location names (cuMemGetMemPool and the rest): pools of host
// memory and managed pools are not offered.
CUresult locatedDevice(Runtime& runtime, const CUmemLocation* location, CUmemAllocationType type,
                       CUdevice& device) {
  if (location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED || location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return location->type == CU_MEM_LOCATION_TYPE_DEVICE || type == CU_MEM_ALLOCATION_TYPE_PINNED
               ? CUDA_ERROR_NOT_SUPPORTED
               : CUDA_ERROR_INVALID_VALUE;
  }
  device = location->id;
  return poolsFor(runtime, device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// cuMemGetDefaultMemPool (`current` false) and cuMemGetMemPool.
CUresult getLocatedPool(const char* entryPoint, CUmemoryPool* pool, const CUmemLocation* location,
                        CUmemAllocationType type, bool current) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    CUdevice device = 0;
    const CUresult located = locatedDevice(runtime, location, type, device);
    return located != CUDA_SUCCESS ? located : getPool(runtime, pool, device, current);
  });
}

}  // namespace

namespace gpuproxy::stub {

std::optional<std::uint32_t> poolDevice(CUmemoryPool handle) {
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  const Pool* pool = pools.find(handle);
  if (pool == nullptr) return std::nullopt;
  return pool->device;
}

CUmemoryPool currentPool(std::uint32_t device) {
  if (device >= kMaxDevices) return nullptr;
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  return Pools::handleOf(*pools.current(device));
}

CUresult poolRoomFor(CUmemoryPool handle, std::uint64_t bytes) {
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  const Pool* pool = pools.find(handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (pool->imported) return CUDA_ERROR_INVALID_VALUE;  // CUDA allocates from no imported pool
  if (pool->maxBytes != 0 && (bytes > pool->maxBytes || pool->usedBytes > pool->maxBytes - bytes)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

void notePoolAllocation(CUmemoryPool handle, std::uint64_t pointer, std::uint64_t bytes) {
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  if (Pool* pool = pools.find(handle)) pools.allocated(*pool, pointer, bytes);
}

void notePoolFree(std::uint64_t pointer) {
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  pools.freed(pointer);
}

bool fromPool(std::uint64_t pointer) {
  Pools& pools = Pools::instance();
  std::lock_guard lock(pools.mutex());
  return pools.poolHolding(pointer) != nullptr;
}

std::optional<CUresult> freeImportedPoolPointer(Runtime& runtime, std::uint64_t pointer) {
  {
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex());
    const Pool* pool = pools.poolOf(pointer);
    if (pool == nullptr || !pool->imported) return std::nullopt;
  }
  const CUresult closed = closeIpcMemory(runtime, pointer);
  if (closed == CUDA_SUCCESS) notePoolFree(pointer);
  return closed;
}

CUresult contextForPool(Runtime& runtime, std::uint32_t poolDevice, std::uint64_t preferred,
                        std::uint64_t& context) {
  std::optional<ContextRecord> record = runtime.context(preferred);
  if (record && record->device == poolDevice) {
    context = preferred;
    return CUDA_SUCCESS;
  }
  std::optional<std::uint64_t> primary = runtime.primaryContext(poolDevice);
  if (!primary) {
    CUcontext retained = nullptr;
    if (CUresult result = cuDevicePrimaryCtxRetain(&retained, static_cast<CUdevice>(poolDevice));
        result != CUDA_SUCCESS) {
      return result;
    }
    primary = handleValue(retained);
  }
  context = *primary;
  return CUDA_SUCCESS;
}

}  // namespace gpuproxy::stub

GPUPROXY_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  return guarded(__func__,
                 [&](Runtime& runtime) { return getPool(runtime, pool_out, dev, false); });
}

GPUPROXY_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) { return getPool(runtime, pool, dev, true); });
}

GPUPROXY_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  return guarded(__func__, [&](Runtime& runtime) { return setPool(runtime, dev, pool); });
}

GPUPROXY_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool* pool_out, CUmemLocation* location,
                                                CUmemAllocationType type) {
  return getLocatedPool(__func__, pool_out, location, type, false);
}

GPUPROXY_EXPORT CUresult cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* location,
                                         CUmemAllocationType type) {
  return getLocatedPool(__func__, pool, location, type, true);
}

GPUPROXY_EXPORT CUresult cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type,
                                         CUmemoryPool pool) {
  return guarded(__func__, [&](Runtime& runtime) {
    CUdevice device = 0;
    if (CUresult located = locatedDevice(runtime, location, type, device);
        located != CUDA_SUCCESS) {
      return located;
    }
    const CUresult set = setPool(runtime, device, pool);
    return set == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : set;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pool == nullptr || poolProps == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    switch (gpuproxy::stub::enumValue(poolProps->location.type)) {
      case CU_MEM_LOCATION_TYPE_DEVICE:
        break;
      case CU_MEM_LOCATION_TYPE_HOST:
      case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        return CUDA_ERROR_NOT_SUPPORTED;  // pools of host memory
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!poolsFor(runtime, poolProps->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    // Of the handle types another process could import the memory by, a file descriptor
    // (interprocess.hpp); nor are the usage hints CUDA has added since offered (none but 0 is
    // defined for pinned device pools).
    if (poolProps->handleTypes != CU_MEM_HANDLE_TYPE_NONE &&
        poolProps->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (poolProps->usage != 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (poolProps->win32SecurityAttributes != nullptr) return CUDA_ERROR_INVALID_VALUE;
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex());
    Pool& made =
        pools.create(static_cast<std::uint32_t>(poolProps->location.id), poolProps->maxSize);
    made.shareable = poolProps->handleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    *pool = Pools::handleOf(made);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool handle) {
  return guarded(__func__, [&](Runtime&) {
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex());
    Pool* pool = pools.find(handle);
    if (pool == nullptr || pool->isDefault) return CUDA_ERROR_INVALID_VALUE;
    pools.destroy(*pool);
    return CUDA_SUCCESS;
  });
}

// A pool's memory is read and written by its own device. Other devices cannot be given access:
// through gpuproxy no two devices are peers (cuDeviceCanAccessPeer answers 0).
GPUPROXY_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool handle, const CUmemAccessDesc* map,
                                            size_t count) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (map == nullptr && count != 0) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<std::uint32_t> device = gpuproxy::stub::poolDevice(handle);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& access = map[i];
      if (access.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (access.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
          access.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          access.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (runtime.device(access.location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
      const bool own = static_cast<std::uint32_t>(access.location.id) == *device;
      // The owning device keeps read-write access; a peer gets none.
      if (own ? access.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE
              : access.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
    }
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool handle,
                                            CUmemLocation* location) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<std::uint32_t> device = gpuproxy::stub::poolDevice(handle);
    if (!device || location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(location->id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *flags = static_cast<std::uint32_t>(location->id) == *device
                 ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                 : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                               void* value) {
  return guarded(__func__, [&](Runtime&) {
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex());
    Pool* found = pools.find(pool);
    if (found == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex());
    Pool* found = pools.find(pool);
    if (found == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
    return gpuproxy::stub::poolDevice(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

// ---- sharing a pool with other processes ------------------------------------------------------
// The file descriptor a shareable pool exports is a sealed memfd naming the pool's device; what
// the importing process gets from it is a pool of its own on that device, from which it imports
// the exporter's allocations by their exported pointers (an interprocess handle of the daemon's
// each). The descriptor itself carries no access: the daemon checks every import.

namespace {

constexpr std::array<char, 8> kPoolFileTag = {'g', 'p', 'x', 'p', 'o', 'o', 'l', '1'};
struct PoolFile {
  std::array<char, 8> tag = kPoolFileTag;
  std::uint32_t device = 0;
};

}  // namespace

GPUPROXY_EXPORT CUresult cuMemPoolExportToShareableHandle(void* handle_out, CUmemoryPool pool,
                                                          CUmemAllocationHandleType handleType,
                                                          unsigned long long flags) {
  return guarded(__func__, [&](Runtime&) {
    if (handle_out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    PoolFile contents;
    {
      Pools& pools = Pools::instance();
      std::lock_guard lock(pools.mutex());
      const Pool* found = pools.find(pool);
      if (found == nullptr || found->imported) return CUDA_ERROR_INVALID_VALUE;
      // Only the handle type the pool was made for.
      if (!found->shareable || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      contents.device = found->device;
    }
    const int fd =
        gpuproxy::stub::sealedFileHolding("gpuproxy-memory-pool", &contents, sizeof(contents));
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::memcpy(handle_out, &fd, sizeof(fd));
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool* pool_out, void* handle,
                                                            CUmemAllocationHandleType handleType,
                                                            unsigned long long flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pool_out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    // CUDA passes the descriptor itself as the pointer's value.
    const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(handle));
    PoolFile contents;
    if (!gpuproxy::stub::readSealedFile(fd, &contents, sizeof(contents)) ||
        contents.tag != kPoolFileTag) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!poolsFor(runtime, static_cast<CUdevice>(contents.device)))
      return CUDA_ERROR_INVALID_DEVICE;
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex());
    Pool& imported = pools.create(contents.device, 0);
    imported.imported = true;
    *pool_out = Pools::handleOf(imported);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData* shareData_out,
                                                CUdeviceptr ptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (shareData_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    {
      Pools& pools = Pools::instance();
      std::lock_guard lock(pools.mutex());
      const Pool* pool = pools.poolOf(ptr);
      if (pool == nullptr || !pool->shareable) return CUDA_ERROR_INVALID_VALUE;
    }
    gpuproxy::stub::IpcHandle handle;
    if (CUresult exported = gpuproxy::stub::exportIpcMemory(runtime, ptr, handle);
        exported != CUDA_SUCCESS) {
      return exported;
    }
    gpuproxy::stub::writeIpcHandle(reinterpret_cast<char*>(shareData_out->reserved),
                                   gpuproxy::stub::IpcHandle::Kind::kPoolPointer, handle);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr* ptr_out, CUmemoryPool pool,
                                                CUmemPoolPtrExportData* shareData) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (ptr_out == nullptr || shareData == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<std::uint32_t> device = gpuproxy::stub::poolDevice(pool);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    {
      Pools& pools = Pools::instance();
      std::lock_guard lock(pools.mutex());
      if (!pools.find(pool)->imported) return CUDA_ERROR_INVALID_VALUE;
    }
    gpuproxy::stub::IpcHandle handle;
    if (!gpuproxy::stub::readIpcHandle(reinterpret_cast<const char*>(shareData->reserved),
                                       gpuproxy::stub::IpcHandle::Kind::kPoolPointer, handle)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::uint64_t context = 0;
    if (CUresult found = gpuproxy::stub::contextForPool(runtime, *device,
                                                        gpuproxy::stub::currentContext(), context);
        found != CUDA_SUCCESS) {
      return found;
    }
    CUdeviceptr pointer = 0;
    if (CUresult opened = gpuproxy::stub::openIpcMemory(runtime, context, handle, pointer);
        opened != CUDA_SUCCESS) {
      return opened;
    }
    std::optional<gpuproxy::stub::AllocationRange> range = runtime.allocationContaining(pointer);
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex());
    Pool* imported = pools.find(pool);
    if (imported != nullptr && pools.poolOf(pointer) == nullptr) {
      pools.allocated(*imported, pointer, range ? range->bytes : 0);
    }
    *ptr_out = pointer;
    return CUDA_SUCCESS;
  });
}
