// fairness: how the daemon's dispatcher shares one GPU between tenants, `fair` against
// the `fifo` baseline (arrival order, as time-slicing or MPS would), in the same run.
//
//   fairness [--seconds N] [--smoke]
//
// Runs the dispatcher the daemon uses (server/dispatch: ScheduledDevice over the sim backend, in
// this process, no sockets) with the sim's `spin` kernel, which occupies the simulated GPU's one
// engine for exactly the time it is given:
//
//   1. shares: three best-effort tenants, weights 1:1:2, kernels of 0.1 ms, 1 ms and 5 ms, each
//      keeping at least 40 ms of work queued for N seconds. GPU time per tenant (measured by the
//      backend) after a warm-up of 10%, its share, Jain's index of share/weight, worst share error.
//   2. latency: the same three plus a latency-critical tenant that launches one 0.2 ms kernel every
//      5 ms; p50/p99 of its launch-to-completion latency, against the same tenant running alone.
//   3. copies: a tenant that copies 4 KiB from device to host every 5 ms, beside another tenant
//      that keeps kernels of 64 one-millisecond blocks queued, against the same copies on an idle
//      GPU: p50/p99 from submission to completion. On a GPU the copy engines copy while the SMs
//      compute; the sim runs other streams' copies between a kernel's blocks.
//
// Targets: Jain >= 0.99 and every share within 5% of its weight; latency-critical p99
// <= isolated p99 + the largest admitted best-effort item (5 ms here).
#include "bench_support.hpp"
#include "server/backend/sim/sim_backend.hpp"
#include "server/dispatch/scheduled_device.hpp"
#include "test_kernels_ptx.hpp"

#include <kj/async-io.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using namespace gpuproxy;
using bench::nowNs;

constexpr const char* kProgram = "fairness";

[[noreturn]] void fail(const char* call, CUresult result) {
  std::fprintf(stderr, "%s: %s failed: CUresult %d\n", kProgram, call, static_cast<int>(result));
  std::exit(1);
}
constexpr std::int64_t kMs = 1'000'000;

struct Options {
  double seconds = 10;
};

struct BestEffortSpec {
  const char* name;
  std::uint32_t weight;
  std::int64_t kernelNs;
};

constexpr BestEffortSpec kBestEffort[] = {
    {"be-0.1ms", 1, kMs / 10},
    {"be-1ms", 1, kMs},
    {"be-5ms", 2, 5 * kMs},
};
constexpr std::int64_t kLcKernelNs = kMs / 5;
constexpr std::int64_t kLcPeriodNs = 5 * kMs;
constexpr std::int64_t kQueuedNs = 40 * kMs;  // work each best-effort tenant keeps queued
constexpr unsigned kWideBlocks = 64;          // blocks of the wide kernels of part 3
constexpr std::int64_t kWideBlockNs = kMs;    // each block's spin
constexpr std::int64_t kCopyPeriodNs = 5 * kMs;
constexpr std::size_t kCopyBytes = 4096;

// Counters the backend's completion callbacks update from its own thread.
struct Counters {
  std::atomic<std::int64_t> outstanding{0};
  std::atomic<std::uint64_t> gpuNs{0};
};

struct Workload {
  std::shared_ptr<server::Tenant> tenant;
  std::unique_ptr<server::backend::Stream> stream;
  std::int64_t kernelNs = 0;
  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  std::uint64_t gpuNsAtWarmup = 0;
};

struct LatencyLog {
  std::mutex mutex;
  std::vector<double> latenciesNs;
  std::int64_t recordFrom = 0;  // launches before this (the warm-up) are not counted
};

struct PhaseResult {
  std::vector<double> gpuSeconds;  // per best-effort tenant, after the warm-up
  bench::LatencySummary latency;   // of the latency-critical tenant, when there was one
};

class Phase {
public:
  Phase(kj::AsyncIoContext& io, const std::string& scheduler) : io_(io) {
    backend_ = server::sim::newSimBackend(server::sim::SimOptions{1, 1ull << 30});
    server::dispatch::DispatchOptions options;
    options.name = scheduler;
    device_ = std::make_unique<server::dispatch::ScheduledDevice>(
        std::move(backend_->openDevice(0)).value(), server::dispatch::newScheduler(options),
        io.provider->getTimer());
    auto module = device_->loadModule({reinterpret_cast<const std::byte*>(testing::kTestKernelsPtx),
                                       sizeof(testing::kTestKernelsPtx)});
    if (!module.ok()) fail("loadModule", module.code());
    module_ = std::move(module).value();
    spin_ = module_->function("spin").value();
  }

  ~Phase() {
    // Streams first, then the device: work still held is dropped, the running kernel interrupted.
    for (Workload& workload : bestEffort_) workload.stream.reset();
    for (Workload* workload : {lc_.get(), wide_.get(), copier_.get()}) {
      if (workload != nullptr) workload->stream.reset();
    }
    if (copySource_ != 0) device_->free(copySource_);
    module_.reset();
    device_.reset();
  }

  void addBestEffort(const BestEffortSpec& spec) {
    Workload& workload = bestEffort_.emplace_back();
    workload.tenant = tenant(spec.name, spec.weight, server::TenantClass::kBestEffort);
    workload.stream = stream(workload.tenant);
    workload.kernelNs = spec.kernelNs;
  }

  void addLatencyCritical() {
    lc_ = std::make_unique<Workload>();
    lc_->tenant = tenant("lc", 1, server::TenantClass::kLatencyCritical);
    lc_->stream = stream(lc_->tenant);
    lc_->kernelNs = kLcKernelNs;
  }

  // Part 3: a tenant keeping two kernels of kWideBlocks blocks queued.
  void addWideKernels() {
    wide_ = std::make_unique<Workload>();
    wide_->tenant = tenant("wide", 1, server::TenantClass::kBestEffort);
    wide_->stream = stream(wide_->tenant);
    wide_->kernelNs = kWideBlockNs;
  }

  // Part 3: a tenant copying kCopyBytes from device to host every kCopyPeriodNs.
  void addCopier() {
    copier_ = std::make_unique<Workload>();
    copier_->tenant = tenant("copier", 1, server::TenantClass::kBestEffort);
    copier_->stream = stream(copier_->tenant);
    auto allocated = device_->allocate(kCopyBytes);
    if (!allocated.ok()) fail("allocate", allocated.code());
    copySource_ = allocated.value();
  }

  PhaseResult run(double seconds) {
    const std::int64_t start = nowNs();
    const std::int64_t warmupEnd = start + static_cast<std::int64_t>(seconds * 0.1e9);
    const std::int64_t end = start + static_cast<std::int64_t>(seconds * 1e9);
    log_->recordFrom = warmupEnd;
    bool warm = false;
    std::int64_t nextLc = start;
    std::int64_t nextCopy = start;
    for (std::int64_t now = start; now < end; now = nowNs()) {
      if (!warm && now >= warmupEnd) {
        warm = true;
        for (Workload& workload : bestEffort_) {
          workload.gpuNsAtWarmup = workload.counters->gpuNs.load();
        }
      }
      for (Workload& workload : bestEffort_) topUp(workload);
      if (lc_ && now >= nextLc) {
        launchLatencyCritical();
        nextLc += kLcPeriodNs;
      }
      if (wide_) topUp(*wide_, wideConfig(), 2);
      if (copier_ && now >= nextCopy) {
        // One copy at a time: a copy still waiting is not joined by more behind it.
        if (copier_->counters->outstanding.load() == 0) copy();
        nextCopy += kCopyPeriodNs;
      }
      // Turns the event loop: completions reach the dispatcher, which submits what is next.
      const std::int64_t next = lc_ ? nextLc : copier_ ? nextCopy : nowNs() + kMs;
      const std::int64_t sleep = std::clamp<std::int64_t>(next - nowNs(), 0, kMs);
      io_.provider->getTimer().afterDelay(sleep * kj::NANOSECONDS).wait(io_.waitScope);
    }
    PhaseResult result;
    for (Workload& workload : bestEffort_) {
      result.gpuSeconds.push_back(
          static_cast<double>(workload.counters->gpuNs.load() - workload.gpuNsAtWarmup) / 1e9);
    }
    if (lc_ || copier_) {
      std::lock_guard lock(log_->mutex);
      result.latency = bench::summarize(log_->latenciesNs);
    }
    return result;
  }

private:
  std::shared_ptr<server::Tenant> tenant(const char* name, std::uint32_t weight,
                                         server::TenantClass tenantClass) {
    server::TenantLimits limits;
    limits.weight = weight;
    limits.tenantClass = tenantClass;
    return std::make_shared<server::Tenant>(nextTenantId_++,
                                            server::TenantDefinition{name, "", limits});
  }

  server::TenantId nextTenantId_ = 1;

  std::unique_ptr<server::backend::Stream> stream(const std::shared_ptr<server::Tenant>& tenant) {
    auto created = device_->createStream({tenant, device_->newClientId()}, 0, 0);
    if (!created.ok()) fail("createStream", created.code());
    return std::move(created).value();
  }

  std::vector<std::byte> spinParameters(std::int64_t ns) {
    std::vector<std::byte> parameters(spin_->info().parameterBytes);
    const auto value = static_cast<unsigned long long>(ns);
    std::memcpy(parameters.data() + spin_->info().parameters.at(0).offset, &value, sizeof(value));
    return parameters;
  }

  // Keeps `depth` launches of `spin` with `launch`'s shape queued (by default one block, and as
  // many as hold kQueuedNs of work).
  void topUp(Workload& workload, const server::backend::LaunchConfig& launch = config(),
             std::int64_t depth = 0) {
    if (depth == 0) depth = std::max<std::int64_t>(4, kQueuedNs / workload.kernelNs);
    const auto parameters = spinParameters(workload.kernelNs);
    while (workload.counters->outstanding.load() < depth) {
      ++workload.counters->outstanding;
      std::shared_ptr<Counters> counters = workload.counters;
      CUresult launched = workload.stream->launch(*spin_, launch, parameters,
                                                  [counters](CUresult, std::uint64_t gpuNs) {
                                                    counters->gpuNs += gpuNs;
                                                    --counters->outstanding;
                                                  });
      if (launched != CUDA_SUCCESS) fail("launch", launched);
    }
  }

  void launchLatencyCritical() {
    const std::int64_t launchedAt = nowNs();
    std::shared_ptr<LatencyLog> log = log_;
    CUresult launched = lc_->stream->launch(
        *spin_, config(), spinParameters(kLcKernelNs), [log, launchedAt](CUresult, std::uint64_t) {
          const std::int64_t done = nowNs();
          std::lock_guard lock(log->mutex);
          if (launchedAt >= log->recordFrom) {
            log->latenciesNs.push_back(static_cast<double>(done - launchedAt));
          }
        });
    if (launched != CUDA_SUCCESS) fail("launch", launched);
  }

  void copy() {
    const std::int64_t submittedAt = nowNs();
    ++copier_->counters->outstanding;
    CUresult copied = copier_->stream->copyDeviceToHost(copyDestination_.data(), copySource_,
                                                        copyDestination_.size());
    if (copied != CUDA_SUCCESS) fail("copyDeviceToHost", copied);
    std::shared_ptr<LatencyLog> log = log_;
    std::shared_ptr<Counters> counters = copier_->counters;
    copied = copier_->stream->addCallback([log, counters, submittedAt](CUresult) {
      const std::int64_t done = nowNs();
      --counters->outstanding;
      std::lock_guard lock(log->mutex);
      if (submittedAt >= log->recordFrom) {
        log->latenciesNs.push_back(static_cast<double>(done - submittedAt));
      }
    });
    if (copied != CUDA_SUCCESS) fail("addCallback", copied);
  }

  static server::backend::LaunchConfig config() { return {}; }
  static server::backend::LaunchConfig wideConfig() {
    server::backend::LaunchConfig wide;
    wide.grid.x = kWideBlocks;
    return wide;
  }

  kj::AsyncIoContext& io_;
  std::unique_ptr<server::backend::Backend> backend_;
  std::unique_ptr<server::dispatch::ScheduledDevice> device_;
  std::unique_ptr<server::backend::Module> module_;
  server::backend::Function* spin_ = nullptr;
  std::vector<Workload> bestEffort_;
  std::unique_ptr<Workload> lc_;
  std::unique_ptr<Workload> wide_;
  std::unique_ptr<Workload> copier_;
  CUdeviceptr copySource_ = 0;
  std::vector<std::byte> copyDestination_ = std::vector<std::byte>(kCopyBytes);
  std::shared_ptr<LatencyLog> log_ = std::make_shared<LatencyLog>();
};

struct ShareStats {
  std::vector<double> shares;
  double jain = 0;
  double worstError = 0;  // largest |share - fair share| / fair share
};

ShareStats shareStats(const std::vector<double>& gpuSeconds) {
  ShareStats stats;
  double total = 0;
  double weights = 0;
  for (double seconds : gpuSeconds) total += seconds;
  for (const BestEffortSpec& spec : kBestEffort) weights += spec.weight;
  double sum = 0;
  double squares = 0;
  for (std::size_t i = 0; i < gpuSeconds.size(); ++i) {
    const double share = total > 0 ? gpuSeconds[i] / total : 0;
    const double fair = kBestEffort[i].weight / weights;
    stats.shares.push_back(share);
    const double normalised = share / fair;
    sum += normalised;
    squares += normalised * normalised;
    stats.worstError = std::max(stats.worstError, std::abs(share - fair) / fair);
  }
  const double n = static_cast<double>(gpuSeconds.size());
  stats.jain = squares > 0 ? sum * sum / (n * squares) : 0;
  return stats;
}

std::string ms(double ns) {
  return bench::format("%.2f", ns / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  bench::Args args(kProgram, argc, argv);
  while (args.next()) {
    if (args.is("--seconds")) {
      options.seconds = args.number(0.1);
    } else if (args.is("--smoke")) {
      options.seconds = 0.3;
    } else if (args.is("--help") || args.is("-h")) {
      std::printf(
          "usage: fairness [--seconds N] [--smoke]\n"
          "  --seconds N   length of each phase (default 10); seven phases run\n"
          "  --smoke       0.3 s phases, to check that it runs\n");
      return 0;
    } else {
      args.unknown();
    }
  }

  auto io = kj::setupAsyncIo();
  std::printf("## fairness\n\n");
  std::printf(
      "Dispatcher + scheduler in process over the sim backend (one engine, kernels run to\n"
      "completion in submission order, other streams' copies between their blocks). %.1f s per\n"
      "phase, first 10%% not counted.\n\n",
      options.seconds);

  // 1. Shares.
  bench::Table shares(
      {"scheduler", "tenant", "weight", "kernel", "fair share", "GPU s", "share", "error"});
  bench::Table summary({"scheduler", "Jain (share/weight)", "worst share error", "targets met"});
  for (const char* scheduler : {"fifo", "fair"}) {
    PhaseResult result;
    {
      Phase phase(io, scheduler);
      for (const BestEffortSpec& spec : kBestEffort) phase.addBestEffort(spec);
      result = phase.run(options.seconds);
    }
    ShareStats stats = shareStats(result.gpuSeconds);
    for (std::size_t i = 0; i < stats.shares.size(); ++i) {
      const BestEffortSpec& spec = kBestEffort[i];
      shares.add(
          {scheduler, spec.name, std::to_string(spec.weight),
           ms(static_cast<double>(spec.kernelNs)) + " ms", bench::format("%.3f", spec.weight / 4.0),
           bench::format("%.2f", result.gpuSeconds[i]), bench::format("%.3f", stats.shares[i]),
           bench::format("%+.1f%%", (stats.shares[i] / (spec.weight / 4.0) - 1) * 100)});
    }
    const bool met = stats.jain >= 0.99 && stats.worstError <= 0.05;
    summary.add({scheduler, bench::format("%.4f", stats.jain),
                 bench::format("%.1f%%", stats.worstError * 100), met ? "yes" : "no"});
  }
  std::printf("### 1. GPU-time shares, three best-effort tenants saturating\n\n");
  shares.print();
  std::printf("\n");
  summary.print();
  std::printf("\n");

  // 2. Latency-critical tenant alongside them, and alone.
  bench::Table latency(
      {"run", "LC kernels", "p50 ms", "p99 ms", "p99 - isolated p99 ms", "target (<= 5 ms) met"});
  bench::LatencySummary isolated;
  {
    Phase phase(io, "fair");
    phase.addLatencyCritical();
    isolated = phase.run(options.seconds).latency;
  }
  latency.add({"LC alone (isolated)", std::to_string(isolated.samples), ms(isolated.median),
               ms(isolated.p99), "-", "-"});
  for (const char* scheduler : {"fifo", "fair"}) {
    bench::LatencySummary shared;
    {
      Phase phase(io, scheduler);
      for (const BestEffortSpec& spec : kBestEffort) phase.addBestEffort(spec);
      phase.addLatencyCritical();
      shared = phase.run(options.seconds).latency;
    }
    const double excess = shared.p99 - isolated.p99;
    latency.add({std::string("LC + 3 BE, ") + scheduler, std::to_string(shared.samples),
                 ms(shared.median), ms(shared.p99), ms(excess),
                 excess <= 5.0 * kMs ? "yes" : "no"});
  }
  std::printf("### 2. Latency-critical tenant: 0.2 ms kernel every 5 ms\n\n");
  latency.print();
  std::printf("\n");

  // 3. Copies beside another tenant's kernels, and on an idle GPU.
  bench::Table copies({"run", "copies", "p50 ms", "p99 ms", "p50 / idle p50"});
  bench::LatencySummary idle;
  {
    Phase phase(io, "fair");
    phase.addCopier();
    idle = phase.run(options.seconds).latency;
  }
  bench::LatencySummary beside;
  {
    Phase phase(io, "fair");
    phase.addWideKernels();
    phase.addCopier();
    beside = phase.run(options.seconds).latency;
  }
  copies.add(
      {"copies, idle GPU", std::to_string(idle.samples), ms(idle.median), ms(idle.p99), "-"});
  copies.add({"copies beside 64-block kernels", std::to_string(beside.samples), ms(beside.median),
              ms(beside.p99),
              bench::format("%.1f", idle.median > 0 ? beside.median / idle.median : 0.0)});
  std::printf(
      "### 3. A tenant's 4 KiB device-to-host copy every 5 ms, beside another's kernels\n\n");
  copies.print();
  std::printf("\n");
  return 0;
}
