// What a kernel is like and how it fits on a device: cuFuncGetAttribute / cuFuncSetAttribute and
// their cuKernel* counterparts, parameter layout, cache and shared-memory hints, and the occupancy
// calculator. All of it is answered in the stub, from the layout cuModuleGetFunction brought back
// (KernelRecord) and the device attributes reported at attach; nothing goes to the daemon.
//
// Wherever a CUfunction is accepted a CUkernel is too (the CUDA runtime passes CUkernels cast to
// CUfunction); it stands for its function in the calling thread's current context, as the driver
// documents for the occupancy calls.

#include <cuda.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>

#include "client/stub/api/modules.hpp"
#include "client/stub/api_support.hpp"
#include "client/stub/enum_value.hpp"
#include "client/stub/export.hpp"

using gpuproxy::stub::currentContext;
using gpuproxy::stub::DeviceRecord;
using gpuproxy::stub::guarded;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::KernelRecord;
using gpuproxy::stub::Runtime;

namespace {

struct ResolvedFunction {
  std::shared_ptr<const KernelRecord> kernel;
  const DeviceRecord* device = nullptr;  // null if the kernel's context is gone
};

// A CUfunction, or a CUkernel as its function in `context` (0: the current context).
CUresult resolveFunction(Runtime& runtime, std::uint64_t handle, std::uint64_t context,
                         ResolvedFunction& resolved) {
  std::uint64_t function = handle;
  resolved.kernel = runtime.function(function);
  if (!resolved.kernel) {
    if (handle == 0 || !gpuproxy::stub::isLibraryKernel(handle)) return CUDA_ERROR_INVALID_HANDLE;
    if (context == 0) context = currentContext();
    if (context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult result = gpuproxy::stub::libraryKernelFunction(runtime, handle, context, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    resolved.kernel = runtime.function(function);
    if (!resolved.kernel) return CUDA_ERROR_INVALID_HANDLE;
  }
  if (auto owner = runtime.context(resolved.kernel->context)) {
    resolved.device = runtime.device(static_cast<CUdevice>(owner->device));
  }
  return CUDA_SUCCESS;
}

// The context in which a CUkernel is looked at "for device `dev`": the current context if it is
// on that device, else the device's primary context if this process holds it.
CUresult contextForDevice(Runtime& runtime, CUdevice dev, std::uint64_t& context) {
  if (runtime.device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (const std::uint64_t current = currentContext(); current != 0) {
    if (auto record = runtime.context(current);
        record && record->device == static_cast<std::uint32_t>(dev)) {
      context = current;
      return CUDA_SUCCESS;
    }
  }
  if (auto primary = runtime.primaryContext(static_cast<std::uint32_t>(dev))) {
    context = *primary;
    return CUDA_SUCCESS;
  }
  GPUPROXY_STUB_LOG(kWarn,
                    "cuKernel*: device %d has no current or retained primary context to hold the "
                    "kernel's function",
                    dev);
  return CUDA_ERROR_INVALID_CONTEXT;
}

CUresult resolveKernelOnDevice(Runtime& runtime, CUkernel kernel, CUdevice dev,
                               ResolvedFunction& resolved) {
  if (!gpuproxy::stub::isLibraryKernel(handleValue(kernel))) return CUDA_ERROR_INVALID_HANDLE;
  std::uint64_t context = 0;
  if (CUresult result = contextForDevice(runtime, dev, context); result != CUDA_SUCCESS) {
    return result;
  }
  return resolveFunction(runtime, handleValue(kernel), context, resolved);
}

int deviceAttribute(const DeviceRecord* device, CUdevice_attribute which) {
  if (device == nullptr) return 0;
  return device->attribute(which).value_or(0);
}

int staticSharedBytes(const KernelRecord& kernel) {
  return std::max(kernel.sharedSizeBytes, 0);
}

// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: as set, else the default per-block limit less
// the kernel's static shared memory (0 when the static part alone is over it).
int maxDynamicSharedBytes(const KernelRecord& kernel, const DeviceRecord* device) {
  const int set = kernel.maxDynamicSharedSizeBytes.load(std::memory_order_relaxed);
  if (set >= 0) return set;
  return std::max(deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK) -
                      staticSharedBytes(kernel),
                  0);
}

int maxThreadsPerBlock(const KernelRecord& kernel, const DeviceRecord* device) {
  const int deviceLimit = deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  if (kernel.maxThreadsPerBlock <= 0) return deviceLimit;
  return deviceLimit > 0 ? std::min(kernel.maxThreadsPerBlock, deviceLimit)
                         : kernel.maxThreadsPerBlock;
}

CUresult getAttribute(const ResolvedFunction& function, int attribute, int& value) {
  const KernelRecord& kernel = *function.kernel;
  const DeviceRecord* device = function.device;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      value = maxThreadsPerBlock(kernel, device);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
      value = staticSharedBytes(kernel);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
      value = std::max(kernel.constSizeBytes, 0);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
      value = std::max(kernel.localSizeBytes, 0);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      value = std::max(kernel.numRegs, 0);
      return CUDA_SUCCESS;
    // The PTX target the kernel came from (CUB picks its tuning by it, and must pick one that was
    // compiled in) and the architecture it runs as: the device's own when PTX was JIT-compiled.
    // The daemon reports both; the device's architecture stands in for one it did not know.
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: {
      const int reported =
          attribute == CU_FUNC_ATTRIBUTE_PTX_VERSION ? kernel.ptxVersion : kernel.binaryVersion;
      value = reported > 0
                  ? reported
                  : deviceAttribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
                        deviceAttribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
      return CUDA_SUCCESS;
    }
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA:
      value = 0;  // -Xptxas --dlcm=ca is a build option the stub never sees used
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      value = maxDynamicSharedBytes(kernel, device);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      value = kernel.preferredSharedMemoryCarveout.load(std::memory_order_relaxed);
      return CUDA_SUCCESS;
    // No cluster requirements: kernels compiled with cluster dimensions are refused at load by
    // the sim, and none can be set here (cuFuncSetAttribute answers NOT_SUPPORTED).
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
      value = 0;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      value = kernel.nonPortableClusterSizeAllowed.load(std::memory_order_relaxed);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      value = kernel.clusterSchedulingPolicy.load(std::memory_order_relaxed);
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult setAttribute(const char* entryPoint, const ResolvedFunction& function, int attribute,
                      int value) {
  const KernelRecord& kernel = *function.kernel;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: {
      const std::int64_t optIn =
          deviceAttribute(function.device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
      if (value < 0 || std::int64_t{value} + staticSharedBytes(kernel) > optIn) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      kernel.maxDynamicSharedSizeBytes.store(value, std::memory_order_relaxed);
      return CUDA_SUCCESS;
    }
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (value < CU_SHAREDMEM_CARVEOUT_DEFAULT || value > CU_SHAREDMEM_CARVEOUT_MAX_SHARED) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      // A hint to the driver; the occupancy calculator below honours it.
      kernel.preferredSharedMemoryCarveout.store(value, std::memory_order_relaxed);
      return CUDA_SUCCESS;
    // Permissions and preferences about clusters bind nothing while no cluster is launched (none
    // can be: the sim refuses cluster kernels at load, cuLaunchKernelEx cluster sizes beyond
    // 1x1x1): kept and answered back, as cuBLAS sets them on every kernel it loads.
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      if (value != 0 && value != 1) return CUDA_ERROR_INVALID_VALUE;
      kernel.nonPortableClusterSizeAllowed.store(value, std::memory_order_relaxed);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      if (value < CU_CLUSTER_SCHEDULING_POLICY_DEFAULT ||
          value > CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      kernel.clusterSchedulingPolicy.store(value, std::memory_order_relaxed);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
      GPUPROXY_STUB_LOG(kWarn,
                        "%s: cluster attribute %d is not supported (no thread-block clusters)",
                        entryPoint, static_cast<int>(attribute));
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      // Read-only attributes, and values that are no attribute at all.
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult parameterInfo(const KernelRecord& kernel, size_t index, size_t* offset, size_t* size) {
  if (offset == nullptr || index >= kernel.parameters.size()) return CUDA_ERROR_INVALID_VALUE;
  *offset = kernel.parameters[index].offset;
  if (size != nullptr) *size = kernel.parameters[index].size;
  return CUDA_SUCCESS;
}

// ---- the occupancy calculator ----------------------------------------------------------------
//
// The arithmetic of the toolkit's cuda_occupancy.h (what cudaOccupancy* compute), for the
// architectures since Volta: blocks per multiprocessor are limited by warps, by the block slots,
// by registers (allocated per warp in units of 256, split over 4 sub-partitions) and by shared
// memory (allocated per block in units of 128 bytes, plus the reserved per-block part, out of the
// carveout the kernel's preference selects). Partitioned global caching (cc 5.2-6.x) is not
// modelled.

struct DeviceLimits {
  int computeMajor = 0;
  int maxThreadsPerBlock = 0;
  int maxThreadsPerMultiprocessor = 0;
  int maxBlocksPerMultiprocessor = 0;
  int registersPerBlock = 0;
  int registersPerMultiprocessor = 0;
  int warpSize = 0;
  std::int64_t sharedPerBlock = 0;
  std::int64_t sharedPerBlockOptIn = 0;
  std::int64_t sharedPerMultiprocessor = 0;
  std::int64_t reservedSharedPerBlock = 0;
  int multiprocessors = 0;
};

std::optional<DeviceLimits> limitsOf(const DeviceRecord* device) {
  DeviceLimits limits;
  limits.computeMajor = deviceAttribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  limits.maxThreadsPerBlock = deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  limits.maxThreadsPerMultiprocessor =
      deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  limits.maxBlocksPerMultiprocessor =
      deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  limits.registersPerBlock = deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  limits.registersPerMultiprocessor =
      deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  limits.warpSize = deviceAttribute(device, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  limits.sharedPerBlock = deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  limits.sharedPerBlockOptIn =
      deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  limits.sharedPerMultiprocessor =
      deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  limits.reservedSharedPerBlock =
      deviceAttribute(device, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
  limits.multiprocessors = deviceAttribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  limits.sharedPerBlockOptIn = std::max(limits.sharedPerBlockOptIn, limits.sharedPerBlock);
  if (limits.computeMajor < 7 || limits.maxThreadsPerBlock <= 0 ||
      limits.maxThreadsPerMultiprocessor <= 0 || limits.maxBlocksPerMultiprocessor <= 0 ||
      limits.registersPerBlock <= 0 || limits.registersPerMultiprocessor <= 0 ||
      limits.warpSize <= 0 || limits.sharedPerBlock <= 0 || limits.sharedPerMultiprocessor <= 0 ||
      limits.multiprocessors <= 0) {
    return std::nullopt;
  }
  return limits;
}

constexpr int kRegisterAllocationUnit = 256;  // registers, per warp
constexpr int kSubPartitions = 4;
constexpr int kMaxRegistersPerThread = 256;
constexpr std::int64_t kSharedAllocationUnit = 128;  // bytes, per block

std::int64_t roundUp(std::int64_t value, std::int64_t unit) {
  return (value + unit - 1) / unit * unit;
}

// The shared-memory sizes a multiprocessor can be configured with (the carveout steps since
// Volta), up to its maximum: the smallest one that holds `bytes`, or nullopt if none does.
std::optional<std::int64_t> sharedConfigHolding(std::int64_t bytes, const DeviceLimits& limits) {
  static constexpr std::array<std::int64_t, 10> kStepsKiB = {0,   8,   16,  32,  64,
                                                             100, 132, 164, 196, 228};
  for (std::int64_t step : kStepsKiB) {
    if (step * 1024 >= limits.sharedPerMultiprocessor) break;
    if (step * 1024 >= bytes) return step * 1024;
  }
  if (bytes <= limits.sharedPerMultiprocessor) return limits.sharedPerMultiprocessor;
  return std::nullopt;
}

// The shared memory per multiprocessor the kernel's carveout preference asks for.
std::int64_t preferredSharedPerMultiprocessor(int carveout, const DeviceLimits& limits) {
  if (carveout < 0) return limits.sharedPerMultiprocessor;
  return sharedConfigHolding(carveout * limits.sharedPerMultiprocessor / 100, limits)
      .value_or(limits.sharedPerMultiprocessor);
}

struct KernelNeeds {
  int maxThreadsPerBlock = 0;
  int registers = 0;
  std::int64_t staticShared = 0;
  std::int64_t maxDynamicShared = 0;
  int carveout = -1;
};

KernelNeeds needsOf(const ResolvedFunction& function) {
  const KernelRecord& kernel = *function.kernel;
  return KernelNeeds{maxThreadsPerBlock(kernel, function.device), std::max(kernel.numRegs, 0),
                     staticSharedBytes(kernel), maxDynamicSharedBytes(kernel, function.device),
                     kernel.preferredSharedMemoryCarveout.load(std::memory_order_relaxed)};
}

int blocksLimitedByRegisters(const DeviceLimits& limits, const KernelNeeds& kernel,
                             int warpsPerBlock) {
  const std::int64_t perWarp =
      roundUp(std::int64_t{kernel.registers} * limits.warpSize, kRegisterAllocationUnit);
  const std::int64_t perBlock = perWarp * warpsPerBlock;
  const std::int64_t assumedPerBlock = perWarp * roundUp(warpsPerBlock, kSubPartitions);
  if (limits.registersPerBlock < assumedPerBlock || limits.registersPerBlock < perBlock ||
      kernel.registers > kMaxRegistersPerThread) {
    return 0;
  }
  if (perWarp == 0) return INT_MAX;
  const std::int64_t warpsPerSubPartition =
      limits.registersPerMultiprocessor / kSubPartitions / perWarp;
  return static_cast<int>(warpsPerSubPartition * kSubPartitions / warpsPerBlock);
}

int blocksLimitedBySharedMemory(const DeviceLimits& limits, const KernelNeeds& kernel,
                                std::int64_t dynamicShared) {
  const std::int64_t fixed = kernel.staticShared + limits.reservedSharedPerBlock;
  const std::int64_t perBlock = roundUp(fixed + dynamicShared, kSharedAllocationUnit);
  // Past the kernel's own limit (cuFuncSetAttribute) or the device's per-block limit, a block
  // cannot launch at all.
  const std::int64_t mostPerBlock = fixed + kernel.maxDynamicShared;
  const std::int64_t perBlockLimit =
      (mostPerBlock > limits.sharedPerBlock ? limits.sharedPerBlockOptIn : limits.sharedPerBlock) +
      limits.reservedSharedPerBlock;
  if (dynamicShared > kernel.maxDynamicShared || perBlock > perBlockLimit) return 0;
  std::int64_t perMultiprocessor = preferredSharedPerMultiprocessor(kernel.carveout, limits);
  if (perMultiprocessor < perBlock) {
    // The driver picks a larger carveout than preferred when a block needs it.
    std::optional<std::int64_t> holding = sharedConfigHolding(perBlock, limits);
    if (!holding) return 0;
    perMultiprocessor = *holding;
  }
  if (perBlock == 0) return INT_MAX;
  return static_cast<int>(perMultiprocessor / perBlock);
}

int activeBlocksPerMultiprocessor(const DeviceLimits& limits, const KernelNeeds& kernel,
                                  int blockSize, std::int64_t dynamicShared) {
  if (blockSize > limits.maxThreadsPerBlock) return 0;
  const int warpsPerBlock = (blockSize + limits.warpSize - 1) / limits.warpSize;
  const int byWarps = limits.maxThreadsPerMultiprocessor / limits.warpSize / warpsPerBlock;
  const int bySlots = limits.maxBlocksPerMultiprocessor;
  const int byRegisters = blocksLimitedByRegisters(limits, kernel, warpsPerBlock);
  const int byShared = blocksLimitedBySharedMemory(limits, kernel, dynamicShared);
  return std::min({byWarps, bySlots, byRegisters, byShared});
}

// What every occupancy entry point starts with: the function (a CUkernel in the current
// context), the device's limits, and the flags.
CUresult prepareOccupancy(Runtime& runtime, CUfunction func, unsigned flags,
                          ResolvedFunction& function, DeviceLimits& limits) {
  if ((flags & ~static_cast<unsigned>(CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult result = resolveFunction(runtime, handleValue(func), 0, function);
      result != CUDA_SUCCESS) {
    return result;
  }
  std::optional<DeviceLimits> found = limitsOf(function.device);
  if (!found) {
    GPUPROXY_STUB_LOG(kWarn,
                      "occupancy: the daemon did not report the device limits the calculator "
                      "needs (or the device is older than compute capability 7.0)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  limits = *found;
  return CUDA_SUCCESS;
}

// CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE changes nothing since Volta: global caching in L1 no
// longer costs occupancy.
CUresult maxActiveBlocks(const char* entryPoint, int* numBlocks, CUfunction func, int blockSize,
                         size_t dynamicSMemSize, unsigned flags) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (numBlocks == nullptr || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
    ResolvedFunction function;
    DeviceLimits limits;
    if (CUresult result = prepareOccupancy(runtime, func, flags, function, limits);
        result != CUDA_SUCCESS) {
      return result;
    }
    *numBlocks = activeBlocksPerMultiprocessor(
        limits, needsOf(function), blockSize,
        static_cast<std::int64_t>(std::min<size_t>(dynamicSMemSize, INT_MAX)));
    return CUDA_SUCCESS;
  });
}

// The block size with the most resident threads per multiprocessor, trying every multiple of the
// warp size from the largest allowed down (the largest wins ties), as cuda_occupancy.h does.
CUresult maxPotentialBlockSize(const char* entryPoint, int* minGridSize, int* blockSize,
                               CUfunction func, CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                               size_t dynamicSMemSize, int blockSizeLimit, unsigned flags) {
  return guarded(entryPoint, [&](Runtime& runtime) {
    if (minGridSize == nullptr || blockSize == nullptr || blockSizeLimit < 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    ResolvedFunction function;
    DeviceLimits limits;
    if (CUresult result = prepareOccupancy(runtime, func, flags, function, limits);
        result != CUDA_SUCCESS) {
      return result;
    }
    const KernelNeeds kernel = needsOf(function);
    int largest = std::min(limits.maxThreadsPerBlock, kernel.maxThreadsPerBlock);
    if (blockSizeLimit > 0) largest = std::min(largest, blockSizeLimit);
    int bestBlockSize = 0;
    int bestBlocks = 0;
    int bestThreads = 0;
    for (int aligned = static_cast<int>(roundUp(largest, limits.warpSize)); aligned > 0;
         aligned -= limits.warpSize) {
      const int tried = std::min(largest, aligned);
      const size_t dynamicShared = blockSizeToDynamicSMemSize != nullptr
                                       ? blockSizeToDynamicSMemSize(tried)
                                       : dynamicSMemSize;
      const int blocks = activeBlocksPerMultiprocessor(
          limits, kernel, tried,
          static_cast<std::int64_t>(std::min<size_t>(dynamicShared, INT_MAX)));
      if (blocks * tried > bestThreads) {
        bestBlockSize = tried;
        bestBlocks = blocks;
        bestThreads = blocks * tried;
      }
      if (bestThreads == limits.maxThreadsPerMultiprocessor) break;
    }
    *minGridSize = bestBlocks * limits.multiprocessors;
    *blockSize = bestBlockSize;
    return CUDA_SUCCESS;
  });
}

}  // namespace

namespace gpuproxy::stub {

CUresult cooperativeGridFits(Runtime& runtime, std::uint64_t function, const unsigned block[3],
                             unsigned sharedMemBytes, std::uint64_t blocks) {
  ResolvedFunction resolved;
  if (CUresult result = resolveFunction(runtime, function, 0, resolved); result != CUDA_SUCCESS) {
    return result;
  }
  if (deviceAttribute(resolved.device, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) != 1) {
    GPUPROXY_STUB_LOG(kWarn, "cuLaunchCooperativeKernel: the device has no cooperative launches");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::optional<DeviceLimits> limits = limitsOf(resolved.device);
  if (!limits) return CUDA_ERROR_NOT_SUPPORTED;
  const std::uint64_t threads = std::uint64_t{block[0]} * block[1] * block[2];
  const int perMultiprocessor = activeBlocksPerMultiprocessor(
      *limits, needsOf(resolved), static_cast<int>(std::min<std::uint64_t>(threads, INT_MAX)),
      sharedMemBytes);
  const std::uint64_t resident =
      static_cast<std::uint64_t>(std::max(perMultiprocessor, 0)) * limits->multiprocessors;
  return blocks <= resident ? CUDA_SUCCESS : CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
}

}  // namespace gpuproxy::stub

// ---- attributes ------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib,
                                            CUfunction hfunc) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ResolvedFunction function;
    if (CUresult result = resolveFunction(runtime, handleValue(hfunc), 0, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    return getAttribute(function, gpuproxy::stub::enumValue(attrib), *pi);
  });
}

GPUPROXY_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib,
                                            int value) {
  return guarded(__func__, [&](Runtime& runtime) {
    ResolvedFunction function;
    if (CUresult result = resolveFunction(runtime, handleValue(hfunc), 0, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    return setAttribute("cuFuncSetAttribute", function, gpuproxy::stub::enumValue(attrib), value);
  });
}

GPUPROXY_EXPORT CUresult cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel kernel,
                                              CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ResolvedFunction function;
    if (CUresult result = resolveKernelOnDevice(runtime, kernel, dev, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    return getAttribute(function, gpuproxy::stub::enumValue(attrib), *pi);
  });
}

GPUPROXY_EXPORT CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel,
                                              CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    ResolvedFunction function;
    if (CUresult result = resolveKernelOnDevice(runtime, kernel, dev, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    return setAttribute("cuKernelSetAttribute", function, gpuproxy::stub::enumValue(attrib), val);
  });
}

GPUPROXY_EXPORT CUresult cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (hmod == nullptr || hfunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ResolvedFunction function;
    if (CUresult result = resolveFunction(runtime, handleValue(hfunc), 0, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    *hmod = gpuproxy::stub::toHandle<CUmodule>(function.kernel->module);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuFuncGetName(const char** name, CUfunction hfunc) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (name == nullptr || hfunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ResolvedFunction function;
    if (CUresult result = resolveFunction(runtime, handleValue(hfunc), 0, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    // The record lives while the function does: the pointer stays valid as long as the driver
    // promises (until the module is unloaded).
    *name = function.kernel->name.c_str();
    return CUDA_SUCCESS;
  });
}

// Functions are whole once their module is loaded (the daemon loads modules eagerly), so loading
// one is only the check that it exists.
GPUPROXY_EXPORT CUresult cuFuncLoad(CUfunction function) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    ResolvedFunction resolved;
    return resolveFunction(runtime, handleValue(function), 0, resolved);
  });
}

GPUPROXY_EXPORT CUresult cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction function) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    ResolvedFunction resolved;
    if (CUresult result = resolveFunction(runtime, handleValue(function), 0, resolved);
        result != CUDA_SUCCESS) {
      return result;
    }
    *state = CU_FUNCTION_LOADING_STATE_LOADED;
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                            size_t* paramSize) {
  return guarded(__func__, [&](Runtime& runtime) {
    ResolvedFunction function;
    if (CUresult result = resolveFunction(runtime, handleValue(func), 0, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    return parameterInfo(*function.kernel, paramIndex, paramOffset, paramSize);
  });
}

// The layout comes from the daemon's look-up of the kernel in a context, so the kernel is
// resolved in the current context (its library is loaded there if it was not yet).
GPUPROXY_EXPORT CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex,
                                              size_t* paramOffset, size_t* paramSize) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (!gpuproxy::stub::isLibraryKernel(handleValue(kernel))) return CUDA_ERROR_INVALID_HANDLE;
    ResolvedFunction function;
    if (CUresult result = resolveFunction(runtime, handleValue(kernel), 0, function);
        result != CUDA_SUCCESS) {
      return result;
    }
    return parameterInfo(*function.kernel, paramIndex, paramOffset, paramSize);
  });
}

// ---- cache and shared-memory hints -----------------------------------------------------------
// Preferences the driver may ignore; the daemon's backends choose their own configuration, so
// they are checked and accepted.

GPUPROXY_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  return guarded(__func__, [&](Runtime& runtime) {
    const int preference = gpuproxy::stub::enumValue(config);
    if (preference < CU_FUNC_CACHE_PREFER_NONE || preference > CU_FUNC_CACHE_PREFER_EQUAL) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    ResolvedFunction function;
    return resolveFunction(runtime, handleValue(hfunc), 0, function);
  });
}

GPUPROXY_EXPORT CUresult cuFuncSetSharedMemConfig(CUfunction hfunc, CUsharedconfig config) {
  return guarded(__func__, [&](Runtime& runtime) {
    const int banks = gpuproxy::stub::enumValue(config);
    if (banks < CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE ||
        banks > CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    ResolvedFunction function;
    return resolveFunction(runtime, handleValue(hfunc), 0, function);
  });
}

GPUPROXY_EXPORT CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config,
                                                CUdevice dev) {
  return guarded(__func__, [&](Runtime& runtime) {
    const int preference = gpuproxy::stub::enumValue(config);
    if (preference < CU_FUNC_CACHE_PREFER_NONE || preference > CU_FUNC_CACHE_PREFER_EQUAL) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    ResolvedFunction function;
    return resolveKernelOnDevice(runtime, kernel, dev, function);
  });
}

// ---- occupancy -------------------------------------------------------------------------------

GPUPROXY_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks,
                                                                     CUfunction func, int blockSize,
                                                                     size_t dynamicSMemSize) {
  return maxActiveBlocks(__func__, numBlocks, func, blockSize, dynamicSMemSize,
                         CU_OCCUPANCY_DEFAULT);
}

GPUPROXY_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags) {
  return maxActiveBlocks(__func__, numBlocks, func, blockSize, dynamicSMemSize, flags);
}

GPUPROXY_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(
    int* minGridSize, int* blockSize, CUfunction func,
    CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize, int blockSizeLimit) {
  return maxPotentialBlockSize(__func__, minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                               dynamicSMemSize, blockSizeLimit, CU_OCCUPANCY_DEFAULT);
}

GPUPROXY_EXPORT CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(
    int* minGridSize, int* blockSize, CUfunction func,
    CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize, int blockSizeLimit,
    unsigned int flags) {
  return maxPotentialBlockSize(__func__, minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                               dynamicSMemSize, blockSizeLimit, flags);
}

// The most dynamic shared memory each block may have for `numBlocks` blocks of `blockSize`
// threads to be resident on one multiprocessor. Unlike cuda_occupancy.h, the reserved per-block
// shared memory is counted too, so that launching with the answer keeps `numBlocks` resident.
GPUPROXY_EXPORT CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* dynamicSmemSize,
                                                                 CUfunction func, int numBlocks,
                                                                 int blockSize) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (dynamicSmemSize == nullptr || numBlocks <= 0 || blockSize <= 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    ResolvedFunction function;
    DeviceLimits limits;
    if (CUresult result = prepareOccupancy(runtime, func, 0, function, limits);
        result != CUDA_SUCCESS) {
      return result;
    }
    const KernelNeeds kernel = needsOf(function);
    // Even without dynamic shared memory that many blocks do not fit.
    if (activeBlocksPerMultiprocessor(limits, kernel, blockSize, 0) < numBlocks) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::int64_t perBlockLimit = limits.sharedPerBlockOptIn + limits.reservedSharedPerBlock;
    std::int64_t perMultiprocessor =
        numBlocks == 1 ? perBlockLimit : preferredSharedPerMultiprocessor(kernel.carveout, limits);
    std::int64_t perBlock =
        perMultiprocessor / numBlocks / kSharedAllocationUnit * kSharedAllocationUnit;
    perBlock = std::min(perBlock, perBlockLimit);
    std::int64_t available = perBlock - kernel.staticShared - limits.reservedSharedPerBlock;
    available = std::clamp<std::int64_t>(available, 0, kernel.maxDynamicShared);
    *dynamicSmemSize = static_cast<size_t>(available);
    return CUDA_SUCCESS;
  });
}

// ---- clusters ----------------------------------------------------------------------------------

namespace {

// The cluster size a launch configuration asks for: 1 when it names none.
std::uint64_t clusterSizeOf(const CUlaunchConfig& config) {
  for (unsigned i = 0; i < config.numAttrs && config.attrs != nullptr; ++i) {
    if (config.attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      const auto& dim = config.attrs[i].value.clusterDim;
      return std::uint64_t{dim.x} * dim.y * dim.z;
    }
  }
  return 1;
}

}  // namespace

// The devices gpuproxy serves report no cluster launch (CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH 0): a
// cluster of one block is every block on its own, so as many fit as blocks are resident on the
// whole device; no larger cluster fits at all. (cuBLAS asks before it picks its kernels.)
GPUPROXY_EXPORT CUresult cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func,
                                                      const CUlaunchConfig* config) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (numClusters == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const unsigned blockSize = config->blockDimX * config->blockDimY * config->blockDimZ;
    if (blockSize == 0) return CUDA_ERROR_INVALID_VALUE;
    ResolvedFunction function;
    DeviceLimits limits;
    if (CUresult result = prepareOccupancy(runtime, func, 0, function, limits);
        result != CUDA_SUCCESS) {
      return result;
    }
    if (clusterSizeOf(*config) > 1) {
      *numClusters = 0;
      return CUDA_SUCCESS;
    }
    const int perMultiprocessor =
        activeBlocksPerMultiprocessor(limits, needsOf(function), static_cast<int>(blockSize),
                                      static_cast<std::int64_t>(config->sharedMemBytes));
    *numClusters =
        perMultiprocessor *
        std::max(deviceAttribute(function.device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 0);
    return CUDA_SUCCESS;
  });
}

GPUPROXY_EXPORT CUresult cuOccupancyMaxPotentialClusterSize(int* clusterSize, CUfunction func,
                                                            const CUlaunchConfig* config) {
  return guarded(__func__, [&](Runtime& runtime) {
    if (clusterSize == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ResolvedFunction function;
    DeviceLimits limits;
    if (CUresult result = prepareOccupancy(runtime, func, 0, function, limits);
        result != CUDA_SUCCESS) {
      return result;
    }
    *clusterSize = 1;
    return CUDA_SUCCESS;
  });
}
