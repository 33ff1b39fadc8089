#pragma once
// The seam between gpuproxyd and a GPU. Two implementations: `cuda` (the real driver, loaded at
// run time) and `sim` (a simulator for machines without a GPU). Everything the daemon does to a
// GPU goes through these interfaces, so a GPU's whole state can later move into a worker process.
//
// Threading: a Device and every object it created are used by one owner thread at a time, except
// what may take long: Device::prepareModule, which any thread may call at any time, and
// allocate/free, registerHostMemory/unregisterHostMemory, loadPrepared and destroying a Module
// (its unload), which may be done on one other thread besides the owner, concurrently with the
// owner's calls (never with reset()). The owner may
// have reset() run on another thread, making no other call on the device until it has returned.
// Callbacks run on a backend thread, must be quick, and must not call back into the backend.
// Lifetimes: a Device outlives its streams, events and modules; destroying a Stream, Event or
// Module returns at once, and work already queued that uses it still completes (as in CUDA).

#include "scheduler/tenant_class.hpp"
#include "server/backend/stream_operation.hpp"

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpuproxy::server::backend {

// A CUresult and, when it is CUDA_SUCCESS, a value.
template <typename T>
class Result {
public:
  Result(T value) : code_(CUDA_SUCCESS), value_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(CUresult error) : code_(error) {}                            // NOLINT: implicit on purpose

  bool ok() const { return code_ == CUDA_SUCCESS; }
  CUresult code() const { return code_; }
  T& value() & { return value_; }
  const T& value() const& { return value_; }
  T&& value() && { return std::move(value_); }

private:
  CUresult code_;
  T value_{};
};

struct DeviceProperties {
  std::string name;
  std::array<std::uint8_t, 16> uuid{};
  std::uint64_t totalMemory = 0;
  // Every attribute the device answers, as (CUdevice_attribute, value).
  std::vector<std::pair<int, int>> attributes;

  // The value of `attribute`, or 0 when the device does not answer it.
  int attribute(int which) const {
    for (const auto& [key, value] : attributes) {
      if (key == which) return value;
    }
    return 0;
  }
  // Major * 10 + minor (90 for 9.0).
  unsigned computeCapability() const {
    return static_cast<unsigned>(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
                                 attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  }
};

// "9.0" for a compute capability of 90 (major * 10 + minor).
inline std::string computeCapabilityName(unsigned computeCapability) {
  return std::to_string(computeCapability / 10) + "." + std::to_string(computeCapability % 10);
}

// Whose device state something is: the daemon gives each client an address space of its own
// and passes it when it allocates memory, registers host memory, loads a module or creates a
// stream for that client. The `sim` backend enforces it: a kernel launched on a stream may touch
// only the memory of the stream's address space (its allocations, registered host memory and
// modules' variables) and faults on anything else, so one client's kernel can never read or
// write another's memory. The `cuda` backend ignores it: every client's work runs in the one
// CUDA context, and a GPU does not stop a kernel from following any pointer into that context.
using AddressSpace = std::uint64_t;
inline constexpr AddressSpace kDaemonAddressSpace = 0;  // the daemon's own (and tests')

// The class of work a stream carries is its owner's tenant class: the dispatcher chooses the
// stream's priority from it; with an SM partition the `cuda` backend also places the stream in
// the class's green context.
using scheduler::TenantClass;

// cuCtxGetStreamPriorityRange's answer. CUDA's convention: lower numbers are higher priorities, so
// greatest <= least; 0 is the default priority and usually the least.
struct StreamPriorityRange {
  int least = 0;
  int greatest = 0;
};

// How a device's SMs are split between best-effort and latency-critical work (green contexts).
// Unset (enabled false) means no partition: every stream may use every SM.
struct SmPartition {
  bool enabled = false;
  unsigned totalSms = 0;
  unsigned bestEffortSms = 0;       // given to best-effort streams
  unsigned latencyCriticalSms = 0;  // the rest, given to latency-critical streams
};

// What the daemon asks of a device when it opens it.
struct DeviceOptions {
  // Confine best-effort work to an SM partition: at least `bestEffortSms` SMs, or when
  // `bestEffortPercent` is set, that share of the device's SMs (rounded down, then up to the
  // partition granularity the driver requires). Both zero: no partition.
  unsigned bestEffortSms = 0;
  unsigned bestEffortPercent = 0;
  bool wantsSmPartition() const { return bestEffortSms != 0 || bestEffortPercent != 0; }
};

struct MemoryInfo {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
};

struct KernelParameter {
  std::uint32_t offset = 0;
  std::uint32_t size = 0;
};

// What cuFuncGetAttribute reports about a kernel.
struct FunctionInfo {
  std::vector<KernelParameter> parameters;
  std::uint32_t parameterBytes = 0;  // size of the packed parameter buffer
  int maxThreadsPerBlock = 1024;
  int sharedSizeBytes = 0;  // static shared memory
  int numRegs = 0;
  int localSizeBytes = 0;  // per thread
  int constSizeBytes = 0;  // user constant memory
  int ptxVersion = 0;      // major * 10 + minor, as CU_FUNC_ATTRIBUTE_PTX_VERSION
  int binaryVersion = 0;   // as CU_FUNC_ATTRIBUTE_BINARY_VERSION
};

// A module-scope variable (__device__, __constant__): where it lives and how big it is, as
// cuModuleGetGlobal answers.
struct GlobalVariable {
  CUdeviceptr address = 0;
  std::size_t bytes = 0;
  // __managed__: the host reaches it at `address` once Module::placeManagedVariable has put it
  // in memory the host shares; until then it is device memory like any other variable.
  bool managed = false;
};

struct Dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  unsigned sharedMemBytes = 0;
  // cuLaunchCooperativeKernel: every block resident at once (the grid may synchronise); a grid
  // the device cannot hold whole is CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
  bool cooperative = false;
};

// Called once when the work it follows has completed: status is CUDA_SUCCESS or the error that
// work (or an earlier sticky fault) produced.
using CompletionCallback = std::function<void(CUresult status)>;

// Called once when a kernel has finished, with its measured GPU time.
using KernelCallback = std::function<void(CUresult status, std::uint64_t gpuNanoseconds)>;

class Function {
public:
  virtual ~Function() = default;
  virtual const FunctionInfo& info() const = 0;
};

// A module image made ready for one device by Device::prepareModule; only that device's
// loadPrepared reads it.
class PreparedModule {
public:
  virtual ~PreparedModule() = default;
};

class Module {
public:
  virtual ~Module() = default;
  // CUDA_ERROR_NOT_FOUND when the module has no kernel of that name. The Function is owned by the
  // Module.
  virtual Result<Function*> function(std::string_view name) = 0;
  // Device memory the loaded module takes (code, constants, globals): charged to the client's
  // tenant like any allocation.
  virtual std::uint64_t deviceBytes() const = 0;
  // A module-scope variable by name; CUDA_ERROR_NOT_FOUND when the module has none.
  virtual Result<GlobalVariable> global(std::string_view name) = 0;
  // Whether its kernels call malloc or free and the device expects their heap from its owner
  // (Device::attachDeviceHeap: the sim). False where the driver keeps the heap itself (cuda).
  virtual bool needsDeviceHeap() const { return false; }
  // Moves managed variable `name` to `address` (host memory of the module's owner registered
  // with this device, as large as the variable), with the value it has unless `keepValue` (the
  // memory holds it already), so that the host and the module's kernels share it. Only before
  // any kernel of the module has been launched (CUDA_ERROR_NOT_SUPPORTED after);
  // CUDA_ERROR_NOT_FOUND for no such managed variable; CUDA_ERROR_NOT_SUPPORTED where the
  // driver places them itself (cuda). Owner thread.
  virtual CUresult placeManagedVariable(std::string_view /*name*/, CUdeviceptr /*address*/,
                                        bool /*keepValue*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
};

class Event {
public:
  virtual ~Event() = default;
  // CUDA_SUCCESS when the last record has completed (or it was never recorded),
  // CUDA_ERROR_NOT_READY while it is pending, or the context's sticky error.
  virtual CUresult query() = 0;
  // Runs `done` once the most recent record has completed (at once if there is none pending).
  virtual void whenComplete(CompletionCallback done) = 0;
  // Milliseconds from `start` to this event. CUDA_ERROR_NOT_READY if either is pending,
  // CUDA_ERROR_INVALID_HANDLE if either was created with CU_EVENT_DISABLE_TIMING or never recorded.
  virtual Result<float> elapsedSince(Event& start) = 0;
};

class Stream {
public:
  virtual ~Stream() = default;
  // Asynchronous, ordered on this stream: a copy or memset (stream_operation.hpp). Host pointers
  // must stay valid until the work has completed (follow with addCallback to learn when). Errors
  // returned here are launch-time errors (checkOperation's rules first); errors of the work
  // itself arrive through callbacks, query() and the device's sticky error.
  virtual CUresult enqueue(const MemoryOperation& operation) = 0;
  CUresult copyHostToDevice(CUdeviceptr destination, const void* source, std::size_t bytes) {
    return enqueue(CopyHostToDevice{destination, source, bytes});
  }
  CUresult copyDeviceToHost(void* destination, CUdeviceptr source, std::size_t bytes) {
    return enqueue(CopyDeviceToHost{destination, source, bytes});
  }
  CUresult copyDeviceToDevice(CUdeviceptr destination, CUdeviceptr source, std::size_t bytes) {
    return enqueue(CopyDeviceToDevice{destination, source, bytes});
  }
  // elementSize is 1, 2 or 4; value holds the element in its low bytes.
  CUresult memset(CUdeviceptr destination, std::uint32_t value, unsigned elementSize,
                  std::size_t count) {
    return enqueue(Memset{destination, value, elementSize, count});
  }
  // `parameters` is the packed buffer laid out as Function::info() says; it is copied.
  // `done` may be empty.
  virtual CUresult launch(Function& function, const LaunchConfig& config,
                          std::span<const std::byte> parameters, KernelCallback done) = 0;
  virtual CUresult record(Event& event) = 0;
  // Later work on this stream waits for the event's most recent record (none: no wait).
  virtual CUresult wait(Event& event) = 0;
  // Runs `done` after all work queued so far on this stream has completed.
  virtual CUresult addCallback(CompletionCallback done) = 0;
  // CUDA_SUCCESS when idle, CUDA_ERROR_NOT_READY while work is pending, or the sticky error.
  virtual CUresult query() = 0;
  // The priority the stream runs at on the device (its creation priority, clamped to the
  // device's range as CUDA clamps it).
  virtual int priority() const = 0;
};

class Device {
public:
  virtual ~Device() = default;
  virtual const DeviceProperties& properties() const = 0;

  // Memory that kernels of `owner` may use.
  virtual Result<CUdeviceptr> allocate(std::size_t bytes, AddressSpace owner) = 0;
  Result<CUdeviceptr> allocate(std::size_t bytes) { return allocate(bytes, kDaemonAddressSpace); }
  virtual CUresult free(CUdeviceptr pointer) = 0;
  // Lets kernels of `with` use allocation `base` too (an interprocess mapping, cuIpcOpenMemHandle),
  // until unshareAllocation or the allocation is freed. `cuda`: every allocation is already
  // reachable from the one context, so nothing to do. Owner thread.
  virtual CUresult shareAllocation(CUdeviceptr /*base*/, AddressSpace /*with*/) {
    return CUDA_SUCCESS;
  }
  virtual void unshareAllocation(CUdeviceptr /*base*/, AddressSpace /*with*/) {}
  virtual MemoryInfo memoryInfo() = 0;
  // Virtual memory management, as the driver's cuMemAddressReserve, cuMemCreate, cuMemMap and
  // cuMemSetAccess do it: a range of device addresses with nothing behind it, physical memory with
  // no address (named by a handle), and mappings of the one into the other, reachable by `owner`'s
  // kernels and copies once its access is set. The caller keeps the rules (sizes, addresses and
  // offsets multiples of protocol::kVirtualMemoryGranularity, a mapping inside one reservation and
  // over nothing mapped, physical memory released only once unmapped, a reservation freed only
  // once empty, unmapMemory and setMemoryAccess naming one whole mapping each); a backend refuses
  // what breaks them with CUDA_ERROR_INVALID_VALUE all the same.
  // createPhysicalMemory and releasePhysicalMemory are thread-safe as allocate and free are; the
  // rest are the owner thread's. CUDA_ERROR_NOT_SUPPORTED where the backend has none of it.
  virtual Result<CUdeviceptr> reserveAddresses(std::uint64_t /*bytes*/,
                                               std::uint64_t /*alignment*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult freeAddresses(CUdeviceptr /*start*/, std::uint64_t /*bytes*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual Result<std::uint64_t> createPhysicalMemory(std::uint64_t /*bytes*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult releasePhysicalMemory(std::uint64_t /*handle*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult mapMemory(CUdeviceptr /*address*/, std::uint64_t /*bytes*/,
                             std::uint64_t /*handle*/, std::uint64_t /*offset*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult unmapMemory(CUdeviceptr /*address*/, std::uint64_t /*bytes*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // `writable`: read and write access for `owner`; otherwise none.
  virtual CUresult setMemoryAccess(CUdeviceptr /*address*/, std::uint64_t /*bytes*/,
                                   AddressSpace /*owner*/, bool /*writable*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }

  // What an allocation of `bytes` takes from the device once its allocator has rounded it: what
  // the daemon charges the owner's tenant. `sim`: whole 256-byte granules of its arena. `cuda`: the
  // driver's granularity, 512 bytes for allocations under 2 MiB (which it packs into shared 2 MiB
  // pages) and whole 2 MiB pages from 2 MiB up.
  virtual std::uint64_t occupiedBytes(std::size_t bytes) const = 0;

  // Host memory that this device's kernels and copies may use directly (pinned, device-mapped):
  // `cuda` registers it with the driver (cuMemHostRegister, DEVICEMAP | PORTABLE), `sim` lets its
  // kernels read and write it. Its device address is its host address (unified addressing). The
  // memory must stay mapped until unregisterHostMemory, which the caller calls only once the work
  // that may use it has completed. A registration survives reset(): it is the process's, not the
  // context's. CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED for a range that
  // overlaps one registered before; CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED for an unknown start.
  virtual CUresult registerHostMemory(void* host, std::size_t bytes, AddressSpace owner) = 0;
  CUresult registerHostMemory(void* host, std::size_t bytes) {
    return registerHostMemory(host, bytes, kDaemonAddressSpace);
  }
  virtual CUresult unregisterHostMemory(void* host) = 0;

  // A module image as cuModuleLoadData takes it (PTX text; cubin and fatbin on `cuda`) loads in
  // two steps:
  // - prepareModule does what may take long and touches no device state: choosing a fatbin's
  //   entry, decompressing it, parsing PTX, the JIT (seconds for a large PTX module on `cuda`).
  //   It may be called from any thread, concurrently with any other call on this device.
  // - loadPrepared places the module in the device's memory (a large cubin takes a while), on
  //   the owner thread or the one other thread the contract above names. Its variables are
  //   `owner`'s memory.
  // Errors are cuModuleLoadData's, from whichever step finds them.
  virtual Result<std::unique_ptr<PreparedModule>> prepareModule(
      std::span<const std::byte> image) const = 0;
  virtual Result<std::unique_ptr<Module>> loadPrepared(std::unique_ptr<PreparedModule> prepared,
                                                       AddressSpace owner) = 0;
  // Both steps on the calling thread.
  Result<std::unique_ptr<Module>> loadModule(std::span<const std::byte> image,
                                             AddressSpace owner = kDaemonAddressSpace) {
    auto prepared = prepareModule(image);
    if (!prepared.ok()) return prepared.code();
    return loadPrepared(std::move(prepared).value(), owner);
  }
  // A stream for `workClass` at `priority` (clamped to streamPriorityRange()), whose kernels run
  // in `owner`'s address space. With an SM partition the stream may only use its class's SMs.
  // createStream(flags, priority) is the daemon's own work, placed as best-effort.
  virtual Result<std::unique_ptr<Stream>> createStream(unsigned flags, int priority) = 0;
  virtual Result<std::unique_ptr<Stream>> createStreamFor(TenantClass workClass, unsigned flags,
                                                          int priority, AddressSpace owner) = 0;
  Result<std::unique_ptr<Stream>> createStreamFor(TenantClass workClass, unsigned flags,
                                                  int priority) {
    return createStreamFor(workClass, flags, priority, kDaemonAddressSpace);
  }
  virtual StreamPriorityRange streamPriorityRange() const = 0;
  // The SM partition this device was opened with (DeviceOptions), as the driver made it.
  virtual SmPartition smPartition() const { return {}; }
  virtual Result<std::unique_ptr<Event>> createEvent(unsigned flags) = 0;

  // CUDA_SUCCESS, or the sticky error (CUDA_ERROR_ILLEGAL_ADDRESS, ...) that poisoned this
  // device's context. Once poisoned, work fails with this error until reset().
  virtual CUresult stickyError() = 0;
  // What the backend knows of the fault behind the sticky error, for the log (the kernel, the
  // address, the thread); empty when it knows nothing more.
  virtual std::string stickyErrorDetail() { return {}; }
  // The client owning `owner` is gone: its work the device has not started is dropped (callbacks
  // run with CUDA_ERROR_CONTEXT_IS_DESTROYED) and a kernel of its that is running stops, where
  // the backend can. The `sim` backend can, so a kernel that never ends does not keep a dead
  // client's memory (or the engine) forever; a GPU cannot stop one kernel without resetting the
  // context for everyone, so the `cuda` backend does nothing and the work runs to its end.
  virtual void abandonWorkOf(AddressSpace /*owner*/) {}
  // Device printf output of `owner`'s kernels that have completed since the last call; what a
  // GPU prints on the application's stdout at its next synchronisation. Empty where the backend
  // does not collect it (the `cuda` backend: the driver prints in the daemon).
  virtual std::string takeDeviceOutput(AddressSpace /*owner*/) { return {}; }
  // cuCtxSetLimit for `owner`'s kernels: CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE or
  // CU_LIMIT_MALLOC_HEAP_SIZE. Returns what was granted (the backend may round or clamp, as the
  // driver does), or the driver's error; CUDA_ERROR_UNSUPPORTED_LIMIT for any other limit. One
  // context serves every owner on `cuda`, so there a limit only ever grows: the largest any owner
  // asked for. Owner thread.
  virtual Result<std::uint64_t> setLimit(AddressSpace owner, CUlimit limit,
                                         std::uint64_t value) = 0;
  // The device heap (`bytes` at `base`, device memory of `owner`'s) that `owner`'s kernels
  // allocate from with malloc, where modules ask for one (Module::needsDeviceHeap); bytes 0 takes
  // it away again (the caller frees the memory afterwards, once no kernel of `owner` runs). Owner
  // thread.
  virtual void attachDeviceHeap(AddressSpace /*owner*/, CUdeviceptr /*base*/,
                                std::uint64_t /*bytes*/) {}
  // Recreates the device's context after a sticky fault. Every allocation, module, stream and event
  // made before is invalid afterwards; the caller must have dropped them. Registered host memory
  // and the SM partition are kept.
  virtual CUresult reset() = 0;
};

class Backend {
public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;  // "cuda" or "sim"
  virtual int driverVersion() const = 0;      // as cuDriverGetVersion reports it
  virtual int deviceCount() const = 0;
  // CUDA_ERROR_NOT_SUPPORTED when `options` asks for what this backend or driver cannot do (an SM
  // partition on `sim`, or on a driver without green contexts); the log says why.
  virtual Result<std::unique_ptr<Device>> openDevice(int index, const DeviceOptions& options) = 0;
  Result<std::unique_ptr<Device>> openDevice(int index) { return openDevice(index, {}); }
};

}  // namespace gpuproxy::server::backend
