// The daemon's data-plane loop (server/data_plane/data_plane.hpp) serving one client's ring pairs,
// whose client end this test plays through the segment's rings, as the stub does.
#include "server/data_plane/data_plane.hpp"

#include "ipc/doorbell.hpp"
#include "ipc/spsc_ring.hpp"
#include "protocol/ring_format.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace gpuproxy::server {
namespace {

namespace ring = protocol::ring;

// Remembers what it was handed, and answers each synchronisation at once.
class RecordingExecutor final : public CommandExecutor {
public:
  void execute(const ring::DecodedCommand& command, CommandPort& port) override {
    executed.push_back(command);
    if (const auto* sync = std::get_if<ring::Synchronize>(&command)) {
      port.postCompletion(sync->completionToken, CUDA_SUCCESS);
    }
  }
  void channelBroken(const std::string& reason) override { broken.push_back(reason); }
  std::vector<ring::DecodedCommand> executed;
  std::vector<std::string> broken;
};

class DataPlaneTest : public ::testing::Test {
protected:
  static constexpr std::uint32_t kRingPairs = 2;

  DataPlaneTest() {
    ChannelSizes sizes;
    sizes.ringPairs = kRingPairs;
    sizes.commandRingCapacity = 4096;
    sizes.completionRingCapacity = 64;  // room for two completions
    sizes.stagingBytes = 4096;
    auto segment = std::make_shared<ClientSegment>("data-plane-test", sizes);
    for (std::uint32_t i = 0; i < kRingPairs; ++i) {
      channels_[i] = std::make_unique<ClientChannel>(executors_[i], segment, i);
    }
    // The client's mapping of it, from the descriptor it is handed.
    client_.emplace(ipc::SharedSegment::map(ipc::UniqueFd(::dup(segment->fd())), segment->bytes()));
    ring::wire::SegmentHeader header;
    std::memcpy(&header, client_->data(), sizeof(header));
    limits_ = ring::limitsOf(header);
    for (std::uint32_t i = 0; i < kRingPairs; ++i) {
      commands_[i].emplace(regionOf(ring::commandRing(header, i)),
                           ring::commandRing(header, i).bytes - sizeof(ipc::RingHeader));
      completions_[i].emplace(regionOf(ring::completionRing(header, i)),
                              ring::completionRing(header, i).bytes - sizeof(ipc::RingHeader));
      plane_.add(*channels_[i]);
    }
    word_ = reinterpret_cast<ipc::CompletionWord*>(client_->data() + header.control.offset);
    loop_ = plane_.run().eagerlyEvaluate([](kj::Exception&& exception) {
      ADD_FAILURE() << "data-plane loop failed: " << exception.getDescription().cStr();
    });
  }

  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~DataPlaneTest() noexcept override {
    loop_ = nullptr;
    for (auto& channel : channels_) plane_.remove(*channel);
  }

  std::span<std::byte> regionOf(const ring::wire::Region& region) {
    return {client_->data() + region.offset, static_cast<std::size_t>(region.bytes)};
  }

  // Turns the loop for `milliseconds`.
  void turnFor(unsigned milliseconds) {
    io_.provider->getTimer().afterDelay(milliseconds * kj::MILLISECONDS).wait(io_.waitScope);
  }

  // Writes a synchronisation into command ring `index` and rings its doorbell, as the stub does.
  void submitSynchronize(std::uint32_t index, std::uint64_t token) {
    ring::Synchronize sync;
    sync.context = 0x10 + index;
    sync.kind = ring::SynchronizeKind::kContext;
    sync.completionToken = token;
    std::array<std::byte, 64> record{};
    const std::size_t bytes = ring::encode(sync, record);
    submitRaw(index, std::span(record).first(bytes));
  }

  void submitRaw(std::uint32_t index, std::span<const std::byte> record) {
    ASSERT_EQ(commands_[index]->tryWrite(record), ipc::RingStatus::kOk);
    ipc::DoorbellRinger(commands_[index]->consumerSleeping(), channels_[index]->doorbellFd())
        .ring();
  }

  // The next completion the client finds in completion ring `index`, if any.
  std::optional<ring::Completion> readCompletion(std::uint32_t index = 0) {
    std::vector<std::byte> record;
    if (completions_[index]->read(record) != ipc::RingStatus::kOk) return std::nullopt;
    const auto decoded = ring::decodeCompletion(record, limits_);
    if (const auto* completion = std::get_if<ring::Completion>(&decoded)) return *completion;
    ADD_FAILURE() << "not a completion record";
    return std::nullopt;
  }

  std::uint32_t published() const {
    return std::atomic_ref<std::uint32_t>(word_->value).load(std::memory_order_acquire);
  }

  kj::AsyncIoContext io_ = kj::setupAsyncIo();
  DataPlane plane_{io_.unixEventPort, io_.provider->getTimer()};
  std::array<RecordingExecutor, kRingPairs> executors_;
  std::array<std::unique_ptr<ClientChannel>, kRingPairs> channels_;
  std::optional<ipc::SharedSegment> client_;
  ring::SegmentLimits limits_;
  std::array<std::optional<ipc::RingWriter>, kRingPairs> commands_;
  std::array<std::optional<ipc::RingReader>, kRingPairs> completions_;
  ipc::CompletionWord* word_ = nullptr;
  kj::Promise<void> loop_ = nullptr;
};

TEST_F(DataPlaneTest, AnswersThatFoundTheCompletionRingFullReachTheClientOnceItReadsIt) {
  // The loop has nothing to do and sleeps on the doorbells.
  turnFor(20);
  // Three answers of work that finished meanwhile (a copy, a synchronisation): two fit.
  channels_[0]->postCompletion(1, CUDA_SUCCESS);
  channels_[0]->postCompletion(2, CUDA_SUCCESS);
  channels_[0]->postCompletion(3, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_TRUE(channels_[0]->answersWaiting());

  // The client reads them and waits for the third, writing nothing (so ringing no doorbell).
  EXPECT_EQ(readCompletion(), (ring::Completion{1, CUDA_SUCCESS}));
  EXPECT_EQ(readCompletion(), (ring::Completion{2, CUDA_SUCCESS}));
  std::optional<ring::Completion> third;
  for (int turn = 0; turn < 2000 && !third; ++turn) {
    turnFor(1);
    third = readCompletion();
  }
  EXPECT_EQ(third, (ring::Completion{3, CUDA_ERROR_ILLEGAL_ADDRESS}));
  EXPECT_FALSE(channels_[0]->answersWaiting());
}

TEST_F(DataPlaneTest, EachRingPairsRecordsReachItsOwnExecutorAndAnswerInItsOwnRing) {
  turnFor(20);  // asleep: each record must ring its own ring's doorbell
  submitSynchronize(1, 7);
  for (int turn = 0; turn < 2000 && executors_[1].executed.empty(); ++turn) turnFor(1);
  ASSERT_EQ(executors_[1].executed.size(), 1u);
  EXPECT_TRUE(executors_[0].executed.empty());
  EXPECT_EQ(std::get<ring::Synchronize>(executors_[1].executed[0]).context, 0x11u);
  EXPECT_EQ(readCompletion(0), std::nullopt);
  EXPECT_EQ(readCompletion(1), (ring::Completion{7, CUDA_SUCCESS}));

  submitSynchronize(0, 8);
  for (int turn = 0; turn < 2000 && executors_[0].executed.empty(); ++turn) turnFor(1);
  ASSERT_EQ(executors_[0].executed.size(), 1u);
  EXPECT_EQ(readCompletion(0), (ring::Completion{8, CUDA_SUCCESS}));
  // One word counts the answers of both rings: the client's waiter sleeps on it alone.
  EXPECT_EQ(published(), 2u);
}

TEST_F(DataPlaneTest, ARingIsDrainedOnlyOnceEveryRecordPublishedInItHasBeenExecuted) {
  // What a control call asks before it runs: a ring that is not drained must first be pumped on
  // its GPU's thread (a message), one that is needs nothing.
  EXPECT_TRUE(channels_[0]->drained());
  // Published but not read yet: the loop runs only while this thread waits.
  submitSynchronize(0, 9);
  submitSynchronize(0, 10);
  EXPECT_FALSE(channels_[0]->drained());
  EXPECT_TRUE(channels_[1]->drained());
  for (int turn = 0; turn < 2000 && executors_[0].executed.size() < 2; ++turn) turnFor(1);
  ASSERT_EQ(executors_[0].executed.size(), 2u);
  EXPECT_TRUE(channels_[0]->drained());
}

TEST_F(DataPlaneTest, ARecordThatCannotBeFramedStopsItsRingAndReachesNoExecutor) {
  // A record of an opcode no version has, then a good one behind it.
  ring::wire::CommandHeader header{};
  header.opcode = 0x7fff;
  header.length = sizeof(header);
  header.sequence = 1;
  std::array<std::byte, sizeof(header)> record{};
  std::memcpy(record.data(), &header, sizeof(header));
  submitRaw(0, record);
  submitSynchronize(0, 9);
  for (int turn = 0; turn < 2000 && executors_[0].broken.empty(); ++turn) turnFor(1);
  ASSERT_EQ(executors_[0].broken.size(), 1u);
  turnFor(20);
  EXPECT_TRUE(executors_[0].executed.empty());
  EXPECT_TRUE(channels_[0]->broken());
  EXPECT_EQ(readCompletion(0), std::nullopt);
  // The client's other ring is not this one's business: the session ends the connection.
  EXPECT_FALSE(channels_[1]->broken());
}

}  // namespace
}  // namespace gpuproxy::server
