// A tenant that tries to hurt the others: each scenario is one way a buggy or malicious
// application can misuse the driver API, or the memory gpuproxy shares with it, and reports what
// it got. Tests run it beside well-behaved clients and check that those are unaffected and that
// nothing it held outlives it. Lines "<check> <CUresult name>" and "<counter> <number>" report
// what happened.
//
//   hostile_client corrupt-ring
#include <cuda.h>

#include "protocol/ring_format.hpp"

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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hostile_client SCENARIO [ARGS]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  if (scenario == "corrupt-ring") return corruptRing();
  std::fprintf(stderr, "hostile_client: unknown scenario %s\n", scenario.c_str());
  return 2;
}
