// A driver-API program for the asynchronous paths (launches, async copies, events, stream waits)
// under the conditions that break them: many threads, cross-thread event hand-offs, large kernel
// arguments, copies larger than any staging buffer, errors of asynchronous work. Runs natively or
// through the stub; every scenario checks its own results and exits 1 with a message on stderr
// when one is wrong. Lines "<check> <CUresult name>" report results for tests to compare.
//
//   ring_probe cross-thread ITERATIONS
//   ring_probe many-launchers THREADS LAUNCHES
//   ring_probe big-args
//   ring_probe staging BYTES
//   ring_probe staging-threads THREADS BYTES
//   ring_probe trap-async stream-sync|ctx-sync|stream-query
//   ring_probe sync-errors
//   ring_probe wait-on-dead-daemon
//   ring_probe launch-forever BYTES
//   ring_probe memset-2d
#include <cuda.h>

#include "test_kernels_ptx.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
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
  std::fflush(stdout);
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "ring_probe: %s\n", message.c_str());
  std::exit(1);
}

[[noreturn]] void fail(const char* call, CUresult result) {
  die(std::string(call) + " failed: " + nameOf(result));
}

#define CHECK(call)                                    \
  do {                                                 \
    CUresult result_ = (call);                         \
    if (result_ != CUDA_SUCCESS) fail(#call, result_); \
  } while (0)

struct Setup {
  CUcontext context = nullptr;
  CUmodule module = nullptr;
};

Setup setUp() {
  Setup setup;
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&setup.context, device));
  CHECK(cuCtxSetCurrent(setup.context));
  CHECK(cuModuleLoadData(&setup.module, gpuproxy::testing::kTestKernelsPtx));
  return setup;
}

CUfunction function(const Setup& setup, const char* name) {
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, setup.module, name));
  return f;
}

CUresult fill(CUfunction fillU32, CUdeviceptr pointer, unsigned value, unsigned long long count,
              CUstream stream) {
  void* params[] = {&pointer, &value, &count};
  const unsigned block = 128;
  const unsigned grid = static_cast<unsigned>((count + block - 1) / block);
  return cuLaunchKernel(fillU32, grid, 1, 1, block, 1, 1, 0, stream, params, nullptr);
}

std::uint32_t pattern(std::uint64_t index, std::uint64_t seed) {
  std::uint64_t x = (index + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x);
}

void fillPattern(std::vector<unsigned char>& bytes, std::uint64_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(pattern(i, seed) >> 8);
  }
}

void expectEqual(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                 const char* what) {
  if (got.size() != want.size()) die(std::string(what) + ": sizes differ");
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      die(std::string(what) + ": byte " + std::to_string(i) + " is " + std::to_string(got[i]) +
          ", expected " + std::to_string(want[i]));
    }
  }
}

// Thread A writes a value on s1 and records an event; thread B, told by A through a condition
// variable, makes s2 wait for the event and reads the value back on s2. A kernel that keeps s1
// busy first makes a wrong order visible: B would read the previous iteration's value.
int crossThread(int iterations) {
  Setup setup = setUp();
  CUfunction fillU32 = function(setup, "fill_u32");
  CUfunction spin = function(setup, "spin");
  CUdeviceptr value;
  CHECK(cuMemAlloc(&value, sizeof(unsigned)));
  CHECK(cuMemsetD32(value, 0xffffffffu, 1));
  CUstream s1, s2;
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));

  std::mutex mutex;
  std::condition_variable changed;
  int recorded = -1;  // iteration whose event A has recorded
  int checked = -1;   // iteration B has verified
  std::thread reader([&] {
    CHECK(cuCtxSetCurrent(setup.context));
    for (int i = 0; i < iterations; ++i) {
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return recorded >= i; });
      }
      CHECK(cuStreamWaitEvent(s2, event, 0));
      unsigned got = 0;
      CHECK(cuMemcpyDtoHAsync(&got, value, sizeof(got), s2));
      CHECK(cuStreamSynchronize(s2));
      if (got != static_cast<unsigned>(i)) {
        die("cross-thread: iteration " + std::to_string(i) + " read " + std::to_string(got));
      }
      {
        std::lock_guard lock(mutex);
        checked = i;
      }
      changed.notify_all();
    }
  });
  for (int i = 0; i < iterations; ++i) {
    {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return checked >= i - 1; });
    }
    unsigned long long ns = (i % 4 == 0) ? 300000 : 20000;
    void* spinParams[] = {&ns};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, spinParams, nullptr));
    CHECK(fill(fillU32, value, static_cast<unsigned>(i), 1, s1));
    CHECK(cuEventRecord(event, s1));
    {
      std::lock_guard lock(mutex);
      recorded = i;
    }
    changed.notify_all();
  }
  reader.join();
  CHECK(cuCtxSynchronize());
  CHECK(cuEventDestroy(event));
  CHECK(cuStreamDestroy(s1));
  CHECK(cuStreamDestroy(s2));
  CHECK(cuMemFree(value));
  std::printf("cross-thread OK %d\n", iterations);
  return 0;
}

// Every thread launches into its own slots as fast as it can: half of them on their own stream,
// half on the legacy NULL stream.
int manyLaunchers(int threads, int launches) {
  Setup setup = setUp();
  CUfunction fillU32 = function(setup, "fill_u32");
  constexpr unsigned kSlot = 64;
  const std::size_t words = static_cast<std::size_t>(threads) * launches * kSlot;
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, words * sizeof(unsigned)));
  CHECK(cuMemsetD32(buffer, 0, words));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      CHECK(cuCtxSetCurrent(setup.context));
      CUstream stream = nullptr;
      if (t % 2 == 0) CHECK(cuStreamCreate(&stream, CU_STREAM_DEFAULT));
      for (int j = 0; j < launches; ++j) {
        const std::size_t slot = static_cast<std::size_t>(t) * launches + j;
        CHECK(fill(fillU32, buffer + slot * kSlot * sizeof(unsigned),
                   static_cast<unsigned>(slot + 1), kSlot, stream));
      }
      CHECK(cuStreamSynchronize(stream));
      if (stream != nullptr) CHECK(cuStreamDestroy(stream));
    });
  }
  for (auto& worker : workers) worker.join();
  CHECK(cuCtxSynchronize());
  std::vector<unsigned> host(words);
  CHECK(cuMemcpyDtoH(host.data(), buffer, words * sizeof(unsigned)));
  for (std::size_t i = 0; i < words; ++i) {
    if (host[i] != i / kSlot + 1) {
      die("many-launchers: word " + std::to_string(i) + " is " + std::to_string(host[i]));
    }
  }
  CHECK(cuMemFree(buffer));
  std::printf("many-launchers OK %d x %d\n", threads, launches);
  return 0;
}

template <std::size_t kWords>
struct Words {
  unsigned words[kWords];
};

template <std::size_t kWords>
void launchCopyWords(CUfunction kernel, CUdeviceptr out, std::uint64_t seed, bool viaExtra,
                     Words<kWords>& args) {
  for (std::size_t i = 0; i < kWords; ++i) args.words[i] = pattern(i, seed);
  if (!viaExtra) {
    void* params[] = {&out, &args};
    CHECK(cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
    return;
  }
  // The packed buffer: the pointer at 0, the struct right after it (4-byte aligned).
  std::vector<unsigned char> packed(sizeof(out) + sizeof(args));
  std::memcpy(packed.data(), &out, sizeof(out));
  std::memcpy(packed.data() + sizeof(out), &args, sizeof(args));
  std::size_t size = packed.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  CHECK(cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, extra));
}

// Kernels taking 4 KiB and 32000 bytes by value, several launches in flight before anything is
// read back, each into its own output.
int bigArgs() {
  Setup setup = setUp();
  CUfunction small = function(setup, "copy_words_4k");
  CUfunction large = function(setup, "copy_words_32k");
  constexpr int kLaunches = 24;
  constexpr std::size_t kSmall = 1024;
  constexpr std::size_t kLarge = 8000;
  std::vector<CUdeviceptr> outs(kLaunches);
  for (auto& out : outs) CHECK(cuMemAlloc(&out, kLarge * sizeof(unsigned)));
  auto smallArgs = std::make_unique<Words<kSmall>>();
  auto largeArgs = std::make_unique<Words<kLarge>>();
  for (int i = 0; i < kLaunches; ++i) {
    const bool viaExtra = i % 3 == 2;
    if (i % 2 == 0) {
      launchCopyWords(small, outs[i], static_cast<std::uint64_t>(i), viaExtra, *smallArgs);
    } else {
      launchCopyWords(large, outs[i], static_cast<std::uint64_t>(i), viaExtra, *largeArgs);
    }
  }
  CHECK(cuCtxSynchronize());
  for (int i = 0; i < kLaunches; ++i) {
    const std::size_t words = i % 2 == 0 ? kSmall : kLarge;
    std::vector<unsigned> host(words);
    CHECK(cuMemcpyDtoH(host.data(), outs[i], words * sizeof(unsigned)));
    for (std::size_t w = 0; w < words; ++w) {
      if (host[w] != pattern(w, static_cast<std::uint64_t>(i))) {
        die("big-args: launch " + std::to_string(i) + " word " + std::to_string(w) + " is " +
            std::to_string(host[w]) + ", expected " +
            std::to_string(pattern(w, static_cast<std::uint64_t>(i))));
      }
    }
    CHECK(cuMemFree(outs[i]));
  }
  std::printf("big-args OK\n");
  return 0;
}

// Copies larger than the staging area, both ways, blocking and on a stream, at odd offsets.
int staging(std::size_t bytes) {
  setUp();
  CUdeviceptr device;
  CUdeviceptr second;
  CHECK(cuMemAlloc(&device, bytes));
  CHECK(cuMemAlloc(&second, bytes));
  std::vector<unsigned char> in(bytes);
  std::vector<unsigned char> out(bytes);

  fillPattern(in, 1);
  CHECK(cuMemcpyHtoD(device, in.data(), bytes));
  CHECK(cuMemcpyDtoH(out.data(), device, bytes));
  expectEqual(out, in, "blocking round trip");

  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  fillPattern(in, 2);
  std::fill(out.begin(), out.end(), 0);
  CHECK(cuMemsetD8Async(device, 0, bytes, stream));
  CHECK(cuMemcpyHtoDAsync(device, in.data(), bytes, stream));
  CHECK(cuMemcpyDtoHAsync(out.data(), device, bytes, stream));
  CHECK(cuStreamSynchronize(stream));
  expectEqual(out, in, "round trip on a stream");

  // Odd offset and length: chunk boundaries fall mid-word.
  const std::size_t odd = bytes - 3;
  std::vector<unsigned char> partIn(odd);
  std::vector<unsigned char> partOut(odd);
  fillPattern(partIn, 3);
  CHECK(cuMemcpyHtoDAsync(device + 1, partIn.data(), odd, stream));
  CHECK(cuMemcpyDtoDAsync(second + 2, device + 1, odd, stream));
  CHECK(cuMemcpyDtoHAsync(partOut.data(), second + 2, odd, stream));
  CHECK(cuStreamSynchronize(stream));
  expectEqual(partOut, partIn, "odd offsets through a device-to-device copy");

  // A memset then a read of the whole range.
  CHECK(cuMemsetD32(second, 0xa5a5a5a5u, bytes / 4));
  CHECK(cuMemcpyDtoH(out.data(), second, bytes / 4 * 4));
  for (std::size_t i = 0; i < bytes / 4 * 4; ++i) {
    if (out[i] != 0xa5) die("memset: byte " + std::to_string(i) + " is " + std::to_string(out[i]));
  }
  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(device));
  CHECK(cuMemFree(second));
  std::printf("staging OK %zu\n", bytes);
  return 0;
}

// Several threads copying at once, so that their chunks interleave in the staging area and come
// back out of order.
int stagingThreads(int threads, std::size_t bytes) {
  Setup setup = setUp();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      CHECK(cuCtxSetCurrent(setup.context));
      CUdeviceptr device;
      CHECK(cuMemAlloc(&device, bytes));
      CUstream stream;
      CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
      std::vector<unsigned char> in(bytes);
      std::vector<unsigned char> out(bytes);
      for (int round = 0; round < 3; ++round) {
        fillPattern(in, static_cast<std::uint64_t>(t * 10 + round));
        if (round % 2 == 0) {
          CHECK(cuMemcpyHtoD(device, in.data(), bytes));
          CHECK(cuMemcpyDtoH(out.data(), device, bytes));
        } else {
          CHECK(cuMemcpyHtoDAsync(device, in.data(), bytes, stream));
          CHECK(cuMemcpyDtoHAsync(out.data(), device, bytes, stream));
          CHECK(cuStreamSynchronize(stream));
        }
        expectEqual(out, in, "staging-threads");
      }
      CHECK(cuStreamDestroy(stream));
      CHECK(cuMemFree(device));
    });
  }
  for (auto& worker : workers) worker.join();
  std::printf("staging-threads OK %d x %zu\n", threads, bytes);
  return 0;
}

// A faulting kernel launched asynchronously: the launch succeeds, the fault shows at the next
// call that synchronises.
int trapAsync(const std::string& how) {
  Setup setup = setUp();
  CUfunction trap = function(setup, "trap");
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  report("cuLaunchKernel(trap)",
         cuLaunchKernel(trap, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr));
  if (how == "stream-sync") {
    report("cuStreamSynchronize", cuStreamSynchronize(stream));
  } else if (how == "ctx-sync") {
    report("cuCtxSynchronize", cuCtxSynchronize());
  } else if (how == "stream-query") {
    CUresult result = CUDA_ERROR_NOT_READY;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (result == CUDA_ERROR_NOT_READY && std::chrono::steady_clock::now() < deadline) {
      result = cuStreamQuery(stream);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    report("cuStreamQuery", result);
  } else {
    die("trap-async: unknown variant " + how);
  }
  return 0;
}

// After a kernel fault the context is unusable: once the stub has heard of the fault, every call
// fails with it, asynchronous ones included, without the application synchronising first (as the
// driver fails launches once it has noticed a fault). The trap runs on one stream; the launches
// that notice it go to another, and a stream created before the fault reports it too.
// Hears of a fault from a synchronisation's answer, then launches at once: the launch must fail
// with the fault too (a driver's context stays unusable once one of its calls has reported it).
int faultThenLaunch() {
  Setup setup = setUp();
  CUfunction trap = function(setup, "trap");
  CUfunction fillU32 = function(setup, "fill_u32");
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, 1024));
  CUstream faulting;
  CUstream other;
  CHECK(cuStreamCreate(&faulting, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  report("cuLaunchKernel(trap)",
         cuLaunchKernel(trap, 1, 1, 1, 1, 1, 1, 0, faulting, nullptr, nullptr));
  report("cuStreamSynchronize(faulting)", cuStreamSynchronize(faulting));
  report("cuLaunchKernel(right after)", fill(fillU32, buffer, 7, 256, other));
  return 0;
}

int faultPoisonsContext() {
  Setup setup = setUp();
  CUfunction trap = function(setup, "trap");
  CUfunction fillU32 = function(setup, "fill_u32");
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, 1024));
  CUstream faulting;
  CUstream other;
  CUstream untouched;
  CHECK(cuStreamCreate(&faulting, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&untouched, CU_STREAM_NON_BLOCKING));
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DEFAULT));
  report("cuLaunchKernel(trap)",
         cuLaunchKernel(trap, 1, 1, 1, 1, 1, 1, 0, faulting, nullptr, nullptr));
  CUresult launch = CUDA_SUCCESS;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (launch == CUDA_SUCCESS && std::chrono::steady_clock::now() < deadline) {
    launch = fill(fillU32, buffer, 7, 256, other);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  report("cuLaunchKernel(after fault)", launch);
  report("cuMemsetD32Async(after fault)", cuMemsetD32Async(buffer, 1, 256, other));
  report("cuEventRecord(after fault)", cuEventRecord(event, other));
  report("cuStreamQuery(untouched stream)", cuStreamQuery(untouched));
  report("cuStreamSynchronize(untouched stream)", cuStreamSynchronize(untouched));
  report("cuCtxSynchronize", cuCtxSynchronize());
  report("cuCtxSynchronize(again)", cuCtxSynchronize());
  return 0;
}

// Mistakes the driver reports at the call itself, also for asynchronous calls; afterwards the
// context is healthy and nothing was latched for later.
int syncErrors() {
  Setup setup = setUp();
  CUfunction fillU32 = function(setup, "fill_u32");
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, 1024));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DEFAULT));
  CUdeviceptr pointer = buffer;
  unsigned value = 1;
  unsigned long long count = 256;
  void* params[] = {&pointer, &value, &count};
  report("launch(bad function)", cuLaunchKernel(reinterpret_cast<CUfunction>(0x4321), 1, 1, 1, 1, 1,
                                                1, 0, stream, params, nullptr));
  report("launch(zero block)",
         cuLaunchKernel(fillU32, 1, 1, 1, 0, 1, 1, 0, stream, params, nullptr));
  report("launch(too many threads)",
         cuLaunchKernel(fillU32, 1, 1, 1, 2048, 1, 1, 0, stream, params, nullptr));
  report("launch(bad stream)", cuLaunchKernel(fillU32, 1, 1, 1, 256, 1, 1, 0,
                                              reinterpret_cast<CUstream>(0x777), params, nullptr));
  report("launch(no parameters)",
         cuLaunchKernel(fillU32, 1, 1, 1, 256, 1, 1, 0, stream, nullptr, nullptr));
  report("cuMemsetD32Async(past end)", cuMemsetD32Async(buffer, 0, 257, stream));
  report("cuMemsetD32Async(misaligned)", cuMemsetD32Async(buffer + 2, 0, 1, stream));
  report("cuMemcpyDtoDAsync(past end)", cuMemcpyDtoDAsync(buffer, buffer + 512, 1024, stream));
  char host[64] = {};
  report("cuMemcpyHtoDAsync(foreign)",
         cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(0x10), host, sizeof(host), stream));
  report("cuMemcpyDtoHAsync(past end)", cuMemcpyDtoHAsync(host, buffer + 1000, 64, stream));
  report("cuEventRecord(bad event)", cuEventRecord(reinterpret_cast<CUevent>(0x999), stream));
  report("cuStreamWaitEvent(bad event)",
         cuStreamWaitEvent(stream, reinterpret_cast<CUevent>(0x999), 0));
  report("cuStreamWaitEvent(bad flags)", cuStreamWaitEvent(stream, event, 0x40));
  report("cuEventSynchronize(bad event)", cuEventSynchronize(reinterpret_cast<CUevent>(0x999)));
  // Everything after this point is fine and must stay fine.
  report("launch(good)", cuLaunchKernel(fillU32, 1, 1, 1, 256, 1, 1, 0, stream, params, nullptr));
  report("cuEventRecord", cuEventRecord(event, stream));
  report("cuEventSynchronize", cuEventSynchronize(event));
  report("cuEventQuery", cuEventQuery(event));
  report("cuStreamSynchronize", cuStreamSynchronize(stream));
  report("cuStreamQuery", cuStreamQuery(stream));
  report("cuCtxSynchronize", cuCtxSynchronize());
  std::vector<unsigned> words(256);
  report("cuMemcpyDtoH", cuMemcpyDtoH(words.data(), buffer, 1024));
  for (unsigned word : words) {
    if (word != 1) die("sync-errors: the good launch did not write its value");
  }
  return 0;
}

// Waits on work that takes far longer than the test: the daemon is killed meanwhile, and the
// wait must end with an error instead of hanging.
int waitOnDeadDaemon() {
  Setup setup = setUp();
  CUfunction spin = function(setup, "spin");
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  unsigned long long ns = 600ull * 1000 * 1000 * 1000;
  void* params[] = {&ns};
  CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr));
  std::printf("waiting\n");
  std::fflush(stdout);
  report("cuStreamSynchronize", cuStreamSynchronize(stream));
  report("cuLaunchKernel(after)",
         cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr));
  return 0;
}

// Holds memory and launches as fast as it can until killed.
int launchForever(std::size_t bytes) {
  Setup setup = setUp();
  CUfunction fillU32 = function(setup, "fill_u32");
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, bytes));
  CUstream streams[2];
  CHECK(cuStreamCreate(&streams[0], CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&streams[1], CU_STREAM_NON_BLOCKING));
  const unsigned long long words = std::min<std::size_t>(bytes / sizeof(unsigned), 1024);
  for (std::uint64_t i = 0;; ++i) {
    CHECK(fill(fillU32, buffer, static_cast<unsigned>(i), words, streams[i % 2]));
    if (i == 1000) {
      std::printf("launching\n");
      std::fflush(stdout);
    }
    if (i % 4096 == 4095) CHECK(cuStreamSynchronize(streams[i % 2]));
  }
}

}  // namespace

// cuMemsetD2D8/16/32(Async) on a pitched buffer: every row set, the bytes between rows and
// around the region untouched; the driver's argument rules answered at the call.
int memset2D() {
  setUp();
  constexpr std::size_t kPitch = 256;
  constexpr std::size_t kRows = 8;
  constexpr std::size_t kBytes = kPitch * kRows;
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, kBytes));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemsetD8(buffer, 0x11, kBytes));
  // Rows 1..6: bytes 8..40 as 0x22, then 16-bit elements over bytes 64..96 of rows 2..5, then
  // 32-bit ones over 128..160 of rows 3..4 on another stream, ordered by a synchronisation.
  CHECK(cuMemsetD2D8(buffer + kPitch + 8, kPitch, 0x22, 32, 6));
  CHECK(cuMemsetD2D16(buffer + 2 * kPitch + 64, kPitch, 0xBEEF, 16, 4));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemsetD2D32Async(buffer + 3 * kPitch + 128, kPitch, 0x01020304, 8, 2, stream));
  CHECK(cuStreamSynchronize(stream));
  std::vector<unsigned char> got(kBytes);
  CHECK(cuMemcpyDtoH(got.data(), buffer, kBytes));
  std::vector<unsigned char> want(kBytes, 0x11);
  for (std::size_t row = 1; row <= 6; ++row) {
    for (std::size_t i = 8; i < 40; ++i) want[row * kPitch + i] = 0x22;
  }
  for (std::size_t row = 2; row <= 5; ++row) {
    for (std::size_t i = 64; i < 96; i += 2) {
      want[row * kPitch + i] = 0xEF;
      want[row * kPitch + i + 1] = 0xBE;
    }
  }
  for (std::size_t row = 3; row <= 4; ++row) {
    for (std::size_t i = 128; i < 160; i += 4) {
      want[row * kPitch + i] = 0x04;
      want[row * kPitch + i + 1] = 0x03;
      want[row * kPitch + i + 2] = 0x02;
      want[row * kPitch + i + 3] = 0x01;
    }
  }
  expectEqual(got, want, "2D memsets");
  report("misaligned-pitch", cuMemsetD2D32(buffer, kPitch + 2, 0, 4, 2));
  report("pitch-below-row", cuMemsetD2D8(buffer, 16, 0, 32, 2));
  report("past-the-allocation", cuMemsetD2D8(buffer, kPitch, 0, 32, kRows + 1));
  report("empty", cuMemsetD2D16Async(buffer, kPitch, 0, 0, kRows, stream));
  report("synchronize", cuCtxSynchronize());
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ring_probe SCENARIO [ARGS]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  auto number = [&](int index, long long fallback) {
    return argc > index ? std::strtoll(argv[index], nullptr, 0) : fallback;
  };
  if (scenario == "cross-thread") return crossThread(static_cast<int>(number(2, 200)));
  if (scenario == "many-launchers") {
    return manyLaunchers(static_cast<int>(number(2, 8)), static_cast<int>(number(3, 500)));
  }
  if (scenario == "big-args") return bigArgs();
  if (scenario == "staging") return staging(static_cast<std::size_t>(number(2, 48 << 20)));
  if (scenario == "staging-threads") {
    return stagingThreads(static_cast<int>(number(2, 4)),
                          static_cast<std::size_t>(number(3, 10 << 20)));
  }
  if (scenario == "trap-async" && argc > 2) return trapAsync(argv[2]);
  if (scenario == "sync-errors") return syncErrors();
  if (scenario == "memset-2d") return memset2D();
  if (scenario == "fault-poisons-context") return faultPoisonsContext();
  if (scenario == "fault-then-launch") return faultThenLaunch();
  if (scenario == "wait-on-dead-daemon") return waitOnDeadDaemon();
  if (scenario == "launch-forever") {
    return launchForever(static_cast<std::size_t>(number(2, 1 << 20)));
  }
  std::fprintf(stderr, "ring_probe: unknown scenario %s\n", scenario.c_str());
  return 2;
}
