// The cuda backend against a real GPU. Without a driver or a device the whole program exits 77,
// which ctest reports as skipped, after printing why.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/backend/backend.hpp"
#include "server/backend/cuda/cuda_backend.hpp"
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
using backend::KernelParameter;
using backend::LaunchConfig;
using backend::Module;
using backend::Stream;

// Generous: a loaded CI GPU can be slow, and a hang must fail rather than wait for ctest.
constexpr std::chrono::seconds kWait{30};

backend::Backend* gBackend = nullptr;  // set by main() once the driver is known to work

// One completion, delivered on the backend's thread. Shared so that a late callback after a timed
// out wait never touches a dead frame.
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

bool isSticky(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_ASSERT:
      return true;
    default:
      return false;
  }
}

template <typename T>
std::span<const std::byte> bytesOf(const std::vector<T>& values) {
  return std::as_bytes(std::span(values));
}

class CudaBackendTest : public ::testing::Test {
protected:
  void SetUp() override {
    auto opened = gBackend->openDevice(0);
    ASSERT_TRUE(opened.ok()) << "openDevice(0): " << opened.code();
    device_ = std::move(opened).value();
    stream_ = newStream();
    ASSERT_NE(stream_, nullptr);
  }

  void TearDown() override {
    for (CUdeviceptr pointer : allocations_) {
      if (device_) {
        device_->free(pointer);
      }
    }
    stream_.reset();
    device_.reset();
  }

  std::unique_ptr<Stream> newStream() {
    auto created = device_->createStream(0, 0);
    EXPECT_TRUE(created.ok()) << "createStream: " << created.code();
    return created.ok() ? std::move(created).value() : nullptr;
  }

  std::unique_ptr<Event> newEvent(unsigned flags = CU_EVENT_DEFAULT) {
    auto created = device_->createEvent(flags);
    EXPECT_TRUE(created.ok()) << "createEvent: " << created.code();
    return created.ok() ? std::move(created).value() : nullptr;
  }

  CUdeviceptr allocate(std::size_t bytes) {
    auto allocated = device_->allocate(bytes);
    EXPECT_TRUE(allocated.ok()) << "allocate: " << allocated.code();
    if (!allocated.ok()) {
      return 0;
    }
    allocations_.push_back(allocated.value());
    return allocated.value();
  }

  // Waits for everything queued on `stream` so far; the callback's status.
  CUresult finish(Stream& stream) {
    auto completion = std::make_shared<Completion>();
    auto future = completion->status.get_future();
    const CUresult queued =
        stream.addCallback([completion](CUresult status) { completion->status.set_value(status); });
    if (queued != CUDA_SUCCESS) {
      return queued;
    }
    return await(future);
  }

  static bool becomesIdle(Stream& stream) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    CUresult state = stream.query();
    while (state == CUDA_ERROR_NOT_READY && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      state = stream.query();
    }
    EXPECT_EQ(state, CUDA_SUCCESS);
    return state == CUDA_SUCCESS;
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::vector<CUdeviceptr> allocations_;
};

TEST_F(CudaBackendTest, ReportsPropertiesAndEveryAnsweredAttribute) {
  EXPECT_EQ(gBackend->name(), "cuda");
  EXPECT_GE(gBackend->driverVersion(), 12000);
  EXPECT_GE(gBackend->deviceCount(), 1);

  const backend::DeviceProperties& properties = device_->properties();
  EXPECT_FALSE(properties.name.empty());
  EXPECT_GT(properties.totalMemory, 0u);
  EXPECT_TRUE(std::any_of(properties.uuid.begin(), properties.uuid.end(),
                          [](std::uint8_t byte) { return byte != 0; }));

  const auto& attributes = properties.attributes;
  // A modern GPU answers well over a hundred attributes; a handful would mean the loop stopped.
  EXPECT_GT(attributes.size(), 100u);
  EXPECT_TRUE(std::is_sorted(attributes.begin(), attributes.end()));
  for (const auto& [attribute, value] : attributes) {
    EXPECT_GE(attribute, 1);
    EXPECT_LT(attribute, CU_DEVICE_ATTRIBUTE_MAX);
  }
  auto valueOf = [&](CUdevice_attribute wanted) {
    for (const auto& [attribute, value] : attributes) {
      if (attribute == wanted) {
        return value;
      }
    }
    ADD_FAILURE() << "attribute " << wanted << " missing";
    return -1;
  };
  EXPECT_GE(valueOf(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 512);
  EXPECT_GT(valueOf(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 0);
  EXPECT_GE(valueOf(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), 5);
  EXPECT_EQ(valueOf(CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);

  const backend::MemoryInfo memory = device_->memoryInfo();
  EXPECT_GT(memory.total, 0u);
  EXPECT_LE(memory.free, memory.total);
  EXPECT_EQ(device_->stickyError(), CUDA_SUCCESS);
}

TEST_F(CudaBackendTest, CopiesRoundTripThroughTwoAllocations) {
  constexpr std::size_t kCount = 1 << 20;
  std::vector<std::uint32_t> source(kCount);
  std::iota(source.begin(), source.end(), 7u);
  std::vector<std::uint32_t> back(kCount, 0);
  const std::size_t bytes = kCount * sizeof(std::uint32_t);
  const CUdeviceptr first = allocate(bytes);
  const CUdeviceptr second = allocate(bytes);
  ASSERT_NE(first, 0u);
  ASSERT_NE(second, 0u);

  ASSERT_EQ(stream_->copyHostToDevice(first, source.data(), bytes), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToDevice(second, first, bytes), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(back.data(), second, bytes), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(back, source);
  // Idle soon: the callback can run before the driver's host function has returned.
  EXPECT_TRUE(becomesIdle(*stream_));

  const backend::MemoryInfo memory = device_->memoryInfo();
  EXPECT_LE(memory.free + 2 * bytes, memory.total);
}

TEST_F(CudaBackendTest, MemsetsEachElementSize) {
  constexpr std::size_t kBytes = 4096;
  const CUdeviceptr pointer = allocate(kBytes);
  ASSERT_NE(pointer, 0u);
  std::vector<std::uint8_t> bytes(kBytes);
  ASSERT_EQ(stream_->memset(pointer, 0xAB, 1, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(bytes.data(), pointer, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0xAB; }));

  std::vector<std::uint16_t> halves(kBytes / 2);
  ASSERT_EQ(stream_->memset(pointer, 0xBEEF, 2, halves.size()), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(halves.data(), pointer, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  EXPECT_TRUE(
      std::all_of(halves.begin(), halves.end(), [](std::uint16_t h) { return h == 0xBEEF; }));

  std::vector<std::uint32_t> words(kBytes / 4);
  ASSERT_EQ(stream_->memset(pointer, 0xDEADBEEF, 4, words.size()), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(words.data(), pointer, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  EXPECT_TRUE(
      std::all_of(words.begin(), words.end(), [](std::uint32_t w) { return w == 0xDEADBEEF; }));

  EXPECT_EQ(stream_->memset(pointer, 0, 3, 8), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CudaBackendTest, EventsCompleteAndMeasureTime) {
  auto start = newEvent();
  auto end = newEvent();
  auto untimed = newEvent(CU_EVENT_DISABLE_TIMING);
  ASSERT_TRUE(start && end && untimed);

  // Never recorded: complete, but there is no time to measure.
  EXPECT_EQ(start->query(), CUDA_SUCCESS);
  EXPECT_EQ(end->elapsedSince(*start).code(), CUDA_ERROR_INVALID_HANDLE);
  {
    auto completion = std::make_shared<Completion>();
    auto future = completion->status.get_future();
    start->whenComplete([completion](CUresult status) { completion->status.set_value(status); });
    EXPECT_EQ(await(future), CUDA_SUCCESS);
  }

  constexpr std::size_t kBytes = 256u << 20;
  const CUdeviceptr pointer = allocate(kBytes);
  ASSERT_NE(pointer, 0u);
  ASSERT_EQ(stream_->record(*start), CUDA_SUCCESS);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(stream_->memset(pointer, static_cast<std::uint32_t>(i), 4, kBytes / 4), CUDA_SUCCESS);
  }
  ASSERT_EQ(stream_->record(*end), CUDA_SUCCESS);
  ASSERT_EQ(stream_->record(*untimed), CUDA_SUCCESS);

  auto completion = std::make_shared<Completion>();
  auto future = completion->status.get_future();
  end->whenComplete([completion](CUresult status) { completion->status.set_value(status); });
  ASSERT_EQ(await(future), CUDA_SUCCESS);
  EXPECT_EQ(end->query(), CUDA_SUCCESS);

  const auto elapsed = end->elapsedSince(*start);
  ASSERT_TRUE(elapsed.ok()) << elapsed.code();
  EXPECT_GT(elapsed.value(), 0.0f);
  EXPECT_LT(elapsed.value(), 10'000.0f);
  EXPECT_EQ(untimed->elapsedSince(*start).code(), CUDA_ERROR_INVALID_HANDLE);
}

#ifdef GPUPROXY_HAVE_TEST_KERNELS

class CudaKernelTest : public CudaBackendTest {
protected:
  void SetUp() override {
    CudaBackendTest::SetUp();
    if (HasFatalFailure()) {
      return;
    }
    auto loaded = device_->loadModule(testKernelsImage());
    ASSERT_TRUE(loaded.ok()) << "loadModule: " << loaded.code();
    module_ = std::move(loaded).value();
  }

  void TearDown() override {
    module_.reset();
    CudaBackendTest::TearDown();
  }

  backend::Function& function(std::string_view name) {
    auto found = module_->function(name);
    EXPECT_TRUE(found.ok()) << name << ": " << found.code();
    if (!found.ok()) {
      throw std::runtime_error("kernel missing");  // ends the test; gtest reports it
    }
    return *found.value();
  }

  // Launches spin(ns) on `stream`; the kernel callback's status and GPU time arrive in the
  // returned futures.
  std::pair<std::future<CUresult>, std::future<std::uint64_t>> spin(Stream& stream,
                                                                    std::uint64_t nanoseconds) {
    backend::Function& kernel = function("spin");
    auto completion = std::make_shared<Completion>();
    auto futures =
        std::make_pair(completion->status.get_future(), completion->nanoseconds.get_future());
    const unsigned long long ns = nanoseconds;
    const CUresult launched =
        stream.launch(kernel, LaunchConfig{}, ParameterPacker(kernel.info()).add(ns).bytes(),
                      [completion](CUresult status, std::uint64_t gpuNanoseconds) {
                        completion->nanoseconds.set_value(gpuNanoseconds);
                        completion->status.set_value(status);
                      });
    EXPECT_EQ(launched, CUDA_SUCCESS);
    return futures;
  }

  std::unique_ptr<Module> module_;
};

TEST_F(CudaKernelTest, ReportsParameterLayoutsFromTheDriver) {
  const FunctionInfo& vectorAdd = function("vector_add").info();
  ASSERT_EQ(vectorAdd.parameters.size(), 4u);
  EXPECT_EQ(vectorAdd.parameters[0].offset, 0u);
  EXPECT_EQ(vectorAdd.parameters[1].offset, 8u);
  EXPECT_EQ(vectorAdd.parameters[2].offset, 16u);
  EXPECT_EQ(vectorAdd.parameters[3].offset, 24u);
  EXPECT_EQ(vectorAdd.parameters[0].size, 8u);
  EXPECT_EQ(vectorAdd.parameters[3].size, 4u);
  EXPECT_EQ(vectorAdd.parameterBytes, 28u);
  EXPECT_GT(vectorAdd.maxThreadsPerBlock, 0);
  EXPECT_GT(vectorAdd.numRegs, 0);

  const FunctionInfo& fill = function("fill_u32").info();
  ASSERT_EQ(fill.parameters.size(), 3u);
  EXPECT_EQ(fill.parameters[1].offset, 8u);
  EXPECT_EQ(fill.parameters[1].size, 4u);
  EXPECT_EQ(fill.parameters[2].offset, 16u);  // an 8-byte value realigns after a 4-byte one
  EXPECT_EQ(fill.parameters[2].size, 8u);
  EXPECT_EQ(fill.parameterBytes, 24u);

  const FunctionInfo& spinInfo = function("spin").info();
  ASSERT_EQ(spinInfo.parameters.size(), 1u);
  EXPECT_EQ(spinInfo.parameterBytes, 8u);
  EXPECT_TRUE(function("trap").info().parameters.empty());

  EXPECT_EQ(module_->function("no_such_kernel").code(), CUDA_ERROR_NOT_FOUND);
  // Looked up twice, a kernel is the same Function.
  EXPECT_EQ(&function("spin"), &function("spin"));
}

TEST_F(CudaKernelTest, LaunchesVectorAddAndFill) {
  constexpr int kCount = 1 << 16;
  const std::size_t bytes = kCount * sizeof(float);
  std::vector<float> a(kCount);
  std::vector<float> b(kCount);
  for (int i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i);
  }
  const CUdeviceptr da = allocate(bytes);
  const CUdeviceptr db = allocate(bytes);
  const CUdeviceptr dc = allocate(bytes);
  ASSERT_TRUE(da && db && dc);
  ASSERT_EQ(stream_->copyHostToDevice(da, a.data(), bytes), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyHostToDevice(db, b.data(), bytes), CUDA_SUCCESS);

  backend::Function& vectorAdd = function("vector_add");
  LaunchConfig config;
  config.block.x = 256;
  config.grid.x = (kCount + 255) / 256;
  auto completion = std::make_shared<Completion>();
  auto status = completion->status.get_future();
  ASSERT_EQ(
      stream_->launch(
          vectorAdd, config,
          ParameterPacker(vectorAdd.info()).add(da).add(db).add(dc).add(kCount).bytes(),
          [completion](CUresult result, std::uint64_t) { completion->status.set_value(result); }),
      CUDA_SUCCESS);
  EXPECT_EQ(await(status), CUDA_SUCCESS);

  std::vector<float> c(kCount, -1.0f);
  ASSERT_EQ(stream_->copyDeviceToHost(c.data(), dc, bytes), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(c[i], a[i] + b[i]) << "at " << i;
  }

  // fill_u32 mixes 8-, 4- and 8-byte parameters; no callback this time.
  backend::Function& fill = function("fill_u32");
  const unsigned value = 0x12345678u;
  const unsigned long long count = kCount;
  ASSERT_EQ(stream_->launch(fill, config,
                            ParameterPacker(fill.info()).add(dc).add(value).add(count).bytes(), {}),
            CUDA_SUCCESS);
  std::vector<std::uint32_t> words(kCount, 0);
  ASSERT_EQ(stream_->copyDeviceToHost(words.data(), dc, bytes), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  EXPECT_TRUE(std::all_of(words.begin(), words.end(), [&](std::uint32_t w) { return w == value; }));

  // Too few parameter bytes is the caller's error, caught before the driver sees it.
  EXPECT_EQ(stream_->launch(fill, config, std::span<const std::byte>(), {}),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CudaKernelTest, KernelCallbackCarriesGpuTime) {
  constexpr std::uint64_t kSpin = 5'000'000;  // 5 ms
  auto [status, nanoseconds] = spin(*stream_, kSpin);
  EXPECT_EQ(await(status), CUDA_SUCCESS);
  ASSERT_EQ(nanoseconds.wait_for(kWait), std::future_status::ready);
  const std::uint64_t measured = nanoseconds.get();
  EXPECT_GE(measured, kSpin * 9 / 10);
  EXPECT_LT(measured, kSpin * 200);

  // Events around the kernel agree with the spin time too.
  auto start = newEvent();
  auto end = newEvent();
  ASSERT_EQ(stream_->record(*start), CUDA_SUCCESS);
  auto second = spin(*stream_, kSpin);
  ASSERT_EQ(stream_->record(*end), CUDA_SUCCESS);
  EXPECT_EQ(end->query(), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(end->elapsedSince(*start).code(), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(await(second.first), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  const auto elapsed = end->elapsedSince(*start);
  ASSERT_TRUE(elapsed.ok()) << elapsed.code();
  EXPECT_GE(elapsed.value(), 4.5f);
}

TEST_F(CudaKernelTest, StreamWaitsForAnotherStreamsEvent) {
  auto other = newStream();
  auto event = newEvent();
  ASSERT_TRUE(other && event);
  const CUdeviceptr pointer = allocate(4096);
  ASSERT_NE(pointer, 0u);

  // Completion order, as the backend's thread delivers it.
  auto order = std::make_shared<std::vector<std::string>>();
  auto orderMutex = std::make_shared<std::mutex>();
  auto note = [order, orderMutex](std::string what) {
    std::lock_guard lock(*orderMutex);
    order->push_back(std::move(what));
  };

  backend::Function& kernel = function("spin");
  const unsigned long long ns = 200'000'000;  // 200 ms: ample time to look at the waiting stream
  ASSERT_EQ(stream_->launch(kernel, LaunchConfig{}, ParameterPacker(kernel.info()).add(ns).bytes(),
                            [note](CUresult, std::uint64_t) { note("spin"); }),
            CUDA_SUCCESS);
  ASSERT_EQ(stream_->record(*event), CUDA_SUCCESS);
  ASSERT_EQ(other->wait(*event), CUDA_SUCCESS);
  ASSERT_EQ(other->memset(pointer, 1, 4, 1024), CUDA_SUCCESS);
  EXPECT_EQ(other->query(), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(event->query(), CUDA_ERROR_NOT_READY);

  auto completion = std::make_shared<Completion>();
  auto future = completion->status.get_future();
  ASSERT_EQ(other->addCallback([note, completion](CUresult status) {
    note("other");
    completion->status.set_value(status);
  }),
            CUDA_SUCCESS);
  EXPECT_EQ(await(future), CUDA_SUCCESS);
  EXPECT_EQ(event->query(), CUDA_SUCCESS);
  std::lock_guard lock(*orderMutex);
  EXPECT_EQ(*order, (std::vector<std::string>{"spin", "other"}));
}

TEST_F(CudaKernelTest, WhenCompleteOfALateEventDoesNotHoldBackAnEarlierOne) {
  auto other = newStream();
  auto slow = newEvent();
  auto quick = newEvent();
  ASSERT_TRUE(other && slow && quick);
  auto slowSpin = spin(*stream_, 300'000'000);
  ASSERT_EQ(stream_->record(*slow), CUDA_SUCCESS);
  auto quickSpin = spin(*other, 1'000'000);
  ASSERT_EQ(other->record(*quick), CUDA_SUCCESS);

  auto slowDone = std::make_shared<Completion>();
  auto quickDone = std::make_shared<Completion>();
  auto slowFuture = slowDone->status.get_future();
  auto quickFuture = quickDone->status.get_future();
  slow->whenComplete([slowDone](CUresult status) { slowDone->status.set_value(status); });
  quick->whenComplete([quickDone](CUresult status) { quickDone->status.set_value(status); });
  EXPECT_EQ(await(quickFuture), CUDA_SUCCESS);
  EXPECT_EQ(slowFuture.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  EXPECT_EQ(await(slowFuture), CUDA_SUCCESS);
  EXPECT_EQ(await(slowSpin.first), CUDA_SUCCESS);
  EXPECT_EQ(await(quickSpin.first), CUDA_SUCCESS);
}

TEST_F(CudaKernelTest, QueuedWorkOutlivesItsStreamModuleAndDevice) {
  // backend.hpp: destroying a Stream, Module or Device returns, and work already queued still
  // completes and still reports.
  auto delivered = std::make_shared<std::atomic<int>>(0);
  auto status = std::make_shared<std::atomic<int>>(-1);
  backend::Function& kernel = function("spin");
  const unsigned long long ns = 100'000'000;
  ASSERT_EQ(stream_->launch(kernel, LaunchConfig{}, ParameterPacker(kernel.info()).add(ns).bytes(),
                            [delivered, status](CUresult result, std::uint64_t) {
                              status->store(result);
                              delivered->fetch_add(1);
                            }),
            CUDA_SUCCESS);
  stream_.reset();
  module_.reset();
  EXPECT_EQ(delivered->load(), 0);  // still spinning
  device_.reset();                  // waits for the callback it owes
  EXPECT_EQ(delivered->load(), 1);
  EXPECT_EQ(status->load(), CUDA_SUCCESS);
}

TEST_F(CudaKernelTest, TrapPoisonsTheContextUntilReset) {
  backend::Function& trap = function("trap");
  auto completion = std::make_shared<Completion>();
  auto status = completion->status.get_future();
  ASSERT_EQ(stream_->launch(trap, LaunchConfig{}, {},
                            [completion](CUresult result, std::uint64_t) {
                              completion->status.set_value(result);
                            }),
            CUDA_SUCCESS);
  const CUresult reported = await(status);
  EXPECT_TRUE(isSticky(reported)) << "callback status " << reported;

  const CUresult sticky = device_->stickyError();
  EXPECT_TRUE(isSticky(sticky)) << "stickyError " << sticky;
  // The kernels test program's trap faults with an illegal address.
  EXPECT_EQ(sticky, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(stream_->query(), sticky);
  EXPECT_EQ(device_->allocate(64).code(), sticky);
  EXPECT_EQ(finish(*stream_), sticky);

  // The caller drops everything of the old context first.
  allocations_.clear();
  stream_.reset();
  module_.reset();
  ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
  EXPECT_EQ(device_->stickyError(), CUDA_SUCCESS);

  // Usable again: memory, streams, modules and kernels.
  stream_ = newStream();
  ASSERT_NE(stream_, nullptr);
  auto reloaded = device_->loadModule(testKernelsImage());
  ASSERT_TRUE(reloaded.ok()) << reloaded.code();
  module_ = std::move(reloaded).value();
  const CUdeviceptr pointer = allocate(1024 * sizeof(std::uint32_t));
  ASSERT_NE(pointer, 0u);
  backend::Function& fill = function("fill_u32");
  LaunchConfig config;
  config.block.x = 256;
  config.grid.x = 4;
  const unsigned value = 42;
  const unsigned long long count = 1024;
  ASSERT_EQ(
      stream_->launch(fill, config,
                      ParameterPacker(fill.info()).add(pointer).add(value).add(count).bytes(), {}),
      CUDA_SUCCESS);
  std::vector<std::uint32_t> words(1024, 0);
  ASSERT_EQ(stream_->copyDeviceToHost(words.data(), pointer, words.size() * 4), CUDA_SUCCESS);
  ASSERT_EQ(finish(*stream_), CUDA_SUCCESS);
  EXPECT_TRUE(std::all_of(words.begin(), words.end(), [](std::uint32_t w) { return w == 42; }));
  auto [spinStatus, spinTime] = spin(*stream_, 1'000'000);
  EXPECT_EQ(await(spinStatus), CUDA_SUCCESS);
  EXPECT_GT(spinTime.get(), 0u);
}

#else

TEST(CudaKernelTest, NeedsTheTestKernels) {
  GTEST_SKIP() << "the gpuproxy_test_kernels target did not exist when this was configured";
}

#endif  // GPUPROXY_HAVE_TEST_KERNELS

}  // namespace
}  // namespace gpuproxy::server::cuda

int main(int argc, char** argv) {
  return gpuproxy::testing::runGpuTests(argc, argv, gpuproxy::server::cuda::gBackend);
}
