// Command records (protocol/RING_FORMAT.md) of one session, however they come: from the client's
// command rings (its data plane, a ring pair per device, handed out here) or carried by a
// Session.submit call. One decoder (protocol::ring::decodeCommand) and one executor per GPU
// (gpu_command_executor.hpp, which acts and answers, record_answers.hpp) serve both: a ring's
// records go to its device's executor (RingOfDevice), a batch's each to the executor of the GPU
// its handle names (ClientSession::execute). Only the CommandPort differs, which says where host
// bytes are and where answers go.

#include "ipc/shared_file.hpp"
#include "protocol/limits.hpp"
#include "server/data_plane/data_plane.hpp"
#include "server/session/client_session.hpp"
#include "server/session/record_answers.hpp"
#include "server/session/tell_session.hpp"

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

}  // namespace

ClientSession::DispatchCallResult ClientSession::dispatchCall(
    std::uint64_t interfaceId, std::uint16_t methodId,
    capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) {
  if (pumpRings() && services_.dataPlane != nullptr) {
    // The client may go away while the call waits; its session must not outlive it for that.
    context.allowCancellation();
    return {dispatchAfterRing(interfaceId, methodId, context), false};
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
        if (pumpRings()) return dispatchAfterRing(interfaceId, methodId, context);
        return protocol::Session::Server::dispatchCall(interfaceId, methodId, context).promise;
      });
}

bool ClientSession::pumpRings() {
  bool throttled = false;
  for (const std::shared_ptr<ClientChannel>& channel : channels_) {
    channel->pumpAll();
    throttled = throttled || channel->throttled();
  }
  return throttled;
}

kj::Promise<void> ClientSession::openDataPlane(OpenDataPlaneContext context) {
  auto params = context.getParams();
  auto results = context.getResults();
  if (segment_) {
    results.setResult(CUDA_ERROR_ALREADY_MAPPED);
    return kj::READY_NOW;
  }
  if (services_.dataPlane == nullptr) {
    results.setResult(CUDA_ERROR_NOT_SUPPORTED);
    return kj::READY_NOW;
  }
  ChannelSizes sizes;
  // A ring pair per device the client can see, so that each GPU reads only its own records; at
  // least one, for a client that sees none (its records name no GPU and are refused).
  sizes.ringPairs = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(visibleDevices_.size()));
  std::optional<ipc::AddressReservation> reservation;
  try {
    if (params.getAddress() != 0) {
      const std::uint64_t page = ipc::pageSize();
      sizes.pinnedHeapBytes =
          (std::min(params.getPinnedHeapBytes(), protocol::kMaxPinnedHeapBytes) + page - 1) / page *
          page;
      const std::uint64_t needed = ClientSegment::bytesFor(sizes);
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
    auto segment =
        std::make_shared<ClientSegment>("gpuproxy-client-" + std::to_string(stats_->identity.pid),
                                        sizes, reservation ? &*reservation : nullptr);
    std::vector<std::unique_ptr<RingOfDevice>> executors;
    std::vector<std::shared_ptr<ClientChannel>> channels;
    auto doorbells = results.initDoorbells(segment->ringPairs());
    for (std::uint32_t ring = 0; ring < segment->ringPairs(); ++ring) {
      executors.push_back(std::make_unique<RingOfDevice>(*this));
      channels.push_back(std::make_shared<ClientChannel>(*executors.back(), segment, ring));
      doorbells.set(ring, sharedFileOf(channels.back()->doorbellFd()));
    }
    results.setSegment(sharedFileOf(segment->fd()));
    results.setSegmentBytes(segment->bytes());
    results.setPinnedHeapBytes(segment->pinnedHeap().size());
    for (const std::shared_ptr<ClientChannel>& channel : channels) {
      services_.dataPlane->add(*channel);
    }
    segment_ = std::move(segment);
    ringExecutors_ = std::move(executors);
    channels_ = std::move(channels);
    for (const auto& [device, executor] : commands_) bindRing(device);
    results.setResult(CUDA_SUCCESS);
  } catch (const std::exception& error) {
    spdlog::warn("pid {}: cannot set up its data plane: {}", stats_->identity.pid, error.what());
    results.setResult(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return kj::READY_NOW;
}

ClientSession::RingOfDevice::RingOfDevice(ClientSession& session)
    : session_(session),
      sessionThread_(kj::getCurrentThreadExecutor().addRef()),
      sessionAlive_(session.alive_),
      stats_(session.stats_),
      noGpu_(nullptr, session, sessionThread_->addRef(), session.alive_, session.stats_,
             session.pinned_) {}

void ClientSession::RingOfDevice::channelBroken(const std::string& reason) {
  tellSession(
      *sessionThread_, sessionAlive_,
      [&session = session_, reason] { session.channelBroken(reason); },
      "a broken ring could not tell its session");
}

void ClientSession::bindRing(std::uint32_t device) {
  const std::optional<std::uint32_t> ordinal = ordinalOf(device);
  auto executor = commands_.find(device);
  if (!ordinal || *ordinal >= ringExecutors_.size() || executor == commands_.end()) return;
  ringExecutors_[*ordinal]->bind(*executor->second);
}

bool ClientSession::readyForCommands() const {
  return !stats_->queueFull();
}

void ClientSession::evict(const std::string& reason) {
  // Every ring's channel stops reading first (each then calls channelBroken, which says it once).
  for (const std::shared_ptr<ClientChannel>& channel : channels_) channel->markBroken(reason);
  channelBroken(reason);
}

void ClientSession::channelBroken(const std::string& reason) {
  if (ringBroken_) return;
  ringBroken_ = true;
  spdlog::warn("pid {} ({}) broke the data-plane format ({}): disconnecting it",
               stats_->identity.pid, stats_->identity.command, reason);
  services_.connections.endConnection(connectionId_);
}

// The CommandPort of one Session.submit call: host bytes of HostRegion::kMessage are the call's
// payload buffer (the staging area and pinned heap, when a record names them, are the session's
// segment's), and answers are collected for the call's result until every completion token in
// the call has been answered. What comes after that (the failure of a copy nobody waits for, a
// staging range to give back) goes to the completion ring of the session's first ring pair (the
// stub reads every one), or nowhere without a data plane.
class ClientSession::MessagePort final : public CommandPort {
public:
  MessagePort(std::vector<std::byte> payload, std::shared_ptr<const ClientSegment> segment,
              std::shared_ptr<ClientChannel> channel)
      : payload_(std::move(payload)), segment_(std::move(segment)), channel_(std::move(channel)) {}
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
    if (!segment_) return {};
    return segment_->hostBytes(location, bytes);
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
  std::shared_ptr<const ClientSegment> segment_;
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
  batch->port = std::make_shared<MessagePort>(std::move(buffer), segment_,
                                              channels_.empty() ? nullptr : channels_.front());
  batch->limits = segment_ ? segment_->limits() : ring::SegmentLimits{};
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
    if (std::holds_alternative<ring::DecodeError>(decoded)) {
      execute(decoded, *batch.port);  // framing errors end the session as ever
      continue;
    }
    batch.port->expect(completionTokenOf(decoded));
    failCommand(*batch.port, result, decoded);
  }
}

void ClientSession::execute(const ring::DecodedCommand& command, CommandPort& port) {
  // A record of a Session.submit batch that cannot be framed: the batch is framed here, so the
  // connection ends here (a ring's channel does the same for its records).
  if (const auto* error = std::get_if<ring::DecodeError>(&command); error && error->disconnect) {
    evict(std::string(ring::describe(error->failure)));
    return;
  }
  // To the executor of the GPU its handle names; one naming no GPU the client uses (a decode error
  // too) to the executor without one, which answers as the driver answers a bad handle.
  GpuCommandExecutor* executor = &noGpu_;
  if (const std::optional<std::uint32_t> device = GpuCommandExecutor::deviceOf(command)) {
    if (auto found = commands_.find(*device); found != commands_.end()) {
      executor = found->second.get();
    }
  }
  executor->execute(command, port);
}

void ClientSession::letGoElsewhere(const ring::LetGoAfterEvent& letGo) {
  // To the GPU its HoldForEvent went to, found by the rule that routed the hold (its stream's
  // device, its context's for the NULL stream), whatever the let-go's waiter context says.
  ring::HoldForEvent hold;
  hold.context = letGo.waiterContext;
  hold.stream = letGo.waiterStream;
  hold.token = letGo.token;
  const std::optional<std::uint32_t> device = GpuCommandExecutor::deviceOf(hold);
  if (!device) return;
  auto waiting = commands_.find(*device);
  if (waiting == commands_.end()) return;
  tellGpu(*clients_.at(*device), [executor = waiting->second.get(), token = letGo.token](
                                     GpuClient&) { executor->letGoOfHold(token); });
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
