// The stub's end of the data plane (client/stub/data_plane.cpp, compiled into this test) against
// an in-process stand-in for the daemon that owns the segment: answers reach the thread waiting
// for them whichever thread reads them, asynchronous errors are reported once at the next
// synchronisation of their context, a full ring waits, staging space comes back, and a dead or
// garbling daemon ends every wait with CUDA_ERROR_MPS_CONNECTION_FAILED instead of a hang.

#include "client/stub/data_plane.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <stdexcept>
#include <thread>
#include <variant>
#include <vector>

#include "ipc/doorbell.hpp"
#include "ipc/shared_segment.hpp"
#include "ipc/spsc_ring.hpp"
#include "protocol/ring_format.hpp"

namespace gpuproxy::stub {
namespace {

namespace ring = protocol::ring;
using namespace std::chrono_literals;

ipc::UniqueFd duplicate(int fd) {
  return ipc::UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
}

// Lays out a segment as the daemon does, with a ring pair per device, and plays the daemon's
// side of every ring.
class FakeDaemon {
public:
  explicit FakeDaemon(std::size_t commandCapacity = std::size_t{1} << 16,
                      std::uint64_t stagingBytes = 64 << 10, std::uint32_t ringPairs = 2) {
    ring::SegmentPlan plan;
    plan.commandRingCount = ringPairs;
    plan.commandRingBytes = ipc::ringRegionBytes(commandCapacity);
    plan.completionRingBytes = ipc::ringRegionBytes(std::size_t{1} << 14);
    plan.controlBytes = sizeof(ring::wire::ControlBlock);
    plan.stagingBytes = stagingBytes;
    header_ = ring::planSegment(plan).value();
    segment_ = ipc::SharedSegment::create("stub-data-plane-test", header_.segmentBytes);
    std::memcpy(segment_.data(), &header_, sizeof(header_));
    for (std::uint32_t i = 0; i < ringPairs; ++i) {
      auto commands = region(ring::commandRing(header_, i));
      auto completions = region(ring::completionRing(header_, i));
      ipc::initializeRing(commands, commands.size() - sizeof(ipc::RingHeader));
      ipc::initializeRing(completions, completions.size() - sizeof(ipc::RingHeader));
      Pair& pair = pairs_.emplace_back();
      pair.commands.emplace(commands, commands.size() - sizeof(ipc::RingHeader));
      pair.completions.emplace(completions, completions.size() - sizeof(ipc::RingHeader));
      pair.doorbell = ipc::makeEventFd();
    }
    publisher_.emplace(
        *reinterpret_cast<ipc::CompletionWord*>(segment_.data() + header_.control.offset));
  }

  std::unique_ptr<DataPlane> connect(const std::atomic<bool>& lost) {
    std::vector<ipc::UniqueFd> doorbells;
    for (const Pair& pair : pairs_) doorbells.push_back(duplicate(pair.doorbell.get()));
    return std::make_unique<DataPlane>(
        ipc::SharedSegment::map(duplicate(segment_.fd()), segment_.size()), std::move(doorbells),
        lost);
  }

  // The next command the client published in command ring `ring`, waiting up to `timeout`.
  std::optional<ring::DecodedCommand> next(std::chrono::milliseconds timeout = 5s,
                                           std::uint32_t ring = 0) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const ipc::RingStatus status = pairs_[ring].commands->read(record_);
      if (status == ipc::RingStatus::kOk)
        return ring::decodeCommand(record_, ring::limitsOf(header_));
      if (status != ipc::RingStatus::kEmpty) throw std::runtime_error("command ring corrupt");
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(100us);
    }
  }

  template <typename T>
  T nextAs(std::uint32_t ring = 0) {
    auto command = next(5s, ring);
    if (!command) throw std::runtime_error("no command arrived");
    if (!std::holds_alternative<T>(*command)) throw std::runtime_error("unexpected command");
    return std::get<T>(*command);
  }

  // Writes `answer` into completion ring `ring` and adds it to the shared count.
  template <typename Answer>
  void post(const Answer& answer, std::uint32_t ring = 0) {
    auto reservation = pairs_[ring].completions->reserve(ring::encodedSize(answer));
    ASSERT_EQ(reservation.status, ipc::RingStatus::kOk);
    pairs_[ring].completions->commit(ring::encode(answer, reservation.bytes));
    publisher_->publishMore(1);
  }

  // A record the ring carries but no completion decoder accepts.
  void postGarbage() {
    std::vector<std::byte> junk(24, std::byte{0x5a});
    ASSERT_EQ(pairs_[0].completions->tryWrite(junk), ipc::RingStatus::kOk);
    publisher_->publishMore(1);
  }

  std::uint32_t waiters() const {
    auto* word = reinterpret_cast<ipc::CompletionWord*>(segment_.data() + header_.control.offset);
    return std::atomic_ref<std::uint32_t>(word->waiters).load();
  }
  std::span<std::byte> staging() { return region(header_.staging); }
  ipc::SharedSegment& segment() { return segment_; }

private:
  struct Pair {
    std::optional<ipc::RingReader> commands;
    std::optional<ipc::RingWriter> completions;
    ipc::UniqueFd doorbell;
  };

  std::span<std::byte> region(const ring::wire::Region& r) {
    return {segment_.data() + r.offset, static_cast<std::size_t>(r.bytes)};
  }

  ring::wire::SegmentHeader header_{};
  ipc::SharedSegment segment_;
  std::vector<Pair> pairs_;
  std::optional<ipc::CompletionPublisher> publisher_;
  std::vector<std::byte> record_;
};

CUresult submitMemset(DataPlane& plane, std::uint64_t context, std::uint64_t stream) {
  ring::Memset memset;
  memset.context = context;
  memset.stream = stream;
  memset.destination = 0x10000;
  memset.count = 4;
  memset.elementSize = 4;
  return plane.submit(context, ring::encodedSize(memset),
                      [&](std::uint64_t sequence, std::span<std::byte> out) {
                        memset.sequence = sequence;
                        return ring::encodeMemset(memset, out);
                      });
}

// A memset on `stream` of `context` that the daemon reports as failed with `result`.
void failAMemset(FakeDaemon& daemon, DataPlane& plane, std::uint64_t context, std::uint64_t stream,
                 CUresult result) {
  ASSERT_EQ(submitMemset(plane, context, stream), CUDA_SUCCESS);
  auto memset = daemon.nextAs<ring::Memset>();
  daemon.post(ring::AsyncError{memset.sequence, context, stream, result,
                               static_cast<std::uint16_t>(ring::Opcode::kMemset)});
}

TEST(StubDataPlane, ASynchronisationWaitsForItsAnswer) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  auto result = std::async(std::launch::async, [&] {
    return plane->synchronize(7, ring::SynchronizeKind::kStream, 42, /*query=*/false);
  });
  auto sync = daemon.nextAs<ring::Synchronize>();
  EXPECT_EQ(sync.context, 7u);
  EXPECT_EQ(sync.handle, 42u);
  EXPECT_EQ(sync.kind, ring::SynchronizeKind::kStream);
  EXPECT_FALSE(sync.query);
  EXPECT_NE(sync.completionToken, 0u);
  // The waiter gives up spinning and sleeps on the futex; the answer must still wake it.
  ASSERT_EQ(result.wait_for(50ms), std::future_status::timeout);
  EXPECT_GT(daemon.waiters(), 0u);
  daemon.post(ring::Completion{sync.completionToken, CUDA_ERROR_NOT_READY});
  ASSERT_EQ(result.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(result.get(), CUDA_ERROR_NOT_READY);
}

TEST(StubDataPlane, AsynchronousErrorsAreReportedOnceAtTheirContextsNextSynchronisation) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  failAMemset(daemon, *plane, 7, 0, CUDA_ERROR_INVALID_VALUE);

  auto answerNext = [&] {
    auto sync = daemon.nextAs<ring::Synchronize>();
    daemon.post(ring::Completion{sync.completionToken, CUDA_SUCCESS});
  };
  // Another context knows nothing of it.
  auto other = std::async(std::launch::async, [&] {
    return plane->synchronize(8, ring::SynchronizeKind::kContext, 0, false);
  });
  answerNext();
  EXPECT_EQ(other.get(), CUDA_SUCCESS);
  // Its own context gets it, once.
  auto first = std::async(std::launch::async, [&] {
    return plane->synchronize(7, ring::SynchronizeKind::kContext, 0, false);
  });
  answerNext();
  EXPECT_EQ(first.get(), CUDA_ERROR_INVALID_VALUE);
  auto second = std::async(std::launch::async, [&] {
    return plane->synchronize(7, ring::SynchronizeKind::kStream, 0, true);
  });
  answerNext();
  EXPECT_EQ(second.get(), CUDA_SUCCESS);
}

TEST(StubDataPlane, AStreamsErrorIsReportedWhereThatStreamIsSynchronised) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  constexpr std::uint64_t kFailing = 0x50;
  constexpr std::uint64_t kOther = 0x60;
  constexpr std::uint64_t kEvent = 0x70;
  failAMemset(daemon, *plane, 7, kFailing, CUDA_ERROR_INVALID_VALUE);
  plane->noteEventRecorded(kEvent, kFailing);

  auto synchronize = [&](ring::SynchronizeKind kind, std::uint64_t handle) {
    auto result =
        std::async(std::launch::async, [&] { return plane->synchronize(7, kind, handle, false); });
    auto sync = daemon.nextAs<ring::Synchronize>();
    daemon.post(ring::Completion{sync.completionToken, CUDA_SUCCESS});
    return result.get();
  };
  EXPECT_EQ(synchronize(ring::SynchronizeKind::kStream, kOther), CUDA_SUCCESS);
  // An event recorded on the failing stream covers the failed command.
  EXPECT_EQ(synchronize(ring::SynchronizeKind::kEvent, kEvent), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(synchronize(ring::SynchronizeKind::kStream, kFailing), CUDA_SUCCESS);
}

TEST(StubDataPlane, AKernelFaultFailsTheContextsLaterCommandsAtTheCall) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  failAMemset(daemon, *plane, 7, 0x50, CUDA_ERROR_ILLEGAL_ADDRESS);
  // No synchronisation in between: the next command finds the fault and is not sent.
  EXPECT_EQ(submitMemset(*plane, 7, 0x60), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(plane->synchronize(7, ring::SynchronizeKind::kContext, 0, false),
            CUDA_ERROR_ILLEGAL_ADDRESS);
  // Another context is not poisoned by the stub (the daemon decides what else fails).
  EXPECT_EQ(submitMemset(*plane, 8, 0x90), CUDA_SUCCESS);
  EXPECT_EQ(daemon.nextAs<ring::Memset>().context, 8u);
  // Until the context is reset.
  plane->forgetContext(7);
  EXPECT_EQ(submitMemset(*plane, 7, 0x60), CUDA_SUCCESS);
}

TEST(StubDataPlane, EachWaiterGetsItsOwnAnswerWhicheverThreadReadsIt) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  constexpr int kThreads = 8;
  std::vector<std::future<CUresult>> results;
  for (int t = 0; t < kThreads; ++t) {
    results.push_back(std::async(std::launch::async, [&, t] {
      return plane->synchronize(1, ring::SynchronizeKind::kStream, static_cast<std::uint64_t>(t),
                                false);
    }));
  }
  std::vector<ring::Synchronize> syncs;
  for (int t = 0; t < kThreads; ++t) syncs.push_back(daemon.nextAs<ring::Synchronize>());
  // Answered newest first; the result names the stream, so a mix-up shows.
  for (auto it = syncs.rbegin(); it != syncs.rend(); ++it) {
    daemon.post(ring::Completion{it->completionToken,
                                 it->handle % 2 == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY});
    std::this_thread::sleep_for(1ms);
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(results[t].get(), t % 2 == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY) << t;
  }
}

// A small ring: the writers wait for the daemon and nothing is lost, reordered or duplicated.
TEST(StubDataPlane, AFullRingMakesWritersWaitAndSequencesRiseInRingOrder) {
  FakeDaemon daemon(/*commandCapacity=*/4096);
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  constexpr int kThreads = 4;
  constexpr int kRecords = 500;
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kRecords; ++i) {
        ASSERT_EQ(
            submitMemset(*plane, static_cast<std::uint64_t>(t + 1), static_cast<std::uint64_t>(i)),
            CUDA_SUCCESS);
      }
    });
  }
  std::vector<int> nextPerThread(kThreads, 0);
  std::uint64_t expectedSequence = 1;
  for (int received = 0; received < kThreads * kRecords; ++received) {
    if (received % 100 == 0) std::this_thread::sleep_for(2ms);  // a slow daemon
    auto memset = daemon.nextAs<ring::Memset>();
    EXPECT_EQ(memset.sequence, expectedSequence++);
    const auto writer = static_cast<int>(memset.context - 1);
    ASSERT_LT(writer, kThreads);
    EXPECT_EQ(memset.stream, static_cast<std::uint64_t>(nextPerThread[writer]++));
  }
  for (auto& writer : writers) writer.join();
  EXPECT_FALSE(daemon.next(20ms).has_value());
  EXPECT_GT(plane->ringFullWaits(), 0u);
}

TEST(StubDataPlane, StagingSpaceComesBackWhenTheDaemonReleasesIt) {
  FakeDaemon daemon(std::size_t{1} << 16, /*stagingBytes=*/64 << 10);
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  ASSERT_EQ(plane->staging().size(), 64u << 10);
  ASSERT_EQ(plane->chunkBytes(), 16u << 10);
  std::vector<StagingAllocator::Range> ranges;
  for (int i = 0; i < 4; ++i) ranges.push_back(*plane->allocateStaging(16 << 10, nullptr));
  // The bytes the stub writes are the bytes the daemon sees.
  std::memset(plane->staging().data() + ranges[1].offset, 0x3c, 16);
  EXPECT_EQ(daemon.staging()[ranges[1].offset], std::byte{0x3c});

  auto fifth =
      std::async(std::launch::async, [&] { return plane->allocateStaging(16 << 10, nullptr); });
  ASSERT_EQ(fifth.wait_for(30ms), std::future_status::timeout);
  daemon.post(ring::StagingRelease{ranges[1].offset, ranges[1].bytes});  // not the head yet
  ASSERT_EQ(fifth.wait_for(30ms), std::future_status::timeout);
  daemon.post(ring::StagingRelease{ranges[0].offset, ranges[0].bytes});
  ASSERT_EQ(fifth.wait_for(5s), std::future_status::ready);
  auto range = fifth.get();
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->offset, 0u);
}

TEST(StubDataPlane, ALostConnectionEndsEveryWait) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  auto result = std::async(std::launch::async, [&] {
    return plane->synchronize(1, ring::SynchronizeKind::kContext, 0, false);
  });
  daemon.nextAs<ring::Synchronize>();
  ASSERT_EQ(result.wait_for(50ms), std::future_status::timeout);
  lost = true;  // what the runtime's loop thread does when the socket closes
  ASSERT_EQ(result.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(result.get(), CUDA_ERROR_MPS_CONNECTION_FAILED);
}

TEST(StubDataPlane, AGarbledCompletionRingEndsTheDataPlane) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  auto result = std::async(std::launch::async, [&] {
    return plane->synchronize(1, ring::SynchronizeKind::kContext, 0, false);
  });
  daemon.nextAs<ring::Synchronize>();
  daemon.postGarbage();
  ASSERT_EQ(result.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(result.get(), CUDA_ERROR_MPS_CONNECTION_FAILED);
  EXPECT_EQ(submitMemset(*plane, 1, 0), CUDA_ERROR_MPS_CONNECTION_FAILED);
}

TEST(StubDataPlane, EachContextsRecordsGoIntoItsDevicesRing) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  plane->noteContext(7, 1);
  plane->noteContext(8, 0);
  ASSERT_EQ(submitMemset(*plane, 7, 0x50), CUDA_SUCCESS);
  ASSERT_EQ(submitMemset(*plane, 8, 0x60), CUDA_SUCCESS);
  // A context the plane was never told of (a stale handle): ring 0, where the daemon refuses it.
  ASSERT_EQ(submitMemset(*plane, 9, 0x70), CUDA_SUCCESS);
  EXPECT_EQ(daemon.nextAs<ring::Memset>(1).stream, 0x50u);
  EXPECT_EQ(daemon.nextAs<ring::Memset>(0).stream, 0x60u);
  EXPECT_EQ(daemon.nextAs<ring::Memset>(0).stream, 0x70u);
  EXPECT_FALSE(daemon.next(20ms, 1).has_value());
  // A destroyed context's handle no longer names device 1.
  plane->forgetContextRing(7);
  ASSERT_EQ(submitMemset(*plane, 7, 0x80), CUDA_SUCCESS);
  EXPECT_EQ(daemon.nextAs<ring::Memset>(0).stream, 0x80u);
}

TEST(StubDataPlane, ASynchronisationSeesAnErrorAnotherRingReportedBeforeItsAnswer) {
  // A stream of device 0 waited for device 1's event, and the let-go failed there: device 1's
  // ring reports the waiting stream's error, then device 0's answers the synchronisation. Both
  // count on the one word, and the waiter drains every ring before it reports.
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  auto plane = daemon.connect(lost);
  plane->noteContext(7, 0);
  auto result = std::async(std::launch::async, [&] {
    return plane->synchronize(7, ring::SynchronizeKind::kStream, 0x50, false);
  });
  auto sync = daemon.nextAs<ring::Synchronize>(0);
  ASSERT_EQ(result.wait_for(50ms), std::future_status::timeout);
  daemon.post(ring::AsyncError{3, 7, 0x50, CUDA_ERROR_INVALID_HANDLE,
                               static_cast<std::uint16_t>(ring::Opcode::kLetGoAfterEvent)},
              1);
  daemon.post(ring::Completion{sync.completionToken, CUDA_SUCCESS}, 0);
  ASSERT_EQ(result.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(result.get(), CUDA_ERROR_INVALID_HANDLE);
}

TEST(StubDataPlane, ASegmentWithoutADoorbellPerRingIsRefused) {
  FakeDaemon daemon;
  std::atomic<bool> lost{false};
  std::vector<ipc::UniqueFd> one;
  one.push_back(ipc::makeEventFd());
  EXPECT_THROW(
      DataPlane(ipc::SharedSegment::map(duplicate(daemon.segment().fd()), daemon.segment().size()),
                std::move(one), lost),
      std::runtime_error);
}

TEST(StubDataPlane, ASegmentThatIsNotOneIsRefused) {
  FakeDaemon daemon;
  std::memset(daemon.segment().data(), 0, 8);  // the magic
  std::atomic<bool> lost{false};
  EXPECT_THROW(daemon.connect(lost), std::runtime_error);
}

}  // namespace
}  // namespace gpuproxy::stub
