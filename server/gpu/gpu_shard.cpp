#include "server/gpu/gpu_shard.hpp"

#include "protocol/cuda_result.hpp"
#include "server/gpu/gpu_client.hpp"

#include <spdlog/spdlog.h>

#include <string>
#include <utility>

namespace gpuproxy::server {

GpuShard::GpuShard(std::uint32_t index, std::unique_ptr<backend::Device> device, kj::Timer& timer,
                   const dispatch::DispatchOptions& dispatch)
    : index_(index),
      device_(std::make_unique<dispatch::ScheduledDevice>(std::move(device),
                                                          dispatch::newScheduler(dispatch), timer)),
      blockingCalls_(std::make_unique<BlockingCallThread>("gpuproxy-slow" + std::to_string(index))),
      blockingCallAnswers_(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {}

GpuShard::~GpuShard() noexcept {
  owner_.check();
  // The answers still on their way are dropped, then the blocking-call thread ends (after the
  // call it is in), so that nothing runs on the device once it is gone.
  blockingCallAnswers_ = nullptr;
  blockingCalls_.reset();
  // The device next: its threads may still run kernel callbacks that report to this shard.
  device_.reset();
}

std::unique_ptr<GpuClient> GpuShard::openClient(std::shared_ptr<ClientStats> stats) {
  owner_.check();
  auto client = std::make_unique<GpuClient>(*this, std::move(stats));
  clients_.insert(client.get());
  return client;
}

void GpuShard::detach(GpuClient& client) {
  owner_.check();
  clients_.erase(&client);
  recoverIfIdle();
}

backend::Result<CUdeviceptr> GpuShard::allocate(std::size_t bytes, backend::AddressSpace owner) {
  owner_.check();
  return device_->allocate(bytes, owner);
}

template <typename Answer, typename Call, typename Finish>
kj::Promise<Answer> GpuShard::runBlocking(Call&& call, Finish&& finish) {
  owner_.check();
  ++blockingCallsOutstanding_;
  auto ended = blockingCalls_->run(std::forward<Call>(call));
  // The caller's promise is fulfilled from a task of the shard's, so that the shard learns of the
  // end of the call even when the caller has stopped waiting (its client went away).
  auto answer = kj::newPromiseAndFulfiller<Answer>();
  auto fulfiller =
      std::make_shared<kj::Own<kj::PromiseFulfiller<Answer>>>(kj::mv(answer.fulfiller));
  blockingCallAnswers_->add(ended.then(
      [this, fulfiller, finish = std::forward<Finish>(finish)]() mutable {
        --blockingCallsOutstanding_;
        const bool callerWaits = (*fulfiller)->isWaiting();
        Answer result = finish(callerWaits);
        if (callerWaits) (*fulfiller)->fulfill(std::move(result));
        recoverIfIdle();
      },
      [this, fulfiller](kj::Exception&& exception) {
        --blockingCallsOutstanding_;
        (*fulfiller)->reject(kj::mv(exception));
        recoverIfIdle();
      }));
  return kj::mv(answer.promise);
}

kj::Promise<backend::Result<std::unique_ptr<backend::Module>>> GpuShard::loadModule(
    std::vector<std::byte> image, backend::AddressSpace owner) {
  using Loaded = backend::Result<std::unique_ptr<backend::Module>>;
  // Shared with the blocking call, which fills it in: the promise carries no value, since a
  // move-only one through kj's cross-thread fulfiller trips GCC's maybe-uninitialized analysis.
  struct Preparation {
    backend::Result<std::unique_ptr<backend::PreparedModule>> module = CUDA_ERROR_UNKNOWN;
  };
  auto preparation = std::make_shared<Preparation>();
  const dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<Loaded>(
      [device, image = std::move(image), preparation]() {
        preparation->module = device->prepareModule(image);
      },
      [this, owner, preparation](bool callerWaits) -> Loaded {
        if (!preparation->module.ok()) return preparation->module.code();
        // Nobody wants it any more: it is not placed in device memory.
        if (!callerWaits) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        return device_->loadPrepared(std::move(preparation->module).value(), owner);
      });
}

kj::Promise<CUresult> GpuShard::registerHostMemory(void* host, std::size_t bytes,
                                                   backend::AddressSpace owner) {
  auto status = std::make_shared<CUresult>(CUDA_ERROR_UNKNOWN);
  dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<CUresult>(
      [device, host, bytes, owner, status]() {
        *status = device->registerHostMemory(host, bytes, owner);
      },
      [status](bool) { return *status; });
}

kj::Promise<CUresult> GpuShard::unregisterHostMemory(void* host) {
  auto status = std::make_shared<CUresult>(CUDA_ERROR_UNKNOWN);
  dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<CUresult>(
      [device, host, status]() { *status = device->unregisterHostMemory(host); },
      [status](bool) { return *status; });
}

void GpuShard::taskFailed(kj::Exception&& exception) {
  spdlog::error("device {}: a blocking call's answer was lost: {}", index_,
                exception.getDescription().cStr());
}

CUresult GpuShard::free(CUdeviceptr pointer) {
  owner_.check();
  // Accounting follows what the client held (its MemoryCharge goes with the allocation), even
  // when a poisoned context refuses the free: the memory comes back with the context reset.
  return device_->free(pointer);
}

void GpuShard::noteKernelStatus(CUresult status, pid_t pid) {
  if (!isStickyError(status)) return;
  bool expected = false;
  if (!faultReported_.compare_exchange_strong(expected, true)) return;
  faultingPid_ = pid;
  const std::string detail = device_->stickyErrorDetail();
  spdlog::error(
      "device {}: a kernel of pid {} failed with {}{}{}: the GPU context is poisoned for every "
      "client on this device; it is recovered once none holds a context on it",
      index_, pid, protocol::cudaResultNameOr(status, "a sticky error"), detail.empty() ? "" : " (",
      detail.empty() ? "" : detail + ")");
}

void GpuShard::recoverIfIdle() {
  owner_.check();
  // Idle: no client holds a context on this GPU. One that is still connected but has reset or
  // destroyed all its contexts has nothing the reset could take from it (device memory, modules,
  // streams and events all belong to a context); its pinned host memory stays registered, since
  // a reset keeps host registrations (backend::Device::reset).
  for (const GpuClient* client : clients_) {
    if (client->hasContexts()) return;
  }
  // A blocking call may be using the context (a JIT, a registration); the last one to end comes
  // back here.
  if (blockingCallsOutstanding_ > 0) return;
  if (device_->stickyError() == CUDA_SUCCESS) return;
  CUresult reset = device_->reset();
  if (reset != CUDA_SUCCESS) {
    spdlog::error("device {}: resetting the poisoned context failed ({})", index_,
                  protocol::cudaResultNameOr(reset, "unknown error"));
    return;
  }
  // Every charge was credited as its context went; a count left over would be the ledger's bug.
  if (clients_.empty()) memoryUsed_ = 0;
  faultingPid_ = 0;
  faultReported_ = false;
  spdlog::warn("device {}: context recovered after a sticky fault; serving new clients", index_);
}

}  // namespace gpuproxy::server
