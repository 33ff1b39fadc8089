// cuLaunchKernelEx: a launch described by a CUlaunchConfig, through cuLaunchKernel's path
// (modules.hpp). Attributes that are hints (priority, cache and scheduling preferences, memory
// synchronisation domains) change nothing a kernel can observe and are accepted, and so is a
// cooperative launch. Programmatic dependent launch is accepted too: it allows a kernel to begin
// before the one ahead of it in the stream has ended, and never requires it, so a launch that
// waits for the kernel ahead keeps every promise (`griddepcontrol.wait` then returns at once).
// For the same reason the events a launch may record (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT,
// CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT, which CUDA allows to fire as late as the kernel's
// end) are recorded right after the kernel. Clusters of more than one block, and graph-only
// attributes, are refused as CUDA_ERROR_NOT_SUPPORTED, with a log line.

#include <cuda.h>

#include <vector>

#include "client/stub/api/modules.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::Runtime;
using gpuproxy::stub::StreamTarget;

namespace gpuproxy::stub {

bool isKernelLaunchHint(int id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    // The kernel runs at its stream's priority.
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    // A preferred cluster shape is used "if possible", else the required one (checked apart).
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
    case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
      return true;
    default:
      return false;
  }
}

}  // namespace gpuproxy::stub

namespace {

// What the attributes ask of the launch beyond its shape.
struct LaunchRequests {
  bool cooperative = false;
  // Events to record once the kernel is queued: (event, record flags).
  std::vector<std::pair<CUevent, int>> events;
};

// CUDA_SUCCESS for an attribute the launch can honour; what it asks for goes into `requests`.
CUresult checkAttribute(const char* entryPoint, const CUlaunchAttribute& attribute,
                        LaunchRequests& requests) {
  const CUlaunchAttributeValue& value = attribute.value;
  bool honoured = false;
  const int id = gpuproxy::stub::enumValue(attribute.id);
  if (gpuproxy::stub::isKernelLaunchHint(id)) return CUDA_SUCCESS;
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_IGNORE:
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
    // Allowed to overlap the kernel ahead, which it then does not.
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
      requests.cooperative = value.cooperative != 0;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      honoured = value.clusterDim.x <= 1 && value.clusterDim.y <= 1 && value.clusterDim.z <= 1;
      break;
    // Neither accepts CU_EVENT_RECORD_EXTERNAL.
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:
      if (value.programmaticEvent.flags != CU_EVENT_RECORD_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
      requests.events.emplace_back(value.programmaticEvent.event, value.programmaticEvent.flags);
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
      if (value.launchCompletionEvent.flags != CU_EVENT_RECORD_DEFAULT) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      requests.events.emplace_back(value.launchCompletionEvent.event,
                                   value.launchCompletionEvent.flags);
      return CUDA_SUCCESS;
    default:
      break;
  }
  if (honoured) return CUDA_SUCCESS;
  GPUPROXY_STUB_LOG(kWarn, "%s: launch attribute %d (with this value) is not supported", entryPoint,
                    id);
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult launchKernelEx(const char* entryPoint, const CUlaunchConfig* config, CUfunction f,
                        void** kernelParams, void** extra, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
    LaunchRequests requests;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
      if (CUresult checked = checkAttribute(entryPoint, config->attrs[i], requests);
          checked != CUDA_SUCCESS) {
        return checked;
      }
    }
    // The events' records, checked before the kernel is queued.
    std::vector<gpuproxy::protocol::ring::EventRecord> records(requests.events.size());
    if (!requests.events.empty()) {
      StreamTarget target;
      if (CUresult resolved =
              gpuproxy::stub::resolveStream(runtime, config->hStream, nullStream, target);
          resolved != CUDA_SUCCESS) {
        return resolved;
      }
      for (std::size_t i = 0; i < records.size(); ++i) {
        const auto& [event, flags] = requests.events[i];
        if (CUresult prepared = gpuproxy::stub::prepareEventRecord(
                runtime, event, target, static_cast<unsigned>(flags), records[i]);
            prepared != CUDA_SUCCESS) {
          return prepared;
        }
      }
    }
    const CUresult launched = gpuproxy::stub::launchKernel(
        entryPoint, f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
        config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->hStream, kernelParams,
        extra, nullStream, requests.cooperative);
    if (launched != CUDA_SUCCESS) return launched;
    for (const auto& record : records) {
      if (CUresult submitted = gpuproxy::stub::submitEventRecord(runtime, record);
          submitted != CUDA_SUCCESS) {
        return submitted;
      }
    }
    return CUDA_SUCCESS;
  });
}

}  // namespace

GPUPROXY_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                          void** kernelParams, void** extra) {
  return launchKernelEx(__func__, config, f, kernelParams, extra, NullStream::kLegacy);
}

GPUPROXY_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                               void** kernelParams, void** extra) {
  return launchKernelEx(__func__, config, f, kernelParams, extra, NullStream::kPerThread);
}
