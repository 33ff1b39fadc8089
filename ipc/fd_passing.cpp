#include "ipc/fd_passing.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

namespace gpuproxy::ipc {

namespace {

// Room for this many descriptors beyond what the caller accepts, so that a peer sending a few
// too many is detected (and those descriptors closed by us) rather than silently truncated.
constexpr std::size_t kExtraFdSlots = 16;

// Takes ownership of every descriptor in the control messages of `message`: the kernel has already
// installed them in this process, so each must end up owned (and closed if rejected).
void collectFds(msghdr& message, std::vector<UniqueFd>& fds, bool& foreign) {
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
       header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) {
      foreign = true;
      continue;
    }
    const std::size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(header);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));  // CMSG_DATA may be unaligned
      fds.emplace_back(fd);
    }
  }
}

}  // namespace

void sendWithFds(int socket, std::span<const std::byte> bytes, std::span<const int> fds) {
  if (bytes.empty()) {
    throw std::system_error(EINVAL, std::generic_category(), "sendWithFds needs at least 1 byte");
  }
  std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(fds.size_bytes()));
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    iovec io{const_cast<std::byte*>(bytes.data() + sent), bytes.size() - sent};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    if (sent == 0 && !fds.empty()) {
      message.msg_control = control.data();
      message.msg_controllen = control.size();
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(fds.size_bytes());
      std::memcpy(CMSG_DATA(header), fds.data(), fds.size_bytes());
    }
    const ssize_t result = ::sendmsg(socket, &message, MSG_NOSIGNAL);
    if (result < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(),
                              "sendmsg(" + std::to_string(fds.size()) + " fds)");
    }
    // The descriptors went with the first byte; a short write only leaves plain bytes to send.
    sent += static_cast<std::size_t>(result);
  }
}

ReceivedMessage receiveWithFds(int socket, std::span<std::byte> buffer, std::size_t maxFds) {
  std::vector<char> control(CMSG_SPACE((maxFds + kExtraFdSlots) * sizeof(int)));
  iovec io{buffer.data(), buffer.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  ssize_t result = 0;
  do {
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    result = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  } while (result < 0 && errno == EINTR);
  if (result < 0) throw std::system_error(errno, std::generic_category(), "recvmsg");

  ReceivedMessage received;
  received.bytes = static_cast<std::size_t>(result);
  bool foreign = false;
  collectFds(message, received.fds, foreign);
  if ((message.msg_flags & MSG_CTRUNC) != 0 || foreign || received.fds.size() > maxFds) {
    const std::size_t count = received.fds.size();
    received.fds.clear();  // closes them
    throw std::system_error(EPROTO, std::generic_category(),
                            "peer sent " + std::to_string(count) + " descriptors" +
                                (foreign ? " and foreign ancillary data" : "") +
                                ((message.msg_flags & MSG_CTRUNC) != 0 ? " (truncated)" : "") +
                                ", at most " + std::to_string(maxFds) + " expected");
  }
  return received;
}

}  // namespace gpuproxy::ipc
