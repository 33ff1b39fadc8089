#pragma once
// Where the stub's stream operations go. Every entry point that launches a kernel, copies, sets
// memory, records or waits for an event, or synchronises builds the command record that
// protocol/RING_FORMAT.md defines (protocol::ring) and hands it to the process's one
// CommandSink (Runtime::commands()); no entry point asks which transport is underneath. Two
// implementations:
//
// - RingSink (ring_sink.hpp): the shared-memory data plane. Asynchronous commands return once
//   their record is in the command ring; errors they run into come back as AsyncError records and
//   are reported at the next synchronising call, as CUDA reports asynchronous errors.
// - RpcSink (rpc_sink.hpp): the same records carried by Session.submit over the control socket,
//   for a process without a data plane (GPUPROXY_TRANSPORT=rpc, or no segment could be had) and
//   for a record the ring cannot hold. Every call waits for the daemon's answer, so an
//   asynchronous command's error is returned by the call itself (legal in CUDA: completing early).
//
// The daemon decodes and executes records the same way whichever sink sent them.

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "protocol/ring_format.hpp"

namespace gpuproxy::stub {

// A stream as the daemon names it: the context and the stream (0: the context's legacy NULL
// stream).
struct StreamTarget {
  std::uint64_t context = 0;
  std::uint64_t stream = 0;
};

class CommandSink {
public:
  virtual ~CommandSink() = default;

  // An asynchronous command: a launch, a device-to-device copy, a memset, an event record or a
  // stream's wait for an event. Its `sequence` is set here.
  virtual CUresult enqueue(protocol::ring::Command& command) = 0;

  // cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize and (with `query`) cuStreamQuery,
  // cuEventQuery. An asynchronous error of what it synchronises with is returned instead of
  // success, once.
  virtual CUresult synchronize(std::uint64_t context, protocol::ring::SynchronizeKind kind,
                               std::uint64_t handle, bool query) = 0;

  // Copies between the host and device memory the caller has checked is this process's.
  // `blocking`: cuMemcpyHtoD/DtoH (the call synchronises as the driver's does); otherwise the
  // Async variants, which may still wait where CUDA allows (pageable memory).
  virtual CUresult copyHostToDevice(const StreamTarget& target, CUdeviceptr destination,
                                    const void* source, std::size_t bytes, bool blocking) = 0;
  virtual CUresult copyDeviceToHost(const StreamTarget& target, void* destination,
                                    CUdeviceptr source, std::size_t bytes, bool blocking) = 0;

  // What a sink that reports errors later needs to know to report them at the right call.
  virtual void eventRecorded(std::uint64_t /*event*/, std::uint64_t /*stream*/) {}
  virtual void eventDestroyed(std::uint64_t /*event*/) {}
  virtual void contextGone(std::uint64_t /*context*/) {}
};

}  // namespace gpuproxy::stub
