#include "client/stub/ring_sink.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <variant>

#include "client/stub/data_plane.hpp"
#include "client/stub/device_output.hpp"
#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

namespace ring = protocol::ring;

CUresult RingSink::enqueue(ring::Command& command) {
  const std::uint32_t bytes =
      std::visit([](const auto& body) { return ring::encodedSize(body); }, command);
  // A ring too small for this record (a launch with a large parameter buffer): the control
  // socket takes it, after the daemon has run everything already in the ring.
  if (!plane_.fits(bytes)) return fallback_.enqueue(command);
  return std::visit([&](auto& body) { return plane_.submitCommand(body); }, command);
}

CUresult RingSink::synchronize(std::uint64_t context, ring::SynchronizeKind kind,
                               std::uint64_t handle, bool query) {
  const CUresult result = plane_.synchronize(context, kind, handle, query);
  printDeviceOutputIfAny();
  return result;
}

void RingSink::printDeviceOutputIfAny() {
  if (!plane_.takeDeviceOutputPending()) return;
  if (Runtime* runtime = Runtime::instance()) printDeviceOutput(*runtime);
}

void RingSink::eventRecorded(std::uint64_t event, std::uint64_t stream) {
  plane_.noteEventRecorded(event, stream);
}

void RingSink::eventDestroyed(std::uint64_t event) {
  plane_.forgetEvent(event);
}

void RingSink::contextGone(std::uint64_t context) {
  plane_.forgetContext(context);
}

CUresult RingSink::copyHostToDevice(const StreamTarget& target, CUdeviceptr destination,
                                    const void* source, std::size_t bytes, bool blocking) {
  if (auto offset = plane_.pinnedHeap().offsetInAllocation(source, bytes)) {
    ring::CopyHostToDevice command;
    command.destination = destination;
    command.source = ring::HostLocation{ring::HostRegion::kPinnedHeap, *offset};
    command.bytes = bytes;
    return pinnedCopy(target, command, blocking);
  }
  if (plane_.chunkBytes() == 0) {
    return fallback_.copyHostToDevice(target, destination, source, bytes, blocking);
  }
  return stagedHostToDevice(target, destination, source, bytes);
}

CUresult RingSink::copyDeviceToHost(const StreamTarget& target, void* destination,
                                    CUdeviceptr source, std::size_t bytes, bool blocking) {
  if (auto offset = plane_.pinnedHeap().offsetInAllocation(destination, bytes)) {
    ring::CopyDeviceToHost command;
    command.source = source;
    command.destination = ring::HostLocation{ring::HostRegion::kPinnedHeap, *offset};
    command.bytes = bytes;
    return pinnedCopy(target, command, blocking);
  }
  if (plane_.chunkBytes() == 0) {
    return fallback_.copyDeviceToHost(target, destination, source, bytes, blocking);
  }
  const CUresult result = stagedDeviceToHost(target, destination, source, bytes);
  printDeviceOutputIfAny();
  return result;
}

template <typename Command>
CUresult RingSink::pinnedCopy(const StreamTarget& target, Command& command, bool blocking) {
  command.context = target.context;
  command.stream = target.stream;
  command.chunkIndex = 0;
  command.lastChunk = true;
  command.completionToken = blocking ? plane_.newToken() : 0;
  if (CUresult submitted = plane_.submitCommand(command); submitted != CUDA_SUCCESS) {
    return submitted;
  }
  if (!blocking) return CUDA_SUCCESS;
  const CUresult result = plane_.waitFor(command.completionToken);
  printDeviceOutputIfAny();
  if (result != CUDA_SUCCESS) return result;
  return plane_.takeAsyncError(target.context);
}

// Chunk by chunk through the staging area: fill a range, publish its record, go on with the next
// chunk while the daemon moves this one. The daemon gives each range back once it has copied the
// bytes out. Returns once every chunk is staged: the caller's buffer is free again, as CUDA
// promises for pageable memory.
CUresult RingSink::stagedHostToDevice(const StreamTarget& target, CUdeviceptr destination,
                                      const void* source, std::size_t bytes) {
  const auto* from = static_cast<const std::byte*>(source);
  const std::uint64_t chunk = plane_.chunkBytes();
  std::uint32_t index = 0;
  for (std::size_t position = 0; position < bytes; ++index) {
    const std::size_t length =
        static_cast<std::size_t>(std::min<std::uint64_t>(chunk, bytes - position));
    std::optional<StagingAllocator::Range> range = plane_.allocateStaging(length, nullptr);
    if (!range) return CUDA_ERROR_MPS_CONNECTION_FAILED;
    std::memcpy(plane_.staging().data() + range->offset, from + position, length);
    ring::CopyHostToDevice command;
    command.context = target.context;
    command.stream = target.stream;
    command.destination = destination + position;
    command.source = ring::HostLocation{ring::HostRegion::kStaging, range->offset};
    command.bytes = length;
    command.chunkIndex = index;
    command.lastChunk = position + length == bytes;
    CUresult submitted = plane_.submitCommand(command);
    if (submitted != CUDA_SUCCESS) {
      plane_.releaseStaging(*range);
      return submitted;
    }
    position += length;
  }
  return CUDA_SUCCESS;
}

// Chunk by chunk the other way: each chunk's record carries a token the daemon answers once the
// bytes are in the staging area; they are copied out in order, and the range reused. Up to a
// staging area's worth of chunks is in flight. Returns once the bytes are in the caller's buffer.
CUresult RingSink::stagedDeviceToHost(const StreamTarget& target, void* destination,
                                      CUdeviceptr source, std::size_t bytes) {
  auto* to = static_cast<std::byte*>(destination);
  struct InFlight {
    StagingAllocator::Range range;
    std::uint64_t token = 0;
    std::size_t position = 0;
  };
  std::deque<InFlight> inFlight;
  CUresult failure = CUDA_SUCCESS;
  // Lands the oldest chunk; false when none is in flight.
  auto finishOldest = [&]() {
    if (inFlight.empty()) return false;
    const InFlight chunk = inFlight.front();
    inFlight.pop_front();
    const CUresult result = plane_.waitFor(chunk.token);
    if (result != CUDA_SUCCESS) {
      if (failure == CUDA_SUCCESS) failure = result;
    } else if (failure == CUDA_SUCCESS) {
      std::memcpy(to + chunk.position, plane_.staging().data() + chunk.range.offset,
                  chunk.range.bytes);
    }
    plane_.releaseStaging(chunk.range);
    return true;
  };
  const std::uint64_t chunk = plane_.chunkBytes();
  std::uint32_t index = 0;
  for (std::size_t position = 0; position < bytes && failure == CUDA_SUCCESS; ++index) {
    const std::size_t length =
        static_cast<std::size_t>(std::min<std::uint64_t>(chunk, bytes - position));
    std::optional<StagingAllocator::Range> range = plane_.allocateStaging(length, finishOldest);
    if (!range) {
      failure = CUDA_ERROR_MPS_CONNECTION_FAILED;
      break;
    }
    if (failure != CUDA_SUCCESS) {
      plane_.releaseStaging(*range);
      break;
    }
    ring::CopyDeviceToHost command;
    command.context = target.context;
    command.stream = target.stream;
    command.source = source + position;
    command.destination = ring::HostLocation{ring::HostRegion::kStaging, range->offset};
    command.bytes = length;
    command.completionToken = plane_.newToken();
    command.chunkIndex = index;
    command.lastChunk = position + length == bytes;
    CUresult submitted = plane_.submitCommand(command);
    if (submitted != CUDA_SUCCESS) {
      plane_.releaseStaging(*range);
      failure = submitted;
      break;
    }
    inFlight.push_back(InFlight{*range, command.completionToken, position});
    position += length;
  }
  while (finishOldest()) {
  }
  if (failure != CUDA_SUCCESS) return failure;
  // A blocking copy reports what earlier asynchronous work in this context ran into.
  return plane_.takeAsyncError(target.context);
}

}  // namespace gpuproxy::stub
