// Virtual memory management: cuMemGetAllocationGranularity, cuMemAddressReserve, cuMemAddressFree,
// cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemGetAccess,
// cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle. The daemon reserves the
// addresses, makes the physical memory (charged to the tenant like any allocation), maps it and
// checks every call (protocol/gpuproxy.capnp, Session.memAddressReserve); the stub checks what the
// driver checks at the call and keeps its copy of what the process holds
// (client/stub/virtual_memory.hpp). A mapping with read-write access is device memory of its
// reservation's context for copies and memsets, as an allocation is. All of it is the process's,
// not a context's: cuMemCreate needs no context, and cuCtxDestroy leaves it, as the driver's does.
//
// Physical memory made for a file descriptor (cuMemCreate with requestedHandleTypes
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) is exported as a sealed memfd holding an interprocess
// handle of the daemon's (cuMemExportToShareableHandle); another process of the same tenant
// imports it as physical memory of its own (cuMemImportFromShareableHandle), one memory for all.
//
// Not served (CUDA_ERROR_NOT_SUPPORTED, logged): other shareable handle types (fabric, Windows),
// memory on the host, read-only access, sparse arrays (cuMemMapArrayAsync, tile pools), retaining
// the handle of memory whose handle was released, and, since through gpuproxy no two devices are
// peers, access from another device than the memory's. Compression and RDMA capability are asked
// for and not granted, as on a device without them.

#include <cuda.h>

#include <cstdint>
#include <cstring>

#include "client/stub/api/interprocess.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"
#include "client/stub/log.hpp"
#include "protocol/limits.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::toResult;
using gpuproxy::stub::VirtualMemoryTable;

namespace {

constexpr std::uint64_t kGranule = gpuproxy::protocol::kVirtualMemoryGranularity;
constexpr std::uint64_t kHostPage = 4096;

// What cuMemCreate and cuMemGetAllocationGranularity accept in `prop`: pinned memory on one of
// the devices, with nothing asked for that gpuproxy does not serve.
CUresult checkAllocationProp(Runtime& runtime, const CUmemAllocationProp& prop) {
  if (prop.type == CU_MEM_ALLOCATION_TYPE_INVALID ||
      prop.location.type == CU_MEM_LOCATION_TYPE_INVALID) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop.type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    GPUPROXY_STUB_LOG(kWarn, "virtual memory: allocation type %d is not supported (pinned only)",
                      static_cast<int>(prop.type));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    GPUPROXY_STUB_LOG(kWarn,
                      "virtual memory: physical memory at location type %d is not supported "
                      "(device memory only)",
                      static_cast<int>(prop.location.type));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (runtime.device(prop.location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if ((prop.requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
    GPUPROXY_STUB_LOG(kWarn,
                      "virtual memory: shareable handle types %d are not supported (a POSIX file "
                      "descriptor only)",
                      static_cast<int>(prop.requestedHandleTypes));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (prop.allocFlags.usage != 0) {
    GPUPROXY_STUB_LOG(kWarn, "virtual memory: tile pools for sparse arrays are not supported");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

// The properties memory made from `asked` has: compression and RDMA capability are requests the
// driver grants where the device can (applications read back what they got), and these devices
// report neither (Runtime::fitDeviceAttributes).
CUmemAllocationProp grantedProp(const CUmemAllocationProp& asked) {
  CUmemAllocationProp granted = asked;
  granted.allocFlags.compressionType = 0;
  granted.allocFlags.gpuDirectRDMACapable = 0;
  return granted;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                       const CUmemAllocationProp* prop,
                                                       CUmemAllocationGranularity_flags option) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
        option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult checked = checkAllocationProp(runtime, *prop); checked != CUDA_SUCCESS) {
      return checked;
    }
    *granularity = kGranule;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                             CUdeviceptr addr, unsigned long long flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (ptr == nullptr || size == 0 || size % kHostPage != 0 || addr % kHostPage != 0 ||
        (alignment & (alignment - 1)) != 0 || flags != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // `addr` is a hint; the daemon places every reservation itself.
    const std::uint64_t context = currentContext();
    if (!runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    struct Reply {
      CUresult result;
      std::uint64_t pointer;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.memAddressReserveRequest();
      request.setContext(context);
      request.setBytes(size);
      request.setAlignment(alignment);
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getPointer()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    runtime.virtualMemory().addReservation(reply.pointer, size, context);
    *ptr = static_cast<CUdeviceptr>(reply.pointer);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guarded(__func__, [&](Runtime& runtime) {
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.memAddressFreeRequest();
      request.setPointer(ptr);
      request.setBytes(size);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result == CUDA_SUCCESS) runtime.virtualMemory().forgetReservation(ptr);
    return result;
  });
}

GPUPROXY_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult checked = checkAllocationProp(runtime, *prop); checked != CUDA_SUCCESS) {
      return checked;
    }
    if (size == 0 || size % kGranule != 0) return CUDA_ERROR_INVALID_VALUE;
    // Made on the device, in no context: the process needs none (as with the driver).
    struct Reply {
      CUresult result;
      std::uint64_t handle;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.memCreateRequest();
      request.setDevice(static_cast<std::uint32_t>(prop->location.id));
      request.setBytes(size);
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getHandle()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    runtime.virtualMemory().addPhysical(reply.handle,
                                        VirtualMemoryTable::Physical{size, grantedProp(*prop), 1});
    *handle = reply.handle;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guarded(__func__, [&](Runtime& runtime) {
    const std::optional<bool> last = runtime.virtualMemory().release(handle);
    if (!last) return CUDA_ERROR_INVALID_VALUE;
    if (!*last) return CUDA_SUCCESS;  // a reference taken by cuMemRetainAllocationHandle is left
    return runtime.call([&](Session::Client& session) {
      auto request = session.memReleaseRequest();
      request.setHandle(handle);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
  });
}

GPUPROXY_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<VirtualMemoryTable::Physical> physical =
        runtime.virtualMemory().physical(handle);
    const std::optional<std::uint64_t> reservation =
        runtime.virtualMemory().reservationContext(ptr);
    if (!physical || !reservation) return CUDA_ERROR_INVALID_VALUE;
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.memMapRequest();
      request.setPointer(ptr);
      request.setBytes(size);
      request.setOffset(offset);
      request.setHandle(handle);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result != CUDA_SUCCESS) return result;
    runtime.virtualMemory().addMapping(
        ptr, VirtualMemoryTable::Mapping{size, handle, *reservation, physical->prop.location.id,
                                         CU_MEM_ACCESS_FLAGS_PROT_NONE});
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    // The daemon unmaps once the work queued before has completed, and answers then.
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.memUnmapRequest();
      request.setPointer(ptr);
      request.setBytes(size);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result != CUDA_SUCCESS) return result;
    for (const auto& [start, mapping] : runtime.virtualMemory().mappingsIn(ptr, size)) {
      if (mapping.access != CU_MEM_ACCESS_FLAGS_PROT_NONE) runtime.forgetAllocation(start);
    }
    runtime.virtualMemory().forgetMappingsIn(ptr, size);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                        size_t count) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    const auto mappings = runtime.virtualMemory().mappingsIn(ptr, size);
    if (mappings.empty() || mappings.front().first != ptr) return CUDA_ERROR_INVALID_VALUE;
    const int device = mappings.front().second.device;
    // Every descriptor is checked; the memory's own device's says what its access becomes. Any
    // other device may only be given none: through gpuproxy no two devices are peers.
    std::optional<CUmemAccess_flags> access;
    for (std::size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& entry = desc[i];
      if (entry.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
          entry.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          entry.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (entry.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (runtime.device(entry.location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
      if (entry.location.id == device) {
        access = entry.flags;
      } else if (entry.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
    }
    if (!access) return CUDA_SUCCESS;  // only other devices, given none: nothing changes
    if (*access == CU_MEM_ACCESS_FLAGS_PROT_READ) {
      GPUPROXY_STUB_LOG(kWarn, "cuMemSetAccess: read-only access is not supported");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.memSetAccessRequest();
      request.setPointer(ptr);
      request.setBytes(size);
      request.setFlags(static_cast<std::uint32_t>(*access));
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result != CUDA_SUCCESS) return result;
    // Each mapping that may be reached is device memory of its reservation's context to copies
    // and memsets, and to pointer queries.
    for (const auto& [start, mapping] : mappings) {
      if (*access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        runtime.addAllocation(start, mapping.bytes, mapping.context);
      } else {
        runtime.forgetAllocation(start);
      }
    }
    runtime.virtualMemory().setAccess(ptr, size, *access);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                        CUdeviceptr ptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(location->id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    const auto mapping = runtime.virtualMemory().mappingAt(ptr);
    if (!mapping) return CUDA_ERROR_INVALID_VALUE;
    *flags = mapping->second.device == location->id ? mapping->second.access
                                                    : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                     void* addr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto mapping = runtime.virtualMemory().mappingAt(reinterpret_cast<CUdeviceptr>(addr));
    if (!mapping) return CUDA_ERROR_INVALID_VALUE;
    // The handle may have been released (the memory lives on while mapped): then the mapping's
    // memory has no handle left to give, as far as this process's table knows.
    if (!runtime.virtualMemory().retain(mapping->second.handle)) {
      GPUPROXY_STUB_LOG(kWarn,
                        "cuMemRetainAllocationHandle: the memory mapped at %p was released; "
                        "retaining it again is not supported",
                        addr);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    *handle = mapping->second.handle;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<VirtualMemoryTable::Physical> physical =
        runtime.virtualMemory().physical(handle);
    if (!physical) return CUDA_ERROR_INVALID_VALUE;
    *prop = physical->prop;
    return CUDA_SUCCESS;
  });
}

// The only shareable handle type served: a POSIX file descriptor. A fabric handle (for other
// nodes) is not served; the Windows types are no handle on Linux.
static CUresult checkShareableType(CUmemAllocationHandleType type) {
  if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_SUCCESS;
  if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
    GPUPROXY_STUB_LOG(kWarn, "virtual memory: fabric handles are not supported");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

GPUPROXY_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                      CUmemGenericAllocationHandle handle,
                                                      CUmemAllocationHandleType handleType,
                                                      unsigned long long flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult checked = checkShareableType(handleType); checked != CUDA_SUCCESS) return checked;
    const std::optional<VirtualMemoryTable::Physical> physical =
        runtime.virtualMemory().physical(handle);
    if (!physical) return CUDA_ERROR_INVALID_VALUE;
    // Only as the handle type the memory was made for (cuMemCreate's requestedHandleTypes).
    if ((physical->prop.requestedHandleTypes & handleType) == 0) return CUDA_ERROR_INVALID_VALUE;
    gpuproxy::stub::IpcHandle exported;
    if (CUresult result = gpuproxy::stub::exportPhysicalMemory(runtime, handle, exported);
        result != CUDA_SUCCESS) {
      return result;
    }
    char bytes[gpuproxy::stub::kIpcHandleBytes];
    gpuproxy::stub::writeIpcHandle(bytes, gpuproxy::stub::IpcHandle::Kind::kPhysicalMemory,
                                   exported);
    const int fd =
        gpuproxy::stub::sealedFileHolding("gpuproxy-physical-memory", bytes, sizeof(bytes));
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::memcpy(shareableHandle, &fd, sizeof(fd));
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                        void* osHandle,
                                                        CUmemAllocationHandleType shHandleType) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult checked = checkShareableType(shHandleType); checked != CUDA_SUCCESS) {
      return checked;
    }
    // CUDA passes the descriptor itself as the pointer's value.
    const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
    char bytes[gpuproxy::stub::kIpcHandleBytes];
    gpuproxy::stub::IpcHandle imported;
    if (!gpuproxy::stub::readSealedFile(fd, bytes, sizeof(bytes)) ||
        !gpuproxy::stub::readIpcHandle(bytes, gpuproxy::stub::IpcHandle::Kind::kPhysicalMemory,
                                       imported)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    struct Reply {
      CUresult result;
      std::uint64_t handle;
      std::uint64_t bytes;
      std::uint32_t ordinal;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.memImportRequest();
      request.setDevice(imported.device);
      request.setToken(gpuproxy::stub::ipcTokenData(imported));
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getHandle(), response.getBytes(),
                     response.getOrdinal()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    // What cuMemGetAllocationPropertiesFromHandle reports of it: device memory on its device,
    // shareable as it was made.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = static_cast<int>(reply.ordinal);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    runtime.virtualMemory().addPhysical(reply.handle,
                                        VirtualMemoryTable::Physical{reply.bytes, prop, 1});
    *handle = reply.handle;
    return CUDA_SUCCESS;
  });
}
