// The executor of a client's command records on one GPU, with that GPU served by a thread of its
// own (GpuOnItsOwnThread), as each GPU will be: records are handed to it by message and it acts,
// and answers later, on the GPU's thread only (the GPU's owner-thread checks throw otherwise). What
// it needs beyond its GPU, a wait for another GPU's event, it asks its session for, here a stand-in
// whose answer comes from this test's thread.
#include "server/session/gpu_command_executor.hpp"

#include "gpu_on_its_own_thread.hpp"
#include "server/backend/sim/sim_backend.hpp"
#include "server/gpu/gpu_messages.hpp"
#include "server/tenant/tenant.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace gpuproxy::server {
namespace {

namespace ring = protocol::ring;

// Answers as a client's completion ring would get them, from whichever thread posts them, and a
// staging area of its own.
class RecordingPort final : public CommandPort {
public:
  std::span<std::byte> hostBytes(const ring::HostLocation& location, std::uint64_t bytes) override {
    return {staging_.data() + location.offset, bytes};
  }
  std::shared_ptr<const void> keepAlive() override { return shared_from_this(); }

  void postCompletion(std::uint64_t token, CUresult result) override {
    std::lock_guard lock(mutex_);
    completions_[token] = result;
    postedOn_.push_back(std::this_thread::get_id());
    changed_.notify_all();
  }
  void postAsyncError(const ring::AsyncError& error) override {
    std::lock_guard lock(mutex_);
    asyncErrors_.push_back(error);
    postedOn_.push_back(std::this_thread::get_id());
    changed_.notify_all();
  }
  void postStagingRelease(std::uint64_t, std::uint64_t) override {}
  void postDeviceOutput(std::uint64_t) override {}

  // The answer to `token`, once it has come (up to 10 s); nullopt if it has not.
  std::optional<CUresult> answerTo(std::uint64_t token) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(10),
                      [&] { return completions_.count(token) != 0; });
    auto found = completions_.find(token);
    return found == completions_.end() ? std::nullopt : std::optional(found->second);
  }
  // The answer to `token` if it has come already.
  std::optional<CUresult> answeredYet(std::uint64_t token) {
    std::lock_guard lock(mutex_);
    auto found = completions_.find(token);
    return found == completions_.end() ? std::nullopt : std::optional(found->second);
  }
  std::vector<ring::AsyncError> asyncErrors() {
    std::lock_guard lock(mutex_);
    return asyncErrors_;
  }
  std::vector<std::thread::id> postedOn() {
    std::lock_guard lock(mutex_);
    return postedOn_;
  }
  std::span<const std::byte> staging() const { return staging_; }

private:
  std::vector<std::byte> staging_ = std::vector<std::byte>(1 << 16);
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::uint64_t, CUresult> completions_;
  std::vector<ring::AsyncError> asyncErrors_;
  std::vector<std::thread::id> postedOn_;
};

// The session as the executor sees it: events of "another GPU" are those it was told of, recorded
// once this test's thread says so.
class StandInSession final : public CommandsBeyondOneGpu {
public:
  // kj::Own is declared noexcept(false); dropping a fulfiller only rejects its promise.
  ~StandInSession() noexcept override {}

  void evict(const std::string& reason) override {
    std::lock_guard lock(mutex_);
    evicted_ = reason;
  }
  std::optional<kj::Promise<CUresult>> whenRecordedElsewhere(Handle event) override {
    if (event != otherGpusEvent_) return std::nullopt;
    auto paf = kj::newPromiseAndCrossThreadFulfiller<CUresult>();
    std::lock_guard lock(mutex_);
    recorded_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  void setOtherGpusEvent(Handle event) { otherGpusEvent_ = event; }
  // The event's record is done on its GPU (called from the test's thread).
  bool finishRecord() {
    std::lock_guard lock(mutex_);
    if (!recorded_) return false;
    recorded_->fulfill(CUDA_SUCCESS);
    return true;
  }
  std::optional<std::string> evicted() {
    std::lock_guard lock(mutex_);
    return evicted_;
  }

private:
  Handle otherGpusEvent_ = 0;
  std::mutex mutex_;
  kj::Own<kj::CrossThreadPromiseFulfiller<CUresult>> recorded_;
  std::optional<std::string> evicted_;
};

class GpuCommandExecutorTest : public ::testing::Test {
protected:
  GpuCommandExecutorTest() {
    stats_->identity.pid = 4321;
    stats_->tenant = tenant_;
    stats_->addressSpace = 1;
    client_ = wait(
        onGpu(gpu_.shard(), [stats = stats_](GpuShard& gpu) { return gpu.openClient(stats); }));
    context_ =
        wait(onGpu(*client_, [](GpuClient& client) { return client.createContext(0); })).value();
    pointer_ = wait(onGpu(*client_, [context = context_](GpuClient& client) {
                 return client.allocate(context, 1 << 16);
               })).value();
    executor_ = wait(onGpu(*client_, [this](GpuClient& client) {
      return std::make_unique<GpuCommandExecutor>(&client, session_, stats_, pinned_);
    }));
  }

  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~GpuCommandExecutorTest() noexcept override {
    // On the GPU's thread: the executor, then the client after its work, as a session's teardown.
    GpuClient& gone = *client_;
    wait(onGpu(
        gone, [executor = std::move(executor_), client = std::move(client_)](GpuClient&) mutable {
          executor.reset();
          client->abandon();
          return client->drain().then([client = std::move(client)]() mutable { client.reset(); });
        }));
  }

  template <typename T>
  T wait(kj::Promise<T> promise) {
    return promise.wait(io_->waitScope);
  }

  // Hands `record` to the executor on the GPU's thread.
  void execute(ring::DecodedCommand record) {
    wait(onGpu(*client_, [this, record = std::move(record)](GpuClient&) {
      executor_->execute(record, *port_);
    }));
  }

  // Held by pointer: kj's destructors may throw, which a gtest fixture's destructor may not.
  std::unique_ptr<kj::AsyncIoContext> io_ =
      std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo());
  std::shared_ptr<Tenant> tenant_ =
      std::make_shared<Tenant>(1, TenantDefinition{"executor", "/unused", TenantLimits{}});
  std::shared_ptr<ClientStats> stats_ = std::make_shared<ClientStats>();
  std::shared_ptr<const LivePinnedAllocations> pinned_ = std::make_shared<LivePinnedAllocations>();
  std::unique_ptr<backend::Backend> backend_ = sim::newSimBackend(sim::SimOptions{2, 1ull << 30});
  GpuOnItsOwnThread gpu_{*backend_, 0};
  StandInSession session_;
  std::shared_ptr<RecordingPort> port_ = std::make_shared<RecordingPort>();
  std::unique_ptr<GpuClient> client_;
  Handle context_ = 0;
  CUdeviceptr pointer_ = 0;
  std::unique_ptr<GpuCommandExecutor> executor_;
};

TEST_F(GpuCommandExecutorTest, RecordsActAndAnswerOnTheGpusOwnThread) {
  ring::Memset memset;
  memset.context = context_;
  memset.destination = pointer_;
  memset.count = 1024;
  memset.value = 0x5a;
  execute(memset);
  ring::CopyDeviceToHost copy;
  copy.context = context_;
  copy.source = pointer_;
  copy.destination = ring::HostLocation{ring::HostRegion::kStaging, 0};
  copy.bytes = 1024;
  copy.completionToken = 7;
  execute(copy);

  EXPECT_EQ(port_->answerTo(7), CUDA_SUCCESS);
  for (std::size_t i = 0; i < 1024; ++i) {
    ASSERT_EQ(port_->staging()[i], std::byte{0x5a}) << "byte " << i;
  }
  EXPECT_TRUE(port_->asyncErrors().empty());
  for (std::thread::id thread : port_->postedOn()) EXPECT_EQ(thread, gpu_.threadId());
}

TEST_F(GpuCommandExecutorTest, AHandleOfAnotherGpuIsAnUnknownHandleHere) {
  // The same serial on device 1: not this GPU's, whatever this GPU has.
  const Handle elsewhere = makeHandle(HandleKind::kContext, 1, context_ & 0xffff'ffff'ffffull);
  ring::Memset memset;
  memset.sequence = 3;
  memset.context = elsewhere;
  memset.destination = pointer_;
  memset.count = 16;
  EXPECT_EQ(GpuCommandExecutor::deviceOf(memset), 1u);
  execute(memset);
  ring::Synchronize sync;
  sync.context = elsewhere;
  sync.kind = ring::SynchronizeKind::kContext;
  sync.completionToken = 8;
  execute(sync);

  EXPECT_EQ(port_->answerTo(8), CUDA_ERROR_INVALID_CONTEXT);
  const auto errors = port_->asyncErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].sequence, 3u);
  EXPECT_EQ(errors[0].result, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(GpuCommandExecutorTest, TheExecutorOfNoGpuAnswersEveryRecordAsABadHandle) {
  GpuCommandExecutor noGpu(nullptr, session_, stats_, pinned_);
  ring::Synchronize sync;
  sync.context = context_;
  sync.kind = ring::SynchronizeKind::kEvent;
  sync.handle = makeHandle(HandleKind::kEvent, 0, 1);
  sync.completionToken = 9;
  noGpu.execute(sync, *port_);
  ring::HostFunction call;
  call.context = context_;
  call.completionToken = 10;
  noGpu.execute(call, *port_);
  EXPECT_EQ(port_->answeredYet(9), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(port_->answeredYet(10), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(GpuCommandExecutorTest, AStreamWaitsForAnotherGpusEventUntilTheSessionSaysItIsRecorded) {
  const Handle otherGpusEvent = makeHandle(HandleKind::kEvent, 1, 1);
  session_.setOtherGpusEvent(otherGpusEvent);
  ring::StreamWaitEvent waitForEvent;
  waitForEvent.context = context_;
  waitForEvent.event = otherGpusEvent;
  execute(waitForEvent);
  ring::Synchronize sync;
  sync.context = context_;
  sync.completionToken = 11;
  execute(sync);

  // Every message sent before this one has run on the GPU: the synchronisation is held.
  execute(ring::Synchronize{.context = context_,
                            .kind = ring::SynchronizeKind::kStream,
                            .completionToken = 12,
                            .query = true});
  EXPECT_EQ(port_->answerTo(12), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(port_->answeredYet(11), std::nullopt);

  ASSERT_TRUE(session_.finishRecord());
  EXPECT_EQ(port_->answerTo(11), CUDA_SUCCESS);
  EXPECT_TRUE(port_->asyncErrors().empty());

  // An event the session does not know is a bad handle, and holds nothing.
  waitForEvent.sequence = 5;
  waitForEvent.event = makeHandle(HandleKind::kEvent, 1, 2);
  execute(waitForEvent);
  sync.completionToken = 13;
  execute(sync);
  EXPECT_EQ(port_->answerTo(13), CUDA_SUCCESS);
  const auto errors = port_->asyncErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].sequence, 5u);
  EXPECT_EQ(errors[0].result, CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(GpuCommandExecutorTest, AnswersStillToComeGoWithTheExecutor) {
  const Handle otherGpusEvent = makeHandle(HandleKind::kEvent, 1, 1);
  session_.setOtherGpusEvent(otherGpusEvent);
  ring::StreamWaitEvent waitForEvent;
  waitForEvent.context = context_;
  waitForEvent.event = otherGpusEvent;
  execute(waitForEvent);
  ring::Synchronize sync;
  sync.context = context_;
  sync.completionToken = 14;
  execute(sync);

  // The session ends while the synchronisation waits: the executor goes on its GPU first.
  wait(onGpu(*client_, [this](GpuClient&) { executor_.reset(); }));
  ASSERT_TRUE(session_.finishRecord());
  // Whatever the GPU does next, nobody answers for the executor that went.
  wait(onGpu(*client_, [](GpuClient&) {}));
  EXPECT_EQ(port_->answeredYet(14), std::nullopt);
}

}  // namespace
}  // namespace gpuproxy::server
