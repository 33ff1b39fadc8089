// Device memory, copies and memsets, and page-locked host memory.
//
// Copies and memsets are command records handed to the process's command sink (command_sink.hpp),
// after the checks the daemon would make against this process's own allocations. With the
// shared-memory data plane, pageable host copies pass through the segment's staging area in
// pipelined chunks: host → device returns once every chunk is staged (the application's buffer
// is free again then, as CUDA promises for pageable memory); device → host once the bytes are in
// the application's buffer. Without it (GPUPROXY_TRANSPORT=rpc) each call waits for the daemon's
// answer: completing an asynchronous call early is legal CUDA behaviour and keeps host buffers
// safe.
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

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>

#include "client/stub/api/host_memory.hpp"
#include "client/stub/api/managed_memory.hpp"
#include "client/stub/api/memory_pools.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "client/stub/graph_memory.hpp"
#include "client/stub/pinned_heap.hpp"
#include "client/stub/stream_capture.hpp"
#include "ipc/shared_file.hpp"
#include "ipc/shared_segment.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::allocationContext;
using gpuproxy::stub::ContextRecord;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamTarget;
using gpuproxy::stub::toResult;

namespace ring = gpuproxy::protocol::ring;

namespace gpuproxy::stub {

CUresult allocateSharedPinned(Runtime& runtime, PinnedHeap& heap, const char* entryPoint,
                              std::uint64_t bytes, PinnedHeap::Allocation& allocation) {
  auto allocated = heap.allocate(bytes);
  if (!allocated) {
    if (entryPoint == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    GPUPROXY_STUB_LOG(kWarn,
                      "%s: %llu bytes do not fit in the pinned heap (%llu of %zu bytes in use); "
                      "GPUPROXY_PINNED_HEAP sets its size",
                      entryPoint, static_cast<unsigned long long>(bytes),
                      static_cast<unsigned long long>(heap.bytesInUse()), heap.region().size());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // This process faults the pages in before the daemon ever maps them for a device: a shared
  // page is charged to the memory cgroup of whoever touches it first, and pinned memory is the
  // application's, so its pod pays for it (as it pays for cuMemHostAlloc's pages on a GPU node).
  // Rewriting each page's first byte keeps the (unspecified) contents.
  volatile std::byte* pages = heap.region().data() + allocated->offset;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t at = 0; at < allocated->bytes; at += page) pages[at] = pages[at];
  const CUresult result = runtime.call([&](Session::Client& session) {
    auto request = session.registerPinnedRequest();
    request.setOffset(allocated->offset);
    request.setBytes(allocated->bytes);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
  if (result != CUDA_SUCCESS) {
    heap.free(allocated->offset);
    return result;
  }
  allocation = *allocated;
  return CUDA_SUCCESS;
}

CUresult unregisterSharedPinned(Runtime& runtime, std::uint64_t offset) {
  // The daemon answers once the work queued before this call, which may use the memory, has
  // completed; only then may the range be handed out again.
  return runtime.call([&](Session::Client& session) {
    auto request = session.unregisterPinnedRequest();
    request.setOffset(offset);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
}

CUresult registerSharedRange(Runtime& runtime, ipc::UniqueFd file, std::uint64_t fileOffset,
                             std::uint64_t address, std::uint64_t bytes) {
  return runtime.call([&](Session::Client& session) {
    auto request = session.registerHostRangeRequest();
    request.setFile(kj::heap<ipc::SharedFileServer>(std::move(file)));
    request.setFileOffset(fileOffset);
    request.setAddress(address);
    request.setBytes(bytes);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
}

CUresult unregisterSharedRange(Runtime& runtime, std::uint64_t address) {
  // Answered once the work queued before this call, which may use the memory, has completed.
  return runtime.call([&](Session::Client& session) {
    auto request = session.unregisterHostRangeRequest();
    request.setAddress(address);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
}

}  // namespace gpuproxy::stub

namespace {

// Memory a copy or a memset may name as device memory: this process's device allocations (managed
// memory among them) and module variables, and host memory the devices reach at its own address
// (pinned memory, device-mapped registrations), as the driver's unified addressing allows.
bool deviceReaches(Runtime& runtime, CUdeviceptr pointer, std::uint64_t bytes) {
  if (runtime.ownsRange(pointer, bytes)) return true;
  std::optional<gpuproxy::stub::HostAllocationRange> host =
      gpuproxy::stub::hostAllocationContaining(pointer);
  return host && host->deviceMapped && bytes <= host->bytes - (pointer - host->start);
}

// An operation on memory of another device than the stream's, queued by `operation(where)`
// (beginOnOwnDevice in api_support.hpp); nullopt when it is the stream's to queue.
template <typename Operation>
std::optional<CUresult> onOwnDevice(Runtime& runtime, const StreamTarget& target,
                                    CUdeviceptr pointer, Operation operation) {
  std::optional<StreamTarget> where;
  if (CUresult begun = gpuproxy::stub::beginOnOwnDevice(runtime, target, pointer, where);
      begun != CUDA_SUCCESS) {
    return begun;
  }
  if (!where) return std::nullopt;
  if (CUresult queued = operation(*where); queued != CUDA_SUCCESS) return queued;
  return gpuproxy::stub::finishOnOwnDevice(runtime, *where);
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
    if (srcHost == nullptr || !deviceReaches(runtime, dstDevice, byteCount)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (std::optional<CUresult> done =
            onOwnDevice(runtime, target, dstDevice, [&](const StreamTarget& where) {
              return runtime.commands().copyHostToDevice(where, dstDevice, srcHost, byteCount,
                                                         /*blocking=*/true);
            })) {
      return *done;
    }
    return runtime.commands().copyHostToDevice(target, dstDevice, srcHost, byteCount, blocking);
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
    if (dstHost == nullptr || !deviceReaches(runtime, srcDevice, byteCount)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (std::optional<CUresult> done =
            onOwnDevice(runtime, target, srcDevice, [&](const StreamTarget& where) {
              return runtime.commands().copyDeviceToHost(where, dstHost, srcDevice, byteCount,
                                                         /*blocking=*/true);
            })) {
      return *done;
    }
    return runtime.commands().copyDeviceToHost(target, dstHost, srcDevice, byteCount, blocking);
  });
}

// A copy between two GPUs' memory. No GPU reaches another's memory through gpuproxy (there is no
// peer access), so it goes through the host, as the driver copies between GPUs without a peer
// path: `target`'s earlier work first, then the source read back in its device's NULL stream
// (after that device's earlier work, as cuMemcpyPeer is ordered) and written in the
// destination's, in pieces of at most 64 MiB. The call returns when the copy has completed, which
// an asynchronous copy may also do.
CUresult copyBetweenDevices(Runtime& runtime, const StreamTarget& target, CUdeviceptr dst,
                            std::uint64_t dstContext, CUdeviceptr src, std::uint64_t srcContext,
                            size_t byteCount) {
  if (CUresult drained = runtime.commands().synchronize(
          target.context, ring::SynchronizeKind::kStream, target.stream, /*query=*/false);
      drained != CUDA_SUCCESS) {
    return drained;
  }
  constexpr size_t kPiece = size_t{64} << 20;
  std::vector<std::byte> bounce(std::min(byteCount, kPiece));
  const StreamTarget from{srcContext, 0};
  const StreamTarget to{dstContext, 0};
  for (size_t done = 0; done < byteCount; done += kPiece) {
    const size_t bytes = std::min(kPiece, byteCount - done);
    if (CUresult read = runtime.commands().copyDeviceToHost(from, bounce.data(), src + done, bytes,
                                                            /*blocking=*/true);
        read != CUDA_SUCCESS) {
      return read;
    }
    if (CUresult written = runtime.commands().copyHostToDevice(to, dst + done, bounce.data(), bytes,
                                                               /*blocking=*/true);
        written != CUDA_SUCCESS) {
      return written;
    }
  }
  return runtime.commands().synchronize(dstContext, ring::SynchronizeKind::kStream, 0,
                                        /*query=*/false);
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
    if (!deviceReaches(runtime, dstDevice, byteCount) ||
        !deviceReaches(runtime, srcDevice, byteCount)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::optional<std::uint64_t> dstContext = allocationContext(runtime, dstDevice);
    const std::optional<std::uint64_t> srcContext = allocationContext(runtime, srcDevice);
    if (dstContext && srcContext) {
      const std::optional<ContextRecord> dstRecord = runtime.context(*dstContext);
      const std::optional<ContextRecord> srcRecord = runtime.context(*srcContext);
      if (dstRecord && srcRecord && dstRecord->device != srcRecord->device) {
        if (std::optional<CUresult> refused =
                runtime.capturing().captures().unsupported(target.stream)) {
          return *refused;  // a graph has no node for it
        }
        return copyBetweenDevices(runtime, target, dstDevice, *dstContext, srcDevice, *srcContext,
                                  byteCount);
      }
    }
    // Both on one device (or reached by every device): on that device if it is not the stream's.
    auto queue = [&](const StreamTarget& where) {
      return gpuproxy::stub::enqueueDeviceToDevice(runtime, where, dstDevice, srcDevice, byteCount);
    };
    const CUdeviceptr owned = dstContext ? dstDevice : srcDevice;
    if (std::optional<CUresult> done = onOwnDevice(runtime, target, owned, queue)) return *done;
    return queue(target);
  });
}

// cuMemcpy and cuMemcpyAsync: with unified addressing the direction follows from the pointers.
// An address inside one of this process's device allocations is device memory; any other is
// host memory (pinned or pageable, which the host-side copies tell apart themselves). A host to
// host copy waits for the stream's earlier work, as the driver orders it, and copies here.
CUresult memcpyUnified(const char* entryPoint, CUdeviceptr dst, CUdeviceptr src, size_t byteCount,
                       CUstream stream, NullStream nullStream, bool blocking) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const bool dstOnDevice = runtime.ownsRange(dst, 1);
    const bool srcOnDevice = runtime.ownsRange(src, 1);
    void* dstHost = reinterpret_cast<void*>(static_cast<std::uintptr_t>(dst));
    const void* srcHost = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(src));
    if (dstOnDevice && srcOnDevice) {
      return memcpyDtoD(entryPoint, dst, src, byteCount, stream, nullStream);
    }
    if (dstOnDevice) {
      return memcpyHtoD(entryPoint, dst, srcHost, byteCount, stream, nullStream, blocking);
    }
    if (srcOnDevice) {
      return memcpyDtoH(entryPoint, dstHost, src, byteCount, stream, nullStream, blocking);
    }
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (byteCount == 0) return CUDA_SUCCESS;
    if (dstHost == nullptr || srcHost == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult drained = runtime.commands().synchronize(
            target.context, ring::SynchronizeKind::kStream, target.stream, /*query=*/false);
        drained != CUDA_SUCCESS) {
      return drained;
    }
    std::memmove(dstHost, srcHost, byteCount);
    return CUDA_SUCCESS;
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
    if (count > std::numeric_limits<std::uint64_t>::max() / elementSize ||
        !deviceReaches(runtime, dstDevice, std::uint64_t{count} * elementSize)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto queue = [&](const StreamTarget& where) {
      ring::Command command{ring::Memset{}};
      auto& memset = std::get<ring::Memset>(command);
      memset.context = where.context;
      memset.stream = where.stream;
      memset.destination = dstDevice;
      memset.count = count;
      memset.value = value;
      memset.elementSize = elementSize;
      return runtime.commands().enqueue(command);
    };
    if (std::optional<CUresult> done = onOwnDevice(runtime, target, dstDevice, queue)) return *done;
    return queue(target);
  });
}

// cuMemsetD2D8/16/32 and their Async variants: `height` rows of `width` elements, `pitch` bytes
// apart (the pitch does not matter with one row).
CUresult memset2DOnStream(const char* entryPoint, CUdeviceptr dstDevice, size_t pitch,
                          std::uint32_t value, std::uint8_t elementSize, size_t width,
                          size_t height, CUstream stream, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    // The driver requires 16- and 32-bit rows to start on an element boundary.
    if (dstDevice % elementSize != 0) return CUDA_ERROR_INVALID_VALUE;
    if (height > 1 && pitch % elementSize != 0) return CUDA_ERROR_INVALID_VALUE;
    if (width == 0 || height == 0) return CUDA_SUCCESS;
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    if (width > kMax / elementSize) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t rowBytes = std::uint64_t{width} * elementSize;
    if (height > 1 && (pitch < rowBytes || pitch > (kMax - rowBytes) / (height - 1))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t extent = (height > 1 ? std::uint64_t{pitch} * (height - 1) : 0) + rowBytes;
    if (!deviceReaches(runtime, dstDevice, extent)) return CUDA_ERROR_INVALID_VALUE;
    auto queue = [&](const StreamTarget& where) {
      ring::Command command{ring::Memset2D{}};
      auto& memset = std::get<ring::Memset2D>(command);
      memset.context = where.context;
      memset.stream = where.stream;
      memset.destination = dstDevice;
      memset.pitch = pitch;
      memset.width = width;
      memset.height = height;
      memset.value = value;
      memset.elementSize = elementSize;
      return runtime.commands().enqueue(command);
    };
    if (std::optional<CUresult> done = onOwnDevice(runtime, target, dstDevice, queue)) return *done;
    return queue(target);
  });
}

// ---- page-locked host memory -----------------------------------------------------------------

// Host allocations made by cuMemHostAlloc, so that cuMemFreeHost can tell its own pointers from
// anything else. Leaked on purpose: applications free pinned buffers from static destructors.
struct HostAllocations {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> sizes;  // pointer -> mapped length
  // cuMemHostRegister's ranges, by the pointer it was given: the whole pages that hold them, and
  // whether gpuproxyd maps them too (device-mapped) or they stay this process's own.
  struct Registration {
    std::uint64_t pageStart = 0;
    std::uint64_t pageBytes = 0;
    bool deviceMapped = false;
  };
  std::map<std::uint64_t, Registration> registrations;
  // Every page-locked allocation, pinned heap or not, by start (cuPointerGetAttribute).
  std::map<std::uint64_t, gpuproxy::stub::HostAllocationRange> ranges;
};

HostAllocations& hostAllocations() {
  static auto* allocations = new HostAllocations;
  return *allocations;
}

void rememberHostAllocation(Runtime& runtime, void* start, std::uint64_t bytes, bool deviceMapped,
                            std::optional<unsigned> allocationFlags) {
  const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(start));
  HostAllocations& allocations = hostAllocations();
  std::lock_guard lock(allocations.mutex);
  allocations.ranges[address] = gpuproxy::stub::HostAllocationRange{
      address, bytes, currentContext(), runtime.newBufferId(), deviceMapped, allocationFlags};
}

void forgetHostAllocation(void* start) {
  HostAllocations& allocations = hostAllocations();
  std::lock_guard lock(allocations.mutex);
  allocations.ranges.erase(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(start)));
}

// Pinned memory from the shared heap: allocated here, then registered with (and charged by) the
// daemon. PORTABLE, DEVICEMAP and WRITECOMBINED need nothing more: every allocation is mapped for
// every device, and write-combining is a CPU caching hint the daemon's mapping does not change.
CUresult pinnedAlloc(Runtime& runtime, gpuproxy::stub::PinnedHeap& heap, void** pp, size_t bytesize,
                     unsigned flags) {
  gpuproxy::stub::PinnedHeap::Allocation allocation;
  if (CUresult allocated = gpuproxy::stub::allocateSharedPinned(runtime, heap, "cuMemHostAlloc",
                                                                bytesize, allocation);
      allocated != CUDA_SUCCESS) {
    return allocated;
  }
  *pp = heap.region().data() + allocation.offset;
  rememberHostAllocation(runtime, *pp, allocation.bytes, /*deviceMapped=*/true, flags);
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
    if (gpuproxy::stub::PinnedHeap* heap = runtime.pinnedHeap()) {
      return pinnedAlloc(runtime, *heap, pp, bytesize, flags);
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
    rememberHostAllocation(runtime, memory, length, /*deviceMapped=*/false, flags);
    *pp = memory;
    return CUDA_SUCCESS;
  });
}

// Whether [address, address + bytes) overlaps a page-locked range this process has already.
bool overlapsPageLocked(std::uint64_t address, std::uint64_t bytes) {
  HostAllocations& allocations = hostAllocations();
  std::lock_guard lock(allocations.mutex);
  auto next = allocations.ranges.lower_bound(address);
  if (next != allocations.ranges.end() && next->first < address + bytes) return true;
  if (next == allocations.ranges.begin()) return false;
  const auto& previous = std::prev(next)->second;
  return previous.start + previous.bytes > address;
}

// cuMemHostRegister. Memory that lies in a shared mapping of a sealed memfd (another process's
// shared segment, such as gpuproxyd's pinned memory when its cuda backend runs on this stub) is
// mapped by gpuproxyd at the same address and registered with its GPUs: devices reach it, as on
// a GPU. So is a range of whole pages of private anonymous memory (an mmap of the program's own,
// malloc's page-aligned blocks) registered with CU_MEMHOSTREGISTER_DEVICEMAP: its pages are moved
// into a memfd first, at the same address. Other memory (part of a page of malloc's, the stack,
// file mappings) cannot be shared after the fact; it is registered here alone, for what needs no
// device mapping: copies from and to it work (through the staging area, as for pageable memory),
// and CU_MEMHOSTREGISTER_DEVICEMAP is refused with CUDA_ERROR_NOT_SUPPORTED, as
// cuMemHostGetDevicePointer is for it.
CUresult hostRegister(const char* entryPoint, void* p, size_t bytesize, unsigned flags) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    constexpr unsigned kKnownFlags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                     CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
    const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
    if (p == nullptr || bytesize == 0 || (flags & ~kKnownFlags) != 0 ||
        address + bytesize < address) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) {
      GPUPROXY_STUB_LOG(kWarn,
                        "%s: CU_MEMHOSTREGISTER_IOMEMORY (device I/O memory) is not "
                        "supported through gpuproxy",
                        entryPoint);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (overlapsPageLocked(address, bytesize)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t pageStart = address / page * page;
    const std::uint64_t pageBytes = (address + bytesize + page - 1) / page * page - pageStart;
    bool deviceMapped = false;
    bool addressTakenInDaemon = false;
    std::optional<gpuproxy::ipc::SharedWindow> window =
        gpuproxy::ipc::sharedWindowOf(reinterpret_cast<void*>(pageStart), pageBytes);
    // Whole pages of private memory asked to be device-mapped are moved into a memfd in place
    // (ipc::shareInPlace): the range is the caller's alone, so nothing else on those pages moves.
    if (!window && (flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0 && pageStart == address &&
        pageBytes == bytesize) {
      window = gpuproxy::ipc::shareInPlace(p, bytesize);
    }
    if (window) {
      const CUresult result = gpuproxy::stub::registerSharedRange(
          runtime, std::move(window->fd), window->fileOffset, pageStart, pageBytes);
      if (result == CUDA_SUCCESS) {
        deviceMapped = true;
      } else if (result != CUDA_ERROR_ALREADY_MAPPED && result != CUDA_ERROR_INVALID_VALUE) {
        return result;  // over the tenant's pinned memory limit, a range taken, ...
      } else {
        addressTakenInDaemon = result == CUDA_ERROR_ALREADY_MAPPED;
      }
    }
    if (!deviceMapped && (flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0) {
      // gpuproxyd maps the memory at the address it has here, so that the host pointer is the
      // device pointer; another client's memory may already lie there.
      GPUPROXY_STUB_LOG(kWarn, "%s: CU_MEMHOSTREGISTER_DEVICEMAP of %llu bytes at %p: %s",
                        entryPoint, static_cast<unsigned long long>(bytesize), p,
                        addressTakenInDaemon
                            ? "gpuproxyd has that address in use already (another client's "
                              "memory); memory placed elsewhere can be device-mapped"
                            : "gpuproxyd can map only memory shared with it (cuMemHostAlloc's, a "
                              "shared mapping of a sealed memfd, or whole pages of private "
                              "anonymous memory); registered without it, copies work but devices "
                              "cannot reach the memory");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    {
      HostAllocations& allocations = hostAllocations();
      std::lock_guard lock(allocations.mutex);
      allocations.registrations[address] =
          HostAllocations::Registration{pageStart, pageBytes, deviceMapped};
    }
    rememberHostAllocation(runtime, p, bytesize, deviceMapped, std::nullopt);
    return CUDA_SUCCESS;
  });
}

CUresult hostUnregister(const char* entryPoint, void* p) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
    HostAllocations::Registration registration;
    {
      HostAllocations& allocations = hostAllocations();
      std::lock_guard lock(allocations.mutex);
      auto found = allocations.registrations.find(address);
      if (found == allocations.registrations.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
      registration = found->second;
    }
    if (registration.deviceMapped) {
      // Answered once the work queued before, which may use the memory, has completed.
      const CUresult result =
          gpuproxy::stub::unregisterSharedRange(runtime, registration.pageStart);
      if (result != CUDA_SUCCESS) return result;
    }
    {
      HostAllocations& allocations = hostAllocations();
      std::lock_guard lock(allocations.mutex);
      allocations.registrations.erase(address);
    }
    forgetHostAllocation(p);
    return CUDA_SUCCESS;
  });
}

}  // namespace

// ---- device memory ---------------------------------------------------------------------------

namespace {

CUresult allocateIn(Runtime& runtime, std::uint64_t context, size_t bytesize, CUdeviceptr* dptr) {
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
}

// The daemon frees once the work this process queued before has drained, and answers then.
CUresult freeAllocation(Runtime& runtime, CUdeviceptr dptr) {
  if (std::optional<CUresult> closed = gpuproxy::stub::freeImportedPoolPointer(runtime, dptr)) {
    return *closed;
  }
  CUresult result = runtime.call([&](Session::Client& session) {
    auto request = session.memFreeRequest();
    request.setPointer(dptr);
    return request.send().then([](auto response) { return toResult(response.getResult()); });
  });
  if (result == CUDA_SUCCESS) {
    runtime.forgetAllocation(dptr);
    gpuproxy::stub::notePoolFree(dptr);
  }
  return result;
}

// cuMemAllocAsync and cuMemFreeAsync, on the current pool of the stream's device, and
// cuMemAllocFromPoolAsync. The memory is the tenant's like any other allocation. Allocating at
// once is a legal schedule of "usable in stream order"; freeing waits, as cuMemFree does, for this
// process's earlier work, so the call returns later than CUDA's would, never earlier than is safe.
// `pool`: null for the stream's device's current pool. A pool of another device (which CUDA
// allows) gets its memory through that device's primary context, which the stub retains for the
// rest of the process if the program has not.
CUresult allocateOnStream(const char* entryPoint, CUdeviceptr* dptr, size_t bytesize,
                          CUstream stream, NullStream nullStream, CUmemoryPool pool = nullptr) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    std::optional<gpuproxy::stub::ContextRecord> context = runtime.context(target.context);
    if (!context) return CUDA_ERROR_INVALID_CONTEXT;
    gpuproxy::stub::StreamCaptures& captures = runtime.capturing().captures();
    if (captures.capturing(target.stream)) {
      // On a capturing stream: the graph's allocation (a memory node), from the graph's own pool.
      if (pool != nullptr)
        return captures.unsupported(target.stream).value_or(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
      std::shared_ptr<gpuproxy::stub::GraphAllocation> allocation;
      if (CUresult allocated = gpuproxy::stub::GraphMemory::instance().allocate(
              target.context, context->device, bytesize, allocation);
          allocated != CUDA_SUCCESS) {
        return allocated;
      }
      gpuproxy::stub::GraphNode node;
      node.kind = gpuproxy::stub::GraphNode::Kind::kMemAlloc;
      node.allocation = allocation;
      const CUresult captured = captures.capture(target.stream, std::move(node))
                                    .value_or(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
      if (captured == CUDA_SUCCESS) *dptr = allocation->address();
      return captured;
    }
    if (pool == nullptr) pool = gpuproxy::stub::currentPool(context->device);
    const std::optional<std::uint32_t> poolDevice =
        pool != nullptr ? gpuproxy::stub::poolDevice(pool) : std::nullopt;
    if (!poolDevice) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t owner = target.context;
    if (CUresult found =
            gpuproxy::stub::contextForPool(runtime, *poolDevice, target.context, owner);
        found != CUDA_SUCCESS) {
      return found;
    }
    if (CUresult room = gpuproxy::stub::poolRoomFor(pool, bytesize); room != CUDA_SUCCESS) {
      return room;
    }
    if (CUresult allocated = allocateIn(runtime, owner, bytesize, dptr);
        allocated != CUDA_SUCCESS) {
      return allocated;
    }
    gpuproxy::stub::notePoolAllocation(pool, *dptr, bytesize);
    return CUDA_SUCCESS;
  });
}

CUresult freeOnStream(const char* entryPoint, CUdeviceptr dptr, CUstream stream,
                      NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, stream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    gpuproxy::stub::GraphMemory& graphMemory = gpuproxy::stub::GraphMemory::instance();
    gpuproxy::stub::StreamCaptures& captures = runtime.capturing().captures();
    if (captures.capturing(target.stream)) {
      // On a capturing stream: a free node, of an allocation a graph made (CUDA captures no
      // other free).
      std::shared_ptr<gpuproxy::stub::GraphAllocation> allocation = graphMemory.find(dptr);
      if (!allocation)
        return captures.unsupported(target.stream).value_or(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
      gpuproxy::stub::GraphNode node;
      node.kind = gpuproxy::stub::GraphNode::Kind::kMemFree;
      node.allocation = std::move(allocation);
      return captures.capture(target.stream, std::move(node))
          .value_or(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    if (std::optional<CUresult> graphs = graphMemory.freeOutsideGraph(dptr)) return *graphs;
    return freeAllocation(runtime, dptr);
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return allocateIn(runtime, context, bytesize, dptr);
  });
}

// Rows of WidthInBytes each start on the device's texture alignment (512 bytes on the GPUs of
// this generation, which is the pitch cudaMallocPitch reports there), and the allocation is
// Height such rows.
GPUPROXY_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                            size_t Height, unsigned int ElementSizeBytes) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t context = currentContext();
    std::optional<gpuproxy::stub::ContextRecord> record = runtime.context(context);
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    const gpuproxy::stub::DeviceRecord* device =
        runtime.device(static_cast<CUdevice>(record->device));
    const std::uint64_t alignment = std::max(
        device != nullptr ? device->attribute(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT).value_or(512)
                          : 512,
        1);
    std::uint64_t pitch = 0;
    std::uint64_t bytes = 0;
    if (__builtin_add_overflow(std::uint64_t{WidthInBytes}, alignment - 1, &pitch)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    pitch = pitch / alignment * alignment;
    if (__builtin_mul_overflow(pitch, std::uint64_t{Height}, &bytes)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult allocated = allocateIn(runtime, context, static_cast<size_t>(bytes), dptr);
        allocated != CUDA_SUCCESS) {
      return allocated;
    }
    *pPitch = static_cast<size_t>(pitch);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dptr == 0) return CUDA_SUCCESS;  // as the driver does
    if (std::optional<CUresult> graphs =
            gpuproxy::stub::GraphMemory::instance().freeOutsideGraph(dptr)) {
      return *graphs;
    }
    if (std::optional<gpuproxy::stub::AllocationRange> range = runtime.allocationContaining(dptr);
        range && range->managed) {
      return range->start == dptr ? gpuproxy::stub::freeManaged(runtime, *range)
                                  : CUDA_ERROR_INVALID_VALUE;
    }
    return freeAllocation(runtime, dptr);
  });
}

GPUPROXY_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return allocateOnStream(__func__, dptr, bytesize, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                              CUstream hStream) {
  return allocateOnStream(__func__, dptr, bytesize, hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream hStream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return allocateOnStream(__func__, dptr, bytesize, hStream, NullStream::kLegacy, pool);
}

GPUPROXY_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                      CUmemoryPool pool, CUstream hStream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return allocateOnStream(__func__, dptr, bytesize, hStream, NullStream::kPerThread, pool);
}

GPUPROXY_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return freeOnStream(__func__, dptr, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return freeOnStream(__func__, dptr, hStream, NullStream::kPerThread);
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
    // Managed memory comes from the same heap, and is not the host allocation cuMemFreeHost frees.
    if (std::optional<gpuproxy::stub::AllocationRange> managed =
            runtime.allocationContaining(reinterpret_cast<CUdeviceptr>(p));
        managed && managed->managed) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (gpuproxy::stub::PinnedHeap* heap = runtime.pinnedHeap()) {
      if (auto allocation = heap->lookup(p)) {
        if (CUresult unregistered =
                gpuproxy::stub::unregisterSharedPinned(runtime, allocation->offset);
            unregistered != CUDA_SUCCESS) {
          return unregistered;
        }
        forgetHostAllocation(p);
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
    forgetHostAllocation(p);
    ::munmap(p, length);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  return hostRegister(__func__, p, bytesize, Flags);
}

GPUPROXY_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  return hostRegister(__func__, p, bytesize, Flags);
}

GPUPROXY_EXPORT CUresult cuMemHostUnregister(void* p) {
  return hostUnregister(__func__, p);
}

// The flags of the cuMemAllocHost or cuMemHostAlloc allocation `p` points into, as they were given.
GPUPROXY_EXPORT CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  return guarded(__func__, [&](Runtime&) {
    if (pFlags == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::optional<gpuproxy::stub::HostAllocationRange> range =
        gpuproxy::stub::hostAllocationContaining(
            static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)));
    if (!range || !range->allocationFlags) return CUDA_ERROR_INVALID_VALUE;
    *pFlags = *range->allocationFlags;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p,
                                                      unsigned int Flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pdptr == nullptr || p == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (currentContext() == 0) return CUDA_ERROR_INVALID_CONTEXT;
    // Managed memory shares the pinned heap but is not page-locked host memory.
    if (std::optional<gpuproxy::stub::AllocationRange> managed =
            runtime.allocationContaining(reinterpret_cast<CUdeviceptr>(p));
        managed && managed->managed) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Unified addressing: a pinned buffer's device address is its host address, for any pointer
    // inside the allocation.
    gpuproxy::stub::PinnedHeap* heap = runtime.pinnedHeap();
    if (heap == nullptr || !heap->offsetInAllocation(p, 1)) {
      const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
      if (auto range = gpuproxy::stub::hostAllocationContaining(address)) {
        // A cuMemHostRegister range gpuproxyd maps at the same address, or one it does not.
        if (range->deviceMapped) {
          *pdptr = static_cast<CUdeviceptr>(address);
          return CUDA_SUCCESS;
        }
        return CUDA_ERROR_NOT_SUPPORTED;
      }
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

// cuMemcpyPeer(Async): a copy between two contexts' memory, in the current context's stream (the
// NULL stream for cuMemcpyPeer); between two GPUs it goes through the host (copyBetweenDevices).
CUresult memcpyPeer(const char* entryPoint, CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src,
                    CUcontext srcContext, size_t byteCount, CUstream stream,
                    NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (!runtime.context(gpuproxy::stub::handleValue(dstContext)) ||
        !runtime.context(gpuproxy::stub::handleValue(srcContext))) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    return memcpyDtoD(entryPoint, dst, src, byteCount, stream, nullStream);
  });
}

GPUPROXY_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext,
                                      CUdeviceptr srcDevice, CUcontext srcContext,
                                      size_t ByteCount) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, nullptr,
                    NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext,
                                           CUdeviceptr srcDevice, CUcontext srcContext,
                                           size_t ByteCount) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, nullptr,
                    NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                           CUdeviceptr srcDevice, CUcontext srcContext,
                                           size_t ByteCount, CUstream hStream) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream,
                    NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext,
                                                CUdeviceptr srcDevice, CUcontext srcContext,
                                                size_t ByteCount, CUstream hStream) {
  return memcpyPeer(__func__, dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream,
                    NullStream::kPerThread);
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

// ---- 2D memsets ------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                         size_t Width, size_t Height) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, uc, 1, Width, Height, nullptr,
                          NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch,
                                              unsigned char uc, size_t Width, size_t Height) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, uc, 1, Width, Height, nullptr,
                          NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                          size_t Width, size_t Height) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, us, 2, Width, Height, nullptr,
                          NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch,
                                               unsigned short us, size_t Width, size_t Height) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, us, 2, Width, Height, nullptr,
                          NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                          size_t Width, size_t Height) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, ui, 4, Width, Height, nullptr,
                          NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch,
                                               unsigned int ui, size_t Width, size_t Height) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, ui, 4, Width, Height, nullptr,
                          NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                           size_t Width, size_t Height, CUstream hStream) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, uc, 1, Width, Height, hStream,
                          NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch,
                                                unsigned char uc, size_t Width, size_t Height,
                                                CUstream hStream) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, uc, 1, Width, Height, hStream,
                          NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch,
                                            unsigned short us, size_t Width, size_t Height,
                                            CUstream hStream) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, us, 2, Width, Height, hStream,
                          NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch,
                                                 unsigned short us, size_t Width, size_t Height,
                                                 CUstream hStream) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, us, 2, Width, Height, hStream,
                          NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                            size_t Width, size_t Height, CUstream hStream) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, ui, 4, Width, Height, hStream,
                          NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch,
                                                 unsigned int ui, size_t Width, size_t Height,
                                                 CUstream hStream) {
  return memset2DOnStream(__func__, dstDevice, dstPitch, ui, 4, Width, Height, hStream,
                          NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return memcpyUnified(__func__, dst, src, ByteCount, nullptr, NullStream::kLegacy, true);
}

GPUPROXY_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return memcpyUnified(__func__, dst, src, ByteCount, nullptr, NullStream::kPerThread, true);
}

GPUPROXY_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                       CUstream hStream) {
  return memcpyUnified(__func__, dst, src, ByteCount, hStream, NullStream::kLegacy, false);
}

GPUPROXY_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                            CUstream hStream) {
  return memcpyUnified(__func__, dst, src, ByteCount, hStream, NullStream::kPerThread, false);
}

namespace {

// cuMemcpyBatchAsync: each copy as cuMemcpyAsync makes it, one after the other on the stream (a
// GPU may run them in any order; a batch whose copies depend on each other is undefined). Every
// copy is covered by an attribute with a source access order; a host source read "during the API
// call" is copied before the call returns. Location hints and flags are hints. `failIdx`: the copy
// that failed, SIZE_MAX for an error of the batch as a whole.
CUresult memcpyBatch(const char* entryPoint, const CUdeviceptr* dsts, const CUdeviceptr* srcs,
                     const size_t* sizes, size_t count, const CUmemcpyAttributes* attrs,
                     const size_t* attrsIdxs, size_t numAttrs, size_t* failIdx, CUstream stream,
                     NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (failIdx != nullptr) *failIdx = std::numeric_limits<size_t>::max();
    const bool legacy =
        stream == CU_STREAM_LEGACY || (stream == nullptr && nullStream == NullStream::kLegacy);
    if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
        attrsIdxs == nullptr || numAttrs == 0 || numAttrs > count || legacy) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t k = 0; k < numAttrs; ++k) {
      const bool ordered = k == 0 ? attrsIdxs[0] == 0 : attrsIdxs[k] > attrsIdxs[k - 1];
      if (!ordered || attrsIdxs[k] >= count) return CUDA_ERROR_INVALID_VALUE;
      switch (gpuproxy::stub::enumValue(attrs[k].srcAccessOrder)) {
        case CU_MEMCPY_SRC_ACCESS_ORDER_STREAM:
        case CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL:
        case CU_MEMCPY_SRC_ACCESS_ORDER_ANY:
          break;
        default:
          if (failIdx != nullptr) *failIdx = attrsIdxs[k];
          return CUDA_ERROR_INVALID_VALUE;
      }
    }
    size_t attribute = 0;
    for (size_t i = 0; i < count; ++i) {
      while (attribute + 1 < numAttrs && attrsIdxs[attribute + 1] <= i) ++attribute;
      const bool duringCall = gpuproxy::stub::enumValue(attrs[attribute].srcAccessOrder) ==
                              CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
      const bool hostSource = !runtime.ownsRange(srcs[i], 1);
      const CUresult copied = memcpyUnified(entryPoint, dsts[i], srcs[i], sizes[i], stream,
                                            nullStream, /*blocking=*/duringCall && hostSource);
      if (copied != CUDA_SUCCESS) {
        if (failIdx != nullptr) *failIdx = i;
        return copied;
      }
    }
    return CUDA_SUCCESS;
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                            size_t count, CUmemcpyAttributes* attrs,
                                            size_t* attrsIdxs, size_t numAttrs, size_t* failIdx,
                                            CUstream hStream) {
  return memcpyBatch(__func__, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx,
                     hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                 size_t* sizes, size_t count,
                                                 CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                                 size_t numAttrs, size_t* failIdx,
                                                 CUstream hStream) {
  return memcpyBatch(__func__, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx,
                     hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                               size_t count, CUmemcpyAttributes* attrs,
                                               size_t* attrsIdxs, size_t numAttrs,
                                               CUstream hStream) {
  return memcpyBatch(__func__, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, nullptr,
                     hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs,
                                                    size_t* sizes, size_t count,
                                                    CUmemcpyAttributes* attrs, size_t* attrsIdxs,
                                                    size_t numAttrs, CUstream hStream) {
  return memcpyBatch(__func__, dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, nullptr,
                     hStream, NullStream::kPerThread);
}

namespace gpuproxy::stub {

std::optional<HostAllocationRange> hostAllocationContaining(std::uint64_t pointer) {
  HostAllocations& allocations = hostAllocations();
  std::lock_guard lock(allocations.mutex);
  auto after = allocations.ranges.upper_bound(pointer);
  if (after == allocations.ranges.begin()) return std::nullopt;
  const HostAllocationRange& range = std::prev(after)->second;
  if (pointer - range.start >= range.bytes) return std::nullopt;
  return range;
}

}  // namespace gpuproxy::stub
