// Host work on streams (host functions and callbacks), and stream and context ids. Capture and
// its queries are graphs.cpp's.

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "client/stub/api_support.hpp"
#include "client/stub/data_plane.hpp"
#include "client/stub/export.hpp"
#include "client/stub/host_functions.hpp"
#include "client/stub/stream_capture.hpp"

using gpuproxy::stub::currentContext;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::resolveStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamTarget;

namespace ring = gpuproxy::protocol::ring;

namespace {

// The process's host-function thread, made at the first host function that goes through the data
// plane (there is one data plane per process, for its whole life).
gpuproxy::stub::HostFunctions& hostFunctionsOf(gpuproxy::stub::DataPlane& dataPlane) {
  static gpuproxy::stub::HostFunctions* functions = new gpuproxy::stub::HostFunctions(dataPlane);
  return *functions;
}

// A host function as it runs when due: a stream that failed does not run later host functions;
// the failure is reported at the stream's next synchronisation (or by the call itself, when it
// waited for the stream).
auto hostFunctionRun(CUhostFn fn, void* userData) {
  return [fn, userData](CUresult drained) {
    if (drained != CUDA_SUCCESS) return drained;
    fn(userData);
    return CUDA_SUCCESS;
  };
}

// Host work on a stream runs after the stream's earlier work and before its later work. With the
// data plane the call returns at once and `run(status)` is called on the stub's host-function
// thread when due, while gpuproxyd holds the stream's later work (host_functions.hpp). Without it
// (GPUPROXY_TRANSPORT=rpc, whose calls carry no asynchronous answers) the stub does it
// synchronously: it waits for the stream to drain (like cuStreamSynchronize), runs the function
// on the calling thread and only then returns, so nothing queued later can start before it; CUDA
// allows an enqueueing call to complete early, and the stream order is kept exactly. Either way
// the function may not call CUDA, as with the driver. `run` gets the stream's status; in the
// synchronous case the call returns what `run` returns.
template <typename Run>
CUresult runOn(Runtime& runtime, const StreamTarget& target, Run run) {
  if (gpuproxy::stub::DataPlane* dataPlane = runtime.dataPlane()) {
    return hostFunctionsOf(*dataPlane)
        .launch(target.context, target.stream, [run](CUresult status) { run(status); });
  }
  const CUresult drained = runtime.commands().synchronize(
      target.context, ring::SynchronizeKind::kStream, target.stream, /*query=*/false);
  return run(drained);
}

template <typename Run>
CUresult runOnStream(const char* entryPoint, CUstream hStream, NullStream nullStream, Run run) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    return runOn(runtime, target, run);
  });
}

// The answer to host work on a capturing stream: a host function becomes a node of the graph, a
// callback is refused (CUDA does not capture cuStreamAddCallback); nullopt when the stream does
// not capture.
std::optional<CUresult> captured(const char* entryPoint, CUstream hStream, NullStream nullStream,
                                 CUhostFn fn, void* userData) {
  std::optional<CUresult> answer;
  const CUresult checked = guarded(entryPoint, [&](Runtime& runtime) {
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    gpuproxy::stub::CapturingSink& sink = runtime.capturing();
    answer = fn != nullptr ? sink.captureHostFunction(target.stream, fn, userData)
                           : sink.captures().unsupported(target.stream);
    return CUDA_SUCCESS;
  });
  if (checked != CUDA_SUCCESS) return checked;
  return answer;
}

CUresult launchHostFunc(const char* entryPoint, CUstream hStream, CUhostFn fn, void* userData,
                        NullStream nullStream) {
  if (fn == nullptr) {
    return guarded(entryPoint, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  if (std::optional<CUresult> answer = captured(entryPoint, hStream, nullStream, fn, userData)) {
    return *answer;
  }
  return runOnStream(entryPoint, hStream, nullStream, hostFunctionRun(fn, userData));
}

CUresult addCallback(const char* entryPoint, CUstream hStream, CUstreamCallback callback,
                     void* userData, unsigned flags, NullStream nullStream) {
  if (callback == nullptr || flags != 0) {
    return guarded(entryPoint, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  if (std::optional<CUresult> answer =
          captured(entryPoint, hStream, nullStream, nullptr, nullptr)) {
    return *answer;
  }
  return runOnStream(entryPoint, hStream, nullStream,
                     [hStream, callback, userData](CUresult drained) {
                       // A callback runs whatever happened and is told the stream's status; when
                       // the call itself waited, the error is also returned, since this call is
                       // where the stub learnt of it.
                       callback(hStream, drained, userData);
                       return drained;
                     });
}

// Stream ids: a stream's daemon handle, which the daemon never reuses within a session. The
// legacy NULL stream, which has no handle, takes its context's.
CUresult streamId(const char* entryPoint, CUstream hStream, unsigned long long* id,
                  NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
    StreamTarget target;
    if (CUresult resolved = resolveStream(runtime, hStream, nullStream, target);
        resolved != CUDA_SUCCESS) {
      return resolved;
    }
    *id = target.stream != 0 ? target.stream : target.context;
    return CUDA_SUCCESS;
  });
}

}  // namespace

namespace gpuproxy::stub {

CUresult launchHostFunction(const StreamTarget& target, CUhostFn function, void* userData) {
  Runtime* runtime = Runtime::instance();
  if (runtime == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return runOn(*runtime, target, hostFunctionRun(function, userData));
}

}  // namespace gpuproxy::stub

GPUPROXY_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  return launchHostFunc(__func__, hStream, fn, userData, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  return launchHostFunc(__func__, hStream, fn, userData, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback,
                                             void* userData, unsigned int flags) {
  return addCallback(__func__, hStream, callback, userData, flags, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback,
                                                  void* userData, unsigned int flags) {
  return addCallback(__func__, hStream, callback, userData, flags, NullStream::kPerThread);
}

GPUPROXY_EXPORT CUresult cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
  return ::streamId(__func__, hStream, streamId, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuStreamGetId_ptsz(CUstream hStream, unsigned long long* streamId) {
  return ::streamId(__func__, hStream, streamId, NullStream::kPerThread);
}

// A context's id: its daemon handle, never reused within the session. NULL asks about the
// current context.
GPUPROXY_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t context = ctx != nullptr ? handleValue(ctx) : currentContext();
    if (context == 0 || !runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    *ctxId = context;
    return CUDA_SUCCESS;
  });
}
