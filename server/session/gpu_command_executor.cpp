#include "server/session/gpu_command_executor.hpp"

#include "protocol/limits.hpp"
#include "protocol/overloaded.hpp"
#include "server/session/record_answers.hpp"
#include "server/session/tell_session.hpp"

#include <spdlog/spdlog.h>

#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

namespace gpuproxy::server {

namespace ring = protocol::ring;

namespace {

backend::LaunchConfig configOf(const ring::LaunchKernel& launch) {
  return backend::LaunchConfig{backend::Dim3{launch.grid.x, launch.grid.y, launch.grid.z},
                               backend::Dim3{launch.block.x, launch.block.y, launch.block.z},
                               launch.sharedMemBytes, launch.cooperative};
}

// The device-only commands (no host memory, no answer but a failure) as the stream operations
// the backends run (server/backend/stream_operation.hpp).
backend::MemoryOperation toOperation(const ring::CopyDeviceToDevice& copy) {
  return backend::CopyDeviceToDevice{copy.destination, copy.source, copy.bytes};
}
backend::MemoryOperation toOperation(const ring::Memset& memset) {
  return backend::Memset{memset.destination, memset.value, memset.elementSize, memset.count};
}
backend::MemoryOperation toOperation(const ring::Memset2D& memset) {
  return backend::Memset2D{memset.destination, memset.pitch, memset.value,
                           memset.elementSize, memset.width, memset.height};
}

// The pinned-heap range a record names (its source or destination in the client's pinned heap),
// if it names one.
std::optional<std::pair<std::uint64_t, std::uint64_t>> pinnedHeapRangeOf(
    const ring::DecodedCommand& command) {
  auto inHeap = [](const ring::HostLocation& location,
                   std::uint64_t bytes) -> std::optional<std::pair<std::uint64_t, std::uint64_t>> {
    if (location.region != ring::HostRegion::kPinnedHeap) return std::nullopt;
    return std::pair{location.offset, bytes};
  };
  if (const auto* copy = std::get_if<ring::CopyHostToDevice>(&command)) {
    return inHeap(copy->source, copy->bytes);
  }
  if (const auto* copy = std::get_if<ring::CopyDeviceToHost>(&command)) {
    return inHeap(copy->destination, copy->bytes);
  }
  if (const auto* launch = std::get_if<ring::LaunchKernel>(&command);
      launch != nullptr && launch->parameterReference) {
    return inHeap(*launch->parameterReference, launch->parameterBytes);
  }
  return std::nullopt;
}

}  // namespace

GpuCommandExecutor::GpuCommandExecutor(GpuClient* client, CommandsBeyondOneGpu& session,
                                       kj::Own<const kj::Executor> sessionThread,
                                       std::weak_ptr<const bool> sessionAlive,
                                       std::shared_ptr<ClientStats> stats,
                                       std::shared_ptr<const LivePinnedAllocations> pinned)
    : client_(client),
      session_(session),
      sessionThread_(kj::mv(sessionThread)),
      sessionAlive_(std::move(sessionAlive)),
      stats_(std::move(stats)),
      pinned_(std::move(pinned)),
      tasks_(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {}

// Drops the tasks first: none may answer once this executor is going.
GpuCommandExecutor::~GpuCommandExecutor() noexcept {
  tasks_ = nullptr;
}

std::optional<std::uint32_t> GpuCommandExecutor::deviceOf(const ring::DecodedCommand& command) {
  auto ofStream = [](std::uint64_t context, std::uint64_t stream) {
    return stream == 0 ? server::deviceOf(context, HandleKind::kContext)
                       : server::deviceOf(stream, HandleKind::kStream);
  };
  return std::visit(
      protocol::Overloaded{
          [](const ring::EventRecord& record) {
            return server::deviceOf(record.event, HandleKind::kEvent);
          },
          [&](const ring::StreamWaitEvent& wait) { return ofStream(wait.context, wait.stream); },
          [&](const ring::HostFunction& call) { return ofStream(call.context, call.stream); },
          [&](const ring::HoldForEvent& hold) { return ofStream(hold.context, hold.stream); },
          [](const ring::LetGoAfterEvent& letGo) {
            return server::deviceOf(letGo.event, HandleKind::kEvent);
          },
          [&](const ring::Synchronize& sync) -> std::optional<std::uint32_t> {
            switch (sync.kind) {
              case ring::SynchronizeKind::kStream:
                return ofStream(sync.context, sync.handle);
              case ring::SynchronizeKind::kEvent:
                return server::deviceOf(sync.handle, HandleKind::kEvent);
              case ring::SynchronizeKind::kContext:
                return server::deviceOf(sync.context, HandleKind::kContext);
            }
            return std::nullopt;
          },
          [&](const ring::HostFunctionReturned& returned) {
            return ofStream(returned.context, returned.stream);
          },
          [](const ring::DecodeError&) -> std::optional<std::uint32_t> { return std::nullopt; },
          [](const auto& onContext) {
            return server::deviceOf(onContext.context, HandleKind::kContext);
          },
      },
      command);
}

void GpuCommandExecutor::execute(const ring::DecodedCommand& command, CommandPort& port) {
  // Host memory in the pinned heap is used only inside the client's live pinned allocations:
  // those pages the client has faulted in (its cgroup pays for them) and its tenant is charged
  // for. Any other range is refused as a bad pointer, and the daemon never touches it.
  if (const auto range = pinnedHeapRangeOf(command);
      range && !pinned_->holds(range->first, range->second)) {
    failCommand(port, CUDA_ERROR_INVALID_VALUE, command);
    return;
  }
  guarded(command, port, [&] { executeChecked(command, port); });
}

void GpuCommandExecutor::failInternally(const ring::DecodedCommand& command, CommandPort& port,
                                        const char* what) {
  spdlog::error("pid {}: internal error executing a command record: {}", stats_->identity.pid,
                what);
  failCommand(port, CUDA_ERROR_UNKNOWN, command);
}

void GpuCommandExecutor::executeChecked(const ring::DecodedCommand& command, CommandPort& port) {
  std::visit(
      protocol::Overloaded{
          [&](const ring::LaunchKernel& launch) { executeLaunch(launch, port); },
          [&](const ring::CopyHostToDevice& copy) { executeCopyToDevice(copy, port); },
          [&](const ring::CopyDeviceToHost& copy) { executeCopyToHost(copy, port); },
          [&](const ring::CopyDeviceToDevice& copy) { executeOnDevice(copy, port); },
          [&](const ring::Memset& memset) { executeOnDevice(memset, port); },
          [&](const ring::Memset2D& memset) { executeOnDevice(memset, port); },
          [&](const ring::EventRecord& record) {
            GpuClient* client = clientFor(record.event, HandleKind::kEvent);
            report(port,
                   client == nullptr
                       ? CUDA_ERROR_INVALID_HANDLE
                       : client->recordEvent(record.context, record.event, record.stream),
                   record);
          },
          [&](const ring::StreamWaitEvent& wait) { report(port, streamWaitEvent(wait), wait); },
          [&](const ring::Synchronize& sync) { executeSynchronize(sync, port); },
          [&](const ring::HostFunction& call) { executeHostFunction(call, port); },
          [&](const ring::HostFunctionReturned& returned) { openHostGate(returned.token); },
          [&](const ring::HoldForEvent& hold) {
            report(port, holdForAnotherGpu(hold.context, hold.stream, hold.token), hold);
          },
          [&](const ring::LetGoAfterEvent& letGo) { executeLetGoAfterEvent(letGo, port); },
          [&](const ring::DecodeError& error) { executeDecodeError(error, port); },
      },
      command);
}

template <typename Command>
void GpuCommandExecutor::executeOnDevice(const Command& command, CommandPort& port) {
  GpuClient* client = clientFor(command.context, HandleKind::kContext);
  report(port,
         client == nullptr ? CUDA_ERROR_INVALID_CONTEXT
                           : client->enqueue(command.context, command.stream, toOperation(command)),
         command);
}

void GpuCommandExecutor::executeLaunch(const ring::LaunchKernel& launch, CommandPort& port) {
  std::span<const std::byte> parameters = launch.inlineParameters;
  std::vector<std::byte> copied;
  if (launch.parameterReference) {
    auto bytes = port.hostBytes(*launch.parameterReference, launch.parameterBytes);
    copied.assign(bytes.begin(), bytes.end());
    parameters = copied;
    if (launch.parameterReference->region == ring::HostRegion::kStaging) {
      port.postStagingRelease(launch.parameterReference->offset, launch.parameterBytes);
    }
  }
  GpuClient* client = clientFor(launch.context, HandleKind::kContext);
  CUresult result = CUDA_ERROR_INVALID_CONTEXT;
  if (client != nullptr) {
    result = handleDevice(launch.function) != client->deviceIndex()
                 ? CUDA_ERROR_INVALID_HANDLE
                 : client->launchKernel(launch.context, launch.function, configOf(launch),
                                        launch.stream, parameters);
  }
  report(port, result, launch);
}

void GpuCommandExecutor::executeCopyToDevice(const ring::CopyHostToDevice& copy,
                                             CommandPort& port) {
  GpuClient* client = clientFor(copy.context, HandleKind::kContext);
  if (copy.source.region == ring::HostRegion::kPinnedHeap && client != nullptr) {
    // DMA straight from the application's pinned buffer, which the port's keep-alive keeps mapped
    // until the copy is over; answered when it is.
    kj::Promise<CUresult> done =
        client->copyHostToDeviceFrom(copy.context, copy.stream, copy.destination,
                                     port.hostBytes(copy.source, copy.bytes), port.keepAlive());
    tasks_->add(done.then([port = port.shared_from_this(), copy](CUresult result) {
      answer(*port, result, copy.completionToken, copy);
    }));
    return;
  }
  CUresult result = CUDA_ERROR_INVALID_CONTEXT;
  kj::Promise<CUresult> read = nullptr;
  if (client != nullptr) {
    // Straight from the staging range (or the call's payload) too: moving the client's bytes into
    // a buffer of the daemon's own would be done on this thread, the loop every client waits on.
    // A staging range goes back to the client once the backend has read it; the caller's own
    // buffer was free again once the stub had filled the range, so a waiting caller is answered
    // now (CUDA's pageable semantics).
    // Bytes of a call's payload stay in the daemon until the copy has read them: they count
    // against the client's bound on queued work.
    const std::uint64_t held = copy.source.region == ring::HostRegion::kMessage ? copy.bytes : 0;
    result = client->queueHostToDeviceFrom(copy.context, copy.stream, copy.destination,
                                           port.hostBytes(copy.source, copy.bytes),
                                           port.keepAlive(), held, read);
  }
  if (copy.source.region == ring::HostRegion::kStaging) {
    const std::uint64_t offset = copy.source.offset;
    const std::uint64_t bytes = copy.bytes;
    if (result == CUDA_SUCCESS) {
      tasks_->add(read.then([port = port.shared_from_this(), offset, bytes](CUresult) {
        port->postStagingRelease(offset, bytes);
      }));
    } else {
      port.postStagingRelease(offset, bytes);
    }
  } else if (result == CUDA_SUCCESS) {
    // The payload stays alive through the keep-alive the backend's callback holds.
    read.detach([](kj::Exception&&) {});
  }
  answer(port, result, copy.completionToken, copy);
}

void GpuCommandExecutor::executeCopyToHost(const ring::CopyDeviceToHost& copy, CommandPort& port) {
  GpuClient* client = clientFor(copy.context, HandleKind::kContext);
  if (client == nullptr) {
    answer(port, CUDA_ERROR_INVALID_CONTEXT, copy.completionToken, copy);
    return;
  }
  // Straight into the client's staging area, pinned buffer or the call's payload: no copy in the
  // daemon.
  kj::Promise<CUresult> done =
      client->copyDeviceToHostInto(copy.context, copy.stream, copy.source,
                                   port.hostBytes(copy.destination, copy.bytes), port.keepAlive());
  tasks_->add(done.then([this, port = port.shared_from_this(), copy](CUresult result) {
    // A blocking copy synchronises: what the client's kernels printed comes first.
    if (copy.completionToken != 0) collectDeviceOutput(*port);
    answer(*port, result, copy.completionToken, copy);
  }));
}

void GpuCommandExecutor::executeHostFunction(const ring::HostFunction& call, CommandPort& port) {
  // Answered when due: in the completion ring, or in the answer of the Session.submit call that
  // carried it (which then waits, as for a Synchronize).
  const std::uint64_t token = call.completionToken;
  CUresult missing = CUDA_SUCCESS;
  GpuClient* client = clientForStream(call.context, call.stream, missing);
  if (client == nullptr) {
    port.postCompletion(token, missing);
    return;
  }
  // A token names one host function of the client's on this GPU (the stub never uses one twice);
  // the bound on those pending is each GPU's.
  if (client->holdsForHostFunction(token) ||
      client->hostFunctionsPending() >= protocol::kMaxPendingHostFunctions) {
    port.postCompletion(token, CUDA_ERROR_INVALID_VALUE);
    return;
  }
  GpuClient::StreamHold hold = client->holdStreamForHostFunction(call.context, call.stream, token);
  if (hold.result != CUDA_SUCCESS) {
    port.postCompletion(token, hold.result);
    return;
  }
  tasks_->add(hold.reached.then([port = port.shared_from_this(), token](CUresult status) {
    port->postCompletion(token, status);
  }));
}

void GpuCommandExecutor::openHostGate(std::uint64_t token) {
  // A token that holds nothing here (answered with an error, opened already, a stream of another
  // GPU named) changes nothing.
  if (client_ != nullptr) client_->hostFunctionReturned(token);
}

void GpuCommandExecutor::executeDecodeError(const ring::DecodeError& error, CommandPort& port) {
  if (error.disconnect) {
    // Our bug: whoever framed the record ends the connection instead (CommandsBeyondOneGpu).
    throw std::logic_error("a record that breaks the format reached a GPU's executor");
  }
  if (error.completionToken != 0) {
    port.postCompletion(error.completionToken, error.result);
  } else {
    port.postAsyncError(
        ring::AsyncError{error.sequence, error.context, error.stream, error.result, error.opcode});
  }
}

void GpuCommandExecutor::executeSynchronize(const ring::Synchronize& sync, CommandPort& port) {
  const std::uint64_t token = sync.completionToken;
  // Answers `token` once `promise` resolves.
  auto answerLater = [&](kj::Promise<CUresult> promise) {
    tasks_->add(promise.then([this, port = port.shared_from_this(), token](CUresult result) {
      // What the client's kernels printed is printed before the synchronisation returns.
      collectDeviceOutput(*port);
      port->postCompletion(token, result);
    }));
  };
  switch (sync.kind) {
    case ring::SynchronizeKind::kStream: {
      CUresult missing;
      GpuClient* client = clientForStream(sync.context, sync.handle, missing);
      if (client == nullptr) {
        port.postCompletion(token, missing);
      } else if (sync.query) {
        port.postCompletion(token, client->queryStream(sync.context, sync.handle));
      } else {
        answerLater(client->synchronizeStream(sync.context, sync.handle));
      }
      return;
    }
    case ring::SynchronizeKind::kEvent: {
      GpuClient* client = clientFor(sync.handle, HandleKind::kEvent);
      if (client == nullptr) {
        port.postCompletion(token, CUDA_ERROR_INVALID_HANDLE);
      } else if (sync.query) {
        port.postCompletion(token, client->queryEvent(sync.handle));
      } else {
        answerLater(client->synchronizeEvent(sync.handle));
      }
      return;
    }
    case ring::SynchronizeKind::kContext: {
      GpuClient* client = clientFor(sync.context, HandleKind::kContext);
      if (client == nullptr) {
        port.postCompletion(token, CUDA_ERROR_INVALID_CONTEXT);
      } else if (sync.query) {
        port.postCompletion(token, CUDA_ERROR_NOT_SUPPORTED);
      } else {
        answerLater(client->synchronizeContext(sync.context));
      }
      return;
    }
  }
  port.postCompletion(token, CUDA_ERROR_INVALID_VALUE);
}

CUresult GpuCommandExecutor::streamWaitEvent(const ring::StreamWaitEvent& wait) {
  CUresult missing;
  GpuClient* client = clientForStream(wait.context, wait.stream, missing);
  if (client == nullptr) return missing;
  if (wait.flags != 0 && wait.flags != CU_EVENT_WAIT_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
  // Another GPU's event is waited for as HoldForEvent and LetGoAfterEvent, never here.
  if (!client->ownsEvent(wait.event)) return CUDA_ERROR_INVALID_HANDLE;
  return client->streamWaitEvent(wait.context, wait.stream, wait.event);
}

CUresult GpuCommandExecutor::holdForAnotherGpu(Handle context, Handle stream, std::uint64_t token) {
  // Taken whatever the hold's fate, so that no early let-go stays behind.
  const bool doneAlready = letGoEarly_.erase(token) != 0;
  CUresult missing;
  GpuClient* client = clientForStream(context, stream, missing);
  if (client == nullptr) return missing;
  if (doneAlready) return CUDA_SUCCESS;  // the event's record was done first
  if (heldForAnotherGpu_.count(token) != 0 ||
      heldForAnotherGpu_.size() >= protocol::kMaxPendingWaitsForOtherGpus) {
    return CUDA_ERROR_INVALID_VALUE;  // a token in use, or too many holds
  }
  // Held as for a host function: the stream's later work waits behind a gate of this GPU's.
  const GpuClient::HoldForAnotherGpu held = client->holdStreamForAnotherGpu(context, stream);
  if (held.result == CUDA_SUCCESS) heldForAnotherGpu_[token] = held.hold;
  return held.result;
}

void GpuCommandExecutor::letGoOfHold(std::uint64_t token) {
  if (client_ == nullptr) return;
  auto held = heldForAnotherGpu_.find(token);
  if (held == heldForAnotherGpu_.end()) {
    // Remembered for a hold still to come, but only so many: past that the oldest (the stub's
    // tokens only grow) is forgotten, and a hold that comes for it waits until the client goes.
    if (letGoEarly_.size() >= protocol::kMaxPendingWaitsForOtherGpus) {
      letGoEarly_.erase(letGoEarly_.begin());
    }
    letGoEarly_.insert(token);
    return;
  }
  client_->anotherGpusEventDone(held->second);
  heldForAnotherGpu_.erase(held);
}

CUresult GpuCommandExecutor::afterLatestRecord(Handle event, kj::Function<void()> then) {
  GpuClient* client = clientFor(event, HandleKind::kEvent);
  if (client == nullptr || !client->ownsEvent(event)) return CUDA_ERROR_INVALID_HANDLE;
  // The event's latest record as of now, as CUDA promises: a later record does not count.
  auto letGo = std::make_shared<kj::Function<void()>>(std::move(then));
  tasks_->add(client->synchronizeEvent(event).then([letGo](CUresult) { (*letGo)(); },
                                                   [letGo](kj::Exception&&) { (*letGo)(); }));
  return CUDA_SUCCESS;
}

void GpuCommandExecutor::executeLetGoAfterEvent(const ring::LetGoAfterEvent& letGo,
                                                CommandPort& port) {
  // By a message to the session's thread, whose tables say where the waiting stream is; the
  // session may be gone by then (this executor's tasks go later, on its GPU).
  auto tell =
      std::make_shared<kj::Function<void()>>([sessionThread = sessionThread_->addRef(),
                                              &session = session_, alive = sessionAlive_, letGo]() {
        tellSession(
            *sessionThread, alive, [&session, letGo] { session.letGoElsewhere(letGo); },
            "a let-go for another GPU did not reach its session");
      });
  const CUresult result = afterLatestRecord(letGo.event, [tell] { (*tell)(); });
  if (result == CUDA_SUCCESS) return;
  // Nothing to wait for: the stream goes on, and hears why at its next synchronisation.
  (*tell)();
  port.postAsyncError(ring::AsyncError{letGo.sequence, letGo.waiterContext, letGo.waiterStream,
                                       result,
                                       static_cast<std::uint16_t>(ring::LetGoAfterEvent::kOpcode)});
}

void GpuCommandExecutor::collectDeviceOutput(CommandPort& port) {
  // This GPU's: CUDA prints a context's output at that context's synchronisations.
  const std::size_t waiting = client_ == nullptr ? 0 : client_->collectDeviceOutput();
  if (waiting > 0) port.postDeviceOutput(waiting);
}

GpuClient* GpuCommandExecutor::clientFor(std::uint64_t handle, HandleKind kind) const {
  if (client_ == nullptr) return nullptr;
  const std::optional<std::uint32_t> device = server::deviceOf(handle, kind);
  return device == client_->deviceIndex() ? client_ : nullptr;
}

GpuClient* GpuCommandExecutor::clientForStream(std::uint64_t context, std::uint64_t stream,
                                               CUresult& missing) const {
  missing = stream == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
  return stream == 0 ? clientFor(context, HandleKind::kContext)
                     : clientFor(stream, HandleKind::kStream);
}

void GpuCommandExecutor::taskFailed(kj::Exception&& exception) {
  spdlog::warn("pid {}: ring command failed: {}", stats_->identity.pid,
               exception.getDescription().cStr());
}

}  // namespace gpuproxy::server
