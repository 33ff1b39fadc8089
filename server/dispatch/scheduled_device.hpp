#pragma once
// The per-GPU dispatcher (docs/architecture.md §3; the policy is in scheduler/README.md): a
// backend::Device whose streams and events are proxies, so that every GPU operation passes
// through the scheduler before it reaches the real device.
//
// Each proxy stream keeps a queue of the operations not yet handed to its real stream. Only the
// kernel at the head of a queue is a scheduler item; when the scheduler returns it, it goes to the
// real stream, followed by every non-kernel operation (copies, memsets, event records and waits,
// host callbacks) up to the next kernel, which becomes the stream's scheduler item in turn. So a
// stream's order is kept exactly, and the scheduler decides only which stream's next kernel goes.
//
// A wait on an event whose record is still held here is held too (the backend would treat a wait
// for a record it has not seen as no wait at all). It goes to the real stream once that record
// has; if a later record of the same event got there first, the wait waits for that later record,
// which only delays the waiting stream.
//
// Threading: everything here runs on the thread that owns the GPU, including the scheduler,
// which is not thread-safe. Kernel completions arrive on backend threads; the client's own
// callback runs there as before, and the completion is brought back to the loop with a
// cross-thread fulfiller, where the scheduler is told and the next items are submitted. Time for
// the scheduler is std::chrono::steady_clock in nanoseconds; wakeAt() is honoured with the loop's
// kj::Timer.
//
// Lifetimes: as for any backend::Device, the ScheduledDevice outlives its streams and events.
// Destroying a proxy stream or event returns at once; work already queued for it still reaches the
// GPU and completes (the dispatcher keeps the real objects until their queues have drained).

#include "scheduler/scheduler.hpp"
#include "server/backend/backend.hpp"
#include "server/tenant/tenant.hpp"

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/function.h>
#include <kj/timer.h>

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpuproxy::server::dispatch {

// Which scheduler a device runs and how it is tuned. `name` is "fair" or "fifo".
struct DispatchOptions {
  std::string name = "fair";
  scheduler::SchedulerConfig config;
};

// Builds the scheduler `options` names. Throws std::invalid_argument for an unknown name or a
// config the scheduler refuses.
std::unique_ptr<scheduler::Scheduler> newScheduler(const DispatchOptions& options);

// Whose kernels a stream carries: the scheduling tenant is the client's tenant (its weight and
// class are read from it at first use and whenever they change; its GPU time is added to it).
struct StreamOwner {
  std::shared_ptr<Tenant> tenant;  // null: the daemon's own work, run as a weight-1 tenant
  scheduler::ClientId client = 0;
  // Whose memory the stream's kernels may touch (backend::AddressSpace).
  backend::AddressSpace addressSpace = backend::kDaemonAddressSpace;
};

// Where a stream runs: its class (its owner's tenant class when it was made), the priority it
// runs at on the GPU, and the priority its client asked for (clamped to the device's range),
// which is what the client is told.
struct StreamPlacement {
  backend::TenantClass workClass = backend::TenantClass::kBestEffort;
  int devicePriority = 0;
  int requestedPriority = 0;
};

struct DispatchStats {
  std::size_t streams = 0;         // live and draining proxy streams
  std::size_t heldOperations = 0;  // operations queued here, not yet on a real stream
  std::size_t kernelsQueued = 0;   // kernels waiting for the scheduler
  std::size_t kernelsInFlight = 0;
};

class ScheduledDevice final : public backend::Device {
public:
  ScheduledDevice(std::unique_ptr<backend::Device> device,
                  std::unique_ptr<scheduler::Scheduler> scheduler, kj::Timer& timer);
  ~ScheduledDevice() override;
  ScheduledDevice(const ScheduledDevice&) = delete;
  ScheduledDevice& operator=(const ScheduledDevice&) = delete;

  // backend::Device
  using backend::Device::allocate;
  using backend::Device::createStreamFor;
  using backend::Device::registerHostMemory;
  const backend::DeviceProperties& properties() const override { return device_->properties(); }
  // Memory is the real device's business: nothing is held for it here, so the owner's other
  // thread may allocate and free as the contract allows.
  backend::Result<CUdeviceptr> allocate(std::size_t bytes, backend::AddressSpace owner) override {
    return device_->allocate(bytes, owner);
  }
  CUresult free(CUdeviceptr pointer) override { return device_->free(pointer); }
  backend::Result<CUdeviceptr> reserveAddresses(std::uint64_t bytes,
                                                std::uint64_t alignment) override {
    return backend().reserveAddresses(bytes, alignment);
  }
  CUresult freeAddresses(CUdeviceptr start, std::uint64_t bytes) override {
    return backend().freeAddresses(start, bytes);
  }
  backend::Result<std::uint64_t> createPhysicalMemory(std::uint64_t bytes) override {
    return device_->createPhysicalMemory(bytes);
  }
  CUresult releasePhysicalMemory(std::uint64_t handle) override {
    return device_->releasePhysicalMemory(handle);
  }
  CUresult mapMemory(CUdeviceptr address, std::uint64_t bytes, std::uint64_t handle,
                     std::uint64_t offset) override {
    return backend().mapMemory(address, bytes, handle, offset);
  }
  CUresult unmapMemory(CUdeviceptr address, std::uint64_t bytes) override {
    return backend().unmapMemory(address, bytes);
  }
  CUresult setMemoryAccess(CUdeviceptr address, std::uint64_t bytes, backend::AddressSpace owner,
                           bool writable) override {
    return backend().setMemoryAccess(address, bytes, owner, writable);
  }
  CUresult shareAllocation(CUdeviceptr base, backend::AddressSpace with) override {
    return backend().shareAllocation(base, with);
  }
  void unshareAllocation(CUdeviceptr base, backend::AddressSpace with) override {
    backend().unshareAllocation(base, with);
  }
  backend::MemoryInfo memoryInfo() override;
  std::uint64_t occupiedBytes(std::size_t bytes) const override {
    return device_->occupiedBytes(bytes);
  }
  // Pinned host memory is the real device's business: nothing is held for it here.
  CUresult registerHostMemory(void* host, std::size_t bytes, backend::AddressSpace owner) override {
    return device_->registerHostMemory(host, bytes, owner);
  }
  CUresult unregisterHostMemory(void* host) override { return device_->unregisterHostMemory(host); }
  // Modules are the real device's business too; preparing one touches nothing here, so any
  // thread may, as the contract allows, and placing one is the blocking-call thread's, as
  // allocating memory is.
  backend::Result<std::unique_ptr<backend::PreparedModule>> prepareModule(
      std::span<const std::byte> image) const override {
    return device_->prepareModule(image);
  }
  backend::Result<std::unique_ptr<backend::Module>> loadPrepared(
      std::unique_ptr<backend::PreparedModule> prepared, backend::AddressSpace owner) override {
    return device_->loadPrepared(std::move(prepared), owner);
  }
  // A stream of the daemon's own (no client): scheduled as an internal weight-1 tenant, placed
  // as best-effort (createStream) or as `workClass` (createStreamFor).
  backend::Result<std::unique_ptr<backend::Stream>> createStream(unsigned flags,
                                                                 int priority) override;
  backend::Result<std::unique_ptr<backend::Stream>> createStreamFor(
      backend::TenantClass workClass, unsigned flags, int priority,
      backend::AddressSpace owner) override;
  backend::StreamPriorityRange streamPriorityRange() const override {
    return backend().streamPriorityRange();
  }
  backend::SmPartition smPartition() const override { return backend().smPartition(); }
  backend::Result<std::unique_ptr<backend::Event>> createEvent(unsigned flags) override;
  CUresult stickyError() override;
  // Asked from backend threads too, when a kernel reports a sticky error (the backends allow it).
  std::string stickyErrorDetail() override { return device_->stickyErrorDetail(); }
  void abandonWorkOf(backend::AddressSpace owner) override { backend().abandonWorkOf(owner); }
  std::string takeDeviceOutput(backend::AddressSpace owner) override {
    return backend().takeDeviceOutput(owner);
  }
  backend::Result<std::uint64_t> setLimit(backend::AddressSpace owner, CUlimit limit,
                                          std::uint64_t value) override {
    return backend().setLimit(owner, limit, value);
  }
  void attachDeviceHeap(backend::AddressSpace owner, CUdeviceptr base,
                        std::uint64_t bytes) override {
    backend().attachDeviceHeap(owner, base, bytes);
  }
  // The context reset, in two halves so that its slow part can leave the owner thread (a reset
  // recreates a GPU context: it may take long). beginReset, on the owner thread, fails every
  // operation still held here (their callbacks get CUDA_ERROR_CONTEXT_IS_DESTROYED) and returns
  // the real device's reset, which one other thread may then run. Until finishReset, also on the
  // owner thread, the owner makes no call that reaches the real device (checked: KJ_ASSERT).
  kj::Function<CUresult()> beginReset();
  void finishReset();
  // Both halves, on the owner thread.
  CUresult reset() override;

  // A stream whose kernels are scheduled for `owner`. Its priority on the GPU is in the band of
  // the owner's tenant class (stream_priority.hpp), and the real device places it by that class.
  backend::Result<std::unique_ptr<backend::Stream>> createStream(const StreamOwner& owner,
                                                                 unsigned flags, int priority);
  // A new client id, unique on this device.
  scheduler::ClientId newClientId() { return nextClientId_++; }
  // The client is gone: every operation of its streams still held here (kernels the scheduler
  // has not handed out, and everything queued behind them) is dropped, never to run. Callbacks
  // of dropped work run now with `status`; records fail their waiters. Work already on the real
  // streams is left to finish. Returns how many operations were dropped.
  std::size_t abandonClient(scheduler::ClientId client, CUresult status);
  // Work on `stream` (a stream of this device) that is not this GPU's (a client's
  // cuLaunchHostFunc, a wait for another GPU's event): `reached(status)` runs, on a backend thread,
  // once the stream's earlier work is done; the stream's later work is held here until
  // openHostGate. The gate is a wait for a record that only openHostGate makes, so what a held wait
  // does it does: later work of other streams that waits on this stream's later records waits too.
  // Dropped like any held work (abandonClient, reset).
  struct HostGate;
  backend::Result<std::shared_ptr<HostGate>> pushHostGate(backend::Stream& stream,
                                                          backend::CompletionCallback reached);
  // Lets the stream go on; a second call does nothing.
  void openHostGate(HostGate& gate);
  // How many of the copies, memsets and kernels pushed to `stream` (a stream of this device) are
  // still held here rather than on the real stream: always the latest ones pushed.
  std::size_t heldMemoryOperations(backend::Stream& stream) const;

  // "fair" or "fifo".
  std::string_view schedulerName() const { return scheduler_->name(); }
  // Re-reads the weight and class of every tenant this device has seen (after set-limit or a
  // reload) and lets the scheduler decide again.
  void refreshTenants();
  DispatchStats stats() const;
  // Where `stream`, made by this device, runs; nullopt for any other stream.
  std::optional<StreamPlacement> placement(const backend::Stream& stream) const;

  backend::Device& real() { return *device_; }

  struct StreamState;
  struct EventState;

private:
  class ProxyStream;
  class ProxyEvent;
  struct Operation;
  struct KernelDone {
    CUresult status = CUDA_SUCCESS;
    std::uint64_t nanoseconds = 0;
  };
  struct TenantEntry {
    std::weak_ptr<Tenant> tenant;
    scheduler::TenantId id = 0;
    scheduler::TenantSpec spec;
  };
  struct Queued {
    std::shared_ptr<StreamState> stream;
  };
  struct InFlight {
    std::shared_ptr<Tenant> tenant;
  };
  class ErrorHandler final : public kj::TaskSet::ErrorHandler {
  public:
    void taskFailed(kj::Exception&& exception) override;
  };

  static scheduler::Nanos now();
  backend::Result<std::unique_ptr<backend::Stream>> makeStream(const StreamOwner& owner,
                                                               backend::TenantClass workClass,
                                                               unsigned flags, int priority,
                                                               backend::AddressSpace addressSpace);
  CUresult checkLaunch(const backend::Function& function,
                       const backend::LaunchConfig& config) const;

  // Everything a proxy stream does goes through these.
  CUresult push(const std::shared_ptr<StreamState>& stream, Operation operation);
  void release(const std::shared_ptr<StreamState>& stream);
  // Hands `stream`'s queue to its real stream up to the next kernel (made a scheduler item), an
  // unsatisfied wait, or the end; then streams unblocked meanwhile; then asks the scheduler.
  void advance(std::shared_ptr<StreamState> stream);
  void drainReady();
  void advanceOne(std::shared_ptr<StreamState> stream);
  // Hands one operation to the real stream. Errors go to the operation's callbacks and, for
  // operations without one, to the stream's next query or callback.
  void submit(StreamState& stream, Operation& operation);
  void fail(StreamState& stream, Operation& operation, CUresult status);
  void submitKernel(StreamState& stream, Operation& operation, scheduler::ItemId item);
  void recordReleased(EventState& event, std::uint64_t sequence, CUresult status);
  void pump();
  void armWake(scheduler::Nanos nowNanos);
  void kernelDone(scheduler::ItemId item, KernelDone done);
  scheduler::TenantId tenantFor(const StreamOwner& owner);
  void forgetExpiredTenants();
  // Fails and drops every held operation.
  void abandonAll(CUresult status);
  // The real device, for the owner thread's calls: none may reach it while another thread resets
  // it (beginReset). Immutable facts (properties, occupiedBytes) and the calls the backend
  // contract lets other threads make go to device_ directly.
  backend::Device& backend() const {
    KJ_ASSERT(!resetting_, "a call reached the device while its context is being reset");
    return *device_;
  }

  std::unique_ptr<backend::Device> device_;
  bool resetting_ = false;  // from beginReset to finishReset
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  kj::Timer& timer_;
  std::map<scheduler::StreamId, std::shared_ptr<StreamState>> streams_;
  std::deque<std::shared_ptr<StreamState>> ready_;  // to advance, in order
  std::unordered_map<scheduler::ItemId, Queued> queued_;
  std::unordered_map<scheduler::ItemId, InFlight> inFlight_;
  // By the daemon's tenant id, which no other tenant ever gets while the daemon runs.
  std::map<TenantId, TenantEntry> tenants_;
  scheduler::TenantId nextTenantId_ = 1;  // 0: the daemon's own streams
  scheduler::ClientId nextClientId_ = 1;
  scheduler::StreamId nextStreamId_ = 1;
  scheduler::ItemId nextItemId_ = 1;
  // Launch limits from the device's attributes (0: the device did not say), checked when a
  // kernel is queued because the real launch may come later, when no caller is left to answer.
  std::array<unsigned, 3> maxBlock_{};
  std::array<unsigned, 3> maxGrid_{};
  unsigned maxThreadsPerBlock_ = 0;
  bool advancing_ = false;
  bool pumping_ = false;
  std::optional<scheduler::Nanos> wakeArmedAt_;
  ErrorHandler errorHandler_;
  // Last: dropped first, before anything its tasks use. Held by pointer because a TaskSet's
  // destructor may throw, which a Device's may not.
  std::unique_ptr<kj::TaskSet> tasks_ = std::make_unique<kj::TaskSet>(errorHandler_);
};

}  // namespace gpuproxy::server::dispatch
