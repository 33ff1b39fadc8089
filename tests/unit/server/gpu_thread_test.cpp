// Each GPU served by a thread of its own (GpuThread): its shard lives there, and a GPU whose
// thread is busy holds up no other GPU.
#include "server/daemon/gpu_thread.hpp"

#include "server/backend/sim/sim_backend.hpp"
#include "server/gpu/gpu_messages.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace gpuproxy::server {
namespace {

class GpuThreadTest : public ::testing::Test {
protected:
  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~GpuThreadTest() noexcept override {}

  template <typename T>
  T wait(kj::Promise<T> promise) {
    return promise.wait(io_->waitScope);
  }

  // Held by pointer: kj's destructors may throw, which a gtest fixture's destructor may not.
  std::unique_ptr<kj::AsyncIoContext> io_ =
      std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo());
  std::unique_ptr<backend::Backend> backend_ = sim::newSimBackend(sim::SimOptions{2, 1ull << 30});
};

TEST_F(GpuThreadTest, TheShardIsOwnedByItsGpusThreadAndNoOther) {
  std::unique_ptr<GpuThread> gpu0 = GpuThread::start(*backend_, 0).value();
  std::unique_ptr<GpuThread> gpu1 = GpuThread::start(*backend_, 1).value();
  ASSERT_NE(gpu0, nullptr);
  ASSERT_NE(gpu1, nullptr);
  EXPECT_NE(gpu0->threadId(), gpu1->threadId());
  EXPECT_NE(gpu0->threadId(), std::this_thread::get_id());
  EXPECT_FALSE(gpu0->shard().owner().isCurrent());
  const auto ranOn = wait(onGpu(gpu1->shard(), [](GpuShard& gpu) {
    return std::make_pair(std::this_thread::get_id(), gpu.owner().isCurrent());
  }));
  EXPECT_EQ(ranOn.first, gpu1->threadId());
  EXPECT_TRUE(ranOn.second);
  EXPECT_EQ(gpu1->shard().index(), 1u);
}

TEST_F(GpuThreadTest, AGpuWhoseThreadIsBusyHoldsUpNoOtherGpu) {
  std::unique_ptr<GpuThread> gpu0 = GpuThread::start(*backend_, 0).value();
  std::unique_ptr<GpuThread> gpu1 = GpuThread::start(*backend_, 1).value();
  // GPU 0's thread is kept busy until GPU 1 has run a message: with one thread for both, GPU 1's
  // message would only run after GPU 0's had given up waiting.
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto busy = onGpu(gpu0->shard(), [released](GpuShard&) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!released->load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return released->load();
  });
  const std::thread::id releasedOn = wait(onGpu(gpu1->shard(), [released](GpuShard&) {
    released->store(true);
    return std::this_thread::get_id();
  }));
  EXPECT_EQ(releasedOn, gpu1->threadId());
  EXPECT_TRUE(wait(kj::mv(busy)));
}

TEST_F(GpuThreadTest, ADeviceThatCannotBeOpenedStartsNoThread) {
  const auto started = GpuThread::start(*backend_, 7);
  EXPECT_FALSE(started.ok());
  EXPECT_EQ(started.code(), CUDA_ERROR_INVALID_DEVICE);
}

}  // namespace
}  // namespace gpuproxy::server
