// Device memory, copies and memsets (forwarded), and page-locked host memory (local for now).
//
// Asynchronous copies and memsets wait for the daemon's answer: completing an asynchronous call
// early is legal CUDA behaviour, and it keeps host buffers safe to reuse until the shared-memory
// data plane (DESIGN §2) takes over the hot path.

#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kj/vector.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamTarget;
using gpuproxy::stub::toResult;

namespace {

constexpr std::size_t kChunk = gpuproxy::protocol::MAX_TRANSFER_CHUNK;
// Chunks in flight at once for a large copy: enough to keep the socket busy while the daemon
// copies, few enough that a 1 GiB copy does not build 1 GiB of messages before the first answer.
constexpr std::size_t kChunksInFlight = 4;

// A request message sized for `dataBytes` of payload, so that building it allocates one segment.
capnp::MessageSize messageSizeFor(std::size_t dataBytes) {
  return capnp::MessageSize{dataBytes / sizeof(capnp::word) + 64, 0};
}

CUresult firstFailure(const kj::Array<CUresult>& results) {
  for (CUresult result : results) {
    if (result != CUDA_SUCCESS) return result;
  }
  return CUDA_SUCCESS;
}

CUresult copyHostToDevice(Runtime& runtime, const StreamTarget& target, CUdeviceptr destination,
                          const void* source, std::size_t bytes) {
  const auto* from = static_cast<const unsigned char*>(source);
  for (std::size_t group = 0; group < bytes; group += kChunk * kChunksInFlight) {
    const std::size_t groupEnd = std::min(bytes, group + kChunk * kChunksInFlight);
    CUresult result = runtime.call([&](Session::Client& session) {
      kj::Vector<kj::Promise<CUresult>> replies;
      for (std::size_t offset = group; offset < groupEnd; offset += kChunk) {
        const std::size_t length = std::min(kChunk, groupEnd - offset);
        auto request = session.memcpyHtoDRequest(messageSizeFor(length));
        request.setContext(target.context);
        request.setStream(target.stream);
        request.setDestination(destination + offset);
        request.setData(kj::arrayPtr(from + offset, length));
        replies.add(
            request.send().then([](auto response) { return toResult(response.getResult()); }));
      }
      return kj::joinPromises(replies.releaseAsArray()).then([](kj::Array<CUresult> results) {
        return firstFailure(results);
      });
    });
    if (result != CUDA_SUCCESS) return result;
  }
  return CUDA_SUCCESS;
}

CUresult copyDeviceToHost(Runtime& runtime, const StreamTarget& target, void* destination,
                          CUdeviceptr source, std::size_t bytes) {
  auto* to = static_cast<unsigned char*>(destination);
  for (std::size_t group = 0; group < bytes; group += kChunk * kChunksInFlight) {
    const std::size_t groupEnd = std::min(bytes, group + kChunk * kChunksInFlight);
    CUresult result = runtime.call([&](Session::Client& session) {
      kj::Vector<kj::Promise<CUresult>> replies;
      for (std::size_t offset = group; offset < groupEnd; offset += kChunk) {
        const std::size_t length = std::min(kChunk, groupEnd - offset);
        auto request = session.memcpyDtoHRequest();
        request.setContext(target.context);
        request.setStream(target.stream);
        request.setSource(source + offset);
        request.setBytes(length);
        // Runs on the loop thread while the calling thread waits, so writing into its buffer
        // here is safe.
        replies.add(request.send().then([to, offset, length](auto response) {
          const auto result = toResult(response.getResult());
          if (result != CUDA_SUCCESS) return result;
          auto data = response.getData();
          if (data.size() != length) {
            GPUPROXY_STUB_LOG(kError, "memcpyDtoH: gpuproxyd sent %zu bytes for %zu requested",
                              data.size(), length);
            return CUDA_ERROR_UNKNOWN;
          }
          std::memcpy(to + offset, data.begin(), length);
          return CUDA_SUCCESS;
        }));
      }
      return kj::joinPromises(replies.releaseAsArray()).then([](kj::Array<CUresult> results) {
        return firstFailure(results);
      });
    });
    if (result != CUDA_SUCCESS) return result;
  }
  return CUDA_SUCCESS;
}

CUresult memcpyHtoD(const char* entryPoint, CUdeviceptr dstDevice, const void* srcHost,
                    size_t byteCount, CUstream stream, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (byteCount == 0) return CUDA_SUCCESS;
    if (srcHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return copyHostToDevice(runtime, target, dstDevice, srcHost, byteCount);
  });
}

CUresult memcpyDtoH(const char* entryPoint, void* dstHost, CUdeviceptr srcDevice, size_t byteCount,
                    CUstream stream, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (byteCount == 0) return CUDA_SUCCESS;
    if (dstHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return copyDeviceToHost(runtime, target, dstHost, srcDevice, byteCount);
  });
}

CUresult memcpyDtoD(const char* entryPoint, CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                    size_t byteCount, CUstream stream, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (byteCount == 0) return CUDA_SUCCESS;
    return runtime.call([&](Session::Client& session) {
      auto request = session.memcpyDtoDRequest();
      request.setContext(target.context);
      request.setStream(target.stream);
      request.setDestination(dstDevice);
      request.setSource(srcDevice);
      request.setBytes(byteCount);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
  });
}

CUresult memsetOnStream(const char* entryPoint, CUdeviceptr dstDevice, std::uint32_t value,
                        std::uint8_t elementSize, size_t count, CUstream stream,
                        NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    // The driver requires 16- and 32-bit memsets to be aligned to their element.
    if (dstDevice % elementSize != 0) return CUDA_ERROR_INVALID_VALUE;
    if (count == 0) return CUDA_SUCCESS;
    return runtime.call([&](Session::Client& session) {
      auto request = session.memsetRequest();
      request.setContext(target.context);
      request.setStream(target.stream);
      request.setDestination(dstDevice);
      request.setValue(value);
      request.setElementSize(elementSize);
      request.setCount(count);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
  });
}

// ---- page-locked host memory -----------------------------------------------------------------

// Host allocations made by cuMemHostAlloc, so that cuMemFreeHost can tell its own pointers from
// anything else. Leaked on purpose: applications free pinned buffers from static destructors.
struct HostAllocations {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> sizes;  // pointer -> mapped length
};

HostAllocations& hostAllocations() {
  static auto* allocations = new HostAllocations;
  return *allocations;
}

CUresult hostAlloc(const char* entryPoint, void** pp, size_t bytesize, unsigned flags) {
  return guarded(entryPoint, [&](Runtime&) {
    constexpr unsigned kKnownFlags =
        CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (pp == nullptr || bytesize == 0 || (flags & ~kKnownFlags) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if ((flags & CU_MEMHOSTALLOC_DEVICEMAP) != 0) {
      GPUPROXY_STUB_LOG(kWarn,
                        "%s: CU_MEMHOSTALLOC_DEVICEMAP is not supported yet: device-mapped host "
                        "memory needs gpuproxy's shared-memory heap, which is not built yet",
                        entryPoint);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // Page-aligned like the driver's pinned memory; PORTABLE and WRITECOMBINED change nothing
    // for memory that the stub copies from anyway.
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t length = (bytesize + page - 1) / page * page;
    void* memory =
        ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    HostAllocations& allocations = hostAllocations();
    {
      std::lock_guard lock(allocations.mutex);
      allocations.sizes[memory] = length;
    }
    *pp = memory;
    return CUDA_SUCCESS;
  });
}

}  // namespace

// ---- device memory ---------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct Reply {
      CUresult result;
      std::uint64_t pointer;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.memAllocRequest();
      request.setContext(context);
      request.setBytes(bytesize);
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getPointer()};
      });
    });
    if (reply.result == CUDA_SUCCESS) *dptr = static_cast<CUdeviceptr>(reply.pointer);
    return reply.result;
  });
}

GPUPROXY_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dptr == 0) return CUDA_SUCCESS;  // as the driver does
    return runtime.call([&](Session::Client& session) {
      auto request = session.memFreeRequest();
      request.setPointer(dptr);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
  });
}

GPUPROXY_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct Reply {
      CUresult result;
      std::uint64_t free;
      std::uint64_t total;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.memGetInfoRequest();
      request.setContext(context);
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getFree(), response.getTotal()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    *free = static_cast<size_t>(reply.free);
    *total = static_cast<size_t>(reply.total);
    return CUDA_SUCCESS;
  });
}

// ---- host memory -----------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  return hostAlloc(__func__, pp, bytesize, 0);
}

GPUPROXY_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  return hostAlloc(__func__, pp, bytesize, Flags);
}

GPUPROXY_EXPORT CUresult cuMemFreeHost(void* p) {
  return guarded(__func__, [&](Runtime&) {
    if (p == nullptr) return CUDA_SUCCESS;
    HostAllocations& allocations = hostAllocations();
    std::size_t length = 0;
    {
      std::lock_guard lock(allocations.mutex);
      auto found = allocations.sizes.find(p);
      if (found == allocations.sizes.end()) return CUDA_ERROR_INVALID_VALUE;
      length = found->second;
      allocations.sizes.erase(found);
    }
    ::munmap(p, length);
    return CUDA_SUCCESS;
  });
}

// ---- copies ----------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                         size_t ByteCount) {
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, nullptr, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost,
                                              size_t ByteCount) {
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, nullptr, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, nullptr, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice,
                                              size_t ByteCount) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, nullptr, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                         size_t ByteCount) {
  return memcpyDtoD(__func__, dstDevice, srcDevice, ByteCount, nullptr, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                              size_t ByteCount) {
  return memcpyDtoD(__func__, dstDevice, srcDevice, ByteCount, nullptr, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost,
                                              size_t ByteCount, CUstream hStream) {
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost,
                                                   size_t ByteCount, CUstream hStream) {
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice,
                                              size_t ByteCount, CUstream hStream) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice,
                                                   size_t ByteCount, CUstream hStream) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                              size_t ByteCount, CUstream hStream) {
  return memcpyDtoD(__func__, dstDevice, srcDevice, ByteCount, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                                   size_t ByteCount, CUstream hStream) {
  return memcpyDtoD(__func__, dstDevice, srcDevice, ByteCount, hStream, NullStream::kPerThread);
}

// ---- memsets ---------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return memsetOnStream(__func__, dstDevice, uc, 1, N, nullptr, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return memsetOnStream(__func__, dstDevice, uc, 1, N, nullptr, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return memsetOnStream(__func__, dstDevice, us, 2, N, nullptr, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return memsetOnStream(__func__, dstDevice, us, 2, N, nullptr, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return memsetOnStream(__func__, dstDevice, ui, 4, N, nullptr, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return memsetOnStream(__func__, dstDevice, ui, 4, N, nullptr, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                         CUstream hStream) {
  return memsetOnStream(__func__, dstDevice, uc, 1, N, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                              CUstream hStream) {
  return memsetOnStream(__func__, dstDevice, uc, 1, N, hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                          CUstream hStream) {
  return memsetOnStream(__func__, dstDevice, us, 2, N, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                               CUstream hStream) {
  return memsetOnStream(__func__, dstDevice, us, 2, N, hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                          CUstream hStream) {
  return memsetOnStream(__func__, dstDevice, ui, 4, N, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                               CUstream hStream) {
  return memsetOnStream(__func__, dstDevice, ui, 4, N, hStream, NullStream::kPerThread);
}
