// A tenant that tries to hurt the others: each scenario is one way a buggy or malicious
// application can misuse the driver API, or the memory gpuproxy shares with it, and reports what
// it got. Tests run it beside well-behaved clients and check that those are unaffected and that
// nothing it held outlives it. Lines "<check> <CUresult name>" and "<counter> <number>" report
// what happened.
//
//   hostile_client corrupt-ring
//   hostile_client tiny-allocs COUNT          COUNT one-byte cuMemAlloc calls, then holds them
//   hostile_client queue-flood memset|event SECONDS
//                                             queues asynchronous work behind a kernel that
//                                             outlasts it, as fast as the calls return
//   hostile_client create-flood stream|event|module|context COUNT
//   hostile_client big-module MIB             cuModuleLoadData of a valid PTX image of MIB MiB
//
// Every scenario but corrupt-ring ends with "holding": it then keeps what it made until killed.
#include <cuda.h>

#include "protocol/ring_format.hpp"
#include "test_kernels_ptx.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
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
  std::fprintf(stderr, "hostile_client: %s\n", message.c_str());
  std::exit(1);
}

#define CHECK(call)                                                                \
  do {                                                                             \
    CUresult result_ = (call);                                                     \
    if (result_ != CUDA_SUCCESS) die(std::string(#call) + ": " + nameOf(result_)); \
  } while (0)

void setUp() {
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
}

// The start of this process's data-plane segment, found as a hostile application would find it:
// the mapping of the memfd the daemon named "gpuproxy-client-PID". Null when there is none.
std::byte* dataPlaneSegment() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:gpuproxy-client-") == std::string::npos) continue;
    return reinterpret_cast<std::byte*>(std::strtoull(line.c_str(), nullptr, 16));
  }
  return nullptr;
}

// Scribbles over the producer index of its own command ring while it keeps synchronising, then
// synchronises once more. A corrupt ring cannot be read any further: the daemon must cut the
// client off, and its calls must fail instead of hanging.
int corruptRing() {
  setUp();
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, 1 << 20));
  CHECK(cuCtxSynchronize());
  std::byte* segment = dataPlaneSegment();
  if (segment == nullptr) die("no data-plane segment is mapped");
  gpuproxy::protocol::ring::wire::SegmentHeader header;
  std::memcpy(&header, segment, sizeof header);
  // ipc::RingHeader keeps the producer index at byte 128 of the ring's header.
  std::byte* producerIndex = segment + header.commandRings.offset + 128;
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    const std::uint64_t garbage = 0xdeadbeef12345678ull;
    while (!stop.load()) {
      std::memcpy(producerIndex, &garbage, sizeof garbage);
      std::this_thread::yield();
    }
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until && cuCtxSynchronize() == CUDA_SUCCESS) {
  }
  stop = true;
  scribbler.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  report("cuCtxSynchronize", cuCtxSynchronize());
  report("cuMemAlloc", cuMemAlloc(&buffer, 4096));
  return 0;
}

void count(const char* counter, unsigned long long value) {
  std::printf("%s %llu\n", counter, value);
  std::fflush(stdout);
}

[[noreturn]] void holdForever() {
  std::printf("holding\n");
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Many allocations far smaller than the device's allocation granularity: what they occupy, not
// what they asked for, is what the tenant's limit must count.
int tinyAllocs(unsigned long long howMany) {
  setUp();
  unsigned long long made = 0;
  CUresult result = CUDA_SUCCESS;
  for (; made < howMany; ++made) {
    CUdeviceptr pointer;
    if ((result = cuMemAlloc(&pointer, 1)) != CUDA_SUCCESS) break;
  }
  count("allocations", made);
  report("last", result);
  std::size_t free = 0;
  std::size_t total = 0;
  CHECK(cuMemGetInfo(&free, &total));
  count("free", free);
  holdForever();
}

CUfunction loadSpin() {
  CUmodule module;
  CHECK(cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx));
  CUfunction spin;
  CHECK(cuModuleGetFunction(&spin, module, "spin"));
  return spin;
}

// Asynchronous work that cannot start (a kernel ahead of it on the stream runs far longer than
// the flood), queued as fast as the calls return: the daemon must bound what it keeps for the
// client, and the client waits in its own ring once it has queued that much.
int queueFlood(const std::string& kind, long long seconds) {
  setUp();
  CUfunction spin = loadSpin();
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  unsigned long long ns = static_cast<unsigned long long>(seconds + 600) * 1000000000ull;
  void* parameters[] = {&ns};
  CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, parameters, nullptr));
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, 4096));
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  std::printf("flooding\n");
  std::fflush(stdout);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  unsigned long long calls = 0;
  CUresult result = CUDA_SUCCESS;
  while (std::chrono::steady_clock::now() < until) {
    result = kind == "event"
                 ? cuEventRecord(event, stream)
                 : cuMemsetD8Async(buffer, static_cast<unsigned char>(calls), 4096, stream);
    if (result != CUDA_SUCCESS) break;
    ++calls;
  }
  count("calls", calls);
  report("last", result);
  holdForever();
}

// Creates objects that cost the daemon memory (and the sim work) until refused.
int createFlood(const std::string& kind, unsigned long long howMany) {
  setUp();
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  unsigned long long made = 0;
  CUresult result = CUDA_SUCCESS;
  for (; made < howMany; ++made) {
    if (kind == "stream") {
      CUstream stream;
      result = cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    } else if (kind == "event") {
      CUevent event;
      result = cuEventCreate(&event, CU_EVENT_DEFAULT);
    } else if (kind == "module") {
      CUmodule module;
      result = cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx);
    } else if (kind == "context") {
      CUcontext context;
      result = cuCtxCreate(&context, nullptr, 0, device);
    } else {
      die("unknown kind " + kind);
    }
    if (result != CUDA_SUCCESS) break;
  }
  count("created", made);
  report("last", result);
  holdForever();
}

// A module image of `mebibytes` MiB: the test kernels, padded with PTX comments.
int bigModule(unsigned long long mebibytes) {
  setUp();
  std::string image(gpuproxy::testing::kTestKernelsPtx);
  const std::string line = "// " + std::string(76, 'x') + "\n";
  while (image.size() + line.size() < mebibytes << 20) image += line;
  CUmodule module;
  const CUresult loaded = cuModuleLoadData(&module, image.c_str());
  report("cuModuleLoadData", loaded);
  if (loaded == CUDA_SUCCESS) {
    CUfunction spin;
    report("cuModuleGetFunction", cuModuleGetFunction(&spin, module, "spin"));
  }
  holdForever();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hostile_client SCENARIO [ARGS]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  auto number = [&](int index) {
    if (argc <= index) die("scenario " + scenario + " needs more arguments");
    return std::strtoull(argv[index], nullptr, 0);
  };
  auto word = [&](int index) -> std::string {
    if (argc <= index) die("scenario " + scenario + " needs more arguments");
    return argv[index];
  };
  if (scenario == "corrupt-ring") return corruptRing();
  if (scenario == "tiny-allocs") return tinyAllocs(number(2));
  if (scenario == "queue-flood") return queueFlood(word(2), static_cast<long long>(number(3)));
  if (scenario == "create-flood") return createFlood(word(2), number(3));
  if (scenario == "big-module") return bigModule(number(2));
  std::fprintf(stderr, "hostile_client: unknown scenario %s\n", scenario.c_str());
  return 2;
}
