#pragma once
// One client's shared segment (protocol/RING_FORMAT.md): the sealed memfd the daemon made for it,
// holding a command ring and a completion ring per GPU the client may use, the control block, the
// staging area and the pinned heap. Each ring pair is served by its own ClientChannel (the
// channel of one GPU); what they share is here: the mapping, the layout the daemon planned (never
// read back from the segment, which the client can scribble on), the host regions records name,
// and the completion word every channel bumps.

#include "ipc/doorbell.hpp"
#include "ipc/shared_segment.hpp"
#include "protocol/ring_format.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace gpuproxy::server {

struct ChannelSizes {
  // Command rings, and as many completion rings: one pair per device the client may use.
  std::uint32_t ringPairs = 1;
  std::size_t commandRingCapacity = std::size_t{1} << 20;     // each
  std::size_t completionRingCapacity = std::size_t{1} << 16;  // each
  std::size_t stagingBytes = std::size_t{16} << 20;
  std::size_t pinnedHeapBytes = 0;  // rounded up to a page
};

class ClientSegment {
public:
  // Creates the segment (named `name` in /proc/PID/maps), lays it out and initialises every ring.
  // With `placeInto` (exactly bytesFor(sizes) long) the segment is mapped there, at the address
  // the client reserved for it too, so that pointers into its pinned heap are the same in both
  // processes. Throws std::system_error when the kernel refuses the memfd.
  ClientSegment(const std::string& name, ChannelSizes sizes,
                ipc::AddressReservation* placeInto = nullptr);
  // The size of the segment with these sizes; throws std::invalid_argument when they form no
  // valid layout.
  static std::uint64_t bytesFor(const ChannelSizes& sizes);
  ClientSegment(const ClientSegment&) = delete;
  ClientSegment& operator=(const ClientSegment&) = delete;

  // What the client is handed (borrowed).
  int fd() const { return segment_.fd(); }
  std::uint64_t bytes() const { return segment_.size(); }
  std::uint32_t ringPairs() const { return header_.commandRingCount; }
  // Ring pair `index` (< ringPairs()), each its own ipc/ SPSC ring, initialised.
  std::span<std::byte> commandRing(std::uint32_t index) const;
  std::span<std::byte> completionRing(std::uint32_t index) const;
  // The word every completion ring's channel adds to after it writes (ipc::CompletionPublisher).
  ipc::CompletionWord& completionWord() const;
  // The pinned heap region in the daemon's mapping (empty when there is none).
  std::span<std::byte> pinnedHeap() const { return regionOf(header_.pinnedHeap); }
  // The limits every record of this segment's rings is decoded with.
  const protocol::ring::SegmentLimits& limits() const { return limits_; }
  // The bytes of a host location in the staging area or pinned heap, already checked by the
  // decoder against limits(); anything else is our bug (std::logic_error).
  std::span<std::byte> hostBytes(const protocol::ring::HostLocation& location,
                                 std::uint64_t bytes) const;

private:
  std::span<std::byte> regionOf(const protocol::ring::wire::Region& region) const {
    return {segment_.data() + region.offset, static_cast<std::size_t>(region.bytes)};
  }

  protocol::ring::wire::SegmentHeader header_;
  protocol::ring::SegmentLimits limits_;
  ipc::SharedSegment segment_;
};

}  // namespace gpuproxy::server
