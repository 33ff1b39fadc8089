// CUDA graphs: made by stream capture (cuStreamBeginCapture/EndCapture, and the capture queries)
// or node by node (cuGraphAdd{Kernel,Memcpy,Memset,Host,Empty}Node, cuGraphAddDependencies);
// instantiated, launched, updated (cuGraphExecUpdate, cuGraph[Exec]KernelNodeSetParams) and
// destroyed. How capture works, and what a launch does, is stream_capture.hpp's: everything is
// kept in the stub, and gpuproxyd sees only the operations a launch sends. Child graphs,
// conditional, event, memory and external-semaphore nodes, edge data other than the default, and
// device-side launches are not supported: their entry points stay CUDA_ERROR_NOT_SUPPORTED.

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "client/stub/api/modules.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"
#include "client/stub/log.hpp"
#include "client/stub/stream_capture.hpp"

using gpuproxy::stub::CapturingSink;
using gpuproxy::stub::Graph;
using gpuproxy::stub::GraphNode;
using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamCaptures;
using gpuproxy::stub::StreamTarget;

namespace {

// An executable graph: its own copy of the graph's nodes, as CUDA's is (destroying or changing
// the graph afterwards leaves it alone), and the order a launch sends them in.
struct GraphExec {
  Graph graph;
  std::vector<std::size_t> order;
  // The nodes of the graph it was made from (or last updated from), to their copies here: what
  // cuGraphExecKernelNodeSetParams names.
  std::map<const GraphNode*, std::size_t> fromGraph;
};

// Every graph and executable graph handed out, so that a handle that is not one (or no longer
// one) is refused instead of followed. Leaked on purpose, as the stub's other tables. The graphs
// themselves are the application's to serialise, as CUDA's are.
struct GraphTables {
  std::mutex mutex;
  std::set<Graph*> graphs;
  std::set<GraphExec*> execs;
};

GraphTables& tables() {
  static auto* tables = new GraphTables;
  return *tables;
}

CUgraph adopt(std::unique_ptr<Graph> graph) {
  GraphTables& all = tables();
  std::lock_guard lock(all.mutex);
  all.graphs.insert(graph.get());
  return reinterpret_cast<CUgraph>(graph.release());
}

// Null unless `handle` is a live graph.
Graph* graphOf(CUgraph handle) {
  auto* graph = reinterpret_cast<Graph*>(handle);
  GraphTables& all = tables();
  std::lock_guard lock(all.mutex);
  return all.graphs.count(graph) != 0 ? graph : nullptr;
}

GraphExec* execOf(CUgraphExec handle) {
  auto* exec = reinterpret_cast<GraphExec*>(handle);
  GraphTables& all = tables();
  std::lock_guard lock(all.mutex);
  return all.execs.count(exec) != 0 ? exec : nullptr;
}

CUgraphNode handleOf(const GraphNode& node) {
  return reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(&node));
}

// The index of `node` in `graph`; nullopt when it is not one of its nodes.
std::optional<std::size_t> indexIn(const Graph& graph, CUgraphNode node) {
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    if (handleOf(graph.nodes[i]) == node) return i;
  }
  return std::nullopt;
}

// The graph `node` belongs to, and its index there.
std::optional<std::pair<Graph*, std::size_t>> locate(CUgraphNode node) {
  if (node == nullptr) return std::nullopt;
  GraphTables& all = tables();
  std::lock_guard lock(all.mutex);
  for (Graph* graph : all.graphs) {
    if (std::optional<std::size_t> index = indexIn(*graph, node)) {
      return std::make_pair(graph, *index);
    }
  }
  return std::nullopt;
}

void rememberOrigins(GraphExec& exec, const Graph& graph) {
  exec.fromGraph.clear();
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) exec.fromGraph[&graph.nodes[i]] = i;
}

CUresult beginCapture(const char* entryPoint, CUstream hStream, CUstreamCaptureMode mode,
                      NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    return runtime.capturing().captures().begin(target, mode);
  });
}

CUresult endCapture(const char* entryPoint, CUstream hStream, CUgraph* phGraph,
                    NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    std::unique_ptr<Graph> graph;
    const CUresult ended = runtime.capturing().captures().end(target.stream, graph);
    *phGraph = ended == CUDA_SUCCESS ? adopt(std::move(graph)) : nullptr;
    return ended;
  });
}

// cuStreamIsCapturing and every cuStreamGetCaptureInfo. For a stream that is not capturing the
// driver returns the status alone, leaving the other outputs as they were. For one that is: its
// capture's id; the graph being built is not handed out (it becomes a graph at the end), nor are
// the nodes the next operation would depend on (none are listed).
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
    const StreamCaptures::Status capture = runtime.capturing().captures().statusOf(target.stream);
    *status = capture.status;
    if (capture.status == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_SUCCESS;
    if (id != nullptr) *id = capture.id;
    if (graph != nullptr) *graph = nullptr;
    if (dependencies != nullptr) *dependencies = nullptr;
    if (numDependencies != nullptr) *numDependencies = 0;
    return CUDA_SUCCESS;
  });
}

// cuStreamGetCaptureInfo_v3: as captureInfo, and no edge data (none is listed with no dependency).
CUresult captureInfoWithEdges(const char* entryPoint, CUstream hStream, NullStream nullStream,
                              CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                              const CUgraphNode** dependencies, const CUgraphEdgeData** edgeData,
                              size_t* numDependencies) {
  if (edgeData != nullptr && dependencies == nullptr) {
    return guarded(entryPoint, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  if (edgeData != nullptr) *edgeData = nullptr;
  return captureInfo(entryPoint, hStream, nullStream, status, id, graph, dependencies,
                     numDependencies);
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
    auto exec = std::make_unique<GraphExec>(GraphExec{*graph, std::move(*order), {}});
    rememberOrigins(*exec, *graph);
    GraphTables& all = tables();
    std::lock_guard lock(all.mutex);
    all.execs.insert(exec.get());
    *phGraphExec = reinterpret_cast<CUgraphExec>(exec.release());
    return CUDA_SUCCESS;
  });
}

CUresult launchGraph(const char* entryPoint, CUgraphExec hGraphExec, CUstream hStream,
                     NullStream nullStream, bool upload) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const GraphExec* exec = execOf(hGraphExec);
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
    return runtime.capturing().launch(exec->graph, exec->order, target);
  });
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
    *phGraphClone = adopt(std::make_unique<Graph>(*graph));
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  return guarded(__func__, [&](Runtime&) {
    auto* graph = reinterpret_cast<Graph*>(hGraph);
    GraphTables& all = tables();
    {
      std::lock_guard lock(all.mutex);
      if (all.graphs.erase(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
    }
    delete graph;
    return CUDA_SUCCESS;
  });
}

// The nodes of a graph, in the order they were captured (each depends on the one before).
GPUPROXY_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  return guarded(__func__, [&](Runtime&) {
    if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Graph* graph = graphOf(hGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (nodes == nullptr) {
      *numNodes = graph->nodes.size();
      return CUDA_SUCCESS;
    }
    const std::size_t given = std::min(*numNodes, graph->nodes.size());
    for (std::size_t i = 0; i < given; ++i) {
      nodes[i] = handleOf(graph->nodes[i]);
    }
    for (std::size_t i = given; i < *numNodes; ++i) nodes[i] = nullptr;
    *numNodes = given;
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

GPUPROXY_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  return guarded(__func__, [&](Runtime&) {
    auto* exec = reinterpret_cast<GraphExec*>(hGraphExec);
    GraphTables& all = tables();
    {
      std::lock_guard lock(all.mutex);
      if (all.execs.erase(exec) == 0) return CUDA_ERROR_INVALID_VALUE;
    }
    delete exec;
    return CUDA_SUCCESS;
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
  // Under the tables' lock: locate() walks every graph's nodes, so no graph grows meanwhile.
  GraphTables& all = tables();
  std::lock_guard lock(all.mutex);
  auto* graph = reinterpret_cast<Graph*>(hGraph);
  if (all.graphs.count(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
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
  namespace ring = gpuproxy::protocol::ring;
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

CUDA_KERNEL_NODE_PARAMS fromV1(const CUDA_KERNEL_NODE_PARAMS_v1& v1) {
  CUDA_KERNEL_NODE_PARAMS params{};
  params.func = v1.func;
  params.gridDimX = v1.gridDimX;
  params.gridDimY = v1.gridDimY;
  params.gridDimZ = v1.gridDimZ;
  params.blockDimX = v1.blockDimX;
  params.blockDimY = v1.blockDimY;
  params.blockDimZ = v1.blockDimZ;
  params.sharedMemBytes = v1.sharedMemBytes;
  params.kernelParams = v1.kernelParams;
  params.extra = v1.extra;
  return params;
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
  node.command = std::move(replacement.command);
  node.parameters = std::move(replacement.parameters);
  return CUDA_SUCCESS;
}

CUresult setKernelParams(const char* entryPoint, CUgraphNode hNode,
                         const CUDA_KERNEL_NODE_PARAMS* params) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<std::pair<Graph*, std::size_t>> found = locate(hNode);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    Graph& graph = *found->first;
    return replaceKernel(runtime, graph.nodes[found->second], *params, graph.context);
  });
}

CUresult setExecKernelParams(const char* entryPoint, CUgraphExec hGraphExec, CUgraphNode hNode,
                             const CUDA_KERNEL_NODE_PARAMS* params) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GraphExec* exec = execOf(hGraphExec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto found = exec->fromGraph.find(reinterpret_cast<const GraphNode*>(hNode));
    if (found == exec->fromGraph.end()) return CUDA_ERROR_INVALID_VALUE;
    return replaceKernel(runtime, exec->graph.nodes[found->second], *params, exec->graph.context);
  });
}

CUresult addDependencies(const char* entryPoint, CUgraph hGraph, const CUgraphNode* from,
                         const CUgraphNode* to, const CUgraphEdgeData* edgeData,
                         size_t numDependencies) {
  return guarded(entryPoint, [&](Runtime&) {
    if (numDependencies > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    Graph* graph = graphOf(hGraph);
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Only the default edge (full completion of the node before) is supported.
    if (edgeData != nullptr) {
      for (size_t i = 0; i < numDependencies; ++i) {
        const CUgraphEdgeData& edge = edgeData[i];
        if (edge.from_port != 0 || edge.to_port != 0 ||
            edge.type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT) {
          return CUDA_ERROR_NOT_SUPPORTED;
        }
      }
    }
    std::vector<std::pair<std::size_t, std::size_t>> edges;
    for (size_t i = 0; i < numDependencies; ++i) {
      std::optional<std::size_t> source = indexIn(*graph, from[i]);
      std::optional<std::size_t> target = indexIn(*graph, to[i]);
      if (!source || !target || *source == *target) return CUDA_ERROR_INVALID_VALUE;
      const std::vector<std::size_t>& existing = graph->nodes[*target].dependencies;
      if (std::find(existing.begin(), existing.end(), *source) != existing.end()) {
        return CUDA_ERROR_INVALID_VALUE;  // an edge that exists already
      }
      edges.emplace_back(*source, *target);
    }
    for (const auto& [source, target] : edges) graph->nodes[target].dependencies.push_back(source);
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
    if (graph->nodes.size() != current.nodes.size()) {
      return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, nullptr);
    }
    if (graph->context != 0 && current.context != 0 && graph->context != current.context) {
      return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED, nullptr);
    }
    for (std::size_t i = 0; i < graph->nodes.size(); ++i) {
      const GraphNode& next = graph->nodes[i];
      const GraphNode& now = current.nodes[i];
      if (next.dependencies != now.dependencies) {
        return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, &next);
      }
      const bool sameShape = next.kind == now.kind &&
                             next.copy.has_value() == now.copy.has_value() &&
                             next.memset.has_value() == now.memset.has_value() &&
                             (next.host != nullptr) == (now.host != nullptr) &&
                             next.command.has_value() == now.command.has_value() &&
                             (!next.command || next.command->index() == now.command->index());
      if (!sameShape) return refuse(CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, &next);
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
  return setKernelParams(__func__, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphKernelNodeSetParams(CUgraphNode hNode,
                                                    const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  if (nodeParams == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  const CUDA_KERNEL_NODE_PARAMS params = fromV1(*nodeParams);
  return setKernelParams(__func__, hNode, &params);
}

GPUPROXY_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(
    CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS* nodeParams) {
  return setExecKernelParams(__func__, hGraphExec, hNode, nodeParams);
}

GPUPROXY_EXPORT CUresult cuGraphExecKernelNodeSetParams(
    CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1* nodeParams) {
  if (nodeParams == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  const CUDA_KERNEL_NODE_PARAMS params = fromV1(*nodeParams);
  return setExecKernelParams(__func__, hGraphExec, hNode, &params);
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
  return addDependencies(__func__, hGraph, from, to, nullptr, numDependencies);
}

GPUPROXY_EXPORT CUresult cuGraphAddDependencies_v2(CUgraph hGraph, const CUgraphNode* from,
                                                   const CUgraphNode* to,
                                                   const CUgraphEdgeData* edgeData,
                                                   size_t numDependencies) {
  return addDependencies(__func__, hGraph, from, to, edgeData, numDependencies);
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
