#include "ipc/fd_passing.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>

namespace gpuproxy::ipc {
namespace {

struct SocketPair {
  explicit SocketPair(int type = SOCK_STREAM) {
    int fds[2];
    if (::socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, fds) != 0) {
      throw std::system_error(errno, std::generic_category(), "socketpair");
    }
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
  UniqueFd a;
  UniqueFd b;
};

struct Pipe {
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category());
    read.reset(fds[0]);
    write.reset(fds[1]);
  }
  UniqueFd read;
  UniqueFd write;
};

int openDescriptorCount() {
  int count = 0;
  DIR* directory = ::opendir("/proc/self/fd");
  while (const dirent* entry = ::readdir(directory)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(directory);
  return count - 1;  // the directory's own descriptor
}

std::span<const std::byte> bytesOf(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

TEST(FdPassing, DescriptorsArriveWorkingAndCloseOnExec) {
  SocketPair sockets;
  Pipe pipe;
  const int toSend[] = {pipe.write.get()};
  sendWithFds(sockets.a.get(), bytesOf("segment"), toSend);

  std::byte buffer[64];
  ReceivedMessage message = receiveWithFds(sockets.b.get(), buffer, 2);
  ASSERT_EQ(message.bytes, 7u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buffer), 7), "segment");
  ASSERT_EQ(message.fds.size(), 1u);
  EXPECT_NE(message.fds[0].get(), pipe.write.get());
  EXPECT_EQ(::fcntl(message.fds[0].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

  // The received descriptor is the same pipe.
  ASSERT_EQ(::write(message.fds[0].get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(pipe.read.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
}

TEST(FdPassing, BytesWithoutDescriptors) {
  SocketPair sockets;
  sendWithFds(sockets.a.get(), bytesOf("plain"), {});
  std::byte buffer[16];
  ReceivedMessage message = receiveWithFds(sockets.b.get(), buffer, 4);
  EXPECT_EQ(message.bytes, 5u);
  EXPECT_TRUE(message.fds.empty());
}

TEST(FdPassing, TooManyDescriptorsAreAllClosedAndRejected) {
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET}) {
    SocketPair sockets(type);
    Pipe pipe;
    const std::vector<int> toSend(5, pipe.read.get());
    sendWithFds(sockets.a.get(), bytesOf("x"), toSend);
    const int before = openDescriptorCount();
    std::byte buffer[4];
    try {
      receiveWithFds(sockets.b.get(), buffer, 2);
      FAIL() << "accepted 5 descriptors where 2 were expected";
    } catch (const std::system_error& error) {
      EXPECT_EQ(error.code().value(), EPROTO) << error.what();
    }
    EXPECT_EQ(openDescriptorCount(), before) << "rejected descriptors leaked";
  }
}

TEST(FdPassing, FarTooManyDescriptorsAreRejectedWithoutLeaks) {
  // More than the receive buffer has room for: the kernel truncates (MSG_CTRUNC) and drops the
  // rest itself; the ones that did arrive must still be closed.
  SocketPair sockets;
  Pipe pipe;
  const std::vector<int> toSend(200, pipe.read.get());
  sendWithFds(sockets.a.get(), bytesOf("x"), toSend);
  const int before = openDescriptorCount();
  std::byte buffer[4];
  EXPECT_THROW(receiveWithFds(sockets.b.get(), buffer, 1), std::system_error);
  EXPECT_EQ(openDescriptorCount(), before);
}

TEST(FdPassing, UnexpectedDescriptorsWhenNoneAccepted) {
  SocketPair sockets;
  Pipe pipe;
  const int toSend[] = {pipe.read.get()};
  sendWithFds(sockets.a.get(), bytesOf("x"), toSend);
  std::byte buffer[4];
  EXPECT_THROW(receiveWithFds(sockets.b.get(), buffer, 0), std::system_error);
}

TEST(FdPassing, PeerClosedReadsAsZeroBytes) {
  SocketPair sockets;
  sockets.a.reset();
  std::byte buffer[4];
  EXPECT_EQ(receiveWithFds(sockets.b.get(), buffer, 1).bytes, 0u);
  EXPECT_THROW(sendWithFds(sockets.b.get(), bytesOf("x"), {}), std::system_error);  // no SIGPIPE
}

TEST(FdPassing, EmptyPayloadIsRefused) {
  SocketPair sockets;
  EXPECT_THROW(sendWithFds(sockets.a.get(), {}, {}), std::system_error);
}

}  // namespace
}  // namespace gpuproxy::ipc
