// The daemon's side of the data plane, spoken to by a hand-written client instead of the stub: the
// segment arrives over the socket, commands in the ring are executed in order and answered on the
// completion ring, control calls see every command published before them, a bad argument fails
// one command, and a client that breaks the format is cut off while others keep working.

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "ipc/doorbell.hpp"
#include "ipc/shared_segment.hpp"
#include "ipc/spsc_ring.hpp"
#include "protocol/ring_format.hpp"
#include "tests/support/process.hpp"

namespace gpuproxy::testing {
namespace {

namespace ring = protocol::ring;
using namespace std::chrono_literals;

int connectTo(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A client that attaches, takes the primary context of device 0 and opens its data plane.
class RawClient {
public:
  RawClient(kj::AsyncIoContext& io, const std::string& socketPath)
      : io_(io),
        stream_(io_.lowLevelProvider->wrapUnixSocketFd(
            connectTo(socketPath), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP)),
        client_(*stream_, 4),
        gateway_(client_.bootstrap().castAs<protocol::Gateway>()),
        session_(nullptr) {
    auto attach = gateway_.attachRequest();
    attach.setProtocolVersion(protocol::PROTOCOL_VERSION);
    session_ = attach.send().wait(io_.waitScope).getSession();
    auto retain = session_.retainPrimaryContextRequest();
    retain.setDevice(0);
    context_ = retain.send().wait(io_.waitScope).getContext();

    auto open = session_.openDataPlaneRequest().send().wait(io_.waitScope);
    EXPECT_EQ(open.getResult(), CUDA_SUCCESS);
    auto segmentFd = open.getSegment().getFd().wait(io_.waitScope);
    auto doorbellFd = open.getDoorbell().getFd().wait(io_.waitScope);
    KJ_IF_MAYBE (fd, segmentFd) {
      segment_ = ipc::SharedSegment::map(ipc::UniqueFd(::fcntl(*fd, F_DUPFD_CLOEXEC, 0)),
                                         open.getSegmentBytes());
    }
    KJ_IF_MAYBE (fd, doorbellFd) {
      doorbell_ = ipc::UniqueFd(::fcntl(*fd, F_DUPFD_CLOEXEC, 0));
    }
    auto header = ring::readSegmentHeader(segment_.bytes());
    header_ = std::get<ring::wire::SegmentHeader>(header);
    auto region = [&](const ring::wire::Region& r) {
      return std::span<std::byte>(segment_.data() + r.offset, r.bytes);
    };
    commands_.emplace(region(header_.commandRings),
                      header_.commandRings.bytes - sizeof(ipc::RingHeader));
    completions_.emplace(region(header_.completionRing),
                         header_.completionRing.bytes - sizeof(ipc::RingHeader));
  }

  std::uint64_t context() const { return context_; }
  protocol::Session::Client& session() { return session_; }
  kj::WaitScope& waitScope() { return io_.waitScope; }
  std::byte* staging() { return segment_.data() + header_.staging.offset; }

  std::uint64_t alloc(std::uint64_t bytes) {
    auto request = session_.memAllocRequest();
    request.setContext(context_);
    request.setBytes(bytes);
    auto response = request.send().wait(io_.waitScope);
    EXPECT_EQ(response.getResult(), CUDA_SUCCESS);
    return response.getPointer();
  }

  template <typename Command>
  void send(Command command) {
    command.sequence = ++sequence_;
    std::vector<std::byte> record(ring::encodedSize(command));
    ASSERT_EQ(ring::encode(command, record), record.size());
    sendRaw(record);
  }

  void sendRaw(std::span<const std::byte> record) {
    ASSERT_EQ(commands_->tryWrite(record), ipc::RingStatus::kOk);
    ipc::DoorbellRinger(commands_->consumerSleeping(), doorbell_.get()).ring();
  }

  // The next completion-ring record, waiting up to 10 s.
  std::optional<ring::DecodedCompletion> next() {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    std::vector<std::byte> record;
    while (std::chrono::steady_clock::now() < deadline) {
      if (completions_->read(record) == ipc::RingStatus::kOk) {
        return ring::decodeCompletion(record, ring::limitsOf(header_));
      }
      std::this_thread::sleep_for(50us);
    }
    return std::nullopt;
  }

  // Waits for the completion of `token`, skipping staging releases.
  CUresult await(std::uint64_t token) {
    for (;;) {
      auto record = next();
      if (!record) return CUDA_ERROR_TIMEOUT;
      if (auto* done = std::get_if<ring::Completion>(&*record)) {
        EXPECT_EQ(done->token, token);
        return done->result;
      }
      EXPECT_TRUE(std::holds_alternative<ring::StagingRelease>(*record));
    }
  }

  std::vector<std::uint32_t> readBack(std::uint64_t pointer, std::size_t words) {
    ring::CopyDeviceToHost copy;
    copy.context = context_;
    copy.source = pointer;
    copy.destination = {ring::HostRegion::kStaging, 0};
    copy.bytes = words * 4;
    copy.completionToken = ++token_;
    send(copy);
    EXPECT_EQ(await(copy.completionToken), CUDA_SUCCESS);
    std::vector<std::uint32_t> values(words);
    std::memcpy(values.data(), staging(), words * 4);
    return values;
  }

  std::uint64_t newToken() { return ++token_; }

private:
  kj::AsyncIoContext& io_;
  kj::Own<kj::AsyncCapabilityStream> stream_;
  capnp::TwoPartyClient client_;
  protocol::Gateway::Client gateway_;
  protocol::Session::Client session_;
  std::uint64_t context_ = 0;
  ipc::SharedSegment segment_;
  ipc::UniqueFd doorbell_;
  ring::wire::SegmentHeader header_{};
  std::optional<ipc::RingWriter> commands_;
  std::optional<ipc::RingReader> completions_;
  std::uint64_t sequence_ = 0;
  std::uint64_t token_ = 0;
};

ring::Memset fill(std::uint64_t context, std::uint64_t pointer, std::uint32_t value,
                  std::uint64_t count) {
  ring::Memset memset;
  memset.context = context;
  memset.destination = pointer;
  memset.value = value;
  memset.elementSize = 4;
  memset.count = count;
  return memset;
}

TEST(DataPlane, CommandsRunInOrderAndAnswerOnTheCompletionRing) {
  Daemon daemon;
  auto io = kj::setupAsyncIo();
  RawClient client(io, daemon.socketPath());
  const std::uint64_t buffer = client.alloc(4096);
  for (std::uint32_t i = 1; i <= 100; ++i) client.send(fill(client.context(), buffer, i, 1024));
  // Staged upload of the first 16 words, then read all back.
  std::vector<std::uint32_t> words(16, 0xabcdef01u);
  std::memcpy(client.staging() + 65536, words.data(), 64);
  ring::CopyHostToDevice upload;
  upload.context = client.context();
  upload.destination = buffer;
  upload.source = {ring::HostRegion::kStaging, 65536};
  upload.bytes = 64;
  client.send(upload);
  auto release = client.next();
  ASSERT_TRUE(release);
  ASSERT_TRUE(std::holds_alternative<ring::StagingRelease>(*release));
  EXPECT_EQ(std::get<ring::StagingRelease>(*release).offset, 65536u);

  auto values = client.readBack(buffer, 1024);
  EXPECT_EQ(values[0], 0xabcdef01u);
  EXPECT_EQ(values[15], 0xabcdef01u);
  EXPECT_EQ(values[16], 100u);
  EXPECT_EQ(values[1023], 100u);

  ring::Synchronize query;
  query.context = client.context();
  query.kind = ring::SynchronizeKind::kStream;
  query.query = true;
  query.completionToken = client.newToken();
  client.send(query);
  EXPECT_EQ(client.await(query.completionToken), CUDA_SUCCESS);
}

TEST(DataPlane, ControlCallsSeeEveryCommandPublishedBeforeThem) {
  Daemon daemon;
  auto io = kj::setupAsyncIo();
  RawClient client(io, daemon.socketPath());
  const std::uint64_t buffer = client.alloc(1 << 20);
  for (std::uint32_t round = 1; round <= 50; ++round) {
    client.send(fill(client.context(), buffer, round, (1 << 20) / 4));
    // Straight to the control plane, without waiting for anything on the ring.
    auto request = client.session().memcpyDtoHRequest();
    request.setContext(client.context());
    request.setSource(buffer + (1 << 20) - 4);
    request.setBytes(4);
    auto response = request.send().wait(client.waitScope());
    ASSERT_EQ(response.getResult(), CUDA_SUCCESS);
    std::uint32_t value = 0;
    std::memcpy(&value, response.getData().begin(), 4);
    ASSERT_EQ(value, round);
  }
}

TEST(DataPlane, BadArgumentsFailOneCommandAndTheClientGoesOn) {
  Daemon daemon;
  auto io = kj::setupAsyncIo();
  RawClient client(io, daemon.socketPath());
  const std::uint64_t buffer = client.alloc(4096);
  // A pointer this client does not own: the command fails, reported as an AsyncError.
  client.send(fill(client.context(), 0x1234'0000, 7, 16));
  auto error = client.next();
  ASSERT_TRUE(error);
  ASSERT_TRUE(std::holds_alternative<ring::AsyncError>(*error));
  EXPECT_EQ(std::get<ring::AsyncError>(*error).result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(std::get<ring::AsyncError>(*error).opcode,
            static_cast<std::uint16_t>(ring::Opcode::kMemset));
  // A stream that does not exist, on a waited-for command: the waiter gets the error.
  ring::Synchronize sync;
  sync.context = client.context();
  sync.kind = ring::SynchronizeKind::kStream;
  sync.handle = 0x7777;
  sync.completionToken = client.newToken();
  client.send(sync);
  EXPECT_EQ(client.await(sync.completionToken), CUDA_ERROR_INVALID_HANDLE);
  // Memset past the end of the allocation.
  client.send(fill(client.context(), buffer, 1, 4096));
  error = client.next();
  ASSERT_TRUE(error);
  ASSERT_TRUE(std::holds_alternative<ring::AsyncError>(*error));

  client.send(fill(client.context(), buffer, 42, 1024));
  EXPECT_EQ(client.readBack(buffer, 1024)[1023], 42u);
}

TEST(DataPlane, AClientThatBreaksTheFormatIsCutOffAndOthersGoOn) {
  Daemon daemon;
  auto io = kj::setupAsyncIo();
  RawClient bystander(io, daemon.socketPath());
  const std::uint64_t kept = bystander.alloc(4096);
  {
    RawClient vandal(io, daemon.socketPath());
    vandal.alloc(1 << 20);
    std::vector<std::byte> garbage(64, std::byte{0x5a});
    vandal.sendRaw(garbage);
    // The daemon ends the vandal's connection and frees what it held.
    EXPECT_TRUE(eventually([&] {
      auto status = daemon.status();
      return status["clients"].size() == 1 && status["devices"][0]["memory_used"] == 4096;
    }));
    auto request = vandal.session().memAllocRequest();
    request.setContext(vandal.context());
    request.setBytes(4096);
    EXPECT_ANY_THROW(request.send().wait(vandal.waitScope()));
  }
  EXPECT_NE(daemon.log().find("broke the data-plane format"), std::string::npos) << daemon.log();
  bystander.send(fill(bystander.context(), kept, 9, 1024));
  EXPECT_EQ(bystander.readBack(kept, 1024)[0], 9u);
}

}  // namespace
}  // namespace gpuproxy::testing
