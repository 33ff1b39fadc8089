#include "ipc/shared_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include <gtest/gtest.h>

#include "ipc/fd_passing.hpp"
#include "tests/unit/ipc/forked_child.hpp"

namespace gpuproxy::ipc {
namespace {

using test::ForkedChild;

struct SocketPair {
  SocketPair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      throw std::system_error(errno, std::generic_category(), "socketpair");
    }
    daemon.reset(fds[0]);
    client.reset(fds[1]);
  }
  UniqueFd daemon;
  UniqueFd client;
};

// What the "daemon" tells the "client" beside the descriptor.
struct Announcement {
  std::uint64_t bytes;
  std::uintptr_t address;
};

void announce(int socket, const SharedSegment& segment, void* address) {
  const Announcement message{segment.size(), reinterpret_cast<std::uintptr_t>(address)};
  const int fd = segment.fd();
  sendWithFds(socket, std::as_bytes(std::span(&message, 1)), std::span(&fd, 1));
}

// The client half: receives the segment and maps it (at the announced address, if any).
SharedSegment receiveSegment(int socket, bool atSameAddress) {
  Announcement message{};
  ReceivedMessage received =
      receiveWithFds(socket, std::as_writable_bytes(std::span(&message, 1)), 1);
  if (received.bytes != sizeof(message) || received.fds.size() != 1) {
    throw std::runtime_error("bad announcement");
  }
  return SharedSegment::map(std::move(received.fds[0]), message.bytes,
                            atSameAddress ? reinterpret_cast<void*>(message.address) : nullptr);
}

TEST(SharedSegment, ChildMapsSegmentReceivedOverSocketAndSeesWrites) {
  SocketPair sockets;
  SharedSegment segment = SharedSegment::create("gpuproxy-test", 10000);
  ASSERT_EQ(segment.size() % pageSize(), 0u);
  ASSERT_GE(segment.size(), 10000u);
  std::memcpy(segment.data(), "hello", 6);

  ForkedChild child([&] {
    SharedSegment mine = receiveSegment(sockets.client.get(), false);
    if (std::memcmp(mine.data(), "hello", 6) != 0) return 1;
    std::memcpy(mine.data() + 100, "world", 6);
    return 0;
  });
  announce(sockets.daemon.get(), segment, nullptr);
  ASSERT_EQ(child.wait(), 0);
  EXPECT_STREQ(reinterpret_cast<const char*>(segment.data() + 100), "world");
}

TEST(SharedSegment, FixedAddressIsTheSameInBothProcesses) {
  SocketPair sockets;
  const std::size_t bytes = 4 * pageSize();
  // The child is forked before the daemon side maps anything, so that its address space does not
  // inherit the mapping: it has to map the segment at the address it is told.
  ForkedChild child([&] {
    Announcement message{};
    ReceivedMessage received =
        receiveWithFds(sockets.client.get(), std::as_writable_bytes(std::span(&message, 1)), 1);
    if (received.fds.size() != 1) return 1;
    void* address = reinterpret_cast<void*>(message.address);
    if (::msync(address, pageSize(), MS_ASYNC) == 0 || errno != ENOMEM) return 2;  // not mapped yet
    SharedSegment mine = SharedSegment::map(std::move(received.fds[0]), message.bytes, address);
    if (mine.data() != address) return 3;
    // A pointer stored in the segment by the other side means the same thing here.
    const std::byte* pointer = *reinterpret_cast<std::byte**>(mine.data());
    return std::memcmp(pointer, "pinned", 7) == 0 ? 0 : 4;
  });

  AddressReservation reservation = AddressReservation::reserve(bytes);
  void* address = reservation.address();
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(address) % AddressReservation::kAlignment, 0u);
  SharedSegment segment = SharedSegment::create("gpuproxy-heap", bytes, &reservation);
  ASSERT_EQ(segment.data(), address);
  EXPECT_EQ(reservation.address(), nullptr);  // taken over by the segment
  auto** slot = reinterpret_cast<std::byte**>(segment.data());
  *slot = segment.data() + 64;
  std::memcpy(segment.data() + 64, "pinned", 7);

  announce(sockets.daemon.get(), segment, address);
  EXPECT_EQ(child.wait(), 0);
}

TEST(SharedSegment, FixedAddressInUseFailsWithoutClobberingIt) {
  SharedSegment segment = SharedSegment::create("gpuproxy-test", pageSize());
  SharedSegment occupant = SharedSegment::create("occupant", pageSize());
  std::memcpy(occupant.data(), "mine", 5);
  UniqueFd copy(::fcntl(segment.fd(), F_DUPFD_CLOEXEC, 0));
  try {
    SharedSegment::map(std::move(copy), segment.size(), occupant.data());
    FAIL() << "mapped over an existing mapping";
  } catch (const std::system_error& error) {
    EXPECT_EQ(error.code().value(), EEXIST) << error.what();
  }
  EXPECT_STREQ(reinterpret_cast<const char*>(occupant.data()), "mine");
}

TEST(SharedSegment, MapOverAReservationTakesItOverAndFreesTheRest) {
  SharedSegment created = SharedSegment::create("over-reservation", 4 * pageSize());
  std::memcpy(created.data(), "same", 5);
  AddressReservation reservation = AddressReservation::reserve(16 * pageSize());
  auto* base = static_cast<std::byte*>(reservation.address());
  SharedSegment mapped = SharedSegment::map(UniqueFd(::fcntl(created.fd(), F_DUPFD_CLOEXEC, 0)),
                                            created.size(), reservation);
  EXPECT_EQ(mapped.data(), base);
  EXPECT_EQ(reservation.address(), nullptr);
  EXPECT_STREQ(reinterpret_cast<const char*>(mapped.data()), "same");
  // The tail of the reservation went back: the range is free for anyone again.
  AddressReservation tail = AddressReservation::reserveAt(base + 4 * pageSize(), 12 * pageSize());
  EXPECT_EQ(tail.address(), base + 4 * pageSize());

  AddressReservation tooSmall = AddressReservation::reserve(pageSize());
  EXPECT_THROW(SharedSegment::map(UniqueFd(::fcntl(created.fd(), F_DUPFD_CLOEXEC, 0)),
                                  created.size(), tooSmall),
               std::system_error);
}

TEST(SharedSegment, ReserveSkipsRangesAlreadyInUse) {
  AddressReservation first = AddressReservation::reserve(pageSize());
  AddressReservation second =
      AddressReservation::reserve(pageSize(), reinterpret_cast<std::uintptr_t>(first.address()));
  EXPECT_NE(first.address(), second.address());
  EXPECT_THROW(AddressReservation::reserveAt(first.address(), pageSize()), std::system_error);
}

TEST(SharedSegment, SealedSegmentCannotBeResized) {
  SharedSegment segment = SharedSegment::create("gpuproxy-test", pageSize());
  const int seals = ::fcntl(segment.fd(), F_GET_SEALS);
  EXPECT_EQ(seals & SharedSegment::kRequiredSeals, SharedSegment::kRequiredSeals);
  // What a hostile client would try with its copy of the descriptor.
  EXPECT_NE(::ftruncate(segment.fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(segment.fd(), static_cast<off_t>(segment.size() * 2)), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::fcntl(segment.fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  EXPECT_EQ(errno, EPERM);
  segment.data()[segment.size() - 1] = std::byte{1};  // still fully mapped and writable
}

TEST(SharedSegment, MapRejectsWrongSize) {
  SharedSegment segment = SharedSegment::create("gpuproxy-test", pageSize());
  UniqueFd copy(::fcntl(segment.fd(), F_DUPFD_CLOEXEC, 0));
  EXPECT_THROW(SharedSegment::map(std::move(copy), 2 * pageSize()), std::system_error);
}

TEST(SharedSegment, MapRejectsUnsealedMemfd) {
  UniqueFd fd(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd);
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(pageSize())), 0);
  try {
    SharedSegment::map(std::move(fd), pageSize());
    FAIL() << "accepted a segment the sender could still shrink";
  } catch (const std::system_error& error) {
    EXPECT_EQ(error.code().value(), EPERM) << error.what();
  }
}

TEST(SharedSegment, MapRejectsNonMemfd) {
  int pipeFds[2];
  ASSERT_EQ(::pipe2(pipeFds, O_CLOEXEC), 0);
  UniqueFd readEnd(pipeFds[0]);
  UniqueFd writeEnd(pipeFds[1]);
  EXPECT_THROW(SharedSegment::map(std::move(readEnd), 0), std::system_error);
}

TEST(SharedSegment, MoveTransfersOwnership) {
  SharedSegment segment = SharedSegment::create("gpuproxy-test", pageSize());
  std::byte* data = segment.data();
  SharedSegment moved = std::move(segment);
  EXPECT_FALSE(segment.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(moved.data(), data);
  moved = SharedSegment();
  EXPECT_FALSE(moved.valid());
}

// cuMemHostRegister's path: the stub finds the memfd behind a range of its shared segment, and
// the daemon maps that window at the same address and sees the same bytes.
TEST(SharedWindow, FoundForASharedSegmentAndMappedAtTheSameAddressElsewhere) {
  SharedSegment segment = SharedSegment::create("gpuproxy-test", 4 * pageSize());
  std::byte* range = segment.data() + pageSize();
  auto window = sharedWindowOf(range, 2 * pageSize());
  ASSERT_TRUE(window.has_value());
  EXPECT_EQ(window->fileOffset, pageSize());
  SocketPair sockets;
  ForkedChild child([&] {
    std::byte byte{};
    ReceivedMessage received = receiveWithFds(sockets.client.get(), std::span(&byte, 1), 1);
    if (received.fds.size() != 1) return 1;
    // The parent's range is free in the child once the child unmaps its inherited copy.
    ::munmap(segment.data(), segment.size());
    SharedSegment mapped =
        SharedSegment::mapWindow(std::move(received.fds[0]), pageSize(), 2 * pageSize(), range);
    if (mapped.data() != range) return 2;
    std::memcpy(mapped.data() + 10, "window", 6);
    return 0;
  });
  const int fd = window->fd.get();
  const char nothing = 0;
  sendWithFds(sockets.daemon.get(), std::as_bytes(std::span(&nothing, 1)), std::span(&fd, 1));
  ASSERT_EQ(child.wait(), 0);
  EXPECT_EQ(std::memcmp(range + 10, "window", 6), 0);
}

TEST(SharedWindow, NoneForPrivateMemoryOrARangeSpanningMappings) {
  void* anonymous =
      ::mmap(nullptr, 2 * pageSize(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anonymous, MAP_FAILED);
  EXPECT_FALSE(sharedWindowOf(anonymous, pageSize()).has_value());
  ::munmap(anonymous, 2 * pageSize());
  SharedSegment segment = SharedSegment::create("gpuproxy-test", pageSize());
  EXPECT_FALSE(sharedWindowOf(segment.data(), 2 * pageSize()).has_value());
}

// cuMemHostRegister of whole pages of private memory: they move into a sealed memfd where they
// are, with their contents, and are then found as any shared window; a range that is not wholly
// private anonymous memory, or not whole pages, is left alone.
TEST(SharedWindow, PrivatePagesAreSharedInPlaceWithTheirContents) {
  const std::size_t bytes = 3 * pageSize();
  void* mapping =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapping, MAP_FAILED);
  auto* data = static_cast<unsigned char*>(mapping);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 7);
  EXPECT_FALSE(shareInPlace(data + 1, pageSize()).has_value());  // not page-aligned
  auto moved = shareInPlace(mapping, bytes);
  ASSERT_TRUE(moved.has_value());
  bool kept = true;
  for (std::size_t i = 0; i < bytes; ++i)
    kept = kept && data[i] == static_cast<unsigned char>(i * 7);
  EXPECT_TRUE(kept);
  auto window = sharedWindowOf(data + pageSize(), pageSize());
  ASSERT_TRUE(window.has_value());
  EXPECT_EQ(window->fileOffset, pageSize());
  // The same memory through the memfd: a write here is seen there.
  data[pageSize() + 5] = 0xab;
  void* other = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, moved->fd.get(), 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(static_cast<unsigned char*>(other)[pageSize() + 5], 0xab);
  ::munmap(other, bytes);
  // Shared memory already, or read-only memory: not moved.
  EXPECT_FALSE(shareInPlace(mapping, bytes).has_value());
  void* readOnly = ::mmap(nullptr, pageSize(), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(readOnly, MAP_FAILED);
  EXPECT_FALSE(shareInPlace(readOnly, pageSize()).has_value());
  ::munmap(readOnly, pageSize());
  ::munmap(mapping, bytes);
}

TEST(SharedWindow, MapWindowRefusesAFileThatCouldShrinkOrAWindowPastItsEnd) {
  UniqueFd unsealed(::memfd_create("gpuproxy-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(unsealed);
  ASSERT_EQ(::ftruncate(unsealed.get(), static_cast<off_t>(2 * pageSize())), 0);
  EXPECT_THROW(SharedSegment::mapWindow(std::move(unsealed), 0, pageSize(), nullptr),
               std::system_error);
  SharedSegment segment = SharedSegment::create("gpuproxy-test", 2 * pageSize());
  UniqueFd fd(::fcntl(segment.fd(), F_DUPFD_CLOEXEC, 0));
  AddressReservation free =
      AddressReservation::reserve(4 * pageSize(), AddressReservation::kDefaultHint);
  void* at = free.address();
  free = AddressReservation();
  try {
    SharedSegment::mapWindow(std::move(fd), pageSize(), 2 * pageSize(), at);
    FAIL() << "mapped a window past the end of its file";
  } catch (const std::system_error& error) {
    EXPECT_EQ(error.code().value(), EINVAL) << error.what();
  }
}

}  // namespace
}  // namespace gpuproxy::ipc
