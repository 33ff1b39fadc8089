// Streams and events. CUstream and CUevent values are the daemon's handles; the stub remembers
// which context each belongs to because the protocol orders work by (context, stream).

#include <cuda.h>

#include <algorithm>
#include <span>

#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "client/stub/stream_capture.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::ContextRecord;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::DeviceRecord;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamHints;
using gpuproxy::stub::StreamRecord;
using gpuproxy::stub::StreamTarget;
using gpuproxy::stub::toHandle;
using gpuproxy::stub::toResult;

namespace ring = gpuproxy::protocol::ring;

namespace {

struct HandleReply {
  CUresult result;
  std::uint64_t handle;
};

// The reserved stream values (NULL, legacy, per-thread) name no stream that can be destroyed.
bool isReservedStream(std::uint64_t stream) {
  return stream == 0 || stream == handleValue(CU_STREAM_LEGACY) ||
         stream == handleValue(CU_STREAM_PER_THREAD);
}

CUresult createStream(const char* entryPoint, CUstream* phStream, unsigned flags, int priority) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    HandleReply reply = runtime.call([&](Session::Client& session) {
      auto request = session.createStreamRequest();
      request.setContext(context);
      request.setFlags(flags);
      request.setPriority(priority);
      return request.send().then([](auto response) {
        return HandleReply{toResult(response.getResult()), response.getStream()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    // The driver keeps a requested priority clamped to the device's range (cuStreamGetPriority
    // answers that); the daemon places the stream within its tenant's band of that range.
    std::optional<ContextRecord> record = runtime.context(context);
    const DeviceRecord* device =
        record ? runtime.device(static_cast<CUdevice>(record->device)) : nullptr;
    runtime.addStream(
        reply.handle,
        StreamRecord{context, flags, device != nullptr ? device->clampStreamPriority(priority) : 0,
                     StreamHints{}});
    *phStream = toHandle<CUstream>(reply.handle);
    return CUDA_SUCCESS;
  });
}

// What cuStreamGetPriority/Flags/Ctx report. The reserved handles (NULL, legacy, per-thread) are
// the current context's default streams: no flags, the default priority.
CUresult describeStream(Runtime& runtime, CUstream hStream, StreamRecord& out) {
  const std::uint64_t value = handleValue(hStream);
  if (isReservedStream(value)) {
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    std::optional<ContextRecord> record = runtime.context(context);
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    out = StreamRecord{context, 0, 0, record->defaultStreamHints};
    return CUDA_SUCCESS;
  }
  std::optional<StreamRecord> record = runtime.stream(value);
  if (!record) return CUDA_ERROR_INVALID_HANDLE;
  out = *record;
  return CUDA_SUCCESS;
}

template <typename T, typename Field>
CUresult streamProperty(const char* entryPoint, CUstream hStream, T* result, Field&& field) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (result == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamRecord record;
    if (CUresult described = describeStream(runtime, hStream, record); described != CUDA_SUCCESS) {
      return described;
    }
    *result = field(record);
    return CUDA_SUCCESS;
  });
}

CUresult streamPriority(const char* entryPoint, CUstream hStream, int* priority) {
  return streamProperty(entryPoint, hStream, priority,
                        [](const StreamRecord& record) { return record.priority; });
}

CUresult streamFlags(const char* entryPoint, CUstream hStream, unsigned* flags) {
  return streamProperty(entryPoint, hStream, flags,
                        [](const StreamRecord& record) { return record.flags; });
}

CUresult streamContext(const char* entryPoint, CUstream hStream, CUcontext* context) {
  return streamProperty(entryPoint, hStream, context, [](const StreamRecord& record) {
    return toHandle<CUcontext>(record.context);
  });
}

CUresult streamDevice(const char* entryPoint, CUstream hStream, CUdevice* device) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamRecord record;
    if (CUresult described = describeStream(runtime, hStream, record); described != CUDA_SUCCESS) {
      return described;
    }
    std::optional<ContextRecord> context = runtime.context(record.context);
    if (!context) return CUDA_ERROR_INVALID_CONTEXT;
    *device = static_cast<CUdevice>(context->device);
    return CUDA_SUCCESS;
  });
}

CUresult destroyStream(const char* entryPoint, CUstream hStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const std::uint64_t stream = handleValue(hStream);
    if (isReservedStream(stream) || !runtime.streamContext(stream)) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.destroyStreamRequest();
      request.setStream(stream);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result == CUDA_SUCCESS) {
      runtime.forgetStream(stream);
      runtime.capturing().captures().streamGone(stream);
    }
    return result;
  });
}

// cuStreamSynchronize (`query` false) and cuStreamQuery.
CUresult synchronizeStream(const char* entryPoint, CUstream hStream, NullStream nullStream,
                           bool query) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    return runtime.commands().synchronize(target.context, ring::SynchronizeKind::kStream,
                                          target.stream, query);
  });
}

CUresult streamWaitEvent(const char* entryPoint, CUstream hStream, CUevent hEvent, unsigned flags,
                         NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const std::uint64_t event = handleValue(hEvent);
    std::optional<std::uint64_t> eventContext =
        event != 0 ? runtime.eventContext(event) : std::nullopt;
    if (!eventContext) return CUDA_ERROR_INVALID_HANDLE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    // What the daemon would answer, answered here before the record goes out.
    if (flags != CU_EVENT_WAIT_DEFAULT && flags != CU_EVENT_WAIT_EXTERNAL) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // The event may be of another context, on this device or another (the daemon holds the
    // stream until the event's GPU is done with the record).
    bool otherDevice = false;
    if (*eventContext != target.context) {
      const std::optional<ContextRecord> eventsContext = runtime.context(*eventContext);
      if (!eventsContext) return CUDA_ERROR_INVALID_HANDLE;
      const std::optional<ContextRecord> streamContext = runtime.context(target.context);
      otherDevice = streamContext && streamContext->device != eventsContext->device;
    }
    // CU_EVENT_WAIT_EXTERNAL matters only in a stream capture, where the wait becomes an event wait
    // node of the graph (a wait at each of its launches for the event's latest record then)
    // instead of a dependency on what the capture recorded; elsewhere it is a wait like any other.
    if (flags == CU_EVENT_WAIT_EXTERNAL) {
      if (std::optional<CUresult> captured = runtime.capturing().captureEventNode(
              target.stream, gpuproxy::stub::GraphNode::Kind::kEventWait, hEvent)) {
        return *captured;
      }
    }
    // An event of another device: a record for each device, so that each acts on its own GPU
    // (protocol/RING_FORMAT.md, HoldForEvent). A capturing stream keeps the wait as one (a
    // dependency, or a node its launches send through here again).
    if (otherDevice && !runtime.capturing().captures().capturing(target.stream)) {
      const std::uint64_t token = runtime.newWaitToken();
      ring::Command hold{ring::HoldForEvent{0, target.context, target.stream, token}};
      if (CUresult held = runtime.commands().enqueue(hold); held != CUDA_SUCCESS) return held;
      ring::Command letGo{
          ring::LetGoAfterEvent{0, *eventContext, event, token, target.context, target.stream}};
      return runtime.commands().enqueue(letGo);
    }
    ring::Command command{ring::StreamWaitEvent{}};
    auto& wait = std::get<ring::StreamWaitEvent>(command);
    wait.context = target.context;
    wait.stream = target.stream;
    wait.event = event;
    wait.flags = CU_EVENT_WAIT_DEFAULT;
    return runtime.commands().enqueue(command);
  });
}

}  // namespace

namespace gpuproxy::stub {

CUresult prepareEventRecord(Runtime& runtime, CUevent hEvent, const StreamTarget& target,
                            unsigned flags, protocol::ring::EventRecord& record) {
  if (flags != CU_EVENT_RECORD_DEFAULT && flags != CU_EVENT_RECORD_EXTERNAL) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t event = handleValue(hEvent);
  std::optional<std::uint64_t> eventContext =
      event != 0 ? runtime.eventContext(event) : std::nullopt;
  if (!eventContext) return CUDA_ERROR_INVALID_HANDLE;
  // The NULL stream of the event's own context, as the daemon reads stream 0 on this call.
  record.context = target.stream == 0 ? *eventContext : target.context;
  if (record.context != *eventContext) return CUDA_ERROR_INVALID_HANDLE;
  record.event = event;
  record.stream = target.stream;
  return CUDA_SUCCESS;
}

CUresult submitEventRecord(Runtime& runtime, const protocol::ring::EventRecord& record) {
  ring::Command command{record};
  const CUresult submitted = runtime.commands().enqueue(command);
  if (submitted == CUDA_SUCCESS) runtime.commands().eventRecorded(record.event, record.stream);
  return submitted;
}

}  // namespace gpuproxy::stub

namespace {

// cuEventRecord, and cuEventRecordWithFlags with `flags`.
CUresult recordEvent(const char* entryPoint, CUevent hEvent, CUstream hStream,
                     NullStream nullStream, unsigned flags = CU_EVENT_RECORD_DEFAULT) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    ring::EventRecord record;
    if (CUresult prepared =
            gpuproxy::stub::prepareEventRecord(runtime, hEvent, target, flags, record);
        prepared != CUDA_SUCCESS) {
      return prepared;
    }
    // CU_EVENT_RECORD_EXTERNAL matters only in a stream capture, where the record becomes an event
    // record node of the graph (recorded at each of its launches) instead of a capture's join
    // point; elsewhere it is a record like any other.
    if (flags == CU_EVENT_RECORD_EXTERNAL) {
      if (std::optional<CUresult> captured = runtime.capturing().captureEventNode(
              target.stream, gpuproxy::stub::GraphNode::Kind::kEventRecord, hEvent)) {
        return *captured;
      }
    }
    return gpuproxy::stub::submitEventRecord(runtime, record);
  });
}

// cuEventSynchronize (`query` false) and cuEventQuery.
CUresult synchronizeEvent(const char* entryPoint, CUevent hEvent, bool query) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const std::uint64_t event = handleValue(hEvent);
    std::optional<std::uint64_t> context = event != 0 ? runtime.eventContext(event) : std::nullopt;
    if (!context) return CUDA_ERROR_INVALID_HANDLE;
    return runtime.commands().synchronize(*context, ring::SynchronizeKind::kEvent, event, query);
  });
}

CUresult destroyEvent(const char* entryPoint, CUevent hEvent) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const std::uint64_t event = handleValue(hEvent);
    if (event == 0 || !runtime.eventContext(event)) return CUDA_ERROR_INVALID_HANDLE;
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.destroyEventRequest();
      request.setEvent(event);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result == CUDA_SUCCESS) {
      runtime.forgetEvent(event);
      runtime.commands().eventDestroyed(event);
    }
    return result;
  });
}

CUresult elapsedTime(const char* entryPoint, float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t start = handleValue(hStart);
    const std::uint64_t end = handleValue(hEnd);
    if (start == 0 || end == 0 || !runtime.eventContext(start) || !runtime.eventContext(end)) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    struct Reply {
      CUresult result;
      float milliseconds;
    };
    Reply reply = runtime.call([&](Session::Client& session) {
      auto request = session.eventElapsedTimeRequest();
      request.setStart(start);
      request.setEnd(end);
      return request.send().then([](auto response) {
        return Reply{toResult(response.getResult()), response.getMilliseconds()};
      });
    });
    if (reply.result == CUDA_SUCCESS) *pMilliseconds = reply.milliseconds;
    return reply.result;
  });
}

}  // namespace

// ---- streams ---------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return createStream(__func__, phStream, Flags, 0);
}

GPUPROXY_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                    int priority) {
  return createStream(__func__, phStream, flags, priority);
}

// ---- stream attributes ---------------------------------------------------------------------

namespace {

// The launch attributes CUDA defines for streams; all but the priority are hints that change no
// result (StreamHints), kept and answered. The priority is the one the stream was created with.
CUresult setStreamAttribute(const char* entryPoint, CUstream hStream, CUstreamAttrID attr,
                            const CUstreamAttrValue* value) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamRecord record;
    if (CUresult described = describeStream(runtime, hStream, record); described != CUDA_SUCCESS) {
      return described;
    }
    std::optional<ContextRecord> context = runtime.context(record.context);
    const DeviceRecord* device =
        context ? runtime.device(static_cast<CUdevice>(context->device)) : nullptr;
    auto deviceLimit = [&](CUdevice_attribute attribute, int fallback) {
      return device != nullptr ? device->attribute(attribute).value_or(fallback) : fallback;
    };
    StreamHints hints = record.hints;
    switch (gpuproxy::stub::enumValue(attr)) {
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW: {
        const CUaccessPolicyWindow& window = value->accessPolicyWindow;
        const int hit = gpuproxy::stub::enumValue(window.hitProp);
        const int miss = gpuproxy::stub::enumValue(window.missProp);
        const auto largest = static_cast<std::size_t>(
            std::max(deviceLimit(CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, 0), 0));
        if (!(window.hitRatio >= 0.0f && window.hitRatio <= 1.0f) || window.num_bytes > largest ||
            hit < CU_ACCESS_PROPERTY_NORMAL || hit > CU_ACCESS_PROPERTY_PERSISTING ||
            miss < CU_ACCESS_PROPERTY_NORMAL || miss > CU_ACCESS_PROPERTY_STREAMING) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        hints.accessPolicyWindow = window;
        break;
      }
      case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY: {
        const int policy = gpuproxy::stub::enumValue(value->syncPolicy);
        if (policy < CU_SYNC_POLICY_AUTO || policy > CU_SYNC_POLICY_BLOCKING_SYNC) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        hints.synchronizationPolicy = policy;
        break;
      }
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN: {
        const int domain = gpuproxy::stub::enumValue(value->memSyncDomain);
        if (domain != CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT &&
            domain != CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        hints.memSyncDomain = domain;
        break;
      }
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: {
        const int domains = deviceLimit(CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, 1);
        if (value->memSyncDomainMap.default_ >= domains ||
            value->memSyncDomainMap.remote >= domains) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        hints.memSyncDomainMap = value->memSyncDomainMap;
        break;
      }
      case CU_LAUNCH_ATTRIBUTE_PRIORITY: {
        // The daemon placed the stream at its priority when it made it.
        const int asked = device != nullptr ? device->clampStreamPriority(value->priority) : 0;
        if (asked == record.priority) return CUDA_SUCCESS;
        GPUPROXY_STUB_LOG(kWarn, "%s: a stream's priority cannot change after it is created",
                          entryPoint);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      default:
        return CUDA_ERROR_INVALID_VALUE;  // not an attribute of streams
    }
    const std::uint64_t stream = handleValue(hStream);
    if (isReservedStream(stream)) {
      runtime.updateContext(record.context,
                            [&](ContextRecord& owner) { owner.defaultStreamHints = hints; });
    } else {
      runtime.updateStream(stream, [&](StreamRecord& owner) { owner.hints = hints; });
    }
    return CUDA_SUCCESS;
  });
}

CUresult getStreamAttribute(const char* entryPoint, CUstream hStream, CUstreamAttrID attr,
                            CUstreamAttrValue* value) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamRecord record;
    if (CUresult described = describeStream(runtime, hStream, record); described != CUDA_SUCCESS) {
      return described;
    }
    switch (gpuproxy::stub::enumValue(attr)) {
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
        value->accessPolicyWindow = record.hints.accessPolicyWindow;
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
        value->syncPolicy =
            static_cast<CUsynchronizationPolicy>(record.hints.synchronizationPolicy);
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
        value->memSyncDomain = static_cast<CUlaunchMemSyncDomain>(record.hints.memSyncDomain);
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        value->memSyncDomainMap = record.hints.memSyncDomainMap;
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        value->priority = record.priority;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

// Every attribute of `src` that can be set is set on `dst` (the priority stays `dst`'s own).
CUresult copyStreamAttributes(const char* entryPoint, CUstream dst, CUstream src) {
  for (const CUstreamAttrID id :
       {CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
        CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP}) {
    CUstreamAttrValue value{};
    if (CUresult got = getStreamAttribute(entryPoint, src, id, &value); got != CUDA_SUCCESS) {
      return got;
    }
    if (CUresult set = setStreamAttribute(entryPoint, dst, id, &value); set != CUDA_SUCCESS) {
      return set;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace

GPUPROXY_EXPORT CUresult cuStreamSetAttribute(CUstream hStream, CUstreamAttrID attr,
                                              const CUstreamAttrValue* value) {
  return setStreamAttribute(__func__, hStream, attr, value);
}

GPUPROXY_EXPORT CUresult cuStreamSetAttribute_ptsz(CUstream hStream, CUstreamAttrID attr,
                                                   const CUstreamAttrValue* value) {
  return setStreamAttribute(__func__, hStream, attr, value);
}

GPUPROXY_EXPORT CUresult cuStreamGetAttribute(CUstream hStream, CUstreamAttrID attr,
                                              CUstreamAttrValue* value_out) {
  return getStreamAttribute(__func__, hStream, attr, value_out);
}

GPUPROXY_EXPORT CUresult cuStreamGetAttribute_ptsz(CUstream hStream, CUstreamAttrID attr,
                                                   CUstreamAttrValue* value_out) {
  return getStreamAttribute(__func__, hStream, attr, value_out);
}

GPUPROXY_EXPORT CUresult cuStreamCopyAttributes(CUstream dst, CUstream src) {
  return copyStreamAttributes(__func__, dst, src);
}

GPUPROXY_EXPORT CUresult cuStreamCopyAttributes_ptsz(CUstream dst, CUstream src) {
  return copyStreamAttributes(__func__, dst, src);
}

GPUPROXY_EXPORT CUresult cuStreamGetPriority(CUstream hStream, int* priority) {
  return streamPriority(__func__, hStream, priority);
}

GPUPROXY_EXPORT CUresult cuStreamGetPriority_ptsz(CUstream hStream, int* priority) {
  return streamPriority(__func__, hStream, priority);
}

GPUPROXY_EXPORT CUresult cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  return streamFlags(__func__, hStream, flags);
}

GPUPROXY_EXPORT CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) {
  return streamFlags(__func__, hStream, flags);
}

GPUPROXY_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return streamContext(__func__, hStream, pctx);
}

GPUPROXY_EXPORT CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  return streamContext(__func__, hStream, pctx);
}

// No stream here belongs to a green context (cuGreenCtxCreate is not supported): pGreenCtx is
// always null.
GPUPROXY_EXPORT CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx,
                                           CUgreenCtx* pGreenCtx) {
  if (pGreenCtx == nullptr) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  const CUresult found = streamContext(__func__, hStream, pCtx);
  if (found == CUDA_SUCCESS) *pGreenCtx = nullptr;
  return found;
}

GPUPROXY_EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext* pCtx,
                                                CUgreenCtx* pGreenCtx) {
  return cuStreamGetCtx_v2(hStream, pCtx, pGreenCtx);
}

GPUPROXY_EXPORT CUresult cuStreamGetDevice(CUstream hStream, CUdevice* device) {
  return streamDevice(__func__, hStream, device);
}

GPUPROXY_EXPORT CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice* device) {
  return streamDevice(__func__, hStream, device);
}

GPUPROXY_EXPORT CUresult cuStreamDestroy(CUstream hStream) {
  return destroyStream(__func__, hStream);
}

GPUPROXY_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  return destroyStream(__func__, hStream);
}

GPUPROXY_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  return synchronizeStream(__func__, hStream, NullStream::kLegacy, /*query=*/false);
}

GPUPROXY_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  return synchronizeStream(__func__, hStream, NullStream::kPerThread, /*query=*/false);
}

GPUPROXY_EXPORT CUresult cuStreamQuery(CUstream hStream) {
  return synchronizeStream(__func__, hStream, NullStream::kLegacy, /*query=*/true);
}

GPUPROXY_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) {
  return synchronizeStream(__func__, hStream, NullStream::kPerThread, /*query=*/true);
}

GPUPROXY_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return streamWaitEvent(__func__, hStream, hEvent, Flags, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent,
                                                unsigned int Flags) {
  return streamWaitEvent(__func__, hStream, hEvent, Flags, NullStream::kPerThread);
}

// ---- events ----------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned kKnownFlags =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if ((Flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
    // As in CUDA: an interprocess event must not record timing.
    if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    HandleReply reply = runtime.call([&](Session::Client& session) {
      auto request = session.createEventRequest();
      request.setContext(context);
      request.setFlags(Flags);
      return request.send().then([](auto response) {
        return HandleReply{toResult(response.getResult()), response.getEvent()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    runtime.addEvent(reply.handle, context);
    *phEvent = toHandle<CUevent>(reply.handle);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  return recordEvent(__func__, hEvent, hStream, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return recordEvent(__func__, hEvent, hStream, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream,
                                                unsigned int flags) {
  return recordEvent(__func__, hEvent, hStream, NullStream::kLegacy, flags);
}

GPUPROXY_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream,
                                                     unsigned int flags) {
  return recordEvent(__func__, hEvent, hStream, NullStream::kPerThread, flags);
}

GPUPROXY_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  return synchronizeEvent(__func__, hEvent, /*query=*/false);
}

GPUPROXY_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  return synchronizeEvent(__func__, hEvent, /*query=*/true);
}

GPUPROXY_EXPORT CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return elapsedTime(__func__, pMilliseconds, hStart, hEnd);
}

GPUPROXY_EXPORT CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return elapsedTime(__func__, pMilliseconds, hStart, hEnd);
}

GPUPROXY_EXPORT CUresult cuEventDestroy(CUevent hEvent) {
  return destroyEvent(__func__, hEvent);
}

GPUPROXY_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  return destroyEvent(__func__, hEvent);
}
