// runtime_launch: host time the application thread spends in one asynchronous `kernel<<<1, 1>>>()`
// of an empty kernel through the CUDA runtime (nvcc's static cudart, unmodified), against
// cuLaunchKernel of the same kernel's CUfunction in the same process, alternating in rounds. Both
// go through whichever libcuda.so.1 the loader finds (the gpuproxy stub under benchmarks/run), so
// the difference is what cudart itself adds. benchmarks/run's launch_latency in the same run
// gives the in-process sim baseline.
//
//   runtime_launch [--iterations N] [--warmup N] [--batch N] [--rounds N] [--smoke]
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/bench_support.hpp"

namespace {

using namespace gpuproxy::bench;

constexpr const char* kProgram = "runtime_launch";

__global__ void emptyKernel() {}

void checkRuntime(const char* call, cudaError_t status) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s failed: %s\n", kProgram, call, cudaGetErrorName(status));
    std::exit(1);
  }
}

#define CHECK_RT(call) checkRuntime(#call, (call))

struct Options {
  long iterations = 50000;
  long warmup = 2000;
  long batch = 1000;
  long rounds = 5;
};

Options parse(int argc, char** argv) {
  Options options;
  Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--iterations")) {
      options.iterations = args.integer(1);
    } else if (args.is("--warmup")) {
      options.warmup = args.integer(0);
    } else if (args.is("--batch")) {
      options.batch = args.integer(1);
    } else if (args.is("--rounds")) {
      options.rounds = args.integer(1);
    } else if (args.is("--smoke")) {
      options = Options{300, 20, 100, 2};
    } else if (args.is("--help")) {
      std::printf(
          "usage: runtime_launch [--iterations N] [--warmup N] [--batch N] [--rounds N] "
          "[--smoke]\n");
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void**, void**);

// Times `count` launches of one kind on `stream`, draining it every `batch` launches (untimed) so
// that each sample is the enqueue cost alone.
template <typename Launch>
void measure(long count, long batch, cudaStream_t stream, Launch launch,
             std::vector<double>* samples) {
  for (long done = 0; done < count;) {
    const long thisBatch = std::min(batch, count - done);
    for (long i = 0; i < thisBatch; ++i) {
      const std::int64_t start = nowNs();
      launch();
      const std::int64_t end = nowNs();
      if (samples != nullptr) samples->push_back(static_cast<double>(end - start));
    }
    CHECK_RT(cudaStreamSynchronize(stream));
    done += thisBatch;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  cudaStream_t stream;
  CHECK_RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The driver's entry point as cudart finds it, and the kernel's CUfunction in this context.
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CHECK_RT(
      cudaGetDriverEntryPointByVersion("cuLaunchKernel", &entry, 12000, cudaEnableDefault, &found));
  const auto driverLaunch = reinterpret_cast<LaunchKernel>(entry);
  cudaFunction_t function = nullptr;
  CHECK_RT(cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(&emptyKernel)));
  cudaDeviceProp properties;
  CHECK_RT(cudaGetDeviceProperties(&properties, 0));

  auto runtimePath = [&] { emptyKernel<<<1, 1, 0, stream>>>(); };
  auto driverPath = [&] {
    driverLaunch(reinterpret_cast<CUfunction>(function), 1, 1, 1, 1, 1, 1, 0,
                 reinterpret_cast<CUstream>(stream), nullptr, nullptr);
  };
  measure(options.warmup, options.batch, stream, runtimePath, nullptr);
  measure(options.warmup, options.batch, stream, driverPath, nullptr);
  CHECK_RT(cudaGetLastError());

  std::vector<double> runtimeSamples;
  std::vector<double> driverSamples;
  for (long round = 0; round < options.rounds; ++round) {
    const long count =
        options.iterations / options.rounds + (round < options.iterations % options.rounds ? 1 : 0);
    measure(count, options.batch, stream, driverPath, &driverSamples);
    measure(count, options.batch, stream, runtimePath, &runtimeSamples);
  }
  CHECK_RT(cudaGetLastError());

  std::printf("## runtime_launch\n\n");
  std::printf(
      "An empty kernel, grid 1x1x1, block 1x1x1, non-blocking stream, nvcc's static cudart; %ld "
      "timed launches per path in %ld alternating rounds, drained every %ld (untimed); device: "
      "%s.\n\n",
      options.iterations, options.rounds, options.batch, properties.name);
  const LatencySummary driver = summarize(driverSamples);
  const LatencySummary runtime = summarize(runtimeSamples);
  Table table(
      {"path", "launches", "median ns", "p90 ns", "p99 ns", "mean ns", "median vs cuLaunchKernel"});
  table.add({"cuLaunchKernel -> " + callPathLabel() + " (baseline)", std::to_string(driver.samples),
             formatNs(driver.median), formatNs(driver.p90), formatNs(driver.p99),
             formatNs(driver.mean), "1.00x"});
  table.add({"<<<>>> (cudaLaunchKernel) -> " + callPathLabel(), std::to_string(runtime.samples),
             formatNs(runtime.median), formatNs(runtime.p90), formatNs(runtime.p99),
             formatNs(runtime.mean), formatRatio(runtime.median / driver.median)});
  table.print();
  std::printf("\ntarget: <= 500 ns median for <<<>>> through the stub.\n\n");
  CHECK_RT(cudaStreamDestroy(stream));
  return 0;
}
