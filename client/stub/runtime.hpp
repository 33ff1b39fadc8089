#pragma once
// The stub's one process-wide connection to gpuproxyd (docs/architecture.md §2).
//
// Threading: the Cap'n Proto client lives on a private kj event loop running on a thread the
// runtime owns. Application threads never touch kj objects; they hand a function to that thread
// with kj::Executor::executeSync and block until the promise it returns resolves, so any number
// of application threads may call in at once, each with its own synchronous call.
//
// Lifetime: created by the first successful cuInit and never destroyed (see Runtime::initialize).

#include <cuda.h>

#include <kj/async.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/stub/command_sink.hpp"
#include "client/stub/launch_params.hpp"
#include "client/stub/stream_capture.hpp"
#include "client/stub/virtual_memory.hpp"
#include "gpuproxy/protocol/gpuproxy.capnp.h"

namespace gpuproxy::stub {

class DataPlane;
class PinnedHeap;
class RingSink;
class RpcSink;

struct DeviceRecord {
  std::string name;
  std::array<std::uint8_t, 16> uuid{};
  std::uint64_t totalMemory = 0;
  std::unordered_map<int, int> attributes;  // every attribute the daemon reported
  // cuCtxGetStreamPriorityRange: lower numbers are higher priorities, greatest <= least.
  int leastStreamPriority = 0;
  int greatestStreamPriority = 0;

  // A requested stream priority as the driver keeps it: clamped into the device's range.
  int clampStreamPriority(int priority) const {
    return std::clamp(priority, greatestStreamPriority, leastStreamPriority);
  }

  // nullopt for an attribute the daemon did not report.
  std::optional<int> attribute(CUdevice_attribute which) const {
    auto found = attributes.find(static_cast<int>(which));
    if (found == attributes.end()) return std::nullopt;
    return found->second;
  }
};

// What cuStreamSetAttribute set on a stream that changes no result, kept so that
// cuStreamGetAttribute answers it: the L2 access policy window (a cache hint), how the host waits
// for the stream, and the memory synchronisation domain its kernels' fences name (the sim's
// memory is coherent in every domain; on a GPU the default domain's fences reach furthest).
struct StreamHints {
  CUaccessPolicyWindow accessPolicyWindow{};
  int synchronizationPolicy = CU_SYNC_POLICY_AUTO;
  int memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT;
  CUlaunchMemSyncDomainMap memSyncDomainMap{0, 1};
};

struct StreamRecord {
  std::uint64_t context = 0;
  unsigned flags = 0;  // as created (CU_STREAM_NON_BLOCKING or 0)
  int priority = 0;    // as requested, clamped to the device's range
  StreamHints hints;
};

struct ContextRecord {
  std::uint32_t device = 0;
  unsigned flags = 0;
  bool primary = false;
  // Changes whenever the daemon drops the context's resources (destroy, primary reset or final
  // release), so that per-thread caches notice that their streams are gone.
  std::uint64_t generation = 0;
  // cuCtxSetCacheConfig's preference: a hint the backends may ignore, kept so that
  // cuCtxGetCacheConfig answers what was set.
  int cacheConfig = CU_FUNC_CACHE_PREFER_NONE;
  // What cuCtxSetLimit granted, by CUlimit; a limit not here has the driver's default. Cleared
  // with the context's resources (a primary context reset).
  std::map<int, std::size_t> limits{};
  // cuStreamSetAttribute's hints on the context's default streams (NULL, legacy, per-thread).
  StreamHints defaultStreamHints{};
};

// What cuLaunchKernel needs to know about a CUfunction without asking the daemon.
struct KernelRecord {
  std::string name;  // as cuModuleGetFunction was asked for it (cuFuncGetName)
  std::uint64_t module = 0;
  std::uint64_t context = 0;
  std::vector<ParameterSlot> parameters;
  std::uint32_t parameterBytes = 0;
  int maxThreadsPerBlock = 0;
  int sharedSizeBytes = 0;
  int numRegs = 0;
  int localSizeBytes = 0;
  int constSizeBytes = 0;
  int ptxVersion = 0;     // the PTX target the kernel came from (75 for compute_75); 0: unknown
  int binaryVersion = 0;  // the architecture it runs as; 0: unknown
  // What cuFuncSetAttribute changed (function_attributes.cpp). The record is shared between
  // threads, so these are atomics; -1 means never set: the default per-block limit applies to
  // dynamic shared memory, and the carveout is CU_SHAREDMEM_CARVEOUT_DEFAULT (-1) anyway.
  mutable std::atomic<int> maxDynamicSharedSizeBytes{-1};
  mutable std::atomic<int> preferredSharedMemoryCarveout{-1};
  mutable std::atomic<int> nonPortableClusterSizeAllowed{0};
  mutable std::atomic<int> clusterSchedulingPolicy{CU_CLUSTER_SCHEDULING_POLICY_DEFAULT};
};

// One of this process's device allocations (or module variables), as cuPointerGetAttribute and
// cuMemGetAddressRange report it.
struct AllocationRange {
  std::uint64_t start = 0;
  std::uint64_t bytes = 0;
  std::uint64_t context = 0;
  std::uint64_t bufferId =
      0;                 // unique over the process's lifetime (CU_POINTER_ATTRIBUTE_BUFFER_ID)
  bool managed = false;  // cuMemAllocManaged's (managed_memory.cpp)
};

class Runtime {
public:
  // cuInit's work: connect and attach on the first call, cheap afterwards.
  static CUresult initialize();
  // Null before a successful cuInit, and in a child forked from an attached process (its copy of
  // the connection has no loop thread behind it).
  static Runtime* instance() noexcept;

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime();

  int driverVersion() const { return driverVersion_; }
  const std::string& backend() const { return backend_; }
  const std::vector<DeviceRecord>& devices() const { return devices_; }
  // Null for an ordinal out of range.
  const DeviceRecord* device(CUdevice ordinal) const {
    if (ordinal < 0 || static_cast<std::size_t>(ordinal) >= devices_.size()) return nullptr;
    return &devices_[static_cast<std::size_t>(ordinal)];
  }

  bool connectionLost() const noexcept { return lost_.load(std::memory_order_acquire); }

  // Where stream operations go (command_sink.hpp): the shared-memory rings, or the control
  // socket when this process has no data plane (GPUPROXY_TRANSPORT=rpc, or a daemon that could
  // not give it one). Chosen before cuInit returns and constant afterwards.
  CommandSink& commands() const noexcept { return *capturing_; }
  // The same sink, for what only capture needs (stream_capture.hpp).
  CapturingSink& capturing() const noexcept { return *capturing_; }
  // The segment's pinned host heap when this process has one that is usable, else null.
  PinnedHeap* pinnedHeap() const noexcept;
  // The shared-memory data plane, or null (as above).
  DataPlane* dataPlane() const noexcept { return dataPlane_.get(); }

  // What the application gets for an exception out of call(): the transport broke (the schema's
  // convention), so CUDA_ERROR_MPS_CONNECTION_FAILED, or CUDA_ERROR_NOT_SUPPORTED for a method
  // the daemon does not implement. Logs.
  CUresult failed(const char* entryPoint, const kj::Exception& exception) noexcept;

  // Runs func(session) on the loop thread and waits for the kj::Promise<T> (or T) it returns;
  // exceptions come back as kj::Exception. `func` may capture the caller's locals by reference.
  template <typename Func>
  auto call(Func&& func) {
    return executor_->executeSync([this, &func]() { return func(*session_); });
  }

  // Sends without waiting for the answer, for cleanup whose outcome nobody can observe (the
  // per-thread stream of an exiting thread). Returns once the request is on its way.
  template <typename Func>
  void post(Func&& func) {
    executor_->executeSync([this, &func]() {
      kj::Promise<void> sent = func(*session_);
      sent.detach([](kj::Exception&&) {});
    });
  }

  // Handle tables. The daemon validates every handle too; the stub keeps these to answer locally
  // (cuCtxGetDevice, launch checks) and to find the context a stream or event belongs to.
  std::uint64_t newGeneration() noexcept { return nextGeneration_.fetch_add(1) + 1; }
  // Changes whenever a module or a context's resources are forgotten: what a cache of handles
  // (a CUkernel's function per context) checks before it trusts an entry.
  std::uint64_t tablesEpoch() const noexcept {
    return tablesEpoch_.load(std::memory_order_acquire);
  }
  void addContext(std::uint64_t context, ContextRecord record);
  std::optional<ContextRecord> context(std::uint64_t context) const;
  // Changes a known context's record; false when there is none.
  template <typename Change>
  bool updateContext(std::uint64_t context, Change&& change) {
    std::lock_guard lock(tablesMutex_);
    auto found = contexts_.find(context);
    if (found == contexts_.end()) return false;
    change(found->second);
    return true;
  }
  // The primary context of `device` this process has retained before, if any.
  std::optional<std::uint64_t> primaryContext(std::uint32_t device) const;
  // Drops the context's streams, events, modules and functions; `destroyed` also drops the
  // context itself, otherwise it gets a new generation.
  void forgetContextResources(std::uint64_t context, bool destroyed);

  void addStream(std::uint64_t stream, StreamRecord record);
  std::optional<StreamRecord> stream(std::uint64_t stream) const;
  // Changes a known stream's record; false when there is none.
  template <typename Change>
  bool updateStream(std::uint64_t stream, Change&& change) {
    std::lock_guard lock(tablesMutex_);
    auto found = streams_.find(stream);
    if (found == streams_.end()) return false;
    change(found->second);
    return true;
  }
  std::optional<std::uint64_t> streamContext(std::uint64_t stream) const;
  void forgetStream(std::uint64_t stream);

  void addEvent(std::uint64_t event, std::uint64_t context);
  std::optional<std::uint64_t> eventContext(std::uint64_t event) const;
  void forgetEvent(std::uint64_t event);
  // A fresh token joining the two records of a stream's wait for another device's event
  // (protocol::ring::HoldForEvent); never 0.
  std::uint64_t newWaitToken() noexcept {
    return nextWaitToken_.fetch_add(1, std::memory_order_relaxed);
  }

  void addModule(std::uint64_t module, std::uint64_t context);
  std::optional<std::uint64_t> moduleContext(std::uint64_t module) const;
  void forgetModule(std::uint64_t module);  // and its functions

  void addFunction(std::uint64_t function, std::shared_ptr<const KernelRecord> record);
  std::shared_ptr<const KernelRecord> function(std::uint64_t function) const;

  // Device allocations this process made (cuMemAlloc), so that copies and memsets can be refused
  // synchronously, as the daemon would, before they go into the ring. The daemon checks again.
  // `managed`: cuMemAllocManaged memory, which outlives a reset of its context (it is the
  // process's pinned heap's, not the context's) and is freed by cuMemFree only.
  void addAllocation(std::uint64_t pointer, std::uint64_t bytes, std::uint64_t context,
                     bool managed = false);
  // A module variable the daemon named (cuModuleGetGlobal): copies to and from it are allowed
  // while its module is loaded.
  void addModuleVariable(std::uint64_t pointer, std::uint64_t bytes, std::uint64_t context,
                         std::uint64_t module);
  void forgetAllocation(std::uint64_t pointer);
  // Whether [pointer, pointer + bytes) lies inside one of this process's allocations.
  bool ownsRange(std::uint64_t pointer, std::uint64_t bytes) const;
  // The allocation `pointer` points into, if it is one of this process's.
  std::optional<AllocationRange> allocationContaining(std::uint64_t pointer) const;
  // A buffer id no allocation of this process has had (device or host memory alike).
  std::uint64_t newBufferId() noexcept { return nextBufferId_.fetch_add(1) + 1; }
  // Reservations, physical memory and mappings (cuMemMap and its kin).
  VirtualMemoryTable& virtualMemory() { return virtualMemory_; }

private:
  struct StartOutcome {
    CUresult result = CUDA_ERROR_NO_DEVICE;
    bool unreachable = true;  // the daemon could not be reached (vs. it refused)
    std::string reason;
  };

  explicit Runtime(std::string socketPath);
  StartOutcome start();
  void loopMain(std::promise<StartOutcome>& ready);
  void markLost(const std::string& reason) noexcept;
  // After attach, on the loop thread: asks for the data plane and maps it. Logs and leaves
  // dataPlane_ null when that fails (the RPC path then carries everything).
  void openDataPlane(kj::WaitScope& waitScope, protocol::Session::Client& session);
  // Corrects the daemon's device attributes for what the devices reach of this process: only the
  // memory it shares with gpuproxyd, so never pageable memory, even where the GPU itself could
  // (a GPU with HMM reports pageable memory access), and mapped pinned memory
  // (cuMemHostAlloc's DEVICEMAP) only with a pinned heap; and for what the stub offers whatever
  // the GPU: memory pools shared by file descriptor only (memory_pools.cpp), interprocess events,
  // virtual memory that is never exported (virtual_memory.cpp).
  void fitDeviceAttributes();

  const std::string socketPath_;
  std::thread loopThread_;
  // Set by the loop thread before it reports a successful start; constant afterwards.
  kj::Own<const kj::Executor> executor_;
  protocol::Session::Client* session_ = nullptr;  // lives on the loop thread's stack
  int driverVersion_ = 0;
  std::string backend_;
  std::vector<DeviceRecord> devices_;

  std::atomic<bool> lost_{false};
  std::atomic<std::uint64_t> nextWaitToken_{1};
  std::atomic<std::uint64_t> nextGeneration_{0};
  std::atomic<std::uint64_t> tablesEpoch_{1};
  std::atomic<std::uint64_t> nextBufferId_{0};
  std::unique_ptr<DataPlane> dataPlane_;
  std::unique_ptr<RpcSink> rpcSink_;
  std::unique_ptr<RingSink> ringSink_;
  CommandSink* transport_ = nullptr;  // the ring's sink once the data plane is open, else RPC
  std::unique_ptr<CapturingSink> capturing_;

  // Read on every launch and copy from many threads, written rarely.
  mutable std::shared_mutex tablesMutex_;
  std::unordered_map<std::uint64_t, ContextRecord> contexts_;
  std::unordered_map<std::uint64_t, StreamRecord> streams_;
  std::unordered_map<std::uint64_t, std::uint64_t> events_;   // event -> context
  std::unordered_map<std::uint64_t, std::uint64_t> modules_;  // module -> context
  std::unordered_map<std::uint64_t, std::shared_ptr<const KernelRecord>> functions_;

  struct Allocation {
    std::uint64_t bytes = 0;
    std::uint64_t context = 0;
    std::uint64_t module = 0;  // the module of a module variable; 0 for cuMemAlloc memory
    std::uint64_t bufferId = 0;
    bool managed = false;
  };
  mutable std::shared_mutex allocationsMutex_;
  std::map<std::uint64_t, Allocation> allocations_;  // by start address
  VirtualMemoryTable virtualMemory_;
};

}  // namespace gpuproxy::stub
