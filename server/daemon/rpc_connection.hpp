#pragma once
// What the daemon's listening sockets share: opening one without waiting (safe inside event
// callbacks such as a SIGHUP handler or an admin call), and one accepted connection with the
// Cap'n Proto RPC system that serves it.

#include "ipc/unix_socket.hpp"
#include "protocol/limits.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <cstdint>
#include <string>

namespace gpuproxy::server {

inline constexpr std::uint64_t kMaxMessageWords =
    protocol::kMaxControlMessageBytes / sizeof(capnp::word);

// A listening socket at a path and the event loop's side of it. The receiver is declared last, so
// it is destroyed (closing the descriptor) before the socket file is removed.
struct UnixListener {
  ipc::ListeningSocket socket;
  kj::Own<kj::ConnectionReceiver> receiver;
};

// Opens `path` with `mode` (0666 for clients, who are admitted by who can reach the path; 0600 for
// the admin socket). Throws std::runtime_error with a one-line reason, leaving nothing behind.
inline UnixListener listenUnix(kj::AsyncIoContext& io, const std::string& path, mode_t mode) {
  UnixListener listener{ipc::ListeningSocket::open(path, mode), {}};
  listener.receiver = io.lowLevelProvider->wrapListenSocketFd(
      listener.socket.releaseFd(), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                                       kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                                       kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK);
  return listener;
}

// One accepted connection: its stream and the RPC system serving its bootstrap capability.
struct RpcConnection {
  RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap)
      : stream_(kj::mv(stream)),
        network_(*stream_, capnp::rpc::twoparty::Side::SERVER, readerOptions()),
        rpc_(capnp::makeRpcServer(network_, kj::mv(bootstrap))) {}
  // A client connection, which passes file descriptors (the data-plane segment).
  RpcConnection(kj::Own<kj::AsyncCapabilityStream> stream, capnp::Capability::Client bootstrap)
      : capabilityStream_(kj::mv(stream)),
        network_(*capabilityStream_, protocol::kMaxFdsPerMessage,
                 capnp::rpc::twoparty::Side::SERVER, readerOptions()),
        rpc_(capnp::makeRpcServer(network_, kj::mv(bootstrap))) {}

  static capnp::ReaderOptions readerOptions() {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kMaxMessageWords;
    return options;
  }

  kj::Own<kj::AsyncIoStream> stream_;
  kj::Own<kj::AsyncCapabilityStream> capabilityStream_;
  capnp::TwoPartyVatNetwork network_;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc_;
};

}  // namespace gpuproxy::server
