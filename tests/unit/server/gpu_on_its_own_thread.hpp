#pragma once
// One GPU whose GpuShard is made, served and destroyed on a thread of its own, with its own event
// loop: what each GPU's shard thread will be. Tests reach it only by message
// (server/gpu/gpu_messages.hpp), as the daemon's sessions do.

#include "server/backend/backend.hpp"
#include "server/gpu/gpu_shard.hpp"

#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

namespace gpuproxy::server {

class GpuOnItsOwnThread {
public:
  // Opens device `index` of `backend` (which must outlive this) on the new thread.
  GpuOnItsOwnThread(backend::Backend& backend, std::uint32_t index)
      : stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (stop_ < 0) throw std::runtime_error("eventfd failed");
    std::promise<GpuShard*> made;
    auto ready = made.get_future();
    thread_ = std::thread([this, &backend, index, &made] { serve(backend, index, made); });
    shard_ = ready.get();
    if (shard_ == nullptr) {
      thread_.join();
      ::close(stop_);
      throw std::runtime_error("cannot open the sim device");
    }
  }

  // Ends the thread's loop, which then destroys the shard there. Told through an eventfd, not a
  // message: the loop and its executor are gone as soon as it ends, and kj's reply to a message
  // (in its uninstrumented library) would race that for TSan.
  ~GpuOnItsOwnThread() noexcept {
    ending_.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    static_cast<void>(::write(stop_, &one, sizeof(one)));
    thread_.join();
    ::close(stop_);
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
    kj::UnixEventPort::FdObserver stop(io.unixEventPort, stop_,
                                       kj::UnixEventPort::FdObserver::OBSERVE_READ);
    made.set_value(shard.get());
    stop.whenBecomesReadable().wait(io.waitScope);
    // What the caller did before it asked happens before the shard goes (an eventfd alone orders
    // nothing that TSan sees).
    while (!ending_.load(std::memory_order_acquire)) std::this_thread::yield();
    shard.reset();
  }

  int stop_;
  std::atomic<bool> ending_{false};
  std::thread thread_;
  GpuShard* shard_ = nullptr;  // an eventfd: readable once the thread is to end
};

}  // namespace gpuproxy::server
