// The sim runs the PTX nvcc builds from tests/programs/kernels/test_kernels.cu: the same image a
// GPU would load, with the same results.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <vector>

#include "server/backend/sim/sim_backend.hpp"

#if __has_include("test_kernels_ptx.hpp")
#include "test_kernels_ptx.hpp"
#define GPUPROXY_HAVE_TEST_KERNELS 1
#endif

namespace gpuproxy::server::sim {
namespace {

#ifdef GPUPROXY_HAVE_TEST_KERNELS

using backend::Function;
using backend::LaunchConfig;

std::span<const std::byte> ptxImage() {
  // With the terminating NUL, as cuModuleLoadData reads it.
  return {reinterpret_cast<const std::byte*>(gpuproxy::testing::kTestKernelsPtx),
          sizeof(gpuproxy::testing::kTestKernelsPtx)};
}

template <typename... Args>
std::vector<std::byte> pack(const Function& function, Args... args) {
  const backend::FunctionInfo& info = function.info();
  std::vector<std::byte> buffer(info.parameterBytes);
  std::size_t index = 0;
  auto put = [&](const auto& value) {
    ASSERT_LT(index, info.parameters.size());
    ASSERT_EQ(info.parameters[index].size, sizeof(value));
    std::memcpy(buffer.data() + info.parameters[index].offset, &value, sizeof(value));
    ++index;
  };
  (put(args), ...);
  EXPECT_EQ(index, info.parameters.size());
  return buffer;
}

CUresult synchronize(backend::Stream& stream) {
  auto promise = std::make_shared<std::promise<CUresult>>();
  std::future<CUresult> done = promise->get_future();
  const CUresult queued =
      stream.addCallback([promise](CUresult status) { promise->set_value(status); });
  return queued != CUDA_SUCCESS ? queued : done.get();
}

LaunchConfig config(unsigned grid, unsigned block) {
  LaunchConfig launch;
  launch.grid.x = grid;
  launch.block.x = block;
  return launch;
}

TEST(SimKernels, RunsTheNvccPtx) {
  auto backend = newSimBackend({});
  auto device = std::move(backend->openDevice(0)).value();
  auto loaded = device->loadModule(ptxImage());
  ASSERT_TRUE(loaded.ok()) << "the sim refused " << gpuproxy::testing::kTestKernelsPtxPath << ": "
                           << loaded.code();
  auto module = std::move(loaded).value();
  auto stream = std::move(device->createStream(0, 0)).value();

  // vector_add over 1M elements, every element checked.
  constexpr int kCount = 1 << 20;
  constexpr std::size_t kBytes = kCount * sizeof(float);
  std::vector<float> a(kCount);
  std::vector<float> b(kCount);
  for (int i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i) * 0.25f;
    b[i] = 1000.0f - static_cast<float>(i % 977);
  }
  const CUdeviceptr deviceA = device->allocate(kBytes).value();
  const CUdeviceptr deviceB = device->allocate(kBytes).value();
  const CUdeviceptr deviceC = device->allocate(kBytes).value();
  ASSERT_EQ(stream->copyHostToDevice(deviceA, a.data(), kBytes), CUDA_SUCCESS);
  ASSERT_EQ(stream->copyHostToDevice(deviceB, b.data(), kBytes), CUDA_SUCCESS);
  Function& add = *module->function("vector_add").value();
  ASSERT_EQ(add.info().parameterBytes, 28u);
  ASSERT_EQ(stream->launch(add, config(kCount / 256, 256),
                           pack(add, deviceA, deviceB, deviceC, kCount), {}),
            CUDA_SUCCESS);
  std::vector<float> c(kCount, -1.0f);
  ASSERT_EQ(stream->copyDeviceToHost(c.data(), deviceC, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream), CUDA_SUCCESS);
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(c[i], a[i] + b[i]) << "element " << i;

  // fill_u32.
  Function& fill = *module->function("fill_u32").value();
  ASSERT_EQ(
      stream->launch(fill, config(kCount / 512, 512),
                     pack(fill, deviceC, 0xc0ffeeu, static_cast<unsigned long long>(kCount)), {}),
      CUDA_SUCCESS);
  std::vector<std::uint32_t> filled(kCount);
  ASSERT_EQ(stream->copyDeviceToHost(filled.data(), deviceC, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream), CUDA_SUCCESS);
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(filled[i], 0xc0ffeeu) << "element " << i;

  // spin occupies the engine for at least the time asked.
  Function& spin = *module->function("spin").value();
  constexpr unsigned long long kSpinNs = 25'000'000;
  std::promise<std::uint64_t> measured;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(stream->launch(spin, config(1, 32), pack(spin, kSpinNs),
                           [&](CUresult status, std::uint64_t ns) {
                             EXPECT_EQ(status, CUDA_SUCCESS);
                             measured.set_value(ns);
                           }),
            CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream), CUDA_SUCCESS);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::nanoseconds(kSpinNs));
  EXPECT_GE(measured.get_future().get(), kSpinNs);

  // trap poisons the device; reset() recovers it.
  Function& trap = *module->function("trap").value();
  ASSERT_EQ(trap.info().parameterBytes, 0u);
  ASSERT_EQ(stream->launch(trap, config(1, 1), {}, {}), CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(device->stickyError(), CUDA_ERROR_ILLEGAL_ADDRESS);
  stream.reset();
  module.reset();
  ASSERT_EQ(device->reset(), CUDA_SUCCESS);
  EXPECT_EQ(device->stickyError(), CUDA_SUCCESS);
  auto reloaded = device->loadModule(ptxImage());
  ASSERT_TRUE(reloaded.ok());
  auto fresh = device->createStream(0, 0);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(synchronize(*fresh.value()), CUDA_SUCCESS);
}

// Host memory registered with the device (pinned memory) is device-mapped: kernels read and write
// it at its own address. Once unregistered, or for any other host address, the kernel faults with
// a sticky error instead of touching it.
TEST(SimKernels, KernelsUseRegisteredHostMemoryAndFaultOutsideIt) {
  auto backend = newSimBackend({});
  auto device = std::move(backend->openDevice(0)).value();
  auto module = std::move(device->loadModule(ptxImage())).value();
  auto stream = std::move(device->createStream(0, 0)).value();
  Function& fill = *module->function("fill_u32").value();
  constexpr unsigned long long kCount = 4096;
  std::vector<std::uint32_t> host(kCount + 1024, 0);
  const auto pointer = reinterpret_cast<CUdeviceptr>(host.data());

  ASSERT_EQ(device->registerHostMemory(host.data(), kCount * 4), CUDA_SUCCESS);
  EXPECT_EQ(device->registerHostMemory(host.data() + 16, 64),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  ASSERT_EQ(
      stream->launch(fill, config(kCount / 128, 128), pack(fill, pointer, 0xabcdu, kCount), {}),
      CUDA_SUCCESS);
  ASSERT_EQ(synchronize(*stream), CUDA_SUCCESS);
  for (unsigned long long i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 0xabcdu) << "word " << i;
  EXPECT_EQ(host[kCount], 0u);

  // One word past the registered range: the launch faults there and that word is not written
  // (blocks that ran before the fault wrote theirs, as on a GPU).
  ASSERT_EQ(
      stream->launch(fill, config(kCount / 128 + 1, 128), pack(fill, pointer, 7u, kCount + 1), {}),
      CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(host[kCount], 0u);
  const std::uint32_t before = host[0];
  stream.reset();
  ASSERT_EQ(device->reset(), CUDA_SUCCESS);

  ASSERT_EQ(device->unregisterHostMemory(host.data()), CUDA_SUCCESS);
  EXPECT_EQ(device->unregisterHostMemory(host.data()), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  auto fresh = std::move(device->createStream(0, 0)).value();
  ASSERT_EQ(fresh->launch(fill, config(1, 32), pack(fill, pointer, 9u, 32ull), {}), CUDA_SUCCESS);
  EXPECT_EQ(synchronize(*fresh), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(host[0], before);
}

#else

TEST(SimKernels, RunsTheNvccPtx) {
  GTEST_SKIP() << "test_kernels_ptx.hpp not generated (nvcc missing at configure time)";
}

#endif

}  // namespace
}  // namespace gpuproxy::server::sim
