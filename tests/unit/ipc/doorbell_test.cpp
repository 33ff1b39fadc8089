#include "ipc/doorbell.hpp"

#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/shared_segment.hpp"
#include "ipc/spsc_ring.hpp"
#include "tests/unit/ipc/forked_child.hpp"

namespace gpuproxy::ipc {
namespace {

using namespace std::chrono_literals;
using test::ForkedChild;

// One command ring with its doorbell, plus a completion word, in one shared segment.
struct Channel {
  static constexpr std::size_t kCapacity = 4096;
  Channel()
      : segment(SharedSegment::create("doorbell-test", ringRegionBytes(kCapacity) + 64)),
        doorbell(makeEventFd()) {
    initializeRing(ring(), kCapacity);
  }
  std::span<std::byte> ring() const { return segment.bytes().first(ringRegionBytes(kCapacity)); }
  CompletionWord& completion() const {
    return *reinterpret_cast<CompletionWord*>(segment.data() + ringRegionBytes(kCapacity));
  }
  std::uint32_t& sleeping() const {
    return reinterpret_cast<RingHeader*>(segment.data())->consumerSleeping;
  }

  SharedSegment segment;
  UniqueFd doorbell;
};

std::span<const std::byte> asBytes(const std::uint32_t& value) {
  return std::as_bytes(std::span(&value, 1));
}

std::uint32_t valueOf(const std::vector<std::byte>& record) {
  std::uint32_t value = 0;
  std::memcpy(&value, record.data(), std::min(record.size(), sizeof(value)));
  return value;
}

TEST(Doorbell, SleepingConsumerIsWokenByTheProducer) {
  Channel channel;
  ForkedChild producer([&] {
    RingWriter writer(channel.ring(), Channel::kCapacity);
    DoorbellRinger ringer(writer.consumerSleeping(), channel.doorbell.get());
    // Give the consumer time to go to sleep for real.
    while (std::atomic_ref<std::uint32_t>(channel.sleeping()).load() == 0) {
      std::this_thread::sleep_for(1ms);
    }
    std::this_thread::sleep_for(20ms);
    const std::uint32_t value = 42;
    if (writer.tryWrite(asBytes(value)) != RingStatus::kOk) return 1;
    if (!ringer.ring()) return 2;
    return ringer.ring() ? 3 : 0;  // the announcement was consumed: no second eventfd write
  });
  RingReader reader(channel.ring(), Channel::kCapacity);
  DoorbellWaiter waiter(reader.consumerSleeping(), channel.doorbell.get());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(waiter.wait([&] { return reader.pending(); }, 0, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_GE(waiter.sleeps(), 1u);
  std::vector<std::byte> out;
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  EXPECT_EQ(valueOf(out), 42u);
  EXPECT_EQ(producer.wait(), 0);
  EXPECT_EQ(std::atomic_ref<std::uint32_t>(channel.sleeping()).load(), 0u);
}

TEST(Doorbell, WaitTimesOutWhenNothingArrives) {
  Channel channel;
  RingReader reader(channel.ring(), Channel::kCapacity);
  DoorbellWaiter waiter(reader.consumerSleeping(), channel.doorbell.get());
  EXPECT_FALSE(waiter.wait([&] { return reader.pending(); }, 100, 20ms));
  EXPECT_EQ(std::atomic_ref<std::uint32_t>(channel.sleeping()).load(), 0u);
}

TEST(Doorbell, BusyConsumerCostsTheProducerNoSyscall) {
  Channel channel;
  constexpr std::uint32_t kRecords = 100000;
  std::atomic<bool> failed{false};
  std::thread consumer([&] {
    // Never announces sleep: it spins, as the daemon does while it has work.
    RingReader reader(channel.ring(), Channel::kCapacity);
    std::vector<std::byte> out;
    for (std::uint32_t i = 0; i < kRecords;) {
      const RingStatus status = reader.read(out);
      if (status == RingStatus::kEmpty) {
        std::this_thread::yield();
        continue;
      }
      if (status != RingStatus::kOk || valueOf(out) != i) failed = true;
      ++i;
    }
  });
  RingWriter writer(channel.ring(), Channel::kCapacity);
  DoorbellRinger ringer(writer.consumerSleeping(), channel.doorbell.get());
  for (std::uint32_t i = 0; i < kRecords; ++i) {
    while (writer.tryWrite(asBytes(i)) == RingStatus::kFull) std::this_thread::yield();
    ringer.ring();
  }
  consumer.join();
  EXPECT_FALSE(failed);
  EXPECT_EQ(ringer.wakeupsSent(), 0u);
  EXPECT_EQ(drainEventFd(channel.doorbell.get()), 0u);
}

// Ping-pong across processes where nearly every message has to wake a sleeping peer: the daemon
// side sleeps on the eventfd doorbell, the client side on the futex completion word. Spin counts
// vary so that rings land before, inside and after the consumer's announce/re-check window. A
// lost wake-up shows up as a timed-out wait (the test then fails instead of hanging).
TEST(Doorbell, NoLostWakeupsUnderStress) {
  constexpr std::uint32_t kRounds = 20000;
  Channel channel;
  ForkedChild client([&] {
    RingWriter writer(channel.ring(), Channel::kCapacity);
    DoorbellRinger ringer(writer.consumerSleeping(), channel.doorbell.get());
    CompletionWaiter completions(channel.completion());
    for (std::uint32_t i = 1; i <= kRounds; ++i) {
      if (writer.tryWrite(asBytes(i)) != RingStatus::kOk) return 1;
      ringer.ring();
      const auto done =
          completions.wait([i](std::uint32_t value) { return value == i; }, (i * 7919u) % 200, 5s);
      if (!done) return 2;  // lost wake-up (or a dead daemon side)
    }
    return 0;
  });
  RingReader reader(channel.ring(), Channel::kCapacity);
  DoorbellWaiter waiter(reader.consumerSleeping(), channel.doorbell.get());
  CompletionPublisher publisher(channel.completion());
  std::vector<std::byte> out;
  for (std::uint32_t i = 1; i <= kRounds; ++i) {
    ASSERT_TRUE(waiter.wait([&] { return reader.pending(); }, (i * 104729u) % 150, 5s))
        << "lost wake-up at round " << i;
    ASSERT_EQ(reader.read(out), RingStatus::kOk);
    ASSERT_EQ(valueOf(out), i);
    publisher.publishMore(1);
  }
  EXPECT_EQ(client.wait(), 0);
  EXPECT_GT(waiter.sleeps(), 0u);
}

TEST(Doorbell, DrainNeverBlocksEvenWhenThePeerMadeTheEventfdBlocking) {
  UniqueFd doorbell = makeEventFd();
  // What a hostile client can do with its copy: O_NONBLOCK is shared by both processes.
  ASSERT_EQ(::fcntl(doorbell.get(), F_SETFL, 0), 0);
  ForkedChild daemon([&] {
    if (drainEventFd(doorbell.get()) != 0) return 1;  // empty: must return at once
    const std::uint64_t three = 3;
    if (::write(doorbell.get(), &three, sizeof(three)) != sizeof(three)) return 2;
    return drainEventFd(doorbell.get()) == 3 ? 0 : 3;
  });
  EXPECT_EQ(daemon.wait(5s), 0) << "drainEventFd blocked on an empty eventfd";
}

TEST(CompletionWord, BlockedWaiterInAnotherProcessIsWoken) {
  Channel channel;
  ForkedChild client([&] {
    CompletionWaiter waiter(channel.completion());
    const auto value = waiter.wait([](std::uint32_t v) { return v >= 7; }, 0, 10s);
    return value == 7u ? 0 : 1;
  });
  // Publish only once the client is really blocked in the kernel.
  while (std::atomic_ref<std::uint32_t>(channel.completion().waiters).load() == 0) {
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(20ms);
  CompletionPublisher publisher(channel.completion());
  publisher.publishMore(7);
  EXPECT_EQ(client.wait(), 0);
  EXPECT_EQ(publisher.wakesSent(), 1u);
}

TEST(CompletionWord, PublisherSkipsTheSyscallWhenNobodyWaits) {
  Channel channel;
  CompletionPublisher publisher(channel.completion());
  CompletionWaiter waiter(channel.completion());
  for (std::uint32_t i = 1; i <= 1000; ++i) {
    publisher.publishMore(1);
    EXPECT_EQ(waiter.wait([i](std::uint32_t v) { return v == i; }, 1, 1s), i);
  }
  EXPECT_EQ(publisher.wakesSent(), 0u);
}

TEST(CompletionWord, WaitTimesOut) {
  Channel channel;
  CompletionWaiter waiter(channel.completion());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(waiter.wait([](std::uint32_t v) { return v == 1; }, 10, 20ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
  EXPECT_EQ(channel.completion().waiters, 0u);
}

TEST(CompletionWord, PublishersSharingTheWordEachAddWhatTheyPublished) {
  // One word, a publisher per completion ring, each on its own thread: the value ends at the
  // sum, so a waiter that saw any change looks at every ring.
  Channel channel;
  constexpr std::uint32_t kEach = 10000;
  auto publishAll = [&] {
    CompletionPublisher publisher(channel.completion());
    for (std::uint32_t i = 0; i < kEach; ++i) publisher.publishMore(1);
  };
  std::thread first(publishAll);
  std::thread second(publishAll);
  first.join();
  second.join();
  CompletionWaiter waiter(channel.completion());
  EXPECT_EQ(waiter.load(), 2 * kEach);
}

}  // namespace
}  // namespace gpuproxy::ipc
