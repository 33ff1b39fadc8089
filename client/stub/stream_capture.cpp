#include "client/stub/stream_capture.hpp"

#include <algorithm>
#include <set>
#include <type_traits>
#include <utility>
#include <variant>

#include "client/stub/api/host_memory.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/log.hpp"

namespace gpuproxy::stub {

namespace ring = protocol::ring;

namespace {
thread_local CUstreamCaptureMode tThreadCaptureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;
}  // namespace

CUstreamCaptureMode threadCaptureMode() {
  return tThreadCaptureMode;
}

bool isCaptureMode(const CUstreamCaptureMode& mode) {
  switch (enumValue(mode)) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL:
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL:
    case CU_STREAM_CAPTURE_MODE_RELAXED:
      return true;
    default:
      return false;
  }
}

CUstreamCaptureMode exchangeThreadCaptureMode(CUstreamCaptureMode mode) {
  return std::exchange(tThreadCaptureMode, mode);
}

LiveHandles<Graph>& liveGraphs() {
  static auto* graphs = new LiveHandles<Graph>;
  return *graphs;
}

std::optional<std::size_t> indexIn(const Graph& graph, CUgraphNode node) {
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    if (handleOf(graph.nodes[i]) == node) {
      return graph.nodes[i].removed ? std::nullopt : std::optional<std::size_t>(i);
    }
  }
  return std::nullopt;
}

// ---- StreamCaptures ---------------------------------------------------------------------------

namespace {

// Adds `more` to a stream's dependency set, each node once.
void addDependencies(std::vector<std::size_t>& set, const std::vector<std::size_t>& more) {
  for (const std::size_t index : more) {
    if (std::find(set.begin(), set.end(), index) == set.end()) set.push_back(index);
  }
}

}  // namespace

StreamCaptures::Capture::~Capture() {
  // A graph of its own that cuStreamEndCapture did not hand out goes with the capture; the
  // application's graph is the application's again.
  if (own != nullptr) {
    liveGraphs().forget(own.get());
  } else if (graph != nullptr) {
    liveGraphs().release(graph);
  }
}

std::shared_ptr<StreamCaptures::Capture> StreamCaptures::captureOfLocked(
    std::uint64_t stream) const {
  auto found = streams_.find(stream);
  return found == streams_.end() ? nullptr : found->second;
}

void StreamCaptures::invalidateLocked(Capture& capture) {
  if (!capture.invalidated) {
    GPUPROXY_STUB_LOG(kInfo,
                      "stream capture %llu invalidated by an operation CUDA does not capture",
                      static_cast<unsigned long long>(capture.id));
  }
  capture.invalidated = true;
}

void StreamCaptures::releaseLocked(const std::shared_ptr<Capture>& capture) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    it = it->second == capture ? streams_.erase(it) : std::next(it);
  }
  countLocked();
  std::erase_if(events_, [&](const auto& entry) { return entry.second.capture == capture; });
}

CUresult StreamCaptures::begin(const StreamTarget& target, CUstreamCaptureMode mode,
                               CaptureDestination destination) {
  if (!isCaptureMode(mode)) return CUDA_ERROR_INVALID_VALUE;
  // The legacy NULL stream synchronises with every other: it cannot be captured.
  if (target.stream == 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  std::lock_guard lock(mutex_);
  if (streams_.count(target.stream) != 0) return CUDA_ERROR_ILLEGAL_STATE;
  auto capture = std::make_shared<Capture>();
  capture->id = nextId_++;
  capture->origin = target.stream;
  capture->context = target.context;
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  if (destination.graph == nullptr) {
    capture->own = std::make_unique<Graph>();
    capture->own->context = target.context;
    capture->graph = capture->own.get();
    liveGraphs().lend(capture->graph);
  } else {
    const std::uint64_t context = destination.graph->context;
    if ((context != 0 && context != target.context) || !liveGraphs().hold(destination.graph)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    capture->graph = destination.graph;
  }
  capture->dependencies[target.stream] = std::move(destination.dependencies);
  streams_[target.stream] = std::move(capture);
  countLocked();
  lastNode_.erase(target.stream);
  return CUDA_SUCCESS;
}

StreamCaptures::Ended StreamCaptures::end(std::uint64_t stream) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> capture = captureOfLocked(stream);
  if (!capture || capture->origin != stream) return {CUDA_ERROR_ILLEGAL_STATE, nullptr};
  if (capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      capture->thread != std::this_thread::get_id()) {
    return {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, nullptr};
  }
  bool unjoined = false;
  for (const auto& [joined, back] : capture->joined) unjoined = unjoined || !back;
  // Either way the capture is over: every stream it held goes back to normal.
  releaseLocked(capture);
  if (capture->invalidated) return {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, nullptr};
  if (unjoined) return {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, nullptr};
  Ended ended{CUDA_SUCCESS, std::move(capture->own)};
  capture->graph = nullptr;  // the caller's now
  return ended;
}

bool StreamCaptures::buildsInto(const Graph& graph) const {
  if (idle()) return false;
  std::lock_guard lock(mutex_);
  return std::any_of(streams_.begin(), streams_.end(),
                     [&](const auto& stream) { return stream.second->graph == &graph; });
}

StreamCaptures::Status StreamCaptures::statusOf(std::uint64_t stream) const {
  if (idle()) return Status{};
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> capture = captureOfLocked(stream);
  if (!capture) return Status{};
  return Status{
      capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE,
      capture->id, capture->graph, capture->own == nullptr};
}

const std::vector<CUgraphNode>& StreamCaptures::dependencies(std::uint64_t stream) {
  static const std::vector<CUgraphNode> kNone;
  if (idle()) return kNone;
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> capture = captureOfLocked(stream);
  if (!capture) return kNone;
  std::vector<CUgraphNode>& handles = capture->handedOut[stream];
  handles.clear();
  for (const std::size_t index : capture->dependencies[stream]) {
    handles.push_back(handleOf(capture->graph->nodes[index]));
  }
  return handles;
}

CUresult StreamCaptures::updateDependencies(std::uint64_t stream,
                                            const std::vector<CUgraphNode>& nodes, bool replace) {
  if (idle()) return CUDA_ERROR_ILLEGAL_STATE;
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> capture = captureOfLocked(stream);
  if (!capture) return CUDA_ERROR_ILLEGAL_STATE;
  if (capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  std::vector<std::size_t> indices;
  for (const CUgraphNode node : nodes) {
    const std::optional<std::size_t> index = indexIn(*capture->graph, node);
    if (!index) return CUDA_ERROR_INVALID_VALUE;
    indices.push_back(*index);
  }
  std::vector<std::size_t>& set = capture->dependencies[stream];
  if (replace) set.clear();
  addDependencies(set, indices);
  return CUDA_SUCCESS;
}

std::optional<CUresult> StreamCaptures::capture(std::uint64_t stream, GraphNode node) {
  if (idle()) return std::nullopt;
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> capture = captureOfLocked(stream);
  if (!capture) return std::nullopt;
  if (capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  Graph& graph = *capture->graph;
  // What a graph of the application's may not hold: memory nodes made by capture (the graph
  // would have to own an allocation it did not make), in a conditional body what CUDA refuses.
  const bool allowed =
      capture->own != nullptr ||
      (node.kind != GraphNode::Kind::kMemAlloc && node.kind != GraphNode::Kind::kMemFree &&
       (!graph.isBody || allowedInConditionalBody(node.kind)));
  if (!allowed) {
    GPUPROXY_STUB_LOG(kWarn,
                      "stream capture %llu: this operation cannot be captured into the graph "
                      "given to cuStreamBeginCaptureToGraph",
                      static_cast<unsigned long long>(capture->id));
    invalidateLocked(*capture);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (graph.context == 0) graph.context = capture->context;
  std::vector<std::size_t>& dependencies = capture->dependencies[stream];
  node.dependencies = std::move(dependencies);
  graph.nodes.push_back(std::move(node));
  dependencies = {graph.nodes.size() - 1};
  lastNode_[stream] = graph.nodes.size();
  if (auto joined = capture->joined.find(stream); joined != capture->joined.end()) {
    joined->second = false;  // has work the origin has not waited for
  }
  return CUDA_SUCCESS;
}

bool StreamCaptures::eventRecorded(std::uint64_t event, std::uint64_t stream) {
  if (idle()) return false;
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> capture = captureOfLocked(stream);
  if (!capture) {
    events_.erase(event);
    return false;
  }
  events_[event] =
      CapturedEvent{capture, stream, capture->graph->nodes.size(), capture->dependencies[stream]};
  return true;
}

bool StreamCaptures::eventCaptured(std::uint64_t event) const {
  if (idle()) return false;
  std::lock_guard lock(mutex_);
  return events_.count(event) != 0;
}

std::optional<CUresult> StreamCaptures::streamWaits(std::uint64_t stream, std::uint64_t event) {
  if (idle()) return std::nullopt;
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> waiter = captureOfLocked(stream);
  auto found = events_.find(event);
  std::shared_ptr<Capture> source = found == events_.end() ? nullptr : found->second.capture;
  if (!waiter && !source) return std::nullopt;
  if (waiter && !source) {
    // An event recorded outside any capture marks work that is not the graph's: nothing in the
    // graph waits for it (nothing is sent either: the stream runs nothing while it captures).
    return waiter->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
  }
  if (waiter && source != waiter) {
    // Another capture's event would merge two independent capture sequences.
    invalidateLocked(*waiter);
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (!waiter) {
    // A fork: the stream joins the capture from here on.
    if (source->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    streams_[stream] = source;
    countLocked();
    source->joined[stream] = true;
    source->dependencies[stream] = found->second.dependencies;
    lastNode_.erase(stream);
    return CUDA_SUCCESS;
  }
  // Within one capture: the stream's next operation waits for the event's point too; a join
  // when the waiter is the origin (or another stream of the capture) and the event covers
  // everything the recording stream captured.
  const CapturedEvent& recorded = found->second;
  addDependencies(waiter->dependencies[stream], recorded.dependencies);
  if (auto joined = waiter->joined.find(recorded.stream);
      joined != waiter->joined.end() && recorded.stream != stream) {
    auto last = lastNode_.find(recorded.stream);
    if (last == lastNode_.end() || recorded.nodes >= last->second) joined->second = true;
  }
  return CUDA_SUCCESS;
}

std::optional<CUresult> StreamCaptures::synchronizing(std::uint64_t stream) {
  if (idle()) return std::nullopt;
  std::lock_guard lock(mutex_);
  std::shared_ptr<Capture> capture = captureOfLocked(stream);
  if (!capture) return std::nullopt;
  invalidateLocked(*capture);
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

std::optional<CUresult> StreamCaptures::synchronizingContext(std::uint64_t context,
                                                             CUstreamCaptureMode callerMode) {
  if (callerMode == CU_STREAM_CAPTURE_MODE_RELAXED || idle()) return std::nullopt;
  std::lock_guard lock(mutex_);
  std::optional<CUresult> refused;
  for (const auto& [stream, capture] : streams_) {
    // The calling thread's own capture (unless relaxed), or, for a caller in global mode, any
    // thread's global one.
    const bool interferes = capture->context == context &&
                            capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
                            (capture->thread == std::this_thread::get_id() ||
                             (callerMode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                              capture->mode == CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (interferes) {
      invalidateLocked(*capture);
      refused = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  return refused;
}

std::optional<CUresult> StreamCaptures::unsupported(std::uint64_t stream) {
  return synchronizing(stream);
}

void StreamCaptures::streamGone(std::uint64_t stream) {
  if (idle()) return;
  std::lock_guard lock(mutex_);
  if (std::shared_ptr<Capture> capture = captureOfLocked(stream)) {
    if (capture->origin == stream) {
      // The capture cannot be ended any more: every stream it held is released.
      releaseLocked(capture);
    } else {
      streams_.erase(stream);
      capture->joined.erase(stream);
      capture->dependencies.erase(stream);
      capture->handedOut.erase(stream);
    }
    countLocked();
  }
  lastNode_.erase(stream);
}

// ---- CapturingSink ----------------------------------------------------------------------------

namespace {

// The stream a record names (every stream operation names one).
std::uint64_t streamOf(const ring::Command& command) {
  return std::visit(
      [](const auto& record) -> std::uint64_t {
        if constexpr (requires { record.stream; }) {
          return record.stream;
        } else {
          return 0;
        }
      },
      command);
}

}  // namespace

CUresult CapturingSink::enqueue(ring::Command& command) {
  if (captures_.idle()) return transport_->enqueue(command);  // every launch while none captures
  if (auto* record = std::get_if<ring::EventRecord>(&command)) {
    if (captures_.eventRecorded(record->event, record->stream)) return CUDA_SUCCESS;
    return transport_->enqueue(command);
  }
  if (auto* wait = std::get_if<ring::StreamWaitEvent>(&command)) {
    if (std::optional<CUresult> captured = captures_.streamWaits(wait->stream, wait->event)) {
      return *captured;
    }
    return transport_->enqueue(command);
  }
  GraphNode node;
  if (auto* launch = std::get_if<ring::LaunchKernel>(&command)) {
    node.kind = GraphNode::Kind::kKernel;
    if (launch->parameterReference) {
      // Only the transport itself moves parameters out of line.
      if (captures_.capturing(launch->stream)) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
      }
      return transport_->enqueue(command);
    }
  } else if (std::holds_alternative<ring::Memset>(command) ||
             std::holds_alternative<ring::Memset2D>(command)) {
    node.kind = GraphNode::Kind::kMemset;
  } else if (std::holds_alternative<ring::CopyDeviceToDevice>(command)) {
    node.kind = GraphNode::Kind::kMemcpy;
  } else {
    // A stream operation this file does not know how to keep: refused while its stream captures
    // (a new record kind must be taught here to be captured; docs/adding-a-cuda-call.md).
    if (std::optional<CUresult> refused = captures_.unsupported(streamOf(command))) {
      return *refused;
    }
    return transport_->enqueue(command);
  }
  const std::uint64_t stream = streamOf(command);
  if (!captures_.capturing(stream)) {
    return transport_->enqueue(command);
  }
  node.command = command;
  if (auto* launch = std::get_if<ring::LaunchKernel>(&*node.command)) {
    node.parameters.assign(launch->inlineParameters.begin(), launch->inlineParameters.end());
    launch->inlineParameters = {};  // pointed at again at each launch
  }
  if (std::optional<CUresult> captured = captures_.capture(stream, std::move(node))) {
    return *captured;
  }
  return transport_->enqueue(command);  // the capture ended meanwhile
}

std::optional<CUresult> CapturingSink::captureHostFunction(std::uint64_t stream, CUhostFn function,
                                                           void* userData) {
  GraphNode node;
  node.kind = GraphNode::Kind::kHost;
  node.function = function;
  node.userData = userData;
  return captures_.capture(stream, std::move(node));
}

std::optional<CUresult> CapturingSink::captureEventNode(std::uint64_t stream, GraphNode::Kind kind,
                                                        CUevent event) {
  GraphNode node;
  node.kind = kind;
  node.event = event;
  return captures_.capture(stream, std::move(node));
}

CUresult CapturingSink::synchronize(std::uint64_t context, ring::SynchronizeKind kind,
                                    std::uint64_t handle, bool query) {
  if (kind == ring::SynchronizeKind::kStream) {
    if (std::optional<CUresult> refused = captures_.synchronizing(handle)) return *refused;
  } else if (kind == ring::SynchronizeKind::kEvent) {
    if (captures_.eventCaptured(handle)) return CUDA_ERROR_CAPTURED_EVENT;
  } else if (kind == ring::SynchronizeKind::kContext && !query) {
    if (std::optional<CUresult> refused =
            captures_.synchronizingContext(context, threadCaptureMode())) {
      return *refused;
    }
  }
  return transport_->synchronize(context, kind, handle, query);
}

CUresult CapturingSink::copyWithHost(const StreamTarget& target, bool hostToDevice,
                                     CUdeviceptr device, void* host, std::size_t bytes,
                                     bool blocking) {
  if (!captures_.capturing(target.stream)) {
    return hostToDevice ? transport_->copyHostToDevice(target, device, host, bytes, blocking)
                        : transport_->copyDeviceToHost(target, host, device, bytes, blocking);
  }
  // A graph's copy reads (or writes) the host buffer each time it runs, page-locked or pageable
  // (NVIDIA's simpleCudaGraphs captures a copy into a variable on the stack). A blocking copy
  // cannot be captured.
  const auto address = reinterpret_cast<std::uint64_t>(host);
  std::optional<HostAllocationRange> range = hostAllocationContaining(address);
  const bool pageLocked = range && bytes <= range->bytes - (address - range->start);
  if (blocking) return *captures_.unsupported(target.stream);
  GraphNode node;
  node.kind = GraphNode::Kind::kMemcpy;
  node.hostToDevice = hostToDevice;
  node.device = device;
  node.host = host;
  node.bytes = bytes;
  node.pageable = !pageLocked;
  return captures_.capture(target.stream, std::move(node))
      .value_or(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

CUresult CapturingSink::copyHostToDevice(const StreamTarget& target, CUdeviceptr destination,
                                         const void* source, std::size_t bytes, bool blocking) {
  return copyWithHost(target, true, destination, const_cast<void*>(source), bytes, blocking);
}

CUresult CapturingSink::copyDeviceToHost(const StreamTarget& target, void* destination,
                                         CUdeviceptr source, std::size_t bytes, bool blocking) {
  return copyWithHost(target, false, source, destination, bytes, blocking);
}

std::optional<std::vector<std::size_t>> launchOrder(const Graph& graph) {
  // Kahn's algorithm, the ready node added first going first.
  const std::size_t count = graph.nodes.size();
  std::vector<std::size_t> waiting(count, 0);
  std::vector<std::vector<std::size_t>> dependents(count);
  for (std::size_t node = 0; node < count; ++node) {
    for (std::size_t dependency : graph.nodes[node].dependencies) {
      if (dependency >= count) return std::nullopt;
      ++waiting[node];
      dependents[dependency].push_back(node);
    }
  }
  std::set<std::size_t> ready;
  for (std::size_t node = 0; node < count; ++node) {
    if (waiting[node] == 0) ready.insert(node);
  }
  std::vector<std::size_t> order;
  order.reserve(count);
  while (!ready.empty()) {
    const std::size_t node = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(node);
    for (std::size_t dependent : dependents[node]) {
      if (--waiting[dependent] == 0) ready.insert(dependent);
    }
  }
  if (order.size() != count) return std::nullopt;
  return order;
}

ConditionalHandle::~ConditionalHandle() {
  // The graphs holding it are gone; so may be its context, whose memory is then gone with it.
  if (value != 0) cuMemFree_v2(value);
}

bool allowedInConditionalBody(GraphNode::Kind kind) {
  switch (kind) {
    case GraphNode::Kind::kKernel:
    case GraphNode::Kind::kMemcpy:
    case GraphNode::Kind::kMemset:
    case GraphNode::Kind::kEmpty:
    case GraphNode::Kind::kConditional:
    case GraphNode::Kind::kChildGraph:
      return true;
    case GraphNode::Kind::kHost:
    case GraphNode::Kind::kMemAlloc:
    case GraphNode::Kind::kMemFree:
    case GraphNode::Kind::kEventRecord:
    case GraphNode::Kind::kEventWait:
      return false;
  }
  return false;
}

bool hasConditionalNodes(const Graph& graph) {
  for (const GraphNode& node : graph.nodes) {
    if (node.kind == GraphNode::Kind::kConditional) return true;
  }
  return false;
}

CUresult CapturingSink::launch(const Graph& graph, const std::vector<std::size_t>& order,
                               const StreamTarget& target) {
  if (graph.context != 0 && graph.context != target.context) return CUDA_ERROR_INVALID_VALUE;
  const CUstream stream = reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(target.stream));
  // A conditional node reads its value when the work before it is done, which a capture cannot.
  if (captures_.capturing(target.stream) && hasConditionalNodes(graph)) {
    GPUPROXY_STUB_LOG(kWarn,
                      "a graph with conditional nodes launched into a capture is not "
                      "supported");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  for (const std::shared_ptr<ConditionalHandle>& condition : graph.conditions) {
    if (!condition->assignDefault) continue;
    if (CUresult reset = cuMemsetD32Async(condition->value, condition->defaultValue, 1, stream);
        reset != CUDA_SUCCESS) {
      return reset;
    }
  }
  for (std::size_t index : order) {
    const GraphNode& node = graph.nodes[index];
    CUresult sent = CUDA_SUCCESS;
    if (!node.enabled) continue;
    if (node.kind == GraphNode::Kind::kConditional) {
      sent = runConditional(node, target);
    } else if (node.kind == GraphNode::Kind::kChildGraph) {
      const Graph& child = *node.bodies.front();
      std::optional<std::vector<std::size_t>> childOrder = launchOrder(child);
      sent = childOrder ? launch(child, *childOrder, target) : CUDA_ERROR_INVALID_VALUE;
    } else if (node.kind == GraphNode::Kind::kEmpty || node.kind == GraphNode::Kind::kMemAlloc ||
               node.kind == GraphNode::Kind::kMemFree) {
      continue;  // a memory node's memory is there already (graph_memory.hpp)
    } else if (node.kind == GraphNode::Kind::kEventRecord) {
      // Through the entry points: captured again if the launch stream captures.
      sent = cuEventRecord(node.event, stream);
    } else if (node.kind == GraphNode::Kind::kEventWait) {
      sent = cuStreamWaitEvent(stream, node.event, CU_EVENT_WAIT_DEFAULT);
    } else if (node.kind == GraphNode::Kind::kHost) {
      // Captured again if the launch stream captures.
      std::optional<CUresult> captured =
          captureHostFunction(target.stream, node.function, node.userData);
      sent = captured ? *captured : launchHostFunction(target, node.function, node.userData);
    } else if (node.copy) {
      sent = cuMemcpy3DAsync_v2(&*node.copy, stream);
    } else if (node.memset) {
      const CUDA_MEMSET_NODE_PARAMS& memset = *node.memset;
      switch (memset.elementSize) {
        case 1:
          sent =
              cuMemsetD2D8Async(memset.dst, memset.pitch, static_cast<unsigned char>(memset.value),
                                memset.width, memset.height, stream);
          break;
        case 2:
          sent = cuMemsetD2D16Async(memset.dst, memset.pitch,
                                    static_cast<unsigned short>(memset.value), memset.width,
                                    memset.height, stream);
          break;
        default:
          sent = cuMemsetD2D32Async(memset.dst, memset.pitch, memset.value, memset.width,
                                    memset.height, stream);
          break;
      }
    } else if (node.host != nullptr) {
      // Pageable memory is read when the copy is sent, so what the graph did before it (a host
      // node, a copy into the same buffer) must have finished; a copy to pageable memory waits
      // for its data anyway. A launch into a capturing stream is captured, not run.
      if (node.pageable && node.hostToDevice && !captures_.capturing(target.stream)) {
        sent = transport_->synchronize(target.context, ring::SynchronizeKind::kStream,
                                       target.stream, /*query=*/false);
      }
      if (sent == CUDA_SUCCESS) {
        sent = node.hostToDevice
                   ? copyHostToDevice(target, node.device, node.host, node.bytes, false)
                   : copyDeviceToHost(target, node.host, node.device, node.bytes, false);
      }
    } else if (node.command) {
      ring::Command command = *node.command;
      std::visit(
          [&](auto& record) {
            if constexpr (requires {
                            record.context;
                            record.stream;
                          }) {
              record.context = target.context;
              record.stream = target.stream;
            }
            if constexpr (std::is_same_v<std::decay_t<decltype(record)>, ring::LaunchKernel>) {
              record.inlineParameters = node.parameters;
            }
          },
          command);
      sent = enqueue(command);  // captured again if the launch stream captures
    }
    if (sent != CUDA_SUCCESS) return sent;
  }
  return CUDA_SUCCESS;
}

CUresult CapturingSink::runConditional(const GraphNode& node, const StreamTarget& target) {
  // The value is read once the work ahead of the node is done, and the chosen body sent after
  // it: so a launch waits at each conditional node, as a GPU's does not.
  for (;;) {
    if (CUresult drained =
            transport_->synchronize(target.context, ring::SynchronizeKind::kStream, target.stream,
                                    /*query=*/false);
        drained != CUDA_SUCCESS) {
      return drained;
    }
    std::uint32_t value = 0;
    if (CUresult read = transport_->copyDeviceToHost(target, &value, node.condition->value,
                                                     sizeof value, /*blocking=*/true);
        read != CUDA_SUCCESS) {
      return read;
    }
    const Graph* body = nullptr;
    switch (enumValue(node.conditionType)) {
      case CU_GRAPH_COND_TYPE_IF:  // the second body, when there is one, is the else branch
        body = value != 0 ? node.bodies[0].get()
                          : (node.bodies.size() > 1 ? node.bodies[1].get() : nullptr);
        break;
      case CU_GRAPH_COND_TYPE_WHILE:
        body = value != 0 ? node.bodies[0].get() : nullptr;
        break;
      case CU_GRAPH_COND_TYPE_SWITCH:
        body = value < node.bodies.size() ? node.bodies[value].get() : nullptr;
        break;
      default:
        break;
    }
    if (body == nullptr) return CUDA_SUCCESS;
    std::optional<std::vector<std::size_t>> order = launchOrder(*body);
    if (!order) return CUDA_ERROR_INVALID_VALUE;  // checked at instantiation already
    if (CUresult ran = launch(*body, *order, target); ran != CUDA_SUCCESS) return ran;
    if (enumValue(node.conditionType) != CU_GRAPH_COND_TYPE_WHILE) return CUDA_SUCCESS;
  }
}

}  // namespace gpuproxy::stub
