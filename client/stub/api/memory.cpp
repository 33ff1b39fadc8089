// Device memory, copies and memsets, and page-locked host memory.
//
// With the shared-memory data plane, copies and memsets are records in the command ring. Pageable
// host copies pass through the segment's staging area in pipelined chunks. Host → device returns
// once every chunk is in the staging area (the application's buffer is free again then, as CUDA
// promises for pageable memory); device → host returns once the bytes are in the application's
// buffer. Without the data plane (GPUPROXY_TRANSPORT=rpc) each call waits for the daemon's answer:
// completing an asynchronous call early is legal CUDA behaviour and keeps host buffers safe.
//
// Page-locked memory (cuMemAllocHost, cuMemHostAlloc) comes from the segment's pinned heap, which
// the daemon maps at the same address and registers with the GPU, charged to the tenant. A copy
// whose host range lies in one such allocation is one record naming the heap: the GPU reads or
// writes the application's buffer directly, the Async variants return at once (as CUDA's do for
// pinned memory) and the blocking ones wait for the copy. Without a pinned heap (no data plane, or
// no address suits both processes) page-locked memory is ordinary memory of this process.

#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kj/vector.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>

#include "client/stub/api_support.hpp"
#include "client/stub/data_plane.hpp"
#include "client/stub/export.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::DataPlane;
using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StagingAllocator;
using gpuproxy::stub::StreamTarget;
using gpuproxy::stub::toResult;

namespace ring = gpuproxy::protocol::ring;

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

// ---- through the data plane -------------------------------------------------------------------

// The data plane when it can carry host copies (it has a staging area), else null.
DataPlane* stagingPlane(Runtime& runtime) {
  DataPlane* plane = runtime.dataPlane();
  return plane != nullptr && plane->chunkBytes() > 0 ? plane : nullptr;
}

// Chunk by chunk through the staging area: fill a range, publish its record, go on with the next
// chunk while the daemon moves this one. The daemon gives each range back once it has copied the
// bytes out.
CUresult stagedHostToDevice(DataPlane& plane, const StreamTarget& target, CUdeviceptr destination,
                            const void* source, std::size_t bytes) {
  const auto* from = static_cast<const std::byte*>(source);
  const std::uint64_t chunk = plane.chunkBytes();
  std::uint32_t index = 0;
  for (std::size_t position = 0; position < bytes; ++index) {
    const std::size_t length =
        static_cast<std::size_t>(std::min<std::uint64_t>(chunk, bytes - position));
    std::optional<StagingAllocator::Range> range = plane.allocateStaging(length, nullptr);
    if (!range) return CUDA_ERROR_MPS_CONNECTION_FAILED;
    std::memcpy(plane.staging().data() + range->offset, from + position, length);
    ring::CopyHostToDevice command;
    command.context = target.context;
    command.stream = target.stream;
    command.destination = destination + position;
    command.source = ring::HostLocation{ring::HostRegion::kStaging, range->offset};
    command.bytes = length;
    command.chunkIndex = index;
    command.lastChunk = position + length == bytes;
    CUresult submitted = plane.submitCommand(command);
    if (submitted != CUDA_SUCCESS) {
      plane.releaseStaging(*range);
      return submitted;
    }
    position += length;
  }
  return CUDA_SUCCESS;
}

// Chunk by chunk the other way: each chunk's record carries a token the daemon answers once the
// bytes are in the staging area; they are copied out in order, and the range reused. Up to a
// staging area's worth of chunks is in flight.
CUresult stagedDeviceToHost(DataPlane& plane, const StreamTarget& target, void* destination,
                            CUdeviceptr source, std::size_t bytes) {
  auto* to = static_cast<std::byte*>(destination);
  struct InFlight {
    StagingAllocator::Range range;
    std::uint64_t token = 0;
    std::size_t position = 0;
  };
  std::deque<InFlight> inFlight;
  CUresult failure = CUDA_SUCCESS;
  // Lands the oldest chunk; false when none is in flight.
  auto finishOldest = [&]() {
    if (inFlight.empty()) return false;
    const InFlight chunk = inFlight.front();
    inFlight.pop_front();
    const CUresult result = plane.waitFor(chunk.token);
    if (result != CUDA_SUCCESS) {
      if (failure == CUDA_SUCCESS) failure = result;
    } else if (failure == CUDA_SUCCESS) {
      std::memcpy(to + chunk.position, plane.staging().data() + chunk.range.offset,
                  chunk.range.bytes);
    }
    plane.releaseStaging(chunk.range);
    return true;
  };
  const std::uint64_t chunk = plane.chunkBytes();
  std::uint32_t index = 0;
  for (std::size_t position = 0; position < bytes && failure == CUDA_SUCCESS; ++index) {
    const std::size_t length =
        static_cast<std::size_t>(std::min<std::uint64_t>(chunk, bytes - position));
    std::optional<StagingAllocator::Range> range = plane.allocateStaging(length, finishOldest);
    if (!range) {
      failure = CUDA_ERROR_MPS_CONNECTION_FAILED;
      break;
    }
    if (failure != CUDA_SUCCESS) {
      plane.releaseStaging(*range);
      break;
    }
    ring::CopyDeviceToHost command;
    command.context = target.context;
    command.stream = target.stream;
    command.source = source + position;
    command.destination = ring::HostLocation{ring::HostRegion::kStaging, range->offset};
    command.bytes = length;
    command.completionToken = plane.newToken();
    command.chunkIndex = index;
    command.lastChunk = position + length == bytes;
    CUresult submitted = plane.submitCommand(command);
    if (submitted != CUDA_SUCCESS) {
      plane.releaseStaging(*range);
      failure = submitted;
      break;
    }
    inFlight.push_back(InFlight{*range, command.completionToken, position});
    position += length;
  }
  while (finishOldest()) {
  }
  if (failure != CUDA_SUCCESS) return failure;
  // A blocking copy reports what earlier asynchronous work in this context ran into.
  return plane.takeAsyncError(target.context);
}

// A copy between device memory and one pinned allocation: one record naming the pinned heap.
// `blocking`: wait for the copy to complete (and report earlier asynchronous errors of the
// context, as a synchronising call); otherwise return once the record is in the ring.
template <typename Command>
CUresult pinnedCopy(DataPlane& plane, const StreamTarget& target, Command& command, bool blocking) {
  command.context = target.context;
  command.stream = target.stream;
  command.chunkIndex = 0;
  command.lastChunk = true;
  command.completionToken = blocking ? plane.newToken() : 0;
  if (CUresult submitted = plane.submitCommand(command); submitted != CUDA_SUCCESS) {
    return submitted;
  }
  if (!blocking) return CUDA_SUCCESS;
  const CUresult result = plane.waitFor(command.completionToken);
  if (result != CUDA_SUCCESS) return result;
  return plane.takeAsyncError(target.context);
}

// The offset of a host range in the pinned heap when it lies inside one pinned allocation.
std::optional<std::uint64_t> pinnedOffset(DataPlane* plane, const void* host, std::size_t bytes) {
  if (plane == nullptr) return std::nullopt;
  return plane->pinnedHeap().offsetInAllocation(host, bytes);
}

CUresult memcpyHtoD(const char* entryPoint, CUdeviceptr dstDevice, const void* srcHost,
                    size_t byteCount, CUstream stream, NullStream nullStream, bool blocking) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (byteCount == 0) return CUDA_SUCCESS;
    if (srcHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (auto offset = pinnedOffset(runtime.dataPlane(), srcHost, byteCount)) {
      if (!runtime.ownsRange(dstDevice, byteCount)) return CUDA_ERROR_INVALID_VALUE;
      ring::CopyHostToDevice command;
      command.destination = dstDevice;
      command.source = ring::HostLocation{ring::HostRegion::kPinnedHeap, *offset};
      command.bytes = byteCount;
      return pinnedCopy(*runtime.dataPlane(), target, command, blocking);
    }
    if (DataPlane* plane = stagingPlane(runtime)) {
      if (!runtime.ownsRange(dstDevice, byteCount)) return CUDA_ERROR_INVALID_VALUE;
      return stagedHostToDevice(*plane, target, dstDevice, srcHost, byteCount);
    }
    return copyHostToDevice(runtime, target, dstDevice, srcHost, byteCount);
  });
}

CUresult memcpyDtoH(const char* entryPoint, void* dstHost, CUdeviceptr srcDevice, size_t byteCount,
                    CUstream stream, NullStream nullStream, bool blocking) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (byteCount == 0) return CUDA_SUCCESS;
    if (dstHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (auto offset = pinnedOffset(runtime.dataPlane(), dstHost, byteCount)) {
      if (!runtime.ownsRange(srcDevice, byteCount)) return CUDA_ERROR_INVALID_VALUE;
      ring::CopyDeviceToHost command;
      command.source = srcDevice;
      command.destination = ring::HostLocation{ring::HostRegion::kPinnedHeap, *offset};
      command.bytes = byteCount;
      return pinnedCopy(*runtime.dataPlane(), target, command, blocking);
    }
    if (DataPlane* plane = stagingPlane(runtime)) {
      if (!runtime.ownsRange(srcDevice, byteCount)) return CUDA_ERROR_INVALID_VALUE;
      return stagedDeviceToHost(*plane, target, dstHost, srcDevice, byteCount);
    }
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
    if (DataPlane* plane = runtime.dataPlane()) {
      if (!runtime.ownsRange(dstDevice, byteCount) || !runtime.ownsRange(srcDevice, byteCount)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      ring::CopyDeviceToDevice command;
      command.context = target.context;
      command.stream = target.stream;
      command.destination = dstDevice;
      command.source = srcDevice;
      command.bytes = byteCount;
      return plane->submitCommand(command);
    }
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
    if (DataPlane* plane = runtime.dataPlane()) {
      if (count > std::numeric_limits<std::uint64_t>::max() / elementSize ||
          !runtime.ownsRange(dstDevice, std::uint64_t{count} * elementSize)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      ring::Memset command;
      command.context = target.context;
      command.stream = target.stream;
      command.destination = dstDevice;
      command.count = count;
      command.value = value;
      command.elementSize = elementSize;
      return plane->submitCommand(command);
    }
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

// The pinned heap, when this process has one.
gpuproxy::stub::PinnedHeap* pinnedHeap(Runtime& runtime) {
  DataPlane* plane = runtime.dataPlane();
  return plane != nullptr && plane->pinnedHeap().usable() ? &plane->pinnedHeap() : nullptr;
}

// Pinned memory from the shared heap: allocated here, then registered with (and charged by) the
// daemon. PORTABLE, DEVICEMAP and WRITECOMBINED need nothing more: every allocation is mapped for
// every device, and write-combining is a CPU caching hint the daemon's mapping does not change.
CUresult pinnedAlloc(Runtime& runtime, gpuproxy::stub::PinnedHeap& heap, void** pp,
                     size_t bytesize) {
  auto allocation = heap.allocate(bytesize);
  if (!allocation) {
    GPUPROXY_STUB_LOG(kWarn,
                      "cuMemHostAlloc: %zu bytes do not fit in the pinned heap (%llu of %zu bytes "
                      "in use); GPUPROXY_PINNED_HEAP sets its size",
                      bytesize, static_cast<unsigned long long>(heap.bytesInUse()),
                      heap.region().size());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = runtime.call([&](Session::Client& session) {
    auto request = session.registerPinnedRequest();
    request.setOffset(allocation->offset);
    request.setBytes(allocation->bytes);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
  if (result != CUDA_SUCCESS) {
    heap.free(allocation->offset);
    return result;
  }
  *pp = heap.region().data() + allocation->offset;
  return CUDA_SUCCESS;
}

CUresult hostAlloc(const char* entryPoint, void** pp, size_t bytesize, unsigned flags) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    constexpr unsigned kKnownFlags =
        CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (pp == nullptr || bytesize == 0 || (flags & ~kKnownFlags) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (gpuproxy::stub::PinnedHeap* heap = pinnedHeap(runtime)) {
      return pinnedAlloc(runtime, *heap, pp, bytesize);
    }
    if ((flags & CU_MEMHOSTALLOC_DEVICEMAP) != 0) {
      GPUPROXY_STUB_LOG(kWarn,
                        "%s: CU_MEMHOSTALLOC_DEVICEMAP needs the shared pinned heap, which this "
                        "process does not have (GPUPROXY_TRANSPORT=rpc, GPUPROXY_PINNED_HEAP=0, "
                        "or no address suited both processes)",
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
    if (reply.result != CUDA_SUCCESS) return reply.result;
    runtime.addAllocation(reply.pointer, bytesize, context);
    *dptr = static_cast<CUdeviceptr>(reply.pointer);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dptr == 0) return CUDA_SUCCESS;  // as the driver does
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.memFreeRequest();
      request.setPointer(dptr);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result == CUDA_SUCCESS) runtime.forgetAllocation(dptr);
    return result;
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
  return guarded(__func__, [&](Runtime& runtime) {
    if (p == nullptr) return CUDA_SUCCESS;
    if (gpuproxy::stub::PinnedHeap* heap = pinnedHeap(runtime)) {
      if (auto allocation = heap->lookup(p)) {
        // The daemon answers once the work queued before this call, which may use the memory,
        // has completed; only then may the range be handed out again.
        const CUresult result = runtime.call([&](Session::Client& session) {
          auto request = session.unregisterPinnedRequest();
          request.setOffset(allocation->offset);
          return request.send().then([](auto response) { return toResult(response.getResult()); });
        });
        if (result != CUDA_SUCCESS) return result;
        heap->free(allocation->offset);
        return CUDA_SUCCESS;
      }
    }
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

GPUPROXY_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p,
                                                      unsigned int Flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pdptr == nullptr || p == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    // Unified addressing: a pinned buffer's device address is its host address, for any pointer
    // inside the allocation.
    gpuproxy::stub::PinnedHeap* heap = pinnedHeap(runtime);
    if (heap == nullptr || !heap->offsetInAllocation(p, 1)) {
      HostAllocations& allocations = hostAllocations();
      std::lock_guard lock(allocations.mutex);
      // Page-locked memory local to this process is not mapped for the device.
      return allocations.sizes.count(p) != 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    *pdptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
  });
}

// ---- copies ----------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost,
                                         size_t ByteCount) {
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, nullptr, NullStream::kLegacy, true);
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost,
                                              size_t ByteCount) {
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, nullptr, NullStream::kPerThread, true);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, nullptr, NullStream::kLegacy, true);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice,
                                              size_t ByteCount) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, nullptr, NullStream::kPerThread, true);
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
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, hStream, NullStream::kLegacy, false);
}

GPUPROXY_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost,
                                                   size_t ByteCount, CUstream hStream) {
  return memcpyHtoD(__func__, dstDevice, srcHost, ByteCount, hStream, NullStream::kPerThread,
                    false);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice,
                                              size_t ByteCount, CUstream hStream) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, hStream, NullStream::kLegacy, false);
}

GPUPROXY_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice,
                                                   size_t ByteCount, CUstream hStream) {
  return memcpyDtoH(__func__, dstHost, srcDevice, ByteCount, hStream, NullStream::kPerThread,
                    false);
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
