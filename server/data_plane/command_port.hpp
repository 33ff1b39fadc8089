#pragma once
// How command records (protocol/RING_FORMAT.md) reach the session that executes them, and how the
// answers go back. Records come two ways, with one decoder and one executor for both:
//
// - a client's command ring (ClientChannel): answers go into its completion ring, host bytes are
//   the segment's staging area and pinned heap;
// - a Session.submit call over the control socket: answers go back in the call's result, host
//   bytes travel in the call itself (HostRegion::kMessage).
//
// A CommandPort is that pair of ways for one batch of records; the executor answers through it
// and reads the host bytes it names. It is held by shared_ptr because answers to some commands
// (a synchronisation, a copy the device is still doing) are posted after the command returned.

#include "protocol/ring_format.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace gpuproxy::server {

class CommandPort : public std::enable_shared_from_this<CommandPort> {
public:
  virtual ~CommandPort() = default;

  // The bytes of a host location the decoder has already checked against this port's limits.
  // The client may change bytes in a shared segment at any moment: copy them before relying on
  // them.
  virtual std::span<std::byte> hostBytes(const protocol::ring::HostLocation& location,
                                         std::uint64_t bytes) = 0;
  // Keeps every range hostBytes() returned valid for as long as it is held: for GPU work that
  // reads or writes them and may finish after the command's session is gone.
  virtual std::shared_ptr<const void> keepAlive() = 0;

  // Answers, in the order posted.
  virtual void postCompletion(std::uint64_t token, CUresult result) = 0;
  virtual void postAsyncError(const protocol::ring::AsyncError& error) = 0;
  virtual void postStagingRelease(std::uint64_t offset, std::uint64_t bytes) = 0;
  // The client has `bytes` of device printf output waiting (Session.takeDeviceOutput).
  virtual void postDeviceOutput(std::uint64_t bytes) = 0;
};

class CommandExecutor {
public:
  virtual ~CommandExecutor() = default;
  // Acts on one validated command and answers through `port`. A DecodeError of a value (one that
  // does not disconnect) is answered as the command's failure; one of framing never comes from a
  // ring (the channel stops and calls channelBroken instead).
  virtual void execute(const protocol::ring::DecodedCommand& command, CommandPort& port) = 0;
  // False while the client has so much work queued that a ring should leave its further commands
  // where they are (backpressure: the client's ring fills and its writes wait).
  virtual bool readyForCommands() const { return true; }
  // The client broke a ring's framing (a corrupt index or length, a record that cannot be framed):
  // nothing more can be read from it. Called once, on the thread that reads the ring; the executor
  // has the client's session ended so that what it held is reclaimed and its stub learns it is cut
  // off.
  virtual void channelBroken(const std::string& reason) = 0;
};

}  // namespace gpuproxy::server
