// The daemon's data-plane loop (server/data_plane/data_plane.hpp) serving one client's channel,
// whose client end this test plays through the segment's rings, as the stub does.
#include "server/data_plane/data_plane.hpp"

#include "ipc/spsc_ring.hpp"
#include "protocol/ring_format.hpp"

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace gpuproxy::server {
namespace {

namespace ring = protocol::ring;

class IdleExecutor final : public CommandExecutor {
public:
  void execute(const ring::DecodedCommand&, CommandPort&) override {}
  void channelBroken(const std::string&) override {}
};

class DataPlaneTest : public ::testing::Test {
protected:
  DataPlaneTest() {
    ChannelSizes sizes;
    sizes.commandRingCapacity = 4096;
    sizes.completionRingCapacity = 64;  // room for two completions
    sizes.stagingBytes = 4096;
    channel_ = std::make_unique<ClientChannel>(executor_, "data-plane-test", sizes);
    segment_.emplace(ipc::SharedSegment::map(ipc::UniqueFd(::dup(channel_->segmentFd())),
                                             channel_->segmentBytes()));
    ring::wire::SegmentHeader header;
    std::memcpy(&header, segment_->data(), sizeof(header));
    std::span<std::byte> region(segment_->data() + header.completionRing.offset,
                                header.completionRing.bytes);
    completions_.emplace(region, region.size() - sizeof(ipc::RingHeader));
    plane_.add(*channel_);
    loop_ = plane_.run().eagerlyEvaluate([](kj::Exception&& exception) {
      ADD_FAILURE() << "data-plane loop failed: " << exception.getDescription().cStr();
    });
  }

  // kj's Own and Promise destructors may throw; gtest's fixture destructor may not.
  ~DataPlaneTest() noexcept override {
    loop_ = nullptr;
    plane_.remove(*channel_);
  }

  // Turns the loop for `milliseconds`.
  void turnFor(unsigned milliseconds) {
    io_.provider->getTimer().afterDelay(milliseconds * kj::MILLISECONDS).wait(io_.waitScope);
  }

  // The next completion the client finds in its ring, if any.
  std::optional<ring::Completion> readCompletion() {
    std::vector<std::byte> record;
    if (completions_->read(record) != ipc::RingStatus::kOk) return std::nullopt;
    const auto decoded = ring::decodeCompletion(record, channel_->limits());
    if (const auto* completion = std::get_if<ring::Completion>(&decoded)) return *completion;
    ADD_FAILURE() << "not a completion record";
    return std::nullopt;
  }

  kj::AsyncIoContext io_ = kj::setupAsyncIo();
  DataPlane plane_{io_.unixEventPort, io_.provider->getTimer()};
  IdleExecutor executor_;
  std::unique_ptr<ClientChannel> channel_;
  std::optional<ipc::SharedSegment> segment_;
  std::optional<ipc::RingReader> completions_;
  kj::Promise<void> loop_ = nullptr;
};

TEST_F(DataPlaneTest, AnswersThatFoundTheCompletionRingFullReachTheClientOnceItReadsIt) {
  // The loop has nothing to do and sleeps on the doorbell.
  turnFor(20);
  // Three answers of work that finished meanwhile (a copy, a synchronisation): two fit.
  channel_->postCompletion(1, CUDA_SUCCESS);
  channel_->postCompletion(2, CUDA_SUCCESS);
  channel_->postCompletion(3, CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_TRUE(channel_->answersWaiting());

  // The client reads them and waits for the third, writing nothing (so ringing no doorbell).
  EXPECT_EQ(readCompletion(), (ring::Completion{1, CUDA_SUCCESS}));
  EXPECT_EQ(readCompletion(), (ring::Completion{2, CUDA_SUCCESS}));
  std::optional<ring::Completion> third;
  for (int turn = 0; turn < 2000 && !third; ++turn) {
    turnFor(1);
    third = readCompletion();
  }
  EXPECT_EQ(third, (ring::Completion{3, CUDA_ERROR_ILLEGAL_ADDRESS}));
  EXPECT_FALSE(channel_->answersWaiting());
}

}  // namespace
}  // namespace gpuproxy::server
