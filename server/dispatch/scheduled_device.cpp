#include "server/dispatch/scheduled_device.hpp"

#include "server/dispatch/stream_priority.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>
#include <variant>

namespace gpuproxy::server::dispatch {

namespace {

scheduler::TenantSpec specOf(const Tenant& tenant) {
  const Tenant::SchedulingTerms terms = tenant.schedulingTerms();
  return scheduler::TenantSpec{std::max<std::uint32_t>(terms.weight, 1), terms.tenantClass};
}

bool sameSpec(const scheduler::TenantSpec& a, const scheduler::TenantSpec& b) {
  return a.weight == b.weight && a.tenantClass == b.tenantClass;
}

}  // namespace

std::unique_ptr<scheduler::Scheduler> newScheduler(const DispatchOptions& options) {
  if (options.name == "fair") return scheduler::newFairScheduler(options.config);
  if (options.name == "fifo") return scheduler::newFifoScheduler(options.config);
  throw std::invalid_argument("unknown scheduler '" + options.name + "' (fair or fifo)");
}

// ---------------------------------------------------------------------------------------------
// State shared between the proxies and the dispatcher

struct ScheduledDevice::Operation {
  struct Launch {
    backend::Function* function;
    backend::LaunchConfig config;
    std::vector<std::byte> parameters;
    backend::KernelCallback done;
    std::optional<scheduler::ItemId> item;  // once it is a scheduler item
  };
  struct Record {
    std::shared_ptr<EventState> event;
    std::uint64_t sequence;  // this record's number on its event
  };
  struct Wait {
    std::shared_ptr<EventState> event;
    std::uint64_t sequence;   // the record it waits for (0: none)
    bool registered = false;  // listed in event->blocked
  };
  struct Callback {
    backend::CompletionCallback done;
  };
  std::variant<backend::MemoryOperation, Launch, Record, Wait, Callback> body;
};

struct ScheduledDevice::StreamState {
  scheduler::StreamId id = 0;
  StreamOwner owner;
  std::unique_ptr<backend::Stream> real;
  backend::TenantClass workClass = backend::TenantClass::kBestEffort;
  int requestedPriority = 0;  // the client's, clamped to the device's range
  // Operations not yet on the real stream, in order.
  std::deque<Operation> held;
  // How many operations at the front of `held` have been looked at: their kernels are scheduler
  // items. The look stops at a wait for a record still held: kernels behind it become items only
  // once it is satisfied, so that an item the scheduler hands out can always be submitted.
  std::size_t scanned = 0;
  bool released = false;  // its proxy is gone; dropped once `held` is empty
  // An error of held work that had no callback to report it; the next query or callback does.
  CUresult deferredError = CUDA_SUCCESS;
};

struct ScheduledDevice::EventState {
  std::unique_ptr<backend::Event> real;
  std::uint64_t recorded = 0;  // records issued on the proxy
  std::uint64_t released = 0;  // ... of which have reached a real stream (or failed)
  // whenComplete() callbacks for a record still held: (record number, callback).
  std::vector<std::pair<std::uint64_t, backend::CompletionCallback>> waiters;
  // Streams whose head waits for a record still held: (stream, record number it waits for).
  // Each such wait is listed once, so it stays listed until that very record is released, even
  // when earlier records of the event are released first.
  std::vector<std::pair<std::weak_ptr<StreamState>, std::uint64_t>> blocked;

  bool holding() const { return released < recorded; }
};

namespace {

// An error the stream owes its caller is reported by its next callback, once, as CUDA reports an
// asynchronous error at the next synchronising call.
backend::CompletionCallback reportingDeferred(CUresult& deferred,
                                              backend::CompletionCallback done) {
  if (deferred == CUDA_SUCCESS || !done) return done;
  CUresult error = std::exchange(deferred, CUDA_SUCCESS);
  return [error, done = std::move(done)](CUresult status) {
    done(status == CUDA_SUCCESS ? error : status);
  };
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Proxies

class ScheduledDevice::ProxyEvent final : public backend::Event {
public:
  ProxyEvent(ScheduledDevice& device, std::shared_ptr<EventState> state)
      : device_(device), state_(std::move(state)) {}

  CUresult query() override {
    if (state_->holding()) {
      CUresult sticky = device_.stickyError();
      return sticky != CUDA_SUCCESS ? sticky : CUDA_ERROR_NOT_READY;
    }
    return state_->real->query();
  }

  void whenComplete(backend::CompletionCallback done) override {
    if (state_->holding()) {
      state_->waiters.emplace_back(state_->recorded, std::move(done));
      return;
    }
    state_->real->whenComplete(std::move(done));
  }

  backend::Result<float> elapsedSince(backend::Event& start) override {
    auto* other = dynamic_cast<ProxyEvent*>(&start);
    if (other == nullptr || &other->device_ != &device_) return CUDA_ERROR_INVALID_HANDLE;
    if (state_->holding() || other->state_->holding()) return CUDA_ERROR_NOT_READY;
    return state_->real->elapsedSince(*other->state_->real);
  }

  const std::shared_ptr<EventState>& state() const { return state_; }
  const ScheduledDevice& device() const { return device_; }

private:
  ScheduledDevice& device_;
  std::shared_ptr<EventState> state_;
};

class ScheduledDevice::ProxyStream final : public backend::Stream {
public:
  ProxyStream(ScheduledDevice& device, std::shared_ptr<StreamState> state)
      : device_(device), state_(std::move(state)) {}
  ~ProxyStream() override { device_.release(state_); }
  ProxyStream(const ProxyStream&) = delete;
  ProxyStream& operator=(const ProxyStream&) = delete;

  CUresult enqueue(const backend::MemoryOperation& operation) override {
    if (CUresult checked = backend::checkOperation(operation); checked != CUDA_SUCCESS) {
      return checked;
    }
    return device_.push(state_, Operation{operation});
  }

  CUresult launch(backend::Function& function, const backend::LaunchConfig& config,
                  std::span<const std::byte> parameters, backend::KernelCallback done) override {
    if (CUresult checked = device_.checkLaunch(function, config); checked != CUDA_SUCCESS) {
      return checked;
    }
    return device_.push(
        state_, Operation{Operation::Launch{
                    &function, config, std::vector<std::byte>(parameters.begin(), parameters.end()),
                    std::move(done), std::nullopt}});
  }

  CUresult record(backend::Event& event) override {
    auto* proxy = dynamic_cast<ProxyEvent*>(&event);
    if (proxy == nullptr || &proxy->device() != &device_) return CUDA_ERROR_INVALID_HANDLE;
    const std::shared_ptr<EventState>& state = proxy->state();
    return device_.push(state_, Operation{Operation::Record{state, ++state->recorded}});
  }

  CUresult wait(backend::Event& event) override {
    auto* proxy = dynamic_cast<ProxyEvent*>(&event);
    if (proxy == nullptr || &proxy->device() != &device_) return CUDA_ERROR_INVALID_HANDLE;
    const std::shared_ptr<EventState>& state = proxy->state();
    return device_.push(state_, Operation{Operation::Wait{state, state->recorded}});
  }

  CUresult addCallback(backend::CompletionCallback done) override {
    return device_.push(state_, Operation{Operation::Callback{std::move(done)}});
  }

  CUresult query() override {
    if (!state_->held.empty()) {
      CUresult sticky = device_.stickyError();
      return sticky != CUDA_SUCCESS ? sticky : CUDA_ERROR_NOT_READY;
    }
    CUresult status = state_->real->query();
    if (status == CUDA_SUCCESS && state_->deferredError != CUDA_SUCCESS) {
      return std::exchange(state_->deferredError, CUDA_SUCCESS);
    }
    return status;
  }

  // What the client asked for, clamped as CUDA would; the band it runs in is the daemon's policy
  // (placement()), not something the client's program should see.
  int priority() const override { return state_->requestedPriority; }

  const StreamState& state() const { return *state_; }
  const std::shared_ptr<StreamState>& sharedState() const { return state_; }
  const ScheduledDevice& device() const { return device_; }

private:
  ScheduledDevice& device_;
  std::shared_ptr<StreamState> state_;
};

// ---------------------------------------------------------------------------------------------
// The device

void ScheduledDevice::ErrorHandler::taskFailed(kj::Exception&& exception) {
  spdlog::error("dispatcher: {}", exception.getDescription().cStr());
}

ScheduledDevice::ScheduledDevice(std::unique_ptr<backend::Device> device,
                                 std::unique_ptr<scheduler::Scheduler> scheduler, kj::Timer& timer)
    : device_(std::move(device)), scheduler_(std::move(scheduler)), timer_(timer) {
  // The daemon's own streams (no client) share the GPU as one weight-1 best-effort tenant.
  scheduler_->setTenant(0, scheduler::TenantSpec{});
  const backend::DeviceProperties& properties = device_->properties();
  maxBlock_ = {static_cast<unsigned>(properties.attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)),
               static_cast<unsigned>(properties.attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)),
               static_cast<unsigned>(properties.attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z))};
  maxGrid_ = {static_cast<unsigned>(properties.attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)),
              static_cast<unsigned>(properties.attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)),
              static_cast<unsigned>(properties.attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z))};
  maxThreadsPerBlock_ =
      static_cast<unsigned>(properties.attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
}

ScheduledDevice::~ScheduledDevice() {
  abandonAll(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  streams_.clear();
  ready_.clear();
}

scheduler::Nanos ScheduledDevice::now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

backend::MemoryInfo ScheduledDevice::memoryInfo() {
  return backend().memoryInfo();
}

CUresult ScheduledDevice::stickyError() {
  return backend().stickyError();
}

kj::Function<CUresult()> ScheduledDevice::beginReset() {
  KJ_ASSERT(!resetting_, "a reset began while another was under way");
  abandonAll(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  // Real streams made before a reset are invalid after it; only drained, released ones can be
  // left here (the caller dropped every proxy), and nothing of theirs is held any more.
  std::erase_if(streams_, [](const auto& entry) { return entry.second->released; });
  resetting_ = true;
  return [device = device_.get()]() { return device->reset(); };
}

void ScheduledDevice::finishReset() {
  KJ_ASSERT(resetting_, "finishReset without beginReset");
  resetting_ = false;
}

CUresult ScheduledDevice::reset() {
  const CUresult status = beginReset()();
  finishReset();
  return status;
}

backend::Result<std::unique_ptr<backend::Stream>> ScheduledDevice::createStream(unsigned flags,
                                                                                int priority) {
  return createStream(StreamOwner{}, flags, priority);
}

backend::Result<std::unique_ptr<backend::Stream>> ScheduledDevice::createStream(
    const StreamOwner& owner, unsigned flags, int priority) {
  // The class is read now: a stream keeps the band and partition it was made in, so a tenant
  // whose class changes gets the new one for the streams its clients make afterwards.
  // The client's kernels run in its own address space (the sim lets them touch only its memory).
  return makeStream(
      owner, owner.tenant ? owner.tenant->schedulingTerms().tenantClass : TenantClass::kBestEffort,
      flags, priority, owner.addressSpace);
}

backend::Result<std::unique_ptr<backend::Stream>> ScheduledDevice::createStreamFor(
    backend::TenantClass workClass, unsigned flags, int priority, backend::AddressSpace owner) {
  return makeStream(StreamOwner{}, workClass, flags, priority, owner);
}

backend::Result<std::unique_ptr<backend::Stream>> ScheduledDevice::makeStream(
    const StreamOwner& owner, backend::TenantClass workClass, unsigned flags, int priority,
    backend::AddressSpace addressSpace) {
  const backend::StreamPriorityRange range = backend().streamPriorityRange();
  auto real = backend().createStreamFor(workClass, flags,
                                        devicePriority(range, workClass, priority), addressSpace);
  if (!real.ok()) return real.code();
  auto state = std::make_shared<StreamState>();
  state->id = nextStreamId_++;
  state->owner = owner;
  state->real = std::move(real).value();
  state->workClass = workClass;
  state->requestedPriority = clampToRange(range, priority);
  streams_.emplace(state->id, state);
  return std::unique_ptr<backend::Stream>(std::make_unique<ProxyStream>(*this, std::move(state)));
}

std::optional<StreamPlacement> ScheduledDevice::placement(const backend::Stream& stream) const {
  const auto* proxy = dynamic_cast<const ProxyStream*>(&stream);
  if (proxy == nullptr) return std::nullopt;
  const StreamState& state = proxy->state();
  return StreamPlacement{state.workClass, state.real->priority(), state.requestedPriority};
}

backend::Result<std::unique_ptr<backend::Event>> ScheduledDevice::createEvent(unsigned flags) {
  auto real = backend().createEvent(flags);
  if (!real.ok()) return real.code();
  auto state = std::make_shared<EventState>();
  state->real = std::move(real).value();
  return std::unique_ptr<backend::Event>(std::make_unique<ProxyEvent>(*this, std::move(state)));
}

CUresult ScheduledDevice::checkLaunch(const backend::Function& function,
                                      const backend::LaunchConfig& config) const {
  const std::array<unsigned, 3> block{config.block.x, config.block.y, config.block.z};
  const std::array<unsigned, 3> grid{config.grid.x, config.grid.y, config.grid.z};
  for (int i = 0; i < 3; ++i) {
    if (block[i] == 0 || grid[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    if (maxBlock_[i] != 0 && block[i] > maxBlock_[i]) return CUDA_ERROR_INVALID_VALUE;
    if (maxGrid_[i] != 0 && grid[i] > maxGrid_[i]) return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t threads = std::uint64_t{block[0]} * block[1] * block[2];
  if (maxThreadsPerBlock_ != 0 && threads > maxThreadsPerBlock_) return CUDA_ERROR_INVALID_VALUE;
  const int functionMax = function.info().maxThreadsPerBlock;
  if (functionMax > 0 && threads > static_cast<std::uint64_t>(functionMax)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Queues

CUresult ScheduledDevice::push(const std::shared_ptr<StreamState>& stream, Operation operation) {
  // New work on a poisoned context fails at once, as the backend would fail it.
  if (CUresult sticky = backend().stickyError(); sticky != CUDA_SUCCESS) {
    if (auto* record = std::get_if<Operation::Record>(&operation.body)) {
      recordReleased(*record->event, record->sequence, sticky);
    }
    return sticky;
  }
  const bool kernel = std::holds_alternative<Operation::Launch>(operation.body);
  const auto* wait = std::get_if<Operation::Wait>(&operation.body);
  const bool waitHeld = wait != nullptr && wait->event->released < wait->sequence;
  if (!kernel && !waitHeld && stream->held.empty()) {
    // Nothing of this stream is held: straight to the real stream, and its launch-time error
    // straight to the caller.
    CUresult status = CUDA_SUCCESS;
    std::visit(
        [&](auto& body) {
          using Body = std::decay_t<decltype(body)>;
          StreamState& s = *stream;
          if constexpr (std::is_same_v<Body, backend::MemoryOperation>) {
            status = s.real->enqueue(body);
          } else if constexpr (std::is_same_v<Body, Operation::Record>) {
            status = s.real->record(*body.event->real);
            recordReleased(*body.event, body.sequence, status);
          } else if constexpr (std::is_same_v<Body, Operation::Wait>) {
            status = s.real->wait(*body.event->real);
          } else if constexpr (std::is_same_v<Body, Operation::Callback>) {
            status = s.real->addCallback(reportingDeferred(s.deferredError, std::move(body.done)));
          }
        },
        operation.body);
    // A record may have released waits held on other streams.
    drainReady();
    pump();
    return status;
  }
  stream->held.push_back(std::move(operation));
  advance(stream);
  return CUDA_SUCCESS;
}

void ScheduledDevice::release(const std::shared_ptr<StreamState>& stream) {
  stream->released = true;
  if (stream->held.empty()) streams_.erase(stream->id);
}

void ScheduledDevice::advance(std::shared_ptr<StreamState> stream) {
  ready_.push_back(std::move(stream));
  drainReady();
  pump();
}

void ScheduledDevice::drainReady() {
  if (advancing_) return;  // the outer call goes on with what was added
  advancing_ = true;
  while (!ready_.empty()) {
    std::shared_ptr<StreamState> stream = std::move(ready_.front());
    ready_.pop_front();
    advanceOne(std::move(stream));
  }
  advancing_ = false;
}

void ScheduledDevice::advanceOne(std::shared_ptr<StreamState> stream) {
  // Everything at the front that needs no decision goes to the real stream.
  while (!stream->held.empty()) {
    Operation& head = stream->held.front();
    if (std::holds_alternative<Operation::Launch>(head.body)) break;
    if (auto* wait = std::get_if<Operation::Wait>(&head.body);
        wait != nullptr && wait->event->released < wait->sequence) {
      break;
    }
    Operation operation = std::move(head);
    stream->held.pop_front();
    if (stream->scanned > 0) --stream->scanned;
    submit(*stream, operation);
  }
  // Every kernel queued since the last look becomes a scheduler item now, in arrival order, so
  // that `fifo` sees the order clients launched in; the scheduler keeps a stream's items in order.
  while (stream->scanned < stream->held.size()) {
    Operation& operation = stream->held[stream->scanned];
    if (auto* wait = std::get_if<Operation::Wait>(&operation.body)) {
      if (wait->event->released < wait->sequence) {
        if (!wait->registered) {
          wait->event->blocked.emplace_back(stream, wait->sequence);
          wait->registered = true;
        }
        break;
      }
    } else if (auto* launch = std::get_if<Operation::Launch>(&operation.body)) {
      const scheduler::ItemId item = nextItemId_++;
      const backend::LaunchConfig& config = launch->config;
      scheduler::WorkItem work;
      work.id = item;
      work.tenant = tenantFor(stream->owner);
      work.client = stream->owner.client;
      work.stream = stream->id;
      work.priority = stream->requestedPriority;
      work.key = scheduler::DurationKey{
          scheduler::WorkKind::kKernel, reinterpret_cast<std::uintptr_t>(launch->function),
          scheduler::launchShape({config.grid.x, config.grid.y, config.grid.z},
                                 {config.block.x, config.block.y, config.block.z},
                                 config.sharedMemBytes)};
      scheduler_->enqueue(work, now());
      launch->item = item;
      queued_.emplace(item, Queued{stream});
    }
    ++stream->scanned;
  }
  if (stream->released && stream->held.empty()) streams_.erase(stream->id);
}

void ScheduledDevice::submit(StreamState& stream, Operation& operation) {
  CUresult status = CUDA_SUCCESS;
  std::visit(
      [&](auto& body) {
        using Body = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<Body, backend::MemoryOperation>) {
          status = stream.real->enqueue(body);
        } else if constexpr (std::is_same_v<Body, Operation::Launch>) {
          // Kernels go through submitKernel; one here is a bug.
          status = CUDA_ERROR_UNKNOWN;
        } else if constexpr (std::is_same_v<Body, Operation::Record>) {
          status = stream.real->record(*body.event->real);
          recordReleased(*body.event, body.sequence, status);
          return;
        } else if constexpr (std::is_same_v<Body, Operation::Wait>) {
          status = stream.real->wait(*body.event->real);
        } else if constexpr (std::is_same_v<Body, Operation::Callback>) {
          backend::CompletionCallback done =
              reportingDeferred(stream.deferredError, std::move(body.done));
          status = stream.real->addCallback(done);
          if (status != CUDA_SUCCESS && done) done(status);
          return;
        }
        if (status != CUDA_SUCCESS && stream.deferredError == CUDA_SUCCESS) {
          stream.deferredError = status;
        }
      },
      operation.body);
  if (status != CUDA_SUCCESS) {
    spdlog::debug("dispatcher: a held operation failed when submitted ({})",
                  static_cast<int>(status));
  }
}

void ScheduledDevice::fail(StreamState& stream, Operation& operation, CUresult status) {
  std::visit(
      [&](auto& body) {
        using Body = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<Body, Operation::Launch>) {
          if (body.done) body.done(status, 0);
        } else if constexpr (std::is_same_v<Body, Operation::Record>) {
          recordReleased(*body.event, body.sequence, status);
        } else if constexpr (std::is_same_v<Body, Operation::Callback>) {
          if (body.done) body.done(status);
        }
      },
      operation.body);
  (void)stream;
}

void ScheduledDevice::submitKernel(StreamState& stream, Operation& operation,
                                   scheduler::ItemId item) {
  auto& launch = std::get<Operation::Launch>(operation.body);
  inFlight_.emplace(item, InFlight{stream.owner.tenant});
  // The completion comes back to this thread through a cross-thread fulfiller; the client's own
  // callback runs on the backend thread as it did without a dispatcher.
  auto paf = kj::newPromiseAndCrossThreadFulfiller<KernelDone>();
  tasks_->add(paf.promise.then([this, item](KernelDone done) { kernelDone(item, done); }));
  struct Pending {
    kj::Own<kj::CrossThreadPromiseFulfiller<KernelDone>> fulfiller;
    backend::KernelCallback done;
  };
  auto pending = std::make_shared<Pending>(Pending{kj::mv(paf.fulfiller), std::move(launch.done)});
  CUresult status =
      stream.real->launch(*launch.function, launch.config, launch.parameters,
                          [pending](CUresult result, std::uint64_t nanoseconds) {
                            if (pending->done) pending->done(result, nanoseconds);
                            pending->fulfiller->fulfill(KernelDone{result, nanoseconds});
                          });
  if (status != CUDA_SUCCESS) {
    // The backend refused it, so its callback will never run: report the failure here.
    if (pending->done) pending->done(status, 0);
    pending->fulfiller->fulfill(KernelDone{status, 0});
    if (stream.deferredError == CUDA_SUCCESS) stream.deferredError = status;
  }
}

struct ScheduledDevice::HostGate {
  std::shared_ptr<EventState> event;  // its one record is promised, made by openHostGate
  bool open = false;
};

backend::Result<std::shared_ptr<ScheduledDevice::HostGate>> ScheduledDevice::pushHostGate(
    backend::Stream& stream, backend::CompletionCallback reached) {
  auto* proxy = dynamic_cast<ProxyStream*>(&stream);
  if (proxy == nullptr || &proxy->device() != this) return CUDA_ERROR_INVALID_HANDLE;
  // The real event is never recorded: once the gate opens, the real stream's wait for it is no
  // wait at all (as for an event never recorded, in CUDA and in both backends).
  auto real = backend().createEvent(CU_EVENT_DISABLE_TIMING);
  if (!real.ok()) return real.code();
  auto gate = std::make_shared<HostGate>();
  gate->event = std::make_shared<EventState>();
  gate->event->real = std::move(real).value();
  gate->event->recorded = 1;
  const std::shared_ptr<StreamState>& state = proxy->sharedState();
  if (CUresult pushed = push(state, Operation{Operation::Callback{std::move(reached)}});
      pushed != CUDA_SUCCESS) {
    return pushed;
  }
  if (CUresult held = push(state, Operation{Operation::Wait{gate->event, 1}});
      held != CUDA_SUCCESS) {
    return held;
  }
  return gate;
}

void ScheduledDevice::openHostGate(HostGate& gate) {
  if (std::exchange(gate.open, true)) return;
  recordReleased(*gate.event, 1, CUDA_SUCCESS);
  drainReady();
  pump();
}

void ScheduledDevice::recordReleased(EventState& event, std::uint64_t sequence, CUresult status) {
  event.released = std::max(event.released, sequence);
  auto waiters = std::move(event.waiters);
  event.waiters.clear();
  for (auto& [number, done] : waiters) {
    if (number > event.released) {
      event.waiters.emplace_back(number, std::move(done));
    } else if (status != CUDA_SUCCESS) {
      if (done) done(status);
    } else {
      event.real->whenComplete(std::move(done));
    }
  }
  auto blocked = std::move(event.blocked);
  event.blocked.clear();
  for (auto& [weak, number] : blocked) {
    if (number > event.released) {
      if (!weak.expired()) event.blocked.emplace_back(std::move(weak), number);
    } else if (auto stream = weak.lock()) {
      ready_.push_back(std::move(stream));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The scheduler

void ScheduledDevice::pump() {
  if (pumping_ || advancing_) return;  // the outer call asks the scheduler again when done
  pumping_ = true;
  scheduler::Nanos time = now();
  while (auto submission = scheduler_->next(time)) {
    auto found = queued_.find(submission->id);
    if (found == queued_.end()) {
      // Nothing to run for it (its stream was abandoned); give its budget back at once.
      scheduler_->complete(submission->id, 0, time);
      continue;
    }
    std::shared_ptr<StreamState> stream = std::move(found->second.stream);
    queued_.erase(found);
    // The scheduler keeps a stream's items in order and everything before the first kernel has
    // been submitted, so the item is the front of its stream's queue.
    auto* launch =
        stream->held.empty() ? nullptr : std::get_if<Operation::Launch>(&stream->held.front().body);
    if (launch == nullptr || launch->item != submission->id) {
      spdlog::error("dispatcher: scheduler item {} is not at the front of its stream",
                    submission->id);
      scheduler_->complete(submission->id, 0, time);
      continue;
    }
    Operation operation = std::move(stream->held.front());
    stream->held.pop_front();
    if (stream->scanned > 0) --stream->scanned;
    submitKernel(*stream, operation, submission->id);
    // What follows the kernel on its stream goes now, up to the next kernel.
    ready_.push_back(std::move(stream));
    drainReady();
    time = now();
  }
  pumping_ = false;
  armWake(time);
}

void ScheduledDevice::armWake(scheduler::Nanos nowNanos) {
  std::optional<scheduler::Nanos> at = scheduler_->wakeAt(nowNanos);
  if (!at) return;
  if (wakeArmedAt_ && *wakeArmedAt_ > nowNanos && *wakeArmedAt_ <= *at) return;  // sooner one armed
  wakeArmedAt_ = *at;
  const scheduler::Nanos delay = std::max<scheduler::Nanos>(*at - nowNanos, 0);
  tasks_->add(timer_.afterDelay(delay * kj::NANOSECONDS).then([this, at = *at]() {
    if (wakeArmedAt_ == at) wakeArmedAt_.reset();
    pump();
  }));
}

void ScheduledDevice::kernelDone(scheduler::ItemId item, KernelDone done) {
  std::shared_ptr<Tenant> tenant;
  if (auto found = inFlight_.find(item); found != inFlight_.end()) {
    tenant = std::move(found->second.tenant);
    inFlight_.erase(found);
  }
  const scheduler::Nanos time = now();
  scheduler_->complete(item, static_cast<scheduler::Nanos>(done.nanoseconds), time);
  if (tenant) tenant->addGpuTime(time, done.nanoseconds);
  pump();
}

scheduler::TenantId ScheduledDevice::tenantFor(const StreamOwner& owner) {
  if (!owner.tenant) return 0;
  const std::shared_ptr<Tenant>& tenant = owner.tenant;
  auto found = tenants_.find(tenant->id());
  const scheduler::TenantSpec spec = specOf(*tenant);
  if (found == tenants_.end()) {
    forgetExpiredTenants();
    const scheduler::TenantId id = nextTenantId_++;
    scheduler_->setTenant(id, spec);
    tenants_.emplace(tenant->id(), TenantEntry{tenant, id, spec});
    return id;
  }
  if (!sameSpec(found->second.spec, spec)) {
    scheduler_->setTenant(found->second.id, spec);
    found->second.spec = spec;
  }
  return found->second.id;
}

void ScheduledDevice::forgetExpiredTenants() {
  for (auto it = tenants_.begin(); it != tenants_.end();) {
    if (it->second.tenant.expired()) {
      scheduler_->removeTenant(it->second.id);
      it = tenants_.erase(it);
    } else {
      ++it;
    }
  }
}

void ScheduledDevice::refreshTenants() {
  forgetExpiredTenants();
  for (auto& [tenantId, entry] : tenants_) {
    auto tenant = entry.tenant.lock();
    if (!tenant) continue;
    const scheduler::TenantSpec spec = specOf(*tenant);
    if (sameSpec(entry.spec, spec)) continue;
    scheduler_->setTenant(entry.id, spec);
    entry.spec = spec;
  }
  pump();
}

DispatchStats ScheduledDevice::stats() const {
  DispatchStats out;
  out.streams = streams_.size();
  for (const auto& [id, stream] : streams_) out.heldOperations += stream->held.size();
  out.kernelsQueued = queued_.size();
  out.kernelsInFlight = inFlight_.size();
  return out;
}

std::size_t ScheduledDevice::abandonClient(scheduler::ClientId client, CUresult status) {
  if (client == 0) return 0;  // the daemon's own streams are never abandoned this way
  for (scheduler::ItemId item : scheduler_->removeClient(client)) queued_.erase(item);
  // Copied first: failing an operation runs callbacks, which may do anything to the map.
  std::vector<std::shared_ptr<StreamState>> streams;
  for (const auto& [id, stream] : streams_) {
    if (stream->owner.client == client && !stream->held.empty()) streams.push_back(stream);
  }
  std::size_t dropped = 0;
  for (const std::shared_ptr<StreamState>& stream : streams) {
    std::deque<Operation> held = std::move(stream->held);
    stream->held.clear();
    stream->scanned = 0;
    for (Operation& operation : held) {
      // Removed from the scheduler above; an item it had already handed out is not held.
      if (auto* launch = std::get_if<Operation::Launch>(&operation.body); launch && launch->item) {
        queued_.erase(*launch->item);
      }
      fail(*stream, operation, status);
      ++dropped;
    }
    if (stream->released) streams_.erase(stream->id);
  }
  // Failed records may have unblocked waits elsewhere; the scheduler may have room now.
  drainReady();
  pump();
  return dropped;
}

std::size_t ScheduledDevice::heldMemoryOperations(backend::Stream& stream) const {
  const auto* proxy = dynamic_cast<const ProxyStream*>(&stream);
  if (proxy == nullptr || &proxy->device() != this) return 0;
  return static_cast<std::size_t>(std::count_if(
      proxy->state().held.begin(), proxy->state().held.end(), [](const Operation& operation) {
        return std::visit(
            [](const auto& body) {
              using Body = std::decay_t<decltype(body)>;
              return std::is_same_v<Body, backend::MemoryOperation> ||
                     std::is_same_v<Body, Operation::Launch>;
            },
            operation.body);
      }));
}

void ScheduledDevice::abandonAll(CUresult status) {
  // The scheduler forgets the queued heads with their tenants, which are then added again.
  std::vector<std::pair<scheduler::TenantId, scheduler::TenantSpec>> known{{0, {}}};
  for (const auto& [tenantId, entry] : tenants_) known.emplace_back(entry.id, entry.spec);
  for (const auto& [id, spec] : known) {
    scheduler_->removeTenant(id);
    scheduler_->setTenant(id, spec);
  }
  queued_.clear();
  // Copied first: failing an operation runs callbacks, which may do anything to the map.
  std::vector<std::shared_ptr<StreamState>> streams;
  for (const auto& [id, stream] : streams_) streams.push_back(stream);
  for (const std::shared_ptr<StreamState>& stream : streams) {
    stream->scanned = 0;
    std::deque<Operation> held = std::move(stream->held);
    stream->held.clear();
    for (Operation& operation : held) fail(*stream, operation, status);
    if (stream->released) streams_.erase(stream->id);
  }
  ready_.clear();
}

}  // namespace gpuproxy::server::dispatch
