#pragma once
// Everything that belongs to one GPU: its backend device (and so its context), the dispatcher that
// every operation on it passes through (server/dispatch), the daemon's exact accounting of its
// memory, its clients, and what happens after a sticky fault. Nothing here is global, so a GPU can
// later be moved into a supervised worker process of its own.

#include "protocol/cuda_result.hpp"
#include "server/backend/backend.hpp"
#include "server/dispatch/scheduled_device.hpp"
#include "server/gpu/blocking_call_thread.hpp"
#include "server/gpu/client_stats.hpp"
#include "server/gpu/ipc_exports.hpp"
#include "server/gpu/owner_thread.hpp"

#include <kj/async.h>
#include <kj/timer.h>

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace gpuproxy::server {

class GpuClient;

// What status and metrics show of one GPU, taken at one moment on the shard's owner thread: a
// value, so that whoever shows it never reads the GPU's live state.
struct GpuStatus {
  std::uint32_t index = 0;
  std::string name;
  std::uint64_t memoryTotal = 0;
  unsigned computeCapability = 0;  // major * 10 + minor
  std::uint64_t memoryUsed = 0;    // every client's allocations and modules (the ledger's total)
  // Of memoryUsed: allocations whose exporter let go while another process has them open.
  std::uint64_t memoryKeptForImporters = 0;
  std::uint32_t clients = 0;
  CUresult stickyError = CUDA_SUCCESS;  // during a reset, the one it clears
  pid_t faultingPid = 0;
  dispatch::DispatchStats dispatched;
  BlockingCallThread::Stats blockingCalls;
  backend::StreamPriorityRange streamPriorities;  // during a reset, from before it
  backend::SmPartition smPartition;
};

// Threading: a shard is owned by the thread that made it (its GPU's, GpuThread), which alone
// touches its state and that of its clients (OwnerThread checks it). Whoever is not part of the
// GPU (a client's session, status, a tenant's change) reaches it by a message to that thread
// (executor(), server/gpu/gpu_messages.hpp). Backend calls that may block for long run on the
// shard's BlockingCallThread instead, so that a slow module load on one GPU holds up no other
// client's commands, on this GPU or any other, nor the admin socket.
class GpuShard final : private kj::TaskSet::ErrorHandler {
public:
  // `timer` is the owner thread's; the dispatcher wakes the scheduler with it. Throws
  // std::invalid_argument when `dispatch` names no scheduler.
  GpuShard(std::uint32_t index, std::unique_ptr<backend::Device> device, kj::Timer& timer,
           const dispatch::DispatchOptions& dispatch = {});
  ~GpuShard() noexcept;
  GpuShard(const GpuShard&) = delete;
  GpuShard& operator=(const GpuShard&) = delete;

  std::uint32_t index() const { return index_; }
  // Where messages to this GPU go: its owner thread's. Safe from any thread.
  const kj::Executor& executor() const { return executor_; }
  // The scheduled device: streams and events made here are the dispatcher's proxies.
  backend::Device& device() { return *device_; }
  dispatch::ScheduledDevice& dispatcher() { return *device_; }
  // Fixed once the device is open: safe from any thread.
  const backend::DeviceProperties& properties() const { return device_->properties(); }

  // A client's state on this GPU. The shard keeps a borrowed reference for status until the
  // GpuClient is destroyed.
  std::unique_ptr<GpuClient> openClient(std::shared_ptr<ClientStats> stats);

  // Device memory for a client, allocated and freed on the blocking-call thread: the driver's
  // cuMemAlloc may take long under memory pressure, and cuMemFree may wait for the device. What
  // the memory costs is charged by the caller's MemoryCharge. Memory allocated for a caller that
  // no longer waits is freed again at once.
  kj::Promise<backend::Result<CUdeviceptr>> allocate(std::size_t bytes,
                                                     backend::AddressSpace owner);
  kj::Promise<CUresult> free(CUdeviceptr pointer);
  // Frees device memory whose charge its holder has already given back, with nobody waiting for
  // the answer (what a client leaves behind when its context is destroyed or it goes; `bytes` is
  // what it takes on the device, `pid` is for the log line a failure gets). The free runs on the
  // blocking-call thread too, where a cuMemFree that waits for the device holds up no one.
  // Crediting first is safe because that thread runs its calls in order: every allocation on
  // this GPU asked for after this call (and every module load) is made after the memory is back,
  // so a process restarted at its tenant's limit gets it; memoryInfo() counts it as free already.
  void release(CUdeviceptr pointer, std::uint64_t bytes, pid_t pid);
  // Physical memory (cuMemCreate, backend::Device::createPhysicalMemory) for a client, made and
  // given back on the blocking-call thread as allocate and release do. Memory made for a caller
  // that no longer waits is given back again at once.
  kj::Promise<backend::Result<std::uint64_t>> createPhysicalMemory(std::uint64_t bytes);
  void releasePhysicalMemory(std::uint64_t handle, std::uint64_t bytes, pid_t pid);
  // An allocation on this thread, for the sim's device heap (never a driver call).
  backend::Result<CUdeviceptr> allocateNow(std::size_t bytes, backend::AddressSpace owner);
  std::uint64_t occupiedBytes(std::size_t bytes) const { return device_->occupiedBytes(bytes); }
  // A module loaded through the shard: destroying it unloads it on the blocking-call thread, as
  // release frees memory, since cuModuleUnload may wait for the device. Whoever holds it gives
  // back its charge as it destroys it; crediting first is safe for the reason release's comment
  // gives.
  struct UnloadOnBlockingCallThread {
    GpuShard* shard = nullptr;
    void operator()(backend::Module* module) const;
  };
  using LoadedModule = std::unique_ptr<backend::Module, UnloadOnBlockingCallThread>;
  // A module for `owner`: prepared (decoded, JIT-compiled) and placed in device memory on the
  // blocking-call thread. Its device memory is not charged yet: the caller charges it.
  kj::Promise<backend::Result<LoadedModule>> loadModule(std::vector<std::byte> image,
                                                        backend::AddressSpace owner);
  // Host memory registered with (or unregistered from) this GPU on the blocking-call thread:
  // pinning a large range takes time in proportion to its size. Contract as
  // backend::Device::registerHostMemory's.
  kj::Promise<CUresult> registerHostMemory(void* host, std::size_t bytes,
                                           backend::AddressSpace owner);
  kj::Promise<CUresult> unregisterHostMemory(void* host);
  // Whether [pointer, pointer + bytes) lies in one host range registered here for `owner`: such
  // memory is device-mapped at its own address (unified addressing), so copies and memsets may
  // name it as device memory, as kernels may (pinned and managed memory). A range leaves this
  // table when its unregistration starts: nothing queued after that may use it.
  bool hostRangeIsMapped(backend::AddressSpace owner, CUdeviceptr pointer,
                         std::uint64_t bytes) const;
  // The blocking-call thread's counters, for status and metrics.
  BlockingCallThread::Stats blockingCalls() const { return blockingCalls_->stats(); }
  std::uint64_t memoryUsed() const { return memoryUsed_; }
  // Modules take device memory the backend allocates itself; the accounting still covers it.
  // The device's total in the memory ledger (server/gpu/memory_charge.hpp): every client's
  // allocations and modules on it, written only by their MemoryCharges.
  std::uint64_t& memoryCount() { return memoryUsed_; }
  // The device's memory as cuMemGetInfo reports it, with what is being given back (release, a
  // module's unload) counted as free: that memory is the tenants' again, and every allocation
  // asked for from now on reaches the device after it is back.
  backend::MemoryInfo memoryInfo();

  std::size_t clientCount() const { return clients_.size(); }
  // This GPU as status shows it now.
  GpuStatus status();
  // A tenant's weight or class changed: the scheduler learns it (ScheduledDevice::refreshTenants).
  void refreshTenants();

  // The interprocess handles made on this GPU (cuIpc*), and the memory kept for their importers.
  IpcExports& ipcExports() {
    owner_.check();
    return ipcExports_;
  }

  // Resolves at once, or, while the GPU's context is being reset (or due to be, once the blocking
  // calls before it have ended), when the reset has ended: a new context is made only then (the
  // reset would destroy it, or find it in its way).
  kj::Promise<void> whenServing();
  bool resetting() const { return resetEnded_ != nullptr; }
  // The device's stream priorities and SM partition, as status shows them; during a reset, those
  // from before it.
  backend::StreamPriorityRange streamPriorityRange() const;
  backend::SmPartition smPartition() const;
  // What `owner`'s kernels printed (backend::Device::takeDeviceOutput); nothing during a reset,
  // which drops it.
  std::string takeDeviceOutput(backend::AddressSpace owner);

  // Sticky faults: the first kernel that completes with a sticky error names the faulting client.
  // Called from backend threads.
  void noteKernelStatus(CUresult status, pid_t pid);
  // The owner thread's check, for the state of this GPU kept elsewhere (its clients').
  const OwnerThread& owner() const { return owner_; }
  // During a reset, the error it clears.
  CUresult stickyError();
  pid_t faultingPid() const { return faultingPid_.load(); }

private:
  friend class GpuClient;
  void detach(GpuClient& client);
  void recoverIfIdle();
  // Resets the context on the blocking-call thread (resetEnded_ made already); finishReset (this
  // thread) ends it.
  void startReset();
  void finishReset(CUresult status);
  void taskFailed(kj::Exception&& exception) override;
  // Runs `call` on the blocking-call thread; then, on this thread, `finish(callerWaits)` gives
  // the caller's answer, whether or not the caller still waits for it.
  template <typename Answer, typename Call, typename Finish>
  kj::Promise<Answer> runBlocking(Call&& call, Finish&& finish);
  // Runs `call` (a CUresult) on the blocking-call thread with nobody waiting, and logs its failure
  // as that of giving back `what` `id` of `pid`'s. Its `bytes` count as free in memoryInfo() from
  // now until the call has returned (givingBack_).
  template <typename Call>
  void giveBackInBackground(const char* what, std::uint64_t id, std::uint64_t bytes, pid_t pid,
                            Call&& call);
  // Destroys `module` on the blocking-call thread (LoadedModule's deleter).
  void unload(std::unique_ptr<backend::Module> module);

  OwnerThread owner_;
  const kj::Executor& executor_ = kj::getCurrentThreadExecutor();
  std::uint32_t index_;
  std::unique_ptr<dispatch::ScheduledDevice> device_;
  // Declared after the device and destroyed before it (see the destructor): its thread may be
  // inside a call on the device.
  std::unique_ptr<BlockingCallThread> blockingCalls_;
  // Each blocking call's answer, carried back to this thread whether or not its caller still
  // waits, so that the shard always learns that the call has ended.
  kj::Own<kj::TaskSet> blockingCallAnswers_;
  // Blocking calls not yet ended: the context is not reset while one is, since it may use it.
  unsigned blockingCallsOutstanding_ = 0;
  // From when the context is due to be reset (the last client holding a context on the poisoned
  // GPU has gone) until the reset has ended: resolved then (whenServing), and what status says of
  // the device meanwhile. Once the reset has `started` (when no blocking call is outstanding any
  // more), the owner thread makes no call on the device (ScheduledDevice::beginReset).
  struct Reset {
    kj::ForkedPromise<void> ended;
    kj::Own<kj::PromiseFulfiller<void>> end;
    CUresult sticky;
    backend::StreamPriorityRange priorities;
    backend::SmPartition partition;
    bool started = false;
  };
  std::unique_ptr<Reset> resetEnded_;
  std::uint64_t memoryUsed_ = 0;
  // Device memory handed to the blocking-call thread to give back (giveBackInBackground) whose
  // free has not returned yet: added here, taken off on that thread once the free has returned.
  std::atomic<std::uint64_t> givingBack_{0};
  // After memoryUsed_: the charges it keeps are recorded there.
  IpcExports ipcExports_;
  // Host ranges registered with the device, by start (hostRangeIsMapped).
  struct MappedHostRange {
    std::uint64_t bytes = 0;
    backend::AddressSpace owner = backend::kDaemonAddressSpace;
  };
  std::map<CUdeviceptr, MappedHostRange> mappedHostRanges_;
  std::set<GpuClient*> clients_;
  std::atomic<pid_t> faultingPid_{0};
  std::atomic<bool> faultReported_{false};
};

// True for the errors after which a CUDA context is unusable (CUDA's "sticky" errors).
using protocol::isStickyError;

}  // namespace gpuproxy::server
