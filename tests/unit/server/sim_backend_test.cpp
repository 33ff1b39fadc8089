// The sim backend through the backend interface, as the daemon uses it.

#include "server/backend/sim/sim_backend.hpp"
#include "test_kernels_ptx.hpp"
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace gpuproxy::server::sim {
namespace {

using backend::Backend;
using backend::Device;
using backend::Event;
using backend::Function;
using backend::LaunchConfig;
using backend::Module;
using backend::Stream;

constexpr std::uint64_t kGiB = 1ull << 30;
constexpr std::uint64_t kMiB = 1ull << 20;

// The test kernels, as nvcc builds them from tests/programs/kernels/test_kernels.cu.
const std::string_view kTestKernels = gpuproxy::testing::kTestKernelsPtx;

std::span<const std::byte> bytesOf(std::string_view text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

// Packs arguments at the offsets the function's layout gives.
template <typename... Args>
std::vector<std::byte> pack(const Function& function, Args... args) {
  const backend::FunctionInfo& info = function.info();
  std::vector<std::byte> buffer(info.parameterBytes);
  std::size_t index = 0;
  auto put = [&](const auto& value) {
    EXPECT_LT(index, info.parameters.size());
    if (index >= info.parameters.size()) return;
    EXPECT_EQ(info.parameters[index].size, sizeof(value));
    std::memcpy(buffer.data() + info.parameters[index].offset, &value, sizeof(value));
    ++index;
  };
  (put(args), ...);
  EXPECT_EQ(index, info.parameters.size());
  return buffer;
}

LaunchConfig config(unsigned grid, unsigned block) {
  LaunchConfig launch;
  launch.grid.x = grid;
  launch.block.x = block;
  return launch;
}

// Waits for everything queued on `stream` so far; the status the callback saw.
CUresult synchronize(Stream& stream) {
  auto promise = std::make_shared<std::promise<CUresult>>();
  std::future<CUresult> done = promise->get_future();
  const CUresult queued =
      stream.addCallback([promise](CUresult status) { promise->set_value(status); });
  if (queued != CUDA_SUCCESS) return queued;
  return done.get();
}

// Holds the device's engine inside a host callback until released, so a test decides exactly what
// is pending. (Real callbacks must be quick; this one blocks on purpose.)
class EngineGate {
public:
  explicit EngineGate(Stream& stream) {
    auto opened = opened_.get_future().share();
    EXPECT_EQ(stream.addCallback([opened](CUresult) { opened.wait(); }), CUDA_SUCCESS);
  }
  ~EngineGate() { open(); }
  void open() {
    if (!isOpen_) opened_.set_value();
    isOpen_ = true;
  }

private:
  std::promise<void> opened_;
  bool isOpen_ = false;
};

// Hand-written kernels that hold the engine. `hold`: each block's first thread sets *started and
// waits until *go is not 0. `count_before_signal`: each block's first thread sets *started,
// counts the block in *before if *signal is still 0, and sleeps a millisecond while *go is 0.
// `until_flag`: sets *started, then spins (no nanosleep) until *flag is not 0. `forever`: sets
// *started (when not null), then never ends on its own.
const std::string kHoldingKernelsPtx = R"(.version 8.0
.target sm_75
.address_size 64
.visible .entry hold(.param .u64 started, .param .u64 go)
{
  .reg .b32 %r<3>;
  .reg .b64 %rd<3>;
  .reg .pred %p<2>;
  mov.u32 %r1, %tid.x;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra $done;
  ld.param.u64 %rd1, [started];
  ld.param.u64 %rd2, [go];
  mov.u32 %r2, 1;
  st.volatile.global.u32 [%rd1], %r2;
$wait:
  ld.volatile.global.u32 %r2, [%rd2];
  setp.eq.u32 %p1, %r2, 0;
  @%p1 bra $wait;
$done:
  ret;
}
.visible .entry count_before_signal(.param .u64 started, .param .u64 signal, .param .u64 before, .param .u64 go)
{
  .reg .b32 %r<3>;
  .reg .b64 %rd<5>;
  .reg .pred %p<2>;
  mov.u32 %r1, %tid.x;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra $end;
  ld.param.u64 %rd1, [started];
  ld.param.u64 %rd2, [signal];
  ld.param.u64 %rd3, [before];
  ld.param.u64 %rd4, [go];
  mov.u32 %r2, 1;
  st.volatile.global.u32 [%rd1], %r2;
  ld.volatile.global.u32 %r2, [%rd2];
  setp.ne.u32 %p1, %r2, 0;
  @%p1 bra $counted;
  atom.global.add.u32 %r2, [%rd3], 1;
$counted:
  ld.volatile.global.u32 %r2, [%rd4];
  setp.ne.u32 %p1, %r2, 0;
  @%p1 bra $end;
  nanosleep.u32 1000000;
$end:
  ret;
}
.visible .entry until_flag(.param .u64 started, .param .u64 flag)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<3>;
  .reg .pred %p<2>;
  ld.param.u64 %rd2, [started];
  mov.u32 %r1, 1;
  st.volatile.global.u32 [%rd2], %r1;
  ld.param.u64 %rd1, [flag];
$poll:
  ld.volatile.global.u32 %r1, [%rd1];
  setp.eq.u32 %p1, %r1, 0;
  @%p1 bra $poll;
  ret;
}
.visible .entry forever(.param .u64 started)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<2>;
  .reg .pred %p<2>;
  ld.param.u64 %rd1, [started];
  mov.u32 %r1, 1;
  setp.eq.u64 %p1, %rd1, 0;
  @%p1 bra $again;
  st.volatile.global.u32 [%rd1], %r1;
$again:
  add.u32 %r1, %r1, 1;
  bra.uni $again;
}
)";

// A page of host memory registered for `owner`'s kernels, whose words are flags kernels and the
// test set for each other: address(i) is word i for a kernel, word(i) for the test.
class HostFlags {
public:
  HostFlags(Device& device, backend::AddressSpace owner) : device_(device) {
    EXPECT_EQ(device.registerHostMemory(words_, sizeof(words_), owner), CUDA_SUCCESS);
  }
  ~HostFlags() { EXPECT_EQ(device_.unregisterHostMemory(words_), CUDA_SUCCESS); }
  HostFlags(const HostFlags&) = delete;
  HostFlags& operator=(const HostFlags&) = delete;

  CUdeviceptr address(std::size_t index) { return reinterpret_cast<CUdeviceptr>(&words_[index]); }
  std::atomic_ref<std::uint32_t> word(std::size_t index) {
    return std::atomic_ref<std::uint32_t>(words_[index]);
  }
  // Whether a kernel set word `index` within a minute.
  bool waitUntilSet(std::size_t index) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (word(index).load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    return word(index).load() != 0;
  }

private:
  Device& device_;
  alignas(4096) std::uint32_t words_[1024] = {};
};

// A launch of `hold`, whose flags are host memory registered for `owner`: launch() returns once
// one of its blocks runs, go() lets them all end (the destructor does, too).
class HeldKernel {
public:
  HeldKernel(Device& device, backend::AddressSpace owner) : flags_(device, owner) {
    auto module = device.loadModule(bytesOf(kHoldingKernelsPtx));
    EXPECT_TRUE(module.ok()) << module.code();
    if (module.ok()) module_ = std::move(module).value();
  }
  ~HeldKernel() { go(); }
  HeldKernel(const HeldKernel&) = delete;
  HeldKernel& operator=(const HeldKernel&) = delete;

  // False (and let go) when the launch fails or none of its blocks runs within a minute.
  bool launch(Stream& stream, unsigned blocks, backend::KernelCallback done) {
    if (!module_) return false;
    Function& hold = *module_->function("hold").value();
    const CUresult launched =
        stream.launch(hold, config(blocks, 32),
                      pack(hold, flags_.address(kStarted), flags_.address(kGo)), std::move(done));
    if (launched != CUDA_SUCCESS) return false;
    if (flags_.waitUntilSet(kStarted)) return true;
    go();
    return false;
  }
  void go() { flags_.word(kGo).store(1); }

private:
  static constexpr std::size_t kStarted = 0;  // a block started
  static constexpr std::size_t kGo = 1;
  HostFlags flags_;  // destroyed after the module: the kernel's last blocks may still read it
  std::unique_ptr<Module> module_;
};

std::uint64_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0;
  std::uint64_t resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

class SimTest : public ::testing::Test {
protected:
  void SetUp() override { open({}); }

  void open(SimOptions options) {
    stream_.reset();
    module_.reset();
    device_.reset();
    backend_ = newSimBackend(options);
    auto device = backend_->openDevice(0);
    ASSERT_TRUE(device.ok()) << device.code();
    device_ = std::move(device).value();
    auto stream = device_->createStream(0, 0);
    ASSERT_TRUE(stream.ok());
    stream_ = std::move(stream).value();
    auto module = device_->loadModule(bytesOf(kTestKernels));
    ASSERT_TRUE(module.ok()) << module.code();
    module_ = std::move(module).value();
  }

  Function& kernel(std::string_view name) {
    auto function = module_->function(name);
    EXPECT_TRUE(function.ok());
    return *function.value();
  }

  CUdeviceptr allocate(std::size_t bytes) {
    auto pointer = device_->allocate(bytes);
    EXPECT_TRUE(pointer.ok()) << pointer.code();
    return pointer.ok() ? pointer.value() : 0;
  }

  std::unique_ptr<Stream> newStream() {
    auto stream = device_->createStream(CU_STREAM_NON_BLOCKING, 0);
    EXPECT_TRUE(stream.ok());
    return stream.ok() ? std::move(stream).value() : nullptr;
  }

  std::unique_ptr<Event> newEvent(unsigned flags = 0) {
    auto event = device_->createEvent(flags);
    EXPECT_TRUE(event.ok());
    return event.ok() ? std::move(event).value() : nullptr;
  }

  CUresult launchSpin(Stream& stream, std::uint64_t ns, backend::KernelCallback done = {}) {
    Function& spin = kernel("spin");
    return stream.launch(spin, config(1, 1), pack(spin, ns), std::move(done));
  }

  CUresult launchTrap(Stream& stream, backend::KernelCallback done = {}) {
    return stream.launch(kernel("trap"), config(1, 1), {}, std::move(done));
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Module> module_;
  std::unique_ptr<Stream> stream_;
};

// ---- backend and device identity -----------------------------------------------------------

TEST(SimBackend, SaysWhatItIs) {
  auto backend = newSimBackend({.devices = 2, .memoryBytes = 4 * kGiB});
  EXPECT_EQ(backend->name(), "sim");
  EXPECT_EQ(backend->driverVersion(), CUDA_VERSION);
  EXPECT_EQ(backend->deviceCount(), 2);
  EXPECT_EQ(backend->openDevice(2).code(), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(backend->openDevice(-1).code(), CUDA_ERROR_INVALID_DEVICE);

  auto first = backend->openDevice(0);
  auto second = backend->openDevice(1);
  ASSERT_TRUE(first.ok() && second.ok());
  const backend::DeviceProperties& properties = first.value()->properties();
  EXPECT_EQ(properties.name, "gpuproxy sim device 0");
  EXPECT_EQ(second.value()->properties().name, "gpuproxy sim device 1");
  EXPECT_EQ(properties.totalMemory, 4 * kGiB);
  EXPECT_NE(properties.uuid, second.value()->properties().uuid);
  // Stable: another backend instance reports the same UUID for the same index.
  auto again = newSimBackend({})->openDevice(0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value()->properties().uuid, properties.uuid);
}

TEST(SimBackend, RejectsBadOptions) {
  EXPECT_THROW(newSimBackend({.devices = -1}), std::invalid_argument);
  EXPECT_THROW(newSimBackend({.devices = 1, .memoryBytes = 0}), std::invalid_argument);
  EXPECT_THROW(newSimBackend({.devices = 1, .memoryBytes = 2ull << 40}), std::invalid_argument);
  EXPECT_EQ(newSimBackend({.devices = 0})->deviceCount(), 0);
  // A compute capability no GPU the sim models has.
  EXPECT_THROW(newSimBackend({.computeCapability = 91}), std::invalid_argument);
  EXPECT_THROW(newSimBackend({.computeCapability = 0}), std::invalid_argument);
}

// Told to, a device reports another compute capability (so that libraries pick the builds of
// their kernels made for it); everything else is still an H100's.
TEST(SimBackend, ReportsTheComputeCapabilityItIsToldTo) {
  auto device = newSimBackend({.computeCapability = 120})->openDevice(0);
  ASSERT_TRUE(device.ok());
  std::map<int, int> attributes(device.value()->properties().attributes.begin(),
                                device.value()->properties().attributes.end());
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR], 12);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR], 0);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT], 132);
}

TEST(SimBackend, AnswersEveryAttributeLikeAnH100) {
  auto device = newSimBackend({})->openDevice(0);
  ASSERT_TRUE(device.ok());
  std::map<int, int> attributes;
  for (const auto& [attribute, value] : device.value()->properties().attributes) {
    EXPECT_TRUE(attributes.emplace(attribute, value).second) << "duplicate " << attribute;
  }
  for (int attribute = 1; attribute < CU_DEVICE_ATTRIBUTE_MAX; ++attribute) {
    EXPECT_TRUE(attributes.contains(attribute)) << "missing attribute " << attribute;
  }
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR], 9);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR], 0);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT], 132);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK], 1024);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z], 64);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X], 2147483647);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y], 65535);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_WARP_SIZE], 32);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK], 48 * 1024);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN], 227 * 1024);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK], 65536);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING], 1);
  EXPECT_EQ(attributes[CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS], 1);
  EXPECT_GT(attributes[CU_DEVICE_ATTRIBUTE_CLOCK_RATE], 0);
}

TEST(SimBackend, RefusesAnSmPartitionItCouldNotMake) {
  auto backend = newSimBackend({});
  backend::DeviceOptions options;
  options.bestEffortSms = 64;
  EXPECT_EQ(backend->openDevice(0, options).code(), CUDA_ERROR_NOT_SUPPORTED);
  options = {};
  options.bestEffortPercent = 50;
  EXPECT_EQ(backend->openDevice(0, options).code(), CUDA_ERROR_NOT_SUPPORTED);
  auto plain = backend->openDevice(0, backend::DeviceOptions{});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain.value()->smPartition().enabled);
}

TEST(SimBackend, StreamsKeepTheirPriorityClampedToTheRangeOfCurrentGpus) {
  auto device = newSimBackend({})->openDevice(0);
  ASSERT_TRUE(device.ok());
  const backend::StreamPriorityRange range = device.value()->streamPriorityRange();
  EXPECT_EQ(range.least, 0);
  EXPECT_EQ(range.greatest, -5);
  for (const auto& [asked, kept] :
       std::vector<std::pair<int, int>>{{0, 0}, {-3, -3}, {-5, -5}, {-9, -5}, {4, 0}}) {
    auto stream = device.value()->createStreamFor(backend::TenantClass::kLatencyCritical, 0, asked);
    ASSERT_TRUE(stream.ok());
    EXPECT_EQ(stream.value()->priority(), kept) << asked;
  }
  auto daemons = device.value()->createStream(0, -2);
  ASSERT_TRUE(daemons.ok());
  EXPECT_EQ(daemons.value()->priority(), -2);
}

// ---- memory ---------------------------------------------------------------------------------

TEST_F(SimTest, AllocationsAreAlignedDistinctAndAccountedExactly) {
  const backend::MemoryInfo before = device_->memoryInfo();
  EXPECT_EQ(before.total, 16 * kGiB);
  EXPECT_EQ(before.free, 16 * kGiB);
  std::set<CUdeviceptr> seen;
  std::uint64_t charged = 0;
  for (std::size_t bytes : {1, 255, 256, 257, 1000, 4096, 12345}) {
    const CUdeviceptr pointer = allocate(bytes);
    EXPECT_NE(pointer, 0u);
    EXPECT_EQ(pointer % 256, 0u) << bytes;
    EXPECT_GE(pointer, kSimAddressBase);
    EXPECT_LT(pointer, kSimAddressBase + kSimAddressStride);
    EXPECT_TRUE(seen.insert(pointer).second);
    charged += (bytes + 255) / 256 * 256;
    EXPECT_EQ(device_->memoryInfo().free, 16 * kGiB - charged);
  }
  for (CUdeviceptr pointer : seen) EXPECT_EQ(device_->free(pointer), CUDA_SUCCESS);
  EXPECT_EQ(device_->memoryInfo().free, 16 * kGiB);
}

TEST_F(SimTest, RejectsZeroBadFreesAndOverCapacity) {
  EXPECT_EQ(device_->allocate(0).code(), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(device_->allocate(16 * kGiB + 1).code(), CUDA_ERROR_OUT_OF_MEMORY);
  const CUdeviceptr pointer = allocate(1024);
  EXPECT_EQ(device_->free(pointer + 256), CUDA_ERROR_INVALID_VALUE);  // inside, not the start
  EXPECT_EQ(device_->free(0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(device_->free(0x1234), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(device_->free(pointer), CUDA_SUCCESS);
  EXPECT_EQ(device_->free(pointer), CUDA_ERROR_INVALID_VALUE);  // double free
  // A bad free is a client mistake, not a GPU fault.
  EXPECT_EQ(device_->stickyError(), CUDA_SUCCESS);
}

TEST_F(SimTest, FreeRangesCoalesce) {
  open({.devices = 1, .memoryBytes = 1 * kMiB});
  const std::size_t quarter = 256 * 1024;
  CUdeviceptr blocks[4];
  for (CUdeviceptr& block : blocks) block = allocate(quarter);
  EXPECT_EQ(device_->memoryInfo().free, 0u);
  EXPECT_EQ(device_->allocate(1).code(), CUDA_ERROR_OUT_OF_MEMORY);
  // Two adjacent quarters freed separately make room for one half.
  ASSERT_EQ(device_->free(blocks[2]), CUDA_SUCCESS);
  ASSERT_EQ(device_->free(blocks[1]), CUDA_SUCCESS);
  auto half = device_->allocate(2 * quarter);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(half.value(), std::min(blocks[1], blocks[2]));
  ASSERT_EQ(device_->free(half.value()), CUDA_SUCCESS);
  ASSERT_EQ(device_->free(blocks[0]), CUDA_SUCCESS);
  ASSERT_EQ(device_->free(blocks[3]), CUDA_SUCCESS);
  auto whole = device_->allocate(1 * kMiB);
  ASSERT_TRUE(whole.ok()) << "free ranges did not coalesce back into the whole device";
  EXPECT_EQ(device_->memoryInfo().free, 0u);
}

TEST_F(SimTest, LargeAllocationsCostNoRamAndFreedPagesComeBack) {
  const std::uint64_t before = residentBytes();
  const CUdeviceptr big = allocate(8 * kGiB);
  ASSERT_NE(big, 0u);
  EXPECT_EQ(device_->memoryInfo().free, 8 * kGiB);
  EXPECT_LT(residentBytes(), before + 64 * kMiB);

  // Write 64 MiB into it: that much becomes resident, and freeing gives it back.
  {
    std::vector<std::uint8_t> host(64 * kMiB, 0x5a);
    ASSERT_EQ(stream_->copyHostToDevice(big, host.data(), host.size()), CUDA_SUCCESS);
    ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  }
  const std::uint64_t written = residentBytes();
  EXPECT_GE(written, before + 48 * kMiB);
  ASSERT_EQ(device_->free(big), CUDA_SUCCESS);
  // The pages go back off the caller's thread, before the range can be handed out again: by the
  // time an allocation that needs its range succeeds (all of the device), they are gone.
  const CUdeviceptr again = allocate(device_->memoryInfo().total);
  ASSERT_NE(again, 0u);
  EXPECT_LE(residentBytes(), written - 48 * kMiB);
  ASSERT_EQ(device_->free(again), CUDA_SUCCESS);
}

TEST_F(SimTest, CopiesRoundTrip) {
  constexpr std::size_t kBytes = 1 << 20;
  std::vector<std::uint8_t> source(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) source[i] = static_cast<std::uint8_t>(i * 7 + 3);
  const CUdeviceptr a = allocate(kBytes);
  const CUdeviceptr b = allocate(kBytes);
  std::vector<std::uint8_t> back(kBytes, 0);
  ASSERT_EQ(stream_->copyHostToDevice(a, source.data(), kBytes), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToDevice(b, a, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(back.data(), b, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(back, source);

  // Interior ranges and overlapping device-to-device copies.
  ASSERT_EQ(stream_->copyDeviceToDevice(b + 1, b, 1000), CUDA_SUCCESS);
  std::vector<std::uint8_t> slice(1001);
  ASSERT_EQ(stream_->copyDeviceToHost(slice.data(), b, slice.size()), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(slice[0], source[0]);
  for (std::size_t i = 1; i < slice.size(); ++i) ASSERT_EQ(slice[i], source[i - 1]) << i;
  EXPECT_EQ(stream_->copyHostToDevice(a, nullptr, 4), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(SimTest, MemsetWritesElementsOfEachWidth) {
  const CUdeviceptr buffer = allocate(64);
  std::vector<std::uint8_t> back(64);
  ASSERT_EQ(stream_->memset(buffer, 0xab, 1, 64), CUDA_SUCCESS);
  ASSERT_EQ(stream_->memset(buffer + 8, 0xbeef, 2, 4), CUDA_SUCCESS);
  ASSERT_EQ(stream_->memset(buffer + 32, 0x01020304, 4, 2), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(back.data(), buffer, back.size()), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  std::vector<std::uint8_t> expected(64, 0xab);
  for (int i = 0; i < 4; ++i) {
    expected[8 + 2 * i] = 0xef;
    expected[9 + 2 * i] = 0xbe;
  }
  for (int i = 0; i < 2; ++i) {
    expected[32 + 4 * i] = 0x04;
    expected[33 + 4 * i] = 0x03;
    expected[34 + 4 * i] = 0x02;
    expected[35 + 4 * i] = 0x01;
  }
  EXPECT_EQ(back, expected);
  EXPECT_EQ(stream_->memset(buffer + 1, 0, 2, 1), CUDA_ERROR_INVALID_VALUE);  // misaligned
  EXPECT_EQ(stream_->memset(buffer + 2, 0, 4, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stream_->memset(buffer, 0, 3, 1), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(SimTest, Memset2DWritesEveryRowAndNothingBetween) {
  // 4 rows of 3 16-bit elements, 16 bytes apart, in a buffer of 64 bytes of 0x11.
  const CUdeviceptr buffer = allocate(64);
  ASSERT_EQ(stream_->memset(buffer, 0x11, 1, 64), CUDA_SUCCESS);
  ASSERT_EQ(stream_->enqueue(backend::Memset2D{buffer + 2, 16, 0xbeef, 2, 3, 4}), CUDA_SUCCESS);
  std::vector<std::uint8_t> back(64);
  ASSERT_EQ(stream_->copyDeviceToHost(back.data(), buffer, back.size()), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  std::vector<std::uint8_t> expected(64, 0x11);
  for (int row = 0; row < 4; ++row) {
    for (int element = 0; element < 3; ++element) {
      expected[2 + 16 * row + 2 * element] = 0xef;
      expected[3 + 16 * row + 2 * element] = 0xbe;
    }
  }
  EXPECT_EQ(back, expected);
  // The driver's rules: aligned rows, a pitch that holds a row; the pitch of one row is unused.
  EXPECT_EQ(stream_->enqueue(backend::Memset2D{buffer + 1, 16, 0, 2, 3, 4}),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stream_->enqueue(backend::Memset2D{buffer, 6, 0, 4, 3, 2}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stream_->enqueue(backend::Memset2D{buffer, 18, 0, 4, 3, 2}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stream_->enqueue(backend::Memset2D{buffer, 0, 0, 4, 3, 1}), CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*stream_), CUDA_SUCCESS);
}

// ---- streams, ordering, callbacks ------------------------------------------------------------

TEST_F(SimTest, StreamsAreFifo) {
  const CUdeviceptr value = allocate(4);
  std::uint32_t seen = 0;
  std::vector<int> order;
  std::mutex mutex;
  auto note = [&](int step) {
    return [&, step](CUresult status) {
      EXPECT_EQ(status, CUDA_SUCCESS);
      std::lock_guard lock(mutex);
      order.push_back(step);
    };
  };
  ASSERT_EQ(launchSpin(*stream_, 20'000'000), CUDA_SUCCESS);  // later work must still wait
  ASSERT_EQ(stream_->addCallback(note(1)), CUDA_SUCCESS);
  ASSERT_EQ(stream_->memset(value, 1, 4, 1), CUDA_SUCCESS);
  ASSERT_EQ(stream_->addCallback(note(2)), CUDA_SUCCESS);
  ASSERT_EQ(stream_->memset(value, 2, 4, 1), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(&seen, value, 4), CUDA_SUCCESS);
  ASSERT_EQ(stream_->addCallback(note(3)), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(seen, 2u);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST_F(SimTest, StreamsInterleaveInSubmissionOrder) {
  auto other = newStream();
  std::vector<std::string> order;
  std::mutex mutex;
  auto note = [&](std::string step) {
    return [&, step](CUresult) {
      std::lock_guard lock(mutex);
      order.push_back(step);
    };
  };
  {
    EngineGate gate(*stream_);
    ASSERT_EQ(stream_->addCallback(note("a1")), CUDA_SUCCESS);
    ASSERT_EQ(other->addCallback(note("b1")), CUDA_SUCCESS);
    // A long kernel on one stream holds up its own stream's later work, not the other stream's,
    // which runs beside it as on a GPU (before its one block, here).
    ASSERT_EQ(launchSpin(*stream_, 10'000'000, [&](CUresult, std::uint64_t) { note("spin")({}); }),
              CUDA_SUCCESS);
    ASSERT_EQ(other->addCallback(note("b2")), CUDA_SUCCESS);
    ASSERT_EQ(stream_->addCallback(note("a2")), CUDA_SUCCESS);
  }
  ASSERT_EQ(synchronize(*other), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(order, (std::vector<std::string>{"a1", "b1", "b2", "spin", "a2"}));
}

// A GPU dispatches a higher-priority stream's kernels first, and gives the SMs that free up to
// their blocks before a running lower-priority kernel's next ones (cuStreamCreateWithPriority).
// Copies and the like go in submission order whatever their stream's priority, as a GPU's copy
// engines run them beside kernels: an urgent kernel never overtakes the copy of its input that a
// pageable cudaMemcpy left on the NULL stream.
TEST_F(SimTest, AMoreUrgentStreamsReadyKernelGoesFirstButNotBeforeEarlierCopies) {
  auto lessUrgent = device_->createStream(CU_STREAM_NON_BLOCKING, 0);
  auto moreUrgent = device_->createStream(CU_STREAM_NON_BLOCKING, -3);
  auto other = newStream();
  ASSERT_TRUE(lessUrgent.ok() && moreUrgent.ok() && other);
  const CUdeviceptr input = allocate(4);
  std::vector<std::string> order;
  std::mutex mutex;
  auto note = [&](std::string step) {
    return [&, step](CUresult status, std::uint64_t = 0) {
      EXPECT_EQ(status, CUDA_SUCCESS) << step;
      std::lock_guard lock(mutex);
      order.push_back(step);
    };
  };
  {
    EngineGate gate(*stream_);
    ASSERT_EQ(launchSpin(*lessUrgent.value(), 1000, note("less urgent kernel")), CUDA_SUCCESS);
    ASSERT_EQ(other->memset(input, 5, 4, 1), CUDA_SUCCESS);
    ASSERT_EQ(other->addCallback([&](CUresult status) { note("copy")(status); }), CUDA_SUCCESS);
    ASSERT_EQ(launchSpin(*moreUrgent.value(), 1000, note("more urgent kernel")), CUDA_SUCCESS);
  }
  ASSERT_EQ(synchronize(*lessUrgent.value()), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*moreUrgent.value()), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*other), CUDA_SUCCESS);
  EXPECT_EQ(order, (std::vector<std::string>{"copy", "more urgent kernel", "less urgent kernel"}));
}

TEST_F(SimTest, AMoreUrgentStreamsKernelRunsBetweenTheBlocksOfALessUrgentOne) {
  auto lessUrgent = device_->createStream(CU_STREAM_NON_BLOCKING, 0);
  auto moreUrgent = device_->createStream(CU_STREAM_NON_BLOCKING, -5);
  ASSERT_TRUE(lessUrgent.ok() && moreUrgent.ok());
  std::vector<std::string> order;
  std::mutex mutex;
  auto note = [&](std::string step) {
    return [&, step](CUresult status, std::uint64_t) {
      EXPECT_EQ(status, CUDA_SUCCESS) << step;
      std::lock_guard lock(mutex);
      order.push_back(step);
    };
  };
  HeldKernel held(*device_, backend::kDaemonAddressSpace);
  // Surely running, with most of its blocks still to start, when the more urgent one is launched.
  ASSERT_TRUE(held.launch(*lessUrgent.value(), 64, note("less urgent")));
  const CUdeviceptr buffer = allocate(32 * 4);
  Function& fill = kernel("fill_u32");
  ASSERT_EQ(moreUrgent.value()->launch(fill, config(1, 32), pack(fill, buffer, 7u, 32ull),
                                       note("more urgent")),
            CUDA_SUCCESS);
  held.go();
  ASSERT_EQ(synchronize(*lessUrgent.value()), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*moreUrgent.value()), CUDA_SUCCESS);
  EXPECT_EQ(order, (std::vector<std::string>{"more urgent", "less urgent"}));
  std::uint32_t filled = 0;
  ASSERT_EQ(stream_->copyDeviceToHost(&filled, buffer + 31 * 4, 4), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(filled, 7u);
}

// A client that goes while its kernel runs between the blocks of another client's kernel has that
// kernel stopped, and only that one: the kernel it interrupted goes on to its end.
TEST_F(SimTest, AGoneClientsKernelStopsButNotTheKernelItInterrupted) {
  constexpr backend::AddressSpace kStaying = 1;
  constexpr backend::AddressSpace kGoing = 2;
  auto staying = device_->createStreamFor(backend::TenantClass::kBestEffort, CU_STREAM_NON_BLOCKING,
                                          0, kStaying);
  auto going = device_->createStreamFor(backend::TenantClass::kBestEffort, CU_STREAM_NON_BLOCKING,
                                        -5, kGoing);
  ASSERT_TRUE(staying.ok() && going.ok());
  auto module = device_->loadModule(bytesOf(kHoldingKernelsPtx));
  ASSERT_TRUE(module.ok()) << module.code();
  Function& forever = *module.value()->function("forever").value();
  HostFlags goingStarted(*device_, kGoing);
  auto stayingDone = std::make_shared<std::promise<CUresult>>();
  auto goingDone = std::make_shared<std::promise<CUresult>>();
  HeldKernel held(*device_, kStaying);
  ASSERT_TRUE(held.launch(*staying.value(), 64, [stayingDone](CUresult status, std::uint64_t) {
    stayingDone->set_value(status);
  }));
  ASSERT_EQ(going.value()->launch(
                forever, config(1, 1), pack(forever, goingStarted.address(0)),
                [goingDone](CUresult status, std::uint64_t) { goingDone->set_value(status); }),
            CUDA_SUCCESS);
  held.go();
  EXPECT_TRUE(goingStarted.waitUntilSet(0)) << "the more urgent kernel never ran";
  device_->abandonWorkOf(kGoing);
  std::future<CUresult> goingStatus = goingDone->get_future();
  std::future<CUresult> stayingStatus = stayingDone->get_future();
  ASSERT_EQ(goingStatus.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(goingStatus.get(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  ASSERT_EQ(stayingStatus.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(stayingStatus.get(), CUDA_SUCCESS);
}

// A GPU's copy engines copy while its SMs run another stream's kernel: another stream's copies,
// memsets and callback all run between the blocks of a long kernel, byte-exact whatever their
// alignment and overlap, and the kernel's later blocks see what a memset wrote.
TEST_F(SimTest, AnotherStreamsCopiesRunBesideALongKernel) {
  auto copying = newStream();
  auto module = device_->loadModule(bytesOf(kHoldingKernelsPtx));
  ASSERT_TRUE(module.ok()) << module.code();
  Function& count = *module.value()->function("count_before_signal").value();
  HostFlags flags(*device_, backend::kDaemonAddressSpace);  // [0]: a block started; [1]: go
  const CUdeviceptr signal = allocate(4);
  const CUdeviceptr before = allocate(4);
  constexpr std::size_t kBuffer = 4096;
  const CUdeviceptr buffer = allocate(kBuffer);
  ASSERT_EQ(stream_->memset(buffer, 0, 1, kBuffer), CUDA_SUCCESS);
  ASSERT_EQ(stream_->memset(signal, 0, 4, 1), CUDA_SUCCESS);
  ASSERT_EQ(stream_->memset(before, 0, 4, 1), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);

  // At least 16 s of blocks (8 on each of two cores) until the test lets them go.
  constexpr unsigned kBlocks = 1u << 14;
  auto kernelDone = std::make_shared<std::promise<CUresult>>();
  ASSERT_EQ(stream_->launch(
                count, config(kBlocks, 32),
                pack(count, flags.address(0), signal, before, flags.address(1)),
                [kernelDone](CUresult status, std::uint64_t) { kernelDone->set_value(status); }),
            CUDA_SUCCESS);
  ASSERT_TRUE(flags.waitUntilSet(0)) << "the kernel never ran";

  // What the copies below leave in the buffer, worked out on the host.
  alignas(8) std::array<std::uint8_t, 1104> pattern;
  for (std::size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = static_cast<std::uint8_t>(i * 7 + 1);
  std::vector<std::uint8_t> expected(kBuffer, 0);
  std::memmove(&expected[3], &pattern[1], 1001);    // source and destination misaligned
  std::memmove(&expected[10], &expected[3], 1001);  // overlapping, the destination after
  std::memmove(&expected[2048], &pattern[0], 901);  // both aligned, a tail of 5 bytes
  for (std::size_t i = 0; i < 301; ++i) {           // 16-bit elements from mid-word
    expected[3002 + 2 * i] = 0xef;
    expected[3002 + 2 * i + 1] = 0xbe;
  }
  std::vector<std::uint8_t> copied(kBuffer, 0xff);
  ASSERT_EQ(copying->copyHostToDevice(buffer + 3, &pattern[1], 1001), CUDA_SUCCESS);
  ASSERT_EQ(copying->copyDeviceToDevice(buffer + 10, buffer + 3, 1001), CUDA_SUCCESS);
  ASSERT_EQ(copying->copyHostToDevice(buffer + 2048, &pattern[0], 901), CUDA_SUCCESS);
  ASSERT_EQ(copying->memset(buffer + 3002, 0xbeef, 2, 301), CUDA_SUCCESS);
  ASSERT_EQ(copying->copyDeviceToHost(copied.data(), buffer, kBuffer), CUDA_SUCCESS);

  std::uint32_t signalSeen = 0;
  auto copiesDone = std::make_shared<std::promise<CUresult>>();
  ASSERT_EQ(copying->memset(signal, 1, 4, 1), CUDA_SUCCESS);
  ASSERT_EQ(copying->copyDeviceToHost(&signalSeen, signal, 4), CUDA_SUCCESS);
  ASSERT_EQ(copying->addCallback([copiesDone](CUresult status) { copiesDone->set_value(status); }),
            CUDA_SUCCESS);
  std::future<CUresult> copies = copiesDone->get_future();
  std::future<CUresult> kernel = kernelDone->get_future();
  ASSERT_EQ(copies.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const bool kernelStillRan = kernel.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  EXPECT_EQ(copies.get(), CUDA_SUCCESS);
  EXPECT_EQ(signalSeen, 1u);
  EXPECT_EQ(copied, expected);
  EXPECT_TRUE(kernelStillRan) << "the copies waited for the other stream's kernel to end";

  flags.word(1).store(1);
  ASSERT_EQ(kernel.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(kernel.get(), CUDA_SUCCESS);
  std::uint32_t blocksBefore = 0;
  ASSERT_EQ(stream_->copyDeviceToHost(&blocksBefore, before, 4), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_GT(blocksBefore, 0u);
  EXPECT_LT(blocksBefore, kBlocks) << "no block of the kernel saw the memset's value";
}

// A kernel of one block that waits for what another stream's memset writes ends, as on a GPU,
// whose copy engines need no SM: the memset runs between two turns of the block's warps. So does
// a cooperative kernel's, between two rounds of its blocks' turns.
TEST_F(SimTest, AKernelWaitingForAnotherStreamsMemsetEnds) {
  auto setting = newStream();
  auto module = device_->loadModule(bytesOf(kHoldingKernelsPtx));
  ASSERT_TRUE(module.ok()) << module.code();
  Function& wait = *module.value()->function("until_flag").value();
  HostFlags started(*device_, backend::kDaemonAddressSpace);
  const CUdeviceptr flag = allocate(4);
  for (const bool cooperative : {false, true}) {
    SCOPED_TRACE(cooperative ? "cooperative, two blocks" : "one block");
    started.word(0).store(0);
    ASSERT_EQ(stream_->memset(flag, 0, 4, 1), CUDA_SUCCESS);
    backend::LaunchConfig launch = config(cooperative ? 2 : 1, 1);
    launch.cooperative = cooperative;
    auto kernelDone = std::make_shared<std::promise<CUresult>>();
    ASSERT_EQ(stream_->launch(
                  wait, launch, pack(wait, started.address(0), flag),
                  [kernelDone](CUresult status, std::uint64_t) { kernelDone->set_value(status); }),
              CUDA_SUCCESS);
    // Spinning inside the kernel before the memset is queued.
    ASSERT_TRUE(started.waitUntilSet(0)) << "the kernel never ran";
    ASSERT_EQ(setting->memset(flag, 1, 4, 1), CUDA_SUCCESS);
    std::future<CUresult> kernel = kernelDone->get_future();
    const bool ended = kernel.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    if (!ended) device_->abandonWorkOf(backend::kDaemonAddressSpace);  // stops it, to end the test
    ASSERT_TRUE(ended) << "the memset waited for the kernel that waited for it";
    EXPECT_EQ(kernel.get(), CUDA_SUCCESS);
    EXPECT_EQ(synchronize(*setting), CUDA_SUCCESS);
  }
}

TEST_F(SimTest, QueryReportsPendingWork) {
  EXPECT_EQ(stream_->query(), CUDA_SUCCESS);
  auto other = newStream();
  {
    EngineGate gate(*stream_);
    ASSERT_EQ(other->addCallback([](CUresult) {}), CUDA_SUCCESS);
    EXPECT_EQ(stream_->query(), CUDA_ERROR_NOT_READY);
    EXPECT_EQ(other->query(), CUDA_ERROR_NOT_READY);
  }
  ASSERT_EQ(synchronize(*other), CUDA_SUCCESS);
  // synchronize() returns from inside the stream's last callback, and a stream is idle only once
  // that has returned (as with cuLaunchHostFunc): the streams become idle, not necessarily yet.
  EXPECT_TRUE(gpuproxy::testing::eventually([&] { return stream_->query() == CUDA_SUCCESS; }));
  EXPECT_TRUE(gpuproxy::testing::eventually([&] { return other->query() == CUDA_SUCCESS; }));
}

TEST_F(SimTest, DestroyedStreamsAndEventsStillCompleteTheirWork) {
  const CUdeviceptr value = allocate(4);
  std::uint32_t seen = 0;
  std::promise<CUresult> streamDone;
  std::promise<CUresult> eventDone;
  {
    EngineGate gate(*stream_);
    auto doomed = newStream();
    auto event = newEvent();
    ASSERT_EQ(doomed->memset(value, 77, 4, 1), CUDA_SUCCESS);
    ASSERT_EQ(doomed->copyDeviceToHost(&seen, value, 4), CUDA_SUCCESS);
    ASSERT_EQ(doomed->record(*event), CUDA_SUCCESS);
    ASSERT_EQ(doomed->addCallback([&](CUresult status) { streamDone.set_value(status); }),
              CUDA_SUCCESS);
    event->whenComplete([&](CUresult status) { eventDone.set_value(status); });
    // Launch from a module that goes away before the kernel runs.
    module_.reset();
  }
  EXPECT_EQ(streamDone.get_future().get(), CUDA_SUCCESS);
  EXPECT_EQ(eventDone.get_future().get(), CUDA_SUCCESS);
  EXPECT_EQ(seen, 77u);
}

TEST_F(SimTest, LaunchesOutliveTheirModule) {
  std::promise<CUresult> done;
  {
    EngineGate gate(*stream_);
    Function& fill = kernel("fill_u32");
    const CUdeviceptr buffer = allocate(16);
    ASSERT_EQ(stream_->launch(fill, config(1, 4), pack(fill, buffer, 9u, 4ull),
                              [&](CUresult status, std::uint64_t) { done.set_value(status); }),
              CUDA_SUCCESS);
    module_.reset();
  }
  EXPECT_EQ(done.get_future().get(), CUDA_SUCCESS);
}

// ---- events ------------------------------------------------------------------------------------

TEST_F(SimTest, EventsQueryWaitAndTime) {
  auto start = newEvent();
  auto stop = newEvent();
  EXPECT_EQ(stop->query(), CUDA_SUCCESS);  // never recorded
  EXPECT_EQ(stop->elapsedSince(*start).code(), CUDA_ERROR_INVALID_HANDLE);

  auto consumer = newStream();
  const CUdeviceptr value = allocate(4);
  std::uint32_t seen = 0;
  std::promise<CUresult> completed;
  {
    EngineGate gate(*stream_);
    ASSERT_EQ(stream_->record(*start), CUDA_SUCCESS);
    ASSERT_EQ(launchSpin(*stream_, 20'000'000), CUDA_SUCCESS);
    ASSERT_EQ(stream_->memset(value, 0x2a, 4, 1), CUDA_SUCCESS);
    ASSERT_EQ(stream_->record(*stop), CUDA_SUCCESS);
    stop->whenComplete([&](CUresult status) { completed.set_value(status); });
    // The consumer stream reads only after the producer's record.
    ASSERT_EQ(consumer->wait(*stop), CUDA_SUCCESS);
    ASSERT_EQ(consumer->copyDeviceToHost(&seen, value, 4), CUDA_SUCCESS);
    EXPECT_EQ(stop->query(), CUDA_ERROR_NOT_READY);
    EXPECT_EQ(stop->elapsedSince(*start).code(), CUDA_ERROR_NOT_READY);
  }
  ASSERT_EQ(synchronize(*consumer), CUDA_SUCCESS);
  EXPECT_EQ(seen, 0x2au);
  EXPECT_EQ(completed.get_future().get(), CUDA_SUCCESS);
  EXPECT_EQ(stop->query(), CUDA_SUCCESS);
  auto elapsed = stop->elapsedSince(*start);
  ASSERT_TRUE(elapsed.ok());
  EXPECT_GE(elapsed.value(), 20.0f);

  // whenComplete on a completed record runs at once.
  bool ranAtOnce = false;
  stop->whenComplete([&](CUresult status) { ranAtOnce = status == CUDA_SUCCESS; });
  EXPECT_TRUE(ranAtOnce);
}

TEST_F(SimTest, EventsWithoutTimingOrRecordHaveNoElapsedTime) {
  auto timed = newEvent();
  auto untimed = newEvent(CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(stream_->record(*timed), CUDA_SUCCESS);
  ASSERT_EQ(stream_->record(*untimed), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(untimed->elapsedSince(*timed).code(), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(timed->elapsedSince(*untimed).code(), CUDA_ERROR_INVALID_HANDLE);
  auto never = newEvent();
  EXPECT_EQ(timed->elapsedSince(*never).code(), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(device_->createEvent(0x80).code(), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(device_->createEvent(CU_EVENT_INTERPROCESS).code(), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(SimTest, WaitingOnAnUnrecordedEventDoesNotBlock) {
  auto event = newEvent();
  ASSERT_EQ(stream_->wait(*event), CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*stream_), CUDA_SUCCESS);
}

// ---- kernels ---------------------------------------------------------------------------------

TEST_F(SimTest, KernelTimeIsMeasuredOnTheEngine) {
  std::promise<std::pair<CUresult, std::uint64_t>> done;
  ASSERT_EQ(launchSpin(*stream_, 30'000'000,
                       [&](CUresult status, std::uint64_t ns) {
                         done.set_value({status, ns});
                       }),
            CUDA_SUCCESS);
  const auto [status, ns] = done.get_future().get();
  EXPECT_EQ(status, CUDA_SUCCESS);
  EXPECT_GE(ns, 30'000'000u);
}

TEST_F(SimTest, KernelsCoverOnlyLaunchedThreads) {
  constexpr std::uint32_t kCount = 1000;
  const CUdeviceptr a = allocate(kCount * 4);
  const CUdeviceptr b = allocate(kCount * 4);
  const CUdeviceptr c = allocate(kCount * 4);
  std::vector<float> hostA(kCount);
  std::vector<float> hostB(kCount);
  for (std::uint32_t i = 0; i < kCount; ++i) {
    hostA[i] = static_cast<float>(i);
    hostB[i] = 0.5f * static_cast<float>(i);
  }
  ASSERT_EQ(stream_->copyHostToDevice(a, hostA.data(), kCount * 4), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyHostToDevice(b, hostB.data(), kCount * 4), CUDA_SUCCESS);
  ASSERT_EQ(stream_->memset(c, 0xdeadbeef, 4, kCount), CUDA_SUCCESS);
  Function& add = kernel("vector_add");
  // 2 blocks of 256 threads along x cover 512 elements; y and z repeat the same indices.
  LaunchConfig launch = config(2, 256);
  launch.grid.y = 3;
  launch.block.z = 2;
  ASSERT_EQ(stream_->launch(add, launch, pack(add, a, b, c, static_cast<std::int32_t>(kCount)), {}),
            CUDA_SUCCESS);
  std::vector<std::uint32_t> result(kCount);
  ASSERT_EQ(stream_->copyDeviceToHost(result.data(), c, kCount * 4), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  for (std::uint32_t i = 0; i < kCount; ++i) {
    if (i < 512) {
      float value = 0;
      std::memcpy(&value, &result[i], 4);
      ASSERT_EQ(value, hostA[i] + hostB[i]) << i;
    } else {
      ASSERT_EQ(result[i], 0xdeadbeefu) << i;
    }
  }

  Function& fill = kernel("fill_u32");
  ASSERT_EQ(stream_->launch(fill, config(3, 100), pack(fill, c, 7u, 1000ull), {}), CUDA_SUCCESS);
  ASSERT_EQ(stream_->copyDeviceToHost(result.data(), c, kCount * 4), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  for (std::uint32_t i = 0; i < kCount; ++i) ASSERT_EQ(result[i] == 7u, i < 300) << i;
}

TEST_F(SimTest, LaunchConfigurationIsValidatedLikeTheDriver) {
  Function& spin = kernel("spin");
  const auto parameters = pack(spin, std::uint64_t{0});
  auto launchWith = [&](backend::Dim3 grid, backend::Dim3 block, unsigned shared = 0) {
    LaunchConfig launch;
    launch.grid = grid;
    launch.block = block;
    launch.sharedMemBytes = shared;
    return stream_->launch(spin, launch, parameters, {});
  };
  EXPECT_EQ(launchWith({1, 1, 1}, {1024, 1, 1}), CUDA_SUCCESS);
  EXPECT_EQ(launchWith({1, 1, 1}, {32, 32, 1}), CUDA_SUCCESS);
  EXPECT_EQ(launchWith({1, 1, 1}, {1, 1, 64}), CUDA_SUCCESS);
  EXPECT_EQ(launchWith({2147483647, 65535, 65535}, {1, 1, 1}), CUDA_SUCCESS);
  // Up to the opt-in limit: the stub holds each kernel to its own (cuFuncSetAttribute) limit.
  EXPECT_EQ(launchWith({1, 1, 1}, {1, 1, 1}, 227 * 1024), CUDA_SUCCESS);

  EXPECT_EQ(launchWith({1, 1, 1}, {1025, 1, 1}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({1, 1, 1}, {1024, 2, 1}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({1, 1, 1}, {1, 1, 65}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({1, 1, 1}, {0, 1, 1}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({0, 1, 1}, {1, 1, 1}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({1, 65536, 1}, {1, 1, 1}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({1, 1, 65536}, {1, 1, 1}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({2147483648u, 1, 1}, {1, 1, 1}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launchWith({1, 1, 1}, {1, 1, 1}, 227 * 1024 + 1), CUDA_ERROR_INVALID_VALUE);
  // The parameter buffer must be exactly the kernel's.
  EXPECT_EQ(stream_->launch(spin, config(1, 1), std::vector<std::byte>(4), {}),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stream_->launch(spin, config(1, 1), std::vector<std::byte>(16), {}),
            CUDA_ERROR_INVALID_VALUE);
  // The largest grid would take the sim days to run: drop it, and whatever else is queued.
  stream_.reset();
  module_.reset();
  EXPECT_EQ(device_->reset(), CUDA_SUCCESS);
  EXPECT_EQ(device_->stickyError(), CUDA_SUCCESS);
}

// ---- modules ---------------------------------------------------------------------------------

TEST_F(SimTest, ModuleLayoutComesFromThePtx) {
  const backend::FunctionInfo& add = kernel("vector_add").info();
  ASSERT_EQ(add.parameters.size(), 4u);
  EXPECT_EQ(add.parameters[3].offset, 24u);
  EXPECT_EQ(add.parameters[3].size, 4u);
  EXPECT_EQ(add.parameterBytes, 28u);
  const backend::FunctionInfo& fill = kernel("fill_u32").info();
  ASSERT_EQ(fill.parameters.size(), 3u);
  EXPECT_EQ(fill.parameters[2].offset, 16u);
  EXPECT_EQ(fill.parameterBytes, 24u);
  EXPECT_EQ(kernel("trap").info().parameterBytes, 0u);
  EXPECT_EQ(add.maxThreadsPerBlock, 1024);
  EXPECT_EQ(module_->function("nope").code(), CUDA_ERROR_NOT_FOUND);
}

// PTX declares virtual registers, far more than ptxas allocates; what a kernel reports is capped
// where ptxas must make it fit, so that no launch a GPU would take is refused for registers.
TEST_F(SimTest, KernelsReportTheRegistersTheirLaunchBoundsAllow) {
  const std::string header = ".version 8.0\n.target sm_80\n.address_size 64\n";
  auto registersOf = [&](const std::string& directives, const std::string& registers) {
    auto module = device_->loadModule(bytesOf(header + ".visible .entry k(.param .u64 a)" +
                                              directives + "\n{\n" + registers + "\n ret;\n}\n"));
    EXPECT_TRUE(module.ok());
    return module.ok() ? module.value()->function("k").value()->info().numRegs : -1;
  };
  EXPECT_EQ(registersOf("", ".reg .b32 %r<12>;"), 12);
  // No bounds: a 1024-thread block fits.
  EXPECT_EQ(registersOf("", ".reg .b32 %r<2000>;"), 64);
  // .maxntid 384: 65536 / 384, in steps of 8.
  EXPECT_EQ(registersOf(".maxntid 384, 1, 1", ".reg .b32 %r<2000>;"), 168);
  EXPECT_EQ(registersOf(".maxntid 256, 1, 1 .minnctapersm 2", ".reg .b32 %r<2000>;"), 128);
  EXPECT_EQ(registersOf(".maxnreg 40", ".reg .b32 %r<2000>;"), 40);
  EXPECT_EQ(registersOf(".maxntid 32, 1, 1", ".reg .b32 %r<2000>;"), 255);
}

TEST_F(SimTest, ModuleLoadErrors) {
  const std::string header = ".version 8.0\n.target sm_75\n.address_size 64\n";
  auto load = [&](const std::string& image) { return device_->loadModule(bytesOf(image)).code(); };
  // Any kernel the interpreter can run loads.
  EXPECT_EQ(load(header + ".visible .entry matmul(.param .u64 a) { ret; }"), CUDA_SUCCESS);
  // Valid PTX the interpreter does not execute is refused at load, not at launch.
  EXPECT_EQ(load(header + ".visible .entry t(.param .u64 a) {\n .reg .f32 %f<5>;\n"
                          " .reg .b64 %rd<2>;\n"
                          " .reg .b32 %r<2>;\n"
                          " tex.2dms.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r1, %r1, %r1}];"
                          "\n ret;\n}"),
            CUDA_ERROR_NOT_SUPPORTED);
  // Malformed PTX, and bytes that are not PTX at all.
  EXPECT_EQ(load(header + ".visible .entry spin(.param .u64 ns { ret; }"), CUDA_ERROR_INVALID_PTX);
  EXPECT_EQ(load("definitely not a module"), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(device_->loadModule({}).code(), CUDA_ERROR_INVALID_IMAGE);
  // Machine code is what a GPU of another kind could run, not this one; a fatbin is read for
  // its PTX (tests/integration/fatbin_images_test.cpp), and one cut short is no image at all; a
  // wrapper's pointer means nothing in the daemon.
  EXPECT_EQ(load(std::string("\x7f"
                             "ELF\x02\x01\x01\x33",
                             8)),
            CUDA_ERROR_NO_BINARY_FOR_GPU);
  EXPECT_EQ(load(std::string("\x50\xed\x55\xba\x01\x00\x10\x00", 8)), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(load(std::string("\xb1\x43\x62\x46\x01\x00\x10\x00", 8)), CUDA_ERROR_INVALID_IMAGE);
  // A module of device functions only has no kernels, which is fine.
  auto empty = device_->loadModule(bytesOf(header + ".func helper() { ret; }"));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty.value()->function("spin").code(), CUDA_ERROR_NOT_FOUND);
}

// As a GPU loads any module, the sim loads one of which some kernel can run: the kernels it can
// run launch and run, and launching one it cannot is refused (CUDA_ERROR_NOT_SUPPORTED) without
// touching the stream.
TEST_F(SimTest, AModuleLoadsWhenAnyOfItsKernelsCanRunAndOnlyTheOthersAreRefused) {
  const std::string ptx =
      ".version 8.0\n.target sm_90\n.address_size 64\n"
      ".global .align 4 .u32 m = 1;\n"
      ".visible .entry tma() {\n .reg .b32 %r<2>;\n"
      " mbarrier.expect_tx.relaxed.cta.shared.b64 [%r1], 256;\n ret;\n}\n"
      ".visible .entry bump() {\n .reg .b32 %r<3>;\n ld.global.u32 %r1, [m];\n"
      " add.u32 %r2, %r1, 1;\n st.global.u32 [m], %r2;\n ret;\n}\n";
  auto loaded = device_->loadModule(bytesOf(ptx));
  ASSERT_TRUE(loaded.ok()) << loaded.code();
  Module& module = *loaded.value();
  auto tma = module.function("tma");
  ASSERT_TRUE(tma.ok());  // found, with its parameters, as a GPU has it
  EXPECT_EQ(stream_->launch(*tma.value(), config(1, 1), {}, {}), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(stream_->launch(*module.function("bump").value(), config(1, 1), {}, {}), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  std::uint32_t value = 0;
  ASSERT_EQ(stream_->copyDeviceToHost(&value, module.global("m").value().address, sizeof(value)),
            CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(value, 2u);
}

// ---- sticky faults ---------------------------------------------------------------------------

TEST_F(SimTest, TrapPoisonsTheDeviceUntilReset) {
  const CUdeviceptr value = allocate(4);
  ASSERT_EQ(stream_->memset(value, 5, 4, 1), CUDA_SUCCESS);
  auto other = newStream();
  auto event = newEvent();
  std::promise<std::pair<CUresult, std::uint64_t>> trapDone;
  std::promise<CUresult> laterDone;
  std::uint32_t seen = 0xffffffffu;
  {
    EngineGate gate(*stream_);
    ASSERT_EQ(launchTrap(*stream_,
                         [&](CUresult status, std::uint64_t ns) {
                           trapDone.set_value({status, ns});
                         }),
              CUDA_SUCCESS);
    // Queued before the fault, on another stream, behind a kernel (a copy alone might run beside
    // the faulting kernel, as on a GPU): completes with the fault and does nothing.
    ASSERT_EQ(launchSpin(*other, 1), CUDA_SUCCESS);
    ASSERT_EQ(other->copyDeviceToHost(&seen, value, 4), CUDA_SUCCESS);
    ASSERT_EQ(other->record(*event), CUDA_SUCCESS);
    ASSERT_EQ(other->addCallback([&](CUresult status) { laterDone.set_value(status); }),
              CUDA_SUCCESS);
  }
  EXPECT_EQ(trapDone.get_future().get().first, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(laterDone.get_future().get(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(seen, 0xffffffffu);

  EXPECT_EQ(device_->stickyError(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(stream_->query(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(event->query(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(device_->allocate(16).code(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(device_->createStream(0, 0).code(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(device_->createEvent(0).code(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(device_->loadModule(bytesOf(kTestKernels)).code(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(stream_->memset(value, 1, 4, 1), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(launchSpin(*stream_, 1), CUDA_ERROR_ILLEGAL_ADDRESS);

  // Recovery: the caller drops everything, then resets.
  event.reset();
  other.reset();
  stream_.reset();
  module_.reset();
  ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
  EXPECT_EQ(device_->stickyError(), CUDA_SUCCESS);
  EXPECT_EQ(device_->memoryInfo().free, device_->memoryInfo().total);
  auto stream = device_->createStream(0, 0);
  ASSERT_TRUE(stream.ok());
  stream_ = std::move(stream).value();
  auto module = device_->loadModule(bytesOf(kTestKernels));
  ASSERT_TRUE(module.ok());
  module_ = std::move(module).value();
  const CUdeviceptr fresh = allocate(16);
  Function& fill = kernel("fill_u32");
  ASSERT_EQ(stream_->launch(fill, config(1, 4), pack(fill, fresh, 3u, 4ull), {}), CUDA_SUCCESS);
  std::uint32_t filled[4] = {};
  ASSERT_EQ(stream_->copyDeviceToHost(filled, fresh, sizeof(filled)), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(filled[3], 3u);
}

// A __managed__ variable moves, with its value, into host memory its owner registered, and the
// module's kernels use it there; only before they have been launched.
TEST_F(SimTest, ManagedVariablesMoveIntoHostMemoryTheHostShares) {
  const std::string ptx =
      ".version 8.0\n.target sm_75\n.address_size 64\n"
      ".visible .global .attribute(.managed) .align 4 .u32 m = 5;\n"
      ".visible .global .align 4 .u32 plain;\n"
      ".visible .entry bump()\n{\n .reg .b32 %r<3>;\n ld.global.u32 %r1, [m];\n"
      " add.u32 %r2, %r1, 1;\n st.global.u32 [m], %r2;\n ret;\n}\n";
  auto loaded = device_->loadModule(bytesOf(ptx));
  ASSERT_TRUE(loaded.ok());
  Module& module = *loaded.value();
  auto before = module.global("m");
  ASSERT_TRUE(before.ok());
  EXPECT_TRUE(before.value().managed);
  EXPECT_FALSE(module.global("plain").value().managed);
  alignas(4096) static std::uint32_t shared[1024];
  ASSERT_EQ(device_->registerHostMemory(shared, sizeof(shared)), CUDA_SUCCESS);
  const auto address = reinterpret_cast<CUdeviceptr>(shared);
  EXPECT_EQ(module.placeManagedVariable("plain", address, false), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(module.placeManagedVariable("m", address + sizeof(shared), false),
            CUDA_ERROR_INVALID_VALUE);  // not registered memory
  ASSERT_EQ(module.placeManagedVariable("m", address, false), CUDA_SUCCESS);
  EXPECT_EQ(shared[0], 5u);
  EXPECT_EQ(module.global("m").value().address, address);
  Function& bump = *module.function("bump").value();
  ASSERT_EQ(stream_->launch(bump, config(1, 1), {}, {}), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(shared[0], 6u);
  EXPECT_EQ(module.placeManagedVariable("m", address + 64, true), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(device_->unregisterHostMemory(shared), CUDA_SUCCESS);
}

TEST_F(SimTest, RegisteredHostMemoryStaysRegisteredThroughAReset) {
  // Pinned host memory is the process's, not the context's (backend.hpp): a client that holds
  // some while another client's kernel poisons the device keeps it usable after the recovery.
  alignas(4096) static std::uint32_t pinned[1024];
  ASSERT_EQ(device_->registerHostMemory(pinned, sizeof(pinned)), CUDA_SUCCESS);
  ASSERT_EQ(launchTrap(*stream_), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_ERROR_ILLEGAL_ADDRESS);
  stream_.reset();
  module_.reset();
  ASSERT_EQ(device_->reset(), CUDA_SUCCESS);

  stream_ = newStream();
  ASSERT_NE(stream_, nullptr);
  auto module = device_->loadModule(bytesOf(kTestKernels));
  ASSERT_TRUE(module.ok());
  module_ = std::move(module).value();
  Function& fill = kernel("fill_u32");
  const auto address = reinterpret_cast<CUdeviceptr>(pinned);
  ASSERT_EQ(stream_->launch(fill, config(4, 256), pack(fill, address, 9u, 1024ull), {}),
            CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(pinned[0], 9u);
  EXPECT_EQ(pinned[1023], 9u);
  EXPECT_EQ(device_->registerHostMemory(pinned, sizeof(pinned)),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(device_->unregisterHostMemory(pinned), CUDA_SUCCESS);
}

TEST_F(SimTest, OutOfBoundsAccessIsAStickyFault) {
  const CUdeviceptr buffer = allocate(1000);
  std::vector<std::uint8_t> host(1001, 1);
  // One byte past the end of the allocation faults, like a real out-of-bounds access.
  ASSERT_EQ(stream_->copyHostToDevice(buffer, host.data(), 1001), CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*stream_), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(device_->stickyError(), CUDA_ERROR_ILLEGAL_ADDRESS);
  stream_.reset();
  module_.reset();
  ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
}

TEST_F(SimTest, KernelsFaultOnMemoryOutsideAllocations) {
  const CUdeviceptr small = allocate(64 * 4);
  const CUdeviceptr freed = allocate(64 * 4);
  ASSERT_EQ(device_->free(freed), CUDA_SUCCESS);
  Function& fill = kernel("fill_u32");
  std::promise<CUresult> done;
  // 65 elements into a 64-element buffer.
  ASSERT_EQ(stream_->launch(fill, config(1, 128), pack(fill, small, 1u, 65ull),
                            [&](CUresult status, std::uint64_t) { done.set_value(status); }),
            CUDA_SUCCESS);
  EXPECT_EQ(done.get_future().get(), CUDA_ERROR_ILLEGAL_ADDRESS);
  stream_.reset();
  module_.reset();
  ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
  open({});
  Function& fillAgain = kernel("fill_u32");
  ASSERT_EQ(stream_->launch(fillAgain, config(1, 64), pack(fillAgain, freed, 1u, 64ull), {}),
            CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*stream_), CUDA_ERROR_ILLEGAL_ADDRESS);  // use after free
}

// ---- teardown --------------------------------------------------------------------------------

TEST_F(SimTest, DestroyingTheDeviceAbandonsQueuedWorkAndCallsEveryCallback) {
  std::promise<CUresult> spinDone;
  std::promise<CUresult> callbackDone;
  std::promise<CUresult> eventDone;
  auto event = newEvent();
  // An hour-long kernel: the destructor must interrupt it, or this test times out.
  ASSERT_EQ(launchSpin(*stream_, 3600ull * 1'000'000'000,
                       [&](CUresult status, std::uint64_t) { spinDone.set_value(status); }),
            CUDA_SUCCESS);
  ASSERT_EQ(stream_->record(*event), CUDA_SUCCESS);
  event->whenComplete([&](CUresult status) { eventDone.set_value(status); });
  ASSERT_EQ(stream_->addCallback([&](CUresult status) { callbackDone.set_value(status); }),
            CUDA_SUCCESS);
  event.reset();
  stream_.reset();
  module_.reset();
  device_.reset();
  EXPECT_NE(spinDone.get_future().get(), CUDA_SUCCESS);
  EXPECT_NE(eventDone.get_future().get(), CUDA_SUCCESS);
  EXPECT_NE(callbackDone.get_future().get(), CUDA_SUCCESS);
}

TEST_F(SimTest, ResetInterruptsRunningWork) {
  std::promise<CUresult> spinDone;
  ASSERT_EQ(launchSpin(*stream_, 3600ull * 1'000'000'000,
                       [&](CUresult status, std::uint64_t) { spinDone.set_value(status); }),
            CUDA_SUCCESS);
  stream_.reset();
  module_.reset();
  ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
  EXPECT_EQ(spinDone.get_future().get(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(device_->stickyError(), CUDA_SUCCESS);
}

// The engine looks only at streams with work: 100,000 idle streams of one client slow neither
// another stream's work nor their own teardown nor the device's. (Before, each op scanned every
// stream, and each stream's destruction scanned them all again: minutes for this test.)
TEST_F(SimTest, IdleStreamsCostTheEngineNothing) {
  constexpr int kIdle = 100000;
  std::vector<std::unique_ptr<Stream>> idle;
  idle.reserve(kIdle);
  for (int i = 0; i < kIdle; ++i) {
    auto stream = device_->createStream(CU_STREAM_NON_BLOCKING, 0);
    ASSERT_TRUE(stream.ok());
    idle.push_back(std::move(stream).value());
  }
  const CUdeviceptr buffer = allocate(4096);
  auto done = std::async(std::launch::async, [&] {
    for (int i = 0; i < 5000; ++i) {
      EXPECT_EQ(stream_->memset(buffer, static_cast<std::uint32_t>(i), 4, 1024), CUDA_SUCCESS);
    }
    EXPECT_EQ(synchronize(*stream_), CUDA_SUCCESS);
    idle.clear();  // each stream's teardown is constant time
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "5000 ops beside 100000 idle streams took over a minute";
  std::uint32_t last = 0;
  ASSERT_EQ(stream_->copyDeviceToHost(&last, buffer + 4092, 4), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(last, 4999u);
}

// A kernel that never ends does not keep the device from being destroyed (the daemon's
// shutdown) or reset (a reclaim after a fault): the interpreter checks for a stop at every
// backward branch.
TEST_F(SimTest, AKernelInAnInfiniteLoopIsStoppedByShutdownAndReset) {
  for (const bool reset : {true, false}) {
    auto module = device_->loadModule(bytesOf(kHoldingKernelsPtx));
    ASSERT_TRUE(module.ok()) << module.code();
    Function& forever = *module.value()->function("forever").value();
    auto finished = std::make_shared<std::promise<CUresult>>();
    ASSERT_EQ(stream_->launch(
                  forever, config(8, 64), pack(forever, std::uint64_t{0}),
                  [finished](CUresult status, std::uint64_t) { finished->set_value(status); }),
              CUDA_SUCCESS);
    std::future<CUresult> status = finished->get_future();
    EXPECT_EQ(status.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
    stream_.reset();
    module.value().reset();
    module_.reset();
    if (reset) {
      ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
      open({});
    } else {
      device_.reset();
    }
    ASSERT_EQ(status.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_EQ(status.get(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  }
}

// Module variables are device memory of the module's owner, initialised from the PTX, found by
// name (cuModuleGetGlobal's answer), readable and writable by copies and by the module's kernels.
TEST_F(SimTest, ModuleGlobalsAreInitialisedDeviceMemory) {
  const std::string ptx = std::string(".version 8.0\n.target sm_75\n.address_size 64\n") + R"(
.global .align 4 .u32 counter = 41;
.const .align 4 .u32 table[4] = {10, 20, 30, 40};
.visible .entry bump(.param .u32 i) .maxntid 128, 1, 1
{
  .local .align 4 .b8 depot[32];
  .shared .align 4 .b8 tile[512];
  .reg .b32 %r<5>;
  .reg .b64 %rd<3>;
  ld.param.u32 %r1, [i];
  mul.wide.u32 %rd1, %r1, 4;
  mov.u64 %rd2, table;
  add.u64 %rd2, %rd2, %rd1;
  ld.const.u32 %r2, [%rd2];
  ld.global.u32 %r3, [counter];
  add.u32 %r4, %r3, %r2;
  st.global.u32 [counter], %r4;
  ret;
}
)";
  auto loaded = device_->loadModule(bytesOf(ptx));
  ASSERT_TRUE(loaded.ok()) << loaded.code();
  Module& module = *loaded.value();
  auto counter = module.global("counter");
  auto table = module.global("table");
  ASSERT_TRUE(counter.ok() && table.ok());
  EXPECT_EQ(counter.value().bytes, 4u);
  EXPECT_EQ(table.value().bytes, 16u);
  EXPECT_EQ(module.global("bump").code(), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(module.global("nothing").code(), CUDA_ERROR_NOT_FOUND);
  // The module's memory is charged like an allocation: its variables are device memory.
  EXPECT_GE(module.deviceBytes(), 256u);

  std::uint32_t values[4] = {};
  ASSERT_EQ(stream_->copyDeviceToHost(values, table.value().address, 16), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(values[2], 30u);
  // cudaMemcpyToSymbol's way: a copy to the variable's address changes what kernels see.
  const std::uint32_t fresh = 100;
  ASSERT_EQ(stream_->copyHostToDevice(counter.value().address, &fresh, 4), CUDA_SUCCESS);
  Function& bump = *module.function("bump").value();
  ASSERT_EQ(stream_->launch(bump, config(1, 1), pack(bump, std::uint32_t{3}), {}), CUDA_SUCCESS);
  std::uint32_t result = 0;
  ASSERT_EQ(stream_->copyDeviceToHost(&result, counter.value().address, 4), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream_), CUDA_SUCCESS);
  EXPECT_EQ(result, 140u);

  // What cuFuncGetAttribute reports, from the PTX.
  const backend::FunctionInfo& info = bump.info();
  EXPECT_EQ(info.maxThreadsPerBlock, 128);
  EXPECT_EQ(info.sharedSizeBytes, 512);
  EXPECT_EQ(info.localSizeBytes, 32);
  EXPECT_EQ(info.constSizeBytes, 16);
  EXPECT_GT(info.numRegs, 0);
  // As a GPU answers for JIT-compiled PTX: the virtual architecture the PTX targets (.target
  // sm_75), and the device's own as the code it runs (9.0). CUB picks its tuning by the first.
  EXPECT_EQ(info.ptxVersion, 75);
  EXPECT_EQ(info.binaryVersion, 90);
  // More threads than .maxntid allows is a launch error, as with the driver.
  EXPECT_EQ(stream_->launch(bump, config(1, 129), pack(bump, std::uint32_t{0}), {}),
            CUDA_ERROR_INVALID_VALUE);
}

// On the sim a kernel reaches only its own client's memory: a pointer into another address
// space's allocation or registered host memory faults (the sticky CUDA_ERROR_ILLEGAL_ADDRESS)
// and the other's bytes stay as they were.
TEST_F(SimTest, KernelsCannotTouchAnotherAddressSpacesMemory) {
  constexpr backend::AddressSpace kVictim = 1;
  constexpr backend::AddressSpace kAttacker = 2;
  alignas(4096) static std::uint32_t victimPinned[1024];
  std::fill(std::begin(victimPinned), std::end(victimPinned), 5u);
  ASSERT_EQ(device_->registerHostMemory(victimPinned, sizeof(victimPinned), kVictim), CUDA_SUCCESS);
  auto victimMemory = device_->allocate(1024, kVictim);
  auto attackerMemory = device_->allocate(1024, kAttacker);
  ASSERT_TRUE(victimMemory.ok() && attackerMemory.ok());
  const CUdeviceptr victimTargets[] = {victimMemory.value(),
                                       reinterpret_cast<CUdeviceptr>(victimPinned)};
  for (const CUdeviceptr target : victimTargets) {
    auto attackerStream =
        device_->createStreamFor(backend::TenantClass::kBestEffort, 0, 0, kAttacker);
    ASSERT_TRUE(attackerStream.ok());
    Stream& stream = *attackerStream.value();
    auto module = device_->loadModule(bytesOf(kTestKernels), kAttacker);
    ASSERT_TRUE(module.ok());
    Function& fill = *module.value()->function("fill_u32").value();
    // Its own memory: fine.
    ASSERT_EQ(stream.launch(fill, config(1, 64), pack(fill, attackerMemory.value(), 9u, 64ull), {}),
              CUDA_SUCCESS);
    ASSERT_EQ(synchronize(stream), CUDA_SUCCESS);
    // The victim's: a fault, with the offender named in the device's detail.
    ASSERT_EQ(stream.launch(fill, config(1, 64), pack(fill, target, 9u, 64ull), {}), CUDA_SUCCESS);
    EXPECT_EQ(synchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_NE(device_->stickyErrorDetail().find("address space 2"), std::string::npos)
        << device_->stickyErrorDetail();
    attackerStream.value().reset();
    module.value().reset();
    stream_.reset();
    module_.reset();
    ASSERT_EQ(device_->reset(), CUDA_SUCCESS);
    victimMemory = device_->allocate(1024, kVictim);
    attackerMemory = device_->allocate(1024, kAttacker);
    ASSERT_TRUE(victimMemory.ok() && attackerMemory.ok());
  }
  EXPECT_EQ(std::count(std::begin(victimPinned), std::end(victimPinned), 5u), 1024);
  EXPECT_EQ(device_->unregisterHostMemory(victimPinned), CUDA_SUCCESS);
}

TEST(SimDevices, AreIndependent) {
  auto backend = newSimBackend({.devices = 2, .memoryBytes = 1 * kGiB});
  auto first = std::move(backend->openDevice(0)).value();
  auto second = std::move(backend->openDevice(1)).value();
  auto a = first->allocate(256);
  auto b = second->allocate(256);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a.value(), kSimAddressBase);
  EXPECT_EQ(b.value(), kSimAddressBase + kSimAddressStride);
  EXPECT_EQ(second->free(a.value()), CUDA_ERROR_INVALID_VALUE);
  auto event = std::move(first->createEvent(0)).value();
  auto stream = std::move(second->createStream(0, 0)).value();
  EXPECT_EQ(stream->record(*event), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(stream->wait(*event), CUDA_ERROR_INVALID_HANDLE);
  // A fault on one device leaves the other alone.
  auto module = std::move(second->loadModule(bytesOf(kTestKernels))).value();
  ASSERT_EQ(stream->launch(*module->function("trap").value(), config(1, 1), {}, {}), CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(second->stickyError(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(first->stickyError(), CUDA_SUCCESS);
}

}  // namespace
}  // namespace gpuproxy::server::sim
