#pragma once
// The CUDA driver, loaded at run time: nothing links libcuda at build time, so the daemon builds
// and starts (with the sim backend) on machines without a driver. Private to the cuda backend.

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <string>
#include <string_view>

#include "protocol/cuda_result.hpp"

namespace gpuproxy::server::cuda {

// Each entry: (member, driver symbol, ABI version). The version is the one whose typedef in
// <cudaTypedefs.h> gives the member its type, and it is also the version asked of
// cuGetProcAddress, so the pointer we get always has the ABI the compiler checked our calls
// against, on older and newer drivers alike (cuGetProcAddress's documented use: "cuMemAlloc" at
// 3020 is cuMemAlloc_v2). Per-thread-default-stream variants are never asked for: every stream
// the daemon uses is an explicit one.
#define GPUPROXY_CUDA_REQUIRED_ENTRY_POINTS(X)                    \
  X(init, cuInit, 2000)                                           \
  X(driverGetVersion, cuDriverGetVersion, 2020)                   \
  X(getErrorName, cuGetErrorName, 6000)                           \
  X(getErrorString, cuGetErrorString, 6000)                       \
  X(deviceGetCount, cuDeviceGetCount, 2000)                       \
  X(deviceGet, cuDeviceGet, 2000)                                 \
  X(deviceGetName, cuDeviceGetName, 2000)                         \
  X(deviceGetUuid, cuDeviceGetUuid, 11040)                        \
  X(deviceTotalMem, cuDeviceTotalMem, 3020)                       \
  X(deviceGetAttribute, cuDeviceGetAttribute, 2000)               \
  X(primaryCtxRetain, cuDevicePrimaryCtxRetain, 7000)             \
  X(primaryCtxRelease, cuDevicePrimaryCtxRelease, 11000)          \
  X(primaryCtxReset, cuDevicePrimaryCtxReset, 11000)              \
  X(ctxPushCurrent, cuCtxPushCurrent, 4000)                       \
  X(ctxPopCurrent, cuCtxPopCurrent, 4000)                         \
  X(ctxSetLimit, cuCtxSetLimit, 3010)                             \
  X(ctxGetLimit, cuCtxGetLimit, 3010)                             \
  X(memAlloc, cuMemAlloc, 3020)                                   \
  X(memFree, cuMemFree, 3020)                                     \
  X(memAddressReserve, cuMemAddressReserve, 10020)                \
  X(memAddressFree, cuMemAddressFree, 10020)                      \
  X(memCreate, cuMemCreate, 10020)                                \
  X(memRelease, cuMemRelease, 10020)                              \
  X(memMap, cuMemMap, 10020)                                      \
  X(memUnmap, cuMemUnmap, 10020)                                  \
  X(memSetAccess, cuMemSetAccess, 10020)                          \
  X(memGetInfo, cuMemGetInfo, 3020)                               \
  X(memHostRegister, cuMemHostRegister, 6050)                     \
  X(memHostUnregister, cuMemHostUnregister, 4000)                 \
  X(memcpyHtoDAsync, cuMemcpyHtoDAsync, 3020)                     \
  X(memcpyDtoHAsync, cuMemcpyDtoHAsync, 3020)                     \
  X(memcpyDtoDAsync, cuMemcpyDtoDAsync, 3020)                     \
  X(memsetD8Async, cuMemsetD8Async, 3020)                         \
  X(memsetD16Async, cuMemsetD16Async, 3020)                       \
  X(memsetD32Async, cuMemsetD32Async, 3020)                       \
  X(memsetD2D8Async, cuMemsetD2D8Async, 3020)                     \
  X(memsetD2D16Async, cuMemsetD2D16Async, 3020)                   \
  X(memsetD2D32Async, cuMemsetD2D32Async, 3020)                   \
  X(streamCreateWithPriority, cuStreamCreateWithPriority, 5050)   \
  X(streamGetPriority, cuStreamGetPriority, 5050)                 \
  X(ctxGetStreamPriorityRange, cuCtxGetStreamPriorityRange, 5050) \
  X(streamDestroy, cuStreamDestroy, 4000)                         \
  X(streamQuery, cuStreamQuery, 2000)                             \
  X(streamWaitEvent, cuStreamWaitEvent, 3020)                     \
  X(eventCreate, cuEventCreate, 2000)                             \
  X(eventDestroy, cuEventDestroy, 4000)                           \
  X(eventRecord, cuEventRecord, 2000)                             \
  X(eventQuery, cuEventQuery, 2000)                               \
  X(launchHostFunc, cuLaunchHostFunc, 10000)                      \
  X(launchKernel, cuLaunchKernel, 4000)                           \
  X(launchCooperativeKernel, cuLaunchCooperativeKernel, 9000)     \
  X(moduleLoadData, cuModuleLoadData, 2000)                       \
  X(moduleUnload, cuModuleUnload, 2000)                           \
  X(moduleGetFunction, cuModuleGetFunction, 2000)                 \
  X(moduleGetGlobal, cuModuleGetGlobal, 3020)                     \
  X(funcGetAttribute, cuFuncGetAttribute, 2020)                   \
  X(funcSetAttribute, cuFuncSetAttribute, 9000)

// Entry points an older driver may lack; null when absent, and every use checks. The green
// context and library ones are needed only for an SM partition (DeviceOptions), which checks
// them all when a device is opened with one (greenContextEntryPointsMissing). The linker's
// compile PTX ahead of a module's load (CudaDevice::prepareModule); without them the driver
// compiles it inside cuModuleLoadData.
#define GPUPROXY_CUDA_OPTIONAL_ENTRY_POINTS(X)                     \
  X(funcGetParamInfo, cuFuncGetParamInfo, 12040)                   \
  X(funcLoad, cuFuncLoad, 12040)                                   \
  X(libraryLoadData, cuLibraryLoadData, 12000)                     \
  X(libraryUnload, cuLibraryUnload, 12000)                         \
  X(libraryGetKernel, cuLibraryGetKernel, 12000)                   \
  X(kernelGetFunction, cuKernelGetFunction, 12000)                 \
  X(kernelSetAttribute, cuKernelSetAttribute, 12000)               \
  X(libraryGetGlobal, cuLibraryGetGlobal, 12000)                   \
  X(deviceGetDevResource, cuDeviceGetDevResource, 12040)           \
  X(devSmResourceSplitByCount, cuDevSmResourceSplitByCount, 12040) \
  X(devResourceGenerateDesc, cuDevResourceGenerateDesc, 12040)     \
  X(greenCtxCreate, cuGreenCtxCreate, 12040)                       \
  X(greenCtxDestroy, cuGreenCtxDestroy, 12040)                     \
  X(ctxFromGreenCtx, cuCtxFromGreenCtx, 12040)                     \
  X(greenCtxStreamCreate, cuGreenCtxStreamCreate, 12050)           \
  X(linkCreate, cuLinkCreate, 6050)                                \
  X(linkAddData, cuLinkAddData, 6050)                              \
  X(linkComplete, cuLinkComplete, 5050)                            \
  X(linkDestroy, cuLinkDestroy, 5050)

struct DriverApi {
#define GPUPROXY_CUDA_DECLARE_ENTRY_POINT(member, symbol, version) \
  PFN_##symbol##_v##version member = nullptr;
  GPUPROXY_CUDA_REQUIRED_ENTRY_POINTS(GPUPROXY_CUDA_DECLARE_ENTRY_POINT)
  GPUPROXY_CUDA_OPTIONAL_ENTRY_POINTS(GPUPROXY_CUDA_DECLARE_ENTRY_POINT)
#undef GPUPROXY_CUDA_DECLARE_ENTRY_POINT

  // cuEventElapsedTime: the 12.8 variant where the driver has it, else the original; both have
  // this signature.
  PFN_cuEventElapsedTime_v12080 eventElapsedTime = nullptr;

  int driverVersion = 0;  // as cuDriverGetVersion reports it
  std::string library;    // what was dlopen()ed, for log lines

  // "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)".
  std::string describe(CUresult result) const;

  // The green-context and library entry points an SM partition needs that this driver lacks,
  // as "cuGreenCtxStreamCreate, ..."; empty when it has them all.
  std::string greenContextEntryPointsMissing() const;
};

// dlopen()s `library`, resolves every entry point and runs cuInit(0). On failure returns the
// error and sets `whyNot` to one line an operator can act on. The library stays loaded for the
// life of the process: unloading a driver whose threads may still run is never safe.
CUresult loadDriver(const std::string& library, std::shared_ptr<const DriverApi>& api,
                    std::string& whyNot);

// The errors that poison a context until it is reset: protocol::isStickyError.
using protocol::isStickyError;

}  // namespace gpuproxy::server::cuda
