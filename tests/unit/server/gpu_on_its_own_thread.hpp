#pragma once
// One GPU whose GpuShard is made, served and destroyed on a thread of its own, with its own event
// loop: what each GPU's shard thread will be. Tests reach it only by message
// (server/gpu/gpu_messages.hpp), as the daemon's sessions do.

#include "server/backend/backend.hpp"
#include "server/gpu/gpu_shard.hpp"

#include <kj/async-io.h>

#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

namespace gpuproxy::server {

class GpuOnItsOwnThread {
public:
  // Opens device `index` of `backend` (which must outlive this) on the new thread.
  GpuOnItsOwnThread(backend::Backend& backend, std::uint32_t index) {
    std::promise<GpuShard*> made;
    auto ready = made.get_future();
    thread_ = std::thread([this, &backend, index, &made] { serve(backend, index, made); });
    shard_ = ready.get();
    if (shard_ == nullptr) {
      thread_.join();
      throw std::runtime_error("cannot open the sim device");
    }
  }

  // Ends the thread's loop from its own thread; the shard is destroyed there.
  ~GpuOnItsOwnThread() noexcept {
    shard_->executor().executeSync([this] { stop_->fulfill(); });
    thread_.join();
  }

  GpuOnItsOwnThread(const GpuOnItsOwnThread&) = delete;
  GpuOnItsOwnThread& operator=(const GpuOnItsOwnThread&) = delete;

  GpuShard& shard() { return *shard_; }
  std::thread::id threadId() const { return thread_.get_id(); }

private:
  void serve(backend::Backend& backend, std::uint32_t index, std::promise<GpuShard*>& made) {
    auto io = kj::setupAsyncIo();
    auto device = backend.openDevice(static_cast<int>(index));
    if (!device.ok()) {
      made.set_value(nullptr);
      return;
    }
    auto shard =
        std::make_unique<GpuShard>(index, std::move(device).value(), io.provider->getTimer());
    auto stop = kj::newPromiseAndFulfiller<void>();
    stop_ = kj::mv(stop.fulfiller);
    made.set_value(shard.get());
    stop.promise.wait(io.waitScope);
    shard.reset();
  }

  std::thread thread_;
  GpuShard* shard_ = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> stop_;  // touched on the GPU's thread only
};

}  // namespace gpuproxy::server
