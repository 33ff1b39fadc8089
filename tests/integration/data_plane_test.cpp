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
#include "ipc/unix_socket.hpp"
#include "protocol/ring_format.hpp"
#include "tests/support/process.hpp"

namespace gpuproxy::testing {
namespace {

namespace ring = protocol::ring;
using namespace std::chrono_literals;

int connectTo(const std::string& path) {
  return ipc::connectUnixSocket(path).release();
}

// A client that attaches, takes the primary context of `device` and opens its data plane (with a
// pinned heap of `pinnedHeapBytes`, which it maps wherever it likes: it writes no pointers). It
// writes into the ring pair of its context's device, as the stub does, unless told otherwise.
class RawClient {
public:
  RawClient(kj::AsyncIoContext& io, const std::string& socketPath,
            std::uint64_t pinnedHeapBytes = 0, std::uint32_t device = 0)
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
    retain.setDevice(device);
    context_ = retain.send().wait(io_.waitScope).getContext();

    auto request = session_.openDataPlaneRequest();
    if (pinnedHeapBytes > 0) {
      // The daemon maps the segment at an address both processes have free.
      heapAddress_ = ipc::AddressReservation::reserve(pinnedHeapBytes + (std::uint64_t{64} << 20));
      request.setPinnedHeapBytes(pinnedHeapBytes);
      request.setAddress(reinterpret_cast<std::uintptr_t>(heapAddress_.address()));
      request.setReservedBytes(heapAddress_.size());
    }
    auto open = request.send().wait(io_.waitScope);
    EXPECT_EQ(open.getResult(), CUDA_SUCCESS);
    EXPECT_EQ(open.getPinnedHeapBytes(), pinnedHeapBytes);
    auto segmentFd = open.getSegment().getFd().wait(io_.waitScope);
    KJ_IF_MAYBE (fd, segmentFd) {
      segment_ = ipc::SharedSegment::map(ipc::UniqueFd(::fcntl(*fd, F_DUPFD_CLOEXEC, 0)),
                                         open.getSegmentBytes());
    }
    auto header = ring::readSegmentHeader(segment_.bytes());
    header_ = std::get<ring::wire::SegmentHeader>(header);
    auto region = [&](const ring::wire::Region& r) {
      return std::span<std::byte>(segment_.data() + r.offset, r.bytes);
    };
    EXPECT_EQ(open.getDoorbells().size(), header_.commandRingCount);
    for (std::uint32_t i = 0; i < header_.commandRingCount; ++i) {
      RingPair& pair = rings_.emplace_back();
      auto doorbellFd = open.getDoorbells()[i].getFd().wait(io_.waitScope);
      KJ_IF_MAYBE (fd, doorbellFd) {
        pair.doorbell = ipc::UniqueFd(::fcntl(*fd, F_DUPFD_CLOEXEC, 0));
      }
      const ring::wire::Region commandRing = ring::commandRing(header_, i);
      const ring::wire::Region completionRing = ring::completionRing(header_, i);
      pair.commands.emplace(region(commandRing), commandRing.bytes - sizeof(ipc::RingHeader));
      pair.completions.emplace(region(completionRing),
                               completionRing.bytes - sizeof(ipc::RingHeader));
    }
    ring_ = device;
  }

  // The ring pair send() and next() use from now on (at first the context's device's).
  void useRing(std::uint32_t ring) { ring_ = ring; }
  std::size_t ringCount() const { return rings_.size(); }

  std::uint64_t context() const { return context_; }
  protocol::Session::Client& session() { return session_; }
  kj::WaitScope& waitScope() { return io_.waitScope; }
  std::byte* staging() { return segment_.data() + header_.staging.offset; }
  std::byte* pinnedHeap() { return segment_.data() + header_.pinnedHeap.offset; }

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
    RingPair& pair = rings_.at(ring_);
    ASSERT_EQ(pair.commands->tryWrite(record), ipc::RingStatus::kOk);
    ipc::DoorbellRinger(pair.commands->consumerSleeping(), pair.doorbell.get()).ring();
  }

  // Sends `records` in one Session.submit call and returns the answer's completion records and
  // payload.
  std::pair<std::vector<ring::DecodedCompletion>, std::vector<std::byte>> submit(
      std::span<const std::byte> records, std::span<const std::byte> payload = {},
      std::uint64_t payloadBytes = 0) {
    auto request = session_.submitRequest();
    request.setCommands(
        kj::arrayPtr(reinterpret_cast<const kj::byte*>(records.data()), records.size()));
    request.setPayload(
        kj::arrayPtr(reinterpret_cast<const kj::byte*>(payload.data()), payload.size()));
    request.setPayloadBytes(payloadBytes);
    auto response = request.send().wait(io_.waitScope);
    std::vector<ring::DecodedCompletion> answers;
    auto completions = response.getCompletions();
    std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(completions.begin()),
                                    completions.size());
    while (rest.size() >= sizeof(ring::wire::CompletionHeader)) {
      ring::wire::CompletionHeader header{};
      std::memcpy(&header, rest.data(), sizeof(header));
      answers.push_back(ring::decodeCompletion(rest.first(header.length), {}));
      rest = rest.subspan(header.length);
    }
    auto data = response.getPayload();
    return {answers, std::vector<std::byte>(reinterpret_cast<const std::byte*>(data.begin()),
                                            reinterpret_cast<const std::byte*>(data.end()))};
  }

  // The next completion-ring record, waiting up to 10 s.
  std::optional<ring::DecodedCompletion> next() {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    std::vector<std::byte> record;
    while (std::chrono::steady_clock::now() < deadline) {
      if (rings_.at(ring_).completions->read(record) == ipc::RingStatus::kOk) {
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
  ipc::AddressReservation heapAddress_;
  struct RingPair {
    std::optional<ipc::RingWriter> commands;
    std::optional<ipc::RingReader> completions;
    ipc::UniqueFd doorbell;
  };

  ipc::SharedSegment segment_;
  ring::wire::SegmentHeader header_{};
  std::vector<RingPair> rings_;
  std::uint32_t ring_ = 0;
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
    // Straight to the control socket, without waiting for anything on the ring: a copy record
    // carried by Session.submit, its bytes coming back in the call's payload.
    ring::CopyDeviceToHost copy;
    copy.context = client.context();
    copy.source = buffer + (1 << 20) - 4;
    copy.destination = ring::HostLocation{ring::HostRegion::kMessage, 0};
    copy.bytes = 4;
    copy.completionToken = 1;
    std::vector<std::byte> record(ring::encodedSize(copy));
    ASSERT_EQ(ring::encode(copy, record), record.size());
    auto request = client.session().submitRequest();
    request.setCommands(
        kj::arrayPtr(reinterpret_cast<const kj::byte*>(record.data()), record.size()));
    request.setPayloadBytes(4);
    auto response = request.send().wait(client.waitScope());
    auto completions = response.getCompletions();
    auto answer = ring::decodeCompletion(
        {reinterpret_cast<const std::byte*>(completions.begin()), completions.size()}, {});
    ASSERT_TRUE(std::holds_alternative<ring::Completion>(answer));
    ASSERT_EQ(std::get<ring::Completion>(answer).result, CUDA_SUCCESS);
    ASSERT_EQ(response.getPayload().size(), 4u);
    std::uint32_t value = 0;
    std::memcpy(&value, response.getPayload().begin(), 4);
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

// A record may name the pinned heap only inside one of the client's live pinned allocations:
// anywhere else (never allocated, past an allocation's end, freed) it fails as a bad pointer and
// the daemon writes nothing there, so it never touches pages the client has not paid for.
TEST(DataPlane, PinnedHeapRangesMustLieInsideALivePinnedAllocation) {
  Daemon daemon;
  auto io = kj::setupAsyncIo();
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
  RawClient client(io, daemon.socketPath(), 8 * kMiB);
  const std::uint64_t buffer = client.alloc(kMiB);
  client.send(fill(client.context(), buffer, 0x2a2a2a2a, kMiB / 4));
  auto pin = [&](std::uint64_t offset, std::uint64_t bytes) {
    auto request = client.session().registerPinnedRequest();
    request.setOffset(offset);
    request.setBytes(bytes);
    return static_cast<CUresult>(request.send().wait(client.waitScope()).getResult());
  };
  auto unpin = [&](std::uint64_t offset) {
    auto request = client.session().unregisterPinnedRequest();
    request.setOffset(offset);
    return static_cast<CUresult>(request.send().wait(client.waitScope()).getResult());
  };
  auto copyInto = [&](std::uint64_t offset, std::uint64_t bytes) {
    ring::CopyDeviceToHost copy;
    copy.context = client.context();
    copy.source = buffer;
    copy.destination = {ring::HostRegion::kPinnedHeap, offset};
    copy.bytes = bytes;
    copy.completionToken = client.newToken();
    client.send(copy);
    return client.await(copy.completionToken);
  };
  ASSERT_EQ(pin(0, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(copyInto(0, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(client.pinnedHeap()[kMiB - 1], std::byte{0x2a});
  EXPECT_EQ(copyInto(4 * kMiB, kMiB), CUDA_ERROR_INVALID_VALUE);  // never allocated
  EXPECT_EQ(copyInto(kMiB / 2, kMiB), CUDA_ERROR_INVALID_VALUE);  // runs past its end
  EXPECT_EQ(client.pinnedHeap()[4 * kMiB], std::byte{0});
  EXPECT_EQ(client.pinnedHeap()[kMiB], std::byte{0});
  ASSERT_EQ(unpin(0), CUDA_SUCCESS);
  std::memset(client.pinnedHeap(), 0, kMiB);
  EXPECT_EQ(copyInto(0, 4096), CUDA_ERROR_INVALID_VALUE);  // freed
  EXPECT_EQ(client.pinnedHeap()[0], std::byte{0});
}

// Without a ring (GPUPROXY_TRANSPORT=rpc) the same records travel in Session.submit calls and
// meet the same decoder and executor: host bytes come in and go out with the call.
TEST(DataPlane, SubmitCarriesTheSameRecordsUnderTheSameRules) {
  Daemon daemon;
  auto io = kj::setupAsyncIo();
  RawClient client(io, daemon.socketPath());
  const std::uint64_t buffer = client.alloc(8192);
  auto encodedRecord = [](auto command) {
    std::vector<std::byte> record(ring::encodedSize(command));
    EXPECT_EQ(ring::encode(command, record), record.size());
    return record;
  };
  // Two records in one call: bytes in from the call's payload, then a memset over part of them.
  std::vector<std::byte> bytes(8192);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i % 251);
  ring::CopyHostToDevice in;
  in.context = client.context();
  in.destination = buffer;
  in.source = ring::HostLocation{ring::HostRegion::kMessage, 0};
  in.bytes = bytes.size();
  std::vector<std::byte> records = encodedRecord(in);
  const auto memset = encodedRecord(fill(client.context(), buffer + 4096, 0x01020304, 16));
  records.insert(records.end(), memset.begin(), memset.end());
  auto [answers, none] = client.submit(records, bytes);
  EXPECT_TRUE(answers.empty());  // nothing failed, nobody waited
  EXPECT_TRUE(none.empty());

  // And out again into the answer's payload, behind a bad-argument record that fails alone.
  std::vector<std::byte> batch = encodedRecord(fill(client.context(), 0x1234'0000, 7, 16));
  ring::CopyDeviceToHost out;
  out.context = client.context();
  out.source = buffer;
  out.destination = ring::HostLocation{ring::HostRegion::kMessage, 0};
  out.bytes = bytes.size();
  out.completionToken = 5;
  const auto outRecord = encodedRecord(out);
  batch.insert(batch.end(), outRecord.begin(), outRecord.end());
  auto [results, payload] = client.submit(batch, {}, bytes.size());
  ASSERT_EQ(results.size(), 2u);
  ASSERT_TRUE(std::holds_alternative<ring::AsyncError>(results[0]));
  EXPECT_EQ(std::get<ring::AsyncError>(results[0]).result, CUDA_ERROR_INVALID_VALUE);
  ASSERT_TRUE(std::holds_alternative<ring::Completion>(results[1]));
  EXPECT_EQ(std::get<ring::Completion>(results[1]), (ring::Completion{5, CUDA_SUCCESS}));
  ASSERT_EQ(payload.size(), bytes.size());
  EXPECT_TRUE(std::equal(payload.begin(), payload.begin() + 4096, bytes.begin()));
  for (std::size_t i = 4096; i < 4096 + 64; i += 4) {
    std::uint32_t value = 0;
    std::memcpy(&value, payload.data() + i, 4);
    EXPECT_EQ(value, 0x01020304u) << i;
  }

  // A copy past the call's payload fails as a range outside its region; the client goes on.
  out.bytes = protocol::MAX_TRANSFER_CHUNK + 1;
  auto [tooFar, empty] = client.submit(encodedRecord(out), {}, out.bytes);
  ASSERT_EQ(tooFar.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<ring::Completion>(tooFar[0]));
  EXPECT_EQ(std::get<ring::Completion>(tooFar[0]).result, CUDA_ERROR_INVALID_VALUE);

  // Garbage breaks the framing: the client is cut off, as on its ring.
  std::vector<std::byte> garbage(40, std::byte{0x5a});
  EXPECT_ANY_THROW(client.submit(garbage));
  EXPECT_TRUE(eventually([&] { return daemon.status()["clients"].size() == 0; }));
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

TEST(DataPlane, EachDevicesRecordsGoInItsOwnRingAndNoOther) {
  Daemon::Options options;
  options.simDevices = 2;
  Daemon daemon(options);
  auto io = kj::setupAsyncIo();
  RawClient client(io, daemon.socketPath(), 0, /*device=*/1);
  ASSERT_EQ(client.ringCount(), 2u);
  const std::uint64_t buffer = client.alloc(4096);
  auto synchronize = [&](std::uint64_t context) {
    ring::Synchronize sync;
    sync.context = context;
    sync.kind = ring::SynchronizeKind::kContext;
    sync.completionToken = client.newToken();
    client.send(sync);
    return client.await(sync.completionToken);
  };
  // Device 0's ring, before the client has anything on device 0: device 1's context is unknown
  // there, and only that command fails.
  client.useRing(0);
  EXPECT_EQ(synchronize(client.context()), CUDA_ERROR_INVALID_CONTEXT);
  // Nor once it has a context of its own there.
  auto retain = client.session().retainPrimaryContextRequest();
  retain.setDevice(0);
  const std::uint64_t onDevice0 = retain.send().wait(client.waitScope()).getContext();
  EXPECT_EQ(synchronize(client.context()), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(synchronize(onDevice0), CUDA_SUCCESS);
  // In its own device's ring, the context's records run.
  client.useRing(1);
  client.send(fill(client.context(), buffer, 7, 1024));
  EXPECT_EQ(client.readBack(buffer, 1024)[1023], 7u);
  EXPECT_EQ(synchronize(onDevice0), CUDA_ERROR_INVALID_CONTEXT);
}

}  // namespace
}  // namespace gpuproxy::testing
