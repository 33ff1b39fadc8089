#pragma once
// The thread that owns one GPU: an event loop and timer of its own, the GpuShard (the device, its
// dispatcher, its clients' state) opened, served and destroyed on it, and the data-plane loop that
// reads that GPU's ring of every client (each session adds its ring pair for this GPU by a message,
// ClientSession::openDataPlane). Nothing else touches the shard: sessions, status and tenant
// changes reach it by messages to this thread (server/gpu/gpu_messages.hpp), and calls that may
// block for long run on the shard's blocking-call thread besides. So a GPU that is busy, or whose
// driver call takes long, holds up no other GPU's clients, nor the daemon's sockets.
//
// This is the seam along which a GPU can move into a worker process of its own: what crosses it
// is messages and the rings, never a reference into the shard.

#include "server/backend/backend.hpp"
#include "server/data_plane/data_plane.hpp"
#include "server/dispatch/scheduled_device.hpp"
#include "server/gpu/gpu_shard.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

namespace gpuproxy::server {

class GpuThread {
public:
  struct Options {
    backend::DeviceOptions device;
    dispatch::DispatchOptions dispatch;
    DataPlaneOptions dataPlane;
  };

  // Starts the thread, which opens device `index` of `backend` (which must outlive the thread)
  // and serves it. The driver's error when the device cannot be opened; throws what the data
  // plane throws when its poller cannot start.
  static backend::Result<std::unique_ptr<GpuThread>> start(backend::Backend& backend,
                                                           std::uint32_t index,
                                                           const Options& options);
  static backend::Result<std::unique_ptr<GpuThread>> start(backend::Backend& backend,
                                                           std::uint32_t index) {
    return start(backend, index, Options{});
  }

  // Ends the thread's loop, which then destroys the data plane and the shard there, and joins it.
  // Every session must be gone first: no channel left in the data plane, no GpuClient on the
  // shard, nobody waiting for a message's answer.
  ~GpuThread() noexcept;
  GpuThread(const GpuThread&) = delete;
  GpuThread& operator=(const GpuThread&) = delete;

  // Touched only on the thread itself (by messages), except for what GpuShard says is safe from
  // any thread (executor(), properties(), index()).
  GpuShard& shard() { return *shard_; }
  DataPlane& dataPlane() { return *dataPlane_; }
  std::thread::id threadId() const { return thread_.get_id(); }

private:
  GpuThread();
  struct Started;
  void serve(backend::Backend& backend, std::uint32_t index, const Options& options,
             Started& started);

  // Readable once the thread is to end. Told through an eventfd, not a message: the loop and its
  // executor are gone as soon as it ends, and kj's answer to a message (sent back from a loop
  // being destroyed) would race that.
  int stop_;
  std::atomic<bool> ending_{false};
  std::thread thread_;
  GpuShard* shard_ = nullptr;
  DataPlane* dataPlane_ = nullptr;
};

}  // namespace gpuproxy::server
