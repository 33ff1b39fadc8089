// Stream priorities by tenant class and the SM partition (--best-effort-sms) on a real GPU, and
// pinned host memory across a context reset. Every test runs without a partition and with one
// (half the SMs for best-effort work). Without a driver or a device the program exits 77, which
// ctest reports as skipped; a driver without green contexts skips the partitioned half.

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/backend/backend.hpp"
#include "server/backend/cuda/cuda_backend.hpp"
#include "server/dispatch/scheduled_device.hpp"
#include "server/gpu/client_stats.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace gpuproxy::server::cuda {
namespace {

using gpuproxy::testing::ParameterPacker;
#ifdef GPUPROXY_HAVE_TEST_KERNELS
using gpuproxy::testing::testKernelsImage;
#endif

using backend::Device;
using backend::Event;
using backend::FunctionInfo;
using backend::LaunchConfig;
using backend::Module;
using backend::Stream;
using backend::TenantClass;

constexpr std::chrono::seconds kWait{30};
// The share of the SMs the partitioned runs give best-effort work.
constexpr unsigned kBestEffortPercent = 50;

backend::Backend* gBackend = nullptr;  // set by main() once the driver is known to work

struct Completion {
  std::promise<CUresult> status;
  std::promise<std::uint64_t> nanoseconds;
};

CUresult await(std::future<CUresult>& future) {
  if (future.wait_for(kWait) != std::future_status::ready) {
    ADD_FAILURE() << "no completion within " << kWait.count() << " s";
    return CUDA_ERROR_NOT_READY;
  }
  return future.get();
}

CUresult finish(Stream& stream) {
  auto completion = std::make_shared<Completion>();
  auto future = completion->status.get_future();
  const CUresult queued =
      stream.addCallback([completion](CUresult status) { completion->status.set_value(status); });
  return queued != CUDA_SUCCESS ? queued : await(future);
}

int attribute(const Device& device, CUdevice_attribute wanted) {
  for (const auto& [which, value] : device.properties().attributes) {
    if (which == wanted) return value;
  }
  return -1;
}

#ifdef GPUPROXY_HAVE_TEST_KERNELS

LaunchConfig linear(unsigned threads) {
  LaunchConfig config;
  config.block.x = 256;
  config.grid.x = (threads + 255) / 256;
  return config;
}

class SmPartitionTest : public ::testing::TestWithParam<bool> {
protected:
  void SetUp() override {
    backend::DeviceOptions options;
    if (partitioned()) options.bestEffortPercent = kBestEffortPercent;
    auto opened = gBackend->openDevice(0, options);
    if (partitioned() && !opened.ok() && opened.code() == CUDA_ERROR_NOT_SUPPORTED &&
        gBackend->driverVersion() < 12050) {
      GTEST_SKIP() << "driver " << gBackend->driverVersion() << " has no green contexts";
    }
    ASSERT_TRUE(opened.ok()) << "openDevice(0" << (partitioned() ? ", partition" : "")
                             << "): " << opened.code();
    device_ = std::move(opened).value();
    auto loaded = device_->loadModule(testKernelsImage());
    ASSERT_TRUE(loaded.ok()) << "loadModule: " << loaded.code();
    module_ = std::move(loaded).value();
  }

  void TearDown() override {
    for (CUdeviceptr pointer : allocations_) {
      if (device_) device_->free(pointer);
    }
    module_.reset();
    device_.reset();
  }

  bool partitioned() const { return GetParam(); }

  std::unique_ptr<Stream> newStream(TenantClass workClass, int priority = 0) {
    auto created = device_->createStreamFor(workClass, 0, priority);
    EXPECT_TRUE(created.ok()) << "createStreamFor: " << created.code();
    return created.ok() ? std::move(created).value() : nullptr;
  }

  CUdeviceptr allocate(std::size_t bytes) {
    auto allocated = device_->allocate(bytes);
    EXPECT_TRUE(allocated.ok()) << "allocate: " << allocated.code();
    if (!allocated.ok()) return 0;
    allocations_.push_back(allocated.value());
    return allocated.value();
  }

  backend::Function& function(std::string_view name) {
    auto found = module_->function(name);
    EXPECT_TRUE(found.ok()) << name << ": " << found.code();
    if (!found.ok()) throw std::runtime_error("kernel missing");
    return *found.value();
  }

  // vector_add on `stream` over memory allocated by the device (its primary context), checked.
  void addVectorsOn(Stream& stream) {
    constexpr int kCount = 100'000;
    std::vector<float> a(kCount);
    std::vector<float> b(kCount);
    std::iota(a.begin(), a.end(), 1.0f);
    std::iota(b.begin(), b.end(), 1000.0f);
    std::vector<float> c(kCount, -1.0f);
    const std::size_t bytes = kCount * sizeof(float);
    const CUdeviceptr da = allocate(bytes);
    const CUdeviceptr db = allocate(bytes);
    const CUdeviceptr dc = allocate(bytes);
    ASSERT_TRUE(da != 0 && db != 0 && dc != 0);
    ASSERT_EQ(stream.copyHostToDevice(da, a.data(), bytes), CUDA_SUCCESS);
    ASSERT_EQ(stream.copyHostToDevice(db, b.data(), bytes), CUDA_SUCCESS);
    backend::Function& add = function("vector_add");
    auto completion = std::make_shared<Completion>();
    auto status = completion->status.get_future();
    auto time = completion->nanoseconds.get_future();
    ASSERT_EQ(stream.launch(add, linear(kCount),
                            ParameterPacker(add.info()).add(da).add(db).add(dc).add(kCount).bytes(),
                            [completion](CUresult result, std::uint64_t ns) {
                              completion->nanoseconds.set_value(ns);
                              completion->status.set_value(result);
                            }),
              CUDA_SUCCESS);
    ASSERT_EQ(stream.copyDeviceToHost(c.data(), dc, bytes), CUDA_SUCCESS);
    ASSERT_EQ(finish(stream), CUDA_SUCCESS);
    EXPECT_EQ(await(status), CUDA_SUCCESS);
    EXPECT_GT(time.get(), 0u) << "the kernel's timing events, made in its stream's context";
    for (int i = 0; i < kCount; ++i) {
      ASSERT_EQ(c[i], a[i] + b[i]) << "element " << i;
    }
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Module> module_;
  std::vector<CUdeviceptr> allocations_;
};

TEST_P(SmPartitionTest, ThePartitionIsWhatWasAskedForAndCoversEverySm) {
  const backend::SmPartition partition = device_->smPartition();
  EXPECT_EQ(partition.enabled, partitioned());
  if (!partitioned()) return;
  const unsigned sms =
      static_cast<unsigned>(attribute(*device_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
  EXPECT_EQ(partition.totalSms, sms);
  // The remainder is whatever the split left: all of the rest, unless the driver held some SMs
  // back for alignment.
  EXPECT_LE(partition.bestEffortSms + partition.latencyCriticalSms, partition.totalSms);
  // At least what was asked for: the driver rounds up to its granularity, never down.
  EXPECT_GE(partition.bestEffortSms, sms * kBestEffortPercent / 100);
  EXPECT_GT(partition.latencyCriticalSms, 0u);
}

TEST_P(SmPartitionTest, ABestEffortKernelRunsOnItsStreamAndComputesTheRightResult) {
  auto stream = newStream(TenantClass::kBestEffort);
  ASSERT_NE(stream, nullptr);
  addVectorsOn(*stream);
}

TEST_P(SmPartitionTest, ALatencyCriticalKernelRunsOnItsStreamAndComputesTheRightResult) {
  auto stream = newStream(TenantClass::kLatencyCritical);
  ASSERT_NE(stream, nullptr);
  addVectorsOn(*stream);
}

TEST_P(SmPartitionTest, StreamsRunAtThePriorityTheyWereMadeWith) {
  const backend::StreamPriorityRange range = device_->streamPriorityRange();
  EXPECT_LE(range.greatest, range.least);
  auto high = newStream(TenantClass::kLatencyCritical, range.greatest);
  auto low = newStream(TenantClass::kBestEffort, range.least);
  auto beyond = newStream(TenantClass::kBestEffort, range.greatest - 10);
  ASSERT_TRUE(high && low && beyond);
  // What the driver says (cuStreamGetPriority), for green-context streams too.
  EXPECT_EQ(high->priority(), range.greatest);
  EXPECT_EQ(low->priority(), range.least);
  EXPECT_EQ(beyond->priority(), range.greatest);
}

TEST_P(SmPartitionTest, TheDispatcherGivesLatencyCriticalTenantsTheHighestPriority) {
  auto io = kj::setupAsyncIo();
  // The dispatcher owns the device; the module stays the test's and must go first.
  module_.reset();
  dispatch::DispatchOptions options;
  dispatch::ScheduledDevice dispatcher(std::move(device_), dispatch::newScheduler(options),
                                       io.provider->getTimer());
  TenantId nextTenantId = 1;
  auto tenant = [&nextTenantId](const char* name, TenantClass tenantClass) {
    TenantLimits limits;
    limits.tenantClass = tenantClass;
    return std::make_shared<Tenant>(nextTenantId++, TenantDefinition{name, "/unused", limits});
  };
  const dispatch::StreamOwner critical{tenant("critical", TenantClass::kLatencyCritical),
                                       dispatcher.newClientId()};
  const dispatch::StreamOwner batch{tenant("batch", TenantClass::kBestEffort),
                                    dispatcher.newClientId()};
  const backend::StreamPriorityRange range = dispatcher.streamPriorityRange();
  ASSERT_LT(range.greatest, range.least) << "a GPU with one priority level";

  auto lc = dispatcher.createStream(critical, 0, 0);
  auto be = dispatcher.createStream(batch, 0, range.greatest);  // asks for the top
  ASSERT_TRUE(lc.ok() && be.ok());
  const auto lcPlaced = dispatcher.placement(*lc.value());
  const auto bePlaced = dispatcher.placement(*be.value());
  ASSERT_TRUE(lcPlaced && bePlaced);
  // devicePriority is what the driver reports for the real stream.
  EXPECT_EQ(lcPlaced->devicePriority, range.greatest);
  EXPECT_EQ(bePlaced->devicePriority, range.greatest + 1);
  EXPECT_EQ(be.value()->priority(), range.greatest);  // what the client is told
}

TEST_P(SmPartitionTest, EventsOrderWorkAcrossTheTwoClassesStreams) {
  auto producer = newStream(TenantClass::kBestEffort);
  auto consumer = newStream(TenantClass::kLatencyCritical);
  auto created = device_->createEvent(CU_EVENT_DEFAULT);
  ASSERT_TRUE(producer && consumer && created.ok());
  std::unique_ptr<Event> done = std::move(created).value();
  auto startCreated = device_->createEvent(CU_EVENT_DEFAULT);
  ASSERT_TRUE(startCreated.ok());
  std::unique_ptr<Event> start = std::move(startCreated).value();

  constexpr unsigned long long kCount = 1 << 20;
  const CUdeviceptr buffer = allocate(kCount * 4);
  ASSERT_NE(buffer, 0u);
  backend::Function& spin = function("spin");
  backend::Function& fill = function("fill_u32");
  ASSERT_EQ(producer->record(*start), CUDA_SUCCESS);
  // The consumer's copy must see the producer's fill, which a 20 ms spin delays.
  ASSERT_EQ(producer->launch(spin, LaunchConfig{},
                             ParameterPacker(spin.info()).add(20'000'000ull).bytes(), {}),
            CUDA_SUCCESS);
  ASSERT_EQ(
      producer->launch(fill, linear(kCount),
                       ParameterPacker(fill.info()).add(buffer).add(77u).add(kCount).bytes(), {}),
      CUDA_SUCCESS);
  ASSERT_EQ(producer->record(*done), CUDA_SUCCESS);
  ASSERT_EQ(consumer->wait(*done), CUDA_SUCCESS);
  std::vector<std::uint32_t> words(kCount, 0);
  ASSERT_EQ(consumer->copyDeviceToHost(words.data(), buffer, kCount * 4), CUDA_SUCCESS);
  ASSERT_EQ(finish(*consumer), CUDA_SUCCESS);
  EXPECT_TRUE(std::all_of(words.begin(), words.end(), [](std::uint32_t w) { return w == 77; }));

  auto completion = std::make_shared<Completion>();
  auto future = completion->status.get_future();
  done->whenComplete([completion](CUresult status) { completion->status.set_value(status); });
  EXPECT_EQ(await(future), CUDA_SUCCESS);
  EXPECT_EQ(done->query(), CUDA_SUCCESS);
  const auto elapsed = done->elapsedSince(*start);
  ASSERT_TRUE(elapsed.ok()) << elapsed.code();
  EXPECT_GE(elapsed.value(), 15.0f);
}

// For the reset test: page-aligned host memory outside any allocator's reach.
struct MappedPages {
  explicit MappedPages(std::size_t bytes)
      : size(bytes),
        data(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) {}
  ~MappedPages() {
    if (data != MAP_FAILED) ::munmap(data, size);
  }
  MappedPages(const MappedPages&) = delete;
  MappedPages& operator=(const MappedPages&) = delete;
  std::size_t size;
  void* data;
};

TEST_P(SmPartitionTest, AfterAFaultAndAResetPinnedMemoryAndThePartitionAreStillThere) {
  const std::size_t pageSize = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  constexpr unsigned long long kWords = 4096;
  MappedPages pinned(std::max<std::size_t>(kWords * 4, pageSize));
  ASSERT_NE(pinned.data, MAP_FAILED);
  ASSERT_EQ(device_->registerHostMemory(pinned.data, pinned.size), CUDA_SUCCESS);

  auto stream = newStream(TenantClass::kBestEffort);
  ASSERT_NE(stream, nullptr);
  backend::Function& trap = function("trap");
  ASSERT_EQ(stream->launch(trap, LaunchConfig{}, {}, {}), CUDA_SUCCESS);
  EXPECT_EQ(finish(*stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(device_->stickyError(), CUDA_ERROR_ILLEGAL_ADDRESS);

  stream.reset();
  module_.reset();
  allocations_.clear();
  ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
  EXPECT_EQ(device_->stickyError(), CUDA_SUCCESS);
  EXPECT_EQ(device_->smPartition().enabled, partitioned());

  auto reloaded = device_->loadModule(testKernelsImage());
  ASSERT_TRUE(reloaded.ok()) << reloaded.code();
  module_ = std::move(reloaded).value();
  for (const TenantClass workClass : {TenantClass::kBestEffort, TenantClass::kLatencyCritical}) {
    auto again = newStream(workClass);
    ASSERT_NE(again, nullptr);
    // A kernel writes the pinned pages straight through their host address (device-mapped,
    // unified addressing): only a registration that survived the reset lets it.
    const unsigned value = workClass == TenantClass::kBestEffort ? 5u : 6u;
    backend::Function& fill = function("fill_u32");
    ASSERT_EQ(again->launch(fill, linear(kWords),
                            ParameterPacker(fill.info())
                                .add(reinterpret_cast<CUdeviceptr>(pinned.data))
                                .add(value)
                                .add(kWords)
                                .bytes(),
                            {}),
              CUDA_SUCCESS);
    ASSERT_EQ(finish(*again), CUDA_SUCCESS);
    const auto* words = static_cast<const std::uint32_t*>(pinned.data);
    EXPECT_EQ(words[0], value);
    EXPECT_EQ(words[kWords - 1], value);
  }
  EXPECT_EQ(device_->unregisterHostMemory(pinned.data), CUDA_SUCCESS);
}

INSTANTIATE_TEST_SUITE_P(WithAndWithout, SmPartitionTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Partitioned") : std::string("WholeGpu");
                         });

#else

TEST(SmPartitionTest, NeedsTheTestKernels) {
  GTEST_SKIP() << "the gpuproxy_test_kernels target did not exist when this was configured";
}

#endif  // GPUPROXY_HAVE_TEST_KERNELS

}  // namespace
}  // namespace gpuproxy::server::cuda

int main(int argc, char** argv) {
  return gpuproxy::testing::runGpuTests(argc, argv, gpuproxy::server::cuda::gBackend);
}
