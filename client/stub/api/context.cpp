// Contexts: the daemon owns them (and the primary contexts' reference counts); the stub keeps
// CUDA's per-thread current-context stack and remembers which device each context is on.

#include <cuda.h>
#include <cudaProfiler.h>

#include <algorithm>
#include <cstddef>
#include <optional>

#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"
#include "protocol/limits.hpp"

using gpuproxy::protocol::Session;
using gpuproxy::stub::ContextRecord;
using gpuproxy::stub::contextStack;
using gpuproxy::stub::currentContext;
using gpuproxy::stub::DeviceRecord;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::toHandle;
using gpuproxy::stub::toResult;

namespace {

// What cuCtxGetApiVersion reports for every context: the driver API generation of the _v2 entry
// points, which is what the real driver reports for contexts made through them.
constexpr unsigned kContextApiVersion = 3020;

struct ContextReply {
  CUresult result;
  std::uint64_t context;
};

CUresult createContext(const char* entryPoint, CUcontext* pctx, unsigned flags, CUdevice dev) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    ContextReply reply = runtime.call([&](Session::Client& session) {
      auto request = session.createContextRequest();
      request.setDevice(static_cast<std::uint32_t>(dev));
      request.setFlags(flags);
      return request.send().then([](auto response) {
        return ContextReply{toResult(response.getResult()), response.getContext()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    runtime.addContext(reply.context, ContextRecord{static_cast<std::uint32_t>(dev), flags, false,
                                                    runtime.newGeneration()});
    // A new context becomes current to the calling thread, as in CUDA.
    contextStack().push_back(reply.context);
    *pctx = toHandle<CUcontext>(reply.context);
    return CUDA_SUCCESS;
  });
}

CUresult destroyContext(const char* entryPoint, CUcontext ctx) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const std::uint64_t context = handleValue(ctx);
    if (context == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.destroyContextRequest();
      request.setContext(context);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result != CUDA_SUCCESS) return result;
    runtime.forgetContextResources(context, /*destroyed=*/true);
    runtime.commands().contextGone(context);
    gpuproxy::stub::releaseContextLocalStorage(context);
    gpuproxy::stub::forgetPerThreadStream(context);
    auto& stack = contextStack();
    if (!stack.empty() && stack.back() == context) stack.pop_back();
    return CUDA_SUCCESS;
  });
}

CUresult pushContext(const char* entryPoint, CUcontext ctx) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    const std::uint64_t context = handleValue(ctx);
    if (context == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    contextStack().push_back(context);
    return CUDA_SUCCESS;
  });
}

CUresult popContext(const char* entryPoint, CUcontext* pctx) {
  return guarded(entryPoint, [&](Runtime&) {
    auto& stack = contextStack();
    if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    const std::uint64_t context = stack.back();
    stack.pop_back();
    if (pctx != nullptr) *pctx = toHandle<CUcontext>(context);
    return CUDA_SUCCESS;
  });
}

// The primary context of `device` lost its resources (reset, or released for the last time).
void primaryContextWiped(Runtime& runtime, CUdevice dev) {
  if (auto context = runtime.primaryContext(static_cast<std::uint32_t>(dev))) {
    runtime.forgetContextResources(*context, /*destroyed=*/false);
    runtime.commands().contextGone(*context);
    gpuproxy::stub::releaseContextLocalStorage(*context);
  }
}

struct PrimaryState {
  CUresult result;
  unsigned flags;
  bool active;
};

PrimaryState primaryState(Runtime& runtime, CUdevice dev) {
  return runtime.call([&](Session::Client& session) {
    auto request = session.getPrimaryContextStateRequest();
    request.setDevice(static_cast<std::uint32_t>(dev));
    return request.send().then([](auto response) {
      return PrimaryState{toResult(response.getResult()), response.getFlags(),
                          response.getActive()};
    });
  });
}

CUresult releasePrimary(const char* entryPoint, CUdevice dev) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.releasePrimaryContextRequest();
      request.setDevice(static_cast<std::uint32_t>(dev));
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result != CUDA_SUCCESS) return result;
    // The last release destroys the primary context's resources; only the daemon keeps the count.
    PrimaryState state = primaryState(runtime, dev);
    if (state.result == CUDA_SUCCESS && !state.active) primaryContextWiped(runtime, dev);
    return CUDA_SUCCESS;
  });
}

CUresult resetPrimary(const char* entryPoint, CUdevice dev) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    CUresult result = runtime.call([&](Session::Client& session) {
      auto request = session.resetPrimaryContextRequest();
      request.setDevice(static_cast<std::uint32_t>(dev));
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
    if (result == CUDA_SUCCESS) primaryContextWiped(runtime, dev);
    return result;
  });
}

CUresult setPrimaryFlags(const char* entryPoint, CUdevice dev, unsigned flags) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    return runtime.call([&](Session::Client& session) {
      auto request = session.setPrimaryContextFlagsRequest();
      request.setDevice(static_cast<std::uint32_t>(dev));
      request.setFlags(flags);
      return request.send().then([](auto response) { return toResult(response.getResult()); });
    });
  });
}

}  // namespace

// ---- primary contexts ------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    ContextReply reply = runtime.call([&](Session::Client& session) {
      auto request = session.retainPrimaryContextRequest();
      request.setDevice(static_cast<std::uint32_t>(dev));
      return request.send().then([](auto response) {
        return ContextReply{toResult(response.getResult()), response.getContext()};
      });
    });
    if (reply.result != CUDA_SUCCESS) return reply.result;
    // Retaining does not make the context current (cudart does that with cuCtxSetCurrent).
    // A handle seen before keeps its generation: its resources are still alive.
    if (!runtime.context(reply.context)) {
      runtime.addContext(reply.context, ContextRecord{static_cast<std::uint32_t>(dev), 0, true,
                                                      runtime.newGeneration()});
    }
    *pctx = toHandle<CUcontext>(reply.context);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return releasePrimary(__func__, dev);
}

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return releasePrimary(__func__, dev);
}

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return resetPrimary(__func__, dev);
}

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return resetPrimary(__func__, dev);
}

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return setPrimaryFlags(__func__, dev, flags);
}

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  return setPrimaryFlags(__func__, dev, flags);
}

GPUPROXY_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags,
                                                    int* active) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    PrimaryState state = primaryState(runtime, dev);
    if (state.result != CUDA_SUCCESS) return state.result;
    *flags = state.flags;
    *active = state.active ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

// ---- created contexts ------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return createContext(__func__, pctx, flags, dev);
}

GPUPROXY_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return createContext(__func__, pctx, flags, dev);
}

GPUPROXY_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray,
                                        int numParams, unsigned int flags, CUdevice dev) {
  if (numParams < 0 || (numParams > 0 && paramsArray == nullptr)) {
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_INVALID_VALUE; });
  }
  if (numParams > 0) {
    GPUPROXY_STUB_LOG(kWarn, "cuCtxCreate_v3: execution affinity is not supported by gpuproxy");
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_NOT_SUPPORTED; });
  }
  return createContext(__func__, pctx, flags, dev);
}

GPUPROXY_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                        unsigned int flags, CUdevice dev) {
  if (ctxCreateParams != nullptr &&
      (ctxCreateParams->numExecAffinityParams != 0 ||
       ctxCreateParams->execAffinityParams != nullptr || ctxCreateParams->cigParams != nullptr)) {
    GPUPROXY_STUB_LOG(kWarn,
                      "cuCtxCreate_v4: execution affinity and CIG contexts are not supported by "
                      "gpuproxy");
    return guarded(__func__, [](Runtime&) { return CUDA_ERROR_NOT_SUPPORTED; });
  }
  return createContext(__func__, pctx, flags, dev);
}

GPUPROXY_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  return destroyContext(__func__, ctx);
}

GPUPROXY_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return destroyContext(__func__, ctx);
}

// ---- the current-context stack ---------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  return guarded(__func__, [&](Runtime&) {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pctx = toHandle<CUcontext>(currentContext());
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  return guarded(__func__, [&](Runtime& runtime) {
    auto& stack = contextStack();
    const std::uint64_t context = handleValue(ctx);
    if (context == 0) {
      // NULL pops the stack (a no-op when it is empty), as CUDA documents.
      if (!stack.empty()) stack.pop_back();
      return CUDA_SUCCESS;
    }
    if (!runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    if (stack.empty()) {
      stack.push_back(context);
    } else {
      stack.back() = context;
    }
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  return pushContext(__func__, ctx);
}

GPUPROXY_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  return pushContext(__func__, ctx);
}

GPUPROXY_EXPORT CUresult cuCtxPopCurrent(CUcontext* pctx) {
  return popContext(__func__, pctx);
}

GPUPROXY_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  return popContext(__func__, pctx);
}

GPUPROXY_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  return cuCtxGetDevice_v2(device, nullptr);
}

// A null context names the calling thread's current one.
GPUPROXY_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t named = handleValue(ctx);
    std::optional<ContextRecord> record = runtime.context(named != 0 ? named : currentContext());
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    *device = static_cast<CUdevice>(record->device);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  return guarded(__func__, [&](Runtime& runtime) {
    std::optional<ContextRecord> record = runtime.context(currentContext());
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    const DeviceRecord* device = runtime.device(static_cast<CUdevice>(record->device));
    if (device == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    // Either pointer may be NULL, as with the driver.
    if (leastPriority != nullptr) *leastPriority = device->leastStreamPriority;
    if (greatestPriority != nullptr) *greatestPriority = device->greatestStreamPriority;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuCtxSynchronize(void) {
  return cuCtxSynchronize_v2(nullptr);
}

// A null context names the calling thread's current one.
GPUPROXY_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  return guarded(__func__, [&](Runtime& runtime) {
    const std::uint64_t context = ctx != nullptr ? handleValue(ctx) : currentContext();
    if (context == 0 || !runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    return runtime.commands().synchronize(
        context, gpuproxy::protocol::ring::SynchronizeKind::kContext, 0, /*query=*/false);
  });
}

GPUPROXY_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t context = ctx != nullptr ? handleValue(ctx) : currentContext();
    if (context == 0 || !runtime.context(context)) return CUDA_ERROR_INVALID_CONTEXT;
    *version = kContextApiVersion;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuCtxGetFlags(unsigned int* flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<ContextRecord> record = runtime.context(currentContext());
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    if (!record->primary) {
      *flags = record->flags;
      return CUDA_SUCCESS;
    }
    // A primary context's flags can change under it (cuDevicePrimaryCtxSetFlags from any thread);
    // the daemon has the current value.
    PrimaryState state = primaryState(runtime, static_cast<CUdevice>(record->device));
    if (state.result != CUDA_SUCCESS) return state.result;
    *flags = state.flags;
    return CUDA_SUCCESS;
  });
}

// ---- limits --------------------------------------------------------------------------------

namespace {

// The driver's defaults, which every context starts with.
std::optional<size_t> defaultLimit(int limit) {
  switch (limit) {
    case CU_LIMIT_STACK_SIZE:
      return gpuproxy::protocol::kDefaultStackBytes;
    case CU_LIMIT_PRINTF_FIFO_SIZE:
      return gpuproxy::protocol::kDefaultPrintfFifoBytes;
    case CU_LIMIT_MALLOC_HEAP_SIZE:
      return gpuproxy::protocol::kDefaultMallocHeapBytes;
    case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:
      return 2;
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
      return 2048;
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
      return 64;
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
      return 0;
    // CUDA-in-graphics contexts, which cuCtxCreate_v4 refuses: no context here is one (libraries
    // such as cuBLAS ask), and the fallback a CIG context would take stays on.
    case CU_LIMIT_CIG_ENABLED:
      return 0;
    case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED:
      return 1;
    default:
      return std::nullopt;
  }
}

}  // namespace

GPUPROXY_EXPORT CUresult cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pvalue == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<ContextRecord> record = runtime.context(currentContext());
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    const int which = gpuproxy::stub::enumValue(limit);
    std::optional<size_t> value = defaultLimit(which);
    if (!value) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (auto set = record->limits.find(which); set != record->limits.end()) value = set->second;
    *pvalue = *value;
    return CUDA_SUCCESS;
  });
}

// The stack, the printf FIFO and the heap are the device's, so the daemon sets them (and may
// refuse: the heap's size is fixed once the heap exists). The rest are kept here: the L2 hints
// are preferences a GPU may ignore, and the device runtime's limits govern launches from kernels,
// which gpuproxy does not run.
GPUPROXY_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  return guarded(__func__, [&](Runtime& runtime) {
    const std::uint64_t context = currentContext();
    std::optional<ContextRecord> record = runtime.context(context);
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    const int which = gpuproxy::stub::enumValue(limit);
    if (!defaultLimit(which)) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (which == CU_LIMIT_CIG_ENABLED) return CUDA_ERROR_INVALID_VALUE;  // it can only be queried
    size_t granted = value;
    switch (which) {
      case CU_LIMIT_STACK_SIZE:
      case CU_LIMIT_PRINTF_FIFO_SIZE:
      case CU_LIMIT_MALLOC_HEAP_SIZE: {
        struct Reply {
          CUresult result;
          std::uint64_t value;
        };
        Reply reply = runtime.call([&](Session::Client& session) {
          auto request = session.setLimitRequest();
          request.setContext(context);
          request.setLimit(static_cast<std::uint32_t>(which));
          request.setValue(value);
          return request.send().then([](auto response) {
            return Reply{toResult(response.getResult()), response.getValue()};
          });
        });
        if (reply.result != CUDA_SUCCESS) return reply.result;
        granted = static_cast<size_t>(reply.value);
        break;
      }
      case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
        // Bytes: 0 to 128, a hint.
        granted = std::min<size_t>(value, 128);
        break;
      case CU_LIMIT_PERSISTING_L2_CACHE_SIZE: {
        // At most what the device can set aside.
        const DeviceRecord* device = runtime.device(static_cast<CUdevice>(record->device));
        const int most =
            device == nullptr
                ? 0
                : device->attribute(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE).value_or(0);
        granted = std::min<size_t>(value, static_cast<size_t>(std::max(most, 0)));
        break;
      }
      default:
        break;
    }
    const bool known =
        runtime.updateContext(context, [&](ContextRecord& kept) { kept.limits[which] = granted; });
    return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  });
}

// ---- hints and tools the driver may ignore -------------------------------------------------
// Preferences a GPU may ignore and profiler switches with no profiler attached: checked, kept
// where a getter answers them, and accepted.

GPUPROXY_EXPORT CUresult cuCtxSetCacheConfig(CUfunc_cache config) {
  return guarded(__func__, [&](Runtime& runtime) {
    const int preference = gpuproxy::stub::enumValue(config);
    if (preference < CU_FUNC_CACHE_PREFER_NONE || preference > CU_FUNC_CACHE_PREFER_EQUAL) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const bool known = runtime.updateContext(
        currentContext(), [&](ContextRecord& record) { record.cacheConfig = preference; });
    return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  });
}

GPUPROXY_EXPORT CUresult cuCtxGetCacheConfig(CUfunc_cache* pconfig) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pconfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::optional<ContextRecord> record = runtime.context(currentContext());
    if (!record) return CUDA_ERROR_INVALID_CONTEXT;
    *pconfig = static_cast<CUfunc_cache>(record->cacheConfig);
    return CUDA_SUCCESS;
  });
}

// Shared-memory banks are four bytes wide on every GPU since Maxwell, whatever is asked for.
GPUPROXY_EXPORT CUresult cuCtxSetSharedMemConfig(CUsharedconfig config) {
  return guarded(__func__, [&](Runtime& runtime) {
    const int banks = gpuproxy::stub::enumValue(config);
    if (banks < CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE ||
        banks > CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return runtime.context(currentContext()) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  });
}

GPUPROXY_EXPORT CUresult cuCtxGetSharedMemConfig(CUsharedconfig* pConfig) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pConfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!runtime.context(currentContext())) return CUDA_ERROR_INVALID_CONTEXT;
    *pConfig = CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE;
    return CUDA_SUCCESS;
  });
}

// Nothing is ever made persisting in L2 (the persisting-lines limit is 0).
GPUPROXY_EXPORT CUresult cuCtxResetPersistingL2Cache() {
  return guarded(__func__, [&](Runtime& runtime) {
    return runtime.context(currentContext()) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  });
}

// cudaProfilerStart/Stop around a region of interest: no profiling tool attaches to an
// application through gpuproxy, so there is nothing to switch, as with the driver when no tool
// is attached.
GPUPROXY_EXPORT CUresult cuProfilerStart() {
  return guarded(__func__, [&](Runtime& runtime) {
    return runtime.context(currentContext()) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  });
}

GPUPROXY_EXPORT CUresult cuProfilerStop() {
  return guarded(__func__, [&](Runtime& runtime) {
    return runtime.context(currentContext()) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  });
}

// ---- peer access ---------------------------------------------------------------------------
// gpuproxy gives no GPU access to another's memory (each GPU's context is the daemon's, and a
// client reaches only its own allocations), so every pair of devices answers as GPUs without a
// peer-to-peer path do: no access, and enabling it is CUDA_ERROR_PEER_ACCESS_UNSUPPORTED.
// Applications then copy between GPUs through the host, which cuMemcpy does for them.

GPUPROXY_EXPORT CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(dev) == nullptr || runtime.device(peerDev) == nullptr) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    *canAccessPeer = 0;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib,
                                                 CUdevice srcDevice, CUdevice dstDevice) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (runtime.device(srcDevice) == nullptr || runtime.device(dstDevice) == nullptr ||
        srcDevice == dstDevice) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (gpuproxy::stub::enumValue(attrib)) {
      case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
      case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
      case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
      case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
      case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED:
        *value = 0;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

GPUPROXY_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (!runtime.context(currentContext())) return CUDA_ERROR_INVALID_CONTEXT;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!runtime.context(handleValue(peerContext))) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  });
}

GPUPROXY_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (!runtime.context(currentContext())) return CUDA_ERROR_INVALID_CONTEXT;
    if (!runtime.context(handleValue(peerContext))) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  });
}
