#include "server/data_plane/client_channel.hpp"

#include <spdlog/spdlog.h>

#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace gpuproxy::server {

namespace ring = protocol::ring;

namespace {

// Answers parked beyond this stop the channel from taking new commands until the client reads
// its completion ring again.
constexpr std::size_t kMaxParkedAnswers = 4096;

}  // namespace

ClientChannel::ClientChannel(CommandExecutor& executor, std::shared_ptr<ClientSegment> segment,
                             std::uint32_t ring)
    : executor_(&executor), segment_(std::move(segment)) {
  if (ring >= segment_->ringPairs()) throw std::out_of_range("no such ring pair in the segment");
  const std::span<std::byte> commandRegion = segment_->commandRing(ring);
  const std::span<std::byte> completionRegion = segment_->completionRing(ring);
  commands_.emplace(commandRegion, ipc::ringCapacityOf(commandRegion.size()));
  completions_.emplace(completionRegion, ipc::ringCapacityOf(completionRegion.size()));
  doorbell_ = ipc::makeEventFd();
  waiter_.emplace(commands_->consumerSleeping(), doorbell_.get());
  publisher_.emplace(segment_->completionWord());
  record_.reserve(ring::kMaxCommandRecordBytes);
}

ClientChannel::~ClientChannel() = default;

std::size_t ClientChannel::pump(std::size_t budget) {
  std::size_t executed = 0;
  if (!parked_.empty()) flushAnswers();
  while (executed < budget && executor_ != nullptr && !broken_ &&
         parked_.size() < kMaxParkedAnswers && executor_->readyForCommands()) {
    ipc::RingStatus status = commands_->read(record_);
    if (status == ipc::RingStatus::kEmpty) break;
    if (status != ipc::RingStatus::kOk) {
      markBroken(std::string("command ring: ") + ipc::toString(status));
      break;
    }
    ++executed;
    ++commandsExecuted_;
    const ring::DecodedCommand command = ring::decodeCommand(record_, segment_->limits());
    if (ring::breaksFraming(command)) {
      // A record that cannot be framed: nothing after it in this ring can be trusted either.
      markBroken(std::string(ring::describe(std::get<ring::DecodeError>(command).failure)));
      break;
    }
    executor_->execute(command, *this);
  }
  executedThrough_.store(commands_->readIndex(), std::memory_order_release);
  return executed;
}

void ClientChannel::pumpAll() {
  while (pump(1024) > 0) {
  }
}

bool ClientChannel::hasWork() {
  if (broken_) return false;
  if (!parked_.empty()) flushAnswers();
  return executor_ != nullptr && parked_.size() < kMaxParkedAnswers && commands_->pending() &&
         executor_->readyForCommands();
}

bool ClientChannel::throttled() {
  return executor_ != nullptr && !broken_ && commands_->pending() && !executor_->readyForCommands();
}

void ClientChannel::postCompletion(std::uint64_t token, CUresult result) {
  post(ring::Completion{token, result});
}

void ClientChannel::postAsyncError(const ring::AsyncError& error) {
  post(error);
}

void ClientChannel::postStagingRelease(std::uint64_t offset, std::uint64_t bytes) {
  post(ring::StagingRelease{offset, bytes});
}

void ClientChannel::postDeviceOutput(std::uint64_t bytes) {
  post(ring::DeviceOutput{bytes});
}

std::span<std::byte> ClientChannel::hostBytes(const ring::HostLocation& location,
                                              std::uint64_t bytes) {
  return segment_->hostBytes(location, bytes);
}

void ClientChannel::markBroken(std::string reason) {
  if (broken_) return;
  broken_ = std::move(reason);
  if (executor_ != nullptr) executor_->channelBroken(*broken_);
}

void ClientChannel::post(Answer answer) {
  parked_.push_back(std::move(answer));
  flushAnswers();
  if (!parked_.empty() && answersWaiting_) answersWaiting_();
}

void ClientChannel::flushAnswers() {
  std::size_t written = 0;
  while (!parked_.empty()) {
    const Answer& answer = parked_.front();
    const std::uint32_t bytes =
        std::visit([](const auto& value) { return ring::encodedSize(value); }, answer);
    auto reservation = completions_->reserve(bytes);
    if (reservation.status == ipc::RingStatus::kFull) break;  // try again on the next pump
    if (reservation.status != ipc::RingStatus::kOk) {
      markBroken(std::string("completion ring: ") + ipc::toString(reservation.status));
      parked_.clear();
      break;
    }
    const std::size_t used = std::visit(
        [&](const auto& value) { return ring::encode(value, reservation.bytes); }, answer);
    completions_->commit(used);
    parked_.pop_front();
    ++written;
  }
  if (written > 0) publisher_->publishMore(static_cast<std::uint32_t>(written));
}

}  // namespace gpuproxy::server
