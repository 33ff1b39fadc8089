// Unified (managed) memory as CUDA tutorials and applications use it, built by plain nvcc:
// `managed_memory <mode> [argument]` prints what it saw and ends with "<mode>: PASSED" (exit 0) or
// a line naming the failing call (exit 1).
//
//   saxpy            cudaMallocManaged arrays filled by the host, a grid-stride kernel over them,
//                    cudaDeviceSynchronize, the host reads the result; prefetches and advice;
//                    cudaMemset and cudaMemcpy naming managed memory; a kernel on a stream the
//                    memory is attached to; the host writing while another kernel runs;
//                    cudaPointerGetAttributes; cudaFree
//   large N          N managed bytes filled by the host, doubled by a kernel, checked by the host
//   over-limit N     cudaMallocManaged of N bytes must fail with cudaErrorMemoryAllocation
//   hold N           allocates N managed bytes, fills them on the device, prints "holding", then
//                    waits to be killed

#include <cuda_runtime.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "checks.cuh"

// y = a * x + y over any n, whatever the grid (the grid-stride loop tutorials teach).
__global__ void saxpy(int n, float a, const float* x, float* y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    y[i] = a * x[i] + y[i];
  }
}

// Says it has started, then polls until the host raises *stop (or a bound is reached), and
// records how far it got.
__global__ void waitForHost(volatile int* stop, volatile int* started, int* rounds) {
  *started = 1;
  int round = 0;
  while (*stop == 0 && round < 200000) {
    ++round;
    __nanosleep(1000);
  }
  *rounds = round;
}

namespace {

int saxpyMode() {
  int device = 0;
  CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties;
  CHECK(cudaGetDeviceProperties(&properties, device));
  std::printf("managedMemory %d concurrentManagedAccess %d\n", properties.managedMemory,
              properties.concurrentManagedAccess);
  EXPECT(properties.managedMemory == 1, "the device does not report managed memory");

  const int n = 1 << 20;
  float* x = nullptr;
  float* y = nullptr;
  CHECK(cudaMallocManaged(&x, n * sizeof(float)));
  CHECK(cudaMallocManaged(&y, n * sizeof(float), cudaMemAttachGlobal));
  for (int i = 0; i < n; ++i) {
    x[i] = 1.0f;
    y[i] = 2.0f;
  }
  // Hints, as performance-minded code gives them: they must be accepted.
  CHECK(cudaMemAdvise(x, n * sizeof(float), cudaMemAdviseSetReadMostly,
                      cudaMemLocation{cudaMemLocationTypeDevice, device}));
  CHECK(cudaMemPrefetchAsync(x, n * sizeof(float),
                             cudaMemLocation{cudaMemLocationTypeDevice, device}, 0, 0));
  CHECK(cudaMemPrefetchAsync(y, n * sizeof(float),
                             cudaMemLocation{cudaMemLocationTypeDevice, device}, 0, 0));
  saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, x, y);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  float maxError = 0.0f;
  for (int i = 0; i < n; ++i) maxError = std::fmax(maxError, std::fabs(y[i] - 4.0f));
  std::printf("saxpy max error %g\n", maxError);
  EXPECT(maxError == 0.0f, "y is not 4 everywhere");

  // A smaller grid than the data: the loop covers the rest. Prefetched back to the host first.
  CHECK(cudaMemPrefetchAsync(y, n * sizeof(float), cudaMemLocation{cudaMemLocationTypeHost, 0}, 0,
                             0));
  saxpy<<<64, 128>>>(n, -1.0f, x, y);
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i += 4093)
    EXPECT(y[i] == 3.0f, "y[%d] = %f after the second pass", i, y[i]);

  // Copies and memsets name managed memory like any other.
  CHECK(cudaMemset(y, 0, n * sizeof(float)));
  CHECK(cudaDeviceSynchronize());
  EXPECT(y[0] == 0.0f && y[n - 1] == 0.0f, "cudaMemset left y[0] = %f", y[0]);
  float* device_copy = nullptr;
  CHECK(cudaMalloc(&device_copy, n * sizeof(float)));
  CHECK(cudaMemcpy(device_copy, x, n * sizeof(float), cudaMemcpyDefault));
  CHECK(cudaMemcpy(y, device_copy, n * sizeof(float), cudaMemcpyDeviceToDevice));
  // Device-to-device copies (and a pageable source's last bytes) may still be under way when
  // cudaMemcpy returns: the host synchronises before it reads.
  CHECK(cudaDeviceSynchronize());
  EXPECT(y[12345] == 1.0f, "y[12345] = %f after copying x through device memory", y[12345]);
  CHECK(cudaMemcpy(y + 1, x, 16 * sizeof(float), cudaMemcpyDefault));  // managed to managed
  float host[4] = {7.0f, 7.0f, 7.0f, 7.0f};
  CHECK(cudaMemcpy(y, host, sizeof(host), cudaMemcpyHostToDevice));
  CHECK(cudaDeviceSynchronize());
  EXPECT(y[0] == 7.0f && y[3] == 7.0f && y[4] == 1.0f, "y[0..4] = %f %f %f after the copies", y[0],
         y[3], y[4]);
  CHECK(cudaFree(device_copy));

  // What the runtime says the pointer is.
  cudaPointerAttributes attributes;
  CHECK(cudaPointerGetAttributes(&attributes, y + 10));
  std::printf("pointer type %d device %d\n", static_cast<int>(attributes.type), attributes.device);
  EXPECT(attributes.type == cudaMemoryTypeManaged, "type %d", static_cast<int>(attributes.type));
  EXPECT(attributes.devicePointer == y + 10 && attributes.hostPointer == y + 10,
         "device/host pointers %p %p", attributes.devicePointer, attributes.hostPointer);

  // Managed memory attached to one stream, and the host writing it while a kernel polls it
  // (the device has concurrent managed access).
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* flags = nullptr;  // stop, started, rounds
  CHECK(cudaMallocManaged(&flags, 3 * sizeof(int)));
  volatile int* shared = flags;
  shared[0] = 0;
  shared[1] = 0;
  shared[2] = -1;
  CHECK(cudaStreamAttachMemAsync(stream, flags, 0, cudaMemAttachSingle));
  waitForHost<<<1, 1, 0, stream>>>(flags, flags + 1, flags + 2);
  CHECK(cudaGetLastError());
  // The host sees the running kernel's write, and the kernel the host's.
  for (int waited = 0; shared[1] == 0 && waited < 10000; ++waited) usleep(1000);
  EXPECT(shared[1] == 1, "the host never saw the kernel start");
  EXPECT(cudaStreamQuery(stream) == cudaErrorNotReady, "the polling kernel ended on its own");
  shared[0] = 1;
  CHECK(cudaStreamSynchronize(stream));
  std::printf("kernel saw the host's write after %d rounds\n", flags[2]);
  EXPECT(flags[2] >= 0 && flags[2] < 200000, "rounds = %d", flags[2]);
  CHECK(cudaStreamDestroy(stream));

  CHECK(cudaFree(flags));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  // A pointer into the middle of an allocation is not one to free, nor is it host memory.
  float* z = nullptr;
  CHECK(cudaMallocManaged(&z, 4096));
  EXPECT(cudaFree(z + 1) == cudaErrorInvalidValue, "cudaFree of an inner pointer was accepted");
  EXPECT(cudaFreeHost(z) != cudaSuccess, "cudaFreeHost of managed memory was accepted");
  cudaGetLastError();  // reads (and clears) what the refusals left behind: they are not sticky
  CHECK(cudaGetLastError());
  CHECK(cudaFree(z));
  return 0;
}

int large(const char* bytesText) {
  const size_t bytes = std::strtoull(bytesText, nullptr, 10);
  const int n = static_cast<int>(bytes / sizeof(float));
  float* x = nullptr;
  CHECK(cudaMallocManaged(&x, bytes));
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1024);
  saxpy<<<256, 256>>>(n, 1.0f, x, x);  // x = 2x
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i += 1021) {
    EXPECT(x[i] == 2.0f * static_cast<float>(i % 1024), "x[%d] = %f", i, x[i]);
  }
  std::printf("%zu managed bytes doubled\n", bytes);
  CHECK(cudaFree(x));
  return 0;
}

int overLimit(const char* bytesText) {
  const size_t bytes = std::strtoull(bytesText, nullptr, 10);
  void* memory = nullptr;
  const cudaError_t status = cudaMallocManaged(&memory, bytes);
  std::printf("cudaMallocManaged(%zu) returned %s\n", bytes, cudaGetErrorName(status));
  EXPECT(status == cudaErrorMemoryAllocation, "expected cudaErrorMemoryAllocation");
  EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation, "cudaGetLastError lost the failure");
  CHECK(cudaGetLastError());
  CHECK(cudaMallocManaged(&memory, 4096));
  CHECK(cudaFree(memory));
  return 0;
}

int hold(const char* bytesText) {
  const size_t bytes = std::strtoull(bytesText, nullptr, 10);
  float* memory = nullptr;
  CHECK(cudaMallocManaged(&memory, bytes));
  CHECK(cudaMemset(memory, 0, bytes));
  saxpy<<<64, 256>>>(static_cast<int>(bytes / sizeof(float)), 1.0f, memory, memory);
  CHECK(cudaDeviceSynchronize());
  std::printf("holding %zu bytes\n", bytes);
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
  if (std::strcmp(mode, "saxpy") == 0) result = saxpyMode();
  if (std::strcmp(mode, "large") == 0 && argument != nullptr) result = large(argument);
  if (std::strcmp(mode, "over-limit") == 0 && argument != nullptr) result = overLimit(argument);
  if (std::strcmp(mode, "hold") == 0 && argument != nullptr) result = hold(argument);
  if (result == 2) std::printf("unknown mode %s\n", mode);
  if (result == 0) std::printf("%s: PASSED\n", mode);
  return result;
}
