#pragma once
// Stream capture and the graphs it makes (cuStreamBeginCapture ... cuStreamEndCapture,
// cuGraphInstantiate, cuGraphLaunch), kept entirely in the stub: gpuproxyd never sees a graph,
// only the records a graph launch sends, exactly as if the application had issued them again.
//
// While a stream captures, the stream operations issued to it are not sent: CapturingSink (the
// CommandSink every entry point uses) keeps a copy of each in the capture's graph, kernel
// parameters included. A stream waiting on an event recorded in a capturing stream joins that
// capture (a fork); the origin waiting on an event recorded in a joined stream takes it back (a
// join). Each stream of a capture has a dependency set, the nodes its next operation will wait
// for (the last one captured on it, a fork's or join's point, or what the application set), which
// each captured node records; the graph, its own or one of the application's, is a live graph
// handle while the capture lasts, so nodes may be added to it by hand. launchOrder sorts a graph's
// nodes by their dependencies, keeping the order they were added in where none says otherwise. A
// launch sends the nodes in that order to the launch stream: a legal schedule of the graph, though
// one without the concurrency a GPU could find in it. What CUDA does not allow during capture is
// refused as the driver refuses it, and invalidates the capture: synchronising with a capturing
// stream or (outside relaxed mode) with the context, waiting on another capture's event, copies
// with pageable host memory (whose bytes a later launch would have to read). A stream-ordered
// allocation on a capturing stream becomes a memory node (graph_memory.hpp). Thread-safe.

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "client/stub/command_sink.hpp"
#include "client/stub/live_handles.hpp"
#include "client/stub/user_objects.hpp"
#include "protocol/ring_format.hpp"

namespace gpuproxy::stub {

class GraphAllocation;
struct Graph;

// The value of a conditional graph node (cuGraphConditionalHandleCreate): 32 bits of device memory
// in the graph's context, whose address is the handle kernels pass to cudaGraphSetConditional.
// Freed when the last graph or executable graph holding it is gone.
struct ConditionalHandle {
  CUdeviceptr value = 0;
  unsigned defaultValue = 0;
  bool assignDefault = false;  // CU_GRAPH_COND_ASSIGN_DEFAULT: reset at each run of its graph
  ~ConditionalHandle();
};

// One operation of a graph: captured, or added with cuGraphAdd*Node.
struct GraphNode {
  enum class Kind : std::uint8_t {
    kKernel,
    kMemcpy,
    kMemset,
    kHost,
    kEmpty,
    kMemAlloc,
    kMemFree,
    kConditional,
    kChildGraph,
    kEventRecord,
    kEventWait
  };
  Kind kind = Kind::kKernel;
  // A launch, memset or device-to-device copy, as the entry point built it (its context and stream
  // are replaced at each launch of the graph).
  std::optional<protocol::ring::Command> command;
  std::vector<std::byte> parameters;  // a launch's, which command's view then points into
  // What cuGraphKernelNodeGetParams hands out as kernelParams: a pointer into `parameters` per
  // kernel parameter, made when asked.
  std::vector<void*> parameterPointers;
  // cuGraphNodeSetEnabled: a node of an executable graph switched off runs as an empty node.
  bool enabled = true;
  // A kernel node's launch attributes (cuGraphKernelNodeSetAttribute) that are hints, kept to be
  // read back, by CUlaunchAttributeID. Whether it is cooperative is its launch command's.
  std::map<int, CUlaunchAttributeValue> attributes;
  // A copy between device memory and host memory (which the graph reads or writes at each launch,
  // as a GPU's copy node does). `pageable`: the host side is not page-locked, so a launch reads it
  // only once the work before the node has finished, as a copy from pageable memory waits.
  bool hostToDevice = false;
  CUdeviceptr device = 0;
  void* host = nullptr;
  std::size_t bytes = 0;
  bool pageable = false;
  // A memcpy or memset node added with its parameters, run as cuMemcpy3DAsync or cuMemsetD2D*Async
  // would run them at each launch.
  std::optional<CUDA_MEMCPY3D> copy;
  std::optional<CUDA_MEMSET_NODE_PARAMS> memset;
  // A host function (cuLaunchHostFunc, or a host node).
  CUhostFn function = nullptr;
  void* userData = nullptr;
  // An event record or wait node's event (the application's: the graph does not own it).
  CUevent event = nullptr;
  // A memory node's allocation (graph_memory.hpp): the one it makes, or the one it frees.
  std::shared_ptr<GraphAllocation> allocation;
  // The nodes it waits for, by index in its graph: those named when it was added, or, captured,
  // its stream's dependency set then (the node captured before it on that stream, the point of a
  // fork or join, or what cuStreamUpdateCaptureDependencies set).
  std::vector<std::size_t> dependencies;
  // A conditional node: its handle, its type (if, while, switch) and its body graphs; a child
  // graph node: its one body, the copy of the graph it was given. Bodies are owned by the node
  // (an executable graph holds copies of its own); `bodyHandles` is the array cuGraphAddNode
  // hands out as phGraph_out.
  std::shared_ptr<ConditionalHandle> condition;
  CUgraphConditionalNodeType conditionType = CU_GRAPH_COND_TYPE_IF;
  std::vector<std::shared_ptr<Graph>> bodies;
  std::vector<CUgraph> bodyHandles;
  // cuGraphDestroyNode: the node is gone from its graph. It keeps its place (the other nodes'
  // indices, and so their dependencies and handles, stay as they were) as an empty node that no
  // edge touches, and no call finds it by its handle any more.
  bool removed = false;
};

// What cuStreamEndCapture or cuGraphCreate hands out as a CUgraph. Nodes never move once added
// (their addresses are their CUgraphNode handles).
struct Graph {
  std::uint64_t context = 0;  // where its operations run; 0 while it has none
  std::deque<GraphNode> nodes;
  // Conditional handles made for this graph, reset at each of its runs when they ask for it.
  std::vector<std::shared_ptr<ConditionalHandle>> conditions;
  // User object references it owns (cuGraphRetainUserObject); a copy of the graph owns its own.
  UserObjectReferences userObjects;
  bool isBody = false;  // a conditional node's body: the node owns it
  // A clone (cuGraphClone): the original graph's nodes at the time of the clone, to the index of
  // their copies here (cuGraphNodeFindInClone). The keys are only compared, never followed.
  std::map<const GraphNode*, std::size_t> clonedFrom;
};

// Every graph handed out as a CUgraph: those the application owns, and those lent to the table
// (conditional bodies, a capture's graph while the capture lasts; live_handles.hpp).
LiveHandles<Graph>& liveGraphs();

// A node's CUgraphNode handle (its address), and its index in `graph` (nullopt when it is not one
// of its nodes, or was removed from it).
inline CUgraphNode handleOf(const GraphNode& node) {
  return reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(&node));
}
std::optional<std::size_t> indexIn(const Graph& graph, CUgraphNode node);

// Whether `graph` has a conditional node (a body graph can hold one only if its graph does).
bool hasConditionalNodes(const Graph& graph);

// Whether a conditional node's body may hold a node of `kind`: kernels, copies, memsets, empty,
// child graph and conditional nodes, as CUDA allows.
bool allowedInConditionalBody(GraphNode::Kind kind);

// The order a launch sends a graph's nodes in: each after every node it depends on, otherwise in
// the order they were added. nullopt when the dependencies form a cycle.
std::optional<std::vector<std::size_t>> launchOrder(const Graph& graph);

// Launches a host function on a stream as cuLaunchHostFunc does (stream_extras.cpp).
CUresult launchHostFunction(const StreamTarget& target, CUhostFn function, void* userData);

// The calling thread's capture mode (cuThreadExchangeStreamCaptureMode): how much it may do that
// would disturb a capture in progress. Global until changed.
CUstreamCaptureMode threadCaptureMode();
// Whether `mode` (as the application passed it: any integer) is one of the three modes.
bool isCaptureMode(const CUstreamCaptureMode& mode);
CUstreamCaptureMode exchangeThreadCaptureMode(CUstreamCaptureMode mode);

// Where a capture puts what it captures: a graph of its own, or (cuStreamBeginCaptureToGraph) a
// graph of the application's, after some of that graph's nodes.
struct CaptureDestination {
  Graph* graph = nullptr;  // null: a graph of its own
  std::vector<std::size_t> dependencies;
};

class StreamCaptures {
public:
  struct Status {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    std::uint64_t id = 0;
    // The graph it builds (a live graph handle while the capture lasts), and whether that is a
    // graph of the application's (cuStreamBeginCaptureToGraph) rather than one of its own.
    Graph* graph = nullptr;
    bool intoApplicationGraph = false;
  };
  // What cuStreamEndCapture gets: the capture's own graph (null when it captured into the
  // application's), or why there is none.
  struct Ended {
    CUresult status = CUDA_SUCCESS;
    std::unique_ptr<Graph> graph;
  };

  // cuStreamBeginCapture. CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED for the legacy NULL stream
  // (stream 0), CUDA_ERROR_ILLEGAL_STATE for one that is capturing already;
  // CUDA_ERROR_INVALID_VALUE when the destination graph is not a live graph, or not one that
  // may gain this context's operations.
  CUresult begin(const StreamTarget& target, CUstreamCaptureMode mode,
                 CaptureDestination destination = {});
  // cuStreamEndCapture: the graph, or CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (capture ended, no
  // graph), CUDA_ERROR_STREAM_CAPTURE_UNJOINED (a stream that joined has not been joined back),
  // CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (global or thread-local mode, another thread),
  // CUDA_ERROR_ILLEGAL_STATE (the stream does not capture, or did not begin the capture).
  Ended end(std::uint64_t stream);
  Status statusOf(std::uint64_t stream) const;
  // cuStreamGetCaptureInfo's dependencies: the nodes the stream's next captured operation will
  // depend on, as handles in an array that stays valid until the next call for this stream or the
  // end of the capture (empty when the stream does not capture).
  const std::vector<CUgraphNode>& dependencies(std::uint64_t stream);
  // cuStreamUpdateCaptureDependencies: `nodes` (handles) replace the stream's dependency set, or
  // join it. CUDA_ERROR_ILLEGAL_STATE when the stream does not capture,
  // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED when its capture was invalidated,
  // CUDA_ERROR_INVALID_VALUE for a node not of the capture's graph.
  CUresult updateDependencies(std::uint64_t stream, const std::vector<CUgraphNode>& nodes,
                              bool replace);
  // Whether `stream` is in a capture (active or invalidated): its operations go to the capture.
  bool capturing(std::uint64_t stream) const {
    return statusOf(stream).status != CU_STREAM_CAPTURE_STATUS_NONE;
  }
  // Whether a capture under way puts its operations into `graph` (its streams' dependency sets
  // name nodes of it).
  bool buildsInto(const Graph& graph) const;

  // What a stream operation on `stream` becomes: nullopt when the stream does not capture (the
  // caller sends it), else the answer to the call (the node kept, or the capture's refusal).
  std::optional<CUresult> capture(std::uint64_t stream, GraphNode node);
  // An event recorded on a capturing stream marks that point of the capture (nothing is sent);
  // recorded elsewhere, it stops marking one. True when the record was captured.
  bool eventRecorded(std::uint64_t event, std::uint64_t stream);
  // Whether `event` was last recorded in a capture still under way (it marks a point of a graph,
  // not work: querying or waiting for it is CUDA_ERROR_CAPTURED_EVENT).
  bool eventCaptured(std::uint64_t event) const;
  // A stream waiting on an event: nullopt when neither side captures (the caller sends it), else
  // the answer: a fork or a join; nothing for an event recorded outside any capture; the refusal
  // (CUDA_ERROR_STREAM_CAPTURE_ISOLATION) of another capture's event.
  std::optional<CUresult> streamWaits(std::uint64_t stream, std::uint64_t event);
  // A synchronous call that would wait for `stream`: nullopt when it does not capture, else
  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, having invalidated the capture.
  std::optional<CUresult> synchronizing(std::uint64_t stream);
  // A call that would wait for the whole context (cuCtxSynchronize), from a thread whose capture
  // mode is `callerMode`: refused as above while a capture it may not interfere with is active
  // there: the calling thread's own (unless begun relaxed) and, for a caller in global mode, any
  // thread's global one; none when the caller is relaxed (cuThreadExchangeStreamCaptureMode).
  std::optional<CUresult> synchronizingContext(std::uint64_t context,
                                               CUstreamCaptureMode callerMode);
  // Something CUDA does not capture (a copy from pageable memory, a free of memory no graph made)
  // on `stream`: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when it captures (and is invalidated by it).
  std::optional<CUresult> unsupported(std::uint64_t stream);
  // A stream destroyed or a context gone: what captured there is dropped.
  void streamGone(std::uint64_t stream);
  // No stream captures (so no event marks a capture either): every query answers at once, without
  // the lock, which keeps launches free of it when no capture is under way.
  bool idle() const { return capturing_.load(std::memory_order_acquire) == 0; }

private:
  // Lent to (or held in) liveGraphs() from its beginning to its end, whichever way it ends.
  struct Capture {
    Capture() = default;
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;
    ~Capture();
    std::uint64_t id = 0;
    std::uint64_t origin = 0;
    std::uint64_t context = 0;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    bool invalidated = false;
    std::thread::id thread;      // that began it
    Graph* graph = nullptr;      // where its operations go: `own`, or the application's graph
    std::unique_ptr<Graph> own;  // null when it captures into the application's graph
    // Streams that joined, with whether they have been joined back since their last operation.
    std::map<std::uint64_t, bool> joined;
    // Each stream's dependency set: the nodes (indices in `graph`) its next operation waits for.
    std::map<std::uint64_t, std::vector<std::size_t>> dependencies;
    // The handles cuStreamGetCaptureInfo last gave out for each stream.
    std::map<std::uint64_t, std::vector<CUgraphNode>> handedOut;
  };
  struct CapturedEvent {
    std::shared_ptr<Capture> capture;
    std::uint64_t stream = 0;
    std::size_t nodes = 0;  // how many operations had been captured when it was recorded
    std::vector<std::size_t> dependencies;  // the recording stream's dependency set then
  };
  std::shared_ptr<Capture> captureOfLocked(std::uint64_t stream) const;
  void invalidateLocked(Capture& capture);
  // Ends `capture`: every stream it held stops capturing, its events stop marking it.
  void releaseLocked(const std::shared_ptr<Capture>& capture);
  // After any change to streams_: keeps the count the lock-free check below reads.
  void countLocked() { capturing_.store(streams_.size(), std::memory_order_release); }

  mutable std::mutex mutex_;
  std::atomic<std::size_t> capturing_{0};
  std::uint64_t nextId_ = 1;
  std::map<std::uint64_t, std::shared_ptr<Capture>> streams_;  // every capturing stream
  std::map<std::uint64_t, CapturedEvent> events_;              // events recorded in a capture
  // A stream's last captured operation, so that a join can tell whether it covers it.
  std::map<std::uint64_t, std::size_t> lastNode_;
};

// The CommandSink every entry point uses: operations on capturing streams go to their capture,
// everything else to the transport.
class CapturingSink final : public CommandSink {
public:
  // `transport` is read at each call: the process switches from RPC to the ring once.
  explicit CapturingSink(CommandSink* const& transport) : transport_(transport) {}

  StreamCaptures& captures() { return captures_; }
  // The transport itself, for work the stub does for itself (no capture sees it, none refuses it).
  CommandSink& uncaptured() { return *transport_; }
  // Sends a launch of `graph` to `target`, its nodes in `order` (launchOrder's). The target may
  // itself be capturing: the operations are then captured there. CUDA_ERROR_INVALID_VALUE when
  // the graph's operations belong to another context.
  CUresult launch(const Graph& graph, const std::vector<std::size_t>& order,
                  const StreamTarget& target);

  // cuLaunchHostFunc on `stream`: nullopt when it does not capture (the caller launches it), else
  // the answer, the function kept as a node.
  std::optional<CUresult> captureHostFunction(std::uint64_t stream, CUhostFn function,
                                              void* userData);
  // cuEventRecordWithFlags(CU_EVENT_RECORD_EXTERNAL) or cuStreamWaitEvent(CU_EVENT_WAIT_EXTERNAL)
  // on `stream` (`kind` kEventRecord or kEventWait): nullopt when it does not capture (the caller
  // records or waits), else the answer, an event node kept.
  std::optional<CUresult> captureEventNode(std::uint64_t stream, GraphNode::Kind kind,
                                           CUevent event);

  CUresult enqueue(protocol::ring::Command& command) override;
  CUresult synchronize(std::uint64_t context, protocol::ring::SynchronizeKind kind,
                       std::uint64_t handle, bool query) override;
  CUresult copyHostToDevice(const StreamTarget& target, CUdeviceptr destination, const void* source,
                            std::size_t bytes, bool blocking) override;
  CUresult copyDeviceToHost(const StreamTarget& target, void* destination, CUdeviceptr source,
                            std::size_t bytes, bool blocking) override;
  void eventRecorded(std::uint64_t event, std::uint64_t stream) override {
    transport_->eventRecorded(event, stream);
  }
  void eventDestroyed(std::uint64_t event) override { transport_->eventDestroyed(event); }
  void contextGone(std::uint64_t context) override { transport_->contextGone(context); }

private:
  // A conditional node of a graph being launched: its body run (again, while it asks) as its
  // value says.
  CUresult runConditional(const GraphNode& node, const StreamTarget& target);
  CUresult copyWithHost(const StreamTarget& target, bool hostToDevice, CUdeviceptr device,
                        void* host, std::size_t bytes, bool blocking);

  CommandSink* const& transport_;
  StreamCaptures captures_;
};

}  // namespace gpuproxy::stub
