// A well-behaved interactive tenant for load benchmarks: it holds some device memory and, every
// --interval-us, launches a small kernel on its stream and synchronises it, timing that round
// trip, as a service answering requests would. It knows nothing of gpuproxy.
//
//   steady_client [--interval-us U] [--hold-bytes B] [--seconds S] [--device D]
//
// It runs until SIGTERM (or for S seconds), then frees everything and prints what it saw:
//   round_trips N          launch + synchronise round trips completed
//   errors N               calls that failed (it keeps going after one, and says which on stderr)
//   seconds X              how long it ran
//   latency_us UPPER COUNT one line per non-empty bucket of the round-trip histogram: COUNT round
//                          trips took at most UPPER microseconds (and more than the previous
//                          line's)
// The buckets are fixed (eight per power of two), so histograms of many clients can be summed.
#include <cuda.h>
#include <signal.h>

#include "test_kernels_ptx.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> gStop{false};

void onTerm(int) {
  gStop.store(true);
}

// Eight buckets per power of two of microseconds: bucket b holds values up to 2^((b + 1) / 8).
constexpr int kBucketsPerOctave = 8;
constexpr int kBuckets = 40 * kBucketsPerOctave;

int bucketOf(double microseconds) {
  if (microseconds <= 1) return 0;
  const int bucket = static_cast<int>(std::ceil(std::log2(microseconds) * kBucketsPerOctave)) - 1;
  return std::clamp(bucket, 0, kBuckets - 1);
}

double upperBoundOf(int bucket) {
  return std::exp2(static_cast<double>(bucket + 1) / kBucketsPerOctave);
}

unsigned long long gErrors = 0;

bool ok(const char* call, CUresult result) {
  if (result == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  std::fprintf(stderr, "steady_client: %s failed: %s\n", call, name);
  ++gErrors;
  return false;
}

[[noreturn]] void usage(const char* message) {
  std::fprintf(stderr,
               "steady_client: %s\nusage: steady_client [--interval-us U] [--hold-bytes B] "
               "[--seconds S] [--device D]\n",
               message);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  long long intervalUs = 10000;
  unsigned long long holdBytes = 8ull << 20;
  double seconds = 0;
  int deviceIndex = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage("every option takes a value");
    const char* value = argv[++i];
    if (arg == "--interval-us") {
      intervalUs = std::strtoll(value, nullptr, 10);
    } else if (arg == "--hold-bytes") {
      holdBytes = std::strtoull(value, nullptr, 10);
    } else if (arg == "--seconds") {
      seconds = std::strtod(value, nullptr);
    } else if (arg == "--device") {
      deviceIndex = std::atoi(value);
    } else {
      usage("unknown option");
    }
  }
  struct sigaction action {};
  action.sa_handler = onTerm;
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);

  // Set-up failures end the program: there is nothing to measure without a context and a kernel.
  CUdevice device;
  CUcontext context;
  CUmodule module;
  CUfunction fill;
  CUstream stream;
  CUdeviceptr buffer = 0;
  if (!ok("cuInit", cuInit(0)) || !ok("cuDeviceGet", cuDeviceGet(&device, deviceIndex)) ||
      !ok("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&context, device)) ||
      !ok("cuCtxSetCurrent", cuCtxSetCurrent(context)) ||
      !ok("cuModuleLoadData", cuModuleLoadData(&module, gpuproxy::testing::kTestKernelsPtx)) ||
      !ok("cuModuleGetFunction", cuModuleGetFunction(&fill, module, "fill_u32")) ||
      !ok("cuStreamCreate", cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) ||
      !ok("cuMemAlloc", cuMemAlloc(&buffer, std::max<unsigned long long>(holdBytes, 4096))) ||
      !ok("cuMemsetD8", cuMemsetD8(buffer, 0, std::max<unsigned long long>(holdBytes, 4096)))) {
    return 1;
  }

  std::vector<unsigned long long> histogram(kBuckets, 0);
  unsigned long long roundTrips = 0;
  const auto started = std::chrono::steady_clock::now();
  auto next = started;
  while (!gStop.load()) {
    if (seconds > 0 &&
        std::chrono::steady_clock::now() - started > std::chrono::duration<double>(seconds)) {
      break;
    }
    next += std::chrono::microseconds(intervalUs);
    std::this_thread::sleep_until(next);
    unsigned value = static_cast<unsigned>(roundTrips);
    unsigned long long count = 1024;
    void* parameters[] = {&buffer, &value, &count};
    const auto begin = std::chrono::steady_clock::now();
    if (!ok("cuLaunchKernel",
            cuLaunchKernel(fill, 4, 1, 1, 256, 1, 1, 0, stream, parameters, nullptr)) ||
        !ok("cuStreamSynchronize", cuStreamSynchronize(stream))) {
      continue;
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin).count();
    ++histogram[static_cast<std::size_t>(bucketOf(us))];
    ++roundTrips;
    // A client that fell behind (the daemon or the device stalled) does not try to catch up.
    next = std::max(next, std::chrono::steady_clock::now());
  }
  const double ran =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ok("cuMemFree", cuMemFree(buffer));
  ok("cuStreamDestroy", cuStreamDestroy(stream));
  ok("cuModuleUnload", cuModuleUnload(module));
  std::printf("round_trips %llu\nerrors %llu\nseconds %.3f\n", roundTrips, gErrors, ran);
  for (int b = 0; b < kBuckets; ++b) {
    if (histogram[static_cast<std::size_t>(b)] != 0) {
      std::printf("latency_us %.3f %llu\n", upperBoundOf(b),
                  histogram[static_cast<std::size_t>(b)]);
    }
  }
  std::fflush(stdout);
  return 0;
}
