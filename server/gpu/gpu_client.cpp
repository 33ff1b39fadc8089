#include "server/gpu/gpu_client.hpp"

#include "server/gpu/queued_work.hpp"

#include "server/gpu/completion.hpp"
#include "server/gpu/gpu_shard.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <utility>

namespace gpuproxy::server {

namespace {

// Past this many operations queued on one stream without a synchronisation seeing them done, the
// stream is taken to touch any of the client's memory: bookkeeping stays bounded for a client
// that never synchronises, at the cost of freeing less at once if it goes away.
constexpr std::size_t kMaxTouchesPerStream = 1024;

// A copy of a client's bytes kept alive until the backend has consumed them.
struct StagedBytes {
  std::vector<std::byte> bytes;
};

}  // namespace

std::uint64_t keepNewestOutput(std::string& output, std::size_t limit) {
  if (output.size() <= limit) return 0;
  std::size_t drop = output.size() - limit;
  const std::size_t newline = output.find('\n', drop);
  if (newline != std::string::npos) drop = newline + 1;
  output.erase(0, drop);
  return drop;
}

GpuClient::GpuClient(GpuShard& shard, std::shared_ptr<ClientStats> stats)
    : shard_(shard),
      stats_(std::move(stats)),
      schedulingId_(shard_.dispatcher().newClientId()),
      virtualMemory_(shard_, stats_->addressSpace, stats_->identity.pid) {}

GpuClient::~GpuClient() {
  std::vector<Handle> contexts;
  for (const auto& [handle, context] : contexts_) contexts.push_back(handle);
  for (Handle handle : contexts) destroyContextNow(handle);
  // What its kernels printed since its last synchronisation (it went without one): the device
  // keeps it by address space, which no client has again, so nobody would ever take it.
  shard_.takeDeviceOutput(stats_->addressSpace);
  shard_.detach(*this);
}

std::uint32_t GpuClient::deviceIndex() const {
  return shard_.index();
}

const kj::Executor& GpuClient::executor() const {
  return shard_.executor();
}

kj::Promise<void> GpuClient::whenGpuServes() {
  shard_.owner().check();
  return shard_.whenServing();
}

Handle GpuClient::newHandle(HandleKind kind) {
  shard_.owner().check();
  return makeHandle(kind, shard_.index(), nextSerial_++);
}

// ---------------------------------------------------------------------------------------------
// Contexts

std::optional<TenantObjectHold> GpuClient::holdObject(TenantObject kind) {
  shard_.owner().check();
  auto hold = TenantObjectHold::take(stats_->tenant, kind);
  if (!hold) {
    ++stats_->tenant->oomCount;
    spdlog::info("device {}: pid {} of tenant '{}' is at its cap of {} {}", shard_.index(),
                 stats_->identity.pid, stats_->tenant->name(), stats_->tenant->objectLimit(kind),
                 tenantObjectName(kind));
  }
  return hold;
}

backend::Result<Handle> GpuClient::createContext(unsigned flags) {
  shard_.owner().check();
  return createContextAs(newHandle(HandleKind::kContext), flags);
}

backend::Result<Handle> GpuClient::createContextAs(Handle handle, unsigned flags) {
  if (CUresult sticky = shard_.stickyError(); sticky != CUDA_SUCCESS) return sticky;
  auto hold = holdObject(TenantObject::kContext);
  if (!hold) return CUDA_ERROR_OUT_OF_MEMORY;
  auto nullStream =
      shard_.dispatcher().createStream({stats_->tenant, schedulingId_, stats_->addressSpace}, 0, 0);
  if (!nullStream.ok()) return nullStream.code();
  Context& context = contexts_[handle];
  context.flags = flags;
  context.nullStream = std::move(nullStream).value();
  context.hold = std::move(*hold);
  return handle;
}

kj::Promise<CUresult> GpuClient::destroyContext(Handle context) {
  shard_.owner().check();
  auto found = contexts_.find(context);
  if (found == contexts_.end() || found->second.primary) return CUDA_ERROR_INVALID_CONTEXT;
  return drainStreams(context).then([this, context](CUresult status) {
    // The context may have gone while we waited (a second destroy, or the session ended).
    if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
    destroyContextNow(context);
    return isStickyError(status) ? status : CUDA_SUCCESS;
  });
}

backend::Result<Handle> GpuClient::retainPrimaryContext() {
  shard_.owner().check();
  if (!primaryContext_) {
    // The driver's primary context keeps its handle through resets (the runtime makes it current
    // again before it retains it), so a recreated one gets the handle it had.
    if (primaryHandle_ == 0) primaryHandle_ = newHandle(HandleKind::kContext);
    auto created = createContextAs(primaryHandle_, primaryFlags_);
    if (!created.ok()) return created.code();
    contexts_[created.value()].primary = true;
    primaryContext_ = created.value();
  }
  ++primaryRefcount_;
  return *primaryContext_;
}

kj::Promise<CUresult> GpuClient::releasePrimaryContext() {
  shard_.owner().check();
  if (!primaryContext_ || primaryRefcount_ == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--primaryRefcount_ > 0) return CUDA_SUCCESS;
  return resetPrimaryContext();
}

kj::Promise<CUresult> GpuClient::resetPrimaryContext() {
  shard_.owner().check();
  if (!primaryContext_) return CUDA_SUCCESS;  // nothing to reset, as in CUDA
  Handle context = *primaryContext_;
  return drainStreams(context).then([this, context](CUresult) {
    if (primaryContext_ == context) {
      destroyContextNow(context);
      primaryContext_.reset();
      primaryRefcount_ = 0;
    }
    return CUDA_SUCCESS;
  });
}

CUresult GpuClient::setPrimaryContextFlags(unsigned flags) {
  shard_.owner().check();
  constexpr unsigned kSchedMask = CU_CTX_SCHED_MASK | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_MAP_HOST |
                                  CU_CTX_COREDUMP_ENABLE | CU_CTX_USER_COREDUMP_ENABLE |
                                  CU_CTX_SYNC_MEMOPS;
  if ((flags & ~kSchedMask) != 0) return CUDA_ERROR_INVALID_VALUE;
  primaryFlags_ = flags;
  if (primaryContext_) contexts_[*primaryContext_].flags = flags;
  return CUDA_SUCCESS;
}

PrimaryContextState GpuClient::primaryContextState() const {
  shard_.owner().check();
  return PrimaryContextState{primaryFlags_, primaryRefcount_ > 0};
}

kj::Promise<CUresult> GpuClient::synchronizeContext(Handle context) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  // Everything queued on the context's streams by now is done once this resolves.
  std::vector<std::pair<Handle, std::uint64_t>> queued;
  queued.emplace_back(0, contexts_.at(context).nullStreamWork);
  for (const auto& [handle, stream] : streams_) {
    if (stream.context == context) queued.emplace_back(handle, stream.work);
  }
  return drainStreams(context).then([this, context, queued = std::move(queued)](CUresult result) {
    if (result != CUDA_SUCCESS) return result;
    for (const auto& [stream, work] : queued) {
      if (auto target = resolveStream(context, stream)) {
        std::uint64_t* done = workCounters(*target).second;
        *done = std::max(*done, work);
        forgetCompleted(touchesOf(*target), *done);
      }
    }
    return result;
  });
}

void GpuClient::releaseDeviceMemory(CUdeviceptr pointer, const MemoryCharge& charge) {
  shard_.release(pointer, charge.bytes(), stats_->identity.pid);
}

void GpuClient::destroyContextNow(Handle context) {
  // Functions and modules first (they reference nothing else), then events and streams, then the
  // memory the work used.
  std::erase_if(functions_, [&](const auto& entry) { return entry.second.context == context; });
  for (auto it = modules_.begin(); it != modules_.end();) {
    if (it->second.context == context) {
      forgetModuleVariables(it->second);
      it = modules_.erase(it);  // its charge goes with it
    } else {
      ++it;
    }
  }
  for (auto it = events_.begin(); it != events_.end();) {
    it = it->second.context == context ? eraseEvent(it) : std::next(it);
  }
  std::erase_if(streams_, [&](const auto& entry) { return entry.second.context == context; });
  for (auto it = imports_.begin(); it != imports_.end();) {
    it = it->second.context == context ? closeImportNow(it) : std::next(it);
  }
  for (auto it = allocations_.begin(); it != allocations_.end();) {
    it = it->second.context == context ? dropAllocation(it) : std::next(it);
  }
  // Its virtual memory stays: as cuCtxDestroy leaves memory made by cuMemCreate, it is the
  // client's until given back.
  contexts_.erase(context);
  if (primaryContext_ == context) {
    primaryContext_.reset();
    primaryRefcount_ = 0;
  }
  if (contexts_.empty()) {
    // A new context starts with the driver's limits and no heap.
    releaseDeviceHeap();
    heapLimit_ = protocol::kDefaultMallocHeapBytes;
    if (deviceLimitsChanged_) {
      deviceLimitsChanged_ = false;
      backend::Device& device = shard_.device();
      device.setLimit(stats_->addressSpace, CU_LIMIT_STACK_SIZE, protocol::kDefaultStackBytes);
      device.setLimit(stats_->addressSpace, CU_LIMIT_PRINTF_FIFO_SIZE,
                      protocol::kDefaultPrintfFifoBytes);
    }
  }
  // A client that has let go of its last context here (cuDevicePrimaryCtxReset after a fault, as
  // the CUDA runtime's cudaDeviceReset does) no longer holds up the recovery of a poisoned GPU,
  // unless it still holds virtual memory, which a reset would take from it.
  recoverIfHoldingNothing();
}

// ---------------------------------------------------------------------------------------------
// Streams and the legacy NULL stream

std::optional<GpuClient::Target> GpuClient::resolveStream(Handle context, Handle stream) {
  shard_.owner().check();
  if (stream == 0) {
    auto found = contexts_.find(context);
    if (found == contexts_.end()) return std::nullopt;
    return Target{context, found->second.nullStream.get(), nullptr};
  }
  auto found = streams_.find(stream);
  if (found == streams_.end()) return std::nullopt;
  return Target{found->second.context, found->second.stream.get(), &found->second};
}

CUresult GpuClient::orderForLegacyStream(const Target& target) {
  Context& context = contexts_.at(target.context);
  backend::Device& device = shard_.device();
  // An operation on stream `from` must wait for everything queued so far on `after`.
  auto barrier = [&](backend::Stream& after, backend::Stream& from) -> CUresult {
    auto event = device.createEvent(CU_EVENT_DISABLE_TIMING);
    if (!event.ok()) return event.code();
    if (CUresult rc = after.record(*event.value()); rc != CUDA_SUCCESS) return rc;
    return from.wait(*event.value());
  };
  if (target.explicitStream == nullptr) {
    // The NULL stream waits for all blocking streams of its context.
    for (auto& [handle, stream] : streams_) {
      if (stream.context != target.context || !stream.blocking) continue;
      if (stream.work == stream.workSeenByNull) continue;
      if (CUresult rc = barrier(*stream.stream, *context.nullStream); rc != CUDA_SUCCESS) {
        return rc;
      }
      stream.workSeenByNull = stream.work;
    }
    ++context.nullStreamWork;
    return CUDA_SUCCESS;
  }
  Stream& stream = *target.explicitStream;
  if (stream.blocking && context.nullStreamWork != stream.nullWorkWaitedFor) {
    if (CUresult rc = barrier(*context.nullStream, *stream.stream); rc != CUDA_SUCCESS) return rc;
    stream.nullWorkWaitedFor = context.nullStreamWork;
  }
  ++stream.work;
  return CUDA_SUCCESS;
}

std::vector<backend::Stream*> GpuClient::streamsOf(Handle context) {
  std::vector<backend::Stream*> streams;
  for (auto& [handle, state] : contexts_) {
    if (context == 0 || handle == context) streams.push_back(state.nullStream.get());
  }
  for (auto& [handle, state] : streams_) {
    if (context == 0 || state.context == context) streams.push_back(state.stream.get());
  }
  return streams;
}

kj::Promise<CUresult> GpuClient::drainStreams(Handle context) {
  auto streams = streamsOf(context);
  auto statuses = kj::heapArrayBuilder<kj::Promise<CUresult>>(streams.size());
  for (backend::Stream* stream : streams) statuses.add(whenStreamDone(*stream));
  return firstError(statuses.finish());
}

kj::Promise<void> GpuClient::drain() {
  shard_.owner().check();
  return drainStreams(0).then([](CUresult) {});
}

backend::Result<Handle> GpuClient::createStream(Handle context, unsigned flags, int priority) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if ((flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto hold = holdObject(TenantObject::kStream);
  if (!hold) return CUDA_ERROR_OUT_OF_MEMORY;
  auto created = shard_.dispatcher().createStream(
      {stats_->tenant, schedulingId_, stats_->addressSpace}, flags, priority);
  if (!created.ok()) return created.code();
  Handle handle = newHandle(HandleKind::kStream);
  Stream& stream = streams_[handle];
  stream.hold = std::move(*hold);
  stream.context = context;
  stream.blocking = (flags & CU_STREAM_NON_BLOCKING) == 0;
  stream.stream = std::move(created).value();
  // A new stream has seen everything before it: nothing to wait for yet.
  stream.nullWorkWaitedFor = contexts_[context].nullStreamWork;
  return handle;
}

CUresult GpuClient::destroyStream(Handle stream) {
  shard_.owner().check();
  if (streams_.erase(stream) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

kj::Promise<CUresult> GpuClient::synchronizeStream(Handle context, Handle stream) {
  shard_.owner().check();
  auto target = resolveStream(context, stream);
  if (!target) return stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  // Nothing queued since the last completion this client saw: answer without a trip through the
  // backend (a synchronisation on an idle stream is the common case in tight loops).
  auto [queued, done] = workCounters(*target);
  if (*queued == *done && (target->explicitStream != nullptr || !blockingWorkUnseen(context))) {
    return shard_.stickyError();
  }
  // Synchronising the NULL stream also waits for the blocking streams it is ordered after.
  if (target->explicitStream == nullptr) {
    if (CUresult rc = orderForLegacyStream(*target); rc != CUDA_SUCCESS) return rc;
  }
  return noteCompletion(context, stream, *workCounters(*target).first,
                        whenStreamDone(*target->stream));
}

CUresult GpuClient::queryStream(Handle context, Handle stream) {
  shard_.owner().check();
  auto target = resolveStream(context, stream);
  if (!target) return stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  auto [queued, done] = workCounters(*target);
  if (*queued == *done) return shard_.stickyError();
  return target->stream->query();
}

bool GpuClient::blockingWorkUnseen(Handle context) const {
  for (const auto& [handle, stream] : streams_) {
    if (stream.context == context && stream.blocking && stream.work != stream.workSeenByNull) {
      return true;
    }
  }
  return false;
}

std::pair<std::uint64_t*, std::uint64_t*> GpuClient::workCounters(const Target& target) {
  if (target.explicitStream != nullptr) {
    return {&target.explicitStream->work, &target.explicitStream->workDone};
  }
  Context& context = contexts_.at(target.context);
  return {&context.nullStreamWork, &context.nullStreamWorkDone};
}

kj::Promise<CUresult> GpuClient::noteCompletion(Handle context, Handle stream, std::uint64_t queued,
                                                kj::Promise<CUresult> status) {
  return status.then([this, context, stream, queued](CUresult result) {
    if (result == CUDA_SUCCESS) {
      if (auto target = resolveStream(context, stream)) {
        std::uint64_t* done = workCounters(*target).second;
        *done = std::max(*done, queued);
        forgetCompleted(touchesOf(*target), *done);
      }
    }
    return result;
  });
}

GpuClient::Touches& GpuClient::touchesOf(const Target& target) {
  if (target.explicitStream != nullptr) return target.explicitStream->touches;
  return contexts_.at(target.context).nullStreamTouches;
}

void GpuClient::forgetCompleted(Touches& touches, std::uint64_t done) {
  while (!touches.queued.empty() && touches.queued.front().work <= done) {
    touches.queued.pop_front();
  }
}

CUdeviceptr GpuClient::allocationOf(CUdeviceptr pointer) const {
  auto after = allocations_.upper_bound(pointer);
  if (after == allocations_.begin()) return 0;
  auto allocation = std::prev(after);
  return pointer - allocation->first < allocation->second.bytes ? allocation->first : 0;
}

void GpuClient::noteKernelTouches(const Target& target) {
  Touches& touches = touchesOf(target);
  auto [queued, done] = workCounters(target);
  forgetCompleted(touches, *done);
  ++touches.memoryOps;
  // A kernel may follow any pointer: 0 stands for all of the client's memory.
  touches.queued.push_back(Touch{*queued, touches.memoryOps, 0});
  boundTouches(touches);
}

void GpuClient::boundTouches(Touches& touches) {
  if (touches.queued.size() > kMaxTouchesPerStream) {
    // One entry for all of them: done when the newest is, dropped unsubmitted only if the oldest
    // was (what the dispatcher holds is always the newest operations).
    const Touch any{touches.queued.back().work, touches.queued.front().memoryOp, 0};
    touches.queued.clear();
    touches.queued.push_back(any);
  }
}

std::uint64_t GpuClient::abandon() {
  shard_.owner().check();
  struct Queue {
    backend::Stream* stream;
    Touches* touches;
    std::size_t held = 0;
  };
  std::vector<Queue> queues;
  for (auto& [handle, context] : contexts_) {
    queues.push_back(Queue{context.nullStream.get(), &context.nullStreamTouches});
  }
  for (auto& [handle, stream] : streams_) {
    queues.push_back(Queue{stream.stream.get(), &stream.touches});
  }
  dispatch::ScheduledDevice& dispatcher = shard_.dispatcher();
  for (Queue& queue : queues) queue.held = dispatcher.heldMemoryOperations(*queue.stream);
  const std::size_t dropped =
      dispatcher.abandonClient(schedulingId_, CUDA_ERROR_CONTEXT_IS_DESTROYED);
  // The host functions it was running will never say they returned, and what they and other
  // GPUs' events held back is gone.
  hostFunctions_.clear();
  anotherGpusEvents_.clear();
  // Where the device can, the work it already has is dropped too and a running kernel stops (the
  // sim): what drain() waits for then ends soon, even a kernel that would never have.
  dispatcher.abandonWorkOf(stats_->addressSpace);

  // What the work already on the device may still touch: on a stream that is not idle, every
  // operation not known to be done except those just dropped (the newest `held` of them).
  bool touchesAny = false;
  std::set<CUdeviceptr> touched;
  for (const Queue& queue : queues) {
    if (queue.touches->queued.empty() || queue.stream->query() == CUDA_SUCCESS) continue;
    const std::uint64_t lastSubmitted = queue.touches->memoryOps - queue.held;
    for (const Touch& touch : queue.touches->queued) {
      if (touch.memoryOp > lastSubmitted) continue;
      if (touch.base == 0) touchesAny = true;
      touched.insert(touch.base);
    }
  }
  if (dropped > 0) {
    spdlog::debug("device {}: dropped {} operations of pid {} that had not reached the device",
                  shard_.index(), dropped, stats_->identity.pid);
  }
  // A kernel on the device may follow any pointer, into module memory too: everything waits.
  if (touchesAny) return 0;

  const std::uint64_t before = *memoryUsed_;
  for (auto it = allocations_.begin(); it != allocations_.end();) {
    it = touched.count(it->first) != 0 ? std::next(it) : dropAllocation(it);
  }
  // No kernel of this client is left to run, so its modules can go too.
  functions_.clear();
  moduleVariables_.clear();
  modules_.clear();  // and their charges
  releaseDeviceHeap();
  return before - *memoryUsed_;
}

CUresult GpuClient::streamWaitEvent(Handle context, Handle stream, Handle event) {
  shard_.owner().check();
  auto target = resolveStream(context, stream);
  if (!target) return stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  auto found = events_.find(event);
  if (found == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult rc = orderForLegacyStream(*target); rc != CUDA_SUCCESS) return rc;
  if (CUresult waited = target->stream->wait(*found->second.event); waited != CUDA_SUCCESS) {
    return waited;
  }
  return countUntilDone(*target->stream, 0);
}

// ---------------------------------------------------------------------------------------------
// Events

backend::Result<Handle> GpuClient::createEvent(Handle context, unsigned flags) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  constexpr unsigned kKnownFlags =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if ((flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  // As in CUDA: an interprocess event records no timing.
  if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto hold = holdObject(TenantObject::kEvent);
  if (!hold) return CUDA_ERROR_OUT_OF_MEMORY;
  auto created = shard_.device().createEvent(flags);
  if (!created.ok()) return created.code();
  Handle handle = newHandle(HandleKind::kEvent);
  events_[handle] = Event{context, std::move(created).value(), std::move(*hold), flags};
  return handle;
}

CUresult GpuClient::destroyEvent(Handle event) {
  shard_.owner().check();
  auto found = events_.find(event);
  if (found == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  eraseEvent(found);
  return CUDA_SUCCESS;
}

CUresult GpuClient::recordEvent(Handle context, Handle event, Handle stream) {
  shard_.owner().check();
  auto found = events_.find(event);
  if (found == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (stream == 0) context = found->second.context;  // the event's own context's NULL stream
  auto target = resolveStream(context, stream);
  if (!target) return CUDA_ERROR_INVALID_HANDLE;
  if (target->context != found->second.context) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult rc = orderForLegacyStream(*target); rc != CUDA_SUCCESS) return rc;
  if (CUresult recorded = target->stream->record(*found->second.event); recorded != CUDA_SUCCESS) {
    return recorded;
  }
  return countUntilDone(*target->stream, 0);
}

kj::Promise<CUresult> GpuClient::synchronizeEvent(Handle event) {
  shard_.owner().check();
  auto found = events_.find(event);
  if (found == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  return whenEventDone(*found->second.event);
}

CUresult GpuClient::queryEvent(Handle event) {
  shard_.owner().check();
  auto found = events_.find(event);
  if (found == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  return found->second.event->query();
}

backend::Result<float> GpuClient::eventElapsedTime(Handle start, Handle end) {
  shard_.owner().check();
  auto startEvent = events_.find(start);
  auto endEvent = events_.find(end);
  if (startEvent == events_.end() || endEvent == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  return endEvent->second.event->elapsedSince(*startEvent->second.event);
}

// ---------------------------------------------------------------------------------------------
// Memory

std::map<CUdeviceptr, GpuClient::Allocation>::iterator GpuClient::dropAllocation(
    std::map<CUdeviceptr, Allocation>::iterator allocation) {
  if (!shard_.ipcExports().keepForImporters(allocation->first, allocation->second.charge)) {
    releaseDeviceMemory(allocation->first, allocation->second.charge);
  }
  return allocations_.erase(allocation);
}

std::map<Handle, GpuClient::Event>::iterator GpuClient::eraseEvent(
    std::map<Handle, Event>::iterator event) {
  if (event->second.exported) shard_.ipcExports().forgetEvent(*event->second.event);
  return events_.erase(event);
}

// ---------------------------------------------------------------------------------------------
// Interprocess handles (cuIpc*): the table is the shard's (server/gpu/ipc_exports.hpp)

IpcExports::Party GpuClient::ipcParty() const {
  return IpcExports::Party{schedulingId_, stats_->tenant->id()};
}

backend::Result<IpcToken> GpuClient::exportMemory(CUdeviceptr pointer) {
  shard_.owner().check();
  const CUdeviceptr base = allocationOf(pointer);
  if (base == 0) return CUDA_ERROR_INVALID_VALUE;
  return shard_.ipcExports().exportMemory(ipcParty(), base, allocations_.at(base).bytes);
}

backend::Result<IpcExports::Range> GpuClient::openMemory(Handle context, const IpcToken& token) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  for (auto& [base, import] : imports_) {
    if (import.token == token) {  // opened before: one more reference
      ++import.references;
      return IpcExports::Range{base, import.bytes};
    }
  }
  auto range = shard_.ipcExports().openMemory(token, ipcParty());
  if (!range.ok()) return range;
  const IpcExports::Range opened = range.value();
  if (CUresult shared = shard_.device().shareAllocation(opened.base, stats_->addressSpace);
      shared != CUDA_SUCCESS) {
    if (auto charge = shard_.ipcExports().closeMemory(opened.base))
      releaseDeviceMemory(opened.base, *charge);
    return shared;
  }
  imports_.emplace(opened.base, Import{opened.bytes, context, token, 1});
  return opened;
}

kj::Promise<CUresult> GpuClient::closeMemory(CUdeviceptr pointer) {
  shard_.owner().check();
  auto found = imports_.find(pointer);
  if (found == imports_.end() || found->second.references == 0) return CUDA_ERROR_INVALID_VALUE;
  if (--found->second.references > 0) return CUDA_SUCCESS;
  // Unmapped once the work this client queued before has drained, as cuMemFree frees: that work
  // may use the memory (a stream-ordered free of an imported pool pointer is ordered after it).
  return drainStreams(0).then([this, pointer](CUresult) {
    auto closing = imports_.find(pointer);
    // Opened again meanwhile, or gone with its context.
    if (closing == imports_.end() || closing->second.references > 0) return CUDA_SUCCESS;
    closeImportNow(closing);
    return CUDA_SUCCESS;
  });
}

std::map<CUdeviceptr, GpuClient::Import>::iterator GpuClient::closeImportNow(
    std::map<CUdeviceptr, Import>::iterator import) {
  const CUdeviceptr base = import->first;
  shard_.device().unshareAllocation(base, stats_->addressSpace);
  if (std::optional<MemoryCharge> charge = shard_.ipcExports().closeMemory(base)) {
    releaseDeviceMemory(base, *charge);
  }
  return imports_.erase(import);
}

backend::Result<IpcToken> GpuClient::exportEvent(Handle event) {
  shard_.owner().check();
  auto found = events_.find(event);
  if (found == events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  if ((found->second.flags & CU_EVENT_INTERPROCESS) == 0) return CUDA_ERROR_INVALID_HANDLE;
  found->second.exported = true;
  return shard_.ipcExports().exportEvent(ipcParty(), found->second.event);
}

backend::Result<Handle> GpuClient::openEvent(Handle context, const IpcToken& token) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  auto event = shard_.ipcExports().openEvent(token, ipcParty());
  if (!event.ok()) return event.code();
  auto hold = holdObject(TenantObject::kEvent);
  if (!hold) return CUDA_ERROR_OUT_OF_MEMORY;
  Handle handle = newHandle(HandleKind::kEvent);
  events_[handle] = Event{context, std::move(event).value(), std::move(*hold),
                          CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING};
  return handle;
}

bool GpuClient::ownsAllocation(CUdeviceptr pointer) const {
  shard_.owner().check();
  return allocations_.count(pointer) != 0;
}

bool GpuClient::rangeIsOwned(CUdeviceptr pointer, std::uint64_t bytes) const {
  auto within = [pointer, bytes](const auto& ranges, auto sizeOf) {
    auto after = ranges.upper_bound(pointer);
    if (after == ranges.begin()) return false;
    auto range = std::prev(after);
    const std::uint64_t size = sizeOf(range->second);
    const std::uint64_t offset = pointer - range->first;
    return offset < size && bytes <= size - offset;
  };
  return within(allocations_, [](const Allocation& allocation) { return allocation.bytes; }) ||
         within(imports_, [](const Import& import) { return import.bytes; }) ||
         within(moduleVariables_, [](std::uint64_t size) { return size; }) ||
         virtualMemory_.reaches(pointer, bytes) ||
         shard_.hostRangeIsMapped(stats_->addressSpace, pointer, bytes);
}

// ---------------------------------------------------------------------------------------------
// Virtual memory management (server/gpu/client_virtual_memory.hpp)

backend::Result<CUdeviceptr> GpuClient::reserveAddresses(Handle context, std::uint64_t bytes,
                                                         std::uint64_t alignment) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  return virtualMemory_.reserve(bytes, alignment);
}

CUresult GpuClient::freeAddresses(CUdeviceptr start, std::uint64_t bytes) {
  shard_.owner().check();
  const CUresult freed = virtualMemory_.freeReservation(start, bytes);
  recoverIfHoldingNothing();
  return freed;
}

void GpuClient::recoverIfHoldingNothing() {
  if (!holdsDeviceState()) shard_.recoverIfIdle();
}

kj::Promise<backend::Result<Handle>> GpuClient::createPhysicalMemory(std::uint64_t bytes) {
  using Created = backend::Result<Handle>;
  shard_.owner().check();
  if (bytes == 0 || bytes % protocol::kVirtualMemoryGranularity != 0) {
    return Created(CUDA_ERROR_INVALID_VALUE);
  }
  if (!virtualMemory_.hasRoom()) return Created(CUDA_ERROR_OUT_OF_MEMORY);
  // Charged before the device makes it, as an allocation is: physical memory is whole granules.
  auto charge = MemoryCharge::take(ledger(), bytes, MemoryCharge::Kind::kAllocation);
  if (!charge) {
    spdlog::info(
        "device {}: pid {} of tenant '{}' asked for {} bytes of physical memory beyond "
        "its limit",
        shard_.index(), stats_->identity.pid, stats_->tenant->name(), bytes);
    return Created(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return shard_.createPhysicalMemory(bytes).then(
      [this, charge = std::move(*charge)](backend::Result<std::uint64_t> made) mutable -> Created {
        if (!made.ok()) return made.code();  // the charge goes back with `charge`
        const Handle handle = newHandle(HandleKind::kPhysicalMemory);
        virtualMemory_.addPhysical(
            handle, std::make_shared<PhysicalMemory>(shard_, made.value(), std::move(charge),
                                                     stats_->identity.pid));
        return handle;
      });
}

backend::Result<IpcToken> GpuClient::exportPhysicalMemory(Handle handle) {
  shard_.owner().check();
  std::shared_ptr<PhysicalMemory> memory = virtualMemory_.physical(handle);
  if (!memory) return CUDA_ERROR_INVALID_VALUE;
  return shard_.ipcExports().exportPhysical(ipcParty(), memory);
}

backend::Result<GpuClient::ImportedMemory> GpuClient::importPhysicalMemory(const IpcToken& token) {
  shard_.owner().check();
  auto memory = shard_.ipcExports().openPhysical(token, ipcParty());
  if (!memory.ok()) return memory.code();
  if (!virtualMemory_.hasRoom()) return CUDA_ERROR_OUT_OF_MEMORY;
  const Handle handle = newHandle(HandleKind::kPhysicalMemory);
  const std::uint64_t bytes = memory.value()->bytes();
  virtualMemory_.addPhysical(handle, std::move(memory).value());
  return ImportedMemory{handle, bytes};
}

kj::Promise<CUresult> GpuClient::unmapMemory(CUdeviceptr address, std::uint64_t bytes) {
  shard_.owner().check();
  // As cuMemUnmap, after the work the client queued before: it may use the mapping.
  return drainStreams(0).then([this, address, bytes](CUresult) {
    const CUresult unmapped = virtualMemory_.unmap(address, bytes);
    recoverIfHoldingNothing();
    return unmapped;
  });
}

kj::Promise<backend::Result<CUdeviceptr>> GpuClient::allocate(Handle context, std::uint64_t bytes) {
  using Allocated = backend::Result<CUdeviceptr>;
  shard_.owner().check();
  if (contexts_.count(context) == 0) return Allocated(CUDA_ERROR_INVALID_CONTEXT);
  if (bytes == 0) return Allocated(CUDA_ERROR_INVALID_VALUE);
  // The tenant's limit is checked before anything reaches the device, against what the
  // allocation will occupy there: a tenant of many tiny allocations pays for every rounded one.
  const std::uint64_t occupied = shard_.occupiedBytes(bytes);
  auto charge = MemoryCharge::take(ledger(), occupied, MemoryCharge::Kind::kAllocation);
  if (!charge) {
    spdlog::info(
        "device {}: pid {} of tenant '{}' asked for {} bytes ({} on the device) beyond "
        "its limit",
        shard_.index(), stats_->identity.pid, stats_->tenant->name(), bytes, occupied);
    return Allocated(CUDA_ERROR_OUT_OF_MEMORY);
  }
  // Charged while the device allocates, so that concurrent allocations cannot pass the limit.
  return shard_.allocate(bytes, stats_->addressSpace)
      .then([this, context, bytes,
             charge = std::move(*charge)](Allocated pointer) mutable -> Allocated {
        if (!pointer.ok()) return pointer.code();  // the charge goes back with `charge`
        if (contexts_.count(context) == 0) {       // destroyed meanwhile
          releaseDeviceMemory(pointer.value(), charge);
          return CUDA_ERROR_INVALID_CONTEXT;
        }
        allocations_.emplace(pointer.value(), Allocation{bytes, context, std::move(charge)});
        return pointer.value();
      });
}

kj::Promise<CUresult> GpuClient::free(CUdeviceptr pointer) {
  shard_.owner().check();
  if (allocations_.count(pointer) == 0) return CUDA_ERROR_INVALID_VALUE;
  // cuMemFree waits for the work this client queued before it, so nothing still in flight can
  // touch memory that is handed to someone else.
  return drainStreams(0).then([this, pointer](CUresult) -> kj::Promise<CUresult> {
    auto found = allocations_.find(pointer);
    if (found == allocations_.end()) return CUDA_ERROR_INVALID_VALUE;  // freed meanwhile
    if (shard_.ipcExports().keepForImporters(pointer, found->second.charge)) {
      allocations_.erase(found);  // another client maps it: freed once it has unmapped it
      return CUDA_SUCCESS;
    }
    // Gone from the client's tables now; its charge is given back once the device has freed it,
    // so the tenant cannot pass its limit meanwhile.
    auto allocation = std::make_shared<Allocation>(std::move(found->second));
    allocations_.erase(found);
    return shard_.free(pointer).then([allocation](CUresult freed) { return freed; });
  });
}

backend::Result<std::uint64_t> GpuClient::setLimit(Handle context, CUlimit limit,
                                                   std::uint64_t value) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (limit == CU_LIMIT_MALLOC_HEAP_SIZE && deviceHeap_) {
    if (value == heapLimit_) return value;
    spdlog::info(
        "device {}: pid {} asked for a {}-byte device heap after its {}-byte heap was made (a "
        "module that calls malloc or free was loaded): refused, as CUDA refuses it",
        shard_.index(), stats_->identity.pid, value, heapLimit_);
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto granted = shard_.device().setLimit(stats_->addressSpace, limit, value);
  if (!granted.ok()) return granted;
  if (limit == CU_LIMIT_MALLOC_HEAP_SIZE) {
    heapLimit_ = granted.value();
  } else {
    deviceLimitsChanged_ = true;
  }
  return granted;
}

CUresult GpuClient::provideDeviceHeap(const backend::Module& module) {
  if (!module.needsDeviceHeap() || deviceHeap_) return CUDA_SUCCESS;
  auto charge = MemoryCharge::take(ledger(), shard_.occupiedBytes(heapLimit_),
                                   MemoryCharge::Kind::kAllocation);
  backend::Result<CUdeviceptr> pointer = CUDA_ERROR_OUT_OF_MEMORY;
  if (charge) pointer = shard_.allocateNow(heapLimit_, stats_->addressSpace);
  if (!pointer.ok()) {
    spdlog::info(
        "device {}: the {}-byte device heap of pid {} (tenant '{}') could not be had ({}); the "
        "module that needs it is refused",
        shard_.index(), heapLimit_, stats_->identity.pid, stats_->tenant->name(),
        charge ? "out of device memory" : "beyond the tenant's memory limit");
    return CUDA_ERROR_SHARED_OBJECT_INIT_FAILED;
  }
  shard_.device().attachDeviceHeap(stats_->addressSpace, pointer.value(), heapLimit_);
  deviceHeap_.emplace(DeviceHeap{pointer.value(), std::move(*charge)});
  return CUDA_SUCCESS;
}

void GpuClient::releaseDeviceHeap() {
  if (!deviceHeap_) return;
  shard_.device().attachDeviceHeap(stats_->addressSpace, 0, 0);
  releaseDeviceMemory(deviceHeap_->pointer, deviceHeap_->charge);
  deviceHeap_.reset();  // and its charge
}

backend::Result<backend::MemoryInfo> GpuClient::memoryInfo(Handle context) {
  shard_.owner().check();
  if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult sticky = shard_.stickyError(); sticky != CUDA_SUCCESS) return sticky;
  backend::MemoryInfo device = shard_.memoryInfo();
  if (auto limited = stats_->tenant->memoryInfo(shard_.index(), device.free)) {
    return backend::MemoryInfo{limited->first, limited->second};
  }
  return device;
}

CUresult GpuClient::enqueue(Handle context, Handle stream,
                            const backend::MemoryOperation& operation) {
  shard_.owner().check();
  auto target = resolveStream(context, stream);
  if (!target) return stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  if (CUresult queued = enqueueOn(*target, operation); queued != CUDA_SUCCESS) return queued;
  return countUntilDone(*target->stream, 0);
}

GpuClient::StreamHold GpuClient::holdStream(Handle context, Handle stream, Gates& gates,
                                            std::uint64_t name) {
  auto refused = [](CUresult error) { return StreamHold{error, CUDA_SUCCESS}; };
  auto target = resolveStream(context, stream);
  if (!target) {
    return refused(stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE);
  }
  // Stream work like any other: ordered with the legacy NULL stream, and counted, so that a
  // synchronisation of the stream waits for the function to have returned.
  if (CUresult ordered = orderForLegacyStream(*target); ordered != CUDA_SUCCESS) {
    return refused(ordered);
  }
  CallbackOnLoop reached = callbackOnLoop();
  auto gate = shard_.dispatcher().pushHostGate(*target->stream, std::move(reached.callback));
  if (!gate.ok()) return refused(gate.code());
  // Counted as queued work until the stream has gone past it (status, queued_operations).
  if (CUresult counted = countUntilDone(*target->stream, 0); counted != CUDA_SUCCESS) {
    shard_.dispatcher().openHostGate(*gate.value());
    return refused(counted);
  }
  gates.emplace(name, std::move(gate).value());
  return StreamHold{CUDA_SUCCESS, kj::mv(reached.promise)};
}

bool GpuClient::openGate(Gates& gates, std::uint64_t name) {
  shard_.owner().check();
  auto found = gates.find(name);
  if (found == gates.end()) return false;
  const std::shared_ptr<dispatch::ScheduledDevice::HostGate> gate = std::move(found->second);
  gates.erase(found);
  shard_.dispatcher().openHostGate(*gate);
  return true;
}

GpuClient::StreamHold GpuClient::holdStreamForHostFunction(Handle context, Handle stream,
                                                           std::uint64_t token) {
  shard_.owner().check();
  if (holdsForHostFunction(token)) return StreamHold{CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
  return holdStream(context, stream, hostFunctions_, token);
}

bool GpuClient::hostFunctionReturned(std::uint64_t token) {
  shard_.owner().check();
  return openGate(hostFunctions_, token);
}

GpuClient::HoldForAnotherGpu GpuClient::holdStreamForAnotherGpu(Handle context, Handle stream) {
  shard_.owner().check();
  const std::uint64_t hold = ++lastHold_;
  // When the stream reaches the hold does not matter: what lets it go on is the other GPU's.
  return HoldForAnotherGpu{holdStream(context, stream, anotherGpusEvents_, hold).result, hold};
}

void GpuClient::anotherGpusEventDone(std::uint64_t hold) {
  shard_.owner().check();
  openGate(anotherGpusEvents_, hold);
}

std::size_t GpuClient::collectDeviceOutput() {
  shard_.owner().check();
  deviceOutput_.text += shard_.takeDeviceOutput(stats_->addressSpace);
  deviceOutput_.lostBytes += keepNewestOutput(deviceOutput_.text, kMaxDeviceOutputBytes);
  return deviceOutput_.text.size();
}

GpuClient::DeviceOutput GpuClient::takeDeviceOutput() {
  shard_.owner().check();
  return std::exchange(deviceOutput_, DeviceOutput{});
}

CUresult GpuClient::countUntilDone(backend::Stream& stream, std::uint64_t bytes) {
  auto work = std::make_shared<QueuedWork>(stats_, bytes);
  // The callback holds the count; the operation before it is done when it runs.
  return stream.addCallback([work](CUresult) {});
}

CUresult GpuClient::enqueueOn(const Target& target, const backend::MemoryOperation& operation) {
  if (CUresult checked = backend::checkOperation(operation); checked != CUDA_SUCCESS) {
    return checked;
  }
  if (backend::isEmpty(operation)) return CUDA_SUCCESS;
  const backend::DeviceRanges ranges = backend::deviceRanges(operation);
  for (std::size_t i = 0; i < ranges.count; ++i) {
    if (!rangeIsOwned(ranges.ranges[i].pointer, ranges.ranges[i].bytes)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (CUresult rc = orderForLegacyStream(target); rc != CUDA_SUCCESS) return rc;
  CUresult queued = target.stream->enqueue(operation);
  if (queued != CUDA_SUCCESS) return queued;
  Touches& touches = touchesOf(target);
  auto [queuedWork, done] = workCounters(target);
  forgetCompleted(touches, *done);
  ++touches.memoryOps;
  for (std::size_t i = 0; i < ranges.count; ++i) {
    touches.queued.push_back(
        Touch{*queuedWork, touches.memoryOps, allocationOf(ranges.ranges[i].pointer)});
  }
  boundTouches(touches);
  return CUDA_SUCCESS;
}

CUresult GpuClient::copyHostToDevice(Handle context, Handle stream, CUdeviceptr destination,
                                     std::span<const std::byte> data) {
  shard_.owner().check();
  auto staged = std::make_shared<StagedBytes>();
  staged->bytes.assign(data.begin(), data.end());
  kj::Promise<CUresult> read = nullptr;
  CUresult queued = queueHostToDeviceFrom(context, stream, destination, staged->bytes,
                                          std::shared_ptr<const void>(staged, staged.get()),
                                          staged->bytes.size(), read);
  // The staged copy lives until the backend has read it; nobody waits for that.
  if (queued == CUDA_SUCCESS) read.detach([](kj::Exception&&) {});
  return queued;
}

kj::Promise<CUresult> GpuClient::copyHostToDeviceFrom(Handle context, Handle stream,
                                                      CUdeviceptr destination,
                                                      std::span<const std::byte> source,
                                                      std::shared_ptr<const void> keepAlive) {
  shard_.owner().check();
  kj::Promise<CUresult> read = nullptr;
  CUresult queued =
      queueHostToDeviceFrom(context, stream, destination, source, std::move(keepAlive), 0, read);
  if (queued != CUDA_SUCCESS) return queued;
  return read;
}

CUresult GpuClient::queueHostToDeviceFrom(Handle context, Handle stream, CUdeviceptr destination,
                                          std::span<const std::byte> source,
                                          std::shared_ptr<const void> keepAlive,
                                          std::uint64_t heldBytes, kj::Promise<CUresult>& read) {
  shard_.owner().check();
  auto target = resolveStream(context, stream);
  if (!target) return stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  if (source.empty()) {
    read = CUDA_SUCCESS;
    return CUDA_SUCCESS;
  }
  CUresult queued =
      enqueueOn(*target, backend::CopyHostToDevice{destination, source.data(), source.size()});
  if (queued != CUDA_SUCCESS) return queued;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<CUresult>();
  auto fulfiller =
      std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<CUresult>>>(kj::mv(paf.fulfiller));
  auto work = std::make_shared<QueuedWork>(stats_, heldBytes);
  CUresult callback =
      target->stream->addCallback([fulfiller, work, keepAlive = std::move(keepAlive)](
                                      CUresult status) { (*fulfiller)->fulfill(kj::mv(status)); });
  if (callback != CUDA_SUCCESS) return callback;
  read = kj::mv(paf.promise);
  return CUDA_SUCCESS;
}

kj::Promise<backend::Result<std::vector<std::byte>>> GpuClient::copyDeviceToHost(
    Handle context, Handle stream, CUdeviceptr source, std::uint64_t bytes) {
  shard_.owner().check();
  using Bytes = backend::Result<std::vector<std::byte>>;
  // Shared with the backend callback: the copy may land after this client has gone.
  auto landing = std::make_shared<StagedBytes>();
  landing->bytes.resize(bytes);
  return copyDeviceToHostInto(context, stream, source, landing->bytes, landing)
      .then([landing](CUresult status) -> Bytes {
        if (status != CUDA_SUCCESS) return status;
        return std::move(landing->bytes);
      });
}

kj::Promise<CUresult> GpuClient::copyDeviceToHostInto(Handle context, Handle stream,
                                                      CUdeviceptr source,
                                                      std::span<std::byte> destination,
                                                      std::shared_ptr<const void> keepAlive) {
  shard_.owner().check();
  auto target = resolveStream(context, stream);
  if (!target) return stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  if (destination.empty()) return CUDA_SUCCESS;
  CUresult queued =
      enqueueOn(*target, backend::CopyDeviceToHost{destination.data(), source, destination.size()});
  if (queued != CUDA_SUCCESS) return queued;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<CUresult>();
  auto fulfiller =
      std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<CUresult>>>(kj::mv(paf.fulfiller));
  auto work = std::make_shared<QueuedWork>(stats_, 0);
  CUresult callback =
      target->stream->addCallback([fulfiller, work, keepAlive = std::move(keepAlive)](
                                      CUresult status) { (*fulfiller)->fulfill(kj::mv(status)); });
  if (callback != CUDA_SUCCESS) return callback;
  return noteCompletion(context, stream, *workCounters(*target).first, kj::mv(paf.promise));
}

// ---------------------------------------------------------------------------------------------
// Modules and kernels

kj::Promise<backend::Result<Handle>> GpuClient::loadModule(Handle context,
                                                           std::vector<std::byte> image) {
  using Loaded = backend::Result<Handle>;
  shard_.owner().check();
  if (contexts_.count(context) == 0) return Loaded(CUDA_ERROR_INVALID_CONTEXT);
  if (image.empty()) return Loaded(CUDA_ERROR_INVALID_IMAGE);
  auto hold = holdObject(TenantObject::kModule);
  if (!hold) return Loaded(CUDA_ERROR_OUT_OF_MEMORY);
  return shard_.loadModule(std::move(image), stats_->addressSpace)
      .then([this, context, hold = std::move(*hold)](
                backend::Result<GpuShard::LoadedModule> loaded) mutable -> Loaded {
        if (!loaded.ok()) return loaded.code();
        // Another thread of the client may have destroyed the context meanwhile.
        if (contexts_.count(context) == 0) return CUDA_ERROR_INVALID_CONTEXT;
        // Module memory counts against the tenant like an allocation; its size is only known
        // once the module is loaded, so an over-limit module is unloaded again at once.
        auto charge = MemoryCharge::take(ledger(), loaded.value()->deviceBytes(),
                                         MemoryCharge::Kind::kModule);
        if (!charge) return CUDA_ERROR_OUT_OF_MEMORY;
        if (CUresult heap = provideDeviceHeap(*loaded.value()); heap != CUDA_SUCCESS) return heap;
        Handle handle = newHandle(HandleKind::kModule);
        Module& module = modules_[handle];
        module.context = context;
        module.module = std::move(loaded).value();
        module.charge.emplace(std::move(*charge));
        module.hold = std::move(hold);
        return handle;
      });
}

kj::Promise<CUresult> GpuClient::unloadModule(Handle module) {
  shard_.owner().check();
  if (modules_.count(module) == 0) return CUDA_ERROR_INVALID_HANDLE;
  // Kernels keep their module's code alive themselves, but a queued copy or memset into one of
  // its variables does not: the memory is given back only once the client's work has drained.
  return drainStreams(0).then([this, module](CUresult) {
    auto found = modules_.find(module);
    if (found == modules_.end()) return CUDA_ERROR_INVALID_HANDLE;  // unloaded meanwhile
    std::erase_if(functions_, [&](const auto& entry) { return entry.second.module == module; });
    forgetModuleVariables(found->second);
    modules_.erase(found);  // and its charge
    return CUDA_SUCCESS;
  });
}

void GpuClient::forgetModuleVariables(const Module& module) {
  for (const backend::GlobalVariable& variable : module.variablesLookedUp) {
    moduleVariables_.erase(variable.address);
  }
}

backend::Result<backend::GlobalVariable> GpuClient::global(Handle module, const std::string& name) {
  shard_.owner().check();
  auto found = modules_.find(module);
  if (found == modules_.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto variable = found->second.module->global(name);
  if (!variable.ok()) return variable.code();
  if (variable.value().bytes > 0 && moduleVariables_.count(variable.value().address) == 0) {
    moduleVariables_.emplace(variable.value().address, variable.value().bytes);
    found->second.variablesLookedUp.push_back(variable.value());
  }
  return variable.value();
}

CUresult GpuClient::placeManagedVariable(Handle module, const std::string& name,
                                         CUdeviceptr address, bool keepValue) {
  shard_.owner().check();
  auto found = modules_.find(module);
  if (found == modules_.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto variable = found->second.module->global(name);
  if (!variable.ok() || !variable.value().managed) return CUDA_ERROR_NOT_FOUND;
  if (!shard_.hostRangeIsMapped(stats_->addressSpace, address, variable.value().bytes)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return found->second.module->placeManagedVariable(name, address, keepValue);
}

MemoryLedger GpuClient::ledger() {
  shard_.owner().check();
  return MemoryLedger{stats_, shard_.index(), memoryUsed_, &shard_.memoryCount()};
}

backend::Result<FunctionHandle> GpuClient::function(Handle module, const std::string& name) {
  shard_.owner().check();
  auto found = modules_.find(module);
  if (found == modules_.end()) return CUDA_ERROR_INVALID_HANDLE;
  Module& state = found->second;
  if (auto known = state.functionsByName.find(name); known != state.functionsByName.end()) {
    return FunctionHandle{known->second, functions_.at(known->second).function->info()};
  }
  auto resolved = state.module->function(name);
  if (!resolved.ok()) return resolved.code();
  Handle handle = newHandle(HandleKind::kFunction);
  functions_[handle] = Function{state.context, module, resolved.value()};
  state.functionsByName[name] = handle;
  return FunctionHandle{handle, resolved.value()->info()};
}

CUresult GpuClient::launchKernel(Handle context, Handle function,
                                 const backend::LaunchConfig& config, Handle stream,
                                 std::span<const std::byte> parameters) {
  shard_.owner().check();
  auto found = functions_.find(function);
  if (found == functions_.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto target = resolveStream(context, stream);
  if (!target) return stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  // A kernel runs in the context its module was loaded into.
  if (target->context != found->second.context) return CUDA_ERROR_INVALID_HANDLE;
  if (parameters.size() != found->second.function->info().parameterBytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult rc = orderForLegacyStream(*target); rc != CUDA_SUCCESS) return rc;
  // The backend copies the parameters and keeps them until the kernel has run.
  auto work = std::make_shared<QueuedWork>(stats_, parameters.size());
  GpuShard* shard = &shard_;
  pid_t pid = stats_->identity.pid;
  CUresult launched =
      target->stream->launch(*found->second.function, config, parameters,
                             [work, shard, pid](CUresult status, std::uint64_t gpuNanoseconds) {
                               const std::shared_ptr<ClientStats>& stats = work->stats();
                               stats->gpuTimeNs += gpuNanoseconds;
                               stats->tenant->gpuTimeNs += gpuNanoseconds;
                               shard->noteKernelStatus(status, pid);
                             });
  if (launched == CUDA_SUCCESS) {
    noteKernelTouches(*target);
    ++stats_->kernelsLaunched;
    ++stats_->tenant->kernelsLaunched;
  }
  return launched;
}

}  // namespace gpuproxy::server
