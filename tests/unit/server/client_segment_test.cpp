// One client's segment (server/data_plane/client_segment.hpp) served as a thread per GPU will
// serve it: each ring pair's channel read, executed and answered on a thread of its own, the
// client reading every completion ring and waiting on the one word all of them add to. Under
// ThreadSanitizer (the tsan stage) this is what shows that the pairs share nothing but the
// segment's mapping, its layout and that word.
#include "server/data_plane/client_segment.hpp"

#include "ipc/doorbell.hpp"
#include "ipc/spsc_ring.hpp"
#include "protocol/ring_format.hpp"
#include "server/data_plane/client_channel.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

namespace gpuproxy::server {
namespace {

namespace ring = protocol::ring;
using namespace std::chrono_literals;

// Answers each synchronisation at once, on the thread that reads its ring; remembers which
// thread that was.
class AnsweringExecutor final : public CommandExecutor {
public:
  void execute(const ring::DecodedCommand& command, CommandPort& port) override {
    if (std::this_thread::get_id() != thread_) wrongThread_ = true;
    if (const auto* sync = std::get_if<ring::Synchronize>(&command)) {
      port.postCompletion(sync->completionToken, CUDA_SUCCESS);
    }
  }
  void channelBroken(const std::string&) override { broken_ = true; }

  // Set by the thread that serves this executor's ring, before it reads anything.
  void servedBy(std::thread::id thread) { thread_ = thread; }
  bool wrongThread() const { return wrongThread_; }
  bool broken() const { return broken_; }

private:
  std::thread::id thread_;
  bool wrongThread_ = false;
  bool broken_ = false;
};

TEST(ClientSegment, EachRingPairServedByAThreadOfItsOwnAnswersThroughOneWord) {
  constexpr std::uint32_t kPairs = 2;
  constexpr std::uint64_t kPerRing = 2000;
  ChannelSizes sizes;
  sizes.ringPairs = kPairs;
  sizes.commandRingCapacity = 4096;
  sizes.completionRingCapacity = 1024;  // fills: answers wait in the channel meanwhile
  sizes.stagingBytes = 4096;
  auto segment = std::make_shared<ClientSegment>("client-segment-test", sizes);
  ASSERT_EQ(segment->ringPairs(), kPairs);

  // The client's side: it writes into both command rings and reads both completion rings.
  std::array<std::optional<ipc::RingWriter>, kPairs> commands;
  std::array<std::optional<ipc::RingReader>, kPairs> completions;
  for (std::uint32_t i = 0; i < kPairs; ++i) {
    commands[i].emplace(segment->commandRing(i),
                        segment->commandRing(i).size() - sizeof(ipc::RingHeader));
    completions[i].emplace(segment->completionRing(i),
                           segment->completionRing(i).size() - sizeof(ipc::RingHeader));
  }

  // Each pair's channel made, pumped and destroyed on a thread of its own, as a GPU's would be.
  std::array<AnsweringExecutor, kPairs> executors;
  std::atomic<bool> stop{false};
  std::vector<std::thread> servers;
  for (std::uint32_t i = 0; i < kPairs; ++i) {
    servers.emplace_back([&, i] {
      executors[i].servedBy(std::this_thread::get_id());
      ClientChannel channel(executors[i], segment, i);
      while (!stop.load(std::memory_order_acquire)) {
        if (channel.pump(64) == 0) {
          channel.hasWork();  // moves answers that waited for room, as the loop does
          std::this_thread::yield();
        }
      }
    });
  }

  std::array<std::uint64_t, kPairs> sent{};
  std::set<std::uint64_t> answered;
  std::vector<std::byte> record;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (answered.size() < kPairs * kPerRing && std::chrono::steady_clock::now() < deadline) {
    for (std::uint32_t i = 0; i < kPairs; ++i) {
      // Token i + 1, i + 1 + kPairs, ...: each ring's answers say which ring they came from.
      if (sent[i] < kPerRing) {
        ring::Synchronize sync;
        sync.context = 0x10 + i;
        sync.kind = ring::SynchronizeKind::kContext;
        sync.completionToken = 1 + i + kPairs * sent[i];
        std::array<std::byte, 64> bytes{};
        const std::size_t length = ring::encode(sync, bytes);
        if (commands[i]->tryWrite(std::span(bytes).first(length)) == ipc::RingStatus::kOk) {
          ++sent[i];
        }
      }
      while (completions[i]->read(record) == ipc::RingStatus::kOk) {
        const auto decoded = ring::decodeCompletion(record, segment->limits());
        const auto* completion = std::get_if<ring::Completion>(&decoded);
        ASSERT_NE(completion, nullptr);
        EXPECT_EQ((completion->token - 1) % kPairs, i) << "answered in another ring";
        EXPECT_TRUE(answered.insert(completion->token).second) << "answered twice";
      }
    }
  }
  stop.store(true, std::memory_order_release);
  for (std::thread& server : servers) server.join();

  EXPECT_EQ(answered.size(), kPairs * kPerRing);
  // Both threads added to the one word; nothing was lost between them.
  ipc::CompletionWaiter word(segment->completionWord());
  EXPECT_EQ(word.load(), kPairs * kPerRing);
  for (const AnsweringExecutor& executor : executors) {
    EXPECT_FALSE(executor.wrongThread());
    EXPECT_FALSE(executor.broken());
  }
}

}  // namespace
}  // namespace gpuproxy::server
