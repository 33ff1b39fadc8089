// The per-GPU dispatcher on the sim backend: every operation keeps its order on its stream, waits
// on events recorded elsewhere hold until the record is on the GPU, queries and callbacks account
// for work still held, queued work of a destroyed stream completes, and the scheduler it obeys
// decides who goes first (latency-critical before best-effort under `fair`, arrival order under
// `fifo`; weights share the GPU).
#include "server/dispatch/scheduled_device.hpp"

#include "server/backend/sim/sim_backend.hpp"
#include "server/gpu/completion.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#if __has_include("test_kernels_ptx.hpp")
#include "test_kernels_ptx.hpp"
#define GPUPROXY_HAVE_TEST_KERNELS 1
#endif

namespace gpuproxy::server::dispatch {
namespace {

#ifdef GPUPROXY_HAVE_TEST_KERNELS

using backend::Function;
using backend::LaunchConfig;
using namespace std::chrono_literals;

constexpr std::uint64_t kMs = 1'000'000;

template <typename... Args>
std::vector<std::byte> pack(const Function& function, Args... args) {
  const backend::FunctionInfo& info = function.info();
  std::vector<std::byte> buffer(info.parameterBytes);
  std::size_t index = 0;
  auto put = [&](const auto& value) {
    std::memcpy(buffer.data() + info.parameters.at(index).offset, &value, sizeof(value));
    ++index;
  };
  (put(args), ...);
  return buffer;
}

LaunchConfig config(unsigned grid, unsigned block) {
  LaunchConfig launch;
  launch.grid.x = grid;
  launch.block.x = block;
  return launch;
}

std::shared_ptr<Tenant> makeTenant(const std::string& name, std::uint32_t weight,
                                   TenantClass tenantClass = TenantClass::kBestEffort) {
  TenantLimits limits;
  limits.weight = weight;
  limits.tenantClass = tenantClass;
  // Each a tenant of its own, as the daemon's registry would number them.
  static TenantId nextId = 1;
  return std::make_shared<Tenant>(nextId++, TenantDefinition{name, "/unused", limits});
}

class ScheduledDeviceTest : public ::testing::Test {
protected:
  void open(const std::string& scheduler) {
    DispatchOptions options;
    options.name = scheduler;
    device_ = std::make_unique<ScheduledDevice>(std::move(backend_->openDevice(0)).value(),
                                                newScheduler(options), io_->provider->getTimer());
    auto module =
        device_->loadModule({reinterpret_cast<const std::byte*>(gpuproxy::testing::kTestKernelsPtx),
                             sizeof(gpuproxy::testing::kTestKernelsPtx)});
    ASSERT_TRUE(module.ok());
    module_ = std::move(module).value();
    spin_ = module_->function("spin").value();
    fill_ = module_->function("fill_u32").value();
  }

  void TearDown() override {
    streams_.clear();
    events_.clear();
    module_.reset();
    device_.reset();
  }

  StreamOwner owner(const std::shared_ptr<Tenant>& tenant) {
    return StreamOwner{tenant, device_->newClientId()};
  }

  backend::Stream& stream(const StreamOwner& who) {
    auto created = device_->createStream(who, 0, 0);
    EXPECT_TRUE(created.ok());
    streams_.push_back(std::move(created).value());
    return *streams_.back();
  }

  backend::Event& event(unsigned flags = 0) {
    auto created = device_->createEvent(flags);
    EXPECT_TRUE(created.ok());
    events_.push_back(std::move(created).value());
    return *events_.back();
  }

  CUresult spin(backend::Stream& on, std::uint64_t ns, backend::KernelCallback done = {}) {
    return on.launch(*spin_, config(1, 1), pack(*spin_, static_cast<unsigned long long>(ns)),
                     std::move(done));
  }

  CUresult fill(backend::Stream& on, CUdeviceptr pointer, unsigned value, std::uint64_t count) {
    return on.launch(*fill_, config(static_cast<unsigned>((count + 255) / 256), 256),
                     pack(*fill_, pointer, value, static_cast<unsigned long long>(count)), {});
  }

  CUresult sync(backend::Stream& on) { return whenStreamDone(on).wait(io_->waitScope); }

  // Turns the event loop (completions arrive on it) until `condition` holds, for up to 10 s.
  template <typename Condition>
  bool soon(Condition&& condition) {
    for (int turn = 0; turn < 10000; ++turn) {
      if (condition()) return true;
      runFor(std::chrono::milliseconds(1));
    }
    return condition();
  }

  void runFor(std::chrono::milliseconds time) {
    io_->provider->getTimer().afterDelay(time.count() * kj::MILLISECONDS).wait(io_->waitScope);
  }

  // Held by pointer: kj's destructors may throw, which a gtest fixture's destructor may not.
  std::unique_ptr<kj::AsyncIoContext> io_ =
      std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo());
  std::unique_ptr<backend::Backend> backend_ = sim::newSimBackend(sim::SimOptions{1, 1ull << 30});
  std::unique_ptr<ScheduledDevice> device_;
  std::unique_ptr<backend::Module> module_;
  Function* spin_ = nullptr;
  Function* fill_ = nullptr;
  std::vector<std::unique_ptr<backend::Stream>> streams_;
  std::vector<std::unique_ptr<backend::Event>> events_;
};

TEST_F(ScheduledDeviceTest, KeepsStreamOrderWithKernelsAndCopiesInterleaved) {
  open("fair");
  auto busy = makeTenant("busy", 1);
  auto mine = makeTenant("mine", 1);
  // Another tenant keeps the GPU busy, so this stream's kernels wait in the dispatcher while the
  // copies behind them are issued.
  backend::Stream& other = stream(owner(busy));
  for (int i = 0; i < 4; ++i) ASSERT_EQ(spin(other, 2 * kMs), CUDA_SUCCESS);

  backend::Stream& s = stream(owner(mine));
  constexpr std::uint64_t kCount = 1024;
  auto buffer = device_->allocate(kCount * 4);
  ASSERT_TRUE(buffer.ok());
  std::vector<std::vector<std::uint32_t>> seen(4, std::vector<std::uint32_t>(kCount));
  std::vector<std::uint32_t> upload(kCount, 100);
  for (unsigned round = 0; round < 4; ++round) {
    ASSERT_EQ(fill(s, buffer.value(), round + 1, kCount), CUDA_SUCCESS);
    if (round == 0) {
      EXPECT_GT(device_->stats().heldOperations, 0u);
    }
    ASSERT_EQ(s.copyDeviceToHost(seen[round].data(), buffer.value(), kCount * 4), CUDA_SUCCESS);
    if (round == 2) {
      // A copy after a held kernel overwrites what the kernel wrote, not the other way round.
      ASSERT_EQ(s.copyHostToDevice(buffer.value(), upload.data(), kCount * 4), CUDA_SUCCESS);
      ASSERT_EQ(s.copyDeviceToHost(seen[round].data(), buffer.value(), kCount * 4), CUDA_SUCCESS);
    }
  }
  ASSERT_EQ(sync(s), CUDA_SUCCESS);
  EXPECT_EQ(seen[0], std::vector<std::uint32_t>(kCount, 1));
  EXPECT_EQ(seen[1], std::vector<std::uint32_t>(kCount, 2));
  EXPECT_EQ(seen[2], std::vector<std::uint32_t>(kCount, 100));
  EXPECT_EQ(seen[3], std::vector<std::uint32_t>(kCount, 4));
  EXPECT_EQ(sync(other), CUDA_SUCCESS);
  EXPECT_EQ(device_->stats().heldOperations, 0u);
}

TEST_F(ScheduledDeviceTest, AWaitIsHeldUntilTheRecordItWaitsForReachesTheGpu) {
  open("fair");
  auto tenant = makeTenant("t", 1);
  backend::Stream& producer = stream(owner(tenant));
  backend::Stream& consumer = stream(owner(tenant));
  auto buffer = device_->allocate(4096);
  ASSERT_TRUE(buffer.ok());
  ASSERT_EQ(consumer.memset(buffer.value(), 0, 4, 1024), CUDA_SUCCESS);
  ASSERT_EQ(sync(consumer), CUDA_SUCCESS);

  // The producer's fill is held behind a long kernel, so its record is held too.
  ASSERT_EQ(spin(producer, 20 * kMs), CUDA_SUCCESS);
  ASSERT_EQ(fill(producer, buffer.value(), 9, 1024), CUDA_SUCCESS);
  backend::Event& ready = event();
  ASSERT_EQ(producer.record(ready), CUDA_SUCCESS);
  EXPECT_EQ(ready.query(), CUDA_ERROR_NOT_READY);

  // Had the wait reached the real stream before the record, it would wait for nothing and the
  // copy would read zeros.
  std::vector<std::uint32_t> seen(1024, 0xdead);
  ASSERT_EQ(consumer.wait(ready), CUDA_SUCCESS);
  ASSERT_EQ(consumer.copyDeviceToHost(seen.data(), buffer.value(), 4096), CUDA_SUCCESS);
  EXPECT_EQ(consumer.query(), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(sync(consumer), CUDA_SUCCESS);
  EXPECT_EQ(seen, std::vector<std::uint32_t>(1024, 9));
  EXPECT_EQ(ready.query(), CUDA_SUCCESS);
  EXPECT_EQ(sync(producer), CUDA_SUCCESS);
}

// An event recorded twice while both records are held (an application recording the same event
// each iteration), and a wait for the second: releasing the first record must not forget the
// waiting stream, or nothing ever releases it and its synchronisation never returns.
TEST_F(ScheduledDeviceTest, AWaitForAnEventRecordedAgainWhileHeldIsReleasedByTheLaterRecord) {
  open("fair");
  auto tenant = makeTenant("t", 1);
  backend::Stream& producer = stream(owner(tenant));
  backend::Stream& consumer = stream(owner(tenant));
  auto buffer = device_->allocate(4096);
  ASSERT_TRUE(buffer.ok());

  // Held behind the first (unmeasured, so long) kernel: both records and the fill between them.
  ASSERT_EQ(spin(producer, 20 * kMs), CUDA_SUCCESS);
  ASSERT_EQ(spin(producer, 1 * kMs), CUDA_SUCCESS);
  backend::Event& ready = event();
  ASSERT_EQ(producer.record(ready), CUDA_SUCCESS);
  ASSERT_EQ(fill(producer, buffer.value(), 9, 1024), CUDA_SUCCESS);
  ASSERT_EQ(producer.record(ready), CUDA_SUCCESS);
  EXPECT_GT(device_->stats().heldOperations, 0u);

  std::vector<std::uint32_t> seen(1024, 0xdead);
  ASSERT_EQ(consumer.wait(ready), CUDA_SUCCESS);
  ASSERT_EQ(consumer.copyDeviceToHost(seen.data(), buffer.value(), 4096), CUDA_SUCCESS);
  std::optional<CUresult> consumed;
  auto waiting = whenStreamDone(consumer)
                     .then([&](CUresult result) { consumed = result; })
                     .eagerlyEvaluate(nullptr);
  ASSERT_TRUE(soon([&] { return consumed.has_value(); }));
  EXPECT_EQ(*consumed, CUDA_SUCCESS);
  // The copy waited for the second record, so it saw the fill.
  EXPECT_EQ(seen, std::vector<std::uint32_t>(1024, 9));
  EXPECT_EQ(sync(producer), CUDA_SUCCESS);
}

TEST_F(ScheduledDeviceTest, QueriesAndCallbacksAccountForWorkStillHeld) {
  open("fair");
  auto tenant = makeTenant("t", 1);
  backend::Stream& s = stream(owner(tenant));
  backend::Event& start = event();
  backend::Event& end = event();
  std::mutex mutex;
  std::vector<std::string> order;
  auto note = [&](const std::string& what) {
    std::lock_guard lock(mutex);
    order.push_back(what);
  };

  ASSERT_EQ(s.record(start), CUDA_SUCCESS);
  ASSERT_EQ(spin(s, 10 * kMs, [&](CUresult, std::uint64_t) { note("first kernel"); }),
            CUDA_SUCCESS);
  // Held: the first (unmeasured, so long) kernel fills the in-flight budget.
  ASSERT_EQ(spin(s, 1 * kMs, [&](CUresult, std::uint64_t) { note("second kernel"); }),
            CUDA_SUCCESS);
  ASSERT_EQ(s.record(end), CUDA_SUCCESS);
  ASSERT_EQ(s.addCallback([&](CUresult) { note("callback"); }), CUDA_SUCCESS);
  EXPECT_GT(device_->stats().heldOperations, 0u);
  EXPECT_EQ(s.query(), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(end.query(), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(end.elapsedSince(start).code(), CUDA_ERROR_NOT_READY);

  // whenComplete on a record still held fires once that record has completed.
  EXPECT_EQ(whenEventDone(end).wait(io_->waitScope), CUDA_SUCCESS);
  EXPECT_EQ(end.query(), CUDA_SUCCESS);
  ASSERT_EQ(sync(s), CUDA_SUCCESS);
  // sync() is answered from the stream's last callback; the stream is idle once that returned.
  EXPECT_TRUE(soon([&] { return s.query() == CUDA_SUCCESS; }));
  auto elapsed = end.elapsedSince(start);
  ASSERT_TRUE(elapsed.ok());
  EXPECT_GE(elapsed.value(), 10.0f);
  std::lock_guard lock(mutex);
  EXPECT_EQ(order, (std::vector<std::string>{"first kernel", "second kernel", "callback"}));
}

TEST_F(ScheduledDeviceTest, DestroyingAStreamOrEventWithHeldWorkStillCompletesIt) {
  open("fair");
  auto tenant = makeTenant("t", 1);
  auto buffer = device_->allocate(4096);
  ASSERT_TRUE(buffer.ok());
  std::vector<std::uint32_t> seen(1024, 0);
  kj::Promise<CUresult> done = nullptr;
  {
    auto created = device_->createStream(owner(tenant), 0, 0);
    ASSERT_TRUE(created.ok());
    std::unique_ptr<backend::Stream> doomed = std::move(created).value();
    auto createdEvent = device_->createEvent(0);
    ASSERT_TRUE(createdEvent.ok());
    std::unique_ptr<backend::Event> marker = std::move(createdEvent).value();
    ASSERT_EQ(spin(*doomed, 10 * kMs), CUDA_SUCCESS);
    ASSERT_EQ(fill(*doomed, buffer.value(), 3, 1024), CUDA_SUCCESS);
    ASSERT_EQ(doomed->record(*marker), CUDA_SUCCESS);
    ASSERT_EQ(doomed->copyDeviceToHost(seen.data(), buffer.value(), 4096), CUDA_SUCCESS);
    done = whenStreamDone(*doomed);
    // A wait on the destroyed event still orders another stream after the held record.
    ASSERT_EQ(stream(owner(tenant)).wait(*marker), CUDA_SUCCESS);
    EXPECT_GT(device_->stats().heldOperations, 0u);
  }
  EXPECT_EQ(kj::mv(done).wait(io_->waitScope), CUDA_SUCCESS);
  EXPECT_EQ(seen, std::vector<std::uint32_t>(1024, 3));
  EXPECT_EQ(sync(*streams_.back()), CUDA_SUCCESS);
  EXPECT_EQ(device_->stats().heldOperations, 0u);
  EXPECT_EQ(device_->stats().streams, 1u);  // the destroyed one is gone once drained
}

class SchedulerChoice : public ScheduledDeviceTest {
protected:
  // Completion order of one latency-critical kernel issued after `queued` best-effort kernels.
  std::size_t latencyCriticalPosition(std::size_t queued) {
    auto batch = makeTenant("batch", 1);
    auto interactive = makeTenant("interactive", 1, TenantClass::kLatencyCritical);
    std::atomic<std::size_t> completed{0};
    std::atomic<std::size_t> position{0};
    backend::Stream& be = stream(owner(batch));
    for (std::size_t i = 0; i < queued; ++i) {
      EXPECT_EQ(spin(be, 2 * kMs, [&](CUresult, std::uint64_t) { ++completed; }), CUDA_SUCCESS);
    }
    backend::Stream& lc = stream(owner(interactive));
    EXPECT_EQ(spin(lc, 100'000, [&](CUresult, std::uint64_t) { position = ++completed; }),
              CUDA_SUCCESS);
    EXPECT_EQ(sync(lc), CUDA_SUCCESS);
    EXPECT_EQ(sync(be), CUDA_SUCCESS);
    return position;
  }
};

TEST_F(SchedulerChoice, ALatencyCriticalKernelOvertakesQueuedBestEffortWorkUnderFair) {
  open("fair");
  EXPECT_EQ(device_->schedulerName(), "fair");
  // Only what was already on the GPU goes before it.
  EXPECT_LE(latencyCriticalPosition(12), 3u);
}

TEST_F(SchedulerChoice, FifoRunsItInArrivalOrder) {
  open("fifo");
  EXPECT_EQ(device_->schedulerName(), "fifo");
  EXPECT_EQ(latencyCriticalPosition(12), 13u);
}

TEST_F(SchedulerChoice, WeightsShareTheGpuUnderFairAndNotUnderFifo) {
  for (const std::string name : {"fair", "fifo"}) {
    SCOPED_TRACE(name);
    streams_.clear();
    open(name);
    auto light = makeTenant("light", 1);
    auto heavy = makeTenant("heavy", 3);
    backend::Stream& a = stream(owner(light));
    backend::Stream& b = stream(owner(heavy));
    std::atomic<int> lightRan{0};
    std::atomic<int> heavyRan{0};
    // Both stay backlogged for the whole run.
    for (int i = 0; i < 400; ++i) {
      ASSERT_EQ(spin(a, 500'000,
                     [&](CUresult result, std::uint64_t) { lightRan += result == CUDA_SUCCESS; }),
                CUDA_SUCCESS);
      ASSERT_EQ(spin(b, 500'000,
                     [&](CUresult result, std::uint64_t) { heavyRan += result == CUDA_SUCCESS; }),
                CUDA_SUCCESS);
    }
    runFor(250ms);
    if (name == "fair") {
      // The fair scheduler shares measured GPU time by weight, so that is what converges.
      const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
      const double lightTime = static_cast<double>(light->recentGpuTime(now));
      const double heavyTime = static_cast<double>(heavy->recentGpuTime(now));
      ASSERT_GT(lightTime + heavyTime, 0.0);
      EXPECT_NEAR(lightTime / (lightTime + heavyTime), 0.25, 0.06);
    } else {
      // FIFO runs the kernels in the order they came, alternately, whatever the weights: count
      // them (their measured times vary with the host's load, which FIFO does not correct). The
      // two counts are read while kernels still complete, so they may be a few apart; weighted,
      // they would be hundreds apart.
      const int ranLight = lightRan.load();
      const int ranHeavy = heavyRan.load();
      ASSERT_GT(ranLight + ranHeavy, 40);
      EXPECT_LE(std::abs(ranLight - ranHeavy), 4) << ranLight << " and " << ranHeavy;
    }
    // Dropping the device with work still held fails that work rather than running it.
    streams_.clear();
    device_.reset();
  }
}

TEST_F(ScheduledDeviceTest, WeightChangesApplyToWorkAlreadyQueued) {
  open("fair");
  auto light = makeTenant("light", 1);
  auto heavy = makeTenant("heavy", 1);
  backend::Stream& a = stream(owner(light));
  backend::Stream& b = stream(owner(heavy));
  for (int i = 0; i < 400; ++i) {
    ASSERT_EQ(spin(a, 500'000), CUDA_SUCCESS);
    ASSERT_EQ(spin(b, 500'000), CUDA_SUCCESS);
  }
  runFor(20ms);
  TenantLimits limits = heavy->limits();
  limits.weight = 4;
  heavy->setLimits(limits);
  device_->refreshTenants();
  const auto at = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const std::uint64_t lightBefore = light->recentGpuTime(at());
  const std::uint64_t heavyBefore = heavy->recentGpuTime(at());
  runFor(200ms);
  const double lightGot = static_cast<double>(light->recentGpuTime(at()) - lightBefore);
  const double heavyGot = static_cast<double>(heavy->recentGpuTime(at()) - heavyBefore);
  EXPECT_NEAR(lightGot / (lightGot + heavyGot), 0.2, 0.07);
}

TEST_F(ScheduledDeviceTest, TenantClassChoosesTheStreamsPriorityBand) {
  open("fair");
  const StreamOwner critical = owner(makeTenant("critical", 1, TenantClass::kLatencyCritical));
  const StreamOwner batch = owner(makeTenant("batch", 1));
  const backend::StreamPriorityRange range = device_->streamPriorityRange();
  ASSERT_LT(range.greatest, range.least) << "the sim should have several priority levels";

  struct Case {
    const StreamOwner* who;
    int asked;
    backend::TenantClass workClass;
    int runsAt;
    int told;
  };
  const std::vector<Case> cases{
      // Latency-critical: the greatest priority, whatever the client asked.
      {&critical, 0, backend::TenantClass::kLatencyCritical, range.greatest, 0},
      {&critical, range.least + 100, backend::TenantClass::kLatencyCritical, range.greatest,
       range.least},
      // Best-effort: its own priority, clamped below the latency-critical level; a best-effort
      // client asking for the top does not get it.
      {&batch, 0, backend::TenantClass::kBestEffort, 0, 0},
      {&batch, range.greatest, backend::TenantClass::kBestEffort, range.greatest + 1,
       range.greatest},
      {&batch, range.greatest - 50, backend::TenantClass::kBestEffort, range.greatest + 1,
       range.greatest},
  };
  for (const Case& c : cases) {
    auto created = device_->createStream(*c.who, 0, c.asked);
    ASSERT_TRUE(created.ok());
    const std::optional<StreamPlacement> placed = device_->placement(*created.value());
    ASSERT_TRUE(placed.has_value());
    EXPECT_EQ(placed->workClass, c.workClass) << c.asked;
    EXPECT_EQ(placed->devicePriority, c.runsAt) << c.asked;
    // What cuStreamGetPriority would say: the client's own request, clamped like CUDA does.
    EXPECT_EQ(created.value()->priority(), c.told) << c.asked;
    EXPECT_EQ(placed->requestedPriority, c.told) << c.asked;
  }
}

TEST_F(ScheduledDeviceTest, AStreamKeepsTheBandItWasMadeInWhenItsTenantChangesClass) {
  open("fair");
  auto tenant = makeTenant("switching", 1);
  const StreamOwner who = owner(tenant);
  backend::Stream& before = stream(who);
  TenantLimits limits = tenant->limits();
  limits.tenantClass = TenantClass::kLatencyCritical;
  tenant->setLimits(limits);
  device_->refreshTenants();
  backend::Stream& after = stream(who);
  EXPECT_EQ(device_->placement(before)->workClass, backend::TenantClass::kBestEffort);
  EXPECT_EQ(device_->placement(after)->workClass, backend::TenantClass::kLatencyCritical);
  EXPECT_LT(device_->placement(after)->devicePriority, device_->placement(before)->devicePriority);
}

TEST_F(ScheduledDeviceTest, TheDaemonsOwnStreamsAreBestEffort) {
  open("fair");
  auto created = device_->createStream(0, -100);
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(device_->placement(*created.value())->workClass, backend::TenantClass::kBestEffort);
  EXPECT_GT(device_->placement(*created.value())->devicePriority,
            device_->streamPriorityRange().greatest);
  EXPECT_FALSE(device_->smPartition().enabled);
}

#else

TEST(ScheduledDeviceTest, NeedsTheTestKernels) {
  GTEST_SKIP() << "nvcc was not found at configure time: the test kernels were not built";
}

#endif

}  // namespace
}  // namespace gpuproxy::server::dispatch
