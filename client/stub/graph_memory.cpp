#include "client/stub/graph_memory.hpp"

#include <algorithm>

#include "client/stub/api_support.hpp"
#include "client/stub/log.hpp"
#include "client/stub/stream_capture.hpp"

namespace gpuproxy::stub {

GraphAllocation::~GraphAllocation() {
  GraphMemory::instance().released(address_);
}

GraphMemory& GraphMemory::instance() {
  static auto* memory = new GraphMemory();  // graphs may outlive static destructors
  return *memory;
}

CUresult GraphMemory::allocate(std::uint64_t context, std::uint32_t device, std::size_t bytes,
                               std::shared_ptr<GraphAllocation>& allocation) {
  // In `context`, whichever is current: the memory is the context's like any other allocation.
  const bool pushed = currentContext() != context;
  if (pushed) {
    if (CUresult result = cuCtxPushCurrent_v2(toHandle<CUcontext>(context));
        result != CUDA_SUCCESS) {
      return result;
    }
  }
  CUdeviceptr address = 0;
  const CUresult allocated = cuMemAlloc_v2(&address, bytes);
  if (pushed) {
    CUcontext popped = nullptr;
    cuCtxPopCurrent_v2(&popped);
  }
  if (allocated != CUDA_SUCCESS) return allocated;
  allocation = std::make_shared<GraphAllocation>(address, bytes, device);
  std::lock_guard lock(mutex_);
  entries_[address] = Entry{bytes, device, false, allocation};
  held_[device] += bytes;
  noteHeldLocked(device);
  return CUDA_SUCCESS;
}

std::shared_ptr<GraphAllocation> GraphMemory::find(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto found = entries_.find(address);
  return found != entries_.end() ? found->second.owner.lock() : nullptr;
}

CUresult GraphMemory::launch(const Graph& graph, const std::vector<std::size_t>& order,
                             bool autoFreeOnLaunch) {
  std::lock_guard lock(mutex_);
  for (const GraphNode& node : graph.nodes) {
    if (node.kind != GraphNode::Kind::kMemAlloc) continue;
    auto found = entries_.find(node.allocation->address());
    if (found != entries_.end() && found->second.live && !autoFreeOnLaunch) {
      GPUPROXY_STUB_LOG(kWarn,
                        "cuGraphLaunch: the graph's allocation at 0x%llx is still live from an "
                        "earlier launch (free it, or instantiate with AUTO_FREE_ON_LAUNCH)",
                        static_cast<unsigned long long>(node.allocation->address()));
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (std::size_t index : order) {
    const GraphNode& node = graph.nodes[index];
    if (node.kind != GraphNode::Kind::kMemAlloc && node.kind != GraphNode::Kind::kMemFree) {
      continue;
    }
    auto found = entries_.find(node.allocation->address());
    if (found != entries_.end()) found->second.live = node.kind == GraphNode::Kind::kMemAlloc;
  }
  return CUDA_SUCCESS;
}

std::optional<CUresult> GraphMemory::freeOutsideGraph(CUdeviceptr address) {
  {
    std::lock_guard lock(mutex_);
    auto found = entries_.find(address);
    if (found == entries_.end()) return std::nullopt;
    if (!found->second.live) return CUDA_ERROR_INVALID_VALUE;
    found->second.live = false;
    if (!found->second.owner.expired()) return CUDA_SUCCESS;
    held_[found->second.device] -= found->second.bytes;
    entries_.erase(found);
  }
  return freeMemory(address);
}

void GraphMemory::released(CUdeviceptr address) {
  {
    std::lock_guard lock(mutex_);
    auto found = entries_.find(address);
    if (found == entries_.end() || found->second.live) return;  // the program frees a live one
    held_[found->second.device] -= found->second.bytes;
    entries_.erase(found);
  }
  freeMemory(address);
}

CUresult GraphMemory::freeMemory(CUdeviceptr address) {
  const CUresult freed = cuMemFree_v2(address);
  if (freed != CUDA_SUCCESS && freed != CUDA_ERROR_DEINITIALIZED) {
    GPUPROXY_STUB_LOG(kWarn, "freeing the graph allocation at 0x%llx: error %d",
                      static_cast<unsigned long long>(address), static_cast<int>(freed));
  }
  return freed;
}

std::uint64_t GraphMemory::bytesHeld(std::uint32_t device) {
  std::lock_guard lock(mutex_);
  return held_[device];
}

std::uint64_t GraphMemory::mostBytesHeld(std::uint32_t device) {
  std::lock_guard lock(mutex_);
  return mostHeld_[device];
}

void GraphMemory::resetMostBytesHeld(std::uint32_t device) {
  std::lock_guard lock(mutex_);
  mostHeld_[device] = held_[device];
}

void GraphMemory::noteHeldLocked(std::uint32_t device) {
  mostHeld_[device] = std::max(mostHeld_[device], held_[device]);
}

bool hasMemoryNodes(const Graph& graph) {
  return std::any_of(graph.nodes.begin(), graph.nodes.end(), [](const GraphNode& node) {
    return node.kind == GraphNode::Kind::kMemAlloc || node.kind == GraphNode::Kind::kMemFree;
  });
}

}  // namespace gpuproxy::stub
