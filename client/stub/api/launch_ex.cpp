// cuLaunchKernelEx: a launch described by a CUlaunchConfig, through cuLaunchKernel's path
// (modules.hpp). Launch attributes that ask for nothing beyond a plain launch are accepted, and so
// is a cooperative launch (CU_LAUNCH_ATTRIBUTE_COOPERATIVE); any that needs more (clusters,
// programmatic dependent launch, memory synchronisation domains, ...) is refused as
// CUDA_ERROR_NOT_SUPPORTED, with a log line.

#include <cuda.h>

#include "client/stub/api/modules.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::guarded;
using gpuproxy::stub::NullStream;
using gpuproxy::stub::Runtime;

namespace {

// CUDA_SUCCESS for an attribute that leaves the launch a plain one (or a cooperative one, which
// sets `cooperative`).
CUresult checkAttribute(const char* entryPoint, const CUlaunchAttribute& attribute,
                        bool& cooperative) {
  const CUlaunchAttributeValue& value = attribute.value;
  bool plain = false;
  const int id = gpuproxy::stub::enumValue(attribute.id);
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_IGNORE:
      return CUDA_SUCCESS;
    // A scheduling hint: the kernel runs at its stream's priority.
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
      cooperative = value.cooperative != 0;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      plain = value.clusterDim.x == 1 && value.clusterDim.y == 1 && value.clusterDim.z == 1;
      break;
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      plain = value.programmaticStreamSerializationAllowed == 0;
      break;
    default:
      break;
  }
  if (plain) return CUDA_SUCCESS;
  GPUPROXY_STUB_LOG(kWarn, "%s: launch attribute %d (with this value) is not supported", entryPoint,
                    id);
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult launchKernelEx(const char* entryPoint, const CUlaunchConfig* config, CUfunction f,
                        void** kernelParams, void** extra, NullStream nullStream) {
  return guarded(entryPoint, [&](Runtime&) {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
    bool cooperative = false;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
      if (CUresult checked = checkAttribute(entryPoint, config->attrs[i], cooperative);
          checked != CUDA_SUCCESS) {
        return checked;
      }
    }
    return gpuproxy::stub::launchKernel(entryPoint, f, config->gridDimX, config->gridDimY,
                                        config->gridDimZ, config->blockDimX, config->blockDimY,
                                        config->blockDimZ, config->sharedMemBytes, config->hStream,
                                        kernelParams, extra, nullStream, cooperative);
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
