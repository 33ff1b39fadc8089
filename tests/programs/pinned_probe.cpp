// A driver-API program for page-locked host memory (cuMemAllocHost, cuMemHostAlloc): copies from
// and to it, blocking and asynchronous, kernels that read and write it through its device
// pointer, and an allocation held until the process is killed. Runs natively or through the
// stub; every scenario checks its own results and exits 1 with a message on stderr when one is
// wrong. Lines "<check> <CUresult name>" report results for tests to compare.
//
//   pinned_probe copies BYTES    byte-exact H2D and D2H, blocking and on a stream, at offsets
//   pinned_probe kernel COUNT    fill_u32 and vector_add on device-mapped pinned memory, and a
//                                memset and device-to-device copies naming it
//   pinned_probe async           an async copy returns while the stream is busy; a blocking one
//                                waits for it
//   pinned_probe hold BYTES      cuMemHostAlloc, touch every page, then wait to be killed
//   pinned_probe register        cuMemHostRegister of a sealed memfd's shared mapping and of
//                                whole pages of private memory (kernels reach both) and of part
//                                of malloc'd pages (copies only), and its errors
//   pinned_probe hold-registered BYTES [ADDRESS]   cuMemHostRegister of BYTES of shared memory
//                                (at ADDRESS when given), print "holding at ADDRESS", then
//                                wait to be killed
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "test_kernels_ptx.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* nameOf(CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) return "UNKNOWN";
  return name;
}

void report(const char* check, CUresult result) {
  std::printf("%s %s\n", check, nameOf(result));
  std::fflush(stdout);
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "pinned_probe: %s\n", message.c_str());
  std::exit(1);
}

#define CHECK(call)                                                                     \
  do {                                                                                  \
    CUresult result_ = (call);                                                          \
    if (result_ != CUDA_SUCCESS) die(std::string(#call " failed: ") + nameOf(result_)); \
  } while (0)

CUmodule setUp() {
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  CUmodule module;
  CHECK(cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
  return module;
}

void fillPattern(unsigned char* bytes, std::size_t count, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    bytes[i] = static_cast<unsigned char>(x >> 24);
  }
}

void expectSame(const unsigned char* got, const unsigned char* want, std::size_t count,
                const char* what) {
  for (std::size_t i = 0; i < count; ++i) {
    if (got[i] != want[i]) {
      die(std::string(what) + ": byte " + std::to_string(i) + " is " + std::to_string(got[i]) +
          ", expected " + std::to_string(want[i]));
    }
  }
}

double millisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int copies(std::size_t bytes) {
  setUp();
  unsigned char* source = nullptr;
  unsigned char* landing = nullptr;
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&source), bytes));
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&landing), bytes,
                       CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_WRITECOMBINED));
  CUdeviceptr device;
  CHECK(cuMemAlloc(&device, bytes));

  // Blocking both ways.
  fillPattern(source, bytes, 1);
  std::memset(landing, 0, bytes);
  CHECK(cuMemcpyHtoD(device, source, bytes));
  CHECK(cuMemcpyDtoH(landing, device, bytes));
  expectSame(landing, source, bytes, "blocking");

  // On a stream: nothing is read back before the stream is synchronised.
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  fillPattern(source, bytes, 2);
  std::memset(landing, 0, bytes);
  CHECK(cuMemcpyHtoDAsync(device, source, bytes, stream));
  CHECK(cuMemcpyDtoHAsync(landing, device, bytes, stream));
  CHECK(cuStreamSynchronize(stream));
  expectSame(landing, source, bytes, "async");

  // Ranges inside the allocations, at odd offsets.
  const std::size_t part = bytes / 2 + 333;
  fillPattern(source, bytes, 3);
  std::memset(landing, 0, bytes);
  CHECK(cuMemcpyHtoDAsync(device + 64, source + 12345 % (bytes - part), part, stream));
  CHECK(cuMemcpyDtoHAsync(landing + 777 % (bytes - part), device + 64, part, stream));
  CHECK(cuStreamSynchronize(stream));
  expectSame(landing + 777 % (bytes - part), source + 12345 % (bytes - part), part, "offsets");

  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(device));
  CHECK(cuMemFreeHost(source));
  CHECK(cuMemFreeHost(landing));
  std::printf("copies OK %zu\n", bytes);
  return 0;
}

int kernel(unsigned long long count) {
  CUmodule module = setUp();
  CUfunction fillU32;
  CUfunction vectorAdd;
  CHECK(cuModuleGetFunction(&fillU32, module, "fill_u32"));
  CHECK(cuModuleGetFunction(&vectorAdd, module, "vector_add"));
  const std::size_t bytes = count * sizeof(float);
  unsigned* words = nullptr;
  float* a = nullptr;
  float* b = nullptr;
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&words), bytes, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&a), bytes, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&b), bytes,
                       CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr wordsOnDevice, aOnDevice, bOnDevice;
  CHECK(cuMemHostGetDevicePointer(&wordsOnDevice, words, 0));
  CHECK(cuMemHostGetDevicePointer(&aOnDevice, a, 0));
  CHECK(cuMemHostGetDevicePointer(&bOnDevice, b, 0));
  if (wordsOnDevice != reinterpret_cast<CUdeviceptr>(words)) {
    die("the device pointer of pinned memory is not its host pointer");
  }

  // A kernel writes pinned memory; the host reads it once the stream is done.
  std::memset(words, 0, bytes);
  unsigned value = 0x5eed1234u;
  const unsigned block = 128;
  const auto grid = static_cast<unsigned>((count + block - 1) / block);
  void* fillParams[] = {&wordsOnDevice, &value, &count};
  CHECK(cuLaunchKernel(fillU32, grid, 1, 1, block, 1, 1, 0, nullptr, fillParams, nullptr));
  CHECK(cuCtxSynchronize());
  for (unsigned long long i = 0; i < count; ++i) {
    if (words[i] != value) die("fill_u32 into pinned memory: word " + std::to_string(i));
  }

  // A kernel reads pinned memory and writes device memory, then pinned memory.
  for (unsigned long long i = 0; i < count; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i);
  }
  CUdeviceptr sum;
  CHECK(cuMemAlloc(&sum, bytes));
  int n = static_cast<int>(count);
  void* addParams[] = {&aOnDevice, &bOnDevice, &sum, &n};
  CHECK(cuLaunchKernel(vectorAdd, grid, 1, 1, block, 1, 1, 0, nullptr, addParams, nullptr));
  std::memset(words, 0, bytes);
  CHECK(cuMemcpyDtoH(words, sum, bytes));
  void* inPlaceParams[] = {&aOnDevice, &bOnDevice, &bOnDevice, &n};
  CHECK(cuLaunchKernel(vectorAdd, grid, 1, 1, block, 1, 1, 0, nullptr, inPlaceParams, nullptr));
  CHECK(cuCtxSynchronize());
  for (unsigned long long i = 0; i < count; ++i) {
    float got = 0;
    std::memcpy(&got, &words[i], sizeof(got));
    if (got != 1.5f * static_cast<float>(i))
      die("vector_add from pinned memory: element " + std::to_string(i));
    if (b[i] != 1.5f * static_cast<float>(i))
      die("vector_add into pinned memory: element " + std::to_string(i));
  }

  // Copies and memsets may name device-mapped pinned memory by its device pointer, as device
  // memory (unified addressing): a memset of it, a device-to-device copy out of it and into it.
  CHECK(cuMemsetD32(wordsOnDevice, 0x0badf00du, static_cast<std::size_t>(count)));
  CHECK(cuMemcpyDtoD(sum, wordsOnDevice, bytes));
  CHECK(cuMemcpyDtoD(aOnDevice, sum, bytes));
  CHECK(cuCtxSynchronize());
  for (unsigned long long i = 0; i < count; ++i) {
    unsigned got = 0;
    std::memcpy(&got, &a[i], sizeof(got));
    if (words[i] != 0x0badf00du || got != 0x0badf00du) {
      die("memset and device-to-device copies of pinned memory: element " + std::to_string(i));
    }
  }
  CHECK(cuMemFree(sum));
  CHECK(cuMemFreeHost(words));
  CHECK(cuMemFreeHost(a));
  CHECK(cuMemFreeHost(b));
  std::printf("kernel OK %llu\n", count);
  return 0;
}

// A spin kernel keeps the stream busy for 300 ms: an asynchronous copy from pinned memory queued
// behind it returns at once, and a blocking copy on the legacy stream waits for it.
int async() {
  CUmodule module = setUp();
  CUfunction spin;
  CHECK(cuModuleGetFunction(&spin, module, "spin"));
  constexpr std::size_t kBytes = 1 << 20;
  unsigned char* host = nullptr;
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&host), kBytes));
  fillPattern(host, kBytes, 4);
  CUdeviceptr device;
  CHECK(cuMemAlloc(&device, kBytes));
  unsigned long long ns = 300'000'000ull;
  void* spinParams[] = {&ns};

  CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, nullptr, spinParams, nullptr));
  auto start = std::chrono::steady_clock::now();
  CHECK(cuMemcpyHtoDAsync(device, host, kBytes, nullptr));
  std::printf("async-copy-ms %.0f\n", millisecondsSince(start));

  CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, nullptr, spinParams, nullptr));
  unsigned char* back = nullptr;
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&back), kBytes));
  start = std::chrono::steady_clock::now();
  CHECK(cuMemcpyDtoH(back, device, kBytes));
  std::printf("blocking-copy-ms %.0f\n", millisecondsSince(start));
  expectSame(back, host, kBytes, "async round trip");
  CHECK(cuMemFreeHost(host));
  CHECK(cuMemFreeHost(back));
  CHECK(cuMemFree(device));
  std::printf("async OK\n");
  return 0;
}

// A sealed memfd of `pages` pages, mapped shared: memory another process can map too. gpuproxyd
// maps it at the same address, which must be free there: placed in a part of the address space
// neither process's own mappings use (the stub places its segment elsewhere), not where this
// process's next mmap would go, which may be in use in the daemon. The 4 GiB slot is chosen by
// process id, not at random, so that probes running side by side (whose memory the one daemon
// maps) never pick the same one.
unsigned char* sharedMemory(std::size_t pages, bool sealed, std::uint64_t at = 0) {
  const std::size_t bytes = pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::memfd_create("pinned_probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) die("memfd_create/ftruncate");
  if (sealed && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    die("F_ADD_SEALS");
  }
  const auto slot = static_cast<std::uint64_t>(::getpid()) % 0x1000;
  void* hint = reinterpret_cast<void*>(at != 0 ? at : (std::uint64_t{0x3000} + slot) << 32);
  void* memory = ::mmap(hint, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (memory == MAP_FAILED) die("mmap");
  if (at != 0 && memory != hint) die("mmap: the address asked for is in use here");
  ::close(fd);  // the mapping keeps the file
  return static_cast<unsigned char*>(memory);
}

int registered() {
  CUmodule module = setUp();
  CUfunction fillU32;
  CHECK(cuModuleGetFunction(&fillU32, module, "fill_u32"));
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  CUdeviceptr device;
  CHECK(cuMemAlloc(&device, 4 * page));

  // Shared memory: gpuproxyd maps it too, so a kernel writes it through its device pointer.
  // The range starts inside a page and ends inside another, as a buffer may.
  unsigned char* shared = sharedMemory(4, /*sealed=*/true);
  unsigned char* start = shared + page + 100;
  const std::size_t bytes = 2 * page;
  report(
      "register-shared",
      cuMemHostRegister(start, bytes, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
  report("register-shared-again", cuMemHostRegister(start + 8, 8, 0));
  unsigned registeredFlags = 0;
  report("registered-flags", cuMemHostGetFlags(&registeredFlags, start));
  CUdeviceptr onDevice = 0;
  report("shared-device-pointer", cuMemHostGetDevicePointer(&onDevice, start, 0));
  std::printf("shared-device-pointer-is-host %s\n",
              onDevice == reinterpret_cast<CUdeviceptr>(start) ? "yes" : "no");
  unsigned value = 0xfeed5eedu;
  unsigned long long count = bytes / sizeof(unsigned);
  void* fillParams[] = {&onDevice, &value, &count};
  std::memset(start, 0, bytes);
  report("shared-kernel", cuLaunchKernel(fillU32, static_cast<unsigned>((count + 127) / 128), 1, 1,
                                         128, 1, 1, 0, nullptr, fillParams, nullptr));
  report("shared-kernel-sync", cuCtxSynchronize());
  bool filled = true;
  for (unsigned long long i = 0; i < count; ++i) {
    unsigned word = 0;
    std::memcpy(&word, start + i * sizeof(unsigned), sizeof(word));
    filled = filled && word == value;
  }
  std::printf("shared-kernel-wrote %s\n", filled ? "yes" : "no");
  // Copies from and to it.
  fillPattern(start, bytes, 5);
  CHECK(cuMemcpyHtoD(device, start, bytes));
  std::vector<unsigned char> back(bytes);
  CHECK(cuMemcpyDtoH(back.data(), device, bytes));
  expectSame(back.data(), start, bytes, "copies of registered shared memory");
  report("unregister-shared", cuMemHostUnregister(start));
  report("unregister-shared-again", cuMemHostUnregister(start));

  // malloc'd memory cannot be shared after the fact: registered for copies, not for devices.
  std::vector<unsigned char> heap(3 * page + 7);
  report("register-heap-devicemap",
         cuMemHostRegister(heap.data(), heap.size(), CU_MEMHOSTREGISTER_DEVICEMAP));
  report("register-heap", cuMemHostRegister(heap.data(), heap.size(), 0));
  report("register-heap-overlap", cuMemHostRegister(heap.data() + 100, 10, 0));
  report("heap-device-pointer", cuMemHostGetDevicePointer(&onDevice, heap.data(), 0));
  fillPattern(heap.data(), heap.size(), 6);
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  std::vector<unsigned char> landing(heap.size());
  CHECK(cuMemcpyHtoDAsync(device, heap.data(), heap.size(), stream));
  CHECK(cuMemcpyDtoHAsync(landing.data(), device, heap.size(), stream));
  CHECK(cuStreamSynchronize(stream));
  expectSame(landing.data(), heap.data(), heap.size(), "copies of registered heap memory");
  report("unregister-heap-inside", cuMemHostUnregister(heap.data() + 1));
  report("unregister-heap", cuMemHostUnregister(heap.data()));

  // Whole pages of the program's own private memory, device-mapped: moved into shared memory
  // where they are, contents and all, so a kernel writes them too; still the program's after.
  const std::size_t privateBytes = 3 * page;
  void* privateMapping =
      ::mmap(nullptr, privateBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (privateMapping == MAP_FAILED) {
    std::fprintf(stderr, "mmap failed\n");
    return 1;
  }
  auto* privateBytesAt = static_cast<unsigned char*>(privateMapping);
  fillPattern(privateBytesAt, privateBytes, 8);
  std::vector<unsigned char> before(privateBytesAt, privateBytesAt + privateBytes);
  report("register-private-pages-devicemap",
         cuMemHostRegister(privateMapping, privateBytes, CU_MEMHOSTREGISTER_DEVICEMAP));
  std::printf("private-pages-kept %s\n",
              std::memcmp(before.data(), privateBytesAt, privateBytes) == 0 ? "yes" : "no");
  CUdeviceptr privateOnDevice = 0;
  report("private-pages-device-pointer",
         cuMemHostGetDevicePointer(&privateOnDevice, privateMapping, 0));
  unsigned long long privateWords = page / sizeof(unsigned);  // the middle page
  CUdeviceptr middle = privateOnDevice + page;
  unsigned privateValue = 0x5eed0001u;
  void* privateParams[] = {&middle, &privateValue, &privateWords};
  report("private-pages-kernel",
         cuLaunchKernel(fillU32, static_cast<unsigned>((privateWords + 127) / 128), 1, 1, 128, 1, 1,
                        0, nullptr, privateParams, nullptr));
  CHECK(cuCtxSynchronize());
  bool privateFilled = true;
  for (unsigned long long i = 0; i < privateWords; ++i) {
    unsigned word = 0;
    std::memcpy(&word, privateBytesAt + page + i * sizeof(unsigned), sizeof(word));
    privateFilled = privateFilled && word == privateValue;
  }
  privateFilled = privateFilled && std::memcmp(before.data(), privateBytesAt, page) == 0;
  std::printf("private-pages-kernel-wrote %s\n", privateFilled ? "yes" : "no");
  report("unregister-private-pages", cuMemHostUnregister(privateMapping));
  privateBytesAt[0] = 42;  // the program's memory, as before
  std::printf("private-pages-usable %s\n", privateBytesAt[0] == 42 ? "yes" : "no");
  ::munmap(privateMapping, privateBytes);

  // What the daemon cannot map safely: a memfd its owner could still shrink.
  unsigned char* unsealed = sharedMemory(1, /*sealed=*/false);
  report("register-unsealed-devicemap",
         cuMemHostRegister(unsealed, page, CU_MEMHOSTREGISTER_DEVICEMAP));

  // Bad arguments.
  report("register-null", cuMemHostRegister(nullptr, page, 0));
  report("register-empty", cuMemHostRegister(heap.data(), 0, 0));
  report("register-bad-flags", cuMemHostRegister(heap.data(), page, 0x80));
  report("register-iomemory", cuMemHostRegister(heap.data(), page, CU_MEMHOSTREGISTER_IOMEMORY));
  report("unregister-never", cuMemHostUnregister(heap.data()));
  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(device));
  std::printf("register OK\n");
  return 0;
}

int hold(std::size_t bytes) {
  setUp();
  void* memory = nullptr;
  const CUresult result = cuMemHostAlloc(&memory, bytes, CU_MEMHOSTALLOC_DEVICEMAP);
  report("cuMemHostAlloc", result);
  if (result != CUDA_SUCCESS) return 0;
  std::memset(memory, 0x5a, bytes);
  std::printf("holding at %p\n", static_cast<void*>(memory));
  std::fflush(stdout);
  for (;;) ::pause();
}

// cuMemHostRegister of a sealed memfd's shared mapping of BYTES, touched, then held until killed.
int holdRegistered(std::size_t bytes, std::uint64_t at) {
  setUp();
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  unsigned char* memory = sharedMemory((bytes + page - 1) / page, /*sealed=*/true, at);
  const CUresult result = cuMemHostRegister(memory, bytes, CU_MEMHOSTREGISTER_DEVICEMAP);
  report("cuMemHostRegister", result);
  if (result != CUDA_SUCCESS) return 0;
  std::memset(memory, 0x5a, bytes);
  std::printf("holding at %p\n", static_cast<void*>(memory));
  std::fflush(stdout);
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  auto number = [&](int index) {
    if (argc <= index) die("scenario '" + scenario + "' needs more arguments");
    return std::strtoull(argv[index], nullptr, 0);
  };
  if (scenario == "copies") return copies(number(2));
  if (scenario == "kernel") return kernel(number(2));
  if (scenario == "async") return async();
  if (scenario == "hold") return hold(number(2));
  if (scenario == "register") return registered();
  if (scenario == "hold-registered") return holdRegistered(number(2), argc > 3 ? number(3) : 0);
  die("usage: pinned_probe copies BYTES | kernel COUNT | async | hold BYTES | register | "
      "hold-registered BYTES [ADDRESS]");
}
