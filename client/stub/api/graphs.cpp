// CUDA graphs made by stream capture: cuStreamBeginCapture/EndCapture and the capture queries,
// cuGraphInstantiate/Launch/Upload and the graph and executable graph lifetimes, a graph's nodes
// and their types. How capture works, and what a launch does, is stream_capture.hpp's.
// Building graphs node by node (cuGraphAdd*Node), updating executable graphs, child graphs,
// conditional nodes, graph memory nodes and device-side launches are not supported: their entry
// points stay CUDA_ERROR_NOT_SUPPORTED.

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>

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

// An executable graph: its own copy of the graph's operations, as CUDA's is (destroying or
// changing the graph afterwards leaves it alone).
struct GraphExec {
  Graph graph;
};

// Every graph and executable graph handed out, so that a handle that is not one (or no longer
// one) is refused instead of followed. Leaked on purpose, as the stub's other tables.
struct GraphTables {
  std::mutex mutex;
  std::set<const Graph*> graphs;
  std::set<const GraphExec*> execs;
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
const Graph* graphOf(CUgraph handle) {
  const auto* graph = reinterpret_cast<const Graph*>(handle);
  GraphTables& all = tables();
  std::lock_guard lock(all.mutex);
  return all.graphs.count(graph) != 0 ? graph : nullptr;
}

const GraphExec* execOf(CUgraphExec handle) {
  const auto* exec = reinterpret_cast<const GraphExec*>(handle);
  GraphTables& all = tables();
  std::lock_guard lock(all.mutex);
  return all.execs.count(exec) != 0 ? exec : nullptr;
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
    auto exec = std::make_unique<GraphExec>(GraphExec{*graph});
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
    return runtime.capturing().launch(exec->graph, target);
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
    if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        *mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
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
  if (edgeData_out != nullptr && dependencies_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (edgeData_out != nullptr) *edgeData_out = nullptr;
  return captureInfo(__func__, hStream, NullStream::kLegacy, captureStatus_out, id_out, graph_out,
                     dependencies_out, numDependencies_out);
}

GPUPROXY_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream,
                                                        CUstreamCaptureStatus* captureStatus_out,
                                                        cuuint64_t* id_out, CUgraph* graph_out,
                                                        const CUgraphNode** dependencies_out,
                                                        const CUgraphEdgeData** edgeData_out,
                                                        size_t* numDependencies_out) {
  if (edgeData_out != nullptr && dependencies_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (edgeData_out != nullptr) *edgeData_out = nullptr;
  return captureInfo(__func__, hStream, NullStream::kPerThread, captureStatus_out, id_out,
                     graph_out, dependencies_out, numDependencies_out);
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
    const auto* graph = reinterpret_cast<const Graph*>(hGraph);
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
      nodes[i] = reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(&graph->nodes[i]));
    }
    for (std::size_t i = given; i < *numNodes; ++i) nodes[i] = nullptr;
    *numNodes = given;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  return guarded(__func__, [&](Runtime&) {
    if (type == nullptr || hNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // A node is one of a live graph's, which is only known by looking.
    GraphTables& all = tables();
    std::lock_guard lock(all.mutex);
    for (const Graph* graph : all.graphs) {
      for (const GraphNode& node : graph->nodes) {
        if (reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(&node)) == hNode) {
          *type = typeOf(node);
          return CUDA_SUCCESS;
        }
      }
    }
    return CUDA_ERROR_INVALID_VALUE;
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
    const auto* exec = reinterpret_cast<const GraphExec*>(hGraphExec);
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
