// A driver-API program that exercises the calls around launches and copies that applications and
// the CUDA runtime use besides the basic ones: function and kernel attributes, the occupancy
// calculator, pointer attributes, 2D copies, host functions on streams, cuLaunchKernelEx and the
// stream queries, managed memory, graphs made by stream capture, CUDA arrays and texture objects.
// One line per check, "<check> <value>", where a value is a CUresult name, a number, or "yes"/"no"
// for a property the program checked itself. Runs on a GPU too.
//
//   driver_surface

#include <cuda.h>
#include <cudaProfiler.h>

#include "test_kernels_ptx.hpp"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

const char* nameOf(CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) return "UNKNOWN";
  return name;
}

void report(const char* check, CUresult result) {
  std::printf("%s %s\n", check, nameOf(result));
}
void reportNumber(const char* check, long long value) {
  std::printf("%s %lld\n", check, value);
}
void reportYes(const char* check, bool value) {
  std::printf("%s %s\n", check, value ? "yes" : "no");
}

#define MUST(call)                                           \
  do {                                                       \
    const CUresult result_ = (call);                         \
    if (result_ != CUDA_SUCCESS) {                           \
      std::printf("failed %s %s\n", #call, nameOf(result_)); \
      std::exit(1);                                          \
    }                                                        \
  } while (0)

CUdevice gDevice = 0;
CUcontext gContext = nullptr;

int deviceAttribute(CUdevice_attribute which) {
  int value = 0;
  MUST(cuDeviceGetAttribute(&value, which, gDevice));
  return value;
}

int functionAttribute(CUfunction function, CUfunction_attribute which) {
  int value = 0;
  MUST(cuFuncGetAttribute(&value, which, function));
  return value;
}

void fill(CUfunction fillU32, CUstream stream, CUdeviceptr memory, unsigned value,
          unsigned long long count) {
  void* parameters[] = {&memory, &value, &count};
  MUST(cuLaunchKernel(fillU32, static_cast<unsigned>((count + 255) / 256), 1, 1, 256, 1, 1, 0,
                      stream, parameters, nullptr));
}

void functionAttributes(CUmodule module) {
  CUfunction fillU32 = nullptr;
  MUST(cuModuleGetFunction(&fillU32, module, "fill_u32"));
  const int staticShared = functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  reportNumber("attr-max-threads",
               functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
  reportNumber("attr-shared", staticShared);
  reportNumber("attr-num-regs", functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_NUM_REGS));
  reportNumber("attr-binary-version", functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_BINARY_VERSION));
  reportNumber("can-map-host-memory", deviceAttribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY));
  reportNumber("device-cc", deviceAttribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
                                deviceAttribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  reportNumber("attr-carveout",
               functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT));
  const int defaultDynamic =
      functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  reportYes("attr-max-dynamic-default",
            defaultDynamic ==
                deviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK) - staticShared);
  int unused = 0;
  report("attr-bad", cuFuncGetAttribute(&unused, static_cast<CUfunction_attribute>(9999), fillU32));
  report("attr-null-function", cuFuncGetAttribute(&unused, CU_FUNC_ATTRIBUTE_NUM_REGS, nullptr));

  const char* name = nullptr;
  MUST(cuFuncGetName(&name, fillU32));
  std::printf("func-name %s\n", name);
  CUmodule owner = nullptr;
  report("func-module", cuFuncGetModule(&owner, fillU32));
  reportYes("func-module-is-its-module", owner == module);
  report("func-module-null-function", cuFuncGetModule(&owner, nullptr));
  size_t offset = 0;
  size_t size = 0;
  for (size_t i = 0; i < 3; ++i) {
    MUST(cuFuncGetParamInfo(fillU32, i, &offset, &size));
    std::printf("param-%zu %zu+%zu\n", i, offset, size);
  }
  report("param-out-of-range", cuFuncGetParamInfo(fillU32, 3, &offset, &size));
  report("cache-config", cuFuncSetCacheConfig(fillU32, CU_FUNC_CACHE_PREFER_SHARED));
  // Deprecated in cuda.h, still exported and still called by older code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  report("shared-config",
         cuFuncSetSharedMemConfig(fillU32, CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE));
#pragma GCC diagnostic pop

  // More dynamic shared memory than the default limit: refused, then allowed once opted in.
  CUdeviceptr memory = 0;
  MUST(cuMemAlloc(&memory, 1024 * sizeof(unsigned)));
  CUdeviceptr target = memory;
  unsigned value = 5;
  unsigned long long count = 1024;
  void* parameters[] = {&target, &value, &count};
  const unsigned large = 64 * 1024;
  report("launch-large-shared-before",
         cuLaunchKernel(fillU32, 4, 1, 1, 256, 1, 1, large, nullptr, parameters, nullptr));
  report("set-max-dynamic",
         cuFuncSetAttribute(fillU32, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, large));
  reportNumber("attr-max-dynamic-set",
               functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES));
  report("launch-large-shared-after",
         cuLaunchKernel(fillU32, 4, 1, 1, 256, 1, 1, large, nullptr, parameters, nullptr));
  report("launch-large-shared-sync", cuCtxSynchronize());
  report("launch-over-set",
         cuLaunchKernel(fillU32, 4, 1, 1, 256, 1, 1, large + 1024, nullptr, parameters, nullptr));
  const int optIn = deviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  report("set-max-dynamic-over-optin",
         cuFuncSetAttribute(fillU32, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            optIn - staticShared + 1));
  report("set-carveout",
         cuFuncSetAttribute(fillU32, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50));
  report("set-carveout-bad",
         cuFuncSetAttribute(fillU32, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 101));
  report("set-read-only", cuFuncSetAttribute(fillU32, CU_FUNC_ATTRIBUTE_NUM_REGS, 16));
  report("set-cluster", cuFuncSetAttribute(fillU32, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, 2));
  // A permission about clusters (cuBLAS sets it on every kernel): kept, and answered back.
  report("set-non-portable-cluster",
         cuFuncSetAttribute(fillU32, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
  reportNumber("attr-non-portable-cluster",
               functionAttribute(fillU32, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED));
  MUST(cuMemFree(memory));
}

// What the documented calculator gives for the sim-like devices this is checked on, computed
// the plain way: the least of the warp, block-slot, register and shared-memory limits.
int expectedBlocks(int registers, int staticShared, int blockSize, int dynamicShared) {
  const int warpSize = deviceAttribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  const int warps = (blockSize + warpSize - 1) / warpSize;
  int blocks =
      deviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) / warpSize / warps;
  blocks = std::min(blocks, deviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR));
  const int perWarp = (registers * warpSize + 255) / 256 * 256;
  if (perWarp > 0) {
    const int warpsPerQuarter =
        deviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR) / 4 / perWarp;
    blocks = std::min(blocks, warpsPerQuarter * 4 / warps);
  }
  const int perBlock =
      (staticShared + dynamicShared +
       deviceAttribute(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK) + 127) /
      128 * 128;
  blocks = std::min(
      blocks, deviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) / perBlock);
  return blocks;
}

size_t sixtyFourBytesPerThread(int blockSize) {
  return static_cast<size_t>(blockSize) * 64;
}

void occupancy(CUmodule module) {
  CUfunction vectorAdd = nullptr;
  MUST(cuModuleGetFunction(&vectorAdd, module, "vector_add"));
  const int registers = functionAttribute(vectorAdd, CU_FUNC_ATTRIBUTE_NUM_REGS);
  const int staticShared = functionAttribute(vectorAdd, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  int blocks = 0;
  MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vectorAdd, 256, 0));
  reportNumber("occupancy-256", blocks);
  reportYes("occupancy-256-expected", blocks == expectedBlocks(registers, staticShared, 256, 0));
  MUST(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, vectorAdd, 128, 40000,
                                                            CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE));
  reportNumber("occupancy-128-40000", blocks);
  reportYes("occupancy-128-40000-expected",
            blocks == expectedBlocks(registers, staticShared, 128, 40000));
  MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vectorAdd, 64, 60000));
  reportNumber("occupancy-over-dynamic-limit", blocks);
  report("occupancy-zero-block",
         cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vectorAdd, 0, 0));
  report("occupancy-bad-flags",
         cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, vectorAdd, 128, 0, 8));

  // Clusters: one block is a cluster of its own everywhere; the device has no larger ones.
  CUlaunchConfig config{};
  config.gridDimX = 1;
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = 256;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  int clusters = -1;
  MUST(cuOccupancyMaxActiveClusters(&clusters, vectorAdd, &config));
  MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vectorAdd, 256, 0));
  reportYes("clusters-of-one-fill-the-device",
            clusters == blocks * deviceAttribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
  CUlaunchAttribute pair{};
  pair.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  pair.value.clusterDim.x = 2;
  pair.value.clusterDim.y = 1;
  pair.value.clusterDim.z = 1;
  config.attrs = &pair;
  config.numAttrs = 1;
  MUST(cuOccupancyMaxActiveClusters(&clusters, vectorAdd, &config));
  reportNumber("clusters-of-two", clusters);
  int clusterSize = 0;
  MUST(cuOccupancyMaxPotentialClusterSize(&clusterSize, vectorAdd, &config));
  reportNumber("potential-cluster-size", clusterSize);

  // Limits: the driver's defaults until set; what was granted reads back.
  size_t stack = 0;
  MUST(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
  reportNumber("limit-stack", static_cast<long long>(stack));
  report("limit-keep-stack", cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack));
  report("limit-grow-heap", cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, size_t{64} << 20));
  size_t heap = 0;
  MUST(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE));
  reportNumber("limit-heap-mib", static_cast<long long>(heap >> 20));
  size_t granularity = 0;
  MUST(cuCtxSetLimit(CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 1000));
  MUST(cuCtxGetLimit(&granularity, CU_LIMIT_MAX_L2_FETCH_GRANULARITY));
  reportNumber("limit-l2-fetch-granularity", static_cast<long long>(granularity));
  // No context is a CUDA-in-graphics one (cuBLAS asks before it sizes its launches).
  size_t cig = 1;
  MUST(cuCtxGetLimit(&cig, CU_LIMIT_CIG_ENABLED));
  reportNumber("limit-cig-enabled", static_cast<long long>(cig));
  report("limit-set-cig-enabled", cuCtxSetLimit(CU_LIMIT_CIG_ENABLED, 1));
  report("limit-unknown", cuCtxGetLimit(&stack, static_cast<CUlimit>(0x7f)));
  report("limit-set-unknown", cuCtxSetLimit(static_cast<CUlimit>(0x7f), 1));

  int minGrid = 0;
  int blockSize = 0;
  MUST(cuOccupancyMaxPotentialBlockSize(&minGrid, &blockSize, vectorAdd, nullptr, 0, 0));
  reportNumber("potential-block", blockSize);
  reportNumber("potential-grid", minGrid);
  MUST(cuOccupancyMaxPotentialBlockSizeWithFlags(&minGrid, &blockSize, vectorAdd,
                                                 &sixtyFourBytesPerThread, 0, 0, 0));
  reportNumber("potential-callback-block", blockSize);
  MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vectorAdd, blockSize,
                                                   sixtyFourBytesPerThread(blockSize)));
  reportYes("potential-callback-grid-consistent",
            minGrid == blocks * deviceAttribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
  // No warp-multiple block size below it keeps more threads resident.
  bool best = true;
  for (int tried = 32; tried <= 1024; tried += 32) {
    int other = 0;
    MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&other, vectorAdd, tried,
                                                     sixtyFourBytesPerThread(tried)));
    if (other * tried > blocks * blockSize) best = false;
  }
  reportYes("potential-callback-best", best);
  MUST(cuOccupancyMaxPotentialBlockSize(&minGrid, &blockSize, vectorAdd, nullptr, 0, 96));
  reportNumber("potential-limited-block", blockSize);

  size_t available = 0;
  MUST(cuOccupancyAvailableDynamicSMemPerBlock(&available, vectorAdd, 3, 256));
  reportNumber("available-dynamic-3x256", static_cast<long long>(available));
  MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vectorAdd, 256, available));
  reportYes("available-dynamic-fits", blocks >= 3);
  MUST(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, vectorAdd, 256, available + 128));
  reportYes(
      "available-dynamic-tight",
      blocks < 3 || available == static_cast<size_t>(functionAttribute(
                                     vectorAdd, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)));
  report("available-dynamic-too-many",
         cuOccupancyAvailableDynamicSMemPerBlock(&available, vectorAdd, 1000, 256));
}

void kernels() {
  CUlibrary library = nullptr;
  MUST(cuLibraryLoadData(&library, gpuproxy::testing::kTestKernelsPtx, nullptr, nullptr, 0, nullptr,
                         nullptr, 0));
  CUkernel kernel = nullptr;
  MUST(cuLibraryGetKernel(&kernel, library, "fill_u32"));
  int registers = -1;
  report("kernel-get-attribute",
         cuKernelGetAttribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, kernel, gDevice));
  CUfunction function = nullptr;
  MUST(cuKernelGetFunction(&function, kernel));
  reportYes("kernel-attribute-matches",
            registers == functionAttribute(function, CU_FUNC_ATTRIBUTE_NUM_REGS));
  report("kernel-bad-device",
         cuKernelGetAttribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, kernel, 99));
  report("kernel-set-attribute",
         cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 80 * 1024, kernel,
                              gDevice));
  int dynamic = 0;
  MUST(cuKernelGetAttribute(&dynamic, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel,
                            gDevice));
  reportNumber("kernel-max-dynamic", dynamic);
  report("kernel-cache-config", cuKernelSetCacheConfig(kernel, CU_FUNC_CACHE_PREFER_L1, gDevice));
  size_t offset = 0;
  size_t size = 0;
  MUST(cuKernelGetParamInfo(kernel, 2, &offset, &size));
  std::printf("kernel-param-2 %zu+%zu\n", offset, size);
  // A CUkernel where a CUfunction is expected, as the CUDA runtime passes it.
  int blocks = 0;
  report("kernel-occupancy", cuOccupancyMaxActiveBlocksPerMultiprocessor(
                                 &blocks, reinterpret_cast<CUfunction>(kernel), 256, 0));
  reportYes("kernel-occupancy-positive", blocks > 0);
  int threads = 0;
  report("kernel-as-function-attribute",
         cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                            reinterpret_cast<CUfunction>(kernel)));
  MUST(cuLibraryUnload(library));
}

void pointers() {
  CUdeviceptr first = 0;
  CUdeviceptr second = 0;
  MUST(cuMemAlloc(&first, 1 << 20));
  MUST(cuMemAlloc(&second, 4096));
  const CUdeviceptr inside = first + 100;
  unsigned memoryType = 0;
  MUST(cuPointerGetAttribute(&memoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside));
  reportNumber("device-memory-type", memoryType);
  CUcontext context = nullptr;
  MUST(cuPointerGetAttribute(&context, CU_POINTER_ATTRIBUTE_CONTEXT, inside));
  reportYes("device-context", context == gContext);
  int ordinal = -1;
  MUST(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, inside));
  reportNumber("device-ordinal", ordinal);
  CUdeviceptr start = 0;
  MUST(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside));
  reportYes("device-range-start", start == first);
  size_t rangeSize = 0;
  MUST(cuPointerGetAttribute(&rangeSize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inside));
  reportNumber("device-range-size", static_cast<long long>(rangeSize));
  CUdeviceptr devicePointer = 0;
  MUST(cuPointerGetAttribute(&devicePointer, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, inside));
  reportYes("device-device-pointer", devicePointer == inside);
  void* hostPointer = nullptr;
  report("device-host-pointer",
         cuPointerGetAttribute(&hostPointer, CU_POINTER_ATTRIBUTE_HOST_POINTER, inside));
  unsigned long long firstId = 0;
  unsigned long long secondId = 0;
  MUST(cuPointerGetAttribute(&firstId, CU_POINTER_ATTRIBUTE_BUFFER_ID, inside));
  MUST(cuPointerGetAttribute(&secondId, CU_POINTER_ATTRIBUTE_BUFFER_ID, second));
  reportYes("device-buffer-ids-differ", firstId != 0 && secondId != 0 && firstId != secondId);
  unsigned managed = 7;
  MUST(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, inside));
  reportNumber("device-managed", managed);
  unsigned mapped = 0;
  MUST(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, inside));
  reportNumber("device-mapped", mapped);
  CUdeviceptr base = 0;
  size_t bytes = 0;
  MUST(cuMemGetAddressRange(&base, &bytes, inside));
  reportYes("address-range", base == first && bytes == (1 << 20));
  unsigned syncMemops = 7;
  MUST(cuPointerGetAttribute(&syncMemops, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, inside));
  const unsigned on = 1;
  report("sync-memops-set", cuPointerSetAttribute(&on, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, inside));
  unsigned syncMemopsAfter = 0;
  MUST(cuPointerGetAttribute(&syncMemopsAfter, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, first));
  unsigned syncMemopsOther = 7;
  MUST(cuPointerGetAttribute(&syncMemopsOther, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, second));
  reportYes("sync-memops-reads-back",
            syncMemops == 0 && syncMemopsAfter == 1 && syncMemopsOther == 0);
  report("set-other-attribute",
         cuPointerSetAttribute(&on, CU_POINTER_ATTRIBUTE_IS_MANAGED, inside));

  // Several at once, as cudaPointerGetAttributes asks.
  CUpointer_attribute asked[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_HOST_POINTER, CU_POINTER_ATTRIBUTE_IS_MANAGED};
  memoryType = 99;
  ordinal = 99;
  hostPointer = &ordinal;
  managed = 99;
  void* answers[] = {&memoryType, &ordinal, &hostPointer, &managed};
  report("attributes-device", cuPointerGetAttributes(4, asked, answers, second));
  reportYes("attributes-device-values", memoryType == CU_MEMORYTYPE_DEVICE && ordinal == 0 &&
                                            hostPointer == nullptr && managed == 0);

  void* pinned = nullptr;
  MUST(cuMemHostAlloc(&pinned, 10000, CU_MEMHOSTALLOC_PORTABLE));
  void* pinnedInside = static_cast<char*>(pinned) + 10;
  const auto pinnedAddress = reinterpret_cast<CUdeviceptr>(pinnedInside);
  MUST(cuPointerGetAttribute(&memoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pinnedAddress));
  reportNumber("host-memory-type", memoryType);
  MUST(cuPointerGetAttribute(&hostPointer, CU_POINTER_ATTRIBUTE_HOST_POINTER, pinnedAddress));
  reportYes("host-host-pointer", hostPointer == pinnedInside);
  MUST(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, pinnedAddress));
  reportYes("host-range-start", start == reinterpret_cast<CUdeviceptr>(pinned));
  MUST(cuPointerGetAttribute(&context, CU_POINTER_ATTRIBUTE_CONTEXT, pinnedAddress));
  reportYes("host-context", context == gContext);
  MUST(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pinnedAddress));
  reportNumber("host-ordinal", ordinal);
  unsigned hostFlags = 99;
  report("host-flags", cuMemHostGetFlags(&hostFlags, pinnedInside));
  reportNumber("host-flags-value", hostFlags);
  std::vector<char> notPinned(64);
  report("host-flags-pageable", cuMemHostGetFlags(&hostFlags, notPinned.data()));
  MUST(cuMemFreeHost(pinned));
  report("host-flags-freed", cuMemHostGetFlags(&hostFlags, pinnedInside));
  report("freed-host-memory-type",
         cuPointerGetAttribute(&memoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pinnedAddress));

  std::vector<char> pageable(100);
  const auto pageableAddress = reinterpret_cast<CUdeviceptr>(pageable.data());
  report("unknown-memory-type",
         cuPointerGetAttribute(&memoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pageableAddress));
  memoryType = 99;
  ordinal = 99;
  hostPointer = &ordinal;
  managed = 99;
  report("attributes-unknown", cuPointerGetAttributes(4, asked, answers, pageableAddress));
  reportNumber("attributes-unknown-type", memoryType);
  reportNumber("attributes-unknown-ordinal", ordinal);
  reportYes("attributes-unknown-host-null", hostPointer == nullptr);
  reportNumber("attributes-unknown-managed", managed);
  report("unknown-address-range", cuMemGetAddressRange(&base, &bytes, pageableAddress));
  MUST(cuMemFree(first));
  MUST(cuMemFree(second));
  report("freed-device-memory-type",
         cuPointerGetAttribute(&memoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inside));
}

void copies2D() {
  constexpr size_t kWidth = 100;
  constexpr size_t kHeight = 7;
  constexpr size_t kHostPitch = 128;
  constexpr size_t kDevicePitch = 256;
  constexpr size_t kBackPitch = 160;
  std::vector<unsigned char> source(kHostPitch * kHeight);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<unsigned char>(i * 7 + 3);
  CUdeviceptr device = 0;
  CUdeviceptr second = 0;
  MUST(cuMemAlloc(&device, kDevicePitch * kHeight));
  MUST(cuMemAlloc(&second, kDevicePitch * kHeight));
  MUST(cuMemsetD8(device, 0xAB, kDevicePitch * kHeight));
  MUST(cuMemsetD8(second, 0xCD, kDevicePitch * kHeight));

  CUDA_MEMCPY2D up{};
  up.srcMemoryType = CU_MEMORYTYPE_HOST;
  up.srcHost = source.data();
  up.srcPitch = kHostPitch;
  up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  up.dstDevice = device;
  up.dstPitch = kDevicePitch;
  up.WidthInBytes = kWidth;
  up.Height = kHeight;
  report("copy2d-up", cuMemcpy2D(&up));

  // Device to device through unified addressing, on a stream.
  CUstream stream = nullptr;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUDA_MEMCPY2D across{};
  across.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  across.srcDevice = device;
  across.srcPitch = kDevicePitch;
  across.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  across.dstDevice = second;
  across.dstPitch = kDevicePitch;
  across.WidthInBytes = kWidth;
  across.Height = kHeight;
  report("copy2d-across-async", cuMemcpy2DAsync(&across, stream));
  MUST(cuStreamSynchronize(stream));

  std::vector<unsigned char> back(kBackPitch * kHeight, 0x11);
  CUDA_MEMCPY2D down{};
  down.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  down.srcDevice = second;
  down.srcPitch = kDevicePitch;
  down.dstMemoryType = CU_MEMORYTYPE_HOST;
  down.dstHost = back.data();
  down.dstPitch = kBackPitch;
  down.WidthInBytes = kWidth;
  down.Height = kHeight;
  report("copy2d-down", cuMemcpy2DUnaligned(&down));
  bool rowsMatch = true;
  bool hostPaddingKept = true;
  for (size_t row = 0; row < kHeight; ++row) {
    if (std::memcmp(&back[row * kBackPitch], &source[row * kHostPitch], kWidth) != 0) {
      rowsMatch = false;
    }
    for (size_t x = kWidth; x < kBackPitch; ++x) {
      if (back[row * kBackPitch + x] != 0x11) hostPaddingKept = false;
    }
  }
  reportYes("copy2d-round-trip", rowsMatch);
  reportYes("copy2d-host-padding-untouched", hostPaddingKept);
  std::vector<unsigned char> whole(kDevicePitch * kHeight);
  MUST(cuMemcpyDtoH(whole.data(), device, whole.size()));
  bool devicePaddingKept = true;
  for (size_t row = 0; row < kHeight; ++row) {
    for (size_t x = kWidth; x < kDevicePitch; ++x) {
      if (whole[row * kDevicePitch + x] != 0xAB) devicePaddingKept = false;
    }
  }
  reportYes("copy2d-device-padding-untouched", devicePaddingKept);

  // A contiguous copy (pitches equal the width) goes as one.
  std::vector<unsigned char> packed(kWidth * kHeight);
  CUDA_MEMCPY2D contiguous = down;
  contiguous.srcDevice = device;
  contiguous.srcPitch = kWidth;
  contiguous.dstHost = packed.data();
  contiguous.dstPitch = kWidth;
  report("copy2d-contiguous", cuMemcpy2D(&contiguous));
  reportYes("copy2d-contiguous-bytes",
            std::memcmp(packed.data(), whole.data(), packed.size()) == 0);

  CUDA_MEMCPY2D bad = up;
  bad.dstPitch = kWidth - 1;
  report("copy2d-width-over-pitch", cuMemcpy2D(&bad));
  bad = up;
  bad.dstXInBytes = kDevicePitch - kWidth + 1;
  report("copy2d-x-over-pitch", cuMemcpy2D(&bad));
  bad = up;
  bad.Height = kHeight + 1;
  report("copy2d-past-allocation", cuMemcpy2D(&bad));
  bad = up;
  bad.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  report("copy2d-array", cuMemcpy2D(&bad));
  MUST(cuStreamDestroy(stream));
  MUST(cuMemFree(device));
  MUST(cuMemFree(second));
}

// Host work on a stream: runs after the kernel and the copy before it, and before the copy after
// it reads the buffer it writes.
struct HostStep {
  unsigned* buffer = nullptr;
  size_t count = 0;
  unsigned expected = 0;
  unsigned replacement = 0;
  bool sawExpected = false;
  int calls = 0;
  CUresult status = CUDA_ERROR_UNKNOWN;
};

// A batch of copies (cuMemcpyBatchAsync): up from pageable memory read during the call (then
// overwritten), across, and down into pinned memory; then what the driver refuses. CUDA 12.8's
// form, found by cuGetProcAddress at that version, names the copy that failed.
void batchCopies() {
  using BatchWithFailIndex = CUresult (*)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t,
                                          CUmemcpyAttributes*, size_t*, size_t, size_t*, CUstream);
  void* found = nullptr;
  MUST(cuGetProcAddress("cuMemcpyBatchAsync", &found, 12080, CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
  const auto batch = reinterpret_cast<BatchWithFailIndex>(found);
  constexpr size_t kWords = 1024;
  constexpr size_t kBytes = kWords * sizeof(unsigned);
  std::vector<unsigned> source(kWords);
  for (size_t i = 0; i < kWords; ++i) source[i] = static_cast<unsigned>(i * 3 + 1);
  unsigned* back = nullptr;
  MUST(cuMemAllocHost(reinterpret_cast<void**>(&back), kBytes));
  CUdeviceptr first = 0;
  CUdeviceptr second = 0;
  MUST(cuMemAlloc(&first, kBytes));
  MUST(cuMemAlloc(&second, kBytes));
  CUstream stream = nullptr;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  const auto host = [](const void* pointer) {
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(pointer));
  };
  CUdeviceptr up[] = {first};
  CUdeviceptr upFrom[] = {host(source.data())};
  size_t upBytes[] = {kBytes};
  CUmemcpyAttributes duringCall{};
  duringCall.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
  size_t firstCopy[] = {0};
  size_t failed = 0;
  report("batch-up", cuMemcpyBatchAsync(up, upFrom, upBytes, 1, &duringCall, firstCopy, 1, stream));
  std::fill(source.begin(), source.end(), 0u);  // the copy has read it already

  CUdeviceptr dsts[] = {second, host(back)};
  CUdeviceptr srcs[] = {first, second};
  size_t sizes[] = {kBytes, kBytes};
  CUmemcpyAttributes inOrder{};
  inOrder.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  report("batch-across-down",
         cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &inOrder, firstCopy, 1, stream));
  MUST(cuStreamSynchronize(stream));
  bool same = true;
  for (size_t i = 0; i < kWords; ++i) same = same && back[i] == i * 3 + 1;
  reportYes("batch-round-trip", same);

  // Refused: the legacy stream, an attribute without a source order (failIdx names the copy it
  // covers), attributes not starting at copy 0, and a copy past its allocation (failIdx 1).
  report("batch-legacy-stream",
         cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &inOrder, firstCopy, 1, nullptr));
  CUmemcpyAttributes mixed[] = {inOrder, CUmemcpyAttributes{}};
  size_t mixedStarts[] = {0, 1};
  report("batch-no-order", batch(dsts, srcs, sizes, 2, mixed, mixedStarts, 2, &failed, stream));
  reportNumber("batch-no-order-index", static_cast<long long>(failed));
  size_t late[] = {1};
  report("batch-late-attributes",
         cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &inOrder, late, 1, stream));
  size_t tooLong[] = {kBytes, kBytes + 4};
  report("batch-past-allocation",
         batch(dsts, srcs, tooLong, 2, &inOrder, firstCopy, 1, &failed, stream));
  reportNumber("batch-past-allocation-index", static_cast<long long>(failed));
  MUST(cuStreamSynchronize(stream));
  MUST(cuStreamDestroy(stream));
  MUST(cuMemFree(first));
  MUST(cuMemFree(second));
  MUST(cuMemFreeHost(back));
}

void runHostStep(void* data) {
  auto* step = static_cast<HostStep*>(data);
  step->calls += 1;
  step->sawExpected = true;
  for (size_t i = 0; i < step->count; ++i) {
    if (step->buffer[i] != step->expected) step->sawExpected = false;
    step->buffer[i] = step->replacement;
  }
}

void CUDA_CB hostCallback(CUstream, CUresult status, void* data) {
  static_cast<HostStep*>(data)->status = status;
  runHostStep(data);
}

void hostFunctions(CUfunction fillU32) {
  constexpr size_t kCount = 1 << 16;
  CUstream stream = nullptr;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr device = 0;
  MUST(cuMemAlloc(&device, kCount * sizeof(unsigned)));
  void* pinned = nullptr;
  MUST(cuMemHostAlloc(&pinned, kCount * sizeof(unsigned), 0));
  std::vector<unsigned> result(kCount);

  for (int variant = 0; variant < 2; ++variant) {
    const bool callback = variant == 1;
    HostStep step{static_cast<unsigned*>(pinned), kCount, 7u + variant, 9u + variant};
    fill(fillU32, stream, device, step.expected, kCount);
    MUST(cuMemcpyDtoHAsync(pinned, device, kCount * sizeof(unsigned), stream));
    const CUresult queued = callback ? cuStreamAddCallback(stream, &hostCallback, &step, 0)
                                     : cuLaunchHostFunc(stream, &runHostStep, &step);
    MUST(cuMemcpyHtoDAsync(device, pinned, kCount * sizeof(unsigned), stream));
    MUST(cuMemcpyDtoHAsync(result.data(), device, kCount * sizeof(unsigned), stream));
    MUST(cuStreamSynchronize(stream));
    bool later = true;
    for (unsigned value : result) later = later && value == step.replacement;
    const char* prefix = callback ? "callback" : "host-func";
    char check[64];
    std::snprintf(check, sizeof(check), "%s-queued", prefix);
    report(check, queued);
    std::snprintf(check, sizeof(check), "%s-calls", prefix);
    reportNumber(check, step.calls);
    std::snprintf(check, sizeof(check), "%s-after-earlier-work", prefix);
    reportYes(check, step.sawExpected);
    std::snprintf(check, sizeof(check), "%s-before-later-work", prefix);
    reportYes(check, later);
    if (callback) report("callback-status", step.status);
  }
  // A host function the last thing on its stream, and on the NULL stream: a synchronisation of
  // the stream returns once it has run, each of three times.
  std::atomic<int> alone{0};
  auto count = [](void* data) { static_cast<std::atomic<int>*>(data)->fetch_add(1); };
  bool seen = true;
  for (int round = 1; round <= 3; ++round) {
    MUST(cuLaunchHostFunc(stream, count, &alone));
    MUST(cuStreamSynchronize(stream));
    seen = seen && alone.load() == 2 * round - 1;
    MUST(cuLaunchHostFunc(nullptr, count, &alone));
    MUST(cuStreamSynchronize(nullptr));
    seen = seen && alone.load() == 2 * round;
  }
  reportYes("host-func-alone-synchronized", seen);
  report("host-func-null", cuLaunchHostFunc(stream, nullptr, nullptr));
  report("callback-flags", cuStreamAddCallback(stream, &hostCallback, nullptr, 1));
  MUST(cuMemFreeHost(pinned));
  MUST(cuMemFree(device));
  MUST(cuStreamDestroy(stream));
}

// A host function that waits for the application: CUDA runs it on a thread of its own once due,
// so cuLaunchHostFunc returns at once, and the stream's later work (an event record here) waits
// until it has returned. A driver that ran it on the calling thread would never see the release.
struct Rendezvous {
  std::atomic<bool> released{false};
  std::atomic<bool> sawRelease{false};
  std::atomic<bool> returned{false};
};

void waitForRelease(void* data) {
  auto* rendezvous = static_cast<Rendezvous*>(data);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!rendezvous->released.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  rendezvous->sawRelease.store(rendezvous->released.load());
  rendezvous->returned.store(true);
}

void hostFunctionWaitsForTheApplication() {
  CUstream stream = nullptr;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUevent after = nullptr;
  MUST(cuEventCreate(&after, CU_EVENT_DISABLE_TIMING));
  Rendezvous rendezvous;
  report("host-wait-queued", cuLaunchHostFunc(stream, &waitForRelease, &rendezvous));
  MUST(cuEventRecord(after, stream));
  // The host function waits for us, so the event behind it cannot have completed.
  report("host-wait-event-before-release", cuEventQuery(after));
  report("host-wait-stream-before-release", cuStreamQuery(stream));
  rendezvous.released.store(true);
  report("host-wait-sync", cuStreamSynchronize(stream));
  reportYes("host-wait-saw-release", rendezvous.sawRelease.load());
  reportYes("host-wait-returned-before-sync", rendezvous.returned.load());
  report("host-wait-event-after", cuEventQuery(after));
  MUST(cuEventDestroy(after));
  MUST(cuStreamDestroy(stream));
}

void launchEx(CUfunction fillU32) {
  constexpr unsigned long long kCount = 5000;
  CUdeviceptr device = 0;
  MUST(cuMemAlloc(&device, kCount * sizeof(unsigned)));
  MUST(cuMemsetD32(device, 0, kCount));
  CUstream stream = nullptr;
  MUST(cuStreamCreate(&stream, 0));
  CUlaunchAttribute attributes[3] = {};
  attributes[0].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  attributes[0].value.priority = 0;
  attributes[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attributes[1].value.clusterDim.x = 1;
  attributes[1].value.clusterDim.y = 1;
  attributes[1].value.clusterDim.z = 1;
  attributes[2].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attributes[2].value.cooperative = 0;
  CUlaunchConfig config{};
  config.gridDimX = static_cast<unsigned>((kCount + 127) / 128);
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = 128;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.hStream = stream;
  config.attrs = attributes;
  config.numAttrs = 3;
  unsigned value = 42;
  unsigned long long count = kCount;
  void* parameters[] = {&device, &value, &count};
  report("launch-ex", cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  std::vector<unsigned> result(kCount);
  MUST(cuMemcpyDtoHAsync(result.data(), device, kCount * sizeof(unsigned), stream));
  MUST(cuStreamSynchronize(stream));
  bool filled = true;
  for (unsigned got : result) filled = filled && got == 42;
  reportYes("launch-ex-result", filled);
  attributes[2].value.cooperative = 1;
  value = 7;
  report("launch-ex-cooperative", cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  MUST(cuMemcpyDtoHAsync(result.data(), device, kCount * sizeof(unsigned), stream));
  MUST(cuStreamSynchronize(stream));
  filled = true;
  for (unsigned got : result) filled = filled && got == 7;
  reportYes("launch-ex-cooperative-result", filled);
  const unsigned grid = config.gridDimX;
  config.gridDimX = 1000000;  // more blocks than any GPU holds at once
  report("launch-ex-cooperative-too-large",
         cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  config.gridDimX = grid;
  report("launch-cooperative",
         cuLaunchCooperativeKernel(fillU32, grid, 1, 1, 128, 1, 1, 0, stream, parameters));
  report("launch-cooperative-extra-free",
         cuLaunchCooperativeKernel(fillU32, grid, 1, 1, 128, 1, 1, 0, stream, nullptr));
  MUST(cuStreamSynchronize(stream));
  attributes[2].value.cooperative = 0;
  // Programmatic dependent launch, and an event the launch records: the kernel ahead has ended
  // when the event has.
  CUevent completion = nullptr;
  MUST(cuEventCreate(&completion, CU_EVENT_DISABLE_TIMING));
  attributes[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attributes[0].value.programmaticStreamSerializationAllowed = 1;
  attributes[2].id = CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
  attributes[2].value.launchCompletionEvent.event = completion;
  attributes[2].value.launchCompletionEvent.flags = 0;
  value = 9;
  report("launch-ex-dependent", cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  report("launch-ex-dependent-event", cuEventSynchronize(completion));
  MUST(cuMemcpyDtoH(result.data(), device, kCount * sizeof(unsigned)));
  filled = true;
  for (unsigned got : result) filled = filled && got == 9;
  reportYes("launch-ex-dependent-result", filled);
  attributes[2].value.launchCompletionEvent.flags = CU_EVENT_RECORD_EXTERNAL;
  report("launch-ex-event-external", cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  attributes[2].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
  attributes[2].value.programmaticEvent.event = reinterpret_cast<CUevent>(std::uintptr_t{0x5eed});
  attributes[2].value.programmaticEvent.flags = 0;
  report("launch-ex-event-bad", cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  MUST(cuEventDestroy(completion));
  attributes[0].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  attributes[0].value.priority = 0;
  attributes[2].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attributes[2].value.cooperative = 0;
  attributes[1].value.clusterDim.x = 2;
  report("launch-ex-cluster", cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  config.numAttrs = 0;
  config.blockDimX = 4096;
  report("launch-ex-too-many-threads", cuLaunchKernelEx(&config, fillU32, parameters, nullptr));
  report("launch-ex-null", cuLaunchKernelEx(nullptr, fillU32, parameters, nullptr));
  MUST(cuStreamDestroy(stream));
  MUST(cuMemFree(device));
}

void streamQueries() {
  CUstream first = nullptr;
  CUstream second = nullptr;
  MUST(cuStreamCreate(&first, 0));
  MUST(cuStreamCreate(&second, 0));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  report("is-capturing", cuStreamIsCapturing(first, &status));
  reportNumber("is-capturing-status", status);
  status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  report("capture-info",
         cuStreamGetCaptureInfo(nullptr, &status, nullptr, nullptr, nullptr, nullptr, nullptr));
  reportNumber("capture-info-status", status);
  report("is-capturing-bad-stream",
         cuStreamIsCapturing(reinterpret_cast<CUstream>(std::uintptr_t{0x5eed}), &status));
  unsigned long long firstId = 0;
  unsigned long long secondId = 0;
  MUST(cuStreamGetId(first, &firstId));
  MUST(cuStreamGetId(second, &secondId));
  reportYes("stream-ids-differ", firstId != secondId);
  CUdevice streamDevice = -1;
  report("stream-device", cuStreamGetDevice(first, &streamDevice));
  reportYes("stream-device-is-the-context-device", streamDevice == gDevice);
  streamDevice = -1;
  report("stream-device-null-stream", cuStreamGetDevice(nullptr, &streamDevice));
  reportYes("stream-device-null-stream-is-the-context-device", streamDevice == gDevice);
  report("stream-device-bad-stream",
         cuStreamGetDevice(reinterpret_cast<CUstream>(std::uintptr_t{0x5eed}), &streamDevice));
  CUcontext streamContext = nullptr;
  CUgreenCtx streamGreen = reinterpret_cast<CUgreenCtx>(std::uintptr_t{1});
  report("stream-ctx-v2", cuStreamGetCtx_v2(first, &streamContext, &streamGreen));
  reportYes("stream-ctx-v2-context", streamContext == gContext && streamGreen == nullptr);

  // Records with flags: the external flag only changes what a capture makes of the record.
  CUevent marker = nullptr;
  MUST(cuEventCreate(&marker, CU_EVENT_DISABLE_TIMING));
  report("record-flags-default", cuEventRecordWithFlags(marker, first, CU_EVENT_RECORD_DEFAULT));
  report("record-flags-external", cuEventRecordWithFlags(marker, first, CU_EVENT_RECORD_EXTERNAL));
  report("record-flags-unknown", cuEventRecordWithFlags(marker, first, 0x40));
  report("record-flags-synchronize", cuEventSynchronize(marker));
  MUST(cuEventDestroy(marker));

  unsigned long long contextId = 0;
  report("context-id", cuCtxGetId(nullptr, &contextId));
  unsigned long long sameContextId = 1;
  MUST(cuCtxGetId(gContext, &sameContextId));
  reportYes("context-id-stable", contextId == sameContextId);

  // Stream attributes: hints are kept and answered; the priority is the stream's.
  CUstreamAttrValue window{};
  window.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(std::uintptr_t{0x1000});
  window.accessPolicyWindow.num_bytes = 1 << 20;
  window.accessPolicyWindow.hitRatio = 0.6f;
  window.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
  window.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
  report("attr-window-set",
         cuStreamSetAttribute(first, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &window));
  CUstreamAttrValue back{};
  MUST(cuStreamGetAttribute(first, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &back));
  reportYes("attr-window-kept",
            back.accessPolicyWindow.num_bytes == (1 << 20) &&
                back.accessPolicyWindow.hitRatio == 0.6f &&
                back.accessPolicyWindow.hitProp == CU_ACCESS_PROPERTY_PERSISTING);
  MUST(cuStreamCopyAttributes(second, first));
  CUstreamAttrValue copied{};
  MUST(cuStreamGetAttribute(second, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &copied));
  reportYes("attr-window-copied", copied.accessPolicyWindow.num_bytes == (1 << 20));
  CUstreamAttrValue bad = window;
  bad.accessPolicyWindow.hitRatio = 1.5f;
  report("attr-window-bad-ratio",
         cuStreamSetAttribute(first, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &bad));
  CUstreamAttrValue policy{};
  policy.syncPolicy = CU_SYNC_POLICY_YIELD;
  MUST(cuStreamSetAttribute(nullptr, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &policy));
  CUstreamAttrValue policyBack{};
  MUST(cuStreamGetAttribute(nullptr, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &policyBack));
  reportNumber("attr-sync-policy", policyBack.syncPolicy);
  CUstreamAttrValue priority{};
  MUST(cuStreamGetAttribute(first, CU_LAUNCH_ATTRIBUTE_PRIORITY, &priority));
  reportNumber("attr-priority", priority.priority);
  priority.priority -= 1;
  report("attr-priority-change",
         cuStreamSetAttribute(first, CU_LAUNCH_ATTRIBUTE_PRIORITY, &priority));
  report("attr-not-of-streams",
         cuStreamGetAttribute(first, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &priority));
  MUST(cuStreamDestroy(first));
  MUST(cuStreamDestroy(second));
}

// Preferences read back, the profiler switches, peer access (none through gpuproxy) and a peer copy
// within one device.
void hintsAndPeers() {
  report("ctx-cache-config-set", cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_L1));
  CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
  MUST(cuCtxGetCacheConfig(&cache));
  reportNumber("ctx-cache-config", cache);
  report("ctx-cache-config-unknown", cuCtxSetCacheConfig(static_cast<CUfunc_cache>(99)));
  // Deprecated, and still called by applications: the point of the check.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  report("ctx-shared-config-set",
         cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE));
  CUsharedconfig banks = CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE;
  MUST(cuCtxGetSharedMemConfig(&banks));
  reportNumber("ctx-shared-config", banks);
#pragma GCC diagnostic pop
  report("persisting-l2-reset", cuCtxResetPersistingL2Cache());
  report("profiler-start", cuProfilerStart());
  report("profiler-stop", cuProfilerStop());
  CUcontext popped = nullptr;
  MUST(cuCtxPopCurrent(&popped));
  report("profiler-start-without-context", cuProfilerStart());
  MUST(cuCtxPushCurrent(popped));

  // The device's PCI location, and the device found again by it in each form CUDA takes.
  char busId[64] = {};
  report("pci-bus-id", cuDeviceGetPCIBusId(busId, sizeof(busId), gDevice));
  unsigned domain = 0, bus = 0, slot = 0, function = 9;
  reportYes(
      "pci-bus-id-form",
      std::sscanf(busId, "%x:%x:%x.%x", &domain, &bus, &slot, &function) == 4 && function == 0 &&
          domain == static_cast<unsigned>(deviceAttribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)) &&
          bus == static_cast<unsigned>(deviceAttribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)) &&
          slot == static_cast<unsigned>(deviceAttribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)));
  CUdevice found = -1;
  report("by-pci-bus-id", cuDeviceGetByPCIBusId(&found, busId));
  reportYes("by-pci-bus-id-same-device", found == gDevice);
  char shortForm[32];
  std::snprintf(shortForm, sizeof(shortForm), "%X:%X.0", bus, slot);
  found = -1;
  report("by-pci-bus-id-short", cuDeviceGetByPCIBusId(&found, shortForm));
  reportYes("by-pci-bus-id-short-same-device", found == gDevice);
  report("by-pci-bus-id-garbage", cuDeviceGetByPCIBusId(&found, "not-a-bus"));
  report("by-pci-bus-id-null", cuDeviceGetByPCIBusId(&found, nullptr));
  report("pci-bus-id-bad-device", cuDeviceGetPCIBusId(busId, sizeof(busId), 77));

  int canAccess = -1;
  report("can-access-peer", cuDeviceCanAccessPeer(&canAccess, gDevice, gDevice));
  reportNumber("can-access-peer-value", canAccess);
  report("can-access-peer-bad-device", cuDeviceCanAccessPeer(&canAccess, gDevice, 77));
  int attribute = -1;
  report("p2p-attribute-same-device",
         cuDeviceGetP2PAttribute(&attribute, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, gDevice,
                                 gDevice));
  report("enable-peer-access", cuCtxEnablePeerAccess(gContext, 0));
  report("enable-peer-access-flags", cuCtxEnablePeerAccess(gContext, 1));
  report("disable-peer-access", cuCtxDisablePeerAccess(gContext));

  const std::size_t bytes = 1 << 20;
  std::vector<std::uint8_t> pattern(bytes);
  for (std::size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<std::uint8_t>(i * 7);
  CUdeviceptr from = 0;
  CUdeviceptr to = 0;
  MUST(cuMemAlloc(&from, bytes));
  MUST(cuMemAlloc(&to, bytes));
  MUST(cuMemcpyHtoD(from, pattern.data(), bytes));
  report("peer-copy", cuMemcpyPeer(to, gContext, from, gContext, bytes));
  std::vector<std::uint8_t> back(bytes);
  MUST(cuMemcpyDtoH(back.data(), to, bytes));
  reportYes("peer-copy-arrived", back == pattern);
  report(
      "peer-copy-bad-context",
      cuMemcpyPeer(to, reinterpret_cast<CUcontext>(std::uintptr_t{0x5eed}), from, gContext, bytes));
  MUST(cuMemFree(from));
  MUST(cuMemFree(to));
}

// Managed memory (cuMemAllocManaged) and its hints, with the driver's refusals.
void managedMemory(CUfunction fillU32) {
  int supported = -1;
  MUST(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, gDevice));
  reportNumber("managed-attribute", supported);
  CUdeviceptr bad = 0;
  report("managed-zero-bytes", cuMemAllocManaged(&bad, 0, CU_MEM_ATTACH_GLOBAL));
  report("managed-bad-flags", cuMemAllocManaged(&bad, 4096, CU_MEM_ATTACH_SINGLE));
  CUdeviceptr managed = 0;
  const unsigned count = 4096;
  const CUresult allocated =
      cuMemAllocManaged(&managed, count * sizeof(unsigned), CU_MEM_ATTACH_GLOBAL);
  report("managed-alloc", allocated);
  if (allocated != CUDA_SUCCESS) return;

  // The host and a kernel see the same memory at the same address.
  auto* words = reinterpret_cast<unsigned*>(managed);
  for (unsigned i = 0; i < count; ++i) words[i] = i;
  unsigned value = 0xfeedu;
  unsigned long long n = count / 2;
  void* params[] = {&managed, &value, &n};
  MUST(cuLaunchKernel(fillU32, count / 128, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
  MUST(cuCtxSynchronize());
  reportYes("managed-kernel-and-host-agree", words[0] == 0xfeedu && words[n - 1] == 0xfeedu &&
                                                 words[n] == n && words[count - 1] == count - 1);

  unsigned isManaged = 0;
  MUST(cuPointerGetAttribute(&isManaged, CU_POINTER_ATTRIBUTE_IS_MANAGED, managed + 64));
  reportNumber("managed-is-managed", isManaged);
  void* hostPointer = nullptr;
  MUST(cuPointerGetAttribute(&hostPointer, CU_POINTER_ATTRIBUTE_HOST_POINTER, managed + 64));
  reportYes("managed-host-pointer", hostPointer == reinterpret_cast<void*>(managed + 64));

  // Hints: accepted on managed memory with a place that exists; refused otherwise.
  CUmemLocation device{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemLocation host{CU_MEM_LOCATION_TYPE_HOST, 0};
  CUmemLocation nowhere{CU_MEM_LOCATION_TYPE_DEVICE, 99};
  report("managed-prefetch", cuMemPrefetchAsync(managed, count, device, 0, nullptr));
  report("managed-prefetch-host", cuMemPrefetchAsync(managed, count, host, 0, nullptr));
  report("managed-prefetch-no-device", cuMemPrefetchAsync(managed, count, nowhere, 0, nullptr));
  report("managed-prefetch-past-end",
         cuMemPrefetchAsync(managed, count * sizeof(unsigned) + 1, device, 0, nullptr));
  CUdeviceptr plain = 0;
  MUST(cuMemAlloc(&plain, 4096));
  report("managed-prefetch-device-memory", cuMemPrefetchAsync(plain, 4096, device, 0, nullptr));
  report("managed-advise",
         cuMemAdvise(managed, count, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device));
  report("managed-advise-unknown",
         cuMemAdvise(managed, count, static_cast<CUmem_advise>(42), device));
  report("managed-advise-device-memory",
         cuMemAdvise(plain, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, device));
  CUstream stream = nullptr;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  report("managed-attach", cuStreamAttachMemAsync(stream, managed, 0, CU_MEM_ATTACH_SINGLE));
  report("managed-attach-part", cuStreamAttachMemAsync(stream, managed, 64, CU_MEM_ATTACH_SINGLE));
  report("managed-attach-inside",
         cuStreamAttachMemAsync(stream, managed + 64, 0, CU_MEM_ATTACH_SINGLE));
  MUST(cuStreamDestroy(stream));

  // Freed by cuMemFree, from its start only; never by cuMemFreeHost.
  report("managed-free-host", cuMemFreeHost(reinterpret_cast<void*>(managed)));
  report("managed-free-inside", cuMemFree(managed + 64));
  report("managed-free", cuMemFree(managed));
  report("managed-freed-prefetch", cuMemPrefetchAsync(managed, count, device, 0, nullptr));
  MUST(cuMemFree(plain));
}

// A graph captured on a stream and launched twice, and what capture refuses.
void graphs(CUfunction fillU32) {
  CUstream stream = nullptr;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const unsigned count = 4096;
  CUdeviceptr words = 0;
  CUdeviceptr copy = 0;
  MUST(cuMemAlloc(&words, count * sizeof(unsigned)));
  MUST(cuMemAlloc(&copy, count * sizeof(unsigned)));
  MUST(cuMemsetD32(words, 0, count));
  MUST(cuMemsetD32(copy, 0, count));
  MUST(cuCtxSynchronize());

  report("capture-begin", cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  MUST(cuStreamGetCaptureInfo(stream, &status, &id, nullptr, nullptr, nullptr, nullptr));
  reportNumber("capture-status", status);
  reportYes("capture-id", id != 0);
  unsigned value = 7;
  unsigned long long n = count;
  void* params[] = {&words, &value, &n};
  report("capture-launch",
         cuLaunchKernel(fillU32, count / 128, 1, 1, 128, 1, 1, 0, stream, params, nullptr));
  report("capture-copy", cuMemcpyDtoDAsync(copy, words, count * sizeof(unsigned), stream));
  report("capture-memset", cuMemsetD32Async(words, 1, 16, stream));
  // The graph being built, the node the next operation depends on (the memset), and its edge.
  CUgraph building = nullptr;
  const CUgraphNode* next = nullptr;
  const CUgraphEdgeData* edges = nullptr;
  size_t nextCount = 0;
  report("capture-info-v3",
         cuStreamGetCaptureInfo(stream, &status, nullptr, &building, &next, &edges, &nextCount));
  CUgraphNodeType nextType = CU_GRAPH_NODE_TYPE_EMPTY;
  if (nextCount == 1) MUST(cuGraphNodeGetType(next[0], &nextType));
  reportYes("capture-info-next", building != nullptr && nextCount == 1 &&
                                     nextType == CU_GRAPH_NODE_TYPE_MEMSET && edges != nullptr &&
                                     edges[0].type == CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
  CUgraph graph = nullptr;
  report("capture-end", cuStreamEndCapture(stream, &graph));
  reportYes("capture-same-graph", graph == building);
  MUST(cuCtxSynchronize());
  unsigned first = 99;
  MUST(cuMemcpyDtoH(&first, words, sizeof(first)));
  reportNumber("capture-ran-nothing", first);

  size_t nodes = 0;
  report("graph-nodes", cuGraphGetNodes(graph, nullptr, &nodes));
  reportNumber("graph-node-count", static_cast<long long>(nodes));
  CUgraphNode handles[3] = {};
  size_t three = 3;
  MUST(cuGraphGetNodes(graph, handles, &three));
  long long types = 0;
  for (CUgraphNode node : handles) {
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    MUST(cuGraphNodeGetType(node, &type));
    types = types * 10 + type;
  }
  reportNumber("graph-node-types", types);  // kernel 0, memcpy 1, memset 2
  CUgraphExec exec = nullptr;
  report("graph-instantiate", cuGraphInstantiate(&exec, graph, 0));
  MUST(cuGraphDestroy(graph));
  MUST(cuMemsetD32(copy, 0, count));
  MUST(cuCtxSynchronize());
  report("graph-launch", cuGraphLaunch(exec, stream));
  report("graph-launch-again", cuGraphLaunch(exec, stream));
  MUST(cuStreamSynchronize(stream));
  std::vector<unsigned> gotWords(count);
  std::vector<unsigned> gotCopy(count);
  MUST(cuMemcpyDtoH(gotWords.data(), words, count * sizeof(unsigned)));
  MUST(cuMemcpyDtoH(gotCopy.data(), copy, count * sizeof(unsigned)));
  bool right = true;
  for (unsigned i = 0; i < count; ++i) {
    right = right && gotWords[i] == (i < 16 ? 1u : 7u) && gotCopy[i] == 7u;
  }
  reportYes("graph-results", right);
  MUST(cuGraphExecDestroy(exec));
  report("graph-launch-destroyed", cuGraphLaunch(exec, stream));

  // Refusals, each ending the capture it spoiled.
  CUgraph none = nullptr;
  report("capture-legacy-stream", cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MUST(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  report("capture-twice", cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  report("capture-query", cuStreamQuery(stream));
  MUST(cuStreamIsCapturing(stream, &status));
  reportNumber("capture-query-status", status);
  report("capture-end-invalidated", cuStreamEndCapture(stream, &none));
  // An event recorded during a capture marks a point of the graph, not work.
  CUevent marker = nullptr;
  MUST(cuEventCreate(&marker, CU_EVENT_DISABLE_TIMING));
  MUST(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MUST(cuEventRecord(marker, stream));
  report("captured-event-query", cuEventQuery(marker));
  report("captured-event-synchronize", cuEventSynchronize(marker));
  // An external record is an event record node of the graph; the plain record above is no node.
  report("captured-external-record",
         cuEventRecordWithFlags(marker, stream, CU_EVENT_RECORD_EXTERNAL));
  MUST(cuStreamEndCapture(stream, &none));
  {
    std::size_t count = 0;
    CUgraphNode node = nullptr;
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    MUST(cuGraphGetNodes(none, nullptr, &count));
    if (count == 1) {
      MUST(cuGraphGetNodes(none, &node, &count));
      MUST(cuGraphNodeGetType(node, &type));
    }
    std::printf("captured-external-record-node %s\n",
                count == 1 && type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? "yes" : "no");
  }
  MUST(cuGraphDestroy(none));
  report("captured-event-query-after", cuEventQuery(marker));
  MUST(cuEventDestroy(marker));
  report("capture-end-not-capturing", cuStreamEndCapture(stream, &none));
  // A stream-ordered allocation is captured as a memory node; a free of memory no graph made
  // cannot be.
  CUdeviceptr ordinary = 0;
  MUST(cuMemAlloc(&ordinary, 256));
  MUST(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr temporary = 0;
  report("capture-alloc-async", cuMemAllocAsync(&temporary, 256, stream));
  report("capture-free-ordinary", cuMemFreeAsync(ordinary, stream));
  report("capture-alloc-async-end", cuStreamEndCapture(stream, &none));
  MUST(cuMemFree(ordinary));
  // Copies with pageable memory are captured too, and read it when they run: after the host
  // function before them has changed it.
  CUdeviceptr pageableTarget = 0;
  MUST(cuMemAlloc(&pageableTarget, 16 * sizeof(unsigned)));
  std::vector<unsigned> pageable(16, 3);
  std::vector<unsigned> pageableBack(16, 0);
  MUST(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MUST(cuLaunchHostFunc(
      stream,
      [](void* data) {
        for (unsigned& value : *static_cast<std::vector<unsigned>*>(data)) value += 2;
      },
      &pageable));
  report("capture-pageable-copy",
         cuMemcpyHtoDAsync(pageableTarget, pageable.data(), 16 * sizeof(unsigned), stream));
  MUST(cuMemcpyDtoHAsync(pageableBack.data(), pageableTarget, 16 * sizeof(unsigned), stream));
  CUgraph pageableGraph = nullptr;
  report("capture-pageable-copy-end", cuStreamEndCapture(stream, &pageableGraph));
  CUgraphExec pageableExec = nullptr;
  MUST(cuGraphInstantiate(&pageableExec, pageableGraph, 0));
  bool pageableRight = true;
  for (unsigned launch = 1; launch <= 2; ++launch) {
    MUST(cuGraphLaunch(pageableExec, stream));
    MUST(cuStreamSynchronize(stream));
    for (unsigned value : pageableBack) pageableRight = pageableRight && value == 3 + 2 * launch;
  }
  reportYes("capture-pageable-results", pageableRight);
  MUST(cuGraphExecDestroy(pageableExec));
  MUST(cuGraphDestroy(pageableGraph));
  MUST(cuMemFree(pageableTarget));
  // A relaxed thread may synchronise the context during capture; a global one may not.
  MUST(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  MUST(cuThreadExchangeStreamCaptureMode(&mode));
  reportNumber("capture-mode-was", mode);
  report("capture-relaxed-context-sync", cuCtxSynchronize());
  MUST(cuThreadExchangeStreamCaptureMode(&mode));
  report("capture-global-context-sync", cuCtxSynchronize());
  report("capture-global-context-sync-end", cuStreamEndCapture(stream, &none));
  // A graph built node by node: memset, then a kernel, then a host function; updated in place.
  CUgraph built = nullptr;
  MUST(cuGraphCreate(&built, 0));
  CUDA_MEMSET_NODE_PARAMS clear{};
  clear.dst = copy;
  clear.value = 0;
  clear.elementSize = 4;
  clear.width = count;
  clear.height = 1;
  CUgraphNode cleared = nullptr;
  report("node-memset", cuGraphAddMemsetNode(&cleared, built, nullptr, 0, &clear, nullptr));
  unsigned nine = 9;
  void* fillParams[] = {&copy, &nine, &n};
  CUDA_KERNEL_NODE_PARAMS fill{};
  fill.func = fillU32;
  fill.gridDimX = count / 128;
  fill.gridDimY = fill.gridDimZ = 1;
  fill.blockDimX = 128;
  fill.blockDimY = fill.blockDimZ = 1;
  fill.kernelParams = fillParams;
  CUgraphNode filled = nullptr;
  report("node-kernel", cuGraphAddKernelNode(&filled, built, nullptr, 0, &fill));
  report("node-dependency", cuGraphAddDependencies(built, &cleared, &filled, nullptr, 1));
  report("node-dependency-again", cuGraphAddDependencies(built, &cleared, &filled, nullptr, 1));
  std::atomic<int> hostCalls{0};
  CUDA_HOST_NODE_PARAMS count_calls{};
  count_calls.fn = [](void* calls) { ++*static_cast<std::atomic<int>*>(calls); };
  count_calls.userData = &hostCalls;
  CUgraphNode counted = nullptr;
  report("node-host", cuGraphAddHostNode(&counted, built, &filled, 1, &count_calls));
  CUgraphNode stranger = reinterpret_cast<CUgraphNode>(std::uintptr_t{0x5eed});
  CUgraphNode lost = nullptr;
  report("node-unknown-dependency", cuGraphAddEmptyNode(&lost, built, &stranger, 1));
  CUgraphExec builtExec = nullptr;
  MUST(cuGraphInstantiate(&builtExec, built, 0));
  MUST(cuGraphLaunch(builtExec, stream));
  MUST(cuStreamSynchronize(stream));
  MUST(cuMemcpyDtoH(gotCopy.data(), copy, count * sizeof(unsigned)));
  reportYes("node-graph-results", gotCopy[0] == 9 && gotCopy[count - 1] == 9 && hostCalls == 1);
  unsigned eleven = 11;
  void* newParams[] = {&copy, &eleven, &n};
  fill.kernelParams = newParams;
  report("node-exec-set-params", cuGraphExecKernelNodeSetParams(builtExec, filled, &fill));
  MUST(cuGraphLaunch(builtExec, stream));
  MUST(cuStreamSynchronize(stream));
  MUST(cuMemcpyDtoH(gotCopy.data(), copy, count * sizeof(unsigned)));
  reportYes("node-new-params-results", gotCopy[5] == 11 && hostCalls == 2);
  CUgraph lone = nullptr;
  MUST(cuGraphCreate(&lone, 0));
  CUgraphNode empty = nullptr;
  MUST(cuGraphAddEmptyNode(&empty, lone, nullptr, 0));
  CUgraphExecUpdateResultInfo info{};
  report("node-update-other-shape", cuGraphExecUpdate(builtExec, lone, &info));
  reportNumber("node-update-result", info.result);
  MUST(cuGraphExecDestroy(builtExec));
  MUST(cuGraphDestroy(built));
  MUST(cuGraphDestroy(lone));

  // After all that, the stream works as before.
  report("after-capture-launch",
         cuLaunchKernel(fillU32, count / 128, 1, 1, 128, 1, 1, 0, stream, params, nullptr));
  report("after-capture-sync", cuStreamSynchronize(stream));
  MUST(cuMemFree(words));
  MUST(cuMemFree(copy));
  MUST(cuStreamDestroy(stream));
}

// CUDA arrays, and texture and surface objects' argument checks (tests/programs/cudart/textures
// checks what kernels read through them).
void arraysAndTextures() {
  CUDA_ARRAY3D_DESCRIPTOR descriptor{};
  descriptor.Width = 64;
  descriptor.Format = CU_AD_FORMAT_FLOAT;
  descriptor.NumChannels = 3;
  CUarray array = nullptr;
  report("array-three-channels", cuArray3DCreate(&array, &descriptor));
  descriptor.NumChannels = 1;
  descriptor.Width = 0;
  report("array-zero-width", cuArray3DCreate(&array, &descriptor));
  descriptor.Width = 64;
  descriptor.Depth = 4;
  report("array-depth-without-height", cuArray3DCreate(&array, &descriptor));
  descriptor.Depth = 0;
  MUST(cuArray3DCreate(&array, &descriptor));  // 1D, 64 floats
  CUDA_ARRAY3D_DESCRIPTOR back{};
  MUST(cuArray3DGetDescriptor(&back, array));
  reportYes("array-descriptor", back.Width == 64 && back.Height == 0 && back.Depth == 0 &&
                                    back.Format == CU_AD_FORMAT_FLOAT && back.NumChannels == 1);
  std::vector<float> values(64);
  for (int i = 0; i < 64; ++i) values[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
  MUST(cuMemcpyHtoA(array, 0, values.data(), 64 * sizeof(float)));
  std::vector<float> read(16, -1.0f);
  MUST(cuMemcpyAtoH(read.data(), array, 8 * sizeof(float), 16 * sizeof(float)));
  reportYes("array-bytes-round-trip", std::equal(read.begin(), read.end(), values.begin() + 8));
  report("array-read-past-the-end",
         cuMemcpyAtoH(read.data(), array, 56 * sizeof(float), 16 * sizeof(float)));
  CUDA_MEMCPY2D wide{};
  wide.srcMemoryType = CU_MEMORYTYPE_HOST;
  wide.srcHost = values.data();
  wide.srcPitch = 64 * sizeof(float);
  wide.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  wide.dstArray = array;
  wide.dstXInBytes = 4;
  wide.WidthInBytes = 64 * sizeof(float);
  wide.Height = 1;
  report("copy-past-the-array-row", cuMemcpy2D(&wide));

  CUDA_RESOURCE_DESC resource{};
  resource.resType = CU_RESOURCE_TYPE_ARRAY;
  resource.res.array.hArray = array;
  CUDA_TEXTURE_DESC sampler{};
  sampler.filterMode = CU_TR_FILTER_MODE_LINEAR;
  CUtexObject texture = 0;
  const CUresult made = cuTexObjectCreate(&texture, &resource, &sampler, nullptr);
  report("tex-create", made);
  if (made == CUDA_SUCCESS) {
    CUDA_RESOURCE_DESC described{};
    MUST(cuTexObjectGetResourceDesc(&described, texture));
    reportYes("tex-resource-desc",
              described.resType == CU_RESOURCE_TYPE_ARRAY && described.res.array.hArray == array);
    MUST(cuTexObjectDestroy(texture));
  }
  report("tex-no-resource", cuTexObjectCreate(&texture, nullptr, &sampler, nullptr));
  // Surfaces need an array made for load and store.
  CUsurfObject surface = 0;
  report("surf-without-the-flag", cuSurfObjectCreate(&surface, &resource));
  CUdeviceptr linear = 0;
  MUST(cuMemAlloc(&linear, 4096));
  CUDA_RESOURCE_DESC pitched{};
  pitched.resType = CU_RESOURCE_TYPE_PITCH2D;
  pitched.res.pitch2D.devPtr = linear;
  pitched.res.pitch2D.format = CU_AD_FORMAT_UNSIGNED_INT8;
  pitched.res.pitch2D.numChannels = 1;
  pitched.res.pitch2D.width = 40;
  pitched.res.pitch2D.height = 8;
  pitched.res.pitch2D.pitchInBytes = 100;  // not a multiple of the texture pitch alignment
  CUDA_TEXTURE_DESC point{};
  report("tex-misaligned-pitch", cuTexObjectCreate(&texture, &pitched, &point, nullptr));
  pitched.res.pitch2D.pitchInBytes = 128;
  CUDA_TEXTURE_DESC integers{};
  integers.flags = CU_TRSF_READ_AS_INTEGER;
  integers.filterMode = CU_TR_FILTER_MODE_LINEAR;
  report("tex-filtered-integers", cuTexObjectCreate(&texture, &pitched, &integers, nullptr));
  pitched.res.pitch2D.height = 64;  // 8 KiB: past the allocation
  report("tex-past-the-allocation", cuTexObjectCreate(&texture, &pitched, &point, nullptr));
  MUST(cuMemFree(linear));
  MUST(cuArrayDestroy(array));
  report("array-destroyed", cuArray3DGetDescriptor(&back, array));
}

}  // namespace

// Fills a fresh allocation with `fillU32` and says whether every word arrived.
bool fillsMemory(CUfunction fillU32, unsigned value) {
  constexpr unsigned long long kCount = 1000;
  CUdeviceptr memory = 0;
  MUST(cuMemAlloc(&memory, kCount * sizeof(unsigned)));
  fill(fillU32, nullptr, memory, value, kCount);
  std::vector<unsigned> back(kCount);
  MUST(cuMemcpyDtoH(back.data(), memory, kCount * sizeof(unsigned)));
  MUST(cuMemFree(memory));
  return std::all_of(back.begin(), back.end(), [&](unsigned word) { return word == value; });
}

// The JIT linker: one piece of code linked is an image cuModuleLoadData takes, with the output
// options answered; what cannot be linked is refused with its reason in the error log.
void linker() {
  const char* ptx = gpuproxy::testing::kTestKernelsPtx;
  CUjit_option options[] = {CU_JIT_WALL_TIME, CU_JIT_INFO_LOG_BUFFER,
                            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  char info[512];
  char error[512];
  std::memset(info, 'x', sizeof(info));
  std::memset(error, 'x', sizeof(error));
  void* values[] = {nullptr, info, reinterpret_cast<void*>(sizeof(info)), error,
                    reinterpret_cast<void*>(sizeof(error))};
  CUlinkState link = nullptr;
  report("link-create", cuLinkCreate(5, options, values, &link));
  report("link-add-ptx", cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(ptx),
                                       std::strlen(ptx) + 1, "kernels", 0, nullptr, nullptr));
  void* image = nullptr;
  size_t imageBytes = 0;
  report("link-complete", cuLinkComplete(link, &image, &imageBytes));
  float wallMs = -1.0f;
  std::memcpy(&wallMs, &values[0], sizeof(wallMs));
  reportYes("link-wall-time", wallMs >= 0.0f);
  reportYes("link-logs-terminated", std::memchr(info, '\0', sizeof(info)) != nullptr &&
                                        std::memchr(error, '\0', sizeof(error)) != nullptr);
  reportYes("link-image", image != nullptr && imageBytes > 0);
  CUmodule linked = nullptr;
  report("link-load", cuModuleLoadData(&linked, image));
  MUST(cuLinkDestroy(link));
  CUfunction fillU32 = nullptr;
  MUST(cuModuleGetFunction(&fillU32, linked, "fill_u32"));
  reportYes("link-module-runs", fillsMemory(fillU32, 0x5a5a));
  MUST(cuModuleUnload(linked));

  // The same PTX from a file.
  char path[] = "/tmp/gpuproxy-link-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0 || write(fd, ptx, std::strlen(ptx)) != static_cast<ssize_t>(std::strlen(ptx))) {
    std::printf("failed writing %s\n", path);
    std::exit(1);
  }
  close(fd);
  MUST(cuLinkCreate(0, nullptr, nullptr, &link));
  report("link-add-file", cuLinkAddFile(link, CU_JIT_INPUT_PTX, path, 0, nullptr, nullptr));
  report("link-add-missing-file",
         cuLinkAddFile(link, CU_JIT_INPUT_PTX, "/nonexistent/kernels.ptx", 0, nullptr, nullptr));
  report("link-complete-file", cuLinkComplete(link, &image, &imageBytes));
  MUST(cuModuleLoadData(&linked, image));
  MUST(cuModuleGetFunction(&fillU32, linked, "fill_u32"));
  reportYes("link-file-module-runs", fillsMemory(fillU32, 77));
  MUST(cuModuleUnload(linked));
  MUST(cuLinkDestroy(link));
  unlink(path);

  // Refusals.
  report("link-create-null", cuLinkCreate(0, nullptr, nullptr, nullptr));
  report("link-complete-null-state", cuLinkComplete(nullptr, &image, &imageBytes));
  report("link-destroy-null-state", cuLinkDestroy(nullptr));
  MUST(cuLinkCreate(5, options, values, &link));
  report("link-complete-empty", cuLinkComplete(link, &image, &imageBytes));
  report("link-add-unknown-kind",
         cuLinkAddData(link, static_cast<CUjitInputType>(42), const_cast<char*>(ptx),
                       std::strlen(ptx) + 1, nullptr, 0, nullptr, nullptr));
  report("link-add-null-data",
         cuLinkAddData(link, CU_JIT_INPUT_PTX, nullptr, 10, nullptr, 0, nullptr, nullptr));
  report("link-add-cubin-that-is-ptx",
         cuLinkAddData(link, CU_JIT_INPUT_CUBIN, const_cast<char*>(ptx), std::strlen(ptx) + 1,
                       nullptr, 0, nullptr, nullptr));
  std::memset(error, 'x', sizeof(error));
  values[4] = reinterpret_cast<void*>(sizeof(error));
  report("link-add-library", cuLinkAddData(link, CU_JIT_INPUT_LIBRARY, const_cast<char*>(ptx),
                                           std::strlen(ptx) + 1, nullptr, 0, nullptr, nullptr));
  MUST(cuLinkDestroy(link));
  std::memset(error, 'x', sizeof(error));
  values[4] = reinterpret_cast<void*>(sizeof(error));
  MUST(cuLinkCreate(5, options, values, &link));
  for (int piece = 0; piece < 2; ++piece) {
    MUST(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(ptx), std::strlen(ptx) + 1,
                       nullptr, 0, nullptr, nullptr));
  }
  report("link-two-pieces", cuLinkComplete(link, &image, &imageBytes));
  reportYes("link-two-pieces-says-why",
            std::memchr(error, '\0', sizeof(error)) != nullptr && std::strlen(error) > 0 &&
                reinterpret_cast<std::uintptr_t>(values[4]) == std::strlen(error) + 1);
  MUST(cuLinkDestroy(link));
}

int main() {
  MUST(cuInit(0));
  MUST(cuDeviceGet(&gDevice, 0));
  MUST(cuDevicePrimaryCtxRetain(&gContext, gDevice));
  MUST(cuCtxSetCurrent(gContext));
  CUmodule module = nullptr;
  MUST(cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
  CUfunction fillU32 = nullptr;
  MUST(cuModuleGetFunction(&fillU32, module, "fill_u32"));

  functionAttributes(module);
  occupancy(module);
  kernels();
  pointers();
  copies2D();
  batchCopies();
  hostFunctions(fillU32);
  hostFunctionWaitsForTheApplication();
  launchEx(fillU32);
  streamQueries();
  hintsAndPeers();
  managedMemory(fillU32);
  graphs(fillU32);
  arraysAndTextures();
  linker();

  MUST(cuModuleUnload(module));
  MUST(cuDevicePrimaryCtxRelease(gDevice));
  std::printf("driver_surface done\n");
  return 0;
}
