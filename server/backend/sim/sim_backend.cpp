#include "server/backend/sim/sim_backend.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>

#include "protocol/cuda_result.hpp"
#include "protocol/module_image.hpp"
#include "server/backend/ptx/ptx_parser.hpp"
#include "server/backend/sim/device_arena.hpp"
#include "server/backend/sim/device_attributes.hpp"
#include "server/backend/sim/twins.hpp"

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
constexpr unsigned kMaxSharedBytesPerBlock = 48 * 1024;
constexpr int kRegistersPerThread = 32;
// cuCtxGetStreamPriorityRange on current NVIDIA GPUs: six levels, 0 (default, least) to -5.
constexpr int kSimLeastPriority = 0;
constexpr int kSimGreatestPriority = -5;

// One record of an event on a stream. Guarded by DeviceCore::mutex_.
struct RecordState {
  bool completed = false;
  CUresult status = CUDA_SUCCESS;
  Clock::time_point time;
  std::vector<CompletionCallback> waiters;
};

// Guarded by DeviceCore::mutex_ (except the constant flags).
struct EventState {
  explicit EventState(unsigned eventFlags) : flags(eventFlags) {}
  const unsigned flags;
  std::shared_ptr<RecordState> latest;  // the most recent record; null until the first
};

struct FunctionData {
  std::string name;
  const Twin* twin = nullptr;
  FunctionInfo info;
};

struct LaunchOp {
  // Shared with the Function: a queued launch must survive the Module being destroyed.
  std::shared_ptr<const FunctionData> function;
  LaunchConfig config;
  std::vector<std::byte> parameters;
  KernelCallback done;
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
struct StreamQueue {
  std::deque<Op> ops;
  bool released = false;  // the Stream object is gone; drop the queue once it drains
};

struct Outcome {
  CUresult status = CUDA_SUCCESS;
  std::uint64_t nanoseconds = 0;
  Clock::time_point time;
};

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
  DeviceCore(int index, std::unique_ptr<DeviceArena> arena)
      : index_(index), arena_(std::move(arena)) {
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

  std::shared_ptr<StreamQueue> addQueue() {
    auto queue = std::make_shared<StreamQueue>();
    std::lock_guard lock(mutex_);
    queues_.push_back(queue);
    return queue;
  }

  void releaseQueue(const std::shared_ptr<StreamQueue>& queue) {
    std::lock_guard lock(mutex_);
    queue->released = true;
    pruneQueuesLocked();
  }

  CUresult enqueue(StreamQueue& queue, OpBody body) {
    {
      std::lock_guard lock(mutex_);
      if (const CUresult status = usableLocked(); status != CUDA_SUCCESS) return status;
      queue.ops.push_back(Op{nextSequence_++, std::move(body)});
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
      queue.ops.push_back(Op{nextSequence_++, RecordOp{std::move(record)}});
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
      queue.ops.push_back(Op{nextSequence_++, WaitOp{event.latest}});
    }
    workCv_.notify_one();
    return CUDA_SUCCESS;
  }

  CUresult queryQueue(const StreamQueue& queue) {
    std::lock_guard lock(mutex_);
    if (sticky_ != CUDA_SUCCESS) return sticky_;
    return queue.ops.empty() && executing_ != &queue ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
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
    {
      std::lock_guard interruptLock(interruptMutex_);
      interrupted_ = false;
    }
    if (sticky_ != CUDA_SUCCESS) {
      spdlog::info("sim device {}: reset clears sticky {}", index_, describe(sticky_));
    }
    sticky_ = CUDA_SUCCESS;
    arena_->releaseAll();
    return CUDA_SUCCESS;
  }

  // For the spin twin: sleeps until `deadline` unless a reset or shutdown interrupts it.
  bool sleepUntil(Clock::time_point deadline) {
    std::unique_lock lock(interruptMutex_);
    // A deadline already past must not reach the kernel: a timed futex wait is rounded up by the
    // thread's timer slack (50 us by default), which made every short kernel take that long.
    if (Clock::now() >= deadline) return !interrupted_;
    return !interruptCv_.wait_until(lock, deadline, [&] { return interrupted_; });
  }

private:
  CUresult usableLocked() const {
    if (stopping_) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return sticky_;
  }

  // Everything queued so far is dropped rather than run; a running kernel is interrupted.
  void abandonLocked() {
    abandonBefore_ = nextSequence_;
    abandonStatus_ = sticky_ != CUDA_SUCCESS ? sticky_ : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    std::lock_guard interruptLock(interruptMutex_);
    interrupted_ = true;
    interruptCv_.notify_all();
  }

  bool idleLocked() const {
    return executing_ == nullptr && std::all_of(queues_.begin(), queues_.end(),
                                                [](const std::shared_ptr<StreamQueue>& queue) {
                                                  return queue->ops.empty();
                                                });
  }

  void pruneQueuesLocked() {
    queues_.remove_if([&](const std::shared_ptr<StreamQueue>& queue) {
      return queue->released && queue->ops.empty() && executing_ != queue.get();
    });
  }

  // The runnable stream head with the lowest sequence number: streams interleave in submission
  // order, and a stream blocked on an event does not hold up the others.
  std::shared_ptr<StreamQueue> pickLocked() {
    std::shared_ptr<StreamQueue> best;
    for (const std::shared_ptr<StreamQueue>& queue : queues_) {
      if (queue->ops.empty()) continue;
      const Op& head = queue->ops.front();
      if (head.sequence >= abandonBefore_) {
        const auto* wait = std::get_if<WaitOp>(&head.body);
        if (wait != nullptr && !wait->record->completed) continue;
      }
      if (!best || head.sequence < best->ops.front().sequence) best = queue;
    }
    return best;
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
      Op op = std::move(queue->ops.front());
      queue->ops.pop_front();
      executing_ = queue.get();
      const CUresult skipWith = op.sequence < abandonBefore_ ? abandonStatus_ : sticky_;
      lock.unlock();

      const Outcome outcome = run(op, skipWith);
      std::vector<CompletionCallback> waiters;

      lock.lock();
      if (auto* record = std::get_if<RecordOp>(&op.body)) {
        record->record->completed = true;
        record->record->status = outcome.status;
        record->record->time = outcome.time;
        waiters = std::move(record->record->waiters);
      }
      if (protocol::isStickyError(outcome.status) && sticky_ == CUDA_SUCCESS &&
          skipWith == CUDA_SUCCESS) {
        sticky_ = outcome.status;
        spdlog::error("sim device {}: {} faulted with {}; the device is poisoned until reset",
                      index_, describeOp(op), describe(outcome.status));
      }
      // A host callback is part of its stream's work, as in CUDA: the stream is not idle until
      // the callback has returned.
      const bool hostCallback = std::holds_alternative<CallbackOp>(op.body);
      if (!hostCallback) finishExecutingLocked();
      const bool idle = !hostCallback && idleLocked();
      lock.unlock();

      // Callbacks run without the lock: they may query streams and events.
      if (idle) idleCv_.notify_all();
      complete(op, outcome, waiters);
      lock.lock();
      if (hostCallback) {
        finishExecutingLocked();
        if (idleLocked()) idleCv_.notify_all();
      }
    }
  }

  void finishExecutingLocked() {
    executing_ = nullptr;
    pruneQueuesLocked();
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
  Outcome run(Op& op, CUresult skipWith) {
    Outcome outcome;
    outcome.time = Clock::now();
    if (skipWith != CUDA_SUCCESS) {
      outcome.status = skipWith;
      return outcome;
    }
    outcome.status = std::visit([&](auto& body) { return execute(body, outcome); }, op.body);
    return outcome;
  }

  CUresult execute(backend::MemoryOperation& operation, Outcome&) {
    if (backend::isEmpty(operation)) return CUDA_SUCCESS;
    const DeviceArena::Access access = arena_->access();
    return std::visit([&](auto& body) { return execute(access, body); }, operation);
  }

  static CUresult execute(const DeviceArena::Access& access, backend::CopyHostToDevice& copy) {
    std::byte* destination = access.translate(copy.destination, copy.bytes);
    if (destination == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    std::memcpy(destination, copy.source, copy.bytes);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, backend::CopyDeviceToHost& copy) {
    const std::byte* source = access.translate(copy.source, copy.bytes);
    if (source == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    std::memcpy(copy.destination, source, copy.bytes);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, backend::CopyDeviceToDevice& copy) {
    std::byte* destination = access.translate(copy.destination, copy.bytes);
    const std::byte* source = access.translate(copy.source, copy.bytes);
    if (destination == nullptr || source == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    std::memmove(destination, source, copy.bytes);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, backend::Memset& memset) {
    std::byte* destination =
        access.translate(memset.destination, memset.count * memset.elementSize);
    if (destination == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    fillElements(destination, memset.value, memset.elementSize, memset.count);
    return CUDA_SUCCESS;
  }

  static CUresult execute(const DeviceArena::Access& access, backend::Memset2D& memset) {
    const backend::DeviceRange extent = backend::deviceRanges(memset).ranges[0];
    std::byte* destination = access.translate(memset.destination, extent.bytes);
    if (destination == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (std::size_t row = 0; row < memset.height; ++row) {
      fillElements(destination + row * memset.pitch, memset.value, memset.elementSize,
                   memset.width);
    }
    return CUDA_SUCCESS;
  }

  // `count` elements of `elementSize` bytes, each the low bytes of `value`.
  static void fillElements(std::byte* destination, std::uint32_t value, unsigned elementSize,
                           std::size_t count) {
    if (elementSize == 1) {
      std::memset(destination, static_cast<int>(value & 0xff), count);
      return;
    }
    // Little-endian element bytes, as the GPU stores them.
    std::byte pattern[4];
    std::memcpy(pattern, &value, sizeof(pattern));
    for (std::size_t i = 0; i < count; ++i) {
      std::memcpy(destination + i * elementSize, pattern, elementSize);
    }
  }

  CUresult execute(LaunchOp& launch, Outcome& outcome);

  CUresult execute(RecordOp&, Outcome&) { return CUDA_SUCCESS; }
  CUresult execute(WaitOp&, Outcome&) { return CUDA_SUCCESS; }
  CUresult execute(CallbackOp&, Outcome&) { return CUDA_SUCCESS; }

  const int index_;
  const std::unique_ptr<DeviceArena> arena_;

  std::mutex mutex_;
  std::condition_variable workCv_;  // new work, or stop
  std::condition_variable idleCv_;  // the engine has drained (reset waits for it)
  std::list<std::shared_ptr<StreamQueue>> queues_;
  const StreamQueue* executing_ = nullptr;  // the queue whose op runs now
  std::uint64_t nextSequence_ = 0;
  std::uint64_t abandonBefore_ = 0;  // ops with a lower sequence are dropped, not run
  CUresult abandonStatus_ = CUDA_ERROR_CONTEXT_IS_DESTROYED;
  CUresult sticky_ = CUDA_SUCCESS;
  bool stopping_ = false;

  // Separate from mutex_ so a sleeping spin kernel can be woken without the engine lock.
  std::mutex interruptMutex_;
  std::condition_variable interruptCv_;
  bool interrupted_ = false;

  std::thread engine_;  // last: starts after everything it uses is constructed
};

// The view a twin gets of its launch.
class TwinContext final : public KernelContext {
public:
  TwinContext(const LaunchOp& launch, DeviceCore& core) : launch_(launch), core_(core) {
    if (launch.function->twin->touchesMemory) access_.emplace(core.arena().access());
  }

  const LaunchConfig& config() const override { return launch_.config; }

  std::span<const std::byte> parameter(std::size_t index) const override {
    const std::vector<backend::KernelParameter>& layout = launch_.function->info.parameters;
    if (index >= layout.size()) return {};
    return std::span<const std::byte>(launch_.parameters)
        .subspan(layout[index].offset, layout[index].size);
  }

  std::byte* translate(CUdeviceptr address, std::size_t bytes) override {
    return access_ ? access_->translate(address, bytes) : nullptr;
  }

  bool sleepUntil(Clock::time_point deadline) override { return core_.sleepUntil(deadline); }

private:
  const LaunchOp& launch_;
  DeviceCore& core_;
  std::optional<DeviceArena::Access> access_;  // holds device memory still while the twin runs
};

CUresult DeviceCore::execute(LaunchOp& launch, Outcome& outcome) {
  const Clock::time_point start = Clock::now();
  CUresult status = CUDA_SUCCESS;
  {
    TwinContext context(launch, *this);
    status = launch.function->twin->run(context);
  }
  outcome.nanoseconds = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  return status;
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
  SimModule(std::map<std::string, std::unique_ptr<SimFunction>, std::less<>> functions,
            std::uint64_t imageBytes)
      : functions_(std::move(functions)), imageBytes_(imageBytes) {}

  // The sim holds no device memory for a module; it reports the image size as the stand-in for
  // the code and data a GPU would load, so that module memory is accounted for like on a GPU.
  std::uint64_t deviceBytes() const override { return imageBytes_; }

  Result<Function*> function(std::string_view name) override {
    const auto found = functions_.find(name);
    if (found == functions_.end()) return CUDA_ERROR_NOT_FOUND;
    return static_cast<Function*>(found->second.get());
  }

private:
  std::map<std::string, std::unique_ptr<SimFunction>, std::less<>> functions_;
  std::uint64_t imageBytes_;
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
  SimStream(std::shared_ptr<DeviceCore> core, int priority)
      : core_(std::move(core)), queue_(core_->addQueue()), priority_(priority) {}
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
    if (grid.x > kMaxGridDimX || grid.y > kMaxGridDimY || grid.z > kMaxGridDimZ) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (std::uint64_t{config.sharedMemBytes} + static_cast<std::uint64_t>(info.sharedSizeBytes) >
        kMaxSharedBytesPerBlock) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (parameters.size() != info.parameterBytes) return CUDA_ERROR_INVALID_VALUE;
    return core_->enqueue(
        *queue_,
        LaunchOp{simFunction->data(), config,
                 std::vector<std::byte>(parameters.begin(), parameters.end()), std::move(done)});
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
};

std::string twinNames() {
  std::string names;
  for (const Twin& twin : allTwins()) {
    if (!names.empty()) names += ", ";
    names += twin.name;
  }
  return names;
}

class SimDevice final : public Device {
public:
  SimDevice(int index, std::uint64_t memoryBytes, std::unique_ptr<DeviceArena> arena)
      : core_(std::make_shared<DeviceCore>(index, std::move(arena))) {
    properties_.name = "gpuproxy sim device " + std::to_string(index);
    // Reads "gpuproxy-sim" followed by the index: stable across runs and plainly not a real GPU.
    constexpr char kPrefix[] = "gpuproxy-sim";
    std::memcpy(properties_.uuid.data(), kPrefix, 12);
    const auto number = static_cast<std::uint32_t>(index);
    for (int i = 0; i < 4; ++i) {
      properties_.uuid[12 + i] = static_cast<std::uint8_t>(number >> (8 * (3 - i)));
    }
    properties_.totalMemory = memoryBytes;
    properties_.attributes = simDeviceAttributes(index + 1);
  }

  ~SimDevice() override { core_->shutdown(); }

  const DeviceProperties& properties() const override { return properties_; }

  Result<CUdeviceptr> allocate(std::size_t bytes) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return core_->arena().allocate(bytes);
  }

  CUresult free(CUdeviceptr pointer) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    return core_->arena().free(pointer);
  }

  CUresult registerHostMemory(void* host, std::size_t bytes) override {
    return core_->arena().registerHost(host, bytes);
  }

  CUresult unregisterHostMemory(void* host) override { return core_->arena().unregisterHost(host); }

  MemoryInfo memoryInfo() override {
    const std::uint64_t capacity = core_->arena().capacity();
    return MemoryInfo{capacity - core_->arena().allocatedBytes(), capacity};
  }

  Result<std::unique_ptr<Module>> loadModule(std::span<const std::byte> image) override {
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    const int index = core_->index();
    if (protocol::moduleImageKind(image) != protocol::ModuleImageKind::kPtx) {
      spdlog::warn(
          "sim device {}: refusing a cubin/fatbin module image: the sim backend runs PTX only "
          "(kernels as CPU twins); build the kernels to PTX or use the cuda backend",
          index);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!ptx::looksLikePtx(image)) {
      spdlog::warn("sim device {}: module image is neither PTX nor cubin/fatbin", index);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    const ptx::PtxParseResult parsed = ptx::parsePtx(image);
    if (!parsed.ok()) {
      spdlog::warn("sim device {}: malformed PTX: {}", index, parsed.error);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    std::map<std::string, std::unique_ptr<SimFunction>, std::less<>> functions;
    for (const ptx::PtxEntry& entry : parsed.module.entries) {
      const Twin* twin = findTwin(entry.name);
      if (twin == nullptr) {
        spdlog::warn("sim device {}: kernel '{}' has no CPU twin; the sim backend can run only: {}",
                     index, entry.name, twinNames());
        return CUDA_ERROR_NOT_FOUND;
      }
      bool matches = entry.parameters.size() == twin->parameterSizes.size();
      for (std::size_t i = 0; matches && i < entry.parameters.size(); ++i) {
        matches = entry.parameters[i].size == twin->parameterSizes[i];
      }
      if (!matches) {
        spdlog::warn(
            "sim device {}: kernel '{}' in the PTX has a parameter list that differs from its CPU "
            "twin's (see tests/programs/kernels/test_kernels.cu)",
            index, entry.name);
        return CUDA_ERROR_INVALID_IMAGE;
      }
      auto data = std::make_shared<FunctionData>();
      data->name = entry.name;
      data->twin = twin;
      data->info.parameterBytes = entry.parameterBytes;
      for (const ptx::PtxParameter& parameter : entry.parameters) {
        data->info.parameters.push_back({parameter.offset, parameter.size});
      }
      data->info.maxThreadsPerBlock = static_cast<int>(kMaxThreadsPerBlock);
      data->info.sharedSizeBytes = 0;
      data->info.numRegs = kRegistersPerThread;
      functions.emplace(entry.name, std::make_unique<SimFunction>(std::move(data), *core_));
    }
    return std::unique_ptr<Module>(std::make_unique<SimModule>(std::move(functions), image.size()));
  }

  Result<std::unique_ptr<Stream>> createStream(unsigned flags, int priority) override {
    return createStreamFor(backend::TenantClass::kBestEffort, flags, priority);
  }

  // The class is not modelled (there is no SM partition on sim), and neither is the priority:
  // the engine runs ops in submission order. The priority is clamped and kept, as CUDA keeps it,
  // so that what the dispatcher chose can be seen.
  Result<std::unique_ptr<Stream>> createStreamFor(backend::TenantClass /*workClass*/,
                                                  unsigned flags, int priority) override {
    if ((flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult status = core_->usable(); status != CUDA_SUCCESS) return status;
    const int clamped = std::clamp(priority, kSimGreatestPriority, kSimLeastPriority);
    return std::unique_ptr<Stream>(std::make_unique<SimStream>(core_, clamped));
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
  CUresult reset() override { return core_->reset(); }

private:
  DeviceProperties properties_;
  std::shared_ptr<DeviceCore> core_;
};

class SimBackend final : public backend::Backend {
public:
  explicit SimBackend(const SimOptions& options)
      : devices_(options.devices),
        memoryBytes_(options.memoryBytes / kAllocationAlignment * kAllocationAlignment) {}

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
    std::unique_ptr<DeviceArena> arena = DeviceArena::create(base, memoryBytes_);
    if (!arena) {
      spdlog::error("sim device {}: cannot reserve {} bytes of address space for device memory",
                    index, memoryBytes_);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return std::unique_ptr<Device>(
        std::make_unique<SimDevice>(index, memoryBytes_, std::move(arena)));
  }

private:
  const int devices_;
  const std::uint64_t memoryBytes_;
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
  return std::make_unique<SimBackend>(options);
}

}  // namespace gpuproxy::server::sim
