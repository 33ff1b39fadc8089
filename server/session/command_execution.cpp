// Command records (protocol/RING_FORMAT.md) of one session, however they come: from the client's
// command ring (its data plane, handed out here) or carried by a Session.submit call. One decoder
// (protocol::ring::decodeCommand) and one executor (ClientSession::execute) serve both; only the
// CommandPort differs, which says where host bytes are and where answers go. An asynchronous
// command that fails becomes an AsyncError the stub reports at the next synchronising call; a
// waited-for command answers its completion token.

#include "ipc/shared_file.hpp"
#include "protocol/limits.hpp"
#include "protocol/overloaded.hpp"
#include "server/data_plane/data_plane.hpp"
#include "server/session/client_session.hpp"

#include <fcntl.h>
#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>
#include <type_traits>
#include <vector>

namespace gpuproxy::server {

namespace ring = protocol::ring;

namespace {

// A SharedFile capability holding a duplicate of `fd` of its own, so that it may outlive the
// session while Cap'n Proto is still sending it.
kj::Own<ipc::SharedFileServer> sharedFileOf(int fd) {
  ipc::UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy) throw std::system_error(errno, std::generic_category(), "dup");
  return kj::heap<ipc::SharedFileServer>(std::move(copy));
}

// One Session.submit call waiting for its client's queued work to shrink, counted for as long as
// it waits.
class WaitingCall {
public:
  explicit WaitingCall(std::shared_ptr<unsigned> count) : count_(std::move(count)) { ++*count_; }
  ~WaitingCall() { --*count_; }
  WaitingCall(const WaitingCall&) = delete;
  WaitingCall& operator=(const WaitingCall&) = delete;

private:
  std::shared_ptr<unsigned> count_;
};

backend::LaunchConfig configOf(const ring::LaunchKernel& launch) {
  return backend::LaunchConfig{backend::Dim3{launch.grid.x, launch.grid.y, launch.grid.z},
                               backend::Dim3{launch.block.x, launch.block.y, launch.block.z},
                               launch.sharedMemBytes, launch.cooperative};
}

}  // namespace

ClientSession::DispatchCallResult ClientSession::dispatchCall(
    std::uint64_t interfaceId, std::uint16_t methodId,
    capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) {
  if (channel_) {
    channel_->pumpAll();
    if (channel_->throttled() && services_.dataPlane != nullptr) {
      // The client may go away while the call waits; its session must not outlive it for that.
      context.allowCancellation();
      return {dispatchAfterRing(interfaceId, methodId, context), false};
    }
  }
  return protocol::Session::Server::dispatchCall(interfaceId, methodId, context);
}

kj::Promise<void> ClientSession::dispatchAfterRing(
    std::uint64_t interfaceId, std::uint16_t methodId,
    capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) {
  std::weak_ptr<bool> alive = alive_;
  return services_.dataPlane->afterThrottledRecheck().then(
      [this, alive, interfaceId, methodId, context]() mutable -> kj::Promise<void> {
        if (alive.expired() || !*alive.lock()) {
          return KJ_EXCEPTION(DISCONNECTED, "the session ended");
        }
        if (channel_) {
          channel_->pumpAll();
          if (channel_->throttled()) return dispatchAfterRing(interfaceId, methodId, context);
        }
        return protocol::Session::Server::dispatchCall(interfaceId, methodId, context).promise;
      });
}

kj::Promise<void> ClientSession::openDataPlane(OpenDataPlaneContext context) {
  auto params = context.getParams();
  auto results = context.getResults();
  if (channel_) {
    results.setResult(CUDA_ERROR_ALREADY_MAPPED);
    return kj::READY_NOW;
  }
  if (services_.dataPlane == nullptr) {
    results.setResult(CUDA_ERROR_NOT_SUPPORTED);
    return kj::READY_NOW;
  }
  ChannelSizes sizes;
  std::optional<ipc::AddressReservation> reservation;
  try {
    if (params.getAddress() != 0) {
      const std::uint64_t page = ipc::pageSize();
      sizes.pinnedHeapBytes =
          (std::min(params.getPinnedHeapBytes(), protocol::kMaxPinnedHeapBytes) + page - 1) / page *
          page;
      const std::uint64_t needed = ClientChannel::segmentBytesFor(sizes);
      results.setSegmentBytes(needed);
      if (params.getAddress() % page != 0 || needed > params.getReservedBytes()) {
        results.setResult(CUDA_ERROR_INVALID_VALUE);
        return kj::READY_NOW;
      }
      try {
        reservation = ipc::AddressReservation::reserveAt(
            reinterpret_cast<void*>(static_cast<std::uintptr_t>(params.getAddress())), needed);
      } catch (const std::system_error& error) {
        // Taken here (or not a usable address at all): the client tries another one.
        spdlog::debug("pid {}: cannot map its data plane at {:#x}: {}", stats_->identity.pid,
                      params.getAddress(), error.what());
        results.setResult(CUDA_ERROR_ALREADY_MAPPED);
        return kj::READY_NOW;
      }
    }
    auto channel =
        std::make_shared<ClientChannel>(static_cast<CommandExecutor&>(*this),
                                        "gpuproxy-client-" + std::to_string(stats_->identity.pid),
                                        sizes, reservation ? &*reservation : nullptr);
    results.setSegment(sharedFileOf(channel->segmentFd()));
    results.setDoorbell(sharedFileOf(channel->doorbellFd()));
    results.setSegmentBytes(channel->segmentBytes());
    results.setPinnedHeapBytes(channel->pinnedHeap().size());
    services_.dataPlane->add(*channel);
    channel_ = std::move(channel);
    results.setResult(CUDA_SUCCESS);
  } catch (const std::exception& error) {
    spdlog::warn("pid {}: cannot set up its data plane: {}", stats_->identity.pid, error.what());
    results.setResult(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return kj::READY_NOW;
}

bool ClientSession::readyForCommands() const {
  return !stats_->queueFull();
}

void ClientSession::taskFailed(kj::Exception&& exception) {
  spdlog::warn("pid {}: ring command failed: {}", stats_->identity.pid,
               exception.getDescription().cStr());
}

void ClientSession::evict(const std::string& reason) {
  // A ring's channel stops reading first and then calls channelBroken; a record that came by
  // Session.submit has no ring to stop.
  if (channel_) {
    channel_->markBroken(reason);
  } else {
    channelBroken(reason);
  }
}

void ClientSession::channelBroken(const std::string& reason) {
  spdlog::warn("pid {} ({}) broke the data-plane format ({}): disconnecting it",
               stats_->identity.pid, stats_->identity.command, reason);
  services_.connections.endConnection(connectionId_);
}

namespace {

// The completion token a command carries (0: none, or a command that has no such field).
std::uint64_t completionTokenOf(const ring::DecodedCommand& command) {
  return std::visit(
      [](const auto& decoded) -> std::uint64_t {
        if constexpr (requires { decoded.completionToken; }) {
          return decoded.completionToken;
        } else {
          return 0;
        }
      },
      command);
}

// The AsyncError that reports `command` failing with `result` at its stream's next
// synchronisation.
template <typename Command>
ring::AsyncError asyncErrorOf(const Command& command, CUresult result) {
  return ring::AsyncError{command.sequence, command.context, command.stream, result,
                          static_cast<std::uint16_t>(Command::kOpcode)};
}

// Reports the outcome of an asynchronous command: nothing on success, an AsyncError otherwise.
template <typename Command>
void report(CommandPort& port, CUresult result, const Command& command) {
  if (result != CUDA_SUCCESS) port.postAsyncError(asyncErrorOf(command, result));
}

// Answers a command someone may wait for: its token if it has one, else as report() does.
template <typename Command>
void answer(CommandPort& port, CUresult result, std::uint64_t token, const Command& command) {
  if (token != 0) {
    port.postCompletion(token, result);
  } else {
    report(port, result, command);
  }
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

}  // namespace

// The CommandPort of one Session.submit call: host bytes of HostRegion::kMessage are the call's
// payload buffer (the staging area and pinned heap, when a record names them, are the session's
// segment's), and answers are collected for the call's result until every completion token in
// the call has been answered. What comes after that (the failure of a copy nobody waits for, a
// staging range to give back) goes to the session's completion ring, or nowhere without one.
class ClientSession::MessagePort final : public CommandPort {
public:
  MessagePort(std::vector<std::byte> payload, std::shared_ptr<ClientChannel> channel)
      : payload_(std::move(payload)), channel_(std::move(channel)) {}
  // kj::Own is declared noexcept(false); dropping an unfulfilled fulfiller only rejects the call.
  ~MessagePort() noexcept override {}
  MessagePort(const MessagePort&) = delete;
  MessagePort& operator=(const MessagePort&) = delete;

  std::span<std::byte> hostBytes(const ring::HostLocation& location, std::uint64_t bytes) override {
    if (location.region == ring::HostRegion::kMessage) {
      if (location.offset > payload_.size() || bytes > payload_.size() - location.offset) {
        throw std::logic_error("host range outside the call's payload reached the executor");
      }
      return {payload_.data() + location.offset, static_cast<std::size_t>(bytes)};
    }
    // Without a segment the decoder gave both regions no bytes.
    if (!channel_) return {};
    return channel_->hostBytes(location, bytes);
  }

  std::shared_ptr<const void> keepAlive() override { return shared_from_this(); }

  void postCompletion(std::uint64_t token, CUresult result) override {
    if (answered_) {
      if (channel_) channel_->postCompletion(token, result);
      return;
    }
    append(ring::Completion{token, result});
    if (pendingTokens_ > 0) --pendingTokens_;
    answerIfDone();
  }

  void postAsyncError(const ring::AsyncError& error) override {
    if (!answered_) {
      append(error);
    } else if (channel_) {
      channel_->postAsyncError(error);
    }
  }

  void postStagingRelease(std::uint64_t offset, std::uint64_t bytes) override {
    if (channel_) channel_->postStagingRelease(offset, bytes);
  }

  void postDeviceOutput(std::uint64_t bytes) override {
    if (!answered_) {
      append(ring::DeviceOutput{bytes});
    } else if (channel_) {
      channel_->postDeviceOutput(bytes);
    }
  }

  // A command about to be executed carries `token` (0: none).
  void expect(std::uint64_t token) {
    if (token != 0) ++pendingTokens_;
  }

  // Resolves once every expected token has been answered. Call after the whole batch was
  // executed.
  kj::Promise<void> whenAnswered() {
    executed_ = true;
    if (pendingTokens_ == 0) {
      answered_ = true;
      return kj::READY_NOW;
    }
    auto paf = kj::newPromiseAndFulfiller<void>();
    fulfiller_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  kj::ArrayPtr<const capnp::byte> completions() const {
    return kj::arrayPtr(reinterpret_cast<const capnp::byte*>(completions_.data()),
                        completions_.size());
  }
  kj::ArrayPtr<const capnp::byte> payload() const {
    return kj::arrayPtr(reinterpret_cast<const capnp::byte*>(payload_.data()), payload_.size());
  }

private:
  template <typename Answer>
  void append(const Answer& answer) {
    std::array<std::byte, ring::kMaxCompletionRecordBytes> record{};
    const std::size_t bytes = ring::encode(answer, record);
    completions_.insert(completions_.end(), record.begin(), record.begin() + bytes);
  }

  void answerIfDone() {
    if (!executed_ || pendingTokens_ > 0 || answered_) return;
    answered_ = true;
    if (fulfiller_) fulfiller_->fulfill();
  }

  std::vector<std::byte> payload_;
  std::shared_ptr<ClientChannel> channel_;
  std::vector<std::byte> completions_;
  std::uint64_t pendingTokens_ = 0;
  bool executed_ = false;
  bool answered_ = false;
  kj::Own<kj::PromiseFulfiller<void>> fulfiller_;
};

// What one Session.submit call still has to execute. `rest` points into the call's message,
// which lives as long as the call.
struct ClientSession::SubmitBatch {
  std::shared_ptr<MessagePort> port;
  ring::SegmentLimits limits;
  std::span<const std::byte> rest;
  bool payloadWritten = false;
};

kj::Promise<void> ClientSession::submit(SubmitContext context) {
  auto params = context.getParams();
  const capnp::Data::Reader payload = params.getPayload();
  // The call's host buffer: what the client sent, then zeros, bounded whatever it asks for (a
  // record reaching past the bound fails as a range outside its region).
  const std::uint64_t payloadBytes =
      std::min<std::uint64_t>(std::max<std::uint64_t>(payload.size(), params.getPayloadBytes()),
                              protocol::MAX_TRANSFER_CHUNK);
  std::vector<std::byte> buffer(payloadBytes);
  if (const std::uint64_t sent = std::min<std::uint64_t>(payload.size(), payloadBytes); sent != 0) {
    std::memcpy(buffer.data(), payload.begin(), sent);  // both may be null when empty
  }
  // The call may wait for the client's queued work (executeSubmitted); a client that goes away
  // meanwhile must not keep its session, and so its work, alive.
  context.allowCancellation();
  auto batch = std::make_shared<SubmitBatch>();
  batch->port = std::make_shared<MessagePort>(std::move(buffer), channel_);
  batch->limits = channel_ ? channel_->limits() : ring::SegmentLimits{};
  batch->limits.messageBytes = payloadBytes;
  const capnp::Data::Reader commands = params.getCommands();
  batch->rest = std::span<const std::byte>(reinterpret_cast<const std::byte*>(commands.begin()),
                                           commands.size());
  return executeSubmitted(batch)
      .then([batch]() { return batch->port->whenAnswered(); })
      .then([context, batch]() mutable {
        auto results = context.getResults();
        results.setCompletions(batch->port->completions());
        if (batch->payloadWritten) results.setPayload(batch->port->payload());
      });
}

kj::Promise<void> ClientSession::executeSubmitted(std::shared_ptr<SubmitBatch> batch) {
  while (!batch->rest.empty()) {
    if (!readyForCommands() && services_.dataPlane != nullptr) {
      // The client is at its bound on queued work: the call waits, as a ring's writer does when
      // its ring is full. Calls waiting that way hold their messages in the daemon, so only a
      // few may: past that, what they carry fails as out of memory instead of piling up.
      if (*submitsWaiting_ >= kMaxSubmitsWaiting) {
        refuseSubmitted(*batch, CUDA_ERROR_OUT_OF_MEMORY);
        return kj::READY_NOW;
      }
      // Counted until the call goes on or is cancelled (its client went away meanwhile).
      auto waiting = std::make_shared<WaitingCall>(submitsWaiting_);
      std::weak_ptr<bool> alive = alive_;
      return services_.dataPlane->afterThrottledRecheck().then(
          [this, alive, batch, waiting]() mutable -> kj::Promise<void> {
            waiting.reset();
            if (alive.expired() || !*alive.lock()) {
              return KJ_EXCEPTION(DISCONNECTED, "the session ended");
            }
            return executeSubmitted(batch);
          });
    }
    const ring::DecodedCommand decoded = nextSubmitted(*batch);
    if (const auto* copy = std::get_if<ring::CopyDeviceToHost>(&decoded)) {
      batch->payloadWritten =
          batch->payloadWritten || copy->destination.region == ring::HostRegion::kMessage;
    }
    batch->port->expect(completionTokenOf(decoded));
    execute(decoded, *batch->port);
    if (const auto* error = std::get_if<ring::DecodeError>(&decoded); error && error->disconnect) {
      break;
    }
  }
  return kj::READY_NOW;
}

ring::DecodedCommand ClientSession::nextSubmitted(SubmitBatch& batch) {
  // Records back to back, each as long as its header says; a length that cannot be right leaves
  // the rest as one record, which the decoder then refuses as a framing error.
  const auto header = ring::peekCommandHeader(batch.rest);
  std::size_t length = batch.rest.size();
  if (header && header->length >= ring::kCommandHeaderBytes &&
      header->length <= batch.rest.size()) {
    length = header->length;
  }
  ring::DecodedCommand decoded = ring::decodeCommand(batch.rest.first(length), batch.limits);
  batch.rest = batch.rest.subspan(length);
  return decoded;
}

void ClientSession::refuseSubmitted(SubmitBatch& batch, CUresult result) {
  while (!batch.rest.empty()) {
    const ring::DecodedCommand decoded = nextSubmitted(batch);
    std::visit(
        [&](const auto& command) {
          using T = std::decay_t<decltype(command)>;
          if constexpr (std::is_same_v<T, ring::DecodeError>) {
            execute(decoded, *batch.port);  // framing errors end the session as ever
          } else if (const std::uint64_t token = completionTokenOf(decoded); token != 0) {
            batch.port->expect(token);
            batch.port->postCompletion(token, result);
          } else if constexpr (requires { command.stream; }) {
            report(*batch.port, result, command);
          }
        },
        decoded);
  }
}

// Answers `command` with `result` without executing it: its waiter hears it, or else its stream's
// next synchronisation.
static void failCommand(CommandPort& port, CUresult result, const ring::DecodedCommand& command) {
  std::visit(
      [&](const auto& failed) {
        using Failed = std::decay_t<decltype(failed)>;
        if constexpr (std::is_same_v<Failed, ring::DecodeError>) {
          // already answered by the decoder's own rules
        } else if constexpr (requires { failed.stream; }) {
          if constexpr (requires { failed.completionToken; }) {
            answer(port, result, failed.completionToken, failed);
          } else {
            report(port, result, failed);
          }
        } else if constexpr (requires { failed.completionToken; }) {
          if (failed.completionToken != 0) port.postCompletion(failed.completionToken, result);
        }
      },
      command);
}

// The pinned-heap range a record names (its source or destination in the client's pinned heap),
// if it names one.
static std::optional<std::pair<std::uint64_t, std::uint64_t>> pinnedHeapRangeOf(
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

void ClientSession::execute(const ring::DecodedCommand& command, CommandPort& port) {
  // Host memory in the pinned heap is used only inside the client's live pinned allocations:
  // those pages the client has faulted in (its cgroup pays for them) and its tenant is charged
  // for. Any other range is refused as a bad pointer, and the daemon never touches it.
  if (const auto range = pinnedHeapRangeOf(command);
      range && !pinned_->holds(range->first, range->second)) {
    failCommand(port, CUDA_ERROR_INVALID_VALUE, command);
    return;
  }
  try {
    executeChecked(command, port);
  } catch (const kj::Exception& error) {
    failInternally(command, port, error.getDescription().cStr());
  } catch (const std::exception& error) {
    failInternally(command, port, error.what());
  }
}

void ClientSession::failInternally(const ring::DecodedCommand& command, CommandPort& port,
                                   const char* what) {
  // Our bug, not the client's input (that is answered with the driver's error before anything
  // throws): this command fails and is logged, and this client and every other go on.
  spdlog::error("pid {}: internal error executing a command record: {}", stats_->identity.pid,
                what);
  failCommand(port, CUDA_ERROR_UNKNOWN, command);
}

void ClientSession::executeChecked(const ring::DecodedCommand& command, CommandPort& port) {
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
          [&](const ring::DecodeError& error) {
            if (error.disconnect) {
              evict(std::string(ring::describe(error.failure)));
            } else if (error.completionToken != 0) {
              port.postCompletion(error.completionToken, error.result);
            } else {
              port.postAsyncError(ring::AsyncError{error.sequence, error.context, error.stream,
                                                   error.result, error.opcode});
            }
          },
      },
      command);
}

template <typename Command>
void ClientSession::executeOnDevice(const Command& command, CommandPort& port) {
  GpuClient* client = clientFor(command.context, HandleKind::kContext);
  report(port,
         client == nullptr ? CUDA_ERROR_INVALID_CONTEXT
                           : client->enqueue(command.context, command.stream, toOperation(command)),
         command);
}

void ClientSession::executeLaunch(const ring::LaunchKernel& launch, CommandPort& port) {
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

void ClientSession::executeCopyToDevice(const ring::CopyHostToDevice& copy, CommandPort& port) {
  GpuClient* client = clientFor(copy.context, HandleKind::kContext);
  if (copy.source.region == ring::HostRegion::kPinnedHeap && client != nullptr) {
    // DMA straight from the application's pinned buffer, which the port's keep-alive keeps mapped
    // until the copy is over; answered when it is.
    kj::Promise<CUresult> done =
        client->copyHostToDeviceFrom(copy.context, copy.stream, copy.destination,
                                     port.hostBytes(copy.source, copy.bytes), port.keepAlive());
    ringTasks_->add(done.then([port = port.shared_from_this(), copy](CUresult result) {
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
      ringTasks_->add(read.then([port = port.shared_from_this(), offset, bytes](CUresult) {
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

void ClientSession::executeCopyToHost(const ring::CopyDeviceToHost& copy, CommandPort& port) {
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
  ringTasks_->add(done.then([this, port = port.shared_from_this(), copy](CUresult result) {
    // A blocking copy synchronises: what the client's kernels printed comes first.
    if (copy.completionToken != 0) collectDeviceOutput(*port);
    answer(*port, result, copy.completionToken, copy);
  }));
}

void ClientSession::executeHostFunction(const ring::HostFunction& call, CommandPort& port) {
  // Answered when due: in the completion ring, or in the answer of the Session.submit call that
  // carried it (which then waits, as for a Synchronize).
  const std::uint64_t token = call.completionToken;
  // A token names one host function of the client's, whichever GPU holds its stream.
  std::size_t pending = 0;
  bool tokenInUse = false;
  for (const auto& [device, client] : clients_) {
    pending += client->hostFunctionsPending();
    tokenInUse = tokenInUse || client->holdsForHostFunction(token);
  }
  if (tokenInUse || pending >= protocol::kMaxPendingHostFunctions) {
    port.postCompletion(token, CUDA_ERROR_INVALID_VALUE);
    return;
  }
  CUresult missing = CUDA_SUCCESS;
  GpuClient* client = clientForStream(call.context, call.stream, missing);
  if (client == nullptr) {
    port.postCompletion(token, missing);
    return;
  }
  GpuClient::StreamHold hold = client->holdStreamForHostFunction(call.context, call.stream, token);
  if (hold.result != CUDA_SUCCESS) {
    port.postCompletion(token, hold.result);
    return;
  }
  ringTasks_->add(hold.reached.then([port = port.shared_from_this(), token](CUresult status) {
    port->postCompletion(token, status);
  }));
}

void ClientSession::openHostGate(std::uint64_t token) {
  // A token that holds nothing (answered with an error, opened already) changes nothing.
  for (const auto& [device, client] : clients_) {
    if (client->hostFunctionReturned(token)) return;
  }
}

void ClientSession::executeSynchronize(const ring::Synchronize& sync, CommandPort& port) {
  const std::uint64_t token = sync.completionToken;
  // Answers `token` once `promise` resolves.
  // (The tasks are the session's: they never run after it is gone.)
  auto answerLater = [&](kj::Promise<CUresult> promise) {
    ringTasks_->add(promise.then([this, port = port.shared_from_this(), token](CUresult result) {
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

CUresult ClientSession::streamWaitEvent(const ring::StreamWaitEvent& wait) {
  CUresult missing;
  GpuClient* client = clientForStream(wait.context, wait.stream, missing);
  if (client == nullptr) return missing;
  if (wait.flags != 0 && wait.flags != CU_EVENT_WAIT_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
  if (!client->ownsEvent(wait.event)) {
    GpuClient* owner = clientFor(wait.event, HandleKind::kEvent);
    if (owner == nullptr || !owner->ownsEvent(wait.event)) return CUDA_ERROR_INVALID_HANDLE;
    return waitForAnotherGpusEvent(*client, *owner, wait);
  }
  return client->streamWaitEvent(wait.context, wait.stream, wait.event);
}

CUresult ClientSession::waitForAnotherGpusEvent(GpuClient& waiter, GpuClient& owner,
                                                const ring::StreamWaitEvent& wait) {
  // The event's latest record as of now, as CUDA promises: a later record does not count.
  kj::Promise<CUresult> recorded = owner.synchronizeEvent(wait.event);
  // The waiting stream is held on its own GPU as for a host function, and let go once the record
  // is done on the event's GPU. It goes on whether that work succeeded or not: an error of the
  // other GPU's work is that context's, reported there. The session keeps only the hold's name:
  // each GPU's state stays its own.
  const GpuClient::HoldForAnotherGpu held =
      waiter.holdStreamForAnotherGpu(wait.context, wait.stream);
  if (held.result != CUDA_SUCCESS) return held.result;
  auto letGo = [this, device = waiter.deviceIndex(), hold = held.hold]() {
    if (auto client = clients_.find(device); client != clients_.end()) {
      client->second->anotherGpusEventDone(hold);
    }
  };
  ringTasks_->add(
      recorded.then([letGo](CUresult) { letGo(); }, [letGo](kj::Exception&&) { letGo(); }));
  return CUDA_SUCCESS;
}

}  // namespace gpuproxy::server

namespace gpuproxy::server {

void ClientSession::collectDeviceOutput(CommandPort& port) {
  std::size_t waiting = 0;
  for (const auto& [device, client] : clients_) waiting += client->collectDeviceOutput();
  if (waiting > 0) port.postDeviceOutput(waiting);
}

kj::Promise<void> ClientSession::takeDeviceOutput(TakeDeviceOutputContext context) {
  // Each GPU's output, taken there, joined in device order; one answer holds at most what one
  // GPU may keep.
  kj::Vector<kj::Promise<GpuClient::DeviceOutput>> taken;
  for (const auto& [device, client] : clients_) {
    taken.add(onGpu(*client, [](GpuClient& client) { return client.takeDeviceOutput(); }));
  }
  return kj::joinPromises(taken.releaseAsArray())
      .then([context](kj::Array<GpuClient::DeviceOutput> outputs) mutable {
        GpuClient::DeviceOutput joined;
        for (const GpuClient::DeviceOutput& output : outputs) {
          joined.text += output.text;
          joined.lostBytes += output.lostBytes;
        }
        joined.lostBytes += keepNewestOutput(joined.text, GpuClient::kMaxDeviceOutputBytes);
        auto results = context.getResults();
        results.setText(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(joined.text.data()),
                                     joined.text.size()));
        results.setLostBytes(joined.lostBytes);
      });
}

}  // namespace gpuproxy::server
