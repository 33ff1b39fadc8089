// copy_throughput: synchronous host<->device copies through the gpuproxy stub, from pageable
// (malloc) and "pinned" (cuMemAllocHost) host memory, against plain memcpy of the same size in the
// same run.
//
//   copy_throughput [--min-size 4KiB] [--max-size 256MiB] [--factor 4] [--seconds 0.3]
//                   [--min-reps 3] [--smoke]
//
// Needs a daemon (GPUPROXY_SOCKET, LD_LIBRARY_PATH at the stub); benchmarks/run provides both.
// Each cell repeats its copy until --seconds have passed and at least --min-reps were made, and
// reports the median rate. Every buffer is touched before timing so page faults are not measured.
#include <cuda.h>

#include "benchmarks/bench_support.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace gpuproxy::bench;

constexpr const char* kProgram = "copy_throughput";

#define CHECK(call)                                                  \
  do {                                                               \
    CUresult result_ = (call);                                       \
    if (result_ != CUDA_SUCCESS) failCuda(kProgram, #call, result_); \
  } while (0)

struct Options {
  std::uint64_t minSize = 4ull << 10;
  std::uint64_t maxSize = 256ull << 20;
  long factor = 4;
  double seconds = 0.3;
  long minReps = 3;
};

void usage() {
  std::printf(
      "usage: copy_throughput [--min-size SIZE] [--max-size SIZE] [--factor N] [--seconds S]\n"
      "                       [--min-reps N] [--smoke]\n"
      "  --min-size, --max-size  transfer sizes, e.g. 4KiB .. 256MiB (the defaults)\n"
      "  --factor                each size is this many times the previous (default 4)\n"
      "  --seconds               time spent on each cell at least (default 0.3)\n"
      "  --min-reps              copies per cell at least (default 3)\n"
      "  --smoke                 4 KiB .. 1 MiB, one copy each, to check that it runs\n");
}

Options parse(int argc, char** argv) {
  Options options;
  Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--min-size")) {
      options.minSize = args.bytes();
    } else if (args.is("--max-size")) {
      options.maxSize = args.bytes();
    } else if (args.is("--factor")) {
      options.factor = args.integer(2);
    } else if (args.is("--seconds")) {
      options.seconds = args.number(0);
    } else if (args.is("--min-reps")) {
      options.minReps = args.integer(1);
    } else if (args.is("--smoke")) {
      options.maxSize = 1ull << 20;
      options.seconds = 0;
      options.minReps = 1;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  if (options.maxSize < options.minSize) failUsage(kProgram, "--max-size is below --min-size");
  return options;
}

// Median rate in GB/s (10^9 bytes per second, as copy bandwidths are usually quoted).
double measureGbps(std::uint64_t bytes, const Options& options, const std::function<void()>& copy) {
  std::vector<double> rates;
  const std::int64_t deadline = nowNs() + static_cast<std::int64_t>(options.seconds * 1e9);
  constexpr long kMaxReps = 100000;
  for (long rep = 0; rep < kMaxReps && (rep < options.minReps || nowNs() < deadline); ++rep) {
    std::int64_t start = nowNs();
    copy();
    std::int64_t end = nowNs();
    rates.push_back(static_cast<double>(bytes) /
                    static_cast<double>(std::max<std::int64_t>(end - start, 1)));
  }
  return median(std::move(rates));
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);

  const std::size_t capacity = options.maxSize;
  // Through the stub, pinned buffers come from a shared heap sized at start-up: make it hold the
  // largest buffer (and the allocator's bookkeeping), unless the caller chose a size.
  if (std::getenv("GPUPROXY_PINNED_HEAP") == nullptr) {
    const std::string heap = std::to_string(capacity + (std::size_t{16} << 20));
    ::setenv("GPUPROXY_PINNED_HEAP", heap.c_str(), 0);
  }
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  const std::string name = deviceName(device);
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));

  auto* pageableSource = static_cast<unsigned char*>(std::malloc(capacity));
  auto* pageableTarget = static_cast<unsigned char*>(std::malloc(capacity));
  if (pageableSource == nullptr || pageableTarget == nullptr) {
    std::fprintf(stderr, "%s: cannot allocate 2 x %s of host memory\n", kProgram,
                 formatSize(capacity).c_str());
    return 1;
  }
  void* pinnedRaw = nullptr;
  CHECK(cuMemAllocHost(&pinnedRaw, capacity));
  auto* pinned = static_cast<unsigned char*>(pinnedRaw);
  // Pinned memory that is really pinned is mapped for the device (the stub's shared heap, or the
  // driver's own); the stub's local fallback is not, and would measure the pageable path again.
  CUdeviceptr pinnedOnDevice = 0;
  const char* pinnedKind = cuMemHostGetDevicePointer(&pinnedOnDevice, pinned, 0) == CUDA_SUCCESS
                               ? "device-mapped"
                               : "NOT device-mapped (local fallback: the pageable path)";
  std::memset(pageableSource, 0x5a, capacity);
  std::memset(pageableTarget, 0, capacity);
  std::memset(pinned, 0xa5, capacity);
  CUdeviceptr deviceBuffer;
  CHECK(cuMemAlloc(&deviceBuffer, capacity));
  // The daemon's side of the device buffer is reserved lazily: touch it once, untimed.
  CHECK(cuMemcpyHtoD(deviceBuffer, pageableSource, capacity));

  std::printf("## copy_throughput\n\n");
  std::printf(
      "Synchronous cuMemcpyHtoD/cuMemcpyDtoH on the legacy stream; median GB/s (10^9 B/s) "
      "of copies repeated for >= %.2f s and >= %ld times per cell; %% is of memcpy of the "
      "same size measured just before; stub device: %s; transport: %s; pinned memory: %s.\n\n",
      options.seconds, options.minReps, name.c_str(), stubTransport().c_str(), pinnedKind);
  Table table({"size", "memcpy GB/s", "H2D pageable", "D2H pageable", "H2D pinned", "D2H pinned"});
  auto cell = [](double rate, double baseline) {
    return format("%.2f", rate) + " (" + formatPercent(rate / baseline) + ")";
  };
  for (std::uint64_t size = options.minSize; size <= options.maxSize;
       size *= static_cast<std::uint64_t>(options.factor)) {
    double copyRate =
        measureGbps(size, options, [&] { std::memcpy(pageableTarget, pageableSource, size); });
    double h2dPageable = measureGbps(
        size, options, [&] { CHECK(cuMemcpyHtoD(deviceBuffer, pageableSource, size)); });
    double d2hPageable = measureGbps(
        size, options, [&] { CHECK(cuMemcpyDtoH(pageableTarget, deviceBuffer, size)); });
    double h2dPinned =
        measureGbps(size, options, [&] { CHECK(cuMemcpyHtoD(deviceBuffer, pinned, size)); });
    double d2hPinned =
        measureGbps(size, options, [&] { CHECK(cuMemcpyDtoH(pinned, deviceBuffer, size)); });
    table.add({formatSize(size), format("%.2f", copyRate), cell(h2dPageable, copyRate),
               cell(d2hPageable, copyRate), cell(h2dPinned, copyRate), cell(d2hPinned, copyRate)});
  }
  table.print();
  std::printf("\ntargets at 64 MiB: pageable >= 50%% of memcpy, pinned >= 90%%.\n");

  CHECK(cuMemFree(deviceBuffer));
  CHECK(cuMemFreeHost(pinned));
  std::free(pageableSource);
  std::free(pageableTarget);
  return 0;
}
