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

std::span<std::byte> regionOf(const ipc::SharedSegment& segment, const ring::wire::Region& region) {
  return {segment.data() + region.offset, region.bytes};
}

std::size_t ringCapacity(std::size_t regionBytes) {
  return regionBytes - sizeof(ipc::RingHeader);
}

ring::wire::SegmentHeader planFor(const ChannelSizes& sizes) {
  ring::SegmentPlan plan;
  plan.commandRingCount = 1;
  plan.commandRingBytes = ipc::ringRegionBytes(sizes.commandRingCapacity);
  plan.completionRingBytes = ipc::ringRegionBytes(sizes.completionRingCapacity);
  plan.controlBytes = sizeof(ring::wire::ControlBlock);
  plan.stagingBytes = sizes.stagingBytes;
  plan.pinnedHeapBytes = sizes.pinnedHeapBytes;
  auto header = ring::planSegment(plan);
  if (!header) throw std::invalid_argument("data-plane segment sizes do not form a valid layout");
  return *header;
}

}  // namespace

std::uint64_t ClientChannel::segmentBytesFor(const ChannelSizes& sizes) {
  return planFor(sizes).segmentBytes;
}

ClientChannel::ClientChannel(CommandExecutor& executor, const std::string& name, ChannelSizes sizes,
                             ipc::AddressReservation* placeInto)
    : executor_(&executor) {
  header_ = planFor(sizes);
  limits_ = ring::limitsOf(header_);
  segment_ = std::make_shared<ipc::SharedSegment>(
      ipc::SharedSegment::create(name, header_.segmentBytes, placeInto));
  std::memcpy(segment_->data(), &header_, sizeof(header_));
  auto commandRegion = regionOf(*segment_, header_.commandRings);
  auto completionRegion = regionOf(*segment_, header_.completionRing);
  ipc::initializeRing(commandRegion, ringCapacity(commandRegion.size()));
  ipc::initializeRing(completionRegion, ringCapacity(completionRegion.size()));
  commands_.emplace(commandRegion, ringCapacity(commandRegion.size()));
  completions_.emplace(completionRegion, ringCapacity(completionRegion.size()));
  doorbell_ = ipc::makeEventFd();
  waiter_.emplace(commands_->consumerSleeping(), doorbell_.get());
  auto* control = reinterpret_cast<ipc::CompletionWord*>(segment_->data() + header_.control.offset);
  static_assert(sizeof(ipc::CompletionWord) <= sizeof(ring::wire::ControlBlock));
  static_assert(offsetof(ipc::CompletionWord, value) ==
                offsetof(ring::wire::ControlBlock, completionsPublished));
  static_assert(offsetof(ipc::CompletionWord, waiters) ==
                offsetof(ring::wire::ControlBlock, completionWaiters));
  publisher_.emplace(*control);
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
    executor_->execute(ring::decodeCommand(record_, limits_), *this);
  }
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
  // The decoder has checked offset + bytes against the region's size (limits_).
  if (location.region != ring::HostRegion::kStaging &&
      location.region != ring::HostRegion::kPinnedHeap) {
    throw std::logic_error("a record naming no region of the segment reached the executor");
  }
  const ring::wire::Region& region =
      location.region == ring::HostRegion::kStaging ? header_.staging : header_.pinnedHeap;
  if (location.offset > region.bytes || bytes > region.bytes - location.offset) {
    throw std::logic_error("host range outside its region reached the executor");
  }
  return {segment_->data() + region.offset + location.offset, bytes};
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
  if (written > 0) {
    published_ += static_cast<std::uint32_t>(written);
    publisher_->publish(published_);
  }
}

}  // namespace gpuproxy::server
