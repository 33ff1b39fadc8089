#include "server/data_plane/client_segment.hpp"

#include "ipc/spsc_ring.hpp"

#include <cstring>
#include <stdexcept>

namespace gpuproxy::server {

namespace ring = protocol::ring;

namespace {

ring::wire::SegmentHeader planFor(const ChannelSizes& sizes) {
  ring::SegmentPlan plan;
  plan.commandRingCount = sizes.ringPairs;
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

std::uint64_t ClientSegment::bytesFor(const ChannelSizes& sizes) {
  return planFor(sizes).segmentBytes;
}

ClientSegment::ClientSegment(const std::string& name, ChannelSizes sizes,
                             ipc::AddressReservation* placeInto)
    : header_(planFor(sizes)),
      limits_(ring::limitsOf(header_)),
      segment_(ipc::SharedSegment::create(name, header_.segmentBytes, placeInto)) {
  std::memcpy(segment_.data(), &header_, sizeof(header_));
  for (std::uint32_t i = 0; i < ringPairs(); ++i) {
    for (std::span<std::byte> region : {commandRing(i), completionRing(i)}) {
      ipc::initializeRing(region, ipc::ringCapacityOf(region.size()));
    }
  }
  static_assert(sizeof(ipc::CompletionWord) <= sizeof(ring::wire::ControlBlock));
  static_assert(offsetof(ipc::CompletionWord, value) ==
                offsetof(ring::wire::ControlBlock, completionsPublished));
  static_assert(offsetof(ipc::CompletionWord, waiters) ==
                offsetof(ring::wire::ControlBlock, completionWaiters));
}

std::span<std::byte> ClientSegment::commandRing(std::uint32_t index) const {
  return regionOf(ring::commandRing(header_, index));
}

std::span<std::byte> ClientSegment::completionRing(std::uint32_t index) const {
  return regionOf(ring::completionRing(header_, index));
}

ipc::CompletionWord& ClientSegment::completionWord() const {
  return *reinterpret_cast<ipc::CompletionWord*>(segment_.data() + header_.control.offset);
}

std::span<std::byte> ClientSegment::hostBytes(const ring::HostLocation& location,
                                              std::uint64_t bytes) const {
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
  return {segment_.data() + region.offset + location.offset, static_cast<std::size_t>(bytes)};
}

}  // namespace gpuproxy::server
