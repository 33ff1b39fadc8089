// A GPU reached only by message (server/gpu/gpu_messages.hpp), as a session reaches it: here the
// GpuShard lives on a thread of its own (GpuThread), with its own event loop, as every GPU does in
// the daemon, so that a call that touched the GPU's state from the caller's thread would trip
// the owner-thread check (or, under TSan, race).
#include "server/gpu/gpu_messages.hpp"

#include "server/backend/sim/sim_backend.hpp"
#include "server/daemon/gpu_thread.hpp"
#include "server/gpu/gpu_client.hpp"
#include "server/gpu/gpu_shard.hpp"
#include "server/tenant/tenant.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <kj/vector.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

namespace gpuproxy::server {
namespace {

class GpuMessagesTest : public ::testing::Test {
protected:
  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~GpuMessagesTest() noexcept override {}

  std::shared_ptr<ClientStats> newStats() {
    auto stats = std::make_shared<ClientStats>();
    stats->identity.pid = 4321;
    stats->tenant = tenant_;
    stats->addressSpace = 1;
    return stats;
  }

  template <typename T>
  T wait(kj::Promise<T> promise) {
    return promise.wait(io_->waitScope);
  }

  // Held by pointer: kj's destructors may throw, which a gtest fixture's destructor may not.
  std::unique_ptr<kj::AsyncIoContext> io_ =
      std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo());
  std::shared_ptr<Tenant> tenant_ =
      std::make_shared<Tenant>(1, TenantDefinition{"messages", "/unused", TenantLimits{}});
  std::unique_ptr<backend::Backend> backend_ = sim::newSimBackend(sim::SimOptions{1, 1ull << 30});
  std::unique_ptr<GpuThread> gpu_ = GpuThread::start(*backend_, 0).value();
};

TEST_F(GpuMessagesTest, WorkRunsOnTheGpusThreadAndItsAnswerComesBackHere) {
  const std::thread::id caller = std::this_thread::get_id();
  auto ran = wait(onGpu(gpu_->shard(), [](GpuShard& gpu) {
    return std::make_pair(std::this_thread::get_id(), gpu.owner().isCurrent());
  }));
  EXPECT_EQ(ran.first, gpu_->threadId());
  EXPECT_NE(ran.first, caller);
  EXPECT_TRUE(ran.second);
  // The caller's thread is not the GPU's: touching its state from here is our bug, and caught.
  EXPECT_FALSE(gpu_->shard().owner().isCurrent());
}

TEST_F(GpuMessagesTest, AClientMadeUsedAndDestroyedByMessageLeavesNothingBehind) {
  std::unique_ptr<GpuClient> client = wait(
      onGpu(gpu_->shard(), [stats = newStats()](GpuShard& gpu) { return gpu.openClient(stats); }));
  ASSERT_NE(client, nullptr);

  const backend::Result<Handle> context =
      wait(onGpu(*client, [](GpuClient& client) { return client.createContext(0); }));
  ASSERT_TRUE(context.ok());
  // An allocation runs on the GPU's blocking-call thread, whose answer reaches the GPU's thread
  // and then this one.
  const backend::Result<CUdeviceptr> pointer =
      wait(onGpu(*client, [context = context.value()](GpuClient& client) {
        return client.allocate(context, 1 << 20);
      }));
  ASSERT_TRUE(pointer.ok());

  const GpuStatus busy = wait(onGpu(gpu_->shard(), [](GpuShard& gpu) { return gpu.status(); }));
  EXPECT_EQ(busy.clients, 1u);
  EXPECT_GE(busy.memoryUsed, 1u << 20);
  EXPECT_GE(tenant_->memoryUsed(0), 1u << 20);

  // Destroyed on its GPU, after its work: as a session's teardown does.
  GpuClient& gone = *client;
  wait(onGpu(gone, [client = std::move(client)](GpuClient&) mutable {
    client->abandon();
    return client->drain().then([client = std::move(client)]() mutable { client.reset(); });
  }));
  const GpuStatus idle = wait(onGpu(gpu_->shard(), [](GpuShard& gpu) { return gpu.status(); }));
  EXPECT_EQ(idle.clients, 0u);
  EXPECT_EQ(idle.memoryUsed, 0u);
  EXPECT_EQ(tenant_->memoryUsed(0), 0u);
}

TEST_F(GpuMessagesTest, MessagesFromOneThreadRunInTheOrderSent) {
  auto order = std::make_shared<std::vector<int>>();
  kj::Vector<kj::Promise<void>> sent;
  for (int i = 0; i < 100; ++i) {
    sent.add(onGpu(gpu_->shard(), [order, i](GpuShard&) { order->push_back(i); }));
  }
  wait(kj::joinPromises(sent.releaseAsArray()));
  ASSERT_EQ(order->size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ((*order)[static_cast<std::size_t>(i)], i);
}

// Says on which thread it was destroyed.
class DestroyedOn {
public:
  explicit DestroyedOn(std::shared_ptr<std::promise<std::thread::id>> told)
      : told_(std::move(told)) {}
  ~DestroyedOn() { told_->set_value(std::this_thread::get_id()); }
  DestroyedOn(const DestroyedOn&) = delete;
  DestroyedOn& operator=(const DestroyedOn&) = delete;

private:
  std::shared_ptr<std::promise<std::thread::id>> told_;
};

TEST_F(GpuMessagesTest, StateMadeOnAGpuWhoseAnswerNobodyTakesIsDestroyedOnThatGpu) {
  // As when a session goes while its GpuClient is being opened: the answer is dropped unopened on
  // the session's thread, and what it holds must still go on its GPU's thread.
  auto told = std::make_shared<std::promise<std::thread::id>>();
  std::future<std::thread::id> destroyed = told->get_future();
  {
    MadeOnGpu<DestroyedOn> made = wait(onGpu(gpu_->shard(), [told](GpuShard& gpu) {
      return MadeOnGpu<DestroyedOn>(std::make_unique<DestroyedOn>(told), gpu.executor());
    }));
  }
  ASSERT_EQ(destroyed.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(destroyed.get(), gpu_->threadId());
}

TEST_F(GpuMessagesTest, StateMadeOnAGpuAndTakenIsTheTakers) {
  auto told = std::make_shared<std::promise<std::thread::id>>();
  std::future<std::thread::id> destroyed = told->get_future();
  std::unique_ptr<DestroyedOn> kept =
      wait(onGpu(gpu_->shard(), [told](GpuShard& gpu) {
        return MadeOnGpu<DestroyedOn>(std::make_unique<DestroyedOn>(told), gpu.executor());
      })).take();
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(destroyed.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  kept.reset();
  EXPECT_EQ(destroyed.get(), std::this_thread::get_id());
}

}  // namespace
}  // namespace gpuproxy::server
