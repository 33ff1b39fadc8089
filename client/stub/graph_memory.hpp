#pragma once
// Graph memory nodes: the allocations a graph makes and frees as it runs
// (cuGraphAddMemAllocNode/cuGraphAddMemFreeNode, and cuMemAllocAsync/cuMemFreeAsync on a capturing
// stream), kept in the stub like the rest of a graph (stream_capture.hpp).
//
// CUDA fixes an allocation's address when its node is made and keeps it at every launch; the
// allocation is "live" from a launch that runs its alloc node until a free node, cuMemFree or
// cuMemFreeAsync frees it, and a graph launched again while one of its allocations is live fails
// (CUDA_ERROR_INVALID_VALUE) unless it was instantiated with AUTO_FREE_ON_LAUNCH. Here the address
// is ordinary device memory of the tenant's, allocated when the node is made and held for as long
// as a graph, an executable graph or a live allocation needs it: the tenant is charged for it the
// whole time, where a GPU maps physical memory only while the allocation is live. Nothing is sent
// to gpuproxyd at a launch: the memory is there already.

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace gpuproxy::stub {

struct Graph;

// One alloc node's allocation, shared by every copy of the graph that holds the node (the graph,
// its executable graphs) and by the free nodes that name it. When the last of them goes, the
// memory is freed, unless the allocation is live: then the program's free frees it.
class GraphAllocation {
public:
  GraphAllocation(CUdeviceptr address, std::size_t bytes, std::uint32_t device)
      : address_(address), bytes_(bytes), device_(device) {}
  ~GraphAllocation();
  GraphAllocation(const GraphAllocation&) = delete;
  GraphAllocation& operator=(const GraphAllocation&) = delete;

  CUdeviceptr address() const { return address_; }
  std::size_t bytes() const { return bytes_; }
  std::uint32_t device() const { return device_; }

  // Executable graphs made from a graph holding its alloc node: CUDA allows one at a time.
  std::atomic<int> executables{0};

private:
  CUdeviceptr address_;
  std::size_t bytes_;
  std::uint32_t device_;
};

// Every graph allocation of the process, by address. Thread-safe.
class GraphMemory {
public:
  static GraphMemory& instance();

  // A new alloc node's allocation: `bytes` of device memory in `context` (on `device`).
  CUresult allocate(std::uint64_t context, std::uint32_t device, std::size_t bytes,
                    std::shared_ptr<GraphAllocation>& allocation);
  // The allocation at `address` while a graph still holds its node; null otherwise.
  std::shared_ptr<GraphAllocation> find(CUdeviceptr address);

  // A launch of `graph`, its nodes in `order`: CUDA_ERROR_INVALID_VALUE (and nothing changes) when
  // one of its alloc nodes' allocations is still live and `autoFreeOnLaunch` is not set (when it
  // is, such an allocation is freed first); else its allocations become live, and those its free
  // nodes name stop being.
  CUresult launch(const Graph& graph, const std::vector<std::size_t>& order, bool autoFreeOnLaunch);
  // cuMemFree or cuMemFreeAsync of `address`, outside any graph: nullopt when it is no graph
  // allocation; else CUDA_SUCCESS for a live one (no longer live; its memory freed if no graph
  // holds it any more) and CUDA_ERROR_INVALID_VALUE for one that is not live.
  std::optional<CUresult> freeOutsideGraph(CUdeviceptr address);

  // cuDeviceGetGraphMemAttribute: the bytes graph allocations hold on `device` now (used and
  // reserved alike here), and the most they have held since the last reset.
  std::uint64_t bytesHeld(std::uint32_t device);
  std::uint64_t mostBytesHeld(std::uint32_t device);
  void resetMostBytesHeld(std::uint32_t device);

  // GraphAllocation's destructor: the last graph holding `address` is gone.
  void released(CUdeviceptr address);

private:
  struct Entry {
    std::size_t bytes = 0;
    std::uint32_t device = 0;
    bool live = false;
    std::weak_ptr<GraphAllocation> owner;
  };
  void noteHeldLocked(std::uint32_t device);
  // Frees an allocation no graph holds and that is not live (its entry already erased).
  static CUresult freeMemory(CUdeviceptr address);

  std::mutex mutex_;
  std::map<CUdeviceptr, Entry> entries_;
  std::map<std::uint32_t, std::uint64_t> held_;
  std::map<std::uint32_t, std::uint64_t> mostHeld_;
};

// Whether `graph` has memory nodes (which may not be cloned, nor launched into a capture here).
bool hasMemoryNodes(const Graph& graph);

}  // namespace gpuproxy::stub
