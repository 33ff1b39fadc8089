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
#include <deque>
#include <map>
#include <mutex>
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
  // Nearly always so: each GPU's thread reads its rings within microseconds of a record, and a
  // control call takes longer than that to arrive.
  if (ringsDrained())
    return protocol::Session::Server::dispatchCall(interfaceId, methodId, context);
  // The client may go away while the call waits; its session must not outlive it for that.
  context.allowCancellation();
  return {dispatchAfterRing(interfaceId, methodId, context), false};
}

kj::Promise<void> ClientSession::dispatchAfterRing(
    std::uint64_t interfaceId, std::uint16_t methodId,
    capnp::CallContext<capnp::AnyPointer, capnp::AnyPointer> context) {
  std::weak_ptr<bool> alive = alive_;
  return drainRings().then(
      [this, alive, interfaceId, methodId, context](bool throttled) mutable -> kj::Promise<void> {
        if (alive.expired() || !*alive.lock()) {
          return KJ_EXCEPTION(DISCONNECTED, "the session ended");
        }
        if (!throttled) {
          return protocol::Session::Server::dispatchCall(interfaceId, methodId, context).promise;
        }
        // The client is at its bound on queued work and records still wait in a ring: look again
        // shortly.
        return services_.dataPlane->afterThrottledRecheck().then(
            [this, alive, interfaceId, methodId, context]() mutable -> kj::Promise<void> {
              if (alive.expired() || !*alive.lock()) {
                return KJ_EXCEPTION(DISCONNECTED, "the session ended");
              }
              return dispatchAfterRing(interfaceId, methodId, context);
            });
      });
}

bool ClientSession::ringsDrained() const {
  return std::all_of(
      channels_.begin(), channels_.end(),
      [](const std::shared_ptr<ClientChannel>& channel) { return channel->drained(); });
}

kj::Promise<bool> ClientSession::drainRings() {
  kj::Vector<kj::Promise<bool>> throttled;
  for (std::uint32_t ring = 0; ring < channels_.size(); ++ring) {
    if (channels_[ring]->drained()) continue;
    throttled.add(ringHome(ring).thread->executeAsync([channel = channels_[ring]] {
      channel->pumpAll();
      return channel->throttled();
    }));
  }
  return kj::joinPromises(throttled.releaseAsArray()).then([](kj::Array<bool> throttled) {
    return std::find(throttled.begin(), throttled.end(), true) != throttled.end();
  });
}

ClientSession::RingHome ClientSession::ringHome(std::uint32_t ring) const {
  if (const std::optional<std::uint32_t> device = deviceForOrdinal(ring);
      device && *device < services_.gpuDataPlanes.size()) {
    return {services_.gpuDataPlanes[*device], &services_.gpus[*device]->executor()};
  }
  return {services_.dataPlane, &kj::getCurrentThreadExecutor()};
}

kj::Promise<void> ClientSession::openDataPlane(OpenDataPlaneContext context) {
  auto params = context.getParams();
  auto results = context.getResults();
  if (segment_) {
    results.setResult(CUDA_ERROR_ALREADY_MAPPED);
    return kj::READY_NOW;
  }
  if (services_.dataPlane == nullptr || services_.gpuDataPlanes.size() != services_.gpus.size()) {
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
    segment_ = std::move(segment);
    ringExecutors_ = std::move(executors);
    channels_ = std::move(channels);
    // Each ring is served from here on by its GPU's loop, on that GPU's thread. Whatever the client
    // does next reaches that thread after this (a control call's drain, the teardown): messages
    // from one thread to another run in the order sent.
    for (std::uint32_t ring = 0; ring < channels_.size(); ++ring) {
      tellRingThread(ring, [channel = channels_[ring],
                            executor = ringExecutors_[ring].get()](DataPlane& loop) {
        try {
          loop.add(*channel);
        } catch (const std::exception& error) {
          executor->channelBroken(std::string("its ring cannot be served: ") + error.what());
        }
      });
    }
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
  // Both live until the teardown's messages, which follow this one to the same thread.
  tellRingThread(*ordinal,
                 [ring = ringExecutors_[*ordinal].get(),
                  commands = executor->second.get()](DataPlane&) { ring->bind(*commands); });
}

bool ClientSession::readyForCommands() const {
  return !stats_->queueFull();
}

void ClientSession::evict(const std::string& reason) {
  // Every ring's channel stops reading, on its thread (each then tells channelBroken, which says it
  // once).
  for (std::uint32_t ring = 0; ring < channels_.size(); ++ring) {
    tellRingThread(
        ring, [channel = channels_[ring], reason](DataPlane&) { channel->markBroken(reason); });
  }
  channelBroken(reason);
}

void ClientSession::channelBroken(const std::string& reason) {
  if (ringBroken_) return;
  ringBroken_ = true;
  spdlog::warn("pid {} ({}) broke the data-plane format ({}): disconnecting it",
               stats_->identity.pid, stats_->identity.command, reason);
  services_.connections.endConnection(connectionId_);
}

// The answers of one Session.submit call, collected for the call's result until every completion
// token in it has been answered, and its host buffer: HostRegion::kMessage is the call's payload
// (the staging area and pinned heap, when a record names them, are the session's segment's).
// Its records run on the threads of their GPUs, whose answers may come at once or later from
// their work: hence the lock, and a cross-thread fulfiller to tell the session's thread. What
// comes after the call is answered goes to the completion ring of the answering GPU's ring pair
// (SubmitPort), or nowhere without a data plane.
class ClientSession::SubmitAnswers {
public:
  explicit SubmitAnswers(std::vector<std::byte> payload)
      : payload_(std::move(payload)),
        whenAnswered_(kj::newPromiseAndCrossThreadFulfiller<void>()) {}

  // The payload never changes size, so its bytes need no lock (the GPU work that writes them
  // keeps them alive through its port's keepAlive()).
  std::span<std::byte> payloadBytes() { return {payload_.data(), payload_.size()}; }
  kj::ArrayPtr<const capnp::byte> payload() const {
    return kj::arrayPtr(reinterpret_cast<const capnp::byte*>(payload_.data()), payload_.size());
  }

  // A record about to be executed carries `token` (0: none). On the session's thread, before the
  // record goes to its executor.
  void expect(std::uint64_t token) {
    if (token == 0) return;
    const std::lock_guard lock(mutex_);
    ++pendingTokens_;
  }

  // Appends `answer` to the call's result and says true, or says false once the call has been
  // answered (the answer goes elsewhere then).
  template <typename Answer>
  bool append(const Answer& answer, bool completesToken) {
    const std::lock_guard lock(mutex_);
    if (answered_) return false;
    std::array<std::byte, ring::kMaxCompletionRecordBytes> record{};
    const std::size_t bytes = ring::encode(answer, record);
    completions_.insert(completions_.end(), record.begin(), record.begin() + bytes);
    if (completesToken && pendingTokens_ > 0) --pendingTokens_;
    answerIfDone();
    return true;
  }

  // Resolves once every expected token has been answered. On the session's thread, once every
  // record of the batch has been executed.
  kj::Promise<void> whenAnswered() {
    {
      const std::lock_guard lock(mutex_);
      executed_ = true;
      answerIfDone();
    }
    return kj::mv(whenAnswered_.promise);
  }

  // Once the call is answered, the answers it holds.
  kj::ArrayPtr<const capnp::byte> completions() const {
    return kj::arrayPtr(reinterpret_cast<const capnp::byte*>(completions_.data()),
                        completions_.size());
  }

private:
  void answerIfDone() {
    if (!executed_ || pendingTokens_ > 0 || answered_) return;
    answered_ = true;
    whenAnswered_.fulfiller->fulfill();
  }

  std::vector<std::byte> payload_;
  std::mutex mutex_;
  std::vector<std::byte> completions_;
  std::uint64_t pendingTokens_ = 0;
  bool executed_ = false;
  bool answered_ = false;
  kj::PromiseCrossThreadFulfillerPair<void> whenAnswered_;
};

// The CommandPort of one Session.submit call on one thread: that of a GPU its records run on, or
// the session's, for records that name no GPU. Host bytes are the call's and the segment's; what
// comes after the call has been answered (the failure of a copy nobody waits for), and every
// staging range to give back, goes to `channel`: the completion ring of that GPU's ring pair,
// served on that same thread, or (on the session's thread, with `channelThread`) ring 0's, by a
// message to its thread.
class ClientSession::SubmitPort final : public CommandPort {
public:
  SubmitPort(std::shared_ptr<SubmitAnswers> answers, std::shared_ptr<const ClientSegment> segment,
             std::shared_ptr<ClientChannel> channel, const kj::Executor* channelThread)
      : answers_(std::move(answers)),
        segment_(std::move(segment)),
        channel_(std::move(channel)),
        channelThread_(channelThread != nullptr ? channelThread->addRef()
                                                : kj::Own<const kj::Executor>()) {}
  // kj::Own is declared noexcept(false); dropping a reference does not throw.
  ~SubmitPort() noexcept override {}
  SubmitPort(const SubmitPort&) = delete;
  SubmitPort& operator=(const SubmitPort&) = delete;

  std::span<std::byte> hostBytes(const ring::HostLocation& location, std::uint64_t bytes) override {
    if (location.region == ring::HostRegion::kMessage) {
      const std::span<std::byte> payload = answers_->payloadBytes();
      if (location.offset > payload.size() || bytes > payload.size() - location.offset) {
        throw std::logic_error("host range outside the call's payload reached the executor");
      }
      return payload.subspan(location.offset, static_cast<std::size_t>(bytes));
    }
    // Without a segment the decoder gave both regions no bytes.
    if (!segment_) return {};
    return segment_->hostBytes(location, bytes);
  }

  std::shared_ptr<const void> keepAlive() override { return shared_from_this(); }

  void postCompletion(std::uint64_t token, CUresult result) override {
    if (!answers_->append(ring::Completion{token, result}, true)) {
      toChannel([token, result](ClientChannel& channel) { channel.postCompletion(token, result); });
    }
  }
  void postAsyncError(const ring::AsyncError& error) override {
    if (!answers_->append(error, false)) {
      toChannel([error](ClientChannel& channel) { channel.postAsyncError(error); });
    }
  }
  void postStagingRelease(std::uint64_t offset, std::uint64_t bytes) override {
    toChannel(
        [offset, bytes](ClientChannel& channel) { channel.postStagingRelease(offset, bytes); });
  }
  void postDeviceOutput(std::uint64_t bytes) override {
    if (!answers_->append(ring::DeviceOutput{bytes}, false)) {
      toChannel([bytes](ClientChannel& channel) { channel.postDeviceOutput(bytes); });
    }
  }

private:
  template <typename Post>
  void toChannel(Post post) {
    if (!channel_) return;
    if (channelThread_.get() == nullptr) {
      post(*channel_);
      return;
    }
    channelThread_->executeAsync([channel = channel_, post]() { post(*channel); })
        .detach([](kj::Exception&& exception) {
          KJ_LOG(ERROR, "an answer could not reach its ring", exception);
        });
  }

  std::shared_ptr<SubmitAnswers> answers_;
  std::shared_ptr<const ClientSegment> segment_;
  std::shared_ptr<ClientChannel> channel_;
  kj::Own<const kj::Executor> channelThread_;  // null: channel_ is served on this port's thread
};

// What one Session.submit call still has to execute: records decoded ahead (their tokens
// expected), then the rest of the call's message, which lives as long as the call.
struct ClientSession::SubmitBatch {
  std::shared_ptr<SubmitAnswers> answers;
  std::shared_ptr<SubmitPort> sessionPort;                     // records of no GPU
  std::map<std::uint32_t, std::shared_ptr<SubmitPort>> ports;  // by daemon device
  ring::SegmentLimits limits;
  std::deque<ring::DecodedCommand> ahead;
  std::span<const std::byte> rest;
  bool payloadWritten = false;
};

namespace {

// Records decoded ahead of their execution, and so sent to a GPU in one message at most.
constexpr std::size_t kSubmitRunRecords = 256;

}  // namespace

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
  batch->answers = std::make_shared<SubmitAnswers>(std::move(buffer));
  batch->sessionPort = std::make_shared<SubmitPort>(
      batch->answers, segment_, channels_.empty() ? nullptr : channels_.front(),
      channels_.empty() ? nullptr : ringHome(0).thread);
  batch->limits = segment_ ? segment_->limits() : ring::SegmentLimits{};
  batch->limits.messageBytes = payloadBytes;
  const capnp::Data::Reader commands = params.getCommands();
  batch->rest = std::span<const std::byte>(reinterpret_cast<const std::byte*>(commands.begin()),
                                           commands.size());
  return executeSubmitted(batch)
      .then([batch]() { return batch->answers->whenAnswered(); })
      .then([context, batch]() mutable {
        auto results = context.getResults();
        results.setCompletions(batch->answers->completions());
        if (batch->payloadWritten) results.setPayload(batch->answers->payload());
      });
}

kj::Promise<void> ClientSession::executeSubmitted(std::shared_ptr<SubmitBatch> batch) {
  std::weak_ptr<bool> alive = alive_;
  auto goOn = [this, alive, batch]() mutable -> kj::Promise<void> {
    if (alive.expired() || !*alive.lock()) {
      return KJ_EXCEPTION(DISCONNECTED, "the session ended");
    }
    return executeSubmitted(batch);
  };
  while (!batch->ahead.empty() || !batch->rest.empty()) {
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
      return services_.dataPlane->afterThrottledRecheck().then(
          [goOn = kj::mv(goOn), waiting]() mutable {
            waiting.reset();
            return goOn();
          });
    }
    decodeAhead(*batch);
    const std::optional<std::uint32_t> device = executingDevice(batch->ahead.front());
    if (!device) {
      // A framing error (which ends the connection) or a record of no GPU: here.
      const bool framing = ring::breaksFraming(batch->ahead.front());
      execute(batch->ahead.front(), *batch->sessionPort);
      batch->ahead.pop_front();
      if (framing) return kj::READY_NOW;
      continue;
    }
    // The records ahead for this GPU, in one message; it executes them while the client stays
    // below its bound, and gives back the rest.
    std::vector<ring::DecodedCommand> run;
    while (!batch->ahead.empty() && executingDevice(batch->ahead.front()) == device) {
      run.push_back(std::move(batch->ahead.front()));
      batch->ahead.pop_front();
    }
    auto& port = batch->ports[*device];
    if (!port) {
      const std::optional<std::uint32_t> ordinal = ordinalOf(*device);
      port = std::make_shared<SubmitPort>(
          batch->answers, segment_,
          ordinal && *ordinal < channels_.size() ? channels_[*ordinal] : nullptr, nullptr);
    }
    return onGpu(*clients_.at(*device),
                 [executor = commands_.at(*device).get(), port, stats = stats_,
                  run = std::move(run)](GpuClient&) mutable {
                   std::size_t executed = 0;
                   while (executed < run.size() && (executed == 0 || !stats->queueFull())) {
                     executor->execute(run[executed], *port);
                     ++executed;
                   }
                   run.erase(run.begin(), run.begin() + static_cast<std::ptrdiff_t>(executed));
                   return std::move(run);
                 })
        .then([batch, goOn = kj::mv(goOn)](std::vector<ring::DecodedCommand> left) mutable {
          batch->ahead.insert(batch->ahead.begin(), std::make_move_iterator(left.begin()),
                              std::make_move_iterator(left.end()));
          return goOn();
        });
  }
  return kj::READY_NOW;
}

void ClientSession::decodeAhead(SubmitBatch& batch) {
  while (batch.ahead.size() < kSubmitRunRecords && !batch.rest.empty() &&
         (batch.ahead.empty() || !ring::breaksFraming(batch.ahead.back()))) {
    ring::DecodedCommand decoded = nextSubmitted(batch);
    if (const auto* copy = std::get_if<ring::CopyDeviceToHost>(&decoded)) {
      batch.payloadWritten =
          batch.payloadWritten || copy->destination.region == ring::HostRegion::kMessage;
    }
    batch.answers->expect(completionTokenOf(decoded));
    batch.ahead.push_back(std::move(decoded));
  }
}

std::optional<std::uint32_t> ClientSession::executingDevice(
    const ring::DecodedCommand& command) const {
  if (ring::breaksFraming(command)) return std::nullopt;
  const std::optional<std::uint32_t> device = GpuCommandExecutor::deviceOf(command);
  if (!device || commands_.count(*device) == 0) return std::nullopt;
  return device;
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
  // Those decoded ahead have had their tokens counted already.
  for (; !batch.ahead.empty(); batch.ahead.pop_front()) {
    if (std::holds_alternative<ring::DecodeError>(batch.ahead.front())) {
      // Answered by the decoder's rules; one of framing ends the session as ever.
      execute(batch.ahead.front(), *batch.sessionPort);
      continue;
    }
    failCommand(*batch.sessionPort, result, batch.ahead.front());
  }
  while (!batch.rest.empty()) {
    const ring::DecodedCommand decoded = nextSubmitted(batch);
    if (std::holds_alternative<ring::DecodeError>(decoded)) {
      execute(decoded, *batch.sessionPort);  // framing errors end the session as ever
      continue;
    }
    batch.answers->expect(completionTokenOf(decoded));
    failCommand(*batch.sessionPort, result, decoded);
  }
}

void ClientSession::execute(const ring::DecodedCommand& command, CommandPort& port) {
  // A record of a Session.submit batch that cannot be framed: the batch is framed here, so the
  // connection ends here (a ring's channel does the same for its records).
  if (ring::breaksFraming(command)) {
    evict(std::string(ring::describe(std::get<ring::DecodeError>(command).failure)));
    return;
  }
  // One naming no GPU the client uses (a decode error too): the executor without one answers it
  // as the driver answers a bad handle.
  noGpu_.execute(command, port);
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
