// CUDA graphs: made by stream capture (cuStreamBeginCapture/EndCapture, the capture queries and
// cuStreamUpdateCaptureDependencies) or node by node (kernel, copy, memset, host, empty, child
// graph, memory and conditional nodes; their dependencies); read back and changed node by node;
// instantiated, launched, updated (cuGraphExecUpdate, the cuGraphExec*SetParams calls) and
// destroyed; user objects a graph holds (user_objects.hpp). Memory nodes are graph_memory.hpp's.
// How capture works, and what a launch does, is stream_capture.hpp's: everything is kept in the
// stub, and gpuproxyd sees only the operations a launch sends. Conditional nodes run on the sim
// backend only. Event and external-semaphore nodes, edge data other than the default, node
// removal and device-side launches are not supported: their entry points stay
// CUDA_ERROR_NOT_SUPPORTED.

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "client/stub/api/modules.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "client/stub/graph_memory.hpp"
#include "client/stub/live_handles.hpp"
#include "client/stub/log.hpp"
#include "client/stub/stream_capture.hpp"

using gpuproxy::stub::CapturingSink;
using gpuproxy::stub::Graph;
using gpuproxy::stub::GraphAllocation;
using gpuproxy::stub::GraphMemory;
using gpuproxy::stub::GraphNode;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleOf;
using gpuproxy::stub::hasConditionalNodes;
using gpuproxy::stub::indexIn;
using gpuproxy::stub::launchOrder;
using gpuproxy::stub::LiveHandles;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamCaptures;
using gpuproxy::stub::StreamTarget;

namespace ring = gpuproxy::protocol::ring;

namespace {

// The allocations of a graph's alloc nodes, held by its one executable graph (CUDA allows one
// at a time for a graph with memory nodes).
class ExecutableClaim {
public:
  ExecutableClaim() = default;
  ExecutableClaim(const ExecutableClaim&) = delete;
  ExecutableClaim& operator=(const ExecutableClaim&) = delete;
  ~ExecutableClaim() {
    for (const std::shared_ptr<GraphAllocation>& allocation : allocations_) {
      --allocation->executables;
    }
  }
  // False (and nothing claimed) when another executable graph holds one of them.
  bool claim(const Graph& graph) {
    std::vector<std::shared_ptr<GraphAllocation>> wanted;
    for (const GraphNode& node : graph.nodes) {
      if (node.kind == GraphNode::Kind::kMemAlloc) wanted.push_back(node.allocation);
    }
    for (const std::shared_ptr<GraphAllocation>& allocation : wanted) {
      if (allocation->executables.load() != 0) return false;
    }
    for (const std::shared_ptr<GraphAllocation>& allocation : wanted) ++allocation->executables;
    allocations_ = std::move(wanted);
    return true;
  }

private:
  std::vector<std::shared_ptr<GraphAllocation>> allocations_;
};

// An executable graph: its own copy of the graph's nodes, as CUDA's is (destroying or changing
// the graph afterwards leaves it alone), and the order a launch sends them in.
struct GraphExec {
  Graph graph;
  std::vector<std::size_t> order;
  // The nodes of the graph it was made from (or last updated from), to their copies here: what
  // cuGraphExecKernelNodeSetParams names.
  std::map<const GraphNode*, std::size_t> fromGraph;
  bool autoFreeOnLaunch = false;  // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
  // What it was instantiated with, but CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD (cuGraphExecGetFlags).
  unsigned long long flags = 0;
  ExecutableClaim claim;
  // The streams it was launched into (each once), where its user object references are released
  // once the work before has run.
  std::vector<StreamTarget> launchedOn;
};

// Every graph (stream_capture.hpp) and executable graph handed out (live_handles.hpp).
LiveHandles<Graph>& graphs() {
  return gpuproxy::stub::liveGraphs();
}

LiveHandles<GraphExec>& execs() {
  static auto* execs = new LiveHandles<GraphExec>;
  return *execs;
}

CUgraph adopt(std::unique_ptr<Graph> graph) {
  return reinterpret_cast<CUgraph>(graphs().adopt(std::move(graph)));
}

// Null unless `handle` is a live graph.
Graph* graphOf(CUgraph handle) {
  return graphs().find(handle);
}

GraphExec* execOf(CUgraphExec handle) {
  return execs().find(handle);
}

// The body graphs of `graph`'s conditional nodes (and theirs) stop being graphs handles may name.
void forgetBodies(const Graph& graph) {
  for (const GraphNode& node : graph.nodes) {
    for (const std::shared_ptr<Graph>& body : node.bodies) {
      forgetBodies(*body);
      graphs().forget(body.get());
    }
  }
}

// The body graphs of `graph`'s conditional and child graph nodes (and theirs) become graphs
// handles may name, while their nodes last.
void lendBodies(const Graph& graph) {
  for (const GraphNode& node : graph.nodes) {
    for (const std::shared_ptr<Graph>& body : node.bodies) {
      graphs().lend(body.get());
      lendBodies(*body);
    }
  }
}

// Whether a node of `graph` holds graphs of its own (a conditional or child graph node).
bool hasNestedGraphs(const Graph& graph) {
  for (const GraphNode& node : graph.nodes) {
    if (!node.bodies.empty()) return true;
  }
  return false;
}

// An executable graph's own copies of the body graphs that `graph` (its copy of the application's
// graph) still shares with the application's; false when a body's dependencies form a cycle.
bool copyBodies(Graph& graph) {
  for (GraphNode& node : graph.nodes) {
    for (std::size_t i = 0; i < node.bodies.size(); ++i) {
      if (!launchOrder(*node.bodies[i])) return false;
      node.bodies[i] = std::make_shared<Graph>(*node.bodies[i]);
      node.bodyHandles[i] = reinterpret_cast<CUgraph>(node.bodies[i].get());
      if (!copyBodies(*node.bodies[i])) return false;
    }
  }
  return true;
}

// Whether every edge of `edgeData` (null: all default) is the default one, the only kind gpuproxy's
// graphs have: the node before has completed.
bool onlyDefaultEdges(const CUgraphEdgeData* edgeData, size_t count) {
  if (edgeData == nullptr) return true;
  for (size_t i = 0; i < count; ++i) {
    const CUgraphEdgeData& edge = edgeData[i];
    if (edge.from_port != 0 || edge.to_port != 0 || edge.type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT) {
      return false;
    }
  }
  return true;
}

// A query's list as CUDA hands one out: with no array, only its length; else as much of it as
// fits, the rest of the array null, and in `count` how many it put there.
template <typename T>
CUresult answerList(const std::vector<T>& list, T* out, size_t& count) {
  if (out == nullptr) {
    count = list.size();
    return CUDA_SUCCESS;
  }
  const std::size_t given = std::min(count, list.size());
  std::copy_n(list.begin(), given, out);
  std::fill(out + given, out + count, T{});
  count = given;
  return CUDA_SUCCESS;
}

// The graph `node` belongs to, and its index there.
std::optional<std::pair<Graph*, std::size_t>> locate(CUgraphNode node) {
  if (node == nullptr) return std::nullopt;
  return graphs().locked(
      [&](const std::set<Graph*>& live) -> std::optional<std::pair<Graph*, std::size_t>> {
        for (Graph* graph : live) {
          if (std::optional<std::size_t> index = indexIn(*graph, node)) {
            return std::make_pair(graph, *index);
          }
        }
        return std::nullopt;
      });
}

// Where a node is changed or read: in the graph it was added to (nullopt), or its copy in an
// executable graph (the handle the application gave, which may be anything).
using NodeOwner = std::optional<CUgraphExec>;
constexpr NodeOwner kInItsGraph = std::nullopt;

// The node `hNode` of `owner`, with the context its graph runs in.
std::optional<std::pair<GraphNode*, std::uint64_t>> nodeIn(NodeOwner owner, CUgraphNode hNode) {
  if (!owner) {
    std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
    if (!found) return std::nullopt;
    return std::make_pair(&found->first->nodes[found->second], found->first->context);
  }
  GraphExec* executable = execOf(*owner);
  if (executable == nullptr) return std::nullopt;
  auto copy = executable->fromGraph.find(reinterpret_cast<const GraphNode*>(hNode));
  if (copy == executable->fromGraph.end()) return std::nullopt;
  return std::make_pair(&executable->graph.nodes[copy->second], executable->graph.context);
}

// A memset node's parameters, however it was made: added with them, or captured (a 1D or 2D
// memset record).
std::optional<CUDA_MEMSET_NODE_PARAMS> memsetParamsOf(const GraphNode& node) {
  if (node.kind != GraphNode::Kind::kMemset) return std::nullopt;
  if (node.memset) return *node.memset;
  if (!node.command) return std::nullopt;
  CUDA_MEMSET_NODE_PARAMS params{};
  if (const auto* set = std::get_if<ring::Memset>(&*node.command)) {
    params.dst = set->destination;
    params.value = set->value;
    params.elementSize = set->elementSize;
    params.width = set->count;
    params.height = 1;
    return params;
  }
  if (const auto* set = std::get_if<ring::Memset2D>(&*node.command)) {
    params.dst = set->destination;
    params.pitch = set->pitch;
    params.value = set->value;
    params.elementSize = set->elementSize;
    params.width = set->width;
    params.height = set->height;
    return params;
  }
  return std::nullopt;
}

// A copy node's parameters, however it was made: added with them, or captured (between host and
// device memory, or within device memory).
std::optional<CUDA_MEMCPY3D> copyParamsOf(const GraphNode& node) {
  if (node.kind != GraphNode::Kind::kMemcpy) return std::nullopt;
  if (node.copy) return *node.copy;
  CUDA_MEMCPY3D params{};
  params.Height = 1;
  params.Depth = 1;
  if (node.host != nullptr) {
    params.WidthInBytes = node.bytes;
    params.srcMemoryType = node.hostToDevice ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    params.dstMemoryType = node.hostToDevice ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (node.hostToDevice) {
      params.srcHost = node.host;
      params.dstDevice = node.device;
    } else {
      params.srcDevice = node.device;
      params.dstHost = node.host;
    }
  } else if (const auto* copy =
                 node.command ? std::get_if<ring::CopyDeviceToDevice>(&*node.command) : nullptr) {
    params.WidthInBytes = copy->bytes;
    params.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    params.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    params.srcDevice = copy->source;
    params.dstDevice = copy->destination;
  } else {
    return std::nullopt;
  }
  params.srcPitch = params.WidthInBytes;
  params.dstPitch = params.WidthInBytes;
  return params;
}

void rememberOrigins(GraphExec& exec, const Graph& graph) {
  exec.fromGraph.clear();
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) exec.fromGraph[&graph.nodes[i]] = i;
}

// `destination`: cuStreamBeginCaptureToGraph's graph and dependencies (none: a graph of its own).
CUresult beginCapture(const char* entryPoint, CUstream hStream, CUstreamCaptureMode mode,
                      NullStream nullStream, gpuproxy::stub::CaptureDestination destination = {}) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    return runtime.capturing().captures().begin(target, mode, std::move(destination));
  });
}

CUresult endCapture(const char* entryPoint, CUstream hStream, CUgraph* phGraph,
                    NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    StreamCaptures& captures = runtime.capturing().captures();
    // A capture into a graph of the application's may leave phGraph out: it knows the graph.
    const StreamCaptures::Status capture = captures.statusOf(target.stream);
    if (phGraph == nullptr && !capture.intoApplicationGraph) return CUDA_ERROR_INVALID_VALUE;
    StreamCaptures::Ended ended = captures.end(target.stream);
    if (phGraph == nullptr) return ended.status;
    if (ended.status != CUDA_SUCCESS) {
      *phGraph = nullptr;
    } else if (ended.graph != nullptr) {
      *phGraph = adopt(std::move(ended.graph));
    } else {
      *phGraph = reinterpret_cast<CUgraph>(capture.graph);
    }
    return ended.status;
  });
}

// cuStreamBeginCaptureToGraph: a capture whose operations join `hGraph` when it ends, after
// `dependencies` (default edges only).
CUresult beginCaptureToGraph(const char* entryPoint, CUstream hStream, CUgraph hGraph,
                             const CUgraphNode* dependencies, const CUgraphEdgeData* edgeData,
                             size_t numDependencies, CUstreamCaptureMode mode,
                             NullStream nullStream) {
  auto refuse = [&](CUresult result) {
    return guarded(entryPoint, [result](Runtime&) { return result; });
  };
  gpuproxy::stub::CaptureDestination into;
  into.graph = graphOf(hGraph);
  if (into.graph == nullptr || (numDependencies > 0 && dependencies == nullptr)) {
    return refuse(CUDA_ERROR_INVALID_VALUE);
  }
  for (size_t i = 0; i < numDependencies; ++i) {
    std::optional<std::size_t> index = indexIn(*into.graph, dependencies[i]);
    if (!index) return refuse(CUDA_ERROR_INVALID_VALUE);
    into.dependencies.push_back(*index);
  }
  if (!onlyDefaultEdges(edgeData, numDependencies)) return refuse(CUDA_ERROR_NOT_SUPPORTED);
  return beginCapture(entryPoint, hStream, mode, nullStream, std::move(into));
}

// cuStreamIsCapturing and every cuStreamGetCaptureInfo. For a stream that is not capturing the
// driver returns the status alone, leaving the other outputs as they were. For one that is: its
// capture's id, the graph being built (nodes may be added to it meanwhile) and the nodes the
// stream's next operation will depend on.
CUresult captureInfo(const char* entryPoint, CUstream hStream, NullStream nullStream,
                     CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                     const CUgraphNode** dependencies, size_t* numDependencies) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    StreamCaptures& captures = runtime.capturing().captures();
    const StreamCaptures::Status capture = captures.statusOf(target.stream);
    *status = capture.status;
    if (capture.status == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_SUCCESS;
    if (id != nullptr) *id = capture.id;
    if (graph != nullptr) *graph = reinterpret_cast<CUgraph>(capture.graph);
    if (dependencies != nullptr || numDependencies != nullptr) {
      const std::vector<CUgraphNode>& next = captures.dependencies(target.stream);
      if (dependencies != nullptr) *dependencies = next.empty() ? nullptr : next.data();
      if (numDependencies != nullptr) *numDependencies = next.size();
    }
    return CUDA_SUCCESS;
  });
}

// cuStreamUpdateCaptureDependencies (flags: add to the stream's dependency set, or replace it).
CUresult updateCaptureDependencies(const char* entryPoint, CUstream hStream, NullStream nullStream,
                                   const CUgraphNode* dependencies, const CUgraphEdgeData* edgeData,
                                   size_t numDependencies, unsigned int flags) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES &&
        flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (numDependencies > 0 && dependencies == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!onlyDefaultEdges(edgeData, numDependencies)) return CUDA_ERROR_NOT_SUPPORTED;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    const std::vector<CUgraphNode> nodes(dependencies, dependencies + numDependencies);
    return runtime.capturing().captures().updateDependencies(
        target.stream, nodes, flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES);
  });
}

// cuStreamGetCaptureInfo_v3: as captureInfo, with an edge per dependency, each a default one (the
// array is the calling thread's until its next such call).
CUresult captureInfoWithEdges(const char* entryPoint, CUstream hStream, NullStream nullStream,
                              CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                              const CUgraphNode** dependencies, const CUgraphEdgeData** edgeData,
                              size_t* numDependencies) {
  if (edgeData != nullptr && dependencies == nullptr) {
    return guarded(entryPoint, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  size_t count = 0;
  const CUresult result = captureInfo(entryPoint, hStream, nullStream, status, id, graph,
                                      dependencies, edgeData != nullptr ? &count : numDependencies);
  if (result != CUDA_SUCCESS || edgeData == nullptr || *status == CU_STREAM_CAPTURE_STATUS_NONE) {
    return result;
  }
  thread_local std::vector<CUgraphEdgeData> defaultEdges;
  defaultEdges.assign(count, CUgraphEdgeData{});
  *edgeData = defaultEdges.empty() ? nullptr : defaultEdges.data();
  if (numDependencies != nullptr) *numDependencies = count;
  return CUDA_SUCCESS;
}

CUresult instantiate(const char* entryPoint, CUgraphExec* phGraphExec, CUgraph hGraph,
                     unsigned long long flags) {
  return guarded(entryPoint, [&](Runtime&) {
    if (phGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned long long kAccepted = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                             CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                             CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0) {
      GPUPROXY_STUB_LOG(kWarn, "%s: graphs launched from the device are not supported", entryPoint);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if ((flags & ~kAccepted) != 0) return CUDA_ERROR_INVALID_VALUE;
    const Graph* graph = graphOf(hGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::vector<std::size_t>> order = launchOrder(*graph);
    if (!order) {
      GPUPROXY_STUB_LOG(kWarn, "%s: the graph's dependencies form a cycle", entryPoint);
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto exec = std::make_unique<GraphExec>();
    exec->graph = *graph;
    if (!copyBodies(exec->graph)) {
      GPUPROXY_STUB_LOG(kWarn, "%s: a conditional body's dependencies form a cycle", entryPoint);
      return CUDA_ERROR_INVALID_VALUE;
    }
    exec->order = std::move(*order);
    exec->autoFreeOnLaunch = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
    exec->flags = flags & ~static_cast<unsigned long long>(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    if (!exec->claim.claim(*graph)) {
      GPUPROXY_STUB_LOG(kWarn,
                        "%s: a graph with memory nodes has an executable graph already (one at "
                        "a time)",
                        entryPoint);
      return CUDA_ERROR_INVALID_VALUE;
    }
    rememberOrigins(*exec, *graph);
    *phGraphExec = reinterpret_cast<CUgraphExec>(execs().adopt(std::move(exec)));
    return CUDA_SUCCESS;
  });
}

CUresult launchGraph(const char* entryPoint, CUgraphExec hGraphExec, CUstream hStream,
                     NullStream nullStream, bool upload) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    GraphExec* exec = execOf(hGraphExec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    if (exec->graph.context != 0 && exec->graph.context != target.context) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Uploading prepares nothing here: a launch sends the operations as they are.
    if (upload) return CUDA_SUCCESS;
    if (gpuproxy::stub::hasMemoryNodes(exec->graph)) {
      if (runtime.capturing().captures().capturing(target.stream)) {
        GPUPROXY_STUB_LOG(kWarn,
                          "%s: a graph with memory nodes launched into a capture is not "
                          "supported",
                          entryPoint);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      if (CUresult allocated =
              GraphMemory::instance().launch(exec->graph, exec->order, exec->autoFreeOnLaunch);
          allocated != CUDA_SUCCESS) {
        return allocated;
      }
    }
    const CUresult launched = runtime.capturing().launch(exec->graph, exec->order, target);
    const auto sameStream = [&](const StreamTarget& each) {
      return each.context == target.context && each.stream == target.stream;
    };
    if (launched == CUDA_SUCCESS && !exec->graph.userObjects.empty() &&
        std::none_of(exec->launchedOn.begin(), exec->launchedOn.end(), sameStream)) {
      exec->launchedOn.push_back(target);
    }
    return launched;
  });
}

// User object references of a destroyed executable graph, dropped once every stream it was
// launched into has run what came before (a host function on each; the last to run drops them).
struct ReleaseAfterLaunches {
  gpuproxy::stub::UserObjectReferences references;
  std::atomic<std::size_t> streamsLeft{0};
};

void releaseAfterLaunch(void* data) {
  auto* release = static_cast<ReleaseAfterLaunches*>(data);
  if (release->streamsLeft.fetch_sub(1) == 1) delete release;
}

CUgraphNodeType typeOf(const GraphNode& node) {
  switch (node.kind) {
    case GraphNode::Kind::kKernel:
      return CU_GRAPH_NODE_TYPE_KERNEL;
    case GraphNode::Kind::kMemcpy:
      return CU_GRAPH_NODE_TYPE_MEMCPY;
    case GraphNode::Kind::kMemset:
      return CU_GRAPH_NODE_TYPE_MEMSET;
    case GraphNode::Kind::kHost:
      return CU_GRAPH_NODE_TYPE_HOST;
    case GraphNode::Kind::kEmpty:
      return CU_GRAPH_NODE_TYPE_EMPTY;
    case GraphNode::Kind::kMemAlloc:
      return CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    case GraphNode::Kind::kMemFree:
      return CU_GRAPH_NODE_TYPE_MEM_FREE;
    case GraphNode::Kind::kConditional:
      return CU_GRAPH_NODE_TYPE_CONDITIONAL;
    case GraphNode::Kind::kChildGraph:
      return CU_GRAPH_NODE_TYPE_GRAPH;
    case GraphNode::Kind::kEventRecord:
      return CU_GRAPH_NODE_TYPE_EVENT_RECORD;
    case GraphNode::Kind::kEventWait:
      return CU_GRAPH_NODE_TYPE_WAIT_EVENT;
  }
  return CU_GRAPH_NODE_TYPE_EMPTY;
}

}  // namespace

// ---- capture ---------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  return beginCapture(__func__, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  return beginCapture(__func__, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return beginCapture(__func__, hStream, mode, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return beginCapture(__func__, hStream, mode, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return endCapture(__func__, hStream, phGraph, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return endCapture(__func__, hStream, phGraph, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return guarded(__func__, [&](Runtime&) {
    if (mode == nullptr || !gpuproxy::stub::isCaptureMode(*mode)) return CUDA_ERROR_INVALID_VALUE;
    *mode = gpuproxy::stub::exchangeThreadCaptureMode(*mode);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuStreamIsCapturing(CUstream hStream,
                                             CUstreamCaptureStatus* captureStatus) {
  return captureInfo(__func__, hStream, NullStream::kLegacy, captureStatus, nullptr, nullptr,
                     nullptr, nullptr);
}

GPUPROXY_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream,
                                                  CUstreamCaptureStatus* captureStatus) {
  return captureInfo(__func__, hStream, NullStream::kPerThread, captureStatus, nullptr, nullptr,
                     nullptr, nullptr);
}

GPUPROXY_EXPORT CUresult cuStreamGetCaptureInfo(CUstream hStream,
                                                CUstreamCaptureStatus* captureStatus_out,
                                                cuuint64_t* id_out) {
  return captureInfo(__func__, hStream, NullStream::kLegacy, captureStatus_out, id_out, nullptr,
                     nullptr, nullptr);
}

GPUPROXY_EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream,
                                                     CUstreamCaptureStatus* captureStatus_out,
                                                     cuuint64_t* id_out) {
  return captureInfo(__func__, hStream, NullStream::kPerThread, captureStatus_out, id_out, nullptr,
                     nullptr, nullptr);
}

GPUPROXY_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream hStream,
                                                   CUstreamCaptureStatus* captureStatus_out,
                                                   cuuint64_t* id_out, CUgraph* graph_out,
                                                   const CUgraphNode** dependencies_out,
                                                   size_t* numDependencies_out) {
  return captureInfo(__func__, hStream, NullStream::kLegacy, captureStatus_out, id_out, graph_out,
                     dependencies_out, numDependencies_out);
}

GPUPROXY_EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream,
                                                        CUstreamCaptureStatus* captureStatus_out,
                                                        cuuint64_t* id_out, CUgraph* graph_out,
                                                        const CUgraphNode** dependencies_out,
                                                        size_t* numDependencies_out) {
  return captureInfo(__func__, hStream, NullStream::kPerThread, captureStatus_out, id_out,
                     graph_out, dependencies_out, numDependencies_out);
}

GPUPROXY_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream hStream,
                                                   CUstreamCaptureStatus* captureStatus_out,
                                                   cuuint64_t* id_out, CUgraph* graph_out,
                                                   const CUgraphNode** dependencies_out,
                                                   const CUgraphEdgeData** edgeData_out,
                                                   size_t* numDependencies_out) {
  return captureInfoWithEdges(__func__, hStream, NullStream::kLegacy, captureStatus_out, id_out,
                              graph_out, dependencies_out, edgeData_out, numDependencies_out);
}

GPUPROXY_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream,
                                                        CUstreamCaptureStatus* captureStatus_out,
                                                        cuuint64_t* id_out, CUgraph* graph_out,
                                                        const CUgraphNode** dependencies_out,
                                                        const CUgraphEdgeData** edgeData_out,
                                                        size_t* numDependencies_out) {
  return captureInfoWithEdges(__func__, hStream, NullStream::kPerThread, captureStatus_out, id_out,
                              graph_out, dependencies_out, edgeData_out, numDependencies_out);
}

GPUPROXY_EXPORT CUresult cuStreamUpdateCaptureDependencies(CUstream hStream,
                                                           CUgraphNode* dependencies,
                                                           size_t numDependencies,
                                                           unsigned int flags) {
  return updateCaptureDependencies(__func__, hStream, NullStream::kLegacy, dependencies, nullptr,
                                   numDependencies, flags);
}

GPUPROXY_EXPORT CUresult cuStreamUpdateCaptureDependencies_ptsz(CUstream hStream,
                                                                CUgraphNode* dependencies,
                                                                size_t numDependencies,
                                                                unsigned int flags) {
  return updateCaptureDependencies(__func__, hStream, NullStream::kPerThread, dependencies, nullptr,
                                   numDependencies, flags);
}

GPUPROXY_EXPORT CUresult cuStreamUpdateCaptureDependencies_v2(CUstream hStream,
                                                              CUgraphNode* dependencies,
                                                              const CUgraphEdgeData* dependencyData,
                                                              size_t numDependencies,
                                                              unsigned int flags) {
  return updateCaptureDependencies(__func__, hStream, NullStream::kLegacy, dependencies,
                                   dependencyData, numDependencies, flags);
}

GPUPROXY_EXPORT CUresult cuStreamUpdateCaptureDependencies_v2_ptsz(
    CUstream hStream, CUgraphNode* dependencies, const CUgraphEdgeData* dependencyData,
    size_t numDependencies, unsigned int flags) {
  return updateCaptureDependencies(__func__, hStream, NullStream::kPerThread, dependencies,
                                   dependencyData, numDependencies, flags);
}

// ---- graphs and executable graphs ------------------------------------------------------------

// An empty graph (nodes cannot be added to it here; an empty graph launches as a no-op).
GPUPROXY_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  return guarded(__func__, [&](Runtime&) {
    if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    *phGraph = adopt(std::make_unique<Graph>());
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphClone(CUgraph* phGraphClone, CUgraph originalGraph) {
  return guarded(__func__, [&](Runtime&) {
    if (phGraphClone == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Graph* graph = graphOf(originalGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (gpuproxy::stub::hasMemoryNodes(*graph)) return CUDA_ERROR_NOT_SUPPORTED;  // as CUDA says
    if (gpuproxy::stub::hasConditionalNodes(*graph)) {
      GPUPROXY_STUB_LOG(kWarn, "cuGraphClone: a graph with conditional nodes is not cloned");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    auto clone = std::make_unique<Graph>(*graph);
    if (!copyBodies(*clone)) return CUDA_ERROR_INVALID_VALUE;  // a child graph with a cycle
    clone->clonedFrom.clear();
    for (std::size_t i = 0; i < graph->nodes.size(); ++i) {
      if (!graph->nodes[i].removed) clone->clonedFrom[&graph->nodes[i]] = i;
    }
    lendBodies(*clone);
    *phGraphClone = adopt(std::move(clone));
    return CUDA_SUCCESS;
  });
}

// A conditional node's body graphs are its own: destroyed with the graph that holds the node.
GPUPROXY_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  return guarded(__func__, [&](Runtime&) {
    const Graph* graph = graphOf(hGraph);
    // A body, a child graph or a graph a capture is building is not the application's to destroy.
    if (graph == nullptr || graph->isBody || graphs().pinned(graph)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    forgetBodies(*graph);
    return graphs().destroy(hGraph) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

// The nodes of a graph, in the order they were captured (each depends on the one before).
GPUPROXY_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  return guarded(__func__, [&](Runtime&) {
    if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Graph* graph = graphOf(hGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<CUgraphNode> all;
    for (const GraphNode& node : graph->nodes) {
      if (!node.removed) all.push_back(handleOf(node));
    }
    return answerList(all, nodes, *numNodes);
  });
}

// The node keeps its place in the graph's node list as an empty node no edge touches
// (GraphNode::removed), so that every other node keeps its index and its handle.
GPUPROXY_EXPORT CUresult cuGraphDestroyNode(CUgraphNode hNode) {
  return guarded(__func__, [&](Runtime& runtime) {
    std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    Graph& graph = *found->first;
    const std::size_t index = found->second;
    if (gpuproxy::stub::hasMemoryNodes(graph)) {
      GPUPROXY_STUB_LOG(kWarn,
                        "cuGraphDestroyNode: a graph with memory allocation or free nodes keeps "
                        "its nodes, as CUDA says");
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Its streams' dependency sets may name the node: the capture owns the graph meanwhile.
    if (runtime.capturing().captures().buildsInto(graph)) {
      GPUPROXY_STUB_LOG(kWarn, "cuGraphDestroyNode: a capture is still adding to the node's graph");
      return CUDA_ERROR_INVALID_VALUE;
    }
    GraphNode& node = graph.nodes[index];
    for (const std::shared_ptr<Graph>& body : node.bodies) {
      forgetBodies(*body);
      graphs().forget(body.get());
    }
    node = GraphNode{};
    node.kind = GraphNode::Kind::kEmpty;
    node.removed = true;
    for (GraphNode& other : graph.nodes) std::erase(other.dependencies, index);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphNodeFindInClone(CUgraphNode* phNode, CUgraphNode hOriginalNode,
                                                CUgraph hClonedGraph) {
  return guarded(__func__, [&](Runtime&) {
    if (phNode == nullptr || hOriginalNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Graph* clone = graphOf(hClonedGraph);
    if (clone == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto copy = clone->clonedFrom.find(reinterpret_cast<const GraphNode*>(hOriginalNode));
    if (copy == clone->clonedFrom.end() || clone->nodes[copy->second].removed) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *phNode = handleOf(clone->nodes[copy->second]);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  return guarded(__func__, [&](Runtime&) {
    if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    *type = typeOf(found->first->nodes[found->second]);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                     unsigned long long flags) {
  return instantiate(__func__, phGraphExec, hGraph, flags);
}

GPUPROXY_EXPORT CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                            CUgraphNode* phErrorNode, char* logBuffer,
                                            size_t bufferSize) {
  if (phErrorNode != nullptr) *phErrorNode = nullptr;
  if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
  return instantiate(__func__, phGraphExec, hGraph, 0);
}

GPUPROXY_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                               CUgraphNode* phErrorNode, char* logBuffer,
                                               size_t bufferSize) {
  if (phErrorNode != nullptr) *phErrorNode = nullptr;
  if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
  return instantiate(__func__, phGraphExec, hGraph, 0);
}

namespace {

CUresult instantiateWithParams(const char* entryPoint, CUgraphExec* phGraphExec, CUgraph hGraph,
                               CUDA_GRAPH_INSTANTIATE_PARAMS* params, NullStream nullStream) {
  if (params == nullptr) {
    return guarded(entryPoint, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  params->hErrNode_out = nullptr;
  const CUresult made = instantiate(entryPoint, phGraphExec, hGraph, params->flags);
  params->result_out =
      made == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  if (made != CUDA_SUCCESS || (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) == 0) {
    return made;
  }
  return launchGraph(entryPoint, *phGraphExec, params->hUploadStream, nullStream, /*upload=*/true);
}

}  // namespace

GPUPROXY_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                      CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiateWithParams(__func__, phGraphExec, hGraph, params, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                           CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiateWithParams(__func__, phGraphExec, hGraph, params, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuGraphExecGetFlags(CUgraphExec hGraphExec, cuuint64_t* flags) {
  return guarded(__func__, [&](Runtime&) {
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const GraphExec* exec = execOf(hGraphExec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *flags = exec->flags;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  return guarded(__func__, [&](Runtime&) {
    GraphExec* exec = execOf(hGraphExec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Its launches may still run: the user objects they use outlive them.
    if (!exec->launchedOn.empty() && !exec->graph.userObjects.empty()) {
      auto* release = new ReleaseAfterLaunches;
      release->references = std::move(exec->graph.userObjects);
      release->streamsLeft = exec->launchedOn.size();
      for (const StreamTarget& target : exec->launchedOn) {
        if (gpuproxy::stub::launchHostFunction(target, releaseAfterLaunch, release) !=
            CUDA_SUCCESS) {
          releaseAfterLaunch(release);  // the stream is gone, and its work with it
        }
      }
    }
    return execs().destroy(hGraphExec) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

GPUPROXY_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return launchGraph(__func__, hGraphExec, hStream, NullStream::kLegacy, /*upload=*/false);
}

GPUPROXY_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return launchGraph(__func__, hGraphExec, hStream, NullStream::kPerThread, /*upload=*/false);
}

GPUPROXY_EXPORT CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  return launchGraph(__func__, hGraphExec, hStream, NullStream::kLegacy, /*upload=*/true);
}

GPUPROXY_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return launchGraph(__func__, hGraphExec, hStream, NullStream::kPerThread, /*upload=*/true);
}

// ---- graphs built node by node ---------------------------------------------------------------

namespace {

// Adds `node`, waiting for `dependencies` (nodes of the same graph), to the graph. `context`: where
// the node's work runs (0 for a node that runs none); a graph's nodes must share one.
CUresult addNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                 size_t numDependencies, GraphNode node, std::uint64_t context) {
  if (phGraphNode == nullptr || (numDependencies > 0 && dependencies == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Under the graphs' lock: locate() walks every graph's nodes, so no graph grows meanwhile.
  return graphs().locked([&](const std::set<Graph*>& live) {
    auto* graph = reinterpret_cast<Graph*>(hGraph);
    if (live.count(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
    if (graph->isBody && !allowedInConditionalBody(node.kind)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < numDependencies; ++i) {
      std::optional<std::size_t> index = indexIn(*graph, dependencies[i]);
      if (!index) return CUDA_ERROR_INVALID_VALUE;
      if (std::find(node.dependencies.begin(), node.dependencies.end(), *index) !=
          node.dependencies.end()) {
        return CUDA_ERROR_INVALID_VALUE;  // the same dependency twice
      }
      node.dependencies.push_back(*index);
    }
    if (context != 0) {
      if (graph->context != 0 && graph->context != context) {
        GPUPROXY_STUB_LOG(kWarn, "a graph whose nodes run in several contexts is not supported");
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      graph->context = context;
    }
    graph->nodes.push_back(std::move(node));
    *phGraphNode = handleOf(graph->nodes.back());
    return CUDA_SUCCESS;
  });
}

// The context a node's work runs in: the one named, else the calling thread's current one.
std::uint64_t contextOr(CUcontext ctx) {
  return ctx != nullptr ? gpuproxy::stub::handleValue(ctx) : gpuproxy::stub::currentContext();
}

// A kernel node's launch: what cuLaunchKernel would send, without its stream. `f` a CUfunction
// (which runs in its own context) or, when null, `kern` in `ctx` (or the current context).
CUresult kernelNode(Runtime& runtime, const CUDA_KERNEL_NODE_PARAMS& params, GraphNode& node,
                    std::uint64_t& context) {
  CUfunction f = params.func;
  if (f != nullptr) {
    std::shared_ptr<const gpuproxy::stub::KernelRecord> kernel =
        runtime.function(gpuproxy::stub::handleValue(f));
    if (!kernel) return CUDA_ERROR_INVALID_HANDLE;
    context = kernel->context;
  } else {
    if (params.kern == nullptr) return CUDA_ERROR_INVALID_VALUE;
    f = reinterpret_cast<CUfunction>(params.kern);
    context = contextOr(params.ctx);
  }
  if (!runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
  const unsigned grid[3] = {params.gridDimX, params.gridDimY, params.gridDimZ};
  const unsigned block[3] = {params.blockDimX, params.blockDimY, params.blockDimZ};
  std::uint64_t function = 0;
  if (CUresult prepared = gpuproxy::stub::prepareLaunch(runtime, f, context, grid, block,
                                                        params.sharedMemBytes, params.kernelParams,
                                                        params.extra, function, node.parameters);
      prepared != CUDA_SUCCESS) {
    return prepared;
  }
  ring::LaunchKernel launch;
  launch.function = function;
  launch.grid = ring::Dim3{params.gridDimX, params.gridDimY, params.gridDimZ};
  launch.block = ring::Dim3{params.blockDimX, params.blockDimY, params.blockDimZ};
  launch.sharedMemBytes = params.sharedMemBytes;
  launch.parameterBytes = static_cast<std::uint32_t>(node.parameters.size());
  node.kind = GraphNode::Kind::kKernel;
  node.command = ring::Command{launch};
  return CUDA_SUCCESS;
}

// A kernel node's parameters as cuGraphAddKernelNode takes them, from another version of the
// struct: the launch's fields, which every version has.
template <typename Given>
CUDA_KERNEL_NODE_PARAMS launchFieldsOf(const Given& given) {
  CUDA_KERNEL_NODE_PARAMS params{};
  params.func = given.func;
  params.gridDimX = given.gridDimX;
  params.gridDimY = given.gridDimY;
  params.gridDimZ = given.gridDimZ;
  params.blockDimX = given.blockDimX;
  params.blockDimY = given.blockDimY;
  params.blockDimZ = given.blockDimZ;
  params.sharedMemBytes = given.sharedMemBytes;
  params.kernelParams = given.kernelParams;
  params.extra = given.extra;
  return params;
}

CUDA_KERNEL_NODE_PARAMS fromV1(const CUDA_KERNEL_NODE_PARAMS_v1& v1) {
  return launchFieldsOf(v1);
}

CUresult addKernelNode(const char* entryPoint, CUgraphNode* phGraphNode, CUgraph hGraph,
                       const CUgraphNode* dependencies, size_t numDependencies,
                       const CUDA_KERNEL_NODE_PARAMS* params) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GraphNode node;
    std::uint64_t context = 0;
    if (CUresult made = kernelNode(runtime, *params, node, context); made != CUDA_SUCCESS) {
      return made;
    }
    return addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), context);
  });
}

// A kernel node's launch replaced (cuGraphKernelNodeSetParams, cuGraphExecKernelNodeSetParams):
// it stays in its context.
CUresult replaceKernel(Runtime& runtime, GraphNode& node, const CUDA_KERNEL_NODE_PARAMS& params,
                       std::uint64_t graphContext) {
  if (node.kind != GraphNode::Kind::kKernel) return CUDA_ERROR_INVALID_VALUE;
  GraphNode replacement;
  std::uint64_t context = 0;
  if (CUresult made = kernelNode(runtime, params, replacement, context); made != CUDA_SUCCESS) {
    return made;
  }
  if (graphContext != 0 && context != graphContext) return CUDA_ERROR_INVALID_VALUE;
  // New parameters leave the node's attributes as they were.
  const auto* old = node.command ? std::get_if<ring::LaunchKernel>(&*node.command) : nullptr;
  if (old != nullptr && old->cooperative) {
    std::get<ring::LaunchKernel>(*replacement.command).cooperative = true;
  }
  node.command = std::move(replacement.command);
  node.parameters = std::move(replacement.parameters);
  return CUDA_SUCCESS;
}

// cuGraph[Exec]KernelNodeSetParams.
CUresult setKernelParams(const char* entryPoint, NodeOwner owner, CUgraphNode hNode,
                         const CUDA_KERNEL_NODE_PARAMS* params) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(owner, hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    return replaceKernel(runtime, *found->first, *params, found->second);
  });
}

// cuGraphAddDependencies (`add`) and cuGraphRemoveDependencies: each edge named must be new (or,
// to remove, exist); none is changed otherwise.
CUresult changeDependencies(const char* entryPoint, CUgraph hGraph, const CUgraphNode* from,
                            const CUgraphNode* to, const CUgraphEdgeData* edgeData,
                            size_t numDependencies, bool add) {
  return guarded(entryPoint, [&](Runtime&) {
    if (numDependencies > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    Graph* graph = graphOf(hGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Edges of another kind: none can be added here, so none exists to remove.
    if (!onlyDefaultEdges(edgeData, numDependencies)) {
      return add ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    std::vector<std::pair<std::size_t, std::size_t>> edges;
    for (size_t i = 0; i < numDependencies; ++i) {
      std::optional<std::size_t> source = indexIn(*graph, from[i]);
      std::optional<std::size_t> target = indexIn(*graph, to[i]);
      if (!source || !target || *source == *target) return CUDA_ERROR_INVALID_VALUE;
      const std::vector<std::size_t>& existing = graph->nodes[*target].dependencies;
      const bool exists = std::find(existing.begin(), existing.end(), *source) != existing.end();
      if (exists == add) return CUDA_ERROR_INVALID_VALUE;
      edges.emplace_back(*source, *target);
    }
    for (const auto& [source, target] : edges) {
      std::vector<std::size_t>& dependencies = graph->nodes[target].dependencies;
      if (add) {
        dependencies.push_back(source);
      } else {
        std::erase(dependencies, source);
      }
    }
    return CUDA_SUCCESS;
  });
}

// cuGraphExecUpdate: the executable graph takes `hGraph`'s nodes when it has the same shape
// (node for node, in the order added: the same kinds, dependencies and context); a kernel node
// may change its function and arguments, a copy or memset its operands, a host node its function.
CUresult execUpdate(const char* entryPoint, CUgraphExec hGraphExec, CUgraph hGraph,
                    CUgraphExecUpdateResultInfo* info) {
  return guarded(entryPoint, [&](Runtime&) {
    GraphExec* exec = execOf(hGraphExec);
    const Graph* graph = graphOf(hGraph);
    if (exec == nullptr || graph == nullptr || info == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *info = CUgraphExecUpdateResultInfo{CU_GRAPH_EXEC_UPDATE_SUCCESS, nullptr, nullptr};
    auto refuse = [&](CUgraphExecUpdateResult why, const GraphNode* node) {
      info->result = why;
      info->errorNode = node != nullptr ? handleOf(*node) : nullptr;
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    };
    const Graph& current = exec->graph;
    if (hasNestedGraphs(*graph) || hasNestedGraphs(current)) {
      return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED, nullptr);
    }
    if (graph->nodes.size() != current.nodes.size()) {
      return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, nullptr);
    }
    if (graph->context != 0 && current.context != 0 && graph->context != current.context) {
      return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED, nullptr);
    }
    for (std::size_t i = 0; i < graph->nodes.size(); ++i) {
      const GraphNode& next = graph->nodes[i];
      const GraphNode& now = current.nodes[i];
      if (next.removed != now.removed || next.dependencies != now.dependencies) {
        return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, next.removed ? nullptr : &next);
      }
      // A copy or memset may have been captured or given its parameters, either way: what
      // counts is that a copy keeps its kinds of memory.
      bool sameShape = next.kind == now.kind;
      if (sameShape && next.kind == GraphNode::Kind::kMemcpy) {
        const std::optional<CUDA_MEMCPY3D> to = copyParamsOf(next);
        const std::optional<CUDA_MEMCPY3D> from = copyParamsOf(now);
        sameShape = to && from && to->srcMemoryType == from->srcMemoryType &&
                    to->dstMemoryType == from->dstMemoryType;
      } else if (sameShape && next.kind != GraphNode::Kind::kMemset) {
        sameShape = (next.host != nullptr) == (now.host != nullptr) &&
                    next.command.has_value() == now.command.has_value() &&
                    (!next.command || next.command->index() == now.command->index());
      }
      if (!sameShape) return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, &next);
      // A memory node keeps its allocation: its address is fixed when the node is made.
      if (next.allocation != now.allocation) {
        return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED, &next);
      }
    }
    exec->graph = *graph;
    if (exec->graph.context == 0) exec->graph.context = current.context;
    // Same dependencies node for node: the same launch order.
    rememberOrigins(*exec, *graph);
    return CUDA_SUCCESS;
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                 const CUgraphNode* dependencies,
                                                 size_t numDependencies,
                                                 const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  return addKernelNode(__func__, phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  if (nodeParams == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  const CUDA_KERNEL_NODE_PARAMS params = fromV1(*nodeParams);
  return addKernelNode(__func__, phGraphNode, hGraph, dependencies, numDependencies, &params);
}

GPUPROXY_EXPORT CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode hNode,
                                                       const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  return setKernelParams(__func__, kInItsGraph, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphKernelNodeSetParams(CUgraphNode hNode,
                                                    const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  if (nodeParams == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  const CUDA_KERNEL_NODE_PARAMS params = fromV1(*nodeParams);
  return setKernelParams(__func__, kInItsGraph, hNode, &params);
}

GPUPROXY_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(
    CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  return setKernelParams(__func__, hGraphExec, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphExecKernelNodeSetParams(
    CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  if (nodeParams == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  const CUDA_KERNEL_NODE_PARAMS params = fromV1(*nodeParams);
  return setKernelParams(__func__, hGraphExec, hNode, &params);
}

// Checked when the graph is launched, as cuMemcpy3DAsync checks it.
GPUPROXY_EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              const CUDA_MEMCPY3D* copyParams, CUcontext ctx) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (copyParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t context = contextOr(ctx);
    if (!runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    GraphNode node;
    node.kind = GraphNode::Kind::kMemcpy;
    node.copy = *copyParams;
    return addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), context);
  });
}

GPUPROXY_EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              const CUDA_MEMSET_NODE_PARAMS* memsetParams,
                                              CUcontext ctx) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (memsetParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const CUDA_MEMSET_NODE_PARAMS& memset = *memsetParams;
    const unsigned element = memset.elementSize;
    if ((element != 1 && element != 2 && element != 4) || memset.width == 0 || memset.height == 0 ||
        (memset.height > 1 && memset.pitch < memset.width * element)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t context = contextOr(ctx);
    if (!runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    GraphNode node;
    node.kind = GraphNode::Kind::kMemset;
    node.memset = memset;
    return addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), context);
  });
}

GPUPROXY_EXPORT CUresult cuGraphAddHostNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                            const CUgraphNode* dependencies, size_t numDependencies,
                                            const CUDA_HOST_NODE_PARAMS* nodeParams) {
  return guarded(__func__, [&](Runtime&) {
    if (nodeParams == nullptr || nodeParams->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GraphNode node;
    node.kind = GraphNode::Kind::kHost;
    node.function = nodeParams->fn;
    node.userData = nodeParams->userData;
    return addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), 0);
  });
}

GPUPROXY_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                             const CUgraphNode* dependencies,
                                             size_t numDependencies) {
  return guarded(__func__, [&](Runtime&) {
    GraphNode node;
    node.kind = GraphNode::Kind::kEmpty;
    return addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), 0);
  });
}

GPUPROXY_EXPORT CUresult cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode* from,
                                                const CUgraphNode* to, size_t numDependencies) {
  return changeDependencies(__func__, hGraph, from, to, nullptr, numDependencies, true);
}

GPUPROXY_EXPORT CUresult cuGraphAddDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                                   const CUgraphNode* to,
                                                   const CUgraphEdgeData* edgeData,
                                                   size_t numDependencies) {
  return changeDependencies(__func__, hGraph, from, to, edgeData, numDependencies, true);
}

GPUPROXY_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                              CUgraphExecUpdateResultInfo* resultInfo) {
  return execUpdate(__func__, hGraphExec, hGraph, resultInfo);
}

GPUPROXY_EXPORT CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph,
                                           CUgraphNode* hErrorNode_out,
                                           CUgraphExecUpdateResult* updateResult_out) {
  if (hErrorNode_out == nullptr || updateResult_out == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  CUgraphExecUpdateResultInfo info{};
  const CUresult result = execUpdate(__func__, hGraphExec, hGraph, &info);
  *hErrorNode_out = info.errorNode;
  *updateResult_out = info.result;
  return result;
}

// ---- memory nodes ----------------------------------------------------------------------------

namespace {

// Where an alloc node on `device` allocates: the calling thread's context when it is on that
// device, else the device's primary context (retained for the rest of the process if the program
// has not).
CUresult contextOnDevice(Runtime& runtime, std::uint32_t device, std::uint64_t& context) {
  const std::uint64_t current = gpuproxy::stub::currentContext();
  if (std::optional<gpuproxy::stub::ContextRecord> record = runtime.context(current);
      record && record->device == device) {
    context = current;
    return CUDA_SUCCESS;
  }
  if (std::optional<std::uint64_t> primary = runtime.primaryContext(device)) {
    context = *primary;
    return CUDA_SUCCESS;
  }
  CUcontext retained = nullptr;
  if (CUresult result = cuDevicePrimaryCtxRetain(&retained, static_cast<CUdevice>(device));
      result != CUDA_SUCCESS) {
    return result;
  }
  context = gpuproxy::stub::handleValue(retained);
  return CUDA_SUCCESS;
}

// The memory node `hNode` of kind `kind`; null when it is none.
const GraphNode* memoryNode(CUgraphNode hNode, GraphNode::Kind kind) {
  std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
  if (!found) return nullptr;
  const GraphNode& node = found->first->nodes[found->second];
  return node.kind == kind ? &node : nullptr;
}

}  // namespace

// Device memory in the device's default way (pinned, on one device, no IPC handle); access from
// other devices (accessDescs naming another device) is not supported.
GPUPROXY_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                const CUgraphNode* dependencies,
                                                size_t numDependencies,
                                                CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (nodeParams == nullptr || nodeParams->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    const CUmemPoolProps& pool = nodeParams->poolProps;
    if (pool.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        pool.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        runtime.device(static_cast<CUdevice>(pool.location.id)) == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (pool.handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_INVALID_VALUE;
    if (nodeParams->accessDescCount > 0 && nodeParams->accessDescs == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const auto device = static_cast<std::uint32_t>(pool.location.id);
    for (size_t i = 0; i < nodeParams->accessDescCount; ++i) {
      const CUmemAccessDesc& access = nodeParams->accessDescs[i];
      if (access.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
          static_cast<std::uint32_t>(access.location.id) != device) {
        GPUPROXY_STUB_LOG(kWarn,
                          "%s: access to a graph allocation from another device is not "
                          "supported",
                          __func__);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
    std::uint64_t context = 0;
    if (CUresult found = contextOnDevice(runtime, device, context); found != CUDA_SUCCESS) {
      return found;
    }
    std::shared_ptr<GraphAllocation> allocation;
    if (CUresult allocated =
            GraphMemory::instance().allocate(context, device, nodeParams->bytesize, allocation);
        allocated != CUDA_SUCCESS) {
      return allocated;
    }
    GraphNode node;
    node.kind = GraphNode::Kind::kMemAlloc;
    node.allocation = allocation;
    const CUresult added =
        addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), context);
    if (added == CUDA_SUCCESS) nodeParams->dptr = allocation->address();
    return added;
  });
}

// Frees an allocation an alloc node made (of this graph or another), once per graph.
GPUPROXY_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                               const CUgraphNode* dependencies,
                                               size_t numDependencies, CUdeviceptr dptr) {
  return guarded(__func__, [&](Runtime&) {
    std::shared_ptr<GraphAllocation> allocation = GraphMemory::instance().find(dptr);
    if (!allocation) return CUDA_ERROR_INVALID_VALUE;
    if (const Graph* graph = graphOf(hGraph)) {
      for (const GraphNode& node : graph->nodes) {
        if (node.kind == GraphNode::Kind::kMemFree && node.allocation == allocation) {
          return CUDA_ERROR_INVALID_VALUE;  // freed twice in one graph
        }
      }
    }
    GraphNode node;
    node.kind = GraphNode::Kind::kMemFree;
    node.allocation = std::move(allocation);
    return addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), 0);
  });
}

GPUPROXY_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode,
                                                      CUDA_MEM_ALLOC_NODE_PARAMS* params_out) {
  return guarded(__func__, [&](Runtime&) {
    const GraphNode* node = memoryNode(hNode, GraphNode::Kind::kMemAlloc);
    if (node == nullptr || params_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *params_out = CUDA_MEM_ALLOC_NODE_PARAMS{};
    params_out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params_out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params_out->poolProps.location.id = static_cast<int>(node->allocation->device());
    params_out->bytesize = node->allocation->bytes();
    params_out->dptr = node->allocation->address();
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr* dptr_out) {
  return guarded(__func__, [&](Runtime&) {
    const GraphNode* node = memoryNode(hNode, GraphNode::Kind::kMemFree);
    if (node == nullptr || dptr_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *dptr_out = node->allocation->address();
    return CUDA_SUCCESS;
  });
}

// What graph allocations hold on a device. Used and reserved memory are the same here: an
// allocation is backed from its node's creation until nothing needs it.
GPUPROXY_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                      void* value) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (runtime.device(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GraphMemory& memory = GraphMemory::instance();
    const auto index = static_cast<std::uint32_t>(device);
    switch (attr) {
      case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
      case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        *static_cast<cuuint64_t*>(value) = memory.bytesHeld(index);
        return CUDA_SUCCESS;
      case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        *static_cast<cuuint64_t*>(value) = memory.mostBytesHeld(index);
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
  });
}

// Only the high-water marks can be set, and only to 0 (which resets them to what is held now).
GPUPROXY_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                      void* value) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (runtime.device(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    if (value == nullptr || *static_cast<const cuuint64_t*>(value) != 0 ||
        (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    GraphMemory::instance().resetMostBytesHeld(static_cast<std::uint32_t>(device));
    return CUDA_SUCCESS;
  });
}

// Nothing is cached for graphs beyond what their allocations hold, so there is nothing to trim.
GPUPROXY_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  return guarded(__func__, [&](Runtime& runtime) {
    return runtime.device(device) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
  });
}

// ---- event record and wait nodes -------------------------------------------------------------

namespace {

// The context of `event`, one of this process's events; nullopt for anything else.
std::optional<std::uint64_t> contextOfEvent(Runtime& runtime, CUevent event) {
  if (event == nullptr) return std::nullopt;
  return runtime.eventContext(gpuproxy::stub::handleValue(event));
}

// An event record node (`kind` kEventRecord) records `event` once the work it depends on is done;
// an event wait node (kEventWait) holds the graph's later work until `event`'s latest record, as
// of the graph's launch, is done. A launch sends them as cuEventRecord and cuStreamWaitEvent on
// the launch stream, in launch order. The event is the application's: the graph does not own it.
// A record node runs in its event's context; a wait may be for an event of any context.
CUresult addEventNode(Runtime& runtime, CUgraphNode* phGraphNode, CUgraph hGraph,
                      const CUgraphNode* dependencies, size_t numDependencies, GraphNode::Kind kind,
                      CUevent event) {
  // Not an event of this process's: CUDA_ERROR_INVALID_VALUE, the error the driver gives here.
  std::optional<std::uint64_t> context = contextOfEvent(runtime, event);
  if (!context) return CUDA_ERROR_INVALID_VALUE;
  GraphNode node;
  node.kind = kind;
  node.event = event;
  return addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node),
                 kind == GraphNode::Kind::kEventRecord ? *context : 0);
}

// The event of an event node of `kind` in `owner`; a record node's new event must be of the
// context its graph runs in.
CUresult setNodeEvent(Runtime& runtime, NodeOwner owner, CUgraphNode hNode, GraphNode::Kind kind,
                      CUevent event) {
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::optional<std::uint64_t> context = contextOfEvent(runtime, event);
  if (!context) return CUDA_ERROR_INVALID_HANDLE;
  std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(owner, hNode);
  if (!found || found->first->kind != kind) return CUDA_ERROR_INVALID_VALUE;
  if (kind == GraphNode::Kind::kEventRecord && found->second != 0 && found->second != *context) {
    GPUPROXY_STUB_LOG(kWarn, "a graph whose nodes run in several contexts is not supported");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  found->first->event = event;
  return CUDA_SUCCESS;
}

CUresult nodeEvent(CUgraphNode hNode, GraphNode::Kind kind, CUevent* event_out) {
  if (event_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(kInItsGraph, hNode);
  if (!found || found->first->kind != kind) return CUDA_ERROR_INVALID_VALUE;
  *event_out = found->first->event;
  return CUDA_SUCCESS;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuGraphAddEventRecordNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                   const CUgraphNode* dependencies,
                                                   size_t numDependencies, CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    return addEventNode(runtime, phGraphNode, hGraph, dependencies, numDependencies,
                        GraphNode::Kind::kEventRecord, event);
  });
}

GPUPROXY_EXPORT CUresult cuGraphAddEventWaitNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                 const CUgraphNode* dependencies,
                                                 size_t numDependencies, CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    return addEventNode(runtime, phGraphNode, hGraph, dependencies, numDependencies,
                        GraphNode::Kind::kEventWait, event);
  });
}

GPUPROXY_EXPORT CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode hNode, CUevent* event_out) {
  return guarded(__func__, [&](Runtime&) {
    return nodeEvent(hNode, GraphNode::Kind::kEventRecord, event_out);
  });
}

GPUPROXY_EXPORT CUresult cuGraphEventWaitNodeGetEvent(CUgraphNode hNode, CUevent* event_out) {
  return guarded(
      __func__, [&](Runtime&) { return nodeEvent(hNode, GraphNode::Kind::kEventWait, event_out); });
}

GPUPROXY_EXPORT CUresult cuGraphEventRecordNodeSetEvent(CUgraphNode hNode, CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    return setNodeEvent(runtime, kInItsGraph, hNode, GraphNode::Kind::kEventRecord, event);
  });
}

GPUPROXY_EXPORT CUresult cuGraphEventWaitNodeSetEvent(CUgraphNode hNode, CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    return setNodeEvent(runtime, kInItsGraph, hNode, GraphNode::Kind::kEventWait, event);
  });
}

GPUPROXY_EXPORT CUresult cuGraphExecEventRecordNodeSetEvent(CUgraphExec hGraphExec,
                                                            CUgraphNode hNode, CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    return setNodeEvent(runtime, hGraphExec, hNode, GraphNode::Kind::kEventRecord, event);
  });
}

GPUPROXY_EXPORT CUresult cuGraphExecEventWaitNodeSetEvent(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                          CUevent event) {
  return guarded(__func__, [&](Runtime& runtime) {
    return setNodeEvent(runtime, hGraphExec, hNode, GraphNode::Kind::kEventWait, event);
  });
}

// ---- nodes by their generic parameters (cuGraphAddNode, cuGraphNodeSetParams) -----------------

namespace {

// The reserved words of a CUgraphNodeParams must be zero.
bool reservedAreZero(const CUgraphNodeParams& params) {
  return params.reserved0[0] == 0 && params.reserved0[1] == 0 && params.reserved0[2] == 0 &&
         params.reserved2 == 0;
}

// The generic form's kernel parameters (CUDA_KERNEL_NODE_PARAMS_v3: the same fields as v2).
CUDA_KERNEL_NODE_PARAMS kernelParamsOf(const CUDA_KERNEL_NODE_PARAMS_v3& v3) {
  CUDA_KERNEL_NODE_PARAMS params = launchFieldsOf(v3);
  params.kern = v3.kern;
  params.ctx = v3.ctx;
  return params;
}

// A child graph node: a copy of `childGraph` (and of its own child graphs), which
// cuGraphChildGraphNodeGetGraph names. A graph with memory or conditional nodes cannot be a child,
// as CUDA says.
CUresult addChildGraphNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                           const CUgraphNode* dependencies, size_t numDependencies,
                           CUgraph childGraph) {
  const Graph* child = graphOf(childGraph);
  if (child == nullptr || childGraph == hGraph || gpuproxy::stub::hasMemoryNodes(*child) ||
      hasConditionalNodes(*child)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto body = std::make_shared<Graph>(*child);
  body->isBody = false;
  if (!copyBodies(*body)) return CUDA_ERROR_INVALID_VALUE;
  GraphNode node;
  node.kind = GraphNode::Kind::kChildGraph;
  node.bodyHandles.push_back(reinterpret_cast<CUgraph>(body.get()));
  node.bodies.push_back(body);
  const CUresult added =
      addNode(phGraphNode, hGraph, dependencies, numDependencies, std::move(node), body->context);
  if (added != CUDA_SUCCESS) return added;
  graphs().lend(body.get());
  lendBodies(*body);
  return CUDA_SUCCESS;
}

// A conditional node (cuGraphAddNode): its bodies are made empty here for the application to
// fill (CUDA's own array of them goes back in params.phGraph_out). The handle must be one made
// for this graph.
CUresult addConditionalNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                            const CUgraphNode* dependencies, size_t numDependencies,
                            CUDA_CONDITIONAL_NODE_PARAMS& params) {
  Graph* graph = graphOf(hGraph);
  if (graph == nullptr || phGraphNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<gpuproxy::stub::ConditionalHandle> condition;
  for (const auto& made : graph->conditions) {
    if (made->value == params.handle) condition = made;
  }
  if (!condition) return CUDA_ERROR_INVALID_VALUE;
  const int type = gpuproxy::stub::enumValue(params.type);
  const bool sized = (type == CU_GRAPH_COND_TYPE_IF && (params.size == 1 || params.size == 2)) ||
                     (type == CU_GRAPH_COND_TYPE_WHILE && params.size == 1) ||
                     (type == CU_GRAPH_COND_TYPE_SWITCH && params.size >= 1);
  if (!sized) return CUDA_ERROR_INVALID_VALUE;
  GraphNode node;
  node.kind = GraphNode::Kind::kConditional;
  node.condition = condition;
  node.conditionType = params.type;
  for (unsigned i = 0; i < params.size; ++i) {
    auto body = std::make_shared<Graph>();
    body->isBody = true;
    node.bodyHandles.push_back(reinterpret_cast<CUgraph>(body.get()));
    node.bodies.push_back(std::move(body));
  }
  // The node's vector does not move with the node: its array stays where it was handed out.
  CUgraph* bodies = node.bodyHandles.data();
  std::vector<std::shared_ptr<Graph>> made = node.bodies;
  const CUresult added = addNode(phGraphNode, hGraph, dependencies, numDependencies,
                                 std::move(node), contextOr(params.ctx));
  if (added != CUDA_SUCCESS) return added;
  for (const std::shared_ptr<Graph>& body : made) graphs().lend(body.get());
  params.phGraph_out = bodies;
  return CUDA_SUCCESS;
}

// cuGraphAddNode: the node types gpuproxy's graphs have, through their own entry points, and
// conditional nodes. Event and external semaphore nodes and batched memory operations are
// CUDA_ERROR_NOT_SUPPORTED, as their own entry points are.
CUresult addNodeByParams(const char* entryPoint, CUgraphNode* phGraphNode, CUgraph hGraph,
                         const CUgraphNode* dependencies, const CUgraphEdgeData* edgeData,
                         size_t numDependencies, CUgraphNodeParams* nodeParams) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (nodeParams == nullptr || !reservedAreZero(*nodeParams)) return CUDA_ERROR_INVALID_VALUE;
    if (!onlyDefaultEdges(edgeData, numDependencies)) return CUDA_ERROR_NOT_SUPPORTED;
    const int type = gpuproxy::stub::enumValue(nodeParams->type);
    switch (type) {
      case CU_GRAPH_NODE_TYPE_KERNEL: {
        const CUDA_KERNEL_NODE_PARAMS params = kernelParamsOf(nodeParams->kernel);
        return addKernelNode(entryPoint, phGraphNode, hGraph, dependencies, numDependencies,
                             &params);
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY: {
        const CUDA_MEMCPY_NODE_PARAMS& copy = nodeParams->memcpy;
        if (copy.flags != 0 || copy.reserved != 0) return CUDA_ERROR_INVALID_VALUE;
        return cuGraphAddMemcpyNode(phGraphNode, hGraph, dependencies, numDependencies,
                                    &copy.copyParams, copy.copyCtx);
      }
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        const CUDA_MEMSET_NODE_PARAMS_v2& set = nodeParams->memset;
        CUDA_MEMSET_NODE_PARAMS params{};
        params.dst = set.dst;
        params.pitch = set.pitch;
        params.value = set.value;
        params.elementSize = set.elementSize;
        params.width = set.width;
        params.height = set.height;
        return cuGraphAddMemsetNode(phGraphNode, hGraph, dependencies, numDependencies, &params,
                                    set.ctx);
      }
      case CU_GRAPH_NODE_TYPE_HOST: {
        const CUDA_HOST_NODE_PARAMS params{nodeParams->host.fn, nodeParams->host.userData};
        return cuGraphAddHostNode(phGraphNode, hGraph, dependencies, numDependencies, &params);
      }
      case CU_GRAPH_NODE_TYPE_EMPTY:
        return cuGraphAddEmptyNode(phGraphNode, hGraph, dependencies, numDependencies);
      case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
        // The same fields; the address the node allocates goes back into the caller's.
        const CUDA_MEM_ALLOC_NODE_PARAMS_v2& alloc = nodeParams->alloc;
        CUDA_MEM_ALLOC_NODE_PARAMS params{};
        params.poolProps = alloc.poolProps;
        params.accessDescs = alloc.accessDescs;
        params.accessDescCount = alloc.accessDescCount;
        params.bytesize = alloc.bytesize;
        const CUresult added =
            cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, &params);
        if (added == CUDA_SUCCESS) nodeParams->alloc.dptr = params.dptr;
        return added;
      }
      case CU_GRAPH_NODE_TYPE_MEM_FREE:
        return cuGraphAddMemFreeNode(phGraphNode, hGraph, dependencies, numDependencies,
                                     nodeParams->free.dptr);
      case CU_GRAPH_NODE_TYPE_CONDITIONAL:
        return addConditionalNode(phGraphNode, hGraph, dependencies, numDependencies,
                                  nodeParams->conditional);
      case CU_GRAPH_NODE_TYPE_GRAPH:
        if (nodeParams->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) {
          GPUPROXY_STUB_LOG(kWarn, "%s: a child graph moved into its parent is not supported",
                            entryPoint);
          return CUDA_ERROR_NOT_SUPPORTED;
        }
        return addChildGraphNode(phGraphNode, hGraph, dependencies, numDependencies,
                                 nodeParams->graph.graph);
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        return addEventNode(runtime, phGraphNode, hGraph, dependencies, numDependencies,
                            GraphNode::Kind::kEventRecord, nodeParams->eventRecord.event);
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
        return addEventNode(runtime, phGraphNode, hGraph, dependencies, numDependencies,
                            GraphNode::Kind::kEventWait, nodeParams->eventWait.event);
      default:
        GPUPROXY_STUB_LOG(kWarn, "%s: graph nodes of type %d are not supported", entryPoint, type);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  });
}

// cuGraphNodeSetParams and cuGraphExecNodeSetParams (`exec` non-null): a kernel node's new
// parameters, an event node's new event; the parameters of the other node types cannot be
// changed this way in gpuproxy's graphs (CUDA_ERROR_NOT_SUPPORTED). Parameters of another type
// than the node's are CUDA_ERROR_INVALID_VALUE.
CUresult setNodeParams(const char* entryPoint, NodeOwner owner, CUgraphNode hNode,
                       const CUgraphNodeParams* nodeParams) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (nodeParams == nullptr || !reservedAreZero(*nodeParams)) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    const int type = gpuproxy::stub::enumValue(nodeParams->type);
    if (type != static_cast<int>(typeOf(found->first->nodes[found->second]))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) {
      return setNodeEvent(runtime, owner, hNode, GraphNode::Kind::kEventRecord,
                          nodeParams->eventRecord.event);
    }
    if (type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) {
      return setNodeEvent(runtime, owner, hNode, GraphNode::Kind::kEventWait,
                          nodeParams->eventWait.event);
    }
    if (type != CU_GRAPH_NODE_TYPE_KERNEL) {
      GPUPROXY_STUB_LOG(kWarn, "%s: new parameters for a graph node of type %d are not supported",
                        entryPoint, type);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    const CUDA_KERNEL_NODE_PARAMS params = kernelParamsOf(nodeParams->kernel);
    return setKernelParams(entryPoint, owner, hNode, &params);
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                        const CUgraphNode* dependencies, size_t numDependencies,
                                        CUgraphNodeParams* nodeParams) {
  return addNodeByParams(__func__, phGraphNode, hGraph, dependencies, nullptr, numDependencies,
                         nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                           const CUgraphNode* dependencies,
                                           const CUgraphEdgeData* dependencyData,
                                           size_t numDependencies, CUgraphNodeParams* nodeParams) {
  return addNodeByParams(__func__, phGraphNode, hGraph, dependencies, dependencyData,
                         numDependencies, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams* nodeParams) {
  return setNodeParams(__func__, kInItsGraph, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                  CUgraphNodeParams* nodeParams) {
  return setNodeParams(__func__, hGraphExec, hNode, nodeParams);
}

// A conditional node's value: 32 bits of device memory in `ctx` (or the current context), set to
// `defaultLaunchValue` now and, with CU_GRAPH_COND_ASSIGN_DEFAULT, at each run of `hGraph`.
// Kernels set it with cudaGraphSetConditional, which the sim runs as a store to this address.
// A GPU's driver keeps these values itself and links its own cudaGraphSetConditional into the
// kernels it loads, so on the cuda backend the call is refused.
GPUPROXY_EXPORT CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle* pHandle_out,
                                                        CUgraph hGraph, CUcontext ctx,
                                                        unsigned int defaultLaunchValue,
                                                        unsigned int flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    Graph* graph = graphOf(hGraph);
    if (pHandle_out == nullptr || graph == nullptr ||
        (flags & ~CU_GRAPH_COND_ASSIGN_DEFAULT) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (runtime.backend() != "sim") {
      GPUPROXY_STUB_LOG(kWarn,
                        "cuGraphConditionalHandleCreate: conditional graph nodes are supported on "
                        "the sim backend only");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUcontext context = ctx;
    if (context == nullptr) {
      const std::uint64_t current = gpuproxy::stub::currentContext();
      if (current == 0) return CUDA_ERROR_INVALID_CONTEXT;
      context = gpuproxy::stub::toHandle<CUcontext>(current);
    }
    auto condition = std::make_shared<gpuproxy::stub::ConditionalHandle>();
    condition->defaultValue = defaultLaunchValue;
    condition->assignDefault = (flags & CU_GRAPH_COND_ASSIGN_DEFAULT) != 0;
    if (CUresult pushed = cuCtxPushCurrent_v2(context); pushed != CUDA_SUCCESS) return pushed;
    CUresult made = cuMemAlloc_v2(&condition->value, sizeof(std::uint32_t));
    // Set before any stream of the context reads it, a non-blocking one included, and past any
    // capture under way (the handle may be made for a graph a capture is building).
    if (made == CUDA_SUCCESS) {
      const StreamTarget legacy{gpuproxy::stub::handleValue(context), 0};
      made = runtime.capturing().uncaptured().copyHostToDevice(
          legacy, condition->value, &defaultLaunchValue, sizeof(std::uint32_t), true);
    }
    CUcontext popped = nullptr;
    cuCtxPopCurrent_v2(&popped);
    if (made != CUDA_SUCCESS) return made;
    *pHandle_out = condition->value;
    graph->conditions.push_back(std::move(condition));
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                     const CUgraphNode* dependencies,
                                                     const CUgraphEdgeData* dependencyData,
                                                     size_t numDependencies,
                                                     CUstreamCaptureMode mode) {
  return beginCaptureToGraph(__func__, hStream, hGraph, dependencies, dependencyData,
                             numDependencies, mode, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                          const CUgraphNode* dependencies,
                                                          const CUgraphEdgeData* dependencyData,
                                                          size_t numDependencies,
                                                          CUstreamCaptureMode mode) {
  return beginCaptureToGraph(__func__, hStream, hGraph, dependencies, dependencyData,
                             numDependencies, mode, NullStream::kPerThread);
}

// ---- child graphs, node queries, edges -------------------------------------------------------

GPUPROXY_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                  const CUgraphNode* dependencies,
                                                  size_t numDependencies, CUgraph childGraph) {
  return guarded(__func__, [&](Runtime&) {
    return addChildGraphNode(phGraphNode, hGraph, dependencies, numDependencies, childGraph);
  });
}

// The node's own copy of its child graph: a graph handle while the node lasts, not to be
// destroyed on its own.
GPUPROXY_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph* phGraph) {
  return guarded(__func__, [&](Runtime&) {
    if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    const GraphNode& node = found->first->nodes[found->second];
    if (node.kind != GraphNode::Kind::kChildGraph) return CUDA_ERROR_INVALID_VALUE;
    *phGraph = node.bodyHandles.front();
    return CUDA_SUCCESS;
  });
}

namespace {

// Every edge gpuproxy's graphs have is a default one: an array of them, one per edge.
void defaultEdges(CUgraphEdgeData* edgeData, size_t count) {
  if (edgeData != nullptr) std::fill(edgeData, edgeData + count, CUgraphEdgeData{});
}

// cuGraphNodeGetDependencies (`dependents` false) and cuGraphNodeGetDependentNodes (true).
CUresult nodeNeighbours(const char* entryPoint, CUgraphNode hNode, bool dependents,
                        CUgraphNode* nodes, CUgraphEdgeData* edgeData, size_t* count) {
  return guarded(entryPoint, [&](Runtime&) {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    const Graph& graph = *found->first;
    std::vector<CUgraphNode> list;
    if (!dependents) {
      for (std::size_t index : graph.nodes[found->second].dependencies) {
        list.push_back(handleOf(graph.nodes[index]));
      }
    } else {
      for (const GraphNode& node : graph.nodes) {
        const std::vector<std::size_t>& waits = node.dependencies;
        if (std::find(waits.begin(), waits.end(), found->second) != waits.end()) {
          list.push_back(handleOf(node));
        }
      }
    }
    const CUresult answered = answerList(list, nodes, *count);
    defaultEdges(nodes != nullptr ? edgeData : nullptr, *count);
    return answered;
  });
}

// cuGraphGetEdges: every dependency of the graph, as (from, to) pairs in the order the nodes
// were added.
CUresult graphEdges(const char* entryPoint, CUgraph hGraph, CUgraphNode* from, CUgraphNode* to,
                    CUgraphEdgeData* edgeData, size_t* count) {
  return guarded(entryPoint, [&](Runtime&) {
    if (count == nullptr || (from == nullptr) != (to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    const Graph* graph = graphOf(hGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<CUgraphNode> sources;
    std::vector<CUgraphNode> targets;
    for (const GraphNode& node : graph->nodes) {
      for (std::size_t index : node.dependencies) {
        sources.push_back(handleOf(graph->nodes[index]));
        targets.push_back(handleOf(node));
      }
    }
    size_t room = *count;
    answerList(targets, to, room);
    answerList(sources, from, *count);
    defaultEdges(from != nullptr ? edgeData : nullptr, *count);
    return CUDA_SUCCESS;
  });
}

// A host node of a graph (`exec` null) or of an executable graph.
GraphNode* hostNode(NodeOwner owner, CUgraphNode hNode) {
  std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(owner, hNode);
  return found && found->first->kind == GraphNode::Kind::kHost ? found->first : nullptr;
}

CUresult setHostNodeParams(const char* entryPoint, NodeOwner owner, CUgraphNode hNode,
                           const CUDA_HOST_NODE_PARAMS* params) {
  return guarded(entryPoint, [&](Runtime&) {
    if (params == nullptr || params->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GraphNode* node = hostNode(owner, hNode);
    if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
    node->function = params->fn;
    node->userData = params->userData;
    return CUDA_SUCCESS;
  });
}

const char* dotName(const GraphNode& node) {
  switch (node.kind) {
    case GraphNode::Kind::kKernel:
      return "kernel";
    case GraphNode::Kind::kMemcpy:
      return "memcpy";
    case GraphNode::Kind::kMemset:
      return "memset";
    case GraphNode::Kind::kHost:
      return "host";
    case GraphNode::Kind::kEmpty:
      return "empty";
    case GraphNode::Kind::kMemAlloc:
      return "mem_alloc";
    case GraphNode::Kind::kMemFree:
      return "mem_free";
    case GraphNode::Kind::kConditional:
      return "conditional";
    case GraphNode::Kind::kChildGraph:
      return "graph";
    case GraphNode::Kind::kEventRecord:
      return "event_record";
    case GraphNode::Kind::kEventWait:
      return "wait_event";
  }
  return "node";
}

// One graph in DOT: its nodes (named by where they are: "g0_3" is node 3 of the top graph), its
// edges, and each nested graph as a cluster after the node that holds it.
void writeDot(std::FILE* file, const Graph& graph, const std::string& prefix, unsigned& clusters) {
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const GraphNode& node = graph.nodes[i];
    if (node.removed) continue;
    std::fprintf(file, "  %s_%zu [label=\"%zu: %s\"];\n", prefix.c_str(), i, i, dotName(node));
    for (std::size_t index : node.dependencies) {
      std::fprintf(file, "  %s_%zu -> %s_%zu;\n", prefix.c_str(), index, prefix.c_str(), i);
    }
    for (std::size_t b = 0; b < node.bodies.size(); ++b) {
      const std::string inner = prefix + "_" + std::to_string(i) + "b" + std::to_string(b);
      std::fprintf(file, "  subgraph cluster_%u {\n  label=\"%s_%zu body %zu\";\n", clusters++,
                   prefix.c_str(), i, b);
      writeDot(file, *node.bodies[b], inner, clusters);
      std::fprintf(file, "  }\n");
    }
  }
}

}  // namespace

GPUPROXY_EXPORT CUresult cuGraphNodeGetDependencies(CUgraphNode hNode, CUgraphNode* dependencies,
                                                    size_t* numDependencies) {
  return nodeNeighbours(__func__, hNode, false, dependencies, nullptr, numDependencies);
}

GPUPROXY_EXPORT CUresult cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode* dependencies,
                                                       CUgraphEdgeData* edgeData,
                                                       size_t* numDependencies) {
  return nodeNeighbours(__func__, hNode, false, dependencies, edgeData, numDependencies);
}

GPUPROXY_EXPORT CUresult cuGraphNodeGetDependentNodes(CUgraphNode hNode,
                                                      CUgraphNode* dependentNodes,
                                                      size_t* numDependentNodes) {
  return nodeNeighbours(__func__, hNode, true, dependentNodes, nullptr, numDependentNodes);
}

GPUPROXY_EXPORT CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode hNode,
                                                         CUgraphNode* dependentNodes,
                                                         CUgraphEdgeData* edgeData,
                                                         size_t* numDependentNodes) {
  return nodeNeighbours(__func__, hNode, true, dependentNodes, edgeData, numDependentNodes);
}

GPUPROXY_EXPORT CUresult cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode* rootNodes,
                                             size_t* numRootNodes) {
  return guarded(__func__, [&](Runtime&) {
    if (numRootNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Graph* graph = graphOf(hGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<CUgraphNode> roots;
    for (const GraphNode& node : graph->nodes) {
      if (!node.removed && node.dependencies.empty()) roots.push_back(handleOf(node));
    }
    return answerList(roots, rootNodes, *numRootNodes);
  });
}

GPUPROXY_EXPORT CUresult cuGraphGetEdges(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to,
                                         size_t* numEdges) {
  return graphEdges(__func__, hGraph, from, to, nullptr, numEdges);
}

GPUPROXY_EXPORT CUresult cuGraphGetEdges_v2(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to,
                                            CUgraphEdgeData* edgeData, size_t* numEdges) {
  return graphEdges(__func__, hGraph, from, to, edgeData, numEdges);
}

GPUPROXY_EXPORT CUresult cuGraphRemoveDependencies(CUgraph hGraph, const CUgraphNode* from,
                                                   const CUgraphNode* to, size_t numDependencies) {
  return changeDependencies(__func__, hGraph, from, to, nullptr, numDependencies, false);
}

GPUPROXY_EXPORT CUresult cuGraphRemoveDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                                      const CUgraphNode* to,
                                                      const CUgraphEdgeData* edgeData,
                                                      size_t numDependencies) {
  return changeDependencies(__func__, hGraph, from, to, edgeData, numDependencies, false);
}

GPUPROXY_EXPORT CUresult cuGraphHostNodeGetParams(CUgraphNode hNode,
                                                  CUDA_HOST_NODE_PARAMS* nodeParams) {
  return guarded(__func__, [&](Runtime&) {
    if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const GraphNode* node = hostNode(kInItsGraph, hNode);
    if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *nodeParams = CUDA_HOST_NODE_PARAMS{node->function, node->userData};
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphHostNodeSetParams(CUgraphNode hNode,
                                                  const CUDA_HOST_NODE_PARAMS* nodeParams) {
  return setHostNodeParams(__func__, kInItsGraph, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphExecHostNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                      const CUDA_HOST_NODE_PARAMS* nodeParams) {
  return setHostNodeParams(__func__, hGraphExec, hNode, nodeParams);
}

// The graph in Graphviz's DOT language: each node's index and type, its dependencies, and the
// graphs its conditional and child graph nodes hold. `flags` choose extra detail CUDA's printer
// adds; this one prints the same outline whatever they say.
GPUPROXY_EXPORT CUresult cuGraphDebugDotPrint(CUgraph hGraph, const char* path,
                                              unsigned int /*flags*/) {
  return guarded(__func__, [&](Runtime&) {
    const Graph* graph = graphOf(hGraph);
    if (graph == nullptr || path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::FILE* file = std::fopen(path, "w");
    if (file == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
    std::fprintf(file, "digraph gpuproxy_graph {\n");
    unsigned clusters = 0;
    writeDot(file, *graph, "g0", clusters);
    std::fprintf(file, "}\n");
    return std::fclose(file) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
  });
}

// ---- node parameters read back and replaced; nodes of an executable graph switched off -------

namespace {

// The arguments cuGraphAddMemsetNode accepts.
bool memsetParamsValid(const CUDA_MEMSET_NODE_PARAMS& memset) {
  const unsigned element = memset.elementSize;
  return (element == 1 || element == 2 || element == 4) && memset.width != 0 &&
         memset.height != 0 && (memset.height == 1 || memset.pitch >= memset.width * element);
}

// Replaces a memset or copy node's operation, whatever form it had, with the one `params` says.
void replaceMemset(GraphNode& node, const CUDA_MEMSET_NODE_PARAMS& params) {
  node.command.reset();
  node.memset = params;
}

void replaceCopy(GraphNode& node, const CUDA_MEMCPY3D& params) {
  node.command.reset();
  node.host = nullptr;
  node.device = 0;
  node.bytes = 0;
  node.pageable = false;
  node.copy = params;
}

// cuGraph[Exec]MemsetNodeSetParams. In an executable graph both the old and the new memset must
// be one row, and the memory must be the same context's, as CUDA requires.
CUresult setMemsetParams(const char* entryPoint, NodeOwner owner, CUgraphNode hNode,
                         const CUDA_MEMSET_NODE_PARAMS* params) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (params == nullptr || !memsetParamsValid(*params)) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(owner, hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    GraphNode& node = *found->first;
    std::optional<CUDA_MEMSET_NODE_PARAMS> now = memsetParamsOf(node);
    if (!now) return CUDA_ERROR_INVALID_VALUE;
    if (owner) {
      std::optional<gpuproxy::stub::AllocationRange> before =
          runtime.allocationContaining(now->dst);
      std::optional<gpuproxy::stub::AllocationRange> after =
          runtime.allocationContaining(params->dst);
      if (now->height != 1 || params->height != 1 || !after ||
          (before && before->context != after->context)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    replaceMemset(node, *params);
    return CUDA_SUCCESS;
  });
}

// The kind of memory one side of a copy is: a unified address is device memory when it lies in
// one of this process's device allocations, else host memory.
int memoryKind(Runtime& runtime, CUmemorytype type, CUdeviceptr unifiedAddress) {
  const int kind = gpuproxy::stub::enumValue(type);
  if (kind != CU_MEMORYTYPE_UNIFIED) return kind;
  return runtime.ownsRange(unifiedAddress, 1) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
}

// cuGraph[Exec]MemcpyNodeSetParams: checked as the copy is when the graph runs. In an executable
// graph neither side may change its kind of memory, as CUDA requires.
CUresult setCopyParams(const char* entryPoint, NodeOwner owner, CUgraphNode hNode,
                       const CUDA_MEMCPY3D* params) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(owner, hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    GraphNode& node = *found->first;
    std::optional<CUDA_MEMCPY3D> now = copyParamsOf(node);
    if (!now) return CUDA_ERROR_INVALID_VALUE;
    const bool sameKinds = memoryKind(runtime, now->srcMemoryType, now->srcDevice) ==
                               memoryKind(runtime, params->srcMemoryType, params->srcDevice) &&
                           memoryKind(runtime, now->dstMemoryType, now->dstDevice) ==
                               memoryKind(runtime, params->dstMemoryType, params->dstDevice);
    if (owner && !sameKinds) return CUDA_ERROR_INVALID_VALUE;
    replaceCopy(node, *params);
    return CUDA_SUCCESS;
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode hNode,
                                                    CUDA_MEMSET_NODE_PARAMS* nodeParams) {
  return guarded(__func__, [&](Runtime&) {
    if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(kInItsGraph, hNode);
    std::optional<CUDA_MEMSET_NODE_PARAMS> params =
        found ? memsetParamsOf(*found->first) : std::nullopt;
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    *nodeParams = *params;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphMemcpyNodeGetParams(CUgraphNode hNode, CUDA_MEMCPY3D* nodeParams) {
  return guarded(__func__, [&](Runtime&) {
    if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(kInItsGraph, hNode);
    std::optional<CUDA_MEMCPY3D> params = found ? copyParamsOf(*found->first) : std::nullopt;
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    *nodeParams = *params;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphMemsetNodeSetParams(CUgraphNode hNode,
                                                    const CUDA_MEMSET_NODE_PARAMS* nodeParams) {
  return setMemsetParams(__func__, kInItsGraph, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphMemcpyNodeSetParams(CUgraphNode hNode,
                                                    const CUDA_MEMCPY3D* nodeParams) {
  return setCopyParams(__func__, kInItsGraph, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                        const CUDA_MEMSET_NODE_PARAMS* memsetParams,
                                                        CUcontext /*ctx*/) {
  return setMemsetParams(__func__, hGraphExec, hNode, memsetParams);
}

GPUPROXY_EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                        const CUDA_MEMCPY3D* copyParams,
                                                        CUcontext /*ctx*/) {
  return setCopyParams(__func__, hGraphExec, hNode, copyParams);
}

// A kernel node's launch: its function (the one it runs in its context), its shape, and a pointer
// per parameter into the node's own copy of the arguments (valid while the node is unchanged).
GPUPROXY_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                                       CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(kInItsGraph, hNode);
    if (!found || found->first->kind != GraphNode::Kind::kKernel || !found->first->command) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    GraphNode& node = *found->first;
    const auto* launch = std::get_if<ring::LaunchKernel>(&*node.command);
    if (launch == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<const gpuproxy::stub::KernelRecord> kernel = runtime.function(launch->function);
    if (!kernel) return CUDA_ERROR_INVALID_HANDLE;  // its module was unloaded
    node.parameterPointers.clear();
    for (const gpuproxy::stub::ParameterSlot& slot : kernel->parameters) {
      if (std::uint64_t{slot.offset} + slot.size > node.parameters.size()) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      node.parameterPointers.push_back(node.parameters.data() + slot.offset);
    }
    CUDA_KERNEL_NODE_PARAMS params{};
    // The function, and for a function of a CUkernel (every <<<>>> of the CUDA runtime) that
    // kernel and the context: what the runtime knows its kernels by.
    params.func = gpuproxy::stub::toHandle<CUfunction>(launch->function);
    if (std::optional<std::uint64_t> kernelHandle =
            gpuproxy::stub::libraryKernelOf(launch->function)) {
      params.kern = gpuproxy::stub::toHandle<CUkernel>(*kernelHandle);
      params.ctx = gpuproxy::stub::toHandle<CUcontext>(kernel->context);
    }
    params.gridDimX = launch->grid.x;
    params.gridDimY = launch->grid.y;
    params.gridDimZ = launch->grid.z;
    params.blockDimX = launch->block.x;
    params.blockDimY = launch->block.y;
    params.blockDimZ = launch->block.z;
    params.sharedMemBytes = launch->sharedMemBytes;
    params.kernelParams = node.parameterPointers.empty() ? nullptr : node.parameterPointers.data();
    *nodeParams = params;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode,
                                                    CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  if (nodeParams == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  CUDA_KERNEL_NODE_PARAMS params{};
  const CUresult found = cuGraphKernelNodeGetParams_v2(hNode, &params);
  if (found != CUDA_SUCCESS) return found;
  *nodeParams = CUDA_KERNEL_NODE_PARAMS_v1{
      params.func,         params.gridDimX,  params.gridDimY,  params.gridDimZ,
      params.blockDimX,    params.blockDimY, params.blockDimZ, params.sharedMemBytes,
      params.kernelParams, params.extra};
  return CUDA_SUCCESS;
}

namespace {

// A kernel node of its graph: the node, its launch and its graph's context.
struct KernelNode {
  GraphNode* node = nullptr;
  ring::LaunchKernel* launch = nullptr;
  std::uint64_t context = 0;
};

// Nullopt for any node but a kernel node of a graph.
std::optional<KernelNode> kernelNodeOf(CUgraphNode hNode) {
  std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(kInItsGraph, hNode);
  if (!found || found->first->kind != GraphNode::Kind::kKernel || !found->first->command) {
    return std::nullopt;
  }
  auto* launch = std::get_if<ring::LaunchKernel>(&*found->first->command);
  if (launch == nullptr) return std::nullopt;
  return KernelNode{found->first, launch, found->second};
}

// Whether a kernel node may have attribute `id` at all: not those of streams or of single
// launches only.
bool isKernelNodeAttribute(int id) {
  return gpuproxy::stub::isKernelLaunchHint(id) || id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE ||
         id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION ||
         id == CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE;
}

}  // namespace

// Kernel node attributes. The hints (cache access policy, priority, scheduling and carveout
// preferences, memory synchronisation domains) change nothing a kernel can observe, as for
// cuLaunchKernelEx: they are kept to be read back. A cooperative node launches as
// cuLaunchCooperativeKernel does. A cluster of more than one block, and a node the device may
// update, are CUDA_ERROR_NOT_SUPPORTED; attributes of streams or of single launches only are
// CUDA_ERROR_INVALID_VALUE.
GPUPROXY_EXPORT CUresult cuGraphKernelNodeSetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                                       const CUkernelNodeAttrValue* value) {
  return guarded(__func__, [&](Runtime&) {
    std::optional<KernelNode> kernel = kernelNodeOf(hNode);
    if (!kernel || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int id = gpuproxy::stub::enumValue(attr);
    if (!isKernelNodeAttribute(id)) return CUDA_ERROR_INVALID_VALUE;
    if (id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
      kernel->launch->cooperative = value->cooperative != 0;
      return CUDA_SUCCESS;
    }
    bool honoured = true;
    if (id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      honoured = value->clusterDim.x <= 1 && value->clusterDim.y <= 1 && value->clusterDim.z <= 1;
    } else if (id == CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE) {
      honoured = value->deviceUpdatableKernelNode.deviceUpdatable == 0;
    }
    if (!honoured) {
      GPUPROXY_STUB_LOG(kWarn,
                        "cuGraphKernelNodeSetAttribute: attribute %d (with this value) is not "
                        "supported",
                        id);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    kernel->node->attributes[id] = *value;
    return CUDA_SUCCESS;
  });
}

// What was set, or the default (all zeros) for an attribute never set.
GPUPROXY_EXPORT CUresult cuGraphKernelNodeGetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
                                                       CUkernelNodeAttrValue* value_out) {
  return guarded(__func__, [&](Runtime&) {
    std::optional<KernelNode> kernel = kernelNodeOf(hNode);
    if (!kernel || value_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int id = gpuproxy::stub::enumValue(attr);
    if (!isKernelNodeAttribute(id)) return CUDA_ERROR_INVALID_VALUE;
    CUkernelNodeAttrValue answer{};
    if (id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
      answer.cooperative = kernel->launch->cooperative ? 1 : 0;
    } else if (auto set = kernel->node->attributes.find(id);
               set != kernel->node->attributes.end()) {
      answer = set->second;
    }
    *value_out = answer;
    return CUDA_SUCCESS;
  });
}

// Both kernel nodes of the same context.
GPUPROXY_EXPORT CUresult cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  return guarded(__func__, [&](Runtime&) {
    std::optional<KernelNode> to = kernelNodeOf(dst);
    std::optional<KernelNode> from = kernelNodeOf(src);
    if (!to || !from || to->context != from->context) return CUDA_ERROR_INVALID_VALUE;
    to->node->attributes = from->node->attributes;
    to->launch->cooperative = from->launch->cooperative;
    return CUDA_SUCCESS;
  });
}

namespace {

// The node of an executable graph cuGraphNodeSetEnabled may switch: a kernel, copy or memset.
GraphNode* switchableNode(CUgraphExec exec, CUgraphNode hNode) {
  std::optional<std::pair<GraphNode*, std::uint64_t>> found = nodeIn(exec, hNode);
  if (!found) return nullptr;
  const GraphNode::Kind kind = found->first->kind;
  const bool switchable = kind == GraphNode::Kind::kKernel || kind == GraphNode::Kind::kMemcpy ||
                          kind == GraphNode::Kind::kMemset;
  return switchable ? found->first : nullptr;
}

}  // namespace

// cuGraphNodeSetEnabled/GetEnabled: a kernel, copy or memset node of an executable graph runs,
// or runs as an empty node, from its next launch on.
GPUPROXY_EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec hGraphExec, CUgraphNode hNode,
                                               unsigned int isEnabled) {
  return guarded(__func__, [&](Runtime&) {
    GraphNode* node = switchableNode(hGraphExec, hNode);
    if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
    node->enabled = isEnabled != 0;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphNodeGetEnabled(CUgraphExec hGraphExec, CUgraphNode hNode,
                                               unsigned int* isEnabled) {
  return guarded(__func__, [&](Runtime&) {
    const GraphNode* node = switchableNode(hGraphExec, hNode);
    if (node == nullptr || isEnabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *isEnabled = node->enabled ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

// ---- user objects ----------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy,
                                            unsigned int initialRefcount, unsigned int flags) {
  return guarded(__func__, [&](Runtime&) {
    if (object_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    gpuproxy::stub::UserObject* made = nullptr;
    const CUresult created =
        gpuproxy::stub::createUserObject(ptr, destroy, initialRefcount, flags, made);
    if (created == CUDA_SUCCESS) *object_out = reinterpret_cast<CUuserObject>(made);
    return created;
  });
}

GPUPROXY_EXPORT CUresult cuUserObjectRetain(CUuserObject object, unsigned int count) {
  return guarded(__func__, [&](Runtime&) {
    gpuproxy::stub::UserObject* found = gpuproxy::stub::findUserObject(object);
    return found != nullptr && gpuproxy::stub::retainUserObject(*found, count)
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_VALUE;
  });
}

GPUPROXY_EXPORT CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  return guarded(__func__, [&](Runtime&) {
    gpuproxy::stub::UserObject* found = gpuproxy::stub::findUserObject(object);
    return found != nullptr && gpuproxy::stub::releaseUserObject(*found, count)
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_VALUE;
  });
}

GPUPROXY_EXPORT CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object,
                                                 unsigned int count, unsigned int flags) {
  return guarded(__func__, [&](Runtime&) {
    Graph* owner = graphOf(graph);
    gpuproxy::stub::UserObject* found = gpuproxy::stub::findUserObject(object);
    if (owner == nullptr || found == nullptr || (flags & ~CU_GRAPH_USER_OBJECT_MOVE) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return owner->userObjects.add(*found, count, (flags & CU_GRAPH_USER_OBJECT_MOVE) != 0)
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_VALUE;
  });
}

GPUPROXY_EXPORT CUresult cuGraphReleaseUserObject(CUgraph graph, CUuserObject object,
                                                  unsigned int count) {
  return guarded(__func__, [&](Runtime&) {
    Graph* owner = graphOf(graph);
    gpuproxy::stub::UserObject* found = gpuproxy::stub::findUserObject(object);
    if (owner == nullptr || found == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return owner->userObjects.remove(*found, count) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}
