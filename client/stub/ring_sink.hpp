#pragma once
// The CommandSink over the shared-memory data plane (data_plane.hpp): records go into the
// process's command ring and answers come back on its completion ring. Host copies go through
// the segment: a range inside one pinned allocation is one record naming the pinned heap (the GPU
// reads or writes the application's buffer directly); anything else is staged in pipelined
// chunks through the staging area. What the ring cannot carry (a record larger than the ring, a
// copy without a staging area) goes to `fallback`, the socket, after what is already in the ring.

#include "client/stub/command_sink.hpp"

namespace gpuproxy::stub {

class DataPlane;

class RingSink final : public CommandSink {
public:
  RingSink(DataPlane& plane, CommandSink& fallback) : plane_(plane), fallback_(fallback) {}

  CUresult enqueue(protocol::ring::Command& command) override;
  CUresult synchronize(std::uint64_t context, protocol::ring::SynchronizeKind kind,
                       std::uint64_t handle, bool query) override;
  CUresult copyHostToDevice(const StreamTarget& target, CUdeviceptr destination, const void* source,
                            std::size_t bytes, bool blocking) override;
  CUresult copyDeviceToHost(const StreamTarget& target, void* destination, CUdeviceptr source,
                            std::size_t bytes, bool blocking) override;
  void eventRecorded(std::uint64_t event, std::uint64_t stream) override;
  void eventDestroyed(std::uint64_t event) override;
  void contextGone(std::uint64_t context) override;

private:
  CUresult stagedHostToDevice(const StreamTarget& target, CUdeviceptr destination,
                              const void* source, std::size_t bytes);
  CUresult stagedDeviceToHost(const StreamTarget& target, void* destination, CUdeviceptr source,
                              std::size_t bytes);
  // A copy between device memory and one pinned allocation: one record naming the pinned heap.
  // `blocking`: wait for the copy to complete (and report earlier asynchronous errors of the
  // context, as a synchronising call); otherwise return once the record is in the ring.
  template <typename Command>
  CUresult pinnedCopy(const StreamTarget& target, Command& command, bool blocking);
  // After a synchronising call: prints what the application's kernels printed, if the daemon said
  // there is something.
  void printDeviceOutputIfAny();

  DataPlane& plane_;
  CommandSink& fallback_;
};

}  // namespace gpuproxy::stub
