#pragma once
// A few bytes plus file descriptors over a connected Unix socket (SCM_RIGHTS). Cap'n Proto can
// carry descriptors on its own connection; this is the low-level path for tools, tests and
// anything that runs before or beside the RPC connection.

#include <cstddef>
#include <span>
#include <vector>

#include "ipc/unique_fd.hpp"

namespace gpuproxy::ipc {

// Sends `bytes` (at least one byte: a descriptor must ride on data) with `fds` attached to the
// first byte. Retries on EINTR and finishes short writes on stream sockets; never raises SIGPIPE.
// Throws std::system_error (EPIPE when the peer is gone).
void sendWithFds(int socket, std::span<const std::byte> bytes, std::span<const int> fds);

struct ReceivedMessage {
  std::size_t bytes = 0;  // bytes placed in the buffer; 0 means the peer closed the connection
  std::vector<UniqueFd> fds;
};

// One recvmsg into `buffer`, accepting up to `maxFds` descriptors, all close-on-exec. More
// descriptors than that, descriptors the kernel had to drop, or ancillary data of another kind
// are a protocol violation: every descriptor that did arrive is closed (nothing leaks into this
// process) and std::system_error(EPROTO) is thrown. Retries on EINTR. On a stream socket the
// bytes may be fewer than the sender sent; framing is the caller's business.
ReceivedMessage receiveWithFds(int socket, std::span<std::byte> buffer, std::size_t maxFds);

}  // namespace gpuproxy::ipc
