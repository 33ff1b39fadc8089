// Interprocess sharing as multi-process CUDA programs do it (PyTorch's multiprocessing, inference
// servers, NVIDIA's simpleIPC): a process exports an allocation and an event with
// cudaIpcGetMemHandle and cudaIpcGetEventHandle, another opens them and works on the same memory,
// ordered by the shared event.
//
//   ipc_sharing                      the parent exports, starts itself as the child, which opens
//                                    both handles, transforms the data and records the event;
//                                    the parent waits for the event and checks the data, and the
//                                    refusals CUDA gives (its own handle, a timing event, host
//                                    memory) on the way
//   ipc_sharing pool                 the same with a stream-ordered allocation of a shareable
//                                    memory pool, whose file descriptor and exported pointer the
//                                    child imports and frees with cudaFreeAsync
//   ipc_sharing export FILE          allocates and fills, prints "handle HEX", and waits until FILE
//                                    exists, then exits without freeing anything
//   ipc_sharing import HEX [FILE]    opens HEX (after printing "opened", waits until FILE exists
//                                    when given), checks the exporter's data, transforms it,
//                                    checks again and closes; "open: ERROR" when the open fails
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "checks.cuh"

extern char** environ;

namespace {

constexpr int kCount = 1 << 16;

__global__ void fill(int* data, int count, int factor) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    data[i] = factor * i;
  }
}

__global__ void transform(int* data, int count) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    data[i] = 3 * data[i] + 1;
  }
}

template <typename Handle>
std::string hexOf(const Handle& handle) {
  std::string hex;
  char digits[3];
  for (unsigned char byte : handle.reserved) {
    std::snprintf(digits, sizeof(digits), "%02x", byte);
    hex += digits;
  }
  return hex;
}

template <typename Handle>
bool parseHex(const char* hex, Handle& handle) {
  if (std::strlen(hex) != 2 * sizeof(handle.reserved)) return false;
  for (std::size_t i = 0; i < sizeof(handle.reserved); ++i) {
    unsigned value = 0;
    if (std::sscanf(hex + 2 * i, "%2x", &value) != 1) return false;
    handle.reserved[i] = static_cast<char>(value);
  }
  return true;
}

// Runs this program again with `arguments`, as a child inheriting this process's environment;
// 0 once it has exited with 0.
int runChild(const char* self, std::vector<std::string> arguments) {
  std::vector<char*> argv = {const_cast<char*>(self)};
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = 0;
  EXPECT(posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ) == 0,
         "could not start the child");
  int status = 0;
  EXPECT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
         "the child failed (status %d)", status);
  return 0;
}

void waitForFile(const char* path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (access(path, F_OK) != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Whether data[i] == factor * i + offset for every i.
int expectValues(const std::vector<int>& data, int factor, int offset, const char* what) {
  for (int i = 0; i < kCount; ++i) {
    EXPECT(data[i] == factor * i + offset, "%s: element %d is %d, not %d", what, i, data[i],
           factor * i + offset);
  }
  return 0;
}

int child(const char* memHex, const char* eventHex) {
  cudaIpcMemHandle_t memHandle;
  cudaIpcEventHandle_t eventHandle;
  EXPECT(parseHex(memHex, memHandle) && parseHex(eventHex, eventHandle), "bad handle arguments");
  CHECK(cudaSetDevice(0));
  void* data = nullptr;
  CHECK(cudaIpcOpenMemHandle(&data, memHandle, cudaIpcMemLazyEnablePeerAccess));
  // Opened again by the same process: the same mapping, one more reference.
  void* again = nullptr;
  CHECK(cudaIpcOpenMemHandle(&again, memHandle, cudaIpcMemLazyEnablePeerAccess));
  EXPECT(again == data, "the second open gave %p, the first %p", again, data);
  cudaEvent_t ready;
  CHECK(cudaIpcOpenEventHandle(&ready, eventHandle));

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The parent's fill is ordered before this stream's work by the event it recorded after it.
  CHECK(cudaStreamWaitEvent(stream, ready, 0));
  transform<<<64, 128, 0, stream>>>(static_cast<int*>(data), kCount);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(ready, stream));
  std::vector<int> host(kCount);
  CHECK(cudaMemcpyAsync(host.data(), data, kCount * sizeof(int), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (expectValues(host, 6, 1, "the child's view") != 0) return 1;

  CHECK(cudaIpcCloseMemHandle(data));
  CHECK(cudaIpcCloseMemHandle(data));
  // Closed as often as opened: the memory is not this process's any more.
  EXPECT(cudaIpcCloseMemHandle(data) == cudaErrorInvalidValue, "a third close succeeded");
  int first = 0;
  EXPECT(cudaMemcpy(&first, data, sizeof(first), cudaMemcpyDeviceToHost) != cudaSuccess,
         "a copy from closed interprocess memory succeeded");
  cudaGetLastError();
  CHECK(cudaEventDestroy(ready));
  CHECK(cudaStreamDestroy(stream));
  std::printf("child: PASSED\n");
  return 0;
}

int share(const char* self) {
  int* data = nullptr;
  CHECK(cudaMalloc(&data, kCount * sizeof(int)));
  fill<<<64, 128>>>(data, kCount, 2);
  CHECK(cudaGetLastError());
  cudaEvent_t ready;
  CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming | cudaEventInterprocess));
  CHECK(cudaEventRecord(ready, 0));

  // A pointer inside the allocation names the whole allocation.
  cudaIpcMemHandle_t memHandle;
  CHECK(cudaIpcGetMemHandle(&memHandle, data + 100));
  cudaIpcEventHandle_t eventHandle;
  CHECK(cudaIpcGetEventHandle(&eventHandle, ready));
  std::printf("exported %zu bytes and an event\n", kCount * sizeof(int));

  // What CUDA refuses: a process its own handle, an event that records timing, host memory.
  void* own = nullptr;
  const cudaError_t openOwn = cudaIpcOpenMemHandle(&own, memHandle, cudaIpcMemLazyEnablePeerAccess);
  EXPECT(openOwn == cudaErrorDeviceUninitialized, "opening its own handle gave %s",
         cudaGetErrorName(openOwn));
  cudaEvent_t timed;
  CHECK(cudaEventCreate(&timed));
  cudaIpcEventHandle_t timedHandle;
  const cudaError_t exportTimed = cudaIpcGetEventHandle(&timedHandle, timed);
  EXPECT(exportTimed == cudaErrorInvalidResourceHandle, "exporting a timing event gave %s",
         cudaGetErrorName(exportTimed));
  CHECK(cudaEventDestroy(timed));
  std::vector<int> pageable(16);
  cudaIpcMemHandle_t hostHandle;
  const cudaError_t exportHost = cudaIpcGetMemHandle(&hostHandle, pageable.data());
  EXPECT(exportHost == cudaErrorInvalidValue, "exporting host memory gave %s",
         cudaGetErrorName(exportHost));
  cudaGetLastError();

  if (runChild(self, {"child", hexOf(memHandle), hexOf(eventHandle)}) != 0) return 1;

  // The child recorded the event after its kernel: waiting for it is waiting for that kernel.
  CHECK(cudaEventSynchronize(ready));
  std::vector<int> host(kCount);
  CHECK(cudaMemcpy(host.data(), data, kCount * sizeof(int), cudaMemcpyDeviceToHost));
  if (expectValues(host, 6, 1, "the parent's view after the child") != 0) return 1;
  CHECK(cudaEventDestroy(ready));
  CHECK(cudaFree(data));
  std::printf("share: PASSED\n");
  return 0;
}

int poolChild(const char* fdText, const char* pointerHex) {
  cudaMemPoolPtrExportData exported;
  EXPECT(parseHex(pointerHex, exported), "bad pointer argument");
  CHECK(cudaSetDevice(0));
  cudaMemPool_t pool;
  const int fd = std::atoi(fdText);
  CHECK(cudaMemPoolImportFromShareableHandle(&pool,
                                             reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                             cudaMemHandleTypePosixFileDescriptor, 0));
  // An imported pool holds the exporter's memory: it allocates nothing itself.
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* own = nullptr;
  EXPECT(cudaMallocFromPoolAsync(&own, 64, pool, stream) != cudaSuccess,
         "an imported pool allocated memory");
  cudaGetLastError();
  void* data = nullptr;
  CHECK(cudaMemPoolImportPointer(&data, pool, &exported));
  transform<<<64, 128, 0, stream>>>(static_cast<int*>(data), kCount);
  CHECK(cudaGetLastError());
  std::vector<int> host(kCount);
  CHECK(cudaMemcpyAsync(host.data(), data, kCount * sizeof(int), cudaMemcpyDeviceToHost, stream));
  // Freed in stream order, after the copy: the import is given back then.
  CHECK(cudaFreeAsync(data, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (expectValues(host, 15, 1, "the child's view of the pool's memory") != 0) return 1;
  CHECK(cudaMemPoolDestroy(pool));
  CHECK(cudaStreamDestroy(stream));
  std::printf("pool child: PASSED\n");
  return 0;
}

int sharePool(const char* self) {
  int handleTypes = 0;
  CHECK(cudaDeviceGetAttribute(&handleTypes, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
  EXPECT((handleTypes & cudaMemHandleTypePosixFileDescriptor) != 0,
         "pools cannot be shared by file descriptor (%d)", handleTypes);
  cudaMemPoolProps properties = {};
  properties.allocType = cudaMemAllocationTypePinned;
  properties.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  properties.location.type = cudaMemLocationTypeDevice;
  properties.location.id = 0;
  cudaMemPool_t pool;
  CHECK(cudaMemPoolCreate(&pool, &properties));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* data = nullptr;
  CHECK(
      cudaMallocFromPoolAsync(reinterpret_cast<void**>(&data), kCount * sizeof(int), pool, stream));
  fill<<<64, 128, 0, stream>>>(data, kCount, 5);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(stream));

  int fd = -1;
  CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  cudaMemPoolPtrExportData exported;
  CHECK(cudaMemPoolExportPointer(&exported, data));
  // Memory of a pool made without a handle type is not for other processes.
  int* plain = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&plain), 256, stream));
  cudaMemPoolPtrExportData refused;
  const cudaError_t exportPlain = cudaMemPoolExportPointer(&refused, plain);
  EXPECT(exportPlain == cudaErrorInvalidValue, "exporting default-pool memory gave %s",
         cudaGetErrorName(exportPlain));
  cudaGetLastError();
  // A pool's memory goes through its pool, not through legacy interprocess handles.
  cudaIpcMemHandle_t legacy;
  const cudaError_t legacyExport = cudaIpcGetMemHandle(&legacy, data);
  EXPECT(legacyExport == cudaErrorInvalidValue, "a legacy handle of pool memory gave %s",
         cudaGetErrorName(legacyExport));
  cudaGetLastError();
  CHECK(cudaFreeAsync(plain, stream));

  // The child inherits a copy of the descriptor (dup clears close-on-exec).
  const int inherited = dup(fd);
  EXPECT(inherited >= 0, "dup failed");
  const int child = runChild(self, {"pool-child", std::to_string(inherited), hexOf(exported)});
  close(inherited);
  if (child != 0) return 1;
  close(fd);

  std::vector<int> host(kCount);
  CHECK(cudaMemcpy(host.data(), data, kCount * sizeof(int), cudaMemcpyDeviceToHost));
  if (expectValues(host, 15, 1, "the parent's view after the child") != 0) return 1;
  CHECK(cudaFreeAsync(data, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemPoolDestroy(pool));
  CHECK(cudaStreamDestroy(stream));
  std::printf("pool: PASSED\n");
  return 0;
}

int exportAndWait(const char* file) {
  int* data = nullptr;
  CHECK(cudaMalloc(&data, kCount * sizeof(int)));
  fill<<<64, 128>>>(data, kCount, 7);
  CHECK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t memHandle;
  CHECK(cudaIpcGetMemHandle(&memHandle, data));
  std::printf("handle %s\n", hexOf(memHandle).c_str());
  std::fflush(stdout);
  waitForFile(file);
  return 0;  // nothing freed: the daemon reclaims it, or keeps it for those who opened it
}

int import(const char* hex, const char* file) {
  cudaIpcMemHandle_t memHandle;
  EXPECT(parseHex(hex, memHandle), "bad handle argument");
  CHECK(cudaSetDevice(0));
  void* data = nullptr;
  const cudaError_t opened = cudaIpcOpenMemHandle(&data, memHandle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    std::printf("open: %s\n", cudaGetErrorName(opened));
    return 2;
  }
  std::printf("opened\n");
  std::fflush(stdout);
  if (file != nullptr) waitForFile(file);
  std::vector<int> host(kCount);
  CHECK(cudaMemcpy(host.data(), data, kCount * sizeof(int), cudaMemcpyDeviceToHost));
  if (expectValues(host, 7, 0, "the exporter's data") != 0) return 1;
  transform<<<64, 128>>>(static_cast<int*>(data), kCount);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(host.data(), data, kCount * sizeof(int), cudaMemcpyDeviceToHost));
  if (expectValues(host, 21, 1, "after the transform") != 0) return 1;
  CHECK(cudaIpcCloseMemHandle(data));
  std::printf("import: PASSED\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "share";
  if (mode == "share") return share(argv[0]);
  if (mode == "child" && argc == 4) return child(argv[2], argv[3]);
  if (mode == "pool") return sharePool(argv[0]);
  if (mode == "pool-child" && argc == 4) return poolChild(argv[2], argv[3]);
  if (mode == "export" && argc == 3) return exportAndWait(argv[2]);
  if (mode == "import" && (argc == 3 || argc == 4))
    return import(argv[2], argc == 4 ? argv[3] : nullptr);
  std::printf("usage: %s [share | pool | export FILE | import HEX [FILE]]\n", argv[0]);
  return 2;
}
