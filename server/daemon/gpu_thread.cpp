#include "server/daemon/gpu_thread.hpp"

#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <future>
#include <optional>
#include <string>
#include <system_error>

namespace gpuproxy::server {

// What the thread tells its starter once it serves, or why it cannot. It lives on the starter's
// stack: the thread touches it only until it has told.
struct GpuThread::Started {
  std::promise<CUresult> opened;
};

GpuThread::GpuThread() : stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (stop_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

backend::Result<std::unique_ptr<GpuThread>> GpuThread::start(backend::Backend& backend,
                                                             std::uint32_t index,
                                                             const Options& options) {
  std::unique_ptr<GpuThread> gpu(new GpuThread());
  Started started;
  std::future<CUresult> opened = started.opened.get_future();
  gpu->thread_ = std::thread([gpu = gpu.get(), &backend, index, &options, &started] {
    gpu->serve(backend, index, options, started);
  });
  // Named for operators (top -H, a debugger): which thread serves which GPU.
  const std::string name = "gpu" + std::to_string(index);
  ::pthread_setname_np(gpu->thread_.native_handle(), name.c_str());
  CUresult result = CUDA_SUCCESS;
  try {
    result = opened.get();
  } catch (...) {
    gpu->thread_.join();
    throw;
  }
  if (result != CUDA_SUCCESS) {
    gpu->thread_.join();
    return result;
  }
  return gpu;
}

GpuThread::~GpuThread() noexcept {
  if (thread_.joinable()) {
    ending_.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    static_cast<void>(::write(stop_, &one, sizeof(one)));
    thread_.join();
  }
  ::close(stop_);
}

void GpuThread::serve(backend::Backend& backend, std::uint32_t index, const Options& options,
                      Started& started) {
  bool told = false;
  try {
    auto io = kj::setupAsyncIo();
    io.waitScope.setBusyPollInterval(kDataPlaneBusyPollInterval);
    auto device = backend.openDevice(static_cast<int>(index), options.device);
    if (!device.ok()) {
      told = true;
      started.opened.set_value(device.code());
      return;
    }
    // Declared in this order so that the data plane goes before the shard whose clients it served.
    GpuShard shard(index, std::move(device).value(), io.provider->getTimer(), options.dispatch);
    DataPlane dataPlane(io.unixEventPort, io.provider->getTimer(), options.dataPlane);
    auto loop = dataPlane.run().eagerlyEvaluate([index](kj::Exception&& e) {
      spdlog::critical("device {}: data-plane loop failed: {}", index, e.getDescription().cStr());
    });
    kj::UnixEventPort::FdObserver stop(io.unixEventPort, stop_,
                                       kj::UnixEventPort::FdObserver::OBSERVE_READ);
    shard_ = &shard;
    dataPlane_ = &dataPlane;
    told = true;
    started.opened.set_value(CUDA_SUCCESS);
    stop.whenBecomesReadable().wait(io.waitScope);
    // What the destructor's caller did before it asked happens before the shard goes (an eventfd
    // alone orders nothing that TSan sees).
    while (!ending_.load(std::memory_order_acquire)) std::this_thread::yield();
  } catch (...) {
    if (!told) {
      started.opened.set_exception(std::current_exception());
      return;
    }
    // Sessions still hold references into the shard that just went: nothing can go on safely.
    spdlog::critical("device {}: the thread that serves it failed; stopping", index);
    std::abort();
  }
}

}  // namespace gpuproxy::server
