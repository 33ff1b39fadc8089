// The executor of a client's command records on one GPU, with each of two GPUs served by a thread
// of its own (GpuThread), as each GPU is in the daemon: records are handed to an executor by
// message and it acts, and answers later, on its GPU's thread only (the GPU's owner-thread checks
// throw otherwise). A stream's wait for the other GPU's event is its two halves, one on each GPU's
// thread, joined by a message, as ClientSession joins them.
#include "server/session/gpu_command_executor.hpp"
#include "server/daemon/gpu_thread.hpp"

#include "protocol/limits.hpp"
#include "server/backend/sim/sim_backend.hpp"
#include "server/gpu/gpu_messages.hpp"
#include "server/tenant/tenant.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <chrono>
#include <cstring>
#include <functional>
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
  }
  void postAsyncError(const ring::AsyncError& error) override {
    std::lock_guard lock(mutex_);
    asyncErrors_.push_back(error);
    postedOn_.push_back(std::this_thread::get_id());
  }
  void postStagingRelease(std::uint64_t, std::uint64_t) override {}
  void postDeviceOutput(std::uint64_t) override {}

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
  std::map<std::uint64_t, CUresult> completions_;
  std::vector<ring::AsyncError> asyncErrors_;
  std::vector<std::thread::id> postedOn_;
};

// The session as an executor sees it: the let-go of a stream held on another GPU, which the test
// routes (from the session's thread, the test's, where the event's GPU sends it).
class StandInSession final : public CommandsBeyondOneGpu {
public:
  void letGoElsewhere(const ring::LetGoAfterEvent& letGo) override {
    if (std::this_thread::get_id() != thread_) ADD_FAILURE() << "a let-go off the session thread";
    letGo_(letGo.waiterContext, letGo.token);
  }
  std::function<void(Handle, std::uint64_t)> letGo_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::thread::id thread_ = std::this_thread::get_id();
};

// The client's state on one GPU, on that GPU's thread: its GpuClient, a context and 64 KiB of
// device memory, and the executor of its records there.
struct ClientOnGpu {
  ClientOnGpu(backend::Backend& backend, std::uint32_t index, std::shared_ptr<ClientStats> stats,
              StandInSession& session, std::shared_ptr<const LivePinnedAllocations> pinned,
              kj::WaitScope& scope)
      : gpu(GpuThread::start(backend, index).value()) {
    client =
        onGpu(gpu->shard(), [stats](GpuShard& gpu) { return gpu.openClient(stats); }).wait(scope);
    context = onGpu(*client, [](GpuClient& client) { return client.createContext(0); })
                  .wait(scope)
                  .value();
    pointer =
        onGpu(*client, [this](GpuClient& client) { return client.allocate(context, 1 << 16); })
            .wait(scope)
            .value();
    executor = onGpu(*client, [&, sessionThread = kj::getCurrentThreadExecutor().addRef()](
                                  GpuClient& client) mutable {
                 return std::make_unique<GpuCommandExecutor>(
                     &client, session, kj::mv(sessionThread), session.alive_, stats, pinned);
               }).wait(scope);
  }

  // On the GPU's thread: the executor, then the client after its work, as a session's teardown.
  void destroy(kj::WaitScope& scope) {
    GpuClient& gone = *client;
    onGpu(gone, [executor = std::move(executor), client = std::move(client)](GpuClient&) mutable {
      executor.reset();
      client->abandon();
      return client->drain().then([client = std::move(client)]() mutable { client.reset(); });
    }).wait(scope);
  }

  // Hands `record` to the executor on the GPU's thread.
  void execute(ring::DecodedCommand record, CommandPort& port, kj::WaitScope& scope) {
    onGpu(*client, [this, &port, record = std::move(record)](GpuClient&) {
      executor->execute(record, port);
    }).wait(scope);
  }

  std::unique_ptr<GpuThread> gpu;
  std::unique_ptr<GpuClient> client;
  Handle context = 0;
  CUdeviceptr pointer = 0;
  std::unique_ptr<GpuCommandExecutor> executor;
};

class GpuCommandExecutorTest : public ::testing::Test {
protected:
  GpuCommandExecutorTest() {
    stats_->identity.pid = 4321;
    stats_->tenant = tenant_;
    stats_->addressSpace = 1;
    for (std::uint32_t index = 0; index < 2; ++index) {
      gpus_.push_back(std::make_unique<ClientOnGpu>(*backend_, index, stats_, session_, pinned_,
                                                    io_->waitScope));
    }
    // As ClientSession::letGoElsewhere: a message to the GPU of the waiting context.
    session_.letGo_ = [this](Handle waiterContext, std::uint64_t token) {
      ClientOnGpu& waiting = *gpus_[handleDevice(waiterContext)];
      tellGpu(*waiting.client, [executor = waiting.executor.get(), token](GpuClient&) {
        executor->letGoOfHold(token);
      });
    };
  }

  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~GpuCommandExecutorTest() noexcept override {
    for (auto& gpu : gpus_) gpu->destroy(io_->waitScope);
  }

  template <typename T>
  T wait(kj::Promise<T> promise) {
    return promise.wait(io_->waitScope);
  }

  ClientOnGpu& gpu(std::uint32_t index) { return *gpus_[index]; }

  // The answer to `token`, once it has come (up to 10 s), turning this thread's loop meanwhile:
  // it is the session's, where a let-go from another GPU goes first.
  std::optional<CUresult> answerTo(std::uint64_t token) {
    for (int turn = 0; turn < 10000; ++turn) {
      if (auto answer = port_->answeredYet(token)) return answer;
      io_->provider->getTimer().afterDelay(kj::MILLISECONDS).wait(io_->waitScope);
    }
    return std::nullopt;
  }

  // The client was told of exactly one failed record, the one of `sequence`, with `result`.
  void expectOneAsyncError(std::uint64_t sequence, CUresult result) {
    const auto errors = port_->asyncErrors();
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_EQ(errors[0].sequence, sequence);
    EXPECT_EQ(errors[0].result, result);
  }

  // Hands `record` to GPU `index`'s executor, on that GPU's thread.
  void execute(ring::DecodedCommand record, std::uint32_t index = 0) {
    gpus_[index]->execute(std::move(record), *port_, io_->waitScope);
  }

  // Held by pointer: kj's destructors may throw, which a gtest fixture's destructor may not.
  std::unique_ptr<kj::AsyncIoContext> io_ =
      std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo());
  std::shared_ptr<Tenant> tenant_ =
      std::make_shared<Tenant>(1, TenantDefinition{"executor", "/unused", TenantLimits{}});
  std::shared_ptr<ClientStats> stats_ = std::make_shared<ClientStats>();
  std::shared_ptr<const LivePinnedAllocations> pinned_ = std::make_shared<LivePinnedAllocations>();
  std::unique_ptr<backend::Backend> backend_ = sim::newSimBackend(sim::SimOptions{2, 1ull << 30});
  StandInSession session_;
  std::shared_ptr<RecordingPort> port_ = std::make_shared<RecordingPort>();
  std::vector<std::unique_ptr<ClientOnGpu>> gpus_;
};

TEST_F(GpuCommandExecutorTest, RecordsActAndAnswerOnTheGpusOwnThread) {
  ring::Memset memset;
  memset.context = gpu(0).context;
  memset.destination = gpu(0).pointer;
  memset.count = 1024;
  memset.value = 0x5a;
  execute(memset);
  ring::CopyDeviceToHost copy;
  copy.context = gpu(0).context;
  copy.source = gpu(0).pointer;
  copy.destination = ring::HostLocation{ring::HostRegion::kStaging, 0};
  copy.bytes = 1024;
  copy.completionToken = 7;
  execute(copy);

  EXPECT_EQ(answerTo(7), CUDA_SUCCESS);
  for (std::size_t i = 0; i < 1024; ++i) {
    ASSERT_EQ(port_->staging()[i], std::byte{0x5a}) << "byte " << i;
  }
  EXPECT_TRUE(port_->asyncErrors().empty());
  for (std::thread::id thread : port_->postedOn()) EXPECT_EQ(thread, gpu(0).gpu->threadId());
}

TEST_F(GpuCommandExecutorTest, AHandleOfAnotherGpuIsAnUnknownHandleHere) {
  // GPU 1's context, handed to GPU 0's executor.
  const Handle elsewhere = gpu(1).context;
  ring::Memset memset;
  memset.sequence = 3;
  memset.context = elsewhere;
  memset.destination = gpu(1).pointer;
  memset.count = 16;
  EXPECT_EQ(GpuCommandExecutor::deviceOf(memset), 1u);
  execute(memset, 0);
  ring::Synchronize sync;
  sync.context = elsewhere;
  sync.kind = ring::SynchronizeKind::kContext;
  sync.completionToken = 8;
  execute(sync, 0);

  EXPECT_EQ(answerTo(8), CUDA_ERROR_INVALID_CONTEXT);
  expectOneAsyncError(3, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(GpuCommandExecutorTest, TheExecutorOfNoGpuAnswersEveryRecordAsABadHandle) {
  GpuCommandExecutor noGpu(nullptr, session_, kj::getCurrentThreadExecutor().addRef(),
                           session_.alive_, stats_, pinned_);
  ring::Synchronize sync;
  sync.context = gpu(0).context;
  sync.kind = ring::SynchronizeKind::kEvent;
  sync.handle = makeHandle(HandleKind::kEvent, 0, 1);
  sync.completionToken = 9;
  noGpu.execute(sync, *port_);
  ring::HostFunction call;
  call.context = gpu(0).context;
  call.completionToken = 10;
  noGpu.execute(call, *port_);
  // A record with a bad value fails alone (one that breaks the format never comes here: whoever
  // framed it ends the connection).
  ring::DecodeError bad;
  bad.disconnect = false;
  bad.result = CUDA_ERROR_INVALID_VALUE;
  bad.completionToken = 11;
  noGpu.execute(bad, *port_);
  EXPECT_EQ(port_->answeredYet(9), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(port_->answeredYet(10), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(port_->answeredYet(11), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(GpuCommandExecutorTest, AStreamWaitsForTheOtherGpusEventByMessagesOnly) {
  // GPU 1's event, recorded behind a host function the test holds, so that its record is done
  // only when the test lets it.
  const Handle event = wait(onGpu(*gpu(1).client, [context = gpu(1).context](GpuClient& client) {
                         return client.createEvent(context, CU_EVENT_DISABLE_TIMING);
                       })).value();
  execute(ring::HostFunction{.context = gpu(1).context, .completionToken = 20}, 1);
  EXPECT_EQ(answerTo(20), CUDA_SUCCESS);
  execute(ring::EventRecord{.context = gpu(1).context, .event = event}, 1);

  // The wait's two records, each to its GPU's executor: the let-go, on GPU 1's thread once the
  // record is done, tells GPU 0 by a message.
  execute(ring::HoldForEvent{.context = gpu(0).context, .token = 1}, 0);
  execute(
      ring::LetGoAfterEvent{
          .context = gpu(1).context, .event = event, .token = 1, .waiterContext = gpu(0).context},
      1);
  execute(ring::Synchronize{.context = gpu(0).context, .completionToken = 11});

  // Every message sent before this one has run on GPU 0: its stream is held.
  execute(ring::Synchronize{.context = gpu(0).context, .completionToken = 12, .query = true});
  EXPECT_EQ(answerTo(12), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(port_->answeredYet(11), std::nullopt);

  // The host function returns: GPU 1's record is done, and GPU 0's stream goes on.
  execute(ring::HostFunctionReturned{.context = gpu(1).context, .token = 20}, 1);
  EXPECT_EQ(answerTo(11), CUDA_SUCCESS);
  EXPECT_TRUE(port_->asyncErrors().empty());
}

TEST_F(GpuCommandExecutorTest, TheRecordsOfAWaitMayComeInEitherOrder) {
  // The let-go first, for an event GPU 1 does not have: nothing to wait for, the stream goes on
  // and hears why; the hold that comes after it then holds nothing.
  execute(ring::LetGoAfterEvent{.sequence = 6,
                                .context = gpu(1).context,
                                .event = makeHandle(HandleKind::kEvent, 1, 99),
                                .token = 5,
                                .waiterContext = gpu(0).context},
          1);
  execute(ring::HoldForEvent{.context = gpu(0).context, .token = 5}, 0);
  execute(ring::Synchronize{.context = gpu(0).context, .completionToken = 13});
  EXPECT_EQ(answerTo(13), CUDA_SUCCESS);
  expectOneAsyncError(6, CUDA_ERROR_INVALID_HANDLE);

  // A wait record for another GPU's event reaching a GPU whole is refused there.
  execute(ring::StreamWaitEvent{
      .sequence = 7, .context = gpu(0).context, .event = makeHandle(HandleKind::kEvent, 1, 1)});
  execute(ring::Synchronize{.context = gpu(0).context, .completionToken = 14});
  EXPECT_EQ(answerTo(14), CUDA_SUCCESS);
  EXPECT_EQ(port_->asyncErrors().size(), 2u);
}

TEST_F(GpuCommandExecutorTest, AnswersStillToComeGoWithTheExecutor) {
  execute(ring::HoldForEvent{.context = gpu(0).context, .token = 1}, 0);
  execute(ring::Synchronize{.context = gpu(0).context, .completionToken = 15});

  // The session ends while the synchronisation waits: the executor goes on its GPU first.
  wait(onGpu(*gpu(0).client, [&](GpuClient&) { gpu(0).executor.reset(); }));
  // Whatever the GPU does next, nobody answers for the executor that went.
  wait(onGpu(*gpu(0).client, [](GpuClient&) {}));
  EXPECT_EQ(port_->answeredYet(15), std::nullopt);
}

TEST_F(GpuCommandExecutorTest, OnlySoManyLetGosAreRememberedAheadOfTheirHolds) {
  // A client that sends let-gos for holds that never come makes a GPU remember only so many.
  const std::uint64_t bound = protocol::kMaxPendingWaitsForOtherGpus;
  wait(onGpu(*gpu(0).client, [&](GpuClient&) {
    for (std::uint64_t token = 1; token <= bound + 1; ++token) {
      gpu(0).executor->letGoOfHold(token);
    }
  }));
  // The oldest was forgotten: its hold holds; the newest was not: its hold holds nothing.
  execute(ring::HoldForEvent{.context = gpu(0).context, .token = bound + 1}, 0);
  execute(ring::Synchronize{.context = gpu(0).context, .completionToken = 16, .query = true});
  EXPECT_EQ(answerTo(16), CUDA_SUCCESS);
  execute(ring::HoldForEvent{.context = gpu(0).context, .token = 1}, 0);
  execute(ring::Synchronize{.context = gpu(0).context, .completionToken = 17, .query = true});
  EXPECT_EQ(answerTo(17), CUDA_ERROR_NOT_READY);
}

}  // namespace
}  // namespace gpuproxy::server
