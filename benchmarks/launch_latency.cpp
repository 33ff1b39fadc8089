// launch_latency: host time the application thread spends in one asynchronous cuLaunchKernel of an
// empty kernel (`spin` with 0 ns), through the gpuproxy stub, against the same launch made straight
// into the sim backend in this process (no proxy at all) in the same run.
//
//   launch_latency [--iterations N] [--warmup N] [--batch N] [--rounds N]
//                  [--path both|stub|inproc] [--smoke]
//
// The stub path needs a daemon (GPUPROXY_SOCKET, LD_LIBRARY_PATH at the stub); benchmarks/run
// provides both. The two paths alternate in --rounds rounds so that a noisy machine weighs on both
// alike. Every --batch launches the stream is drained outside the timed region, so that the queue
// in front of the (simulated) engine stays short and each sample is the enqueue cost alone.
#include <cuda.h>

#include "benchmarks/bench_support.hpp"
#include "server/backend/backend.hpp"
#include "server/backend/sim/sim_backend.hpp"
#include "test_kernels_ptx.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpuproxy::bench;
namespace backend = gpuproxy::server::backend;

constexpr const char* kProgram = "launch_latency";

#define CHECK(call)                                                  \
  do {                                                               \
    CUresult result_ = (call);                                       \
    if (result_ != CUDA_SUCCESS) failCuda(kProgram, #call, result_); \
  } while (0)

struct Options {
  long iterations = 50000;  // per path, over all rounds
  long warmup = 2000;
  long batch = 1000;
  long rounds = 5;
  bool stub = true;
  bool inproc = true;
  std::vector<int> threads = {2, 4};  // concurrent launching threads, stub path only
};

void usage() {
  std::printf(
      "usage: launch_latency [--iterations N] [--warmup N] [--batch N] [--rounds N]\n"
      "                      [--path both|stub|inproc] [--threads N,...] [--smoke]\n"
      "  --iterations  timed launches per path (default 50000)\n"
      "  --warmup      untimed launches per path before the first round (default 2000)\n"
      "  --batch       launches between untimed drains of the stream (default 1000)\n"
      "  --rounds      the paths alternate this many times (default 5)\n"
      "  --path        which paths to measure (default both)\n"
      "  --threads     also time launches from this many threads at once, each on its own\n"
      "                stream (stub path; default 2,4; empty list: none)\n"
      "  --smoke       a few hundred launches, to check that it runs\n");
}

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
    } else if (args.is("--path")) {
      std::string_view path = args.value();
      options.stub = path == "both" || path == "stub";
      options.inproc = path == "both" || path == "inproc";
      if (!options.stub && !options.inproc) failUsage(kProgram, "--path is both, stub or inproc");
    } else if (args.is("--threads")) {
      const std::string_view list = args.value();
      if (list.empty()) {
        options.threads.clear();
      } else if (!parseIntList(list, options.threads)) {
        failUsage(kProgram, "--threads takes a list such as 2,4");
      }
    } else if (args.is("--smoke")) {
      options.iterations = 300;
      options.warmup = 20;
      options.batch = 100;
      options.rounds = 2;
    } else if (args.is("--help") || args.is("-h")) {
      usage();
      std::exit(0);
    } else {
      args.unknown();
    }
  }
  return options;
}

// One way of launching `spin(0)` on a stream, timed per call.
class LaunchPath {
public:
  virtual ~LaunchPath() = default;
  virtual void launch() = 0;
  virtual void drain() = 0;

  // Times `count` launches one by one, draining every `batch` launches outside the timed region.
  void measure(long count, long batch, std::vector<double>* samples) {
    for (long done = 0; done < count;) {
      long chunk = std::min(batch, count - done);
      for (long i = 0; i < chunk; ++i) {
        std::int64_t start = nowNs();
        launch();
        std::int64_t end = nowNs();
        if (samples != nullptr) samples->push_back(static_cast<double>(end - start));
      }
      drain();
      done += chunk;
    }
  }
};

// The application's view: the CUDA driver API, which LD_LIBRARY_PATH resolves to the stub.
class StubPath final : public LaunchPath {
public:
  StubPath() {
    CHECK(cuInit(0));
    CUdevice device;
    CHECK(cuDeviceGet(&device, 0));
    name_ = deviceName(device);
    CHECK(cuDevicePrimaryCtxRetain(&context_, device));
    CHECK(cuCtxSetCurrent(context_));
    CHECK(cuModuleLoadData(&module_, gpuproxy::testing::kTestKernelsPtx));
    CHECK(cuModuleGetFunction(&spin_, module_, "spin"));
    CHECK(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }

  void launch() override {
    void* params[] = {&nanoseconds_};
    CHECK(cuLaunchKernel(spin_, 1, 1, 1, 1, 1, 1, 0, stream_, params, nullptr));
  }
  void drain() override { CHECK(cuStreamSynchronize(stream_)); }
  const std::string& name() const { return name_; }

  // `threads` application threads launch at once, each on its own stream, each timing its own
  // launches (the stub's command ring is shared, written under a short lock).
  std::vector<double> measureConcurrent(int threads, long perThread, long batch) {
    std::vector<std::vector<double>> samples(static_cast<std::size_t>(threads));
    std::atomic<int> ready{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        CHECK(cuCtxSetCurrent(context_));
        CUstream stream;
        CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
        unsigned long long nanoseconds = 0;
        void* params[] = {&nanoseconds};
        auto& mine = samples[static_cast<std::size_t>(t)];
        mine.reserve(static_cast<std::size_t>(perThread));
        ready.fetch_add(1);
        while (ready.load() < threads) {
        }
        for (long done = 0; done < perThread;) {
          long chunk = std::min(batch, perThread - done);
          for (long i = 0; i < chunk; ++i) {
            std::int64_t start = nowNs();
            CHECK(cuLaunchKernel(spin_, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr));
            mine.push_back(static_cast<double>(nowNs() - start));
          }
          CHECK(cuStreamSynchronize(stream));
          done += chunk;
        }
        CHECK(cuStreamDestroy(stream));
      });
    }
    for (auto& worker : workers) worker.join();
    std::vector<double> all;
    for (auto& mine : samples) all.insert(all.end(), mine.begin(), mine.end());
    return all;
  }

private:
  std::string name_;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction spin_ = nullptr;
  CUstream stream_ = nullptr;
  unsigned long long nanoseconds_ = 0;
};

// The floor without any proxy: the sim backend's own Stream::launch, in this process.
class InProcessPath final : public LaunchPath {
public:
  InProcessPath() {
    backend_ = gpuproxy::server::sim::newSimBackend({});
    device_ = take(backend_->openDevice(0), "openDevice");
    const char* ptx = gpuproxy::testing::kTestKernelsPtx;
    module_ =
        take(device_->loadModule(std::as_bytes(std::span(ptx, std::strlen(ptx)))), "loadModule");
    backend::Result<backend::Function*> spin = module_->function("spin");
    if (!spin.ok()) failCuda(kProgram, "Module::function(spin)", spin.code());
    spin_ = spin.value();
    stream_ = take(device_->createStream(CU_STREAM_NON_BLOCKING, 0), "createStream");
    parameters_.resize(spin_->info().parameterBytes);
    const unsigned long long nanoseconds = 0;
    std::memcpy(parameters_.data() + spin_->info().parameters.at(0).offset, &nanoseconds,
                sizeof(nanoseconds));
  }

  void launch() override {
    CUresult result = stream_->launch(*spin_, config_, parameters_, {});
    if (result != CUDA_SUCCESS) failCuda(kProgram, "Stream::launch", result);
  }
  void drain() override {
    // Shared with the callback: it may still be inside set_value when get() returns here.
    auto done = std::make_shared<std::promise<CUresult>>();
    std::future<CUresult> finished = done->get_future();
    CUresult result = stream_->addCallback([done](CUresult status) { done->set_value(status); });
    if (result != CUDA_SUCCESS) failCuda(kProgram, "Stream::addCallback", result);
    result = finished.get();
    if (result != CUDA_SUCCESS) failCuda(kProgram, "in-process stream", result);
  }

private:
  template <typename T>
  static T take(backend::Result<T> result, const char* what) {
    if (!result.ok()) failCuda(kProgram, what, result.code());
    return std::move(result).value();
  }

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<backend::Device> device_;
  std::unique_ptr<backend::Module> module_;
  backend::Function* spin_ = nullptr;
  std::unique_ptr<backend::Stream> stream_;
  backend::LaunchConfig config_{};
  std::vector<std::byte> parameters_;
};

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);

  std::unique_ptr<InProcessPath> inproc;
  std::unique_ptr<StubPath> stub;
  if (options.inproc) inproc = std::make_unique<InProcessPath>();
  if (options.stub) stub = std::make_unique<StubPath>();

  std::printf("## launch_latency\n\n");
  std::printf(
      "cuLaunchKernel(spin, 0 ns), grid 1x1x1, block 1x1x1, non-blocking stream; %ld "
      "timed launches per path in %ld alternating rounds, drained every %ld (untimed)",
      options.iterations, options.rounds, options.batch);
  if (stub) std::printf("; stub device: %s", stub->name().c_str());
  std::printf(".\n\n");

  // Warm both paths up (first-touch of queues, caches, the daemon's session) before timing.
  if (inproc) inproc->measure(options.warmup, options.batch, nullptr);
  if (stub) stub->measure(options.warmup, options.batch, nullptr);

  std::vector<double> inprocSamples;
  std::vector<double> stubSamples;
  inprocSamples.reserve(static_cast<std::size_t>(options.iterations));
  stubSamples.reserve(static_cast<std::size_t>(options.iterations));
  for (long round = 0; round < options.rounds; ++round) {
    long count =
        options.iterations / options.rounds + (round < options.iterations % options.rounds ? 1 : 0);
    if (inproc) inproc->measure(count, options.batch, &inprocSamples);
    if (stub) stub->measure(count, options.batch, &stubSamples);
  }

  LatencySummary inprocSummary = summarize(inprocSamples);
  LatencySummary stubSummary = summarize(stubSamples);
  Table table(
      {"path", "launches", "median ns", "p90 ns", "p99 ns", "mean ns", "median vs in-process"});
  if (inproc) {
    table.add({"in-process sim backend (baseline)", std::to_string(inprocSummary.samples),
               formatNs(inprocSummary.median), formatNs(inprocSummary.p90),
               formatNs(inprocSummary.p99), formatNs(inprocSummary.mean), "1.00x"});
  }
  if (stub) {
    table.add({callPathLabel(), std::to_string(stubSummary.samples), formatNs(stubSummary.median),
               formatNs(stubSummary.p90), formatNs(stubSummary.p99), formatNs(stubSummary.mean),
               inproc ? formatRatio(stubSummary.median / inprocSummary.median) : "-"});
  }
  table.print();
  if (stub && !options.threads.empty()) {
    std::printf("\nConcurrent launches through the stub (%s), each thread on its own stream:\n\n",
                stubTransport().c_str());
    Table concurrent(
        {"threads", "launches", "median ns", "p90 ns", "p99 ns", "mean ns", "median vs 1 thread"});
    for (int threads : options.threads) {
      if (threads < 1) continue;
      LatencySummary summary = summarize(stub->measureConcurrent(
          threads, std::max(1L, options.iterations / threads), options.batch));
      concurrent.add({std::to_string(threads), std::to_string(summary.samples),
                      formatNs(summary.median), formatNs(summary.p90), formatNs(summary.p99),
                      formatNs(summary.mean), formatRatio(summary.median / stubSummary.median)});
    }
    concurrent.print();
  }
  std::printf(
      "\nclock overhead (two back-to-back steady_clock reads, median): %s ns; "
      "target: <= 300 ns median through the stub.\n",
      formatNs(clockOverheadNs()).c_str());
  return 0;
}
