// What a pointer is: cuPointerGetAttribute(s), cuPointerSetAttribute and cuMemGetAddressRange,
// answered from the stub's own tables of this process's device allocations (Runtime; managed
// memory among them) and page-locked host allocations (memory.cpp). A pointer the process did not
// get from CUDA is unknown to the driver too.

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>

#include "client/stub/api/host_memory.hpp"
#include "client/stub/api/memory_pools.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::AllocationRange;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::HostAllocationRange;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::toHandle;

namespace {

// Where a pointer lies, in the terms every attribute is answered from.
struct PointerFacts {
  CUmemorytype type = CU_MEMORYTYPE_DEVICE;
  std::uint64_t start = 0;
  std::uint64_t bytes = 0;
  std::uint64_t context = 0;
  int device = 0;
  std::uint64_t bufferId = 0;
  bool deviceAccessible = false;  // kernels reach it at the same address
  bool hostAccessible = false;    // the host reaches it at the same address
  bool managed = false;           // cuMemAllocManaged's
};

std::optional<PointerFacts> factsOf(Runtime& runtime, CUdeviceptr pointer) {
  std::optional<PointerFacts> facts;
  if (std::optional<AllocationRange> device = runtime.allocationContaining(pointer)) {
    // Managed memory is device memory to the driver's queries, reachable from the host too.
    facts = PointerFacts{CU_MEMORYTYPE_DEVICE, device->start, device->bytes,   device->context, 0,
                         device->bufferId,     true,          device->managed, device->managed};
  } else if (std::optional<HostAllocationRange> host =
                 gpuproxy::stub::hostAllocationContaining(pointer)) {
    facts = PointerFacts{CU_MEMORYTYPE_HOST, host->start,        host->bytes, host->context, 0,
                         host->bufferId,     host->deviceMapped, true};
  }
  if (!facts) return std::nullopt;
  // Memory of a context that is gone went with it, as far as the driver is concerned.
  std::optional<gpuproxy::stub::ContextRecord> context = runtime.context(facts->context);
  if (!context) return std::nullopt;
  facts->device = static_cast<int>(context->device);
  return facts;
}

// Device allocations whose memory operations were asked to be synchronous
// (cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)), by buffer id. gpuproxy's synchronous
// copies and memsets always finish before they return, so the flag changes nothing but what the
// attribute reads back. Leaked on purpose, as the stub's other tables.
class SyncMemops {
public:
  static SyncMemops& instance() {
    static auto* table = new SyncMemops;
    return *table;
  }
  void set(std::uint64_t bufferId, bool on) {
    std::lock_guard lock(mutex_);
    if (on) {
      buffers_.insert(bufferId);
    } else {
      buffers_.erase(bufferId);
    }
  }
  bool isSet(std::uint64_t bufferId) const {
    std::lock_guard lock(mutex_);
    return buffers_.count(bufferId) != 0;
  }

private:
  mutable std::mutex mutex_;
  std::set<std::uint64_t> buffers_;
};

template <typename T>
void put(void* data, T value) {
  std::memcpy(data, &value, sizeof(value));
}

// Attributes the stub has no answer for (peer tokens, memory pools, virtual memory mappings,
// RDMA): the application hears so rather than a made-up value.
bool unanswerable(int attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      return true;
    default:
      return false;
  }
}

// One attribute of a known pointer. `lenient` (cuPointerGetAttributes): a value that does not
// exist (the host address of device memory) is written as null instead of failing.
CUresult answer(const PointerFacts& facts, int attribute, CUdeviceptr pointer, void* data,
                bool lenient) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      put(data, toHandle<CUcontext>(facts.context));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put(data, static_cast<unsigned>(facts.type));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (!lenient && currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
      if (!facts.deviceAccessible) {
        if (!lenient) return CUDA_ERROR_INVALID_VALUE;
        put(data, CUdeviceptr{0});
        return CUDA_SUCCESS;
      }
      put(data, pointer);  // unified addressing: the same address
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!facts.hostAccessible) {
        if (!lenient) return CUDA_ERROR_INVALID_VALUE;
        put(data, static_cast<void*>(nullptr));
        return CUDA_SUCCESS;
      }
      put(data, reinterpret_cast<void*>(static_cast<std::uintptr_t>(pointer)));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      put(data, SyncMemops::instance().isSet(facts.bufferId) ? 1u : 0u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      put(data, static_cast<unsigned long long>(facts.bufferId));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      put(data, facts.managed ? 1u : 0u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      put(data, facts.device);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:  // cuMemAlloc's memory: cuIpcGetMemHandle
      put(data,
          facts.type == CU_MEMORYTYPE_DEVICE && !facts.managed && !gpuproxy::stub::fromPool(pointer)
              ? 1u
              : 0u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      put(data, static_cast<CUdeviceptr>(facts.start));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      put(data, static_cast<size_t>(facts.bytes));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      put(data, 1u);
      return CUDA_SUCCESS;
    default:
      if (unanswerable(attribute)) {
        GPUPROXY_STUB_LOG(kWarn, "cuPointerGetAttribute: attribute %d is not supported",
                          static_cast<int>(attribute));
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// cuPointerGetAttributes for a pointer CUDA does not know (malloc'd memory, the stack): success
// with every value null, except the device ordinal, which the driver reports as -2 (the device
// cudaPointerGetAttributes then shows for unregistered memory).
CUresult answerUnknown(int attribute, void* data) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      put(data, static_cast<void*>(nullptr));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      put(data, CUdeviceptr{0});
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
      put(data, 0u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      put(data, 0ull);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      put(data, -2);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      put(data, size_t{0});
      return CUDA_SUCCESS;
    default:
      if (unanswerable(attribute)) {
        GPUPROXY_STUB_LOG(kWarn, "cuPointerGetAttributes: attribute %d is not supported",
                          static_cast<int>(attribute));
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

GPUPROXY_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                               CUdeviceptr ptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int which = gpuproxy::stub::enumValue(attribute);
    std::optional<PointerFacts> facts = factsOf(runtime, ptr);
    if (!facts) {
      // Still NOT_SUPPORTED for what the stub cannot answer about any pointer.
      return unanswerable(which) ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    return answer(*facts, which, ptr, data, /*lenient=*/false);
  });
}

GPUPROXY_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                                CUpointer_attribute* attributes, void** data,
                                                CUdeviceptr ptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (numAttributes > 0 && (attributes == nullptr || data == nullptr)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::optional<PointerFacts> facts = factsOf(runtime, ptr);
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      const int which = gpuproxy::stub::enumValue(attributes[i]);
      const CUresult result = facts ? answer(*facts, which, ptr, data[i], /*lenient=*/true)
                                    : answerUnknown(which, data[i]);
      if (result != CUDA_SUCCESS) return result;
    }
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                 CUdeviceptr dptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    std::optional<AllocationRange> range = runtime.allocationContaining(dptr);
    if (!range) return CUDA_ERROR_NOT_FOUND;
    if (pbase != nullptr) *pbase = range->start;
    if (psize != nullptr) *psize = static_cast<size_t>(range->bytes);
    return CUDA_SUCCESS;
  });
}

// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS of device memory is the one attribute a program may set.
GPUPROXY_EXPORT CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute attribute,
                                               CUdeviceptr ptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (value == nullptr ||
        gpuproxy::stub::enumValue(attribute) != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::optional<PointerFacts> facts = factsOf(runtime, ptr);
    if (!facts || facts->type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    unsigned on = 0;
    std::memcpy(&on, value, sizeof on);
    SyncMemops::instance().set(facts->bufferId, on != 0);
    return CUDA_SUCCESS;
  });
}
