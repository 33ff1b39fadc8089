#pragma once
// One client's state on one GPU: its contexts (each with its own legacy NULL stream), allocations,
// modules, functions, streams and events, and every operation on them. Every handle and pointer a
// client sends is checked against these tables, so a client can name only what it created.
//
// Destroying a GpuClient frees everything it holds at once; callers first wait for drain() so that
// no queued work still uses that memory (the session does this on every way a client can end).
// Before that, abandon() drops the work the device has not been handed yet and frees at once the
// memory that no work already on the device can still touch.
//
// Threading: a GpuClient is its GPU's, made, used and destroyed on the GPU's owner thread only;
// whoever is not part of the GPU reaches it by message (server/gpu/gpu_messages.hpp). Every
// public method but deviceIndex() and executor() checks the thread (OwnerThread), so a call from
// elsewhere is found where it is made.

#include "protocol/limits.hpp"
#include "scheduler/scheduler.hpp"
#include "server/backend/backend.hpp"
#include "server/dispatch/scheduled_device.hpp"
#include "server/gpu/client_stats.hpp"
#include "server/gpu/client_virtual_memory.hpp"
#include "server/gpu/gpu_shard.hpp"
#include "server/gpu/handles.hpp"
#include "server/gpu/ipc_exports.hpp"
#include "server/gpu/memory_charge.hpp"

#include <kj/async.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gpuproxy::server {

struct PrimaryContextState {
  unsigned flags = 0;
  bool active = false;
};

// A function's handle and what cuFuncGetAttribute and the stub's launches need of it: a copy, so
// that it can be an answer sent off the GPU's thread.
struct FunctionHandle {
  Handle handle = 0;
  backend::FunctionInfo info;
};

// Keeps the newest `limit` bytes of `output`, dropping whole lines from the front where it can;
// returns the bytes dropped.
std::uint64_t keepNewestOutput(std::string& output, std::size_t limit);

class GpuClient {
public:
  GpuClient(GpuShard& shard, std::shared_ptr<ClientStats> stats);
  ~GpuClient();
  GpuClient(const GpuClient&) = delete;
  GpuClient& operator=(const GpuClient&) = delete;

  std::uint32_t deviceIndex() const;
  // Where messages to this client's state go: its GPU's owner thread (gpu_messages.hpp). Safe
  // from any thread, as deviceIndex() is.
  const kj::Executor& executor() const;

  // Resolves at once, or once the reset of the GPU's context now under way has ended
  // (GpuShard::whenServing): what makes a context, or memory outside one, waits for it first.
  kj::Promise<void> whenGpuServes();

  // Contexts.
  backend::Result<Handle> createContext(unsigned flags);
  kj::Promise<CUresult> destroyContext(Handle context);
  backend::Result<Handle> retainPrimaryContext();
  kj::Promise<CUresult> releasePrimaryContext();
  kj::Promise<CUresult> resetPrimaryContext();
  CUresult setPrimaryContextFlags(unsigned flags);
  PrimaryContextState primaryContextState() const;
  kj::Promise<CUresult> synchronizeContext(Handle context);

  // Memory. Pointers must lie inside this client's own allocations on this GPU.
  // Answers once the device has the memory: the allocation runs off this thread (GpuShard).
  kj::Promise<backend::Result<CUdeviceptr>> allocate(Handle context, std::uint64_t bytes);
  bool ownsAllocation(CUdeviceptr pointer) const;
  // Whether `pointer` lies anywhere inside one of this client's allocations on this GPU.
  bool inAllocation(CUdeviceptr pointer) const {
    shard_.owner().check();
    return allocationOf(pointer) != 0;
  }
  kj::Promise<CUresult> free(CUdeviceptr pointer);
  backend::Result<backend::MemoryInfo> memoryInfo(Handle context);
  // cuCtxSetLimit of CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE or CU_LIMIT_MALLOC_HEAP_SIZE
  // for the client's contexts on this GPU, which share one set of limits and one device heap;
  // returns what was granted. The heap's size is fixed once the heap exists
  // (CUDA_ERROR_INVALID_VALUE). They go back to the driver's defaults with the last context.
  backend::Result<std::uint64_t> setLimit(Handle context, CUlimit limit, std::uint64_t value);
  // Returns once the bytes are staged in the daemon and the copy is queued (CUDA's pageable
  // host-to-device semantics).
  CUresult copyHostToDevice(Handle context, Handle stream, CUdeviceptr destination,
                            std::span<const std::byte> data);
  // Straight from host memory the daemon does not own (a client's pinned heap), with no copy in
  // the daemon: `keepAlive` keeps that memory mapped until the backend has read it. Resolves once
  // the copy has completed.
  kj::Promise<CUresult> copyHostToDeviceFrom(Handle context, Handle stream, CUdeviceptr destination,
                                             std::span<const std::byte> source,
                                             std::shared_ptr<const void> keepAlive);
  // The same, answering now whether the copy was queued; only then does `read` resolve, once the
  // backend has read the source, with the copy's status. `heldBytes`: what `keepAlive` keeps in
  // the daemon's own memory for the copy (counted against the client's queued-work bound).
  CUresult queueHostToDeviceFrom(Handle context, Handle stream, CUdeviceptr destination,
                                 std::span<const std::byte> source,
                                 std::shared_ptr<const void> keepAlive, std::uint64_t heldBytes,
                                 kj::Promise<CUresult>& read);
  // Resolves once the bytes have arrived.
  kj::Promise<backend::Result<std::vector<std::byte>>> copyDeviceToHost(Handle context,
                                                                        Handle stream,
                                                                        CUdeviceptr source,
                                                                        std::uint64_t bytes);
  // The same, straight into host memory the daemon does not own (a client's staging area):
  // `keepAlive` keeps that memory mapped until the backend has written it, even if the client
  // goes away first. Resolves once the bytes are there.
  kj::Promise<CUresult> copyDeviceToHostInto(Handle context, Handle stream, CUdeviceptr source,
                                             std::span<std::byte> destination,
                                             std::shared_ptr<const void> keepAlive);
  // Queues a copy or memset on (context, stream) once its arguments pass CUDA's rules and every
  // device range it touches lies inside one of this client's allocations (else
  // CUDA_ERROR_INVALID_VALUE). Host memory it names must stay valid until it has completed.
  CUresult enqueue(Handle context, Handle stream, const backend::MemoryOperation& operation);
  // Holds (context, stream) for something outside this GPU: host work the client runs itself
  // (cuLaunchHostFunc), or another GPU's event the stream waits for. `reached` resolves with the
  // stream's status once its earlier work is done, and the stream's later work waits until the
  // hold is let go (ScheduledDevice::pushHostGate). Ordered with the legacy NULL stream and
  // counted as queued work, as any stream operation. The gate is kept here, by this GPU, under a
  // name: whoever lets the stream go on names it and needs nothing of this GPU's.
  struct StreamHold {
    CUresult result = CUDA_SUCCESS;  // an error: nothing is held
    kj::Promise<CUresult> reached = CUDA_SUCCESS;
  };
  // A host function the client runs itself (cuLaunchHostFunc), named by the client's `token`;
  // let go by hostFunctionReturned(token). CUDA_ERROR_INVALID_VALUE for a token this GPU already
  // holds a stream for.
  StreamHold holdStreamForHostFunction(Handle context, Handle stream, std::uint64_t token);
  // Lets the stream held for `token` go on; false when this GPU holds none for it (answered with
  // an error, let go already, or another GPU's).
  bool hostFunctionReturned(std::uint64_t token);
  // Another GPU's event the stream waits for (cuStreamWaitEvent across GPUs), named by the `hold`
  // this GPU gives back; let go by anotherGpusEventDone(hold), from whatever learns that the
  // event's record is done there.
  struct HoldForAnotherGpu {
    CUresult result = CUDA_SUCCESS;  // an error: nothing is held
    std::uint64_t hold = 0;
  };
  HoldForAnotherGpu holdStreamForAnotherGpu(Handle context, Handle stream);
  // Lets the stream held as `hold` go on; one let go already, or dropped by abandon(), is nothing.
  void anotherGpusEventDone(std::uint64_t hold);
  std::size_t hostFunctionsPending() const {
    shard_.owner().check();
    return hostFunctions_.size();
  }
  bool holdsForHostFunction(std::uint64_t token) const {
    shard_.owner().check();
    return hostFunctions_.count(token) != 0;
  }

  // Modules and kernels.
  // Answers once the module is loaded: its preparation (decoding, JIT) runs off this thread.
  kj::Promise<backend::Result<Handle>> loadModule(Handle context, std::vector<std::byte> image);
  // Waits for the client's queued work first: a copy into the module's variables may be pending.
  kj::Promise<CUresult> unloadModule(Handle module);
  backend::Result<FunctionHandle> function(Handle module, const std::string& name);
  // A module-scope variable; from then on its range is the client's for copies and memsets.
  backend::Result<backend::GlobalVariable> global(Handle module, const std::string& name);
  // A managed variable moved into the client's managed memory at `address` (host memory of the
  // client's registered with this GPU), which the host then shares with the module's kernels.
  CUresult placeManagedVariable(Handle module, const std::string& name, CUdeviceptr address,
                                bool keepValue);
  CUresult launchKernel(Handle context, Handle function, const backend::LaunchConfig& config,
                        Handle stream, std::span<const std::byte> parameters);

  // Streams and events.
  backend::Result<Handle> createStream(Handle context, unsigned flags, int priority);
  CUresult destroyStream(Handle stream);
  kj::Promise<CUresult> synchronizeStream(Handle context, Handle stream);
  CUresult queryStream(Handle context, Handle stream);
  CUresult streamWaitEvent(Handle context, Handle stream, Handle event);
  backend::Result<Handle> createEvent(Handle context, unsigned flags);
  CUresult destroyEvent(Handle event);
  CUresult recordEvent(Handle context, Handle event, Handle stream);
  kj::Promise<CUresult> synchronizeEvent(Handle event);
  CUresult queryEvent(Handle event);
  backend::Result<float> eventElapsedTime(Handle start, Handle end);
  bool ownsEvent(Handle event) const {
    shard_.owner().check();
    return events_.count(event) != 0;
  }

  // Interprocess handles (cuIpc*, server/gpu/ipc_exports.hpp). The allocation holding `pointer`,
  // exported; CUDA_ERROR_INVALID_VALUE for a pointer in none of this client's allocations.
  backend::Result<IpcToken> exportMemory(CUdeviceptr pointer);
  // Another client's exported allocation, mapped for this one in `context`: copies, memsets and
  // kernels of this client may use it until it is closed as often as it was opened. Errors as
  // IpcExports::openMemory's.
  backend::Result<IpcExports::Range> openMemory(Handle context, const IpcToken& token);
  // One reference of a mapping given back; the last unmaps it once the work this client queued
  // before has drained. CUDA_ERROR_INVALID_VALUE for a pointer that starts no mapping of this
  // client's.
  kj::Promise<CUresult> closeMemory(CUdeviceptr pointer);
  bool holdsMapping(CUdeviceptr pointer) const {
    shard_.owner().check();
    return imports_.count(pointer) != 0;
  }
  // An event created with CU_EVENT_INTERPROCESS, exported; CUDA_ERROR_INVALID_HANDLE otherwise.
  backend::Result<IpcToken> exportEvent(Handle event);
  // Another client's exported event, as an event of this client's in `context`.
  backend::Result<Handle> openEvent(Handle context, const IpcToken& token);

  // Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, ...), kept in
  // ClientVirtualMemory: contracts as its own. Physical memory is charged to the tenant and made
  // off this thread, as allocations are; an unmap waits for the client's queued work first, as
  // cuMemUnmap does.
  backend::Result<CUdeviceptr> reserveAddresses(Handle context, std::uint64_t bytes,
                                                std::uint64_t alignment);
  CUresult freeAddresses(CUdeviceptr start, std::uint64_t bytes);
  bool reservesAddress(CUdeviceptr address) const {
    shard_.owner().check();
    return virtualMemory_.reserves(address);
  }
  kj::Promise<backend::Result<Handle>> createPhysicalMemory(std::uint64_t bytes);
  CUresult releasePhysicalMemory(Handle handle) {
    shard_.owner().check();
    return virtualMemory_.release(handle);
  }
  // Physical memory of this client's exported to a shareable handle
  // (cuMemExportToShareableHandle): the same token every time. CUDA_ERROR_INVALID_VALUE for a
  // handle it does not hold.
  backend::Result<IpcToken> exportPhysicalMemory(Handle handle);
  // Memory a client of the same tenant exported on this GPU, as physical memory of this client's
  // (cuMemImportFromShareableHandle): a handle of its own, released and mapped as any; the memory
  // stays its maker's, charged to it, while any client holds it. Errors as
  // IpcExports::openPhysical's; CUDA_ERROR_OUT_OF_MEMORY at the client's cap on objects.
  struct ImportedMemory {
    Handle handle = 0;
    std::uint64_t bytes = 0;
  };
  backend::Result<ImportedMemory> importPhysicalMemory(const IpcToken& token);
  CUresult mapMemory(CUdeviceptr address, std::uint64_t bytes, std::uint64_t offset,
                     Handle handle) {
    shard_.owner().check();
    return virtualMemory_.map(address, bytes, offset, handle);
  }
  kj::Promise<CUresult> unmapMemory(CUdeviceptr address, std::uint64_t bytes);
  CUresult setMemoryAccess(CUdeviceptr address, std::uint64_t bytes, bool writable) {
    shard_.owner().check();
    return virtualMemory_.setAccess(address, bytes, writable);
  }

  // What the client's kernels printed on this GPU (device printf). collectDeviceOutput moves it
  // from the device to here (before a synchronisation is answered) and returns the bytes waiting;
  // takeDeviceOutput gives them to the client. At most kMaxDeviceOutputBytes wait: as a GPU's
  // circular printf buffer does, the oldest output goes, whole lines where it can.
  static constexpr std::size_t kMaxDeviceOutputBytes = protocol::kMaxPrintfFifoBytes;
  struct DeviceOutput {
    std::string text;
    std::uint64_t lostBytes = 0;  // dropped for want of room since the last take
  };
  std::size_t collectDeviceOutput();
  DeviceOutput takeDeviceOutput();

  // Resolves when every piece of work this client queued on this GPU has completed.
  kj::Promise<void> drain();

  // The client is gone. Its work that has not reached the device yet (kernels still waiting for
  // the scheduler, and everything queued behind them) is dropped, never to run; then each
  // allocation and module that no work already on the device can touch is freed, and its tenant
  // credited, now. Returns the bytes freed. What is left is freed on destruction, after drain().
  std::uint64_t abandon();

  std::uint64_t memoryUsed() const { return *memoryUsed_; }
  bool hasContexts() const { return !contexts_.empty(); }
  // Whether the client holds anything a reset of the GPU's context would take from it: a context
  // (and all that is its) or virtual memory, which is the client's, not a context's.
  bool holdsDeviceState() const { return hasContexts() || virtualMemory_.holdsAny(); }

private:
  // Device memory that an operation queued on a stream may touch, remembered until the operation
  // is known to be done (a synchronisation saw it complete), so that abandon() knows what work
  // still on the device can reach.
  struct Touch {
    std::uint64_t work = 0;      // the operation's number on its stream's work counter
    std::uint64_t memoryOp = 0;  // ... among the stream's copies, memsets and kernels
    CUdeviceptr base = 0;        // the allocation; 0: any (a kernel may follow any pointer)
  };
  struct Touches {
    std::deque<Touch> queued;     // oldest first
    std::uint64_t memoryOps = 0;  // copies, memsets and kernels queued on the stream so far
  };
  struct Context {
    bool primary = false;
    unsigned flags = 0;
    std::unique_ptr<backend::Stream> nullStream;
    std::uint64_t nullStreamWork = 0;      // operations queued on the NULL stream so far
    std::uint64_t nullStreamWorkDone = 0;  // ... of which a completion has been seen
    Touches nullStreamTouches;
    TenantObjectHold hold;  // counts against the tenant's cap on contexts
  };
  struct Stream {
    Handle context = 0;
    bool blocking = true;  // synchronises with the context's legacy NULL stream
    std::unique_ptr<backend::Stream> stream;
    std::uint64_t work = 0;               // operations queued on this stream so far
    std::uint64_t workDone = 0;           // ... of which a completion has been seen
    std::uint64_t workSeenByNull = 0;     // ... of which the NULL stream has waited for
    std::uint64_t nullWorkWaitedFor = 0;  // NULL-stream operations this stream has waited for
    Touches touches;
    TenantObjectHold hold;
  };
  struct Event {
    Handle context = 0;
    // Shared with the clients that opened it by an interprocess handle.
    std::shared_ptr<backend::Event> event;
    TenantObjectHold hold;
    unsigned flags = 0;
    bool exported = false;  // this client exported it (exportEvent)
  };
  struct Module {
    Handle context = 0;
    GpuShard::LoadedModule module;
    std::map<std::string, Handle> functionsByName;
    std::vector<backend::GlobalVariable> variablesLookedUp;  // in moduleVariables_ too
    std::optional<MemoryCharge> charge;                      // its device memory, while loaded
    TenantObjectHold hold;
  };
  struct Function {
    Handle context = 0;
    Handle module = 0;
    backend::Function* function = nullptr;
  };
  struct Allocation {
    std::uint64_t bytes = 0;  // as asked for: the range the client may use
    Handle context = 0;
    MemoryCharge charge;  // what it takes from the device (Device::occupiedBytes)
  };
  // Another client's allocation this one has opened (openMemory). Its memory is the exporter's.
  struct Import {
    std::uint64_t bytes = 0;
    Handle context = 0;
    IpcToken token{};
    unsigned references = 0;
  };
  // Where an operation goes: a backend stream plus the legacy-stream bookkeeping to apply.
  struct Target {
    Handle context = 0;
    backend::Stream* stream = nullptr;
    Stream* explicitStream = nullptr;  // null for the NULL stream
  };

  Handle newHandle(HandleKind kind);
  // Forgets an allocation and frees its memory, unless other clients still map it (then the
  // shard keeps it for them: IpcExports::keepForImporters).
  std::map<CUdeviceptr, Allocation>::iterator dropAllocation(
      std::map<CUdeviceptr, Allocation>::iterator allocation);
  std::map<Handle, Event>::iterator eraseEvent(std::map<Handle, Event>::iterator event);
  // Unmaps an opened allocation at once (its context is going: no work of it is left), freeing it
  // if it was the last mapping of memory its exporter let go of.
  std::map<CUdeviceptr, Import>::iterator closeImportNow(
      std::map<CUdeviceptr, Import>::iterator import);
  IpcExports::Party ipcParty() const;
  backend::Result<Handle> createContextAs(Handle handle, unsigned flags);
  // One more object of `kind` for the client's tenant, or nullopt (logged) at the tenant's cap.
  std::optional<TenantObjectHold> holdObject(TenantObject kind);
  std::optional<Target> resolveStream(Handle context, Handle stream);
  // Applies the legacy default-stream rules (within this client) before an operation on `target`.
  CUresult orderForLegacyStream(const Target& target);
  // The backend streams of `context` (every context when 0).
  std::vector<backend::Stream*> streamsOf(Handle context);
  kj::Promise<CUresult> drainStreams(Handle context);
  // Inside one allocation, one module variable the client has looked up, or one host range of
  // the client's that is mapped for this GPU (pinned or managed memory).
  bool rangeIsOwned(CUdeviceptr pointer, std::uint64_t bytes) const;
  // Whether a blocking stream of `context` has work the NULL stream has not waited for yet.
  bool blockingWorkUnseen(Handle context) const;
  // The counters of `target`'s queued and known-completed operations.
  std::pair<std::uint64_t*, std::uint64_t*> workCounters(const Target& target);
  Touches& touchesOf(const Target& target);
  CUresult enqueueOn(const Target& target, const backend::MemoryOperation& operation);
  // Counts the operation just queued on `stream` against the client's queued-work bound until a
  // callback queued after it has run.
  CUresult countUntilDone(backend::Stream& stream, std::uint64_t bytes);
  // Notes a kernel just queued on `target`: it may touch any of the client's memory.
  void noteKernelTouches(const Target& target);
  // Keeps a stream's list of touches bounded for a client that never synchronises.
  static void boundTouches(Touches& touches);
  // Forgets what operations up to `done` on `touches`' stream touch: they have completed.
  static void forgetCompleted(Touches& touches, std::uint64_t done);
  // The start of the allocation holding `pointer`, or 0 when it lies in none (a module variable:
  // what touches it counts as touching anything, as a kernel does).
  CUdeviceptr allocationOf(CUdeviceptr pointer) const;
  // Drops a module's variables from moduleVariables_.
  void forgetModuleVariables(const Module& module);
  // Resolves as `status` does, first noting that the operations of stream (`context`, `stream`)
  // up to `queued` have completed, so that a query answered after this promise (the client
  // waited for it) finds the stream idle even while the backend is still running the callback
  // that reported it.
  kj::Promise<CUresult> noteCompletion(Handle context, Handle stream, std::uint64_t queued,
                                       kj::Promise<CUresult> status);
  // Where this client's memory charges on this GPU are recorded (server/gpu/memory_charge.hpp).
  MemoryLedger ledger();
  // Frees device memory of this client's on the device; the caller drops its charge (with the
  // allocation, from allocations_, or the heap).
  void releaseDeviceMemory(CUdeviceptr pointer, const MemoryCharge& charge);
  // Frees every resource of `context` and forgets it. Its work must have drained.
  void destroyContextNow(Handle context);
  // Makes the device heap if `module` needs one and there is none yet; CUDA's error for a module
  // whose heap cannot be had (CUDA_ERROR_SHARED_OBJECT_INIT_FAILED) otherwise.
  CUresult provideDeviceHeap(const backend::Module& module);
  // Takes the heap from the device and frees it. No kernel of this client may be running.
  void releaseDeviceHeap();
  // Lets a poisoned GPU recover (GpuShard::recoverIfIdle) once this client holds nothing a reset
  // would take.
  void recoverIfHoldingNothing();

  GpuShard& shard_;
  std::shared_ptr<ClientStats> stats_;
  // Who this client's streams belong to, for the dispatcher's scheduler.
  scheduler::ClientId schedulingId_;
  std::uint64_t nextSerial_ = 1;
  std::optional<Handle> primaryContext_;
  Handle primaryHandle_ = 0;  // what the primary context is called, alive or not: never changes
  unsigned primaryFlags_ = 0;
  unsigned primaryRefcount_ = 0;
  // Device memory held here, written only by this client's MemoryCharges. Shared with them: a
  // charge held by an allocation or free under way off this thread may outlive the client.
  std::shared_ptr<std::uint64_t> memoryUsed_ = std::make_shared<std::uint64_t>(0);
  std::map<Handle, Context> contexts_;
  std::map<Handle, Stream> streams_;
  std::map<Handle, Event> events_;
  std::map<Handle, Module> modules_;
  std::map<Handle, Function> functions_;
  std::map<CUdeviceptr, Allocation> allocations_;
  std::map<CUdeviceptr, Import> imports_;  // by start
  // Module variables looked up (getGlobal), by address: their sizes. Their memory is the module's.
  std::map<CUdeviceptr, std::uint64_t> moduleVariables_;
  // The device heap of this client's kernels on this GPU, where the backend wants it from the
  // daemon (backend::Module::needsDeviceHeap: the sim). As a GPU allocates a context's heap, it is
  // made when the first module that needs it is loaded, of the size the heap limit says then,
  // and charged like an allocation; it goes with the client's last context.
  struct DeviceHeap {
    CUdeviceptr pointer = 0;
    MemoryCharge charge;
  };
  std::optional<DeviceHeap> deviceHeap_;
  std::uint64_t heapLimit_ = protocol::kDefaultMallocHeapBytes;
  // Whether a stack or printf FIFO limit was changed on the device (to undo with the last context).
  bool deviceLimitsChanged_ = false;
  // Reservations, physical memory and mappings (cuMemMap and its kin).
  ClientVirtualMemory virtualMemory_;
  DeviceOutput deviceOutput_;  // collected, not yet taken
  // Streams held for host functions the client is running, by their tokens
  // (holdStreamForHostFunction), and for other GPUs' events, by the holds this GPU named
  // (holdStreamForAnotherGpu). Dropped, unopened, by abandon(): the work they hold back never
  // runs.
  using Gates = std::map<std::uint64_t, std::shared_ptr<dispatch::ScheduledDevice::HostGate>>;
  Gates hostFunctions_;
  Gates anotherGpusEvents_;
  std::uint64_t lastHold_ = 0;
  // Holds (context, stream) as both kinds of hold do; the gate goes into `gates` under `name`.
  StreamHold holdStream(Handle context, Handle stream, Gates& gates, std::uint64_t name);
  // Opens and forgets the gate of `gates` named `name`; false when there is none.
  bool openGate(Gates& gates, std::uint64_t name);
};

}  // namespace gpuproxy::server
