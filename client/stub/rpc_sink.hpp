#pragma once
// The CommandSink over the control socket: each command record goes to the daemon in a
// Session.submit call (gpuproxy.capnp) and the call waits for the answer. Host bytes of a copy
// travel in the call's payload (HostRegion::kMessage), in chunks of maxTransferChunk bytes with a
// few calls in flight at once, so that a large copy neither builds one huge message nor waits a
// round trip per chunk.

#include <atomic>
#include <cstdint>

#include "client/stub/command_sink.hpp"

namespace gpuproxy::stub {

class Runtime;

class RpcSink final : public CommandSink {
public:
  explicit RpcSink(Runtime& runtime) : runtime_(runtime) {}

  CUresult enqueue(protocol::ring::Command& command) override;
  CUresult synchronize(std::uint64_t context, protocol::ring::SynchronizeKind kind,
                       std::uint64_t handle, bool query) override;
  CUresult copyHostToDevice(const StreamTarget& target, CUdeviceptr destination, const void* source,
                            std::size_t bytes, bool blocking) override;
  CUresult copyDeviceToHost(const StreamTarget& target, void* destination, CUdeviceptr source,
                            std::size_t bytes, bool blocking) override;

private:
  std::uint64_t nextSequence() { return sequence_.fetch_add(1, std::memory_order_relaxed); }

  Runtime& runtime_;
  std::atomic<std::uint64_t> sequence_{1};
};

}  // namespace gpuproxy::stub
