#include "server/gpu/gpu_shard.hpp"

#include "protocol/cuda_result.hpp"
#include "server/gpu/gpu_client.hpp"

#include <spdlog/spdlog.h>

#include <iterator>
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

backend::Result<CUdeviceptr> GpuShard::allocateNow(std::size_t bytes, backend::AddressSpace owner) {
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

kj::Promise<backend::Result<GpuShard::LoadedModule>> GpuShard::loadModule(
    std::vector<std::byte> image, backend::AddressSpace owner) {
  using Loaded = backend::Result<LoadedModule>;
  // Shared with the blocking call, which fills it in: the promise carries no value, since a
  // move-only one through kj's cross-thread fulfiller trips GCC's maybe-uninitialized analysis.
  struct Load {
    backend::Result<std::unique_ptr<backend::Module>> module = CUDA_ERROR_UNKNOWN;
  };
  auto load = std::make_shared<Load>();
  dispatch::ScheduledDevice* device = device_.get();
  // Prepared and placed in device memory in one call, after every free and unload given before
  // it, and never beside an allocation: the cuda backend measures what a module takes by the
  // device's free memory across its placement.
  return runBlocking<Loaded>(
      [device, image = std::move(image), owner, load]() {
        auto prepared = device->prepareModule(image);
        if (!prepared.ok()) {
          load->module = prepared.code();
          return;
        }
        load->module = device->loadPrepared(std::move(prepared).value(), owner);
      },
      [this, load](bool callerWaits) -> Loaded {
        if (!load->module.ok()) return load->module.code();
        LoadedModule loaded(load->module.value().release(), UnloadOnBlockingCallThread{this});
        // Nobody wants it any more: it is unloaded again.
        if (!callerWaits) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        return loaded;
      });
}

void GpuShard::UnloadOnBlockingCallThread::operator()(backend::Module* module) const {
  shard->unload(std::unique_ptr<backend::Module>(module));
}

void GpuShard::unload(std::unique_ptr<backend::Module> module) {
  // A module's unload has no answer to give (the backend notes a sticky error itself).
  const std::uint64_t bytes = module->deviceBytes();
  giveBackInBackground("module", 0, bytes, 0, [module = std::move(module)]() mutable {
    module.reset();
    return CUDA_SUCCESS;
  });
}

backend::MemoryInfo GpuShard::memoryInfo() {
  owner_.check();
  // Memory stays in givingBack_ until its free has returned, since a free that waits for the
  // device gives the memory back only at its end: only in the moment between the device having
  // it and the count dropping may it be counted twice (and never past the device's total).
  backend::MemoryInfo info = device_->memoryInfo();
  info.free = std::min(info.total, info.free + givingBack_.load());
  return info;
}

kj::Promise<backend::Result<CUdeviceptr>> GpuShard::allocate(std::size_t bytes,
                                                             backend::AddressSpace owner) {
  using Allocated = backend::Result<CUdeviceptr>;
  auto allocated = std::make_shared<Allocated>(CUDA_ERROR_UNKNOWN);
  dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<Allocated>(
      [device, bytes, owner, allocated]() { *allocated = device->allocate(bytes, owner); },
      [this, bytes, allocated](bool callerWaits) -> Allocated {
        if (!callerWaits && allocated->ok()) {
          release(allocated->value(), device_->occupiedBytes(bytes), 0);
          return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        }
        return *allocated;
      });
}

kj::Promise<CUresult> GpuShard::free(CUdeviceptr pointer) {
  // As release: the caller's charge follows what the client held, whatever the device answers.
  auto status = std::make_shared<CUresult>(CUDA_ERROR_UNKNOWN);
  dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<CUresult>([device, pointer, status]() { *status = device->free(pointer); },
                               [status](bool) { return *status; });
}

kj::Promise<CUresult> GpuShard::registerHostMemory(void* host, std::size_t bytes,
                                                   backend::AddressSpace owner) {
  auto status = std::make_shared<CUresult>(CUDA_ERROR_UNKNOWN);
  dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<CUresult>(
      [device, host, bytes, owner, status]() {
        *status = device->registerHostMemory(host, bytes, owner);
      },
      [this, host, bytes, owner, status](bool) {
        if (*status == CUDA_SUCCESS) {
          mappedHostRanges_[reinterpret_cast<CUdeviceptr>(host)] = MappedHostRange{bytes, owner};
        }
        return *status;
      });
}

kj::Promise<CUresult> GpuShard::unregisterHostMemory(void* host) {
  mappedHostRanges_.erase(reinterpret_cast<CUdeviceptr>(host));
  auto status = std::make_shared<CUresult>(CUDA_ERROR_UNKNOWN);
  dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<CUresult>(
      [device, host, status]() { *status = device->unregisterHostMemory(host); },
      [status](bool) { return *status; });
}

bool GpuShard::hostRangeIsMapped(backend::AddressSpace owner, CUdeviceptr pointer,
                                 std::uint64_t bytes) const {
  owner_.check();
  auto after = mappedHostRanges_.upper_bound(pointer);
  if (after == mappedHostRanges_.begin()) return false;
  const auto& [start, range] = *std::prev(after);
  const std::uint64_t offset = pointer - start;
  return range.owner == owner && offset < range.bytes && bytes <= range.bytes - offset;
}

void GpuShard::taskFailed(kj::Exception&& exception) {
  spdlog::error("device {}: a blocking call's answer was lost: {}", index_,
                exception.getDescription().cStr());
}

template <typename Call>
void GpuShard::giveBackInBackground(const char* what, std::uint64_t id, std::uint64_t bytes,
                                    pid_t pid, Call&& call) {
  // Accounting follows what the client held (its MemoryCharge went with the memory), even when a
  // poisoned context refuses: the memory comes back with the context reset.
  auto status = std::make_shared<CUresult>(CUDA_ERROR_UNKNOWN);
  givingBack_ += bytes;
  // Nobody waits for the answer: the shard's task still ends the call (runBlocking).
  (void)runBlocking<CUresult>(
      [this, bytes, call = std::forward<Call>(call), status]() mutable {
        *status = call();
        givingBack_ -= bytes;  // once the device has it back (memoryInfo)
      },
      [this, what, id, pid, status](bool) {
        if (*status != CUDA_SUCCESS && !isStickyError(*status)) {
          spdlog::error("device {}: giving back {} {:#x} of pid {} failed ({})", index_, what, id,
                        pid, protocol::cudaResultNameOr(*status, "unknown error"));
        }
        return *status;
      });
}

void GpuShard::release(CUdeviceptr pointer, std::uint64_t bytes, pid_t pid) {
  owner_.check();
  dispatch::ScheduledDevice* device = device_.get();
  giveBackInBackground("device memory", pointer, bytes, pid,
                       [device, pointer]() { return device->free(pointer); });
}

kj::Promise<backend::Result<std::uint64_t>> GpuShard::createPhysicalMemory(std::uint64_t bytes) {
  using Created = backend::Result<std::uint64_t>;
  auto created = std::make_shared<Created>(CUDA_ERROR_UNKNOWN);
  dispatch::ScheduledDevice* device = device_.get();
  return runBlocking<Created>(
      [device, bytes, created]() { *created = device->createPhysicalMemory(bytes); },
      [this, bytes, created](bool callerWaits) -> Created {
        if (!callerWaits && created->ok()) {
          releasePhysicalMemory(created->value(), bytes, 0);
          return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        }
        return *created;
      });
}

void GpuShard::releasePhysicalMemory(std::uint64_t handle, std::uint64_t bytes, pid_t pid) {
  owner_.check();
  dispatch::ScheduledDevice* device = device_.get();
  giveBackInBackground("physical memory", handle, bytes, pid,
                       [device, handle]() { return device->releasePhysicalMemory(handle); });
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
  if (resetEnded_ && resetEnded_->started) return;
  if (!resetEnded_) {
    // Idle: no client holds a context or virtual memory on this GPU. One that is still connected
    // but has reset or destroyed all its contexts and given back its virtual memory has nothing
    // the reset could take from it (device memory, modules, streams and events all belong to a
    // context); its pinned host memory stays registered, since a reset keeps host registrations
    // (backend::Device::reset).
    for (const GpuClient* client : clients_) {
      if (client->holdsDeviceState()) return;
    }
    const CUresult sticky = device_->stickyError();
    if (sticky == CUDA_SUCCESS) return;
    // From now on no context is made here until the reset has ended (whenServing), even while
    // it waits for the calls below: a client given one meanwhile would keep the GPU poisoned.
    auto ended = kj::newPromiseAndFulfiller<void>();
    resetEnded_ =
        std::make_unique<Reset>(Reset{ended.promise.fork(), kj::mv(ended.fulfiller), sticky,
                                      device_->streamPriorityRange(), device_->smPartition()});
  }
  // A blocking call may be using the context (a JIT, a registration), or its answer may use it on
  // this thread (placing a prepared module); the last one to end comes back here. What the
  // clients that went left behind is freed there first (release).
  if (blockingCallsOutstanding_ > 0) return;
  startReset();
}

void GpuShard::startReset() {
  resetEnded_->started = true;
  spdlog::info("device {}: resetting the poisoned context", index_);
  // Recreating a context takes long on a GPU (and re-registering clients' pinned memory in it
  // longer): the blocking-call thread does it, while this thread goes on serving every other
  // client and GPU. Until it ends, no new context is made here (whenServing) and nothing here
  // calls the device.
  // Not a runBlocking call: that would look for a reset to start as soon as this one ended, and
  // one that failed would be retried at once, for ever; a failed reset is retried when a client
  // or a blocking call next gives reason to (recoverIfIdle).
  blockingCallAnswers_->add(
      blockingCalls_->run([reset = device_->beginReset()]() mutable { return reset(); })
          .then([this](CUresult status) { finishReset(status); },
                [this](kj::Exception&& exception) {
                  spdlog::error("device {}: the context reset threw: {}", index_,
                                exception.getDescription().cStr());
                  finishReset(CUDA_ERROR_UNKNOWN);
                }));
}

void GpuShard::finishReset(CUresult status) {
  owner_.check();
  device_->finishReset();
  kj::Own<kj::PromiseFulfiller<void>> end = kj::mv(resetEnded_->end);
  resetEnded_.reset();
  if (status != CUDA_SUCCESS) {
    spdlog::error("device {}: resetting the poisoned context failed ({})", index_,
                  protocol::cudaResultNameOr(status, "unknown error"));
  } else {
    // Every charge was credited as its context went; a count left over would be the ledger's
    // bug.
    if (clients_.empty()) memoryUsed_ = 0;
    faultingPid_ = 0;
    faultReported_ = false;
    spdlog::warn("device {}: context recovered after a sticky fault; serving new clients", index_);
  }
  // Contexts asked for meanwhile are made now (after a failed reset, they get the sticky error).
  end->fulfill();
}

kj::Promise<void> GpuShard::whenServing() {
  owner_.check();
  if (resetEnded_) return resetEnded_->ended.addBranch();
  return kj::READY_NOW;
}

GpuStatus GpuShard::status() {
  owner_.check();
  const backend::DeviceProperties& device = properties();
  return GpuStatus{index_,
                   device.name,
                   device.totalMemory,
                   device.computeCapability(),
                   memoryUsed_,
                   ipcExports_.bytesKeptForImporters(),
                   static_cast<std::uint32_t>(clients_.size()),
                   stickyError(),
                   faultingPid(),
                   device_->stats(),
                   blockingCalls(),
                   streamPriorityRange(),
                   smPartition()};
}

void GpuShard::refreshTenants() {
  owner_.check();
  device_->refreshTenants();
}

CUresult GpuShard::stickyError() {
  owner_.check();
  return resetEnded_ ? resetEnded_->sticky : device_->stickyError();
}

backend::StreamPriorityRange GpuShard::streamPriorityRange() const {
  owner_.check();
  return resetEnded_ ? resetEnded_->priorities : device_->streamPriorityRange();
}

backend::SmPartition GpuShard::smPartition() const {
  owner_.check();
  return resetEnded_ ? resetEnded_->partition : device_->smPartition();
}

std::string GpuShard::takeDeviceOutput(backend::AddressSpace owner) {
  owner_.check();
  return resetEnded_ ? std::string() : device_->takeDeviceOutput(owner);
}

}  // namespace gpuproxy::server
