#include "server/backend/sim/sim_backend.hpp"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "protocol/cuda_result.hpp"
#include "protocol/limits.hpp"
#include "protocol/module_image.hpp"
#include "server/backend/fatbin/fatbin_reader.hpp"
#include "server/backend/ptx/ptx_frontend.hpp"
#include "server/backend/ptx/ptx_interpreter.hpp"
#include "server/backend/ptx/ptx_parser.hpp"
#include "server/backend/ptx/relaxed_memory.hpp"
#include "server/backend/sim/device_arena.hpp"
#include "server/backend/sim/device_attributes.hpp"

namespace gpuproxy::server::sim {
namespace {

using backend::CompletionCallback;
using backend::Device;
using backend::DeviceProperties;
using backend::Event;
using backend::Function;
using backend::FunctionInfo;
using backend::KernelCallback;
using backend::LaunchConfig;
using backend::MemoryInfo;
using backend::Module;
using backend::PreparedModule;
using backend::Result;
using backend::Stream;
using Clock = std::chrono::steady_clock;

constexpr int kMaxDevices = 256;
// Launch limits; the same numbers the attribute table reports.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimX = 1024;
constexpr unsigned kMaxBlockDimY = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = 2147483647;
constexpr unsigned kMaxGridDimY = 65535;
constexpr unsigned kMaxGridDimZ = 65535;
// The opt-in limit (MAX_SHARED_MEMORY_PER_BLOCK_OPTIN): the stub holds each kernel to its own
// limit, the default 48 KiB unless cuFuncSetAttribute raised it.
constexpr unsigned kMaxSharedBytesPerBlock = 227 * 1024;
constexpr int kMaxRegistersPerThread = 255;

// The registers a kernel reports (CU_FUNC_ATTRIBUTE_NUM_REGS), which the launch check and the
// occupancy calculator use. The sim has no registers of its own, and PTX declares virtual ones,
// far more than ptxas allocates (a kernel ptxas gives 26 may declare hundreds). So: as many as
// the PTX declares, but never more than ptxas may use where it must make the kernel fit: its
// launch bounds (.maxntid, .minnctapersm: those blocks fit in an SM's 64K registers), .maxnreg,
// and without bounds 64, which lets a 1024-thread block launch, as it does on a GPU for all but
// the heaviest kernels. No launch a GPU would take is refused for registers.
int modelledRegisters(const ptx::Function& kernel) {
  const std::uint32_t threads = kernel.maxThreads != 0 ? kernel.maxThreads : 1024;
  const std::uint32_t warpThreads = (threads + 31) / 32 * 32;
  const std::uint32_t blocks = std::max<std::uint32_t>(kernel.minBlocksPerSm, 1);
  // Registers are allocated per thread in steps of 8.
  std::uint32_t cap = kSimRegistersPerSm / warpThreads / blocks / 8 * 8;
  cap = std::min<std::uint32_t>(std::max<std::uint32_t>(cap, 8), kMaxRegistersPerThread);
  if (kernel.maxRegisters != 0)
    cap = std::min(cap, std::max<std::uint32_t>(kernel.maxRegisters, 8));
  return static_cast<int>(std::clamp<std::uint32_t>(kernel.registerRows, 1, cap));
}
// cuCtxGetStreamPriorityRange on current NVIDIA GPUs: six levels, 0 (default, least) to -5.
constexpr int kSimLeastPriority = 0;
constexpr int kSimGreatestPriority = -5;

// One record of an event on a stream. Guarded by DeviceCore::mutex_.
struct StreamQueue;

struct RecordState {
  bool completed = false;
  CUresult status = CUDA_SUCCESS;
  Clock::time_point time;
  std::vector<CompletionCallback> waiters;
  std::vector<StreamQueue*> blockedQueues;  // streams whose next op waits for this record
};

// Guarded by DeviceCore::mutex_ (except the constant flags).
struct EventState {
  explicit EventState(unsigned eventFlags) : flags(eventFlags) {}
  const unsigned flags;
  std::shared_ptr<RecordState> latest;  // the most recent record; null until the first
};

class DeviceCore;

// A module decoded and ready to be placed in a device's memory.
struct SimPreparedModule final : PreparedModule {
  std::shared_ptr<const ptx::Program> program;
  std::size_t imageBytes = 0;  // the PTX text's size: what the module's code takes on the device
  // A fatbin's newer PTX run in place of its machine code for this device: what a GPU reports as
  // the kernels' PTX and binary versions (it runs the machine code), 0 otherwise.
  unsigned standsInForMachineCode = 0;
};

// The PTX text chosen from a fatbin, and whether it stands in for machine code (see above).
struct SelectedPtx {
  std::string text;
  unsigned standsInForMachineCode = 0;
};

// A loaded module: its decoded program, placed in device memory (its variables in one
// allocation of the owner's), shared by its functions and by launches still queued when the
// Module is destroyed.
struct ModuleImage {
  ModuleImage() = default;
  ModuleImage(const ModuleImage&) = delete;
  ModuleImage& operator=(const ModuleImage&) = delete;
  ~ModuleImage();

  std::shared_ptr<const ptx::Program> program;
  // Replaced only while no kernel of the module has been launched (SimModule::
  // placeManagedVariable), which is why nothing else needs to hold it.
  std::unique_ptr<ptx::Executable> executable;
  // Set on the owner thread when a kernel of the module is first queued.
  mutable std::atomic<bool> launched{false};
  std::shared_ptr<DeviceCore> core;
  CUdeviceptr variables = 0;          // the allocation holding them (0: none)
  std::uint64_t arenaGeneration = 0;  // a reset since frees it with everything else
  backend::AddressSpace owner = backend::kDaemonAddressSpace;
};

struct FunctionData {
  std::string name;
  std::shared_ptr<const ModuleImage> module;
  std::uint32_t kernel = 0;  // function index in module->program
  FunctionInfo info;
};

struct LaunchOp {
  // Shared with the Function: a queued launch must survive the Module being destroyed.
  std::shared_ptr<const FunctionData> function;
  LaunchConfig config;
  std::vector<std::byte> parameters;
  KernelCallback done;
  backend::AddressSpace owner = backend::kDaemonAddressSpace;  // the stream's
};
struct RecordOp {
  std::shared_ptr<RecordState> record;
};
struct WaitOp {
  std::shared_ptr<RecordState> record;
};
struct CallbackOp {
  CompletionCallback done;
};
using OpBody = std::variant<backend::MemoryOperation, LaunchOp, RecordOp, WaitOp, CallbackOp>;

struct Op {
  std::uint64_t sequence = 0;  // global enqueue order across all streams of the device
  OpBody body;
};

// A stream's FIFO. Guarded by DeviceCore::mutex_.
// The engine keeps only the streams that have work where it looks for the next op: runnable
// heads in DeviceCore::ready_, heads waiting for an event's record with that record. An idle
// stream costs nothing per op, however many there are.
struct StreamQueue {
  std::deque<Op> ops;
  bool released = false;  // the Stream object is gone; drop the queue once it drains
  bool ready = false;     // its head is in DeviceCore::ready_
  bool running = false;   // its head has been taken and runs now
  int priority = 0;       // the stream's priority: lower is more urgent
  std::shared_ptr<RecordState> blockedOn;  // its head waits for this record to complete
  backend::AddressSpace owner = backend::kDaemonAddressSpace;
  std::list<std::shared_ptr<StreamQueue>>::iterator self;  // its entry in DeviceCore::queues_
};

// An op the engine runs now. Its stop flag tells its kernel to stop (a reset or shutdown, or its
// client is gone) without the engine lock.
struct Running {
  Running(StreamQueue* queue, bool besideKernel) : queue(queue), besideKernel(besideKernel) {}
  StreamQueue* queue;
  // Run between the blocks of a kernel, which other threads may still be running.
  const bool besideKernel;
  std::atomic<bool> stop{false};
};

struct Outcome {
  CUresult status = CUDA_SUCCESS;
  std::uint64_t nanoseconds = 0;
  Clock::time_point time;
  std::string detail;  // a kernel fault: what, where, whose
};

// How a memory operation moves bytes: plainly while it is the only op running on the device, and
// with relaxed atomic accesses (ptx/relaxed_memory.hpp) when it runs beside a kernel, whose
// threads may be reading or writing the same device or mapped host memory meanwhile.
struct ByteMoves {
  // memmove's semantics: the ranges may overlap.
  void (*copy)(std::byte* destination, const std::byte* source, std::size_t bytes);
  // `count` elements of `elementSize` bytes (1, 2 or 4), each the low bytes of `value`,
  // little-endian as the GPU stores them.
  void (*fill)(std::byte* destination, std::uint32_t value, unsigned elementSize,
               std::size_t count);
};

void copyPlainly(std::byte* destination, const std::byte* source, std::size_t bytes) {
  std::memmove(destination, source, bytes);
}

void fillPlainly(std::byte* destination, std::uint32_t value, unsigned elementSize,
                 std::size_t count) {
  if (elementSize == 1) {
    std::memset(destination, static_cast<int>(value & 0xff), count);
    return;
  }
  std::byte pattern[4];
  std::memcpy(pattern, &value, sizeof(pattern));
  for (std::size_t i = 0; i < count; ++i) {
    std::memcpy(destination + i * elementSize, pattern, elementSize);
  }
}

constexpr ByteMoves kPlainMoves{copyPlainly, fillPlainly};
constexpr ByteMoves kRelaxedMoves{ptx::copyRelaxed, ptx::fillRelaxed};

std::string describe(CUresult status) {
  const char* name = nullptr;
  // cuGetErrorName lives in the driver, which the sim never loads: spell out the common ones.
  switch (status) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      name = "CUDA_ERROR_ILLEGAL_ADDRESS";
      break;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      name = "CUDA_ERROR_CONTEXT_IS_DESTROYED";
      break;
    case CUDA_ERROR_MISALIGNED_ADDRESS:
      name = "CUDA_ERROR_MISALIGNED_ADDRESS";
      break;
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
      name = "CUDA_ERROR_ILLEGAL_INSTRUCTION";
      break;
    case CUDA_ERROR_LAUNCH_FAILED:
      name = "CUDA_ERROR_LAUNCH_FAILED";
      break;
    case CUDA_ERROR_ASSERT:
      name = "CUDA_ERROR_ASSERT";
      break;
    default:
      break;
  }
  return name != nullptr ? std::string(name) : "CUresult " + std::to_string(status);
}

// The engine and all state it shares with the owner thread. Streams and events hold it by
// shared_ptr so that their queued work still completes after they are destroyed, and so that an
// object outliving its Device (a caller bug) finds a stopped engine rather than freed memory.
class DeviceCore final {
public:
  DeviceCore(int index, std::unique_ptr<DeviceArena> arena,
             std::shared_ptr<ptx::Interpreter> interpreter)
      : index_(index), arena_(std::move(arena)), interpreter_(std::move(interpreter)) {
    engine_ = std::thread([this] { engineMain(); });
  }
  ~DeviceCore() { shutdown(); }
  DeviceCore(const DeviceCore&) = delete;
  DeviceCore& operator=(const DeviceCore&) = delete;

  int index() const { return index_; }
  DeviceArena& arena() { return *arena_; }

  // Abandons queued work (its callbacks run with an error on the engine thread), stops the engine.
  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      abandonLocked();
    }
    workCv_.notify_all();
    if (engine_.joinable()) engine_.join();
  }

  // CUDA_SUCCESS when new work may be submitted, else the reason it may not.
  CUresult usable() {
    std::lock_guard lock(mutex_);
    return usableLocked();
  }

  CUresult sticky() {
    std::lock_guard lock(mutex_);
    return sticky_;
  }

  std::string stickyDetail() {
    std::lock_guard lock(mutex_);
    return sticky_ != CUDA_SUCCESS ? stickyDetail_ : std::string();
  }

  // Printf output of `owner`'s completed kernels since the last call.
  std::string takeOutput(backend::AddressSpace owner) {
    std::unique_ptr<ptx::PrintfBuffer> buffer;
    {
      std::lock_guard lock(outputMutex_);
      const auto found = outputs_.find(owner);
      if (found == outputs_.end()) return {};
      buffer = std::move(found->second);
      outputs_.erase(found);
    }
    if (const std::uint64_t lost = buffer->takeLostBytes(); lost > 0) {
      spdlog::warn(
          "sim device {}: {} bytes of device printf output of address space {} were dropped: "
          "its kernels printed more than the {} bytes of its printf buffer "
          "(CU_LIMIT_PRINTF_FIFO_SIZE) between synchronisations",
          index_, lost, owner, buffer->capacity());
    }
    return buffer->take();
  }

  // cuCtxSetLimit's printf FIFO size for `owner` (how much of its output is kept between two of
  // its synchronisations) and stack size (what its recursing kernels' threads get at least).
  void setPrintfFifoBytes(backend::AddressSpace owner, std::uint64_t bytes) {
    std::lock_guard lock(settingsMutex_);
    settings_[owner].printfFifoBytes = bytes;
    forgetIfDefault(owner);
  }
  void setStackBytes(backend::AddressSpace owner, std::uint32_t bytes) {
    std::lock_guard lock(settingsMutex_);
    settings_[owner].stackBytes = bytes;
    forgetIfDefault(owner);
  }
  // The device heap `owner`'s kernels allocate from (none: malloc returns NULL), bookkept here
  // over memory the owner's client allocated; a kernel running meanwhile keeps the one it had.
  void attachHeap(backend::AddressSpace owner, CUdeviceptr base, std::uint64_t bytes) {
    std::lock_guard lock(settingsMutex_);
    settings_[owner].heap = bytes == 0 ? nullptr : std::make_shared<ptx::DeviceHeap>(base, bytes);
    forgetIfDefault(owner);
  }

  std::shared_ptr<StreamQueue> addQueue(backend::AddressSpace owner, int priority) {
    auto queue = std::make_shared<StreamQueue>();
    queue->owner = owner;
    queue->priority = priority;
    std::lock_guard lock(mutex_);
    queue->self = queues_.insert(queues_.end(), queue);
    ++queuesPerOwner_[owner];
    return queue;
  }

  // Backend::abandonWorkOf: the owner's queued ops are skipped when the engine reaches them and
  // its running kernel, if any, stops at its next backward branch.
  void abandonOwner(backend::AddressSpace owner) {
    std::lock_guard lock(mutex_);
    if (queuesPerOwner_.count(owner) == 0) return;
    abandonedOwners_.insert(owner);
    for (Running* running : running_) {
      if (running->queue->owner == owner) running->stop.store(true);
    }
    workCv_.notify_one();
  }

  void releaseQueue(const std::shared_ptr<StreamQueue>& queue) {
    std::lock_guard lock(mutex_);
    queue->released = true;
    dropIfDoneLocked(*queue);
  }

  CUresult enqueue(StreamQueue& queue, OpBody body) {
    {
      std::lock_guard lock(mutex_);
      if (const CUresult status = usableLocked(); status != CUDA_SUCCESS) return status;
      pushLocked(queue, std::move(body));
    }
    workCv_.notify_one();
    return CUDA_SUCCESS;
  }

  CUresult enqueueRecord(StreamQueue& queue, EventState& event) {
    {
      std::lock_guard lock(mutex_);
      if (const CUresult status = usableLocked(); status != CUDA_SUCCESS) return status;
      auto record = std::make_shared<RecordState>();
      event.latest = record;
      pushLocked(queue, RecordOp{std::move(record)});
    }
    workCv_.notify_one();
    return CUDA_SUCCESS;
  }

  CUresult enqueueWait(StreamQueue& queue, const EventState& event) {
    {
      std::lock_guard lock(mutex_);
      if (const CUresult status = usableLocked(); status != CUDA_SUCCESS) return status;
      // Only the record that exists now matters; later records of the event do not delay this
      // stream. No record, or a completed one: nothing to wait for.
      if (!event.latest || event.latest->completed) return CUDA_SUCCESS;
      pushLocked(queue, WaitOp{event.latest});
    }
    workCv_.notify_one();
    return CUDA_SUCCESS;
  }

  CUresult queryQueue(const StreamQueue& queue) {
    std::lock_guard lock(mutex_);
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    return queue.ops.empty() && !queue.running ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  }

  CUresult queryEvent(const EventState& event) {
    std::lock_guard lock(mutex_);
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    return event.latest && !event.latest->completed ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  }

  void whenComplete(const EventState& event, CompletionCallback done) {
    CUresult status = CUDA_SUCCESS;
    {
      std::lock_guard lock(mutex_);
      if (event.latest && !event.latest->completed) {
        event.latest->waiters.push_back(std::move(done));
        return;
      }
      status = sticky_ != CUDA_SUCCESS ? sticky_ : event.latest ? event.latest->status : status;
    }
    if (done) done(status);
  }

  Result<float> elapsed(const EventState& start, const EventState& end) {
    std::lock_guard lock(mutex_);
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    if (((start.flags | end.flags) & CU_EVENT_DISABLE_TIMING) != 0) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (!start.latest || !end.latest) return CUDA_ERROR_INVALID_HANDLE;
    if (!start.latest->completed || !end.latest->completed) return CUDA_ERROR_NOT_READY;
    if (start.latest->status != CUDA_SUCCESS) return start.latest->status;
    if (end.latest->status != CUDA_SUCCESS) return end.latest->status;
    return std::chrono::duration<float, std::milli>(end.latest->time - start.latest->time).count();
  }

  // Drops all queued work (callbacks run with an error), waits for the running op, clears the
  // sticky error and frees all device memory.
  CUresult reset() {
    std::unique_lock lock(mutex_);
    if (stopping_) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    abandonLocked();
    workCv_.notify_all();
    idleCv_.wait(lock, [&] { return idleLocked(); });
    stop_.store(false);
    if (sticky_ != CUDA_SUCCESS) {
      spdlog::info("sim device {}: reset clears sticky {}", index_, describe(sticky_));
    }
    sticky_ = CUDA_SUCCESS;
    stickyDetail_.clear();
    memoryMaps_.clear();
    arena_->releaseAll();
    {
      std::lock_guard outputLock(outputMutex_);
      outputs_.clear();
    }
    {
      // The heaps' memory went with the arena (their clients had let go of them already).
      std::lock_guard settingsLock(settingsMutex_);
      for (auto& [owner, settings] : settings_) settings.heap.reset();
      std::erase_if(settings_, [](const auto& entry) { return entry.second.isDefault(); });
    }
    return CUDA_SUCCESS;
  }

private:
  CUresult usableLocked() const {
    if (stopping_) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return sticky_;
  }

  // Everything queued so far is dropped rather than run; a running kernel is stopped at its
  // next backward branch, nanosleep or block.
  void abandonLocked() {
    abandonBefore_ = nextSequence_;
    abandonStatus_ = sticky_ != CUDA_SUCCESS ? sticky_ : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    stop_.store(true);
    for (Running* running : running_) running->stop.store(true);
    // Waits that were queued are dropped like the rest: their streams are runnable again.
    std::vector<StreamQueue*> blocked(blocked_.begin(), blocked_.end());
    for (StreamQueue* queue : blocked) {
      std::erase(queue->blockedOn->blockedQueues, queue);
      queue->blockedOn.reset();
      blocked_.erase(queue);
      scheduleHeadLocked(*queue);
    }
  }

  bool idleLocked() const { return running_.empty() && queuedOps_ == 0; }

  void pushLocked(StreamQueue& queue, OpBody body) {
    queue.ops.push_back(Op{nextSequence_++, std::move(body)});
    ++queuedOps_;
    if (queue.ops.size() == 1) scheduleHeadLocked(queue);
  }

  // Puts the queue's head where the engine will find it: among the runnable heads, or with the
  // record it waits for. A queue whose op is running is scheduled once it has finished.
  void scheduleHeadLocked(StreamQueue& queue) {
    if (queue.ops.empty() || queue.ready || queue.blockedOn || queue.running) return;
    const Op& head = queue.ops.front();
    if (head.sequence >= abandonBefore_) {
      const auto* wait = std::get_if<WaitOp>(&head.body);
      if (wait != nullptr && !wait->record->completed) {
        queue.blockedOn = wait->record;
        wait->record->blockedQueues.push_back(&queue);
        blocked_.insert(&queue);
        return;
      }
    }
    queue.ready = true;
    ready_.emplace(head.sequence, &queue);
    readyPriorities_.insert(queue.priority);
    if (!isKernel(head)) readyBesideKernels_.fetch_add(1, std::memory_order_relaxed);
    noteReadyChangedLocked();
  }

  void noteReadyChangedLocked() {
    mostUrgentReady_.store(
        readyPriorities_.empty() ? std::numeric_limits<int>::max() : *readyPriorities_.begin(),
        std::memory_order_relaxed);
  }

  static bool isKernel(const Op& op) { return std::holds_alternative<LaunchOp>(op.body); }

  // Takes `chosen` out of the runnable heads.
  std::shared_ptr<StreamQueue> takeReadyLocked(
      std::set<std::pair<std::uint64_t, StreamQueue*>>::iterator chosen) {
    StreamQueue* queue = chosen->second;
    ready_.erase(chosen);
    readyPriorities_.erase(readyPriorities_.find(queue->priority));
    if (!isKernel(queue->ops.front())) readyBesideKernels_.fetch_sub(1, std::memory_order_relaxed);
    noteReadyChangedLocked();
    queue->ready = false;
    return *queue->self;
  }

  // A record completed: the streams waiting for it may go on.
  void recordCompletedLocked(RecordState& record) {
    const std::vector<StreamQueue*> waiting = std::move(record.blockedQueues);
    record.blockedQueues.clear();
    for (StreamQueue* queue : waiting) {
      queue->blockedOn.reset();
      blocked_.erase(queue);
      scheduleHeadLocked(*queue);
    }
  }

  // A released stream is forgotten once its last op has run.
  void dropIfDoneLocked(StreamQueue& queue) {
    if (!queue.released || !queue.ops.empty() || queue.running) return;
    const backend::AddressSpace owner = queue.owner;
    queues_.erase(queue.self);  // destroys `queue`
    if (--queuesPerOwner_[owner] == 0) {
      queuesPerOwner_.erase(owner);
      abandonedOwners_.erase(owner);
    }
  }

  // The runnable stream head submitted first, but for kernels of streams less urgent than the
  // most urgent runnable one, which wait: a GPU runs a higher-priority stream's blocks first.
  // Copies, memsets, records and callbacks go in submission order whatever their stream's
  // priority, as a GPU's copy engines run copies beside kernels: a more urgent kernel never
  // overtakes the copy of its input that a less urgent stream (the NULL stream of a pageable
  // cudaMemcpy, which returns before the copy is done) was given first. A stream blocked on an
  // event does not hold up the others.
  std::shared_ptr<StreamQueue> pickLocked() {
    if (ready_.empty()) return nullptr;
    const int mostUrgent = *readyPriorities_.begin();
    auto chosen = ready_.begin();
    while (chosen->second->priority != mostUrgent && isKernel(chosen->second->ops.front())) {
      ++chosen;  // the most urgent head is further on: the loop ends there at the latest
    }
    return takeReadyLocked(chosen);
  }

  // The runnable head submitted first that is not a kernel (a copy, memset, event record or wait,
  // callback), whatever its stream's priority; null when there is none.
  std::shared_ptr<StreamQueue> pickBesideKernelsLocked() {
    if (readyBesideKernels_.load(std::memory_order_relaxed) == 0) return nullptr;
    auto chosen = ready_.begin();
    while (isKernel(chosen->second->ops.front())) ++chosen;  // one is further on
    return takeReadyLocked(chosen);
  }

  void engineMain() {
    std::unique_lock lock(mutex_);
    for (;;) {
      std::shared_ptr<StreamQueue> queue = pickLocked();
      if (!queue) {
        if (stopping_ && idleLocked()) return;
        workCv_.wait(lock);
        continue;
      }
      runHeadLocked(lock, queue, /*besideKernel=*/false);
    }
  }

  // Between two blocks of a kernel (on the engine thread, which runs blocks too), what a GPU runs
  // beside that kernel:
  // - while a stream more urgent than the kernel's has work ready, what pickLocked picks (that
  //   work, and the copies and records submitted before it), as a GPU gives the SMs that free up
  //   to a higher-priority stream's blocks before the running kernel's next ones;
  // - then the other streams' work that is not a kernel, in submission order, as a GPU's copy
  //   engines copy while its SMs compute: a copy, or the synchronisation of a stream that has
  //   only copies left, does not wait for another stream's long kernel (runBesideKernels).
  // A kernel run here may let still more urgent work, and copies, run between its own blocks.
  void runBetweenBlocks(int priority) {
    std::unique_lock lock(mutex_);
    while (!readyPriorities_.empty() && *readyPriorities_.begin() < priority) {
      runHeadLocked(lock, pickLocked(), /*besideKernel=*/true);
    }
    runBesideKernelsLocked(lock);
  }

  // Between two turns of a block's warps, and after the more urgent work between two blocks: the
  // other streams' ready work that is not a kernel. As many ops as were ready on arrival, so that
  // a stream of copies interleaves with the kernel instead of holding the engine thread for as
  // long as copies keep coming.
  void runBesideKernels() {
    std::unique_lock lock(mutex_);
    runBesideKernelsLocked(lock);
  }

  void runBesideKernelsLocked(std::unique_lock<std::mutex>& lock) {
    for (std::size_t beside = readyBesideKernels_.load(std::memory_order_relaxed); beside > 0;
         --beside) {
      std::shared_ptr<StreamQueue> queue = pickBesideKernelsLocked();
      if (!queue) return;
      runHeadLocked(lock, queue, /*besideKernel=*/true);
    }
  }

  // Runs the head of `queue` (just picked) and its completion; the lock is let go meanwhile.
  void runHeadLocked(std::unique_lock<std::mutex>& lock, const std::shared_ptr<StreamQueue>& queue,
                     bool besideKernel) {
    Op op = std::move(queue->ops.front());
    queue->ops.pop_front();
    --queuedOps_;
    queue->running = true;
    Running running{queue.get(), besideKernel};
    running_.push_back(&running);
    CUresult skipWith = op.sequence < abandonBefore_ ? abandonStatus_ : sticky_;
    if (skipWith == CUDA_SUCCESS && abandonedOwners_.count(queue->owner) != 0) {
      skipWith = CUDA_ERROR_CONTEXT_IS_DESTROYED;  // its client is gone
    }
    running.stop.store(stop_.load());
    lock.unlock();

    const Outcome outcome = run(op, skipWith, running);
    std::vector<CompletionCallback> waiters;

    lock.lock();
    if (auto* record = std::get_if<RecordOp>(&op.body)) {
      record->record->completed = true;
      record->record->status = outcome.status;
      record->record->time = outcome.time;
      waiters = std::move(record->record->waiters);
      recordCompletedLocked(*record->record);
    }
    if (protocol::isStickyError(outcome.status) && sticky_ == CUDA_SUCCESS &&
        skipWith == CUDA_SUCCESS) {
      sticky_ = outcome.status;
      stickyDetail_ = outcome.detail;
      spdlog::error("sim device {}: {} faulted with {}{}; the device is poisoned until reset",
                    index_, describeOp(op), describe(outcome.status),
                    outcome.detail.empty() ? "" : ": " + outcome.detail);
    }
    // A host callback is part of its stream's work, as in CUDA: the stream is not idle until
    // the callback has returned.
    const bool hostCallback = std::holds_alternative<CallbackOp>(op.body);
    if (!hostCallback) finishRunningLocked(running);
    const bool idle = !hostCallback && idleLocked();
    lock.unlock();

    // Callbacks run without the lock: they may query streams and events.
    if (idle) idleCv_.notify_all();
    complete(op, outcome, waiters);
    lock.lock();
    if (hostCallback) {
      finishRunningLocked(running);
      if (idleLocked()) idleCv_.notify_all();
    }
  }

  void finishRunningLocked(Running& running) {
    std::erase(running_, &running);
    StreamQueue& queue = *running.queue;
    queue.running = false;
    scheduleHeadLocked(queue);
    dropIfDoneLocked(queue);
  }

  static std::string describeOp(const Op& op) {
    if (const auto* launch = std::get_if<LaunchOp>(&op.body)) {
      return "kernel '" + launch->function->name + "'";
    }
    return std::string(backend::describe(std::get<backend::MemoryOperation>(op.body)));
  }

  void complete(Op& op, const Outcome& outcome, std::vector<CompletionCallback>& waiters) {
    auto guarded = [&](auto&& call) {
      try {
        call();
      } catch (const std::exception& error) {
        spdlog::error("sim device {}: a completion callback threw: {}", index_, error.what());
      } catch (...) {
        spdlog::error("sim device {}: a completion callback threw", index_);
      }
    };
    if (auto* launch = std::get_if<LaunchOp>(&op.body); launch != nullptr && launch->done) {
      guarded([&] { launch->done(outcome.status, outcome.nanoseconds); });
    } else if (auto* callback = std::get_if<CallbackOp>(&op.body); callback && callback->done) {
      guarded([&] { callback->done(outcome.status); });
    }
    for (CompletionCallback& waiter : waiters) {
      if (waiter) guarded([&] { waiter(outcome.status); });
    }
  }

  // Executes one op on the engine thread, without the core lock held.
  Outcome run(Op& op, CUresult skipWith, Running& running) {
    Outcome outcome;
    outcome.time = Clock::now();
    if (skipWith != CUDA_SUCCESS) {
      outcome.status = skipWith;
      return outcome;
    }
    outcome.status = std::visit(
        [&](auto& body) {
          using Body = std::decay_t<decltype(body)>;
          if constexpr (std::is_same_v<Body, LaunchOp>) {
            return execute(body, outcome, running);
          } else if constexpr (std::is_same_v<Body, backend::MemoryOperation>) {
            return execute(body, running.besideKernel ? kRelaxedMoves : kPlainMoves);
          } else {
            return execute(body, outcome);
          }
        },
        op.body);
    return outcome;
  }

  CUresult execute(backend::MemoryOperation& operation, const ByteMoves& moves) {
    if (backend::isEmpty(operation)) return CUDA_SUCCESS;
    const DeviceArena::Access access = arena_->access();
    return std::visit([&](auto& body) { return execute(access, moves, body); }, operation);
  }

  static CUresult execute(const DeviceArena::Access& access, const ByteMoves& moves,
                          backend::CopyHostToDevice& copy) {
    std::byte* destination = access.translate(copy.destination, copy.bytes);
    if (destination == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    moves.copy(destination, static_cast<const std::byte*>(copy.source), copy.bytes);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, const ByteMoves& moves,
                          backend::CopyDeviceToHost& copy) {
    const std::byte* source = access.translate(copy.source, copy.bytes);
    if (source == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    moves.copy(static_cast<std::byte*>(copy.destination), source, copy.bytes);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, const ByteMoves& moves,
                          backend::CopyDeviceToDevice& copy) {
    std::byte* destination = access.translate(copy.destination, copy.bytes);
    const std::byte* source = access.translate(copy.source, copy.bytes);
    if (destination == nullptr || source == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    moves.copy(destination, source, copy.bytes);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, const ByteMoves& moves,
                          backend::Memset& memset) {
    std::byte* destination =
        access.translate(memset.destination, memset.count * memset.elementSize);
    if (destination == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    moves.fill(destination, memset.value, memset.elementSize, memset.count);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, const ByteMoves& moves,
                          backend::Memset2D& memset) {
    const backend::DeviceRange extent = backend::deviceRanges(memset).ranges[0];
    std::byte* destination = access.translate(memset.destination, extent.bytes);
    if (destination == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (std::size_t row = 0; row < memset.height; ++row) {
      moves.fill(destination + row * memset.pitch, memset.value, memset.elementSize, memset.width);
    }
    return CUDA_SUCCESS;
  }

  class WorkBetweenBlocks;
  CUresult execute(LaunchOp& launch, Outcome& outcome, Running& running);

  CUresult execute(RecordOp&, Outcome&) { return CUDA_SUCCESS; }
  CUresult execute(WaitOp&, Outcome&) { return CUDA_SUCCESS; }
  CUresult execute(CallbackOp&, Outcome&) { return CUDA_SUCCESS; }

  // The memory map of an owner's launches, rebuilt only when the owner's memory changed. Shared:
  // a kernel run between the blocks of another may rebuild the map that one still reads.
  std::shared_ptr<const ptx::MemoryMap> memoryFor(backend::AddressSpace owner,
                                                  const DeviceArena::Access& access);

  const int index_;
  const std::unique_ptr<DeviceArena> arena_;
  const std::shared_ptr<ptx::Interpreter> interpreter_;
  struct CachedMap {
    std::uint64_t version = 0;
    std::shared_ptr<const ptx::MemoryMap> map;
  };
  std::map<backend::AddressSpace, CachedMap> memoryMaps_;  // engine thread only

  std::mutex mutex_;
  std::condition_variable workCv_;                  // new work, or stop
  std::condition_variable idleCv_;                  // the engine has drained (reset waits for it)
  std::list<std::shared_ptr<StreamQueue>> queues_;  // every stream's, until released and drained
  std::set<std::pair<std::uint64_t, StreamQueue*>> ready_;  // runnable heads, by sequence
  std::multiset<int> readyPriorities_;                      // their streams' priorities
  // The least of readyPriorities_ (INT_MAX when none), read between a kernel's blocks.
  std::atomic<int> mostUrgentReady_{std::numeric_limits<int>::max()};
  // How many runnable heads are not kernels: written under mutex_, read without it beside a
  // kernel (WorkBetweenBlocks).
  std::atomic<std::size_t> readyBesideKernels_{0};
  std::unordered_set<StreamQueue*> blocked_;  // heads waiting for a record
  std::size_t queuedOps_ = 0;                 // ops in all queues, not counting running ones
  // The ops running now, innermost last: more than one while more urgent work runs between the
  // blocks of a kernel. Each lives on the engine thread's stack while it runs.
  std::vector<Running*> running_;
  std::uint64_t nextSequence_ = 0;
  std::uint64_t abandonBefore_ = 0;  // ops with a lower sequence are dropped, not run
  CUresult abandonStatus_ = CUDA_ERROR_CONTEXT_IS_DESTROYED;
  CUresult sticky_ = CUDA_SUCCESS;
  std::string stickyDetail_;
  bool stopping_ = false;
  // A reset or shutdown is under way: kernels stop.
  std::atomic<bool> stop_{false};
  std::unordered_map<backend::AddressSpace, std::size_t> queuesPerOwner_;
  std::unordered_set<backend::AddressSpace> abandonedOwners_;

  std::mutex outputMutex_;
  std::map<backend::AddressSpace, std::unique_ptr<ptx::PrintfBuffer>> outputs_;

  // What an owner changed from the defaults: its printf FIFO size and its device heap.
  struct OwnerSettings {
    std::uint64_t printfFifoBytes = protocol::kDefaultPrintfFifoBytes;
    std::uint32_t stackBytes = protocol::kDefaultStackBytes;
    std::shared_ptr<ptx::DeviceHeap> heap;
    bool isDefault() const {
      return printfFifoBytes == protocol::kDefaultPrintfFifoBytes &&
             stackBytes == protocol::kDefaultStackBytes && !heap;
    }
  };
  OwnerSettings settingsOf(backend::AddressSpace owner) {
    std::lock_guard lock(settingsMutex_);
    const auto found = settings_.find(owner);
    return found == settings_.end() ? OwnerSettings{} : found->second;
  }
  void forgetIfDefault(backend::AddressSpace owner) {
    const auto found = settings_.find(owner);
    if (found->second.isDefault()) settings_.erase(found);
  }
  std::mutex settingsMutex_;
  std::unordered_map<backend::AddressSpace, OwnerSettings> settings_;

  std::thread engine_;  // last: starts after everything it uses is constructed
};

std::shared_ptr<const ptx::MemoryMap> DeviceCore::memoryFor(backend::AddressSpace owner,
                                                            const DeviceArena::Access& access) {
  const std::uint64_t version = access.versionOf(owner);
  auto found = memoryMaps_.find(owner);
  if (found != memoryMaps_.end() && found->second.version == version) return found->second.map;
  // Owners that hold nothing any more are forgotten, so the cache follows the live clients.
  std::erase_if(memoryMaps_, [&](const auto& entry) {
    return entry.first != owner && access.versionOf(entry.first) == 0;
  });
  CachedMap& cached = memoryMaps_[owner];
  std::uint64_t current = 0;
  cached.map = std::make_shared<const ptx::MemoryMap>(access.rangesOf(owner, current));
  cached.version = current;
  return cached.map;
}

// What the engine lets run beside a kernel: between its blocks, ready ops of more urgent streams
// and other streams' ready ops that are not kernels (DeviceCore::runBetweenBlocks); between two
// turns of a block's warps, only the latter (runBesideKernels). The time they take is not the
// kernel's, which is charged only its own.
class DeviceCore::WorkBetweenBlocks final : public ptx::BlockBoundary {
public:
  WorkBetweenBlocks(DeviceCore& core, int priority) : core_(core), priority_(priority) {}
  bool workWaiting() const override {
    return core_.mostUrgentReady_.load(std::memory_order_relaxed) < priority_ ||
           besideWorkWaiting();
  }
  void runWaitingWork() override {
    timed([&] { core_.runBetweenBlocks(priority_); });
  }
  bool besideWorkWaiting() const override {
    return core_.readyBesideKernels_.load(std::memory_order_relaxed) > 0;
  }
  void runBesideWork() override {
    timed([&] { core_.runBesideKernels(); });
  }
  Clock::duration spent() const { return spent_; }

private:
  // Runs `work`, adding the time it took to spent_.
  template <typename Work>
  void timed(Work&& work) {
    const Clock::time_point start = Clock::now();
    work();
    spent_ += Clock::now() - start;
  }

  DeviceCore& core_;
  const int priority_;
  Clock::duration spent_{};
};

CUresult DeviceCore::execute(LaunchOp& launch, Outcome& outcome, Running& running) {
  const Clock::time_point start = Clock::now();
  WorkBetweenBlocks between(*this, running.queue->priority);
  const FunctionData& function = *launch.function;
  ptx::LaunchOutcome result;
  // Holds the heap while the kernel runs, whatever happens to the owner's settings meanwhile.
  const OwnerSettings settings = settingsOf(launch.owner);
  const std::uint64_t printfFifoBytes = settings.printfFifoBytes;
  ptx::PrintfBuffer output(printfFifoBytes);
  {
    // Holds device memory still while the kernel runs: nothing it may touch is reused meanwhile.
    const DeviceArena::Access access = arena_->access();
    ptx::LaunchRequest request;
    request.executable = function.module->executable.get();
    request.kernel = function.kernel;
    request.grid[0] = launch.config.grid.x;
    request.grid[1] = launch.config.grid.y;
    request.grid[2] = launch.config.grid.z;
    request.block[0] = launch.config.block.x;
    request.block[1] = launch.config.block.y;
    request.block[2] = launch.config.block.z;
    request.dynamicSharedBytes = launch.config.sharedMemBytes;
    request.cooperative = launch.config.cooperative;
    request.parameters = launch.parameters;
    const std::shared_ptr<const ptx::MemoryMap> memory = memoryFor(launch.owner, access);
    request.memory = memory.get();
    request.stop = &running.stop;
    request.priority = running.queue->priority;
    request.boundary = &between;
    request.printf = &output;
    request.heap = settings.heap.get();
    request.stackBytes = settings.stackBytes;
    result = interpreter_->run(request);
  }
  outcome.nanoseconds = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start - between.spent())
          .count());
  if (!output.empty()) {
    std::lock_guard lock(outputMutex_);
    std::unique_ptr<ptx::PrintfBuffer>& buffer = outputs_[launch.owner];
    if (!buffer) buffer = std::make_unique<ptx::PrintfBuffer>(printfFifoBytes);
    const std::uint64_t lost = output.takeLostBytes();
    buffer->append(output.take());
    if (lost > 0) buffer->noteLost(lost);
  }
  if (result.status != CUDA_SUCCESS && result.status != CUDA_ERROR_CONTEXT_IS_DESTROYED) {
    outcome.detail = result.message + " (address space " + std::to_string(launch.owner) + ")";
  }
  return result.status;
}

ModuleImage::~ModuleImage() {
  // A reset frees every allocation; the range may belong to someone else by now.
  if (core && core->arena().generation() == arenaGeneration) {
    if (variables != 0) core->arena().free(variables);
  }
}

class SimFunction final : public Function {
public:
  SimFunction(std::shared_ptr<const FunctionData> data, const DeviceCore& core)
      : data_(std::move(data)), core_(core) {}
  const FunctionInfo& info() const override { return data_->info; }
  const std::shared_ptr<const FunctionData>& data() const { return data_; }
  const DeviceCore& core() const { return core_; }

private:
  std::shared_ptr<const FunctionData> data_;
  const DeviceCore& core_;
};

class SimModule final : public Module {
public:
  SimModule(std::shared_ptr<ModuleImage> image,
            std::map<std::string, std::unique_ptr<SimFunction>, std::less<>> functions,
            std::uint64_t deviceBytes, std::chrono::milliseconds unloadDelay)
      : image_(std::move(image)),
        functions_(std::move(functions)),
        deviceBytes_(deviceBytes),
        unloadDelay_(unloadDelay) {}
  // Giving the module's memory back is as slow as a free on this device (CallDelays::free): on a
  // GPU, cuModuleUnload may wait for the device as cuMemFree does.
  ~SimModule() override {
    if (unloadDelay_.count() > 0) std::this_thread::sleep_for(unloadDelay_);
  }

  // The image size stands in for the code a GPU would load, plus the module's variables, which
  // live in device memory: module memory is accounted for like on a GPU.
  std::uint64_t deviceBytes() const override { return deviceBytes_; }
  // Kernels that call malloc or free allocate from their owner's heap (DeviceCore's settings),
  // one per client and device as CUDA has one per context.
  bool needsDeviceHeap() const override { return image_->program->usesHeap; }

  Result<Function*> function(std::string_view name) override {
    const auto found = functions_.find(name);
    if (found == functions_.end()) return CUDA_ERROR_NOT_FOUND;
    return static_cast<Function*>(found->second.get());
  }

  Result<backend::GlobalVariable> global(std::string_view name) override {
    const ptx::Program& program = *image_->program;
    for (std::size_t v = 0; v < program.variables.size(); ++v) {
      const ptx::Variable& variable = program.variables[v];
      if (variable.name != name || variable.external ||
          (variable.space != ptx::Space::kGlobal && variable.space != ptx::Space::kConst)) {
        continue;
      }
      return backend::GlobalVariable{
          image_->executable->variableAddress(static_cast<std::uint32_t>(v)),
          static_cast<std::size_t>(variable.bytes), variable.managed};
    }
    return CUDA_ERROR_NOT_FOUND;
  }

  // The variable's bytes move to `address` and the module is placed again with the variable
  // there: its kernels' address constants and other variables' initial pointers to it follow.
  CUresult placeManagedVariable(std::string_view name, CUdeviceptr address,
                                bool keepValue) override {
    const ptx::Program& program = *image_->program;
    std::optional<std::uint32_t> index;
    for (std::uint32_t v = 0; v < program.variables.size(); ++v) {
      const ptx::Variable& variable = program.variables[v];
      if (variable.name == name && variable.managed && !variable.external) index = v;
    }
    if (!index) return CUDA_ERROR_NOT_FOUND;
    if (image_->launched.load()) return CUDA_ERROR_NOT_SUPPORTED;
    const std::uint64_t bytes = program.variables[*index].bytes;
    const CUdeviceptr from = image_->executable->variableAddress(*index);
    if (from == address) return CUDA_SUCCESS;
    {
      const DeviceArena::Access access = image_->core->arena().access();
      const std::byte* source = access.translate(from, bytes);
      std::byte* target = access.translate(address, bytes);
      if (source == nullptr || target == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (!keepValue) std::memmove(target, source, bytes);
    }
    std::vector<std::uint64_t> placements(program.variables.size(), 0);
    for (std::uint32_t v = 0; v < program.variables.size(); ++v) {
      if (program.variables[v].managed) placements[v] = image_->executable->variableAddress(v);
    }
    placements[*index] = address;
    image_->executable = std::make_unique<ptx::Executable>(image_->program, image_->variables,
                                                           std::move(placements));
    return CUDA_SUCCESS;
  }

private:
  std::shared_ptr<ModuleImage> image_;
  std::map<std::string, std::unique_ptr<SimFunction>, std::less<>> functions_;
  std::uint64_t deviceBytes_;
  std::chrono::milliseconds unloadDelay_;
};

class SimEvent final : public Event {
public:
  SimEvent(std::shared_ptr<DeviceCore> core, unsigned flags)
      : core_(std::move(core)), state_(std::make_shared<EventState>(flags)) {}

  CUresult query() override { return core_->queryEvent(*state_); }
  void whenComplete(CompletionCallback done) override {
    core_->whenComplete(*state_, std::move(done));
  }
  Result<float> elapsedSince(Event& start) override {
    const auto* other = dynamic_cast<SimEvent*>(&start);
    if (other == nullptr || other->core_ != core_) return CUDA_ERROR_INVALID_HANDLE;
    return core_->elapsed(*other->state_, *state_);
  }

  const DeviceCore* core() const { return core_.get(); }
  EventState& state() { return *state_; }

private:
  std::shared_ptr<DeviceCore> core_;
  // Records in flight point at RecordState, not here, so destroying the event drops nothing queued.
  std::shared_ptr<EventState> state_;
};

class SimStream final : public Stream {
public:
  SimStream(std::shared_ptr<DeviceCore> core, int priority, backend::AddressSpace owner)
      : core_(std::move(core)),
        queue_(core_->addQueue(owner, priority)),
        priority_(priority),
        owner_(owner) {}
  ~SimStream() override { core_->releaseQueue(queue_); }

  CUresult enqueue(const backend::MemoryOperation& operation) override {
    if (CUresult checked = backend::checkOperation(operation); checked != CUDA_SUCCESS) {
      return checked;
    }
    backend::MemoryOperation queued = operation;
    // A memset sets the low elementSize bytes of its value.
    std::visit(
        [](auto& body) {
          if constexpr (requires { body.elementSize; }) {
            body.value &= body.elementSize == 4 ? 0xffffffffu : (1u << (8 * body.elementSize)) - 1;
          }
        },
        queued);
    return core_->enqueue(*queue_, std::move(queued));
  }

  CUresult launch(Function& function, const LaunchConfig& config,
                  std::span<const std::byte> parameters, KernelCallback done) override {
    const auto* simFunction = dynamic_cast<const SimFunction*>(&function);
    if (simFunction == nullptr || &simFunction->core() != core_.get()) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    const ptx::Function& kernel =
        simFunction->data()->module->program->functions[simFunction->data()->kernel];
    // A kernel of a loaded module that the interpreter cannot run (logged when it was loaded).
    if (!kernel.unsupported.empty()) return CUDA_ERROR_NOT_SUPPORTED;
    const FunctionInfo& info = simFunction->info();
    const backend::Dim3& block = config.block;
    const backend::Dim3& grid = config.grid;
    if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (block.x > kMaxBlockDimX || block.y > kMaxBlockDimY || block.z > kMaxBlockDimZ) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t threads = std::uint64_t{block.x} * block.y * block.z;
    const std::uint64_t maxThreads = std::min<std::uint64_t>(
        kMaxThreadsPerBlock, static_cast<std::uint64_t>(info.maxThreadsPerBlock));
    if (threads > maxThreads) return CUDA_ERROR_INVALID_VALUE;
    // .reqntid: the kernel was compiled for exactly this block shape.
    const std::uint32_t* required = kernel.requiredThreads;
    if (required[0] != 0 &&
        (block.x != required[0] || block.y != required[1] || block.z != required[2])) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (grid.x > kMaxGridDimX || grid.y > kMaxGridDimY || grid.z > kMaxGridDimZ) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (std::uint64_t{config.sharedMemBytes} + static_cast<std::uint64_t>(info.sharedSizeBytes) >
        kMaxSharedBytesPerBlock) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (parameters.size() != info.parameterBytes) return CUDA_ERROR_INVALID_VALUE;
    if (config.cooperative &&
        std::uint64_t{grid.x} * grid.y * grid.z >
            simResidentBlocks(threads,
                              std::uint64_t{config.sharedMemBytes} +
                                  static_cast<std::uint64_t>(info.sharedSizeBytes),
                              info.numRegs)) {
      return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    simFunction->data()->module->launched.store(true);
    return core_->enqueue(*queue_,
                          LaunchOp{simFunction->data(), config,
                                   std::vector<std::byte>(parameters.begin(), parameters.end()),
                                   std::move(done), owner_});
  }

  CUresult record(Event& event) override {
    auto* simEvent = dynamic_cast<SimEvent*>(&event);
    if (simEvent == nullptr || simEvent->core() != core_.get()) return CUDA_ERROR_INVALID_HANDLE;
    return core_->enqueueRecord(*queue_, simEvent->state());
  }

  CUresult wait(Event& event) override {
    // Waiting on another sim device's event is not modelled: each device has its own engine.
    auto* simEvent = dynamic_cast<SimEvent*>(&event);
    if (simEvent == nullptr || simEvent->core() != core_.get()) return CUDA_ERROR_INVALID_HANDLE;
    return core_->enqueueWait(*queue_, simEvent->state());
  }

  CUresult addCallback(CompletionCallback done) override {
    return core_->enqueue(*queue_, CallbackOp{std::move(done)});
  }

  CUresult query() override { return core_->queryQueue(*queue_); }
  int priority() const override { return priority_; }

private:
  std::shared_ptr<DeviceCore> core_;
  std::shared_ptr<StreamQueue> queue_;
  const int priority_;
  const backend::AddressSpace owner_;  // whose memory its kernels may touch
};

// How much longer than it needs each of a device's slow calls takes (SimOptions' SlowCalls).
struct CallDelays {
  std::chrono::milliseconds moduleLoad{0};
  std::chrono::milliseconds free{0};
  std::chrono::milliseconds reset{0};
};

class SimDevice final : public Device {
public:
  SimDevice(int index, std::uint64_t memoryBytes, unsigned computeCapability,
            std::unique_ptr<DeviceArena> arena, std::shared_ptr<ptx::Interpreter> interpreter,
            CallDelays delays)
      : core_(std::make_shared<DeviceCore>(index, std::move(arena), std::move(interpreter))),
        computeCapability_(computeCapability),
        delays_(delays) {
    properties_.name = "gpuproxy sim device " + std::to_string(index);
    // Reads "gpuproxy-sim" followed by the index: stable across runs and plainly not a real GPU.
    constexpr char kPrefix[] = "gpuproxy-sim";
    std::memcpy(properties_.uuid.data(), kPrefix, 12);
    const auto number = static_cast<std::uint32_t>(index);
    for (int i = 0; i < 4; ++i) {
      properties_.uuid[12 + i] = static_cast<std::uint8_t>(number >> (8 * (3 - i)));
    }
    properties_.totalMemory = memoryBytes;
    properties_.attributes = simDeviceAttributes(index + 1, computeCapability);
  }

  ~SimDevice() override { core_->shutdown(); }

  const DeviceProperties& properties() const override { return properties_; }

  using Device::allocate;
  using Device::createStreamFor;
  using Device::registerHostMemory;

  Result<CUdeviceptr> allocate(std::size_t bytes, backend::AddressSpace owner) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return core_->arena().allocate(bytes, owner);
  }

  CUresult free(CUdeviceptr pointer) override {
    if (delays_.free.count() > 0) std::this_thread::sleep_for(delays_.free);
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return core_->arena().free(pointer);
  }

  CUresult shareAllocation(CUdeviceptr base, backend::AddressSpace with) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return core_->arena().share(base, with);
  }

  // Virtual memory management: reservations come from the addresses after the device's memory
  // in its slot (openDevice), physical memory from the arena, in granules as on a GPU.
  Result<CUdeviceptr> reserveAddresses(std::uint64_t bytes, std::uint64_t alignment) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    constexpr std::uint64_t kGranule = protocol::kVirtualMemoryGranularity;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (bytes > kSimAddressStride) return CUDA_ERROR_OUT_OF_MEMORY;
    return core_->arena().reserveAddresses(bytes, std::max(alignment, kGranule));
  }
  CUresult freeAddresses(CUdeviceptr start, std::uint64_t bytes) override {
    return core_->arena().freeAddresses(start, bytes);
  }
  Result<std::uint64_t> createPhysicalMemory(std::uint64_t bytes) override {
    auto allocated = allocate(bytes, backend::kDaemonAddressSpace);
    if (!allocated.ok()) return allocated.code();
    return std::uint64_t{allocated.value()};
  }
  CUresult releasePhysicalMemory(std::uint64_t handle) override { return free(handle); }
  CUresult mapMemory(CUdeviceptr address, std::uint64_t bytes, std::uint64_t handle,
                     std::uint64_t offset) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return core_->arena().map(address, bytes, handle, offset);
  }
  CUresult unmapMemory(CUdeviceptr address, std::uint64_t bytes) override {
    return core_->arena().unmap(address, bytes);
  }
  CUresult setMemoryAccess(CUdeviceptr address, std::uint64_t bytes, backend::AddressSpace owner,
                           bool writable) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return core_->arena().setAccess(address, bytes, owner, writable);
  }

  void unshareAllocation(CUdeviceptr base, backend::AddressSpace with) override {
    core_->arena().unshare(base, with);
  }

  std::uint64_t occupiedBytes(std::size_t bytes) const override {
    return DeviceArena::reservedBytes(bytes);
  }

  CUresult registerHostMemory(void* host, std::size_t bytes, backend::AddressSpace owner) override {
    return core_->arena().registerHost(host, bytes, owner);
  }

  CUresult unregisterHostMemory(void* host) override { return core_->arena().unregisterHost(host); }

  MemoryInfo memoryInfo() override {
    const std::uint64_t capacity = core_->arena().capacity();
    return MemoryInfo{capacity - core_->arena().allocatedBytes(), capacity};
  }

  // The PTX text of a fatbin's entry best suited to this device (its compute capability).
  Result<SelectedPtx> selectFatbinPtx(std::span<const std::byte> image) const {
    const int index = core_->index();
    auto contents = fatbin::parseFatbin(image);
    if (!contents.ok()) {
      spdlog::warn("sim device {}: malformed fatbin of {} bytes: {}", index, image.size(),
                   contents.error);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    const std::vector<fatbin::FatbinEntry>& entries = contents.value->entries;
    auto ptx = fatbin::selectPtx(*contents.value, computeCapability_);
    if (ptx.ok()) return SelectedPtx{std::move(*ptx.value), 0};
    const bool hasUsablePtx =
        std::any_of(entries.begin(), entries.end(), [this](const fatbin::FatbinEntry& entry) {
          return entry.kind == fatbin::EntryKind::kPtx && entry.arch <= computeCapability_;
        });
    if (!hasUsablePtx) {
      // Libraries such as cuBLAS ship machine code for every GPU they support and PTX only for
      // the newest. A GPU of the sim's kind runs such an image from its machine code, which the
      // sim cannot execute; it runs the closest newer PTX instead, whose instructions the
      // interpreter either executes with a GPU's semantics or refuses by name at load.
      const bool machineCodeForThisGpu =
          std::any_of(entries.begin(), entries.end(), [this](const fatbin::FatbinEntry& entry) {
            return entry.kind == fatbin::EntryKind::kElf && entry.arch == computeCapability_ &&
                   entry.variant == fatbin::ArchVariant::kGeneric;
          });
      unsigned closestNewer = 0;
      for (const fatbin::FatbinEntry& entry : entries) {
        if (entry.kind == fatbin::EntryKind::kPtx && entry.arch > computeCapability_ &&
            entry.variant == fatbin::ArchVariant::kGeneric &&
            (closestNewer == 0 || entry.arch < closestNewer)) {
          closestNewer = entry.arch;
        }
      }
      if (machineCodeForThisGpu && closestNewer != 0) {
        auto newer = fatbin::selectPtx(*contents.value, closestNewer);
        if (newer.ok()) {
          spdlog::info(
              "sim device {}: a fatbin of {} bytes has machine code for sm_{} but no PTX for it; "
              "running its compute_{} PTX",
              index, contents.value->size, computeCapability_, closestNewer);
          return SelectedPtx{std::move(*newer.value), computeCapability_};
        }
        ptx.error = newer.error;
      }
    }
    spdlog::warn("sim device {}: cannot load a fatbin of {} bytes: {}", index, contents.value->size,
                 ptx.error);
    return hasUsablePtx ? CUDA_ERROR_INVALID_IMAGE : CUDA_ERROR_NO_BINARY_FOR_GPU;
  }

  // Everything up to a decoded program: the fatbin's entry, decompression, the PTX decoder. It
  // reads only the image and the device's index.
  Result<std::unique_ptr<PreparedModule>> prepareModule(
      std::span<const std::byte> image) const override {
    const int index = core_->index();
    // A fatbin runs from its PTX entry (the interpreter executes PTX, not SASS).
    std::string ptxOfFatbin;
    unsigned standsInForMachineCode = 0;
    switch (protocol::moduleImageKind(image)) {
      case protocol::ModuleImageKind::kPtx:
        break;
      case protocol::ModuleImageKind::kElf:
        spdlog::warn(
            "sim device {}: cannot load a cubin of {} bytes: the sim runs PTX, not machine code; "
            "build the kernels with PTX in them (nvcc -gencode arch=compute_XX,code=compute_XX, "
            "the default keeps it) or use the cuda backend",
            index, image.size());
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
      case protocol::ModuleImageKind::kFatbin: {
        auto selected = selectFatbinPtx(image);
        if (!selected.ok()) return selected.code();
        SelectedPtx chosen = std::move(selected).value();
        ptxOfFatbin = std::move(chosen.text);
        standsInForMachineCode = chosen.standsInForMachineCode;
        image = std::as_bytes(std::span(ptxOfFatbin.data(), ptxOfFatbin.size()));
        break;
      }
      case protocol::ModuleImageKind::kFatbinWrapper:
        // The stub ships the fatbin a wrapper points at; a wrapper's pointer means nothing here.
        spdlog::warn("sim device {}: refusing a fatbin wrapper: its pointer is the client's",
                     index);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    if (!ptx::looksLikePtx(image)) {
      spdlog::warn("sim device {}: module image is neither PTX nor cubin/fatbin", index);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    ptx::DecodeResult decoded =
        ptx::decodePtx(std::string_view(reinterpret_cast<const char*>(image.data()), image.size()));
    if (decoded.status == CUDA_ERROR_NOT_SUPPORTED) {
      spdlog::warn("sim device {}: cannot run this module: {}", index, decoded.message);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!decoded.ok()) {
      spdlog::warn("sim device {}: malformed PTX: {}", index, decoded.message);
      return CUDA_ERROR_INVALID_PTX;
    }
    for (const ptx::Function& function : decoded.program->functions) {
      if (function.isKernel && !function.unsupported.empty()) {
        spdlog::warn("sim device {}: {}; the module loads, and launching that kernel is refused",
                     index, function.unsupported);
      }
    }
    auto prepared = std::make_unique<SimPreparedModule>();
    prepared->program = std::shared_ptr<const ptx::Program>(std::move(decoded.program));
    prepared->imageBytes = image.size();
    prepared->standsInForMachineCode = standsInForMachineCode;
    return std::unique_ptr<PreparedModule>(std::move(prepared));
  }

  Result<std::unique_ptr<Module>> loadPrepared(std::unique_ptr<PreparedModule> preparedModule,
                                               backend::AddressSpace owner) override {
    // A slow load (CallDelays::moduleLoad) is slow where it touches the device: the daemon runs
    // the preparation (a GPU's JIT) and this in one call, and must run this too off its loop.
    if (delays_.moduleLoad.count() > 0) std::this_thread::sleep_for(delays_.moduleLoad);
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    auto* prepared = dynamic_cast<SimPreparedModule*>(preparedModule.get());
    KJ_REQUIRE(prepared != nullptr, "a module prepared by another backend");
    auto moduleImage = std::make_shared<ModuleImage>();
    moduleImage->program = std::move(prepared->program);
    moduleImage->core = core_;
    moduleImage->owner = owner;
    const ptx::Program& program = *moduleImage->program;
    std::uint64_t variableBytes = 0;
    if (program.globalBytes > 0) {
      // The module's variables are the owner's device memory; its constant ones read-only.
      auto allocated = core_->arena().allocate(program.globalBytes, owner, program.constOffset);
      if (!allocated.ok()) return allocated.code();
      moduleImage->variables = allocated.value();
      moduleImage->arenaGeneration = core_->arena().generation();
      variableBytes = (program.globalBytes + kAllocationAlignment - 1) / kAllocationAlignment *
                      kAllocationAlignment;
    }
    moduleImage->executable =
        std::make_unique<ptx::Executable>(moduleImage->program, moduleImage->variables);
    if (program.globalBytes > 0) {
      const std::vector<std::byte> initial = moduleImage->executable->initialImage();
      const DeviceArena::Access access = core_->arena().access();
      std::byte* memory = access.translate(moduleImage->variables, initial.size());
      if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
      std::memcpy(memory, initial.data(), initial.size());
    }
    std::uint64_t constBytes = 0;
    for (const ptx::Variable& variable : program.variables) {
      if (variable.space == ptx::Space::kConst) constBytes += variable.bytes;
    }
    std::map<std::string, std::unique_ptr<SimFunction>, std::less<>> functions;
    for (std::uint32_t f = 0; f < program.functions.size(); ++f) {
      const ptx::Function& kernel = program.functions[f];
      if (!kernel.isKernel || !kernel.defined) continue;
      auto data = std::make_shared<FunctionData>();
      data->name = kernel.name;
      data->module = moduleImage;
      data->kernel = f;
      FunctionInfo& info = data->info;
      info.parameterBytes = kernel.kernelParameterBytes;
      for (const ptx::KernelParameter& parameter : kernel.kernelParameters) {
        info.parameters.push_back({parameter.offset, parameter.size});
      }
      info.maxThreadsPerBlock =
          static_cast<int>(kernel.maxThreads != 0 ? std::min(kernel.maxThreads, kMaxThreadsPerBlock)
                                                  : kMaxThreadsPerBlock);
      info.sharedSizeBytes = static_cast<int>(kernel.ownSharedBytes);
      info.numRegs = modelledRegisters(kernel);
      info.localSizeBytes = static_cast<int>(kernel.localBytes);
      info.constSizeBytes = static_cast<int>(std::min<std::uint64_t>(constBytes, 1u << 30));
      // What a GPU reports for JIT-compiled PTX: the virtual architecture the PTX targets
      // (.target sm_75: 75), and the device's own as the code it runs. For newer PTX run in
      // place of a fatbin's machine code for this device, what the GPU running that code
      // reports (libraries such as cuBLAS pick their launch configurations by it).
      info.ptxVersion =
          static_cast<int>(prepared->standsInForMachineCode != 0 ? prepared->standsInForMachineCode
                                                                 : program.smVersion);
      info.binaryVersion = static_cast<int>(computeCapability_);
      functions.emplace(kernel.name, std::make_unique<SimFunction>(std::move(data), *core_));
    }
    return std::unique_ptr<Module>(
        std::make_unique<SimModule>(std::move(moduleImage), std::move(functions),
                                    prepared->imageBytes + variableBytes, delays_.free));
  }

  Result<std::unique_ptr<Stream>> createStream(unsigned flags, int priority) override {
    return createStreamFor(backend::TenantClass::kBestEffort, flags, priority);
  }

  // The class is not modelled (there is no SM partition on sim). The priority is clamped, as
  // CUDA clamps it, and the engine runs a more urgent stream's ready work first, between the
  // blocks of a less urgent kernel too (DeviceCore::runBetweenBlocks).
  Result<std::unique_ptr<Stream>> createStreamFor(backend::TenantClass /*workClass*/,
                                                  unsigned flags, int priority,
                                                  backend::AddressSpace owner) override {
    if ((flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    const int clamped = std::clamp(priority, kSimGreatestPriority, kSimLeastPriority);
    return std::unique_ptr<Stream>(std::make_unique<SimStream>(core_, clamped, owner));
  }

  backend::StreamPriorityRange streamPriorityRange() const override {
    return {kSimLeastPriority, kSimGreatestPriority};
  }

  Result<std::unique_ptr<Event>> createEvent(unsigned flags) override {
    constexpr unsigned kKnown =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    // As in CUDA: an interprocess event must not record timing.
    if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return std::unique_ptr<Event>(std::make_unique<SimEvent>(core_, flags));
  }

  CUresult stickyError() override { return core_->sticky(); }
  void abandonWorkOf(backend::AddressSpace owner) override { core_->abandonOwner(owner); }

  // The stack size is what a recursing kernel's threads get at least (the sim gives them more by
  // default: ptx::kRecursionStackBytes beyond their frame); the printf FIFO bounds what is kept
  // of the owner's output; the heap is the client's (attachDeviceHeap), so its size is the
  // daemon's business.
  Result<std::uint64_t> setLimit(backend::AddressSpace owner, CUlimit limit,
                                 std::uint64_t value) override {
    switch (limit) {
      case CU_LIMIT_STACK_SIZE: {
        const auto granted = static_cast<std::uint32_t>(
            (std::min<std::uint64_t>(value, ptx::kMaxStackBytesPerThread) + 15) / 16 * 16);
        core_->setStackBytes(owner, granted);
        return std::uint64_t{granted};
      }
      case CU_LIMIT_MALLOC_HEAP_SIZE: {
        // Whole pages, at least one; whether that much memory can be had shows when the heap is
        // made.
        constexpr std::uint64_t kPage = 4096;
        const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() / 2;
        return (std::clamp<std::uint64_t>(value, 1, limit) + kPage - 1) / kPage * kPage;
      }
      case CU_LIMIT_PRINTF_FIFO_SIZE: {
        const std::uint64_t granted =
            std::clamp<std::uint64_t>(value, std::uint64_t{1} << 12, protocol::kMaxPrintfFifoBytes);
        core_->setPrintfFifoBytes(owner, granted);
        return granted;
      }
      default:
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    }
  }
  void attachDeviceHeap(backend::AddressSpace owner, CUdeviceptr base,
                        std::uint64_t bytes) override {
    core_->attachHeap(owner, base, bytes);
  }
  std::string stickyErrorDetail() override { return core_->stickyDetail(); }
  std::string takeDeviceOutput(backend::AddressSpace owner) override {
    return core_->takeOutput(owner);
  }
  CUresult reset() override {
    if (delays_.reset.count() > 0) std::this_thread::sleep_for(delays_.reset);
    return core_->reset();
  }

private:
  DeviceProperties properties_;
  std::shared_ptr<DeviceCore> core_;
  const unsigned computeCapability_;  // major * 10 + minor
  const CallDelays delays_;
};

class SimBackend final : public backend::Backend {
public:
  explicit SimBackend(const SimOptions& options)
      : devices_(options.devices),
        memoryBytes_(options.memoryBytes / kAllocationAlignment * kAllocationAlignment),
        computeCapability_(options.computeCapability),
        interpreter_(std::make_shared<ptx::Interpreter>(workerThreads(options))),
        slowModuleLoad_(options.slowModuleLoad),
        slowFree_(options.slowFree),
        slowReset_(options.slowReset) {}

  std::string_view name() const override { return "sim"; }
  int driverVersion() const override { return CUDA_VERSION; }
  int deviceCount() const override { return devices_; }

  Result<std::unique_ptr<Device>> openDevice(int index,
                                             const backend::DeviceOptions& options) override {
    if (index < 0 || index >= devices_) return CUDA_ERROR_INVALID_DEVICE;
    if (options.wantsSmPartition()) {
      // The sim's one engine runs one kernel at a time: there are no SMs to split, and a
      // partition it only pretended to make would tell an operator nothing true.
      spdlog::error(
          "sim device {}: an SM partition (--best-effort-sms) needs the cuda backend with green "
          "contexts; the sim runs one kernel at a time and has no SMs to split",
          index);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    const CUdeviceptr base =
        kSimAddressBase + static_cast<std::uint64_t>(index) * kSimAddressStride;
    // The arena's host mapping stays out of the range where processes' own mappings go (the
    // kernel places mmap()s top-down from below the stack): a client's memory registered with
    // CU_MEMHOSTREGISTER_DEVICEMAP is mapped in the daemon at the client's address, which a
    // 16 GiB arena there would now and then be in the way of.
    const std::uint64_t slot =
        (memoryBytes_ + kSimHostSlotAlignment - 1) / kSimHostSlotAlignment * kSimHostSlotAlignment;
    void* hostHint =
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(kSimHostBase + index * slot));
    // Reservations (cuMemAddressReserve) take the rest of the device's slot of addresses, from
    // the first granule after its memory.
    constexpr std::uint64_t kGranule = protocol::kVirtualMemoryGranularity;
    const AddressWindow reservable{base + (memoryBytes_ + kGranule - 1) / kGranule * kGranule,
                                   base + kSimAddressStride};
    std::unique_ptr<DeviceArena> arena =
        DeviceArena::create(base, memoryBytes_, hostHint, reservable);
    if (!arena) {
      spdlog::error("sim device {}: cannot reserve {} bytes of address space for device memory",
                    index, memoryBytes_);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const CallDelays delays{slowModuleLoad_.on(index), slowFree_.on(index), slowReset_.on(index)};
    return std::unique_ptr<Device>(std::make_unique<SimDevice>(
        index, memoryBytes_, computeCapability_, std::move(arena), interpreter_, delays));
  }

private:
  // Helpers beside each engine thread, which runs blocks too: one per further core by default.
  static unsigned workerThreads(const SimOptions& options) {
    if (options.workerThreads >= 0) return static_cast<unsigned>(options.workerThreads);
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    return cores - 1;
  }

  const int devices_;
  const std::uint64_t memoryBytes_;
  const unsigned computeCapability_;
  // Shared by every device: blocks of concurrent launches share the host's cores.
  const std::shared_ptr<ptx::Interpreter> interpreter_;
  const SlowCall slowModuleLoad_;
  const SlowCall slowFree_;
  const SlowCall slowReset_;
};

}  // namespace

std::unique_ptr<backend::Backend> newSimBackend(const SimOptions& options) {
  if (options.devices < 0 || options.devices > kMaxDevices) {
    throw std::invalid_argument("sim backend: devices must be between 0 and " +
                                std::to_string(kMaxDevices));
  }
  if (options.memoryBytes < kAllocationAlignment || options.memoryBytes > kSimAddressStride) {
    throw std::invalid_argument(
        "sim backend: memory per device must be between 256 bytes and 1 TiB");
  }
  if (std::find(std::begin(kSimComputeCapabilities), std::end(kSimComputeCapabilities),
                options.computeCapability) == std::end(kSimComputeCapabilities)) {
    std::string offered;
    for (unsigned each : kSimComputeCapabilities) {
      offered += (offered.empty() ? "" : ", ") + backend::computeCapabilityName(each);
    }
    throw std::invalid_argument("sim backend: compute capability " +
                                backend::computeCapabilityName(options.computeCapability) +
                                " is none the sim offers (" + offered + ")");
  }
  return std::make_unique<SimBackend>(options);
}

}  // namespace gpuproxy::server::sim
