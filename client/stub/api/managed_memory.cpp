// Managed memory: cuMemAllocManaged, its hints (cuMemPrefetchAsync, cuMemAdvise,
// cuStreamAttachMemAsync) and its free.
//
// Managed memory is one pointer that the host and every device may use. Through gpuproxy it is
// shared memory that this process and gpuproxyd map at the same address and that gpuproxyd
// registers with every GPU as device-mapped host memory (unified addressing: the device address
// is the host address): a range of the shared pinned heap when it has room, else a sealed memfd
// of the allocation's own, registered as cuMemHostRegister registers shared memory. So the
// application reads and writes it in place, kernels reach it at the same pointer, copies and
// memsets may name it as device memory, and it is always coherent: nothing ever migrates, the
// data stays where both sides reach it ("zero-copy", as CUDA itself places managed memory on
// systems without page migration). That is also why the hints are accepted, checked, and change
// nothing: CUDA documents prefetching and advice as not required for functionality. On a GPU,
// kernels read such memory over the bus, more slowly than device memory; on the sim it makes no
// difference.
//
// The memory is pinned host memory to the daemon: charged to the tenant's pinned_memory_limit,
// and given back when the process exits or is killed.

#include "client/stub/api/managed_memory.hpp"

#include <cuda.h>

#include <fcntl.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>

#include "client/stub/api/host_memory.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "client/stub/log.hpp"
#include "client/stub/pinned_heap.hpp"
#include "ipc/shared_segment.hpp"

using gpuproxy::stub::AllocationRange;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamTarget;

namespace gpuproxy::stub {

namespace {

// Managed allocations that did not fit in the pinned heap: each a mapping of its own, by start.
struct OwnMappings {
  std::mutex mutex;
  std::map<std::uint64_t, std::unique_ptr<ipc::SharedSegment>> byStart;
};

OwnMappings& ownMappings() {
  static auto* mappings = new OwnMappings;  // leaked on purpose, as the other tables
  return *mappings;
}

// gpuproxyd may have the address chosen for a mapping in use; another try picks another random
// place (the refused mapping is kept until then, so that it cannot be chosen again).
constexpr int kMappingAttempts = 4;

// MemAvailable from /proc/meminfo, in bytes; nullopt when it cannot be read.
std::optional<std::uint64_t> availableMemory() {
  std::FILE* meminfo = std::fopen("/proc/meminfo", "re");
  if (meminfo == nullptr) return std::nullopt;
  std::optional<std::uint64_t> available;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof(line), meminfo) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      available = std::uint64_t{kib} * 1024;
      break;
    }
  }
  std::fclose(meminfo);
  return available;
}

CUresult allocateOwnMapping(Runtime& runtime, std::uint64_t bytes, CUdeviceptr& start) {
  // Every page is touched below: more than the machine has would end in the OOM killer, not in
  // an error the application can handle.
  if (std::optional<std::uint64_t> available = availableMemory(); available && bytes > *available) {
    GPUPROXY_STUB_LOG(kWarn,
                      "cuMemAllocManaged: %llu bytes is more than the %llu this machine has "
                      "available",
                      static_cast<unsigned long long>(bytes),
                      static_cast<unsigned long long>(*available));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::unique_ptr<ipc::SharedSegment> refused;
  for (int attempt = 0; attempt < kMappingAttempts; ++attempt) {
    std::unique_ptr<ipc::SharedSegment> mapping;
    try {
      // Where gpuproxyd (and, on a chained cuda backend, the daemon behind it) most likely has
      // the same addresses free.
      const auto length = static_cast<std::size_t>(bytes);
      ipc::AddressReservation place =
          ipc::AddressReservation::reserve(length, ipc::AddressReservation::randomHint());
      mapping = std::make_unique<ipc::SharedSegment>(
          ipc::SharedSegment::create("gpuproxy-managed", length, &place));
    } catch (const std::system_error& error) {
      GPUPROXY_STUB_LOG(kWarn, "cuMemAllocManaged: no shared memory for %llu bytes (%s)",
                        static_cast<unsigned long long>(bytes), error.what());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // Touched here first, so that the application's pod pays for the pages (see
    // allocateSharedPinned).
    volatile std::byte* pages = mapping->data();
    const std::size_t page = ipc::pageSize();
    for (std::size_t at = 0; at < mapping->size(); at += page) pages[at] = pages[at];
    const auto address = reinterpret_cast<std::uint64_t>(mapping->data());
    const CUresult registered =
        registerSharedRange(runtime, ipc::UniqueFd(::fcntl(mapping->fd(), F_DUPFD_CLOEXEC, 0)), 0,
                            address, mapping->size());
    if (registered == CUDA_SUCCESS) {
      start = address;
      OwnMappings& mappings = ownMappings();
      std::lock_guard lock(mappings.mutex);
      mappings.byStart.emplace(address, std::move(mapping));
      return CUDA_SUCCESS;
    }
    if (registered != CUDA_ERROR_ALREADY_MAPPED) return registered;  // the tenant's limit, ...
    refused = std::move(mapping);
  }
  GPUPROXY_STUB_LOG(kWarn, "cuMemAllocManaged: no address for %llu bytes suits gpuproxyd too",
                    static_cast<unsigned long long>(bytes));
  return CUDA_ERROR_OUT_OF_MEMORY;
}

}  // namespace

CUresult freeManaged(Runtime& runtime, const AllocationRange& range) {
  if (PinnedHeap* heap = runtime.pinnedHeap()) {
    if (std::optional<PinnedHeap::Allocation> allocation =
            heap->lookup(reinterpret_cast<const void*>(range.start))) {
      if (CUresult unregistered = unregisterSharedPinned(runtime, allocation->offset);
          unregistered != CUDA_SUCCESS) {
        return unregistered;
      }
      runtime.forgetAllocation(range.start);
      heap->free(allocation->offset);
      return CUDA_SUCCESS;
    }
  }
  if (CUresult unregistered = unregisterSharedRange(runtime, range.start);
      unregistered != CUDA_SUCCESS) {
    return unregistered;
  }
  runtime.forgetAllocation(range.start);
  OwnMappings& mappings = ownMappings();
  std::lock_guard lock(mappings.mutex);
  mappings.byStart.erase(range.start);  // unmapped here; gpuproxyd has let go of it already
  return CUDA_SUCCESS;
}

CUresult allocateManaged(Runtime& runtime, std::uint64_t context, std::uint64_t bytes,
                         CUdeviceptr& start) {
  PinnedHeap* heap = runtime.pinnedHeap();
  PinnedHeap::Allocation allocation;
  const CUresult inHeap = heap == nullptr
                              ? CUDA_ERROR_OUT_OF_MEMORY
                              : allocateSharedPinned(runtime, *heap, nullptr, bytes, allocation);
  if (inHeap == CUDA_SUCCESS) {
    start = reinterpret_cast<CUdeviceptr>(heap->region().data() + allocation.offset);
  } else if (heap != nullptr && inHeap != CUDA_ERROR_OUT_OF_MEMORY) {
    return inHeap;
  } else if (CUresult own = allocateOwnMapping(runtime, bytes, start); own != CUDA_SUCCESS) {
    return own;
  }
  runtime.addAllocation(start, bytes, context, /*managed=*/true);
  return CUDA_SUCCESS;
}

}  // namespace gpuproxy::stub

namespace {

// The managed allocation that holds all of [pointer, pointer + bytes), if one does.
std::optional<AllocationRange> managedRange(Runtime& runtime, CUdeviceptr pointer,
                                            std::uint64_t bytes) {
  std::optional<AllocationRange> range = runtime.allocationContaining(pointer);
  if (!range || !range->managed) return std::nullopt;
  if (bytes > range->bytes - (pointer - range->start)) return std::nullopt;
  return range;
}

// A location a prefetch or an advice may name: a device of this process, or the host.
CUresult checkLocation(Runtime& runtime, CUmemLocation location) {
  switch (gpuproxy::stub::enumValue(location.type)) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return runtime.device(location.id) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      return location.id >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// The legacy entry points name a device ordinal, or CU_DEVICE_CPU for the host.
CUmemLocation locationOf(CUdevice device) {
  CUmemLocation location{};
  if (device == CU_DEVICE_CPU) {
    location.type = CU_MEM_LOCATION_TYPE_HOST;
  } else {
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = device;
  }
  return location;
}

CUresult prefetch(const char* entryPoint, CUdeviceptr devPtr, size_t count, CUmemLocation location,
                  unsigned flags, CUstream stream, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (flags != 0 || count == 0) return CUDA_ERROR_INVALID_VALUE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (!managedRange(runtime, devPtr, count)) return CUDA_ERROR_INVALID_VALUE;
    // Already where every processor reaches it (see the top of the file).
    return checkLocation(runtime, location);
  });
}

CUresult advise(const char* entryPoint, CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                CUmemLocation location) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (count == 0 || !managedRange(runtime, devPtr, count)) return CUDA_ERROR_INVALID_VALUE;
    switch (gpuproxy::stub::enumValue(advice)) {
      case CU_MEM_ADVISE_SET_READ_MOSTLY:
      case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
      case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        return CUDA_SUCCESS;  // no location involved
      case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
      case CU_MEM_ADVISE_SET_ACCESSED_BY:
      case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
        return checkLocation(runtime, location);
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

CUresult attachToStream(const char* entryPoint, CUstream stream, CUdeviceptr dptr, size_t length,
                        unsigned flags, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST &&
        flags != CU_MEM_ATTACH_SINGLE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    // The whole allocation, from its start (length 0 meaning all of it), as the driver requires.
    std::optional<AllocationRange> range = managedRange(runtime, dptr, 1);
    if (!range || range->start != dptr || (length != 0 && length != range->bytes)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Every device here has concurrent managed access, so an association restricts nothing.
    return CUDA_SUCCESS;
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dptr == nullptr || bytesize == 0 ||
        (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUdeviceptr start = 0;
    if (CUresult allocated = gpuproxy::stub::allocateManaged(runtime, context, bytesize, start);
        allocated != CUDA_SUCCESS) {
      return allocated;
    }
    *dptr = start;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                            CUstream hStream) {
  return prefetch(__func__, devPtr, count, locationOf(dstDevice), 0, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count,
                                                 CUdevice dstDevice, CUstream hStream) {
  return prefetch(__func__, devPtr, count, locationOf(dstDevice), 0, hStream,
                  NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count,
                                               CUmemLocation location, unsigned int flags,
                                               CUstream hStream) {
  return prefetch(__func__, devPtr, count, location, flags, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                                    CUmemLocation location, unsigned int flags,
                                                    CUstream hStream) {
  return prefetch(__func__, devPtr, count, location, flags, hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                     CUdevice device) {
  return advise(__func__, devPtr, count, advice, locationOf(device));
}

GPUPROXY_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                        CUmemLocation location) {
  return advise(__func__, devPtr, count, advice, location);
}

GPUPROXY_EXPORT CUresult cuStreamAttachMemAsync(CUstream hStream, CUdeviceptr dptr, size_t length,
                                                unsigned int flags) {
  return attachToStream(__func__, hStream, dptr, length, flags, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamAttachMemAsync_ptsz(CUstream hStream, CUdeviceptr dptr,
                                                     size_t length, unsigned int flags) {
  return attachToStream(__func__, hStream, dptr, length, flags, NullStream::kPerThread);
}
