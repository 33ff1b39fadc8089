// Everyday CUDA runtime API use, written as an application would write it and built by plain
// nvcc. `cudart_checks <mode> [argument]` runs one check, prints what it saw and ends with
// "<mode>: PASSED" (exit 0) or a line naming the failing call (exit 1).
//
//   device-query      cudaGetDeviceCount/Properties, versions, cudaMemGetInfo, one line per device
//   vectors           cudaMalloc, cudaMemcpy (each kind and cudaMemcpyDefault), cudaMemset, <<<>>>
//   streams           a non-blocking stream, events and elapsed time, cudaMemcpyAsync, queries
//   pinned            cudaMallocHost/cudaHostAlloc memory used by asynchronous copies and a kernel
//   symbols           cudaMemcpyToSymbol/FromSymbol on __constant__ and __device__ variables
//   malloc-async      cudaMallocAsync/cudaFreeAsync in stream order
//   memory-pool       the device's default pool: release threshold, usage, cudaMallocFromPoolAsync;
//                     a pool of the program's own (cudaMemPoolCreate) with a maximum size
//   copies-3d         cudaMallocPitch and cudaMalloc3D memory, 2D and 3D copies of a sub-box
//   devices           every device from several threads, cudaDeviceReset of one in between,
//                     module variables written again after the reset
//   peer-copies       two devices without peer access (as through gpuproxy): the queries say so,
//                     and copies between them (cudaMemcpyPeer[Async], cudaMemcpy) go through the
//                     host with the right data; a pool of device 1 allocated from, copied to, set
//                     and read (linear and 2D copies) in a stream of device 0
//   cross-device-events  a stream of device 1 waits for an event of device 0 (held until device
//                     0's stream gets there, which a host function delays), also when the event
//                     is destroyed meanwhile, on the legacy stream, and never recorded
//   hints             cache and shared-memory preferences read back, the profiler switches
//   limits            cudaDeviceSetLimit: a device heap larger than the default taken by
//                     malloc in a kernel, then fixed; a stack deep enough for a recursion; the
//                     defaults again after cudaDeviceReset
//   bad-launch        a launch no device can run: reported by cudaGetLastError, then cleared
//   out-of-memory N   cudaMalloc of N bytes must fail with cudaErrorMemoryAllocation
//   hold N            allocates and fills N bytes, prints "holding", then waits to be killed
//   hold-cross-device a stream of device 1 waiting for an event of device 0 whose stream a host
//                     function holds for good, 4 MiB on each device; prints "holding", then waits
//                     to be killed

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "checks.cuh"

__global__ void scaleAndAdd(float factor, const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = factor * x[i] + y[i];
}

__constant__ float weights[4];
__device__ unsigned int visits;

__global__ void weigh(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = weights[i % 4] * static_cast<float>(i);
    atomicAdd(&visits, 1u);
  }
}

__global__ void storeValue(int* target, int value) {
  *target = value;
}

namespace {

int deviceQuery() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  int driver = 0;
  int runtime = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("devices %d driver %d runtime %d\n", count, driver, runtime);
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp properties;
    CHECK(cudaGetDeviceProperties(&properties, device));
    int smCount = 0;
    CHECK(cudaDeviceGetAttribute(&smCount, cudaDevAttrMultiProcessorCount, device));
    EXPECT(smCount == properties.multiProcessorCount, "attribute %d vs property %d", smCount,
           properties.multiProcessorCount);
    CHECK(cudaSetDevice(device));
    size_t free = 0;
    size_t total = 0;
    CHECK(cudaMemGetInfo(&free, &total));
    EXPECT(total == properties.totalGlobalMem, "cudaMemGetInfo total %zu vs totalGlobalMem %zu",
           total, properties.totalGlobalMem);
    std::printf(
        "device %d name=\"%s\" compute=%d.%d sms=%d memory=%zu warp=%d max_threads=%d "
        "shared_per_block=%zu\n",
        device, properties.name, properties.major, properties.minor, properties.multiProcessorCount,
        properties.totalGlobalMem, properties.warpSize, properties.maxThreadsPerBlock,
        properties.sharedMemPerBlock);
  }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

// Many values live at once (the PTX declares far more registers than 64, which ptxas brings down
// to a few dozen), launched in blocks of 1024 threads as applications often do.
constexpr int kMixedValues = 24;

__host__ __device__ unsigned mixWideOne(unsigned seed) {
  unsigned values[kMixedValues];
  for (int k = 0; k < kMixedValues; ++k) values[k] = seed * (k + 1) + k;
  unsigned mixed = 0;
  for (int k = 0; k < kMixedValues; ++k) {
    mixed ^= (values[k] << (k % 7)) + values[(k * 5) % kMixedValues];
  }
  return mixed;
}

__global__ void mixWide(unsigned* data) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  data[i] = mixWideOne(data[i]);
}

int vectors() {
  const int n = 1 << 16;
  std::vector<float> x(n);
  std::vector<float> y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  float* deviceX = nullptr;
  float* deviceY = nullptr;
  float* deviceCopy = nullptr;
  CHECK(cudaMalloc(&deviceX, n * sizeof(float)));
  CHECK(cudaMalloc(&deviceY, n * sizeof(float)));
  CHECK(cudaMalloc(&deviceCopy, n * sizeof(float)));
  CHECK(cudaMemcpy(deviceX, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(deviceY, 0, n * sizeof(float)));
  // cudaMemcpyDefault: the runtime tells host from device memory by the pointers.
  CHECK(cudaMemcpy(deviceY, y.data(), n * sizeof(float), cudaMemcpyDefault));
  scaleAndAdd<<<(n + 255) / 256, 256>>>(2.0f, deviceX, deviceY, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(deviceCopy, deviceY, n * sizeof(float), cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy(y.data(), deviceCopy, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    EXPECT(y[i] == 2.0f * static_cast<float>(i) + 1.0f, "y[%d] = %f", i, y[i]);
  }
  std::vector<float> copy(n);
  CHECK(cudaMemcpy(copy.data(), y.data(), n * sizeof(float), cudaMemcpyHostToHost));
  EXPECT(copy[n - 1] == y[n - 1], "host to host copy");

  std::vector<unsigned> seeds(n);
  for (int i = 0; i < n; ++i) seeds[i] = static_cast<unsigned>(i) * 2654435761u;
  unsigned* deviceSeeds = nullptr;
  CHECK(cudaMalloc(&deviceSeeds, n * sizeof(unsigned)));
  CHECK(cudaMemcpy(deviceSeeds, seeds.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  mixWide<<<n / 1024, 1024>>>(deviceSeeds);
  CHECK(cudaGetLastError());
  std::vector<unsigned> mixed(n);
  CHECK(cudaMemcpy(mixed.data(), deviceSeeds, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    EXPECT(mixed[i] == mixWideOne(seeds[i]), "mixed[%d] = %u", i, mixed[i]);
  }
  CHECK(cudaFree(deviceSeeds));
  CHECK(cudaFree(deviceX));
  CHECK(cudaFree(deviceY));
  CHECK(cudaFree(deviceCopy));
  std::printf("y[%d] = %.1f\n", n - 1, y[n - 1]);
  return 0;
}

int streams() {
  const int n = 1 << 20;
  std::vector<float> host(n, 1.0f);
  float* device = nullptr;
  CHECK(cudaMalloc(&device, n * sizeof(float)));
  cudaStream_t stream;
  cudaEvent_t start;
  cudaEvent_t stop;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, stream));
  CHECK(cudaMemcpyAsync(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  scaleAndAdd<<<n / 256, 256, 0, stream>>>(3.0f, device, device, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  CHECK(cudaEventQuery(stop));
  float milliseconds = -1.0f;
  CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
  EXPECT(milliseconds >= 0.0f, "elapsed %f ms", milliseconds);
  for (int i = 0; i < n; i += 4093) EXPECT(host[i] == 4.0f, "host[%d] = %f", i, host[i]);
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaStreamQuery(stream));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(device));
  std::printf("elapsed %.3f ms\n", milliseconds);
  return 0;
}

int pinned() {
  const int n = 1 << 18;
  float* input = nullptr;
  float* output = nullptr;
  CHECK(cudaMallocHost(&input, n * sizeof(float)));
  CHECK(cudaHostAlloc(&output, n * sizeof(float), cudaHostAllocDefault));
  for (int i = 0; i < n; ++i) input[i] = static_cast<float>(i % 1000);
  float* device = nullptr;
  CHECK(cudaMalloc(&device, n * sizeof(float)));
  CHECK(cudaMemset(device, 0, n * sizeof(float)));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  CHECK(cudaMemcpyAsync(device, input, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  scaleAndAdd<<<n / 256, 256, 0, stream>>>(0.5f, device, device, n);
  CHECK(cudaMemcpyAsync(output, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  for (int i = 0; i < n; i += 997) {
    EXPECT(output[i] == 1.5f * static_cast<float>(i % 1000), "output[%d] = %f", i, output[i]);
  }
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(device));
  CHECK(cudaFreeHost(input));
  CHECK(cudaFreeHost(output));

  // Zero copy, as programs check for it first: mapped pinned memory a kernel writes in place.
  int canMap = 0;
  CHECK(cudaDeviceGetAttribute(&canMap, cudaDevAttrCanMapHostMemory, 0));
  EXPECT(canMap == 1, "canMapHostMemory is %d", canMap);
  float* mapped = nullptr;
  CHECK(cudaHostAlloc(&mapped, 1024 * sizeof(float), cudaHostAllocMapped));
  for (int i = 0; i < 1024; ++i) mapped[i] = 2.0f;
  float* mappedOnDevice = nullptr;
  CHECK(cudaHostGetDevicePointer(&mappedOnDevice, mapped, 0));
  scaleAndAdd<<<4, 256>>>(1.0f, mappedOnDevice, mappedOnDevice, 1024);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  EXPECT(mapped[1023] == 4.0f, "mapped[1023] = %f", mapped[1023]);
  CHECK(cudaFreeHost(mapped));

  // Memory the program already has, page-locked for its copies.
  int canRegister = 0;
  CHECK(cudaDeviceGetAttribute(&canRegister, cudaDevAttrHostRegisterSupported, 0));
  EXPECT(canRegister == 1, "hostRegisterSupported is %d", canRegister);
  std::vector<float> own(4096, 3.0f);
  CHECK(cudaHostRegister(own.data(), own.size() * sizeof(float), cudaHostRegisterDefault));
  float* ownOnDevice = nullptr;
  CHECK(cudaMalloc(&ownOnDevice, own.size() * sizeof(float)));
  CHECK(cudaMemcpyAsync(ownOnDevice, own.data(), own.size() * sizeof(float), cudaMemcpyHostToDevice,
                        nullptr));
  scaleAndAdd<<<16, 256>>>(1.0f, ownOnDevice, ownOnDevice, 4096);
  CHECK(cudaMemcpyAsync(own.data(), ownOnDevice, own.size() * sizeof(float), cudaMemcpyDeviceToHost,
                        nullptr));
  CHECK(cudaDeviceSynchronize());
  EXPECT(own[4095] == 6.0f, "own[4095] = %f", own[4095]);
  CHECK(cudaHostUnregister(own.data()));
  CHECK(cudaFree(ownOnDevice));
  return 0;
}

int symbols() {
  const float chosen[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  CHECK(cudaMemcpyToSymbol(weights, chosen, sizeof(chosen)));
  const unsigned int zero = 0;
  CHECK(cudaMemcpyToSymbol(visits, &zero, sizeof(zero)));
  const int n = 1000;
  float* out = nullptr;
  CHECK(cudaMalloc(&out, n * sizeof(float)));
  weigh<<<(n + 255) / 256, 256>>>(out, n);
  CHECK(cudaGetLastError());
  std::vector<float> host(n);
  CHECK(cudaMemcpy(host.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    EXPECT(host[i] == chosen[i % 4] * static_cast<float>(i), "out[%d] = %f", i, host[i]);
  }
  unsigned int counted = 0;
  CHECK(cudaMemcpyFromSymbol(&counted, visits, sizeof(counted)));
  EXPECT(counted == n, "visits = %u", counted);
  float back[4] = {};
  CHECK(cudaMemcpyFromSymbol(back, weights, sizeof(back)));
  EXPECT(std::memcmp(back, chosen, sizeof(back)) == 0, "weights read back differ");
  size_t size = 0;
  CHECK(cudaGetSymbolSize(&size, weights));
  EXPECT(size == sizeof(chosen), "cudaGetSymbolSize = %zu", size);
  void* address = nullptr;
  CHECK(cudaGetSymbolAddress(&address, visits));
  EXPECT(address != nullptr, "cudaGetSymbolAddress gave null");
  CHECK(cudaFree(out));
  std::printf("visits %u\n", counted);
  return 0;
}

int mallocAsync() {
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  const int n = 4096;
  float* device = nullptr;
  CHECK(cudaMallocAsync(&device, n * sizeof(float), stream));
  CHECK(cudaMemsetAsync(device, 0, n * sizeof(float), stream));
  scaleAndAdd<<<n / 256, 256, 0, stream>>>(1.0f, device, device, n);
  CHECK(cudaGetLastError());
  std::vector<float> host(n, 5.0f);
  CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaFreeAsync(device, stream));
  CHECK(cudaStreamSynchronize(stream));
  for (int i = 0; i < n; ++i) EXPECT(host[i] == 0.0f, "host[%d] = %f", i, host[i]);
  CHECK(cudaStreamDestroy(stream));
  return 0;
}

// One kernel run and its module variable checked on the calling thread's current device.
int runOnDevice(int device) {
  CHECK(cudaSetDevice(device));
  const int n = 512;
  const float chosen[4] = {2.0f, 2.0f, 2.0f, 2.0f};
  CHECK(cudaMemcpyToSymbol(weights, chosen, sizeof(chosen)));
  float* out = nullptr;
  CHECK(cudaMalloc(&out, n * sizeof(float)));
  weigh<<<(n + 127) / 128, 128>>>(out, n);
  CHECK(cudaGetLastError());
  std::vector<float> host(n);
  CHECK(cudaMemcpy(host.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(out));
  for (int i = 0; i < n; ++i) {
    EXPECT(host[i] == 2.0f * static_cast<float>(i), "device %d: out[%d] = %f", device, i, host[i]);
  }
  return 0;
}

int devices() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  for (int device = 0; device < count; ++device) {
    if (runOnDevice(device) != 0) return 1;
  }
  // A reset drops the device's allocations and modules; the runtime loads them again.
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceReset());
  for (int device = 0; device < count; ++device) {
    if (runOnDevice(device) != 0) return 1;
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, count, &failures] {
      for (int round = 0; round < 8; ++round) {
        if (runOnDevice((t + round) % count) != 0) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT(failures == 0, "%d runs failed on other threads", failures.load());
  std::printf("%d devices, reset, 4 threads\n", count);
  return 0;
}

int peerCopies() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count >= 2, "peer-copies needs two devices, found %d", count);
  int canAccess = -1;
  CHECK(cudaDeviceCanAccessPeer(&canAccess, 0, 1));
  EXPECT(canAccess == 0, "device 0 says it can access device 1's memory (%d)", canAccess);
  int supported = -1;
  CHECK(cudaDeviceGetP2PAttribute(&supported, cudaDevP2PAttrAccessSupported, 1, 0));
  EXPECT(supported == 0, "cudaDevP2PAttrAccessSupported is %d", supported);
  CHECK(cudaSetDevice(0));
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(1, 0);
  EXPECT(enabled == cudaErrorPeerAccessUnsupported, "enabling peer access gave %s",
         cudaGetErrorName(enabled));
  (void)cudaGetLastError();  // the refusal was the last error: cleared

  // Device 0 fills a buffer with a kernel; copies bring it to device 1 three ways.
  const int n = 3 << 20;  // 12 MiB of floats
  std::vector<float> expected(n);
  for (int i = 0; i < n; ++i) expected[i] = 0.5f * static_cast<float>(i % 4099);
  float* onZero = nullptr;
  CHECK(cudaMalloc(&onZero, n * sizeof(float)));
  CHECK(cudaMemcpy(onZero, expected.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  scaleAndAdd<<<(n + 255) / 256, 256>>>(2.0f, onZero, onZero, n);  // onZero = 3 * expected
  CHECK(cudaGetLastError());
  for (float& value : expected) value *= 3.0f;
  CHECK(cudaSetDevice(1));
  float* onOne = nullptr;
  CHECK(cudaMalloc(&onOne, n * sizeof(float)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<float> back(n);
  auto arrived = [&](const char* how) {
    if (cudaMemcpy(back.data(), onOne, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
      std::printf("FAILED: reading back after %s\n", how);
      return false;
    }
    for (int i = 0; i < n; ++i) {
      if (back[i] != expected[i]) {
        std::printf("FAILED: after %s element %d is %f, expected %f\n", how, i, back[i],
                    expected[i]);
        return false;
      }
    }
    return cudaMemset(onOne, 0, n * sizeof(float)) == cudaSuccess;
  };
  CHECK(cudaMemcpyPeer(onOne, 1, onZero, 0, n * sizeof(float)));
  EXPECT(arrived("cudaMemcpyPeer"), "cudaMemcpyPeer");
  CHECK(cudaMemcpyPeerAsync(onOne, 1, onZero, 0, n * sizeof(float), stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(arrived("cudaMemcpyPeerAsync"), "cudaMemcpyPeerAsync");
  CHECK(cudaMemcpy(onOne, onZero, n * sizeof(float), cudaMemcpyDefault));
  EXPECT(arrived("cudaMemcpy(cudaMemcpyDefault)"), "cudaMemcpy");
  CHECK(cudaMemcpyAsync(onOne, onZero, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(arrived("cudaMemcpyAsync(cudaMemcpyDeviceToDevice)"), "cudaMemcpyAsync");
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(onOne));
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(onZero));
  std::printf("no peer access; 4 copies of %zu bytes between devices\n", n * sizeof(float));

  // A pool of device 1 allocated from in stream order on device 0 (CUDA allows it): the memory
  // is device 1's, and device 0 is given no access to it.
  cudaMemPoolProps properties = {};
  properties.allocType = cudaMemAllocationTypePinned;
  properties.location.type = cudaMemLocationTypeDevice;
  properties.location.id = 1;
  cudaMemPool_t poolOnOne = nullptr;
  CHECK(cudaMemPoolCreate(&poolOnOne, &properties));
  cudaMemAccessDesc access = {};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = 0;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  const cudaError_t peerAccess = cudaMemPoolSetAccess(poolOnOne, &access, 1);
  EXPECT(peerAccess != cudaSuccess, "device 0 was given access to device 1's pool");
  cudaGetLastError();  // the refusal above is not sticky
  cudaStream_t onDeviceZero;
  CHECK(cudaStreamCreate(&onDeviceZero));
  float* fromPool = nullptr;
  CHECK(cudaMallocFromPoolAsync(&fromPool, n * sizeof(float), poolOnOne, onDeviceZero));
  cudaPointerAttributes where;
  CHECK(cudaPointerGetAttributes(&where, fromPool));
  EXPECT(where.type == cudaMemoryTypeDevice && where.device == 1,
         "memory of device 1's pool is on device %d (type %d)", where.device,
         static_cast<int>(where.type));
  // Copied to, set and read back in device 0's stream, as unified addressing lets any stream.
  std::vector<float> values(n, 4.5f);
  CHECK(cudaMemcpyAsync(fromPool, values.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                        onDeviceZero));
  CHECK(cudaMemsetAsync(fromPool, 0, sizeof(float), onDeviceZero));
  std::vector<float> read(n, -1.0f);
  CHECK(cudaMemcpyAsync(read.data(), fromPool, n * sizeof(float), cudaMemcpyDeviceToHost,
                        onDeviceZero));
  // A 2D copy too: column 0 of a 16-float-wide matrix there, read into a packed column here.
  std::vector<float> column(n / 16, -1.0f);
  CHECK(cudaMemcpy2DAsync(column.data(), sizeof(float), fromPool, 16 * sizeof(float), sizeof(float),
                          n / 16, cudaMemcpyDeviceToHost, onDeviceZero));
  CHECK(cudaStreamSynchronize(onDeviceZero));
  EXPECT(read[0] == 0.0f && read[n - 1] == 4.5f, "device 1's pool memory read back %f, %f", read[0],
         read[n - 1]);
  EXPECT(column[0] == 0.0f && column[1] == 4.5f && column[n / 16 - 1] == 4.5f,
         "a 2D copy of device 1's pool memory read %f, %f", column[0], column[1]);
  // And on its own device, with device 1 current.
  CHECK(cudaSetDevice(1));
  CHECK(cudaMemcpy(read.data(), fromPool, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(read[0] == 0.0f && read[n - 1] == 4.5f, "device 1 reads its pool memory as %f, %f",
         read[0], read[n - 1]);
  CHECK(cudaSetDevice(0));
  CHECK(cudaFreeAsync(fromPool, onDeviceZero));
  CHECK(cudaStreamSynchronize(onDeviceZero));
  CHECK(cudaStreamDestroy(onDeviceZero));
  CHECK(cudaMemPoolDestroy(poolOnOne));
  std::printf("a pool of device 1 allocated from, copied and set on device 0\n");
  return 0;
}

int hints() {
  CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
  cudaFuncCache cache = cudaFuncCachePreferNone;
  CHECK(cudaDeviceGetCacheConfig(&cache));
  EXPECT(cache == cudaFuncCachePreferShared, "cache preference read back as %d",
         static_cast<int>(cache));
  const cudaError_t invalid = cudaDeviceSetCacheConfig(static_cast<cudaFuncCache>(42));
  EXPECT(invalid == cudaErrorInvalidValue, "an unknown cache preference gave %s",
         cudaGetErrorName(invalid));
  (void)cudaGetLastError();  // the refusal was the last error: cleared
  CHECK(cudaFuncSetCacheConfig(scaleAndAdd, cudaFuncCachePreferL1));
  CHECK(cudaProfilerStart());
  float* data = nullptr;
  CHECK(cudaMalloc(&data, 1024 * sizeof(float)));
  scaleAndAdd<<<4, 256>>>(1.0f, data, data, 1024);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaProfilerStop());
  CHECK(cudaFree(data));
  return 0;
}

// Each thread takes `bytes` from the device heap and writes its index at both ends.
__global__ void takeFromHeap(unsigned** blocks, unsigned bytes) {
  auto* block = static_cast<unsigned*>(malloc(bytes));
  if (block != nullptr) {
    block[0] = threadIdx.x;
    block[bytes / sizeof(unsigned) - 1] = threadIdx.x;
  }
  blocks[threadIdx.x] = block;
}

// 1 + 2 + ... + depth, each level keeping 256 bytes of its own on the stack: deeper than the
// default stack (1 KiB per thread) holds.
__device__ unsigned sumDownFrom(unsigned depth) {
  volatile unsigned frame[64];
  frame[depth % 64] = depth;
  return depth == 0 ? 0 : frame[depth % 64] + sumDownFrom(depth - 1);
}

__global__ void sumRecursively(unsigned* out, unsigned depth) {
  out[threadIdx.x] = sumDownFrom(depth + threadIdx.x);
}

int limits() {
  size_t value = 0;
  CHECK(cudaDeviceGetLimit(&value, cudaLimitMallocHeapSize));
  EXPECT(value == (8u << 20), "default heap size %zu", value);
  CHECK(cudaDeviceGetLimit(&value, cudaLimitStackSize));
  EXPECT(value == 1024, "default stack size %zu", value);
  CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 64u << 20));
  CHECK(cudaDeviceGetLimit(&value, cudaLimitMallocHeapSize));
  EXPECT(value >= (64u << 20), "heap size %zu after asking for 64 MiB", value);
  CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 48u << 10));
  CHECK(cudaDeviceGetLimit(&value, cudaLimitStackSize));
  EXPECT(value >= (48u << 10), "stack size %zu after asking for 48 KiB", value);
  CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 4u << 20));
  CHECK(cudaDeviceGetLimit(&value, cudaLimitPrintfFifoSize));
  EXPECT(value >= (4u << 20), "printf FIFO size %zu after asking for 4 MiB", value);
  const cudaError_t unknown = cudaDeviceSetLimit(static_cast<cudaLimit>(0x7f), 1);
  EXPECT(unknown == cudaErrorUnsupportedLimit, "an unknown limit gave %s",
         cudaGetErrorName(unknown));
  (void)cudaGetLastError();

  // 32 MiB from the heap: four times what the default heap holds.
  constexpr unsigned kThreads = 32;
  constexpr unsigned kBlockBytes = 1u << 20;
  unsigned** blocks = nullptr;
  CHECK(cudaMalloc(&blocks, kThreads * sizeof(unsigned*)));
  takeFromHeap<<<1, kThreads>>>(blocks, kBlockBytes);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  unsigned* taken[kThreads];
  CHECK(cudaMemcpy(taken, blocks, sizeof taken, cudaMemcpyDeviceToHost));
  for (unsigned t = 0; t < kThreads; ++t) {
    EXPECT(taken[t] != nullptr, "malloc of 1 MiB in thread %u returned NULL", t);
    for (unsigned u = 0; u < t; ++u) {
      const auto distance = static_cast<unsigned long long>(
          taken[t] > taken[u] ? taken[t] - taken[u] : taken[u] - taken[t]);
      EXPECT(distance * sizeof(unsigned) >= kBlockBytes, "heap blocks %u and %u overlap", u, t);
    }
  }
  // Once the heap exists its size is fixed.
  const cudaError_t late = cudaDeviceSetLimit(cudaLimitMallocHeapSize, 128u << 20);
  EXPECT(late == cudaErrorInvalidValue, "changing the heap after its use gave %s",
         cudaGetErrorName(late));
  (void)cudaGetLastError();

  constexpr unsigned kDepth = 150;
  unsigned* sums = nullptr;
  CHECK(cudaMalloc(&sums, kThreads * sizeof(unsigned)));
  sumRecursively<<<1, kThreads>>>(sums, kDepth);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  unsigned got[kThreads];
  CHECK(cudaMemcpy(got, sums, sizeof got, cudaMemcpyDeviceToHost));
  for (unsigned t = 0; t < kThreads; ++t) {
    const unsigned depth = kDepth + t;
    EXPECT(got[t] == depth * (depth + 1) / 2, "thread %u summed %u", t, got[t]);
  }
  std::printf("heap blocks %u x %u bytes, recursion %u deep\n", kThreads, kBlockBytes,
              kDepth + kThreads - 1);

  // A reset device starts again with the driver's limits.
  CHECK(cudaDeviceReset());
  CHECK(cudaDeviceGetLimit(&value, cudaLimitMallocHeapSize));
  EXPECT(value == (8u << 20), "heap size %zu after cudaDeviceReset", value);
  CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16u << 20));
  return 0;
}

int memoryPool() {
  // What programs ask before they use stream-ordered allocation.
  int poolsSupported = 0;
  CHECK(cudaDeviceGetAttribute(&poolsSupported, cudaDevAttrMemoryPoolsSupported, 0));
  EXPECT(poolsSupported == 1, "memoryPoolsSupported is %d", poolsSupported);
  cudaMemPool_t pool = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  cudaMemPool_t current = nullptr;
  CHECK(cudaDeviceGetMemPool(&current, 0));
  EXPECT(pool == current, "the current pool is not the default pool");
  std::uint64_t threshold = UINT64_MAX;  // what PyTorch's and RAPIDS' allocators set
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  std::uint64_t readBack = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &readBack));
  EXPECT(readBack == UINT64_MAX, "release threshold read back as %llu",
         static_cast<unsigned long long>(readBack));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  void* first = nullptr;
  void* second = nullptr;
  CHECK(cudaMallocAsync(&first, 1 << 20, stream));
  CHECK(cudaMallocFromPoolAsync(&second, 1 << 20, pool, stream));
  std::uint64_t used = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used == 2u << 20, "pool in use: %llu bytes", static_cast<unsigned long long>(used));
  CHECK(cudaMemsetAsync(second, 7, 1 << 20, stream));
  CHECK(cudaFreeAsync(first, stream));
  CHECK(cudaFreeAsync(second, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used == 0, "pool still in use: %llu bytes", static_cast<unsigned long long>(used));
  std::uint64_t high = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  EXPECT(high == 2u << 20, "high watermark %llu", static_cast<unsigned long long>(high));
  CHECK(cudaMemPoolTrimTo(pool, 0));

  // A pool of the application's own, as RMM's cuda_async_memory_resource makes one: at most
  // 4 MiB, current for the device (cudaMallocAsync allocates from it), destroyed while an
  // allocation is still out (which stays usable), the default pool current again after.
  cudaMemPoolProps properties = {};
  properties.allocType = cudaMemAllocationTypePinned;
  properties.handleTypes = cudaMemHandleTypeNone;
  properties.location.type = cudaMemLocationTypeDevice;
  properties.location.id = 0;
  properties.maxSize = 4u << 20;
  cudaMemPool_t own = nullptr;
  CHECK(cudaMemPoolCreate(&own, &properties));
  EXPECT(own != nullptr && own != pool, "cudaMemPoolCreate gave the default pool");
  CHECK(cudaMemPoolSetAttribute(own, cudaMemPoolAttrReleaseThreshold, &threshold));
  cudaMemAccessFlags access = cudaMemAccessFlagsProtNone;
  cudaMemLocation location = {};
  location.type = cudaMemLocationTypeDevice;
  location.id = 0;
  CHECK(cudaMemPoolGetAccess(&access, own, &location));
  EXPECT(access == cudaMemAccessFlagsProtReadWrite, "the pool's own device has access %d",
         static_cast<int>(access));
  CHECK(cudaDeviceSetMemPool(0, own));
  CHECK(cudaDeviceGetMemPool(&current, 0));
  EXPECT(current == own, "the created pool is not current after cudaDeviceSetMemPool");
  void* fromOwn = nullptr;
  CHECK(cudaMallocAsync(&fromOwn, 3u << 20, stream));
  CHECK(cudaMemPoolGetAttribute(own, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used == 3u << 20, "created pool in use: %llu bytes",
         static_cast<unsigned long long>(used));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used == 0, "the default pool grew: %llu bytes", static_cast<unsigned long long>(used));
  void* tooMuch = nullptr;
  const cudaError_t past = cudaMallocFromPoolAsync(&tooMuch, 2u << 20, own, stream);
  EXPECT(past == cudaErrorMemoryAllocation, "allocating past the pool's maxSize gave %s",
         cudaGetErrorName(past));
  CHECK(cudaMemsetAsync(fromOwn, 1, 3u << 20, stream));
  CHECK(cudaMemPoolDestroy(own));
  CHECK(cudaDeviceGetMemPool(&current, 0));
  EXPECT(current == pool, "the default pool is not current after its replacement was destroyed");
  unsigned char last = 0;
  CHECK(cudaMemcpyAsync(&last, static_cast<unsigned char*>(fromOwn) + (3u << 20) - 1, 1,
                        cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(last == 1, "memory of a destroyed pool read %u", last);
  CHECK(cudaFreeAsync(fromOwn, stream));
  CHECK(cudaStreamSynchronize(stream));
  // Pools other processes import by a file descriptor are offered (ipc_sharing.cu); by a fabric
  // handle, which needs the driver's IMEX channels across nodes, not.
  properties.handleTypes = cudaMemHandleTypeFabric;
  const cudaError_t shareable = cudaMemPoolCreate(&own, &properties);
  EXPECT(shareable == cudaErrorNotSupported, "a fabric-shareable pool gave %s",
         cudaGetErrorName(shareable));
  std::printf(
      "explicit pool: maxSize enforced, current for the device, destroyed with memory out\n");
  CHECK(cudaStreamDestroy(stream));
  return 0;
}

int copies3D() {
  // A 2D round trip through pitched memory.
  const size_t width = 100;
  const size_t rows = 7;
  std::vector<float> plane(width * rows);
  for (size_t i = 0; i < plane.size(); ++i) plane[i] = static_cast<float>(i);
  float* pitched = nullptr;
  size_t pitch = 0;
  CHECK(cudaMallocPitch(reinterpret_cast<void**>(&pitched), &pitch, width * sizeof(float), rows));
  EXPECT(pitch >= width * sizeof(float) && pitch % 512 == 0, "pitch %zu", pitch);
  CHECK(cudaMemcpy2D(pitched, pitch, plane.data(), width * sizeof(float), width * sizeof(float),
                     rows, cudaMemcpyHostToDevice));
  std::vector<float> planeBack(plane.size(), -1.0f);
  CHECK(cudaMemcpy2D(planeBack.data(), width * sizeof(float), pitched, pitch, width * sizeof(float),
                     rows, cudaMemcpyDeviceToHost));
  EXPECT(planeBack == plane, "2D round trip through pitched memory differs");
  CHECK(cudaFree(pitched));

  // A 3D box of 8x6x5 floats, copied into a 10x9x7 volume at (1, 2, 1) and back.
  const cudaExtent volumeExtent = make_cudaExtent(10 * sizeof(float), 9, 7);
  cudaPitchedPtr volume{};
  CHECK(cudaMalloc3D(&volume, volumeExtent));
  CHECK(cudaMemset3D(volume, 0, volumeExtent));
  std::vector<float> box(8 * 6 * 5);
  for (size_t i = 0; i < box.size(); ++i) box[i] = static_cast<float>(i) + 0.5f;
  cudaMemcpy3DParms in{};
  in.srcPtr = make_cudaPitchedPtr(box.data(), 8 * sizeof(float), 8, 6);
  in.dstPtr = volume;
  in.dstPos = make_cudaPos(1 * sizeof(float), 2, 1);
  in.extent = make_cudaExtent(8 * sizeof(float), 6, 5);
  in.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&in));
  std::vector<float> whole(10 * 9 * 7, -1.0f);
  cudaMemcpy3DParms out{};
  out.srcPtr = volume;
  out.dstPtr = make_cudaPitchedPtr(whole.data(), 10 * sizeof(float), 10, 9);
  out.extent = volumeExtent;
  out.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&out));
  for (size_t z = 0; z < 7; ++z) {
    for (size_t y = 0; y < 9; ++y) {
      for (size_t x = 0; x < 10; ++x) {
        const bool inside = x >= 1 && x < 9 && y >= 2 && y < 8 && z >= 1 && z < 6;
        const float expected = inside ? box[((z - 1) * 6 + (y - 2)) * 8 + (x - 1)] : 0.0f;
        const float got = whole[(z * 9 + y) * 10 + x];
        EXPECT(got == expected, "volume (%zu, %zu, %zu) = %f, expected %f", x, y, z, got, expected);
      }
    }
  }
  CHECK(cudaFree(volume.ptr));
  std::printf("pitch %zu, volume pitch %zu\n", pitch, volume.pitch);
  return 0;
}

int badLaunch() {
  float* device = nullptr;
  CHECK(cudaMalloc(&device, 1024));
  scaleAndAdd<<<1, 4096>>>(1.0f, device, device, 1);  // more threads per block than any GPU has
  const cudaError_t refused = cudaGetLastError();
  EXPECT(refused != cudaSuccess, "a 4096-thread block was accepted");
  std::printf("refused with %s\n", cudaGetErrorName(refused));
  CHECK(cudaGetLastError());  // the error is not sticky: reading it cleared it
  scaleAndAdd<<<1, 256>>>(1.0f, device, device, 1);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(device));
  return 0;
}

int outOfMemory(const char* bytesText) {
  const size_t bytes = std::strtoull(bytesText, nullptr, 10);
  void* device = nullptr;
  const cudaError_t status = cudaMalloc(&device, bytes);
  std::printf("cudaMalloc(%zu) returned %s\n", bytes, cudaGetErrorName(status));
  EXPECT(status == cudaErrorMemoryAllocation, "expected cudaErrorMemoryAllocation");
  // The failure is the runtime's last error until read, and not sticky: a small allocation
  // still works.
  EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation, "cudaGetLastError lost the failure");
  CHECK(cudaGetLastError());
  CHECK(cudaMalloc(&device, 1024));
  CHECK(cudaFree(device));
  return 0;
}

int hold(const char* bytesText) {
  const size_t bytes = std::strtoull(bytesText, nullptr, 10);
  void* device = nullptr;
  CHECK(cudaMalloc(&device, bytes));
  CHECK(cudaMemset(device, 1, bytes));
  CHECK(cudaDeviceSynchronize());
  std::printf("holding %zu bytes\n", bytes);
  std::fflush(stdout);
  for (;;) pause();
}

// What the host functions of cross-device-events share: device 0's stream is held until the main
// thread lets it go, and device 1's, once its wait is over, notes whether device 0's had gone on.
struct CrossDeviceOrder {
  std::atomic<bool> released{false};
  std::atomic<bool> firstWentOn{false};
  std::atomic<int> secondSaw{-1};
};

void CUDART_CB holdUntilReleased(void* order) {
  auto* shared = static_cast<CrossDeviceOrder*>(order);
  while (!shared->released.load()) usleep(1000);
  shared->firstWentOn = true;
}

void CUDART_CB noteWhetherFirstWentOn(void* order) {
  auto* shared = static_cast<CrossDeviceOrder*>(order);
  shared->secondSaw = shared->firstWentOn.load() ? 1 : 0;
}

int crossDeviceEvents() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count >= 2, "cross-device-events needs two devices, found %d", count);
  // Device 0's stream: held by a host function, then a kernel and the record.
  CrossDeviceOrder order;
  CHECK(cudaSetDevice(0));
  int* onFirst = nullptr;
  CHECK(cudaMalloc(&onFirst, sizeof(int)));
  cudaStream_t first;
  CHECK(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  cudaEvent_t done;
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CHECK(cudaLaunchHostFunc(first, holdUntilReleased, &order));
  storeValue<<<1, 1, 0, first>>>(onFirst, 5);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(done, first));

  // Device 1's stream waits for that record, then notes the order and runs a kernel of its own.
  CHECK(cudaSetDevice(1));
  cudaStream_t second;
  CHECK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  int* onSecond = nullptr;
  CHECK(cudaMalloc(&onSecond, sizeof(int)));
  CHECK(cudaStreamWaitEvent(second, done, 0));
  // Destroyed while waited for: the wait still holds, as CUDA promises.
  CHECK(cudaEventDestroy(done));
  CHECK(cudaLaunchHostFunc(second, noteWhetherFirstWentOn, &order));
  storeValue<<<1, 1, 0, second>>>(onSecond, 7);
  CHECK(cudaGetLastError());
  const cudaError_t held = cudaStreamQuery(second);
  EXPECT(held == cudaErrorNotReady, "device 1's stream did not wait for device 0's event (%s)",
         cudaGetErrorName(held));
  EXPECT(order.secondSaw == -1, "device 1's stream went past its wait early");
  order.released = true;
  CHECK(cudaStreamSynchronize(second));
  EXPECT(order.secondSaw == 1, "device 1's stream went on before device 0's reached the record");
  int value = -1;
  CHECK(cudaMemcpy(&value, onSecond, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(value == 7, "device 1's kernel after the wait wrote %d, not 7", value);

  // The legacy NULL stream of device 1 waits for a record on device 0's.
  CrossDeviceOrder legacyOrder;
  CHECK(cudaSetDevice(0));
  cudaEvent_t onLegacy;
  CHECK(cudaEventCreateWithFlags(&onLegacy, cudaEventDisableTiming));
  CHECK(cudaLaunchHostFunc(0, holdUntilReleased, &legacyOrder));
  CHECK(cudaEventRecord(onLegacy, 0));
  CHECK(cudaSetDevice(1));
  CHECK(cudaStreamWaitEvent(0, onLegacy, 0));
  CHECK(cudaLaunchHostFunc(0, noteWhetherFirstWentOn, &legacyOrder));
  legacyOrder.released = true;
  CHECK(cudaDeviceSynchronize());
  EXPECT(legacyOrder.secondSaw == 1, "device 1's legacy stream went on before device 0's");

  // An event never recorded is no wait at all.
  CHECK(cudaSetDevice(0));
  cudaEvent_t fresh;
  CHECK(cudaEventCreate(&fresh));
  CHECK(cudaSetDevice(1));
  CHECK(cudaStreamWaitEvent(second, fresh, 0));
  CHECK(cudaStreamSynchronize(second));

  CHECK(cudaEventDestroy(onLegacy));
  CHECK(cudaEventDestroy(fresh));
  CHECK(cudaStreamDestroy(second));
  CHECK(cudaFree(onSecond));
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaStreamDestroy(first));
  CHECK(cudaFree(onFirst));
  std::printf("device 1 waited for device 0's events\n");
  return 0;
}

int holdCrossDevice() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count >= 2, "hold-cross-device needs two devices, found %d", count);
  static CrossDeviceOrder never;  // never released: device 0's stream stays held
  const size_t bytes = size_t{4} << 20;
  void* onFirst = nullptr;
  void* onSecond = nullptr;
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(&onFirst, bytes));
  cudaStream_t first;
  CHECK(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  cudaEvent_t done;
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CHECK(cudaLaunchHostFunc(first, holdUntilReleased, &never));
  storeValue<<<1, 1, 0, first>>>(static_cast<int*>(onFirst), 1);
  CHECK(cudaEventRecord(done, first));
  CHECK(cudaSetDevice(1));
  CHECK(cudaMalloc(&onSecond, bytes));
  cudaStream_t second;
  CHECK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  CHECK(cudaStreamWaitEvent(second, done, 0));
  storeValue<<<1, 1, 0, second>>>(static_cast<int*>(onSecond), 2);
  const cudaError_t held = cudaStreamQuery(second);
  EXPECT(held == cudaErrorNotReady, "device 1's stream is not waiting (%s)",
         cudaGetErrorName(held));
  std::printf("holding\n");
  std::fflush(stdout);
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s <mode> [argument]\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  const char* argument = argc > 2 ? argv[2] : nullptr;
  int result = 2;
  if (std::strcmp(mode, "device-query") == 0) result = deviceQuery();
  if (std::strcmp(mode, "vectors") == 0) result = vectors();
  if (std::strcmp(mode, "streams") == 0) result = streams();
  if (std::strcmp(mode, "pinned") == 0) result = pinned();
  if (std::strcmp(mode, "symbols") == 0) result = symbols();
  if (std::strcmp(mode, "malloc-async") == 0) result = mallocAsync();
  if (std::strcmp(mode, "devices") == 0) result = devices();
  if (std::strcmp(mode, "memory-pool") == 0) result = memoryPool();
  if (std::strcmp(mode, "peer-copies") == 0) result = peerCopies();
  if (std::strcmp(mode, "cross-device-events") == 0) result = crossDeviceEvents();
  if (std::strcmp(mode, "hold-cross-device") == 0) result = holdCrossDevice();
  if (std::strcmp(mode, "hints") == 0) result = hints();
  if (std::strcmp(mode, "limits") == 0) result = limits();
  if (std::strcmp(mode, "copies-3d") == 0) result = copies3D();
  if (std::strcmp(mode, "bad-launch") == 0) result = badLaunch();
  if (std::strcmp(mode, "out-of-memory") == 0 && argument != nullptr) {
    result = outOfMemory(argument);
  }
  if (std::strcmp(mode, "hold") == 0 && argument != nullptr) result = hold(argument);
  if (result == 2) std::printf("unknown mode %s\n", mode);
  if (result == 0) std::printf("%s: PASSED\n", mode);
  return result;
}
