// Fuzz target: shared-memory ring records (protocol/ring_format.hpp). Every input is tried as a
// command record, as a completion record and as a segment header. The property: whatever decodes
// re-encodes to exactly the input bytes, so the decoder accepts only the canonical form and loses
// nothing the daemon would act on. Seeds: one valid record per opcode and completion kind.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <type_traits>
#include <variant>
#include <vector>

#include "protocol/ring_format.hpp"

namespace ring = gpuproxy::protocol::ring;

namespace {

// Region sizes the seeds' offsets fit in; small enough that the fuzzer reaches both edges.
constexpr ring::SegmentLimits kLimits{1u << 20, 16u << 20, std::nullopt};

void requireReencodes(std::span<const std::byte> input, const auto& decoded) {
  std::vector<std::byte> out(input.size() + 64, std::byte{0xAA});
  const std::size_t written = ring::encode(decoded, out);
  if (written != input.size() || std::memcmp(out.data(), input.data(), written) != 0) {
    std::abort();
  }
}

void checkCommand(std::span<const std::byte> input) {
  const ring::DecodedCommand decoded = ring::decodeCommand(input, kLimits);
  if (const auto* error = std::get_if<ring::DecodeError>(&decoded)) {
    // Only framing failures may drop the client; a failed command must name a sequence the
    // daemon's merge can move past, which needs a readable header.
    if (!error->disconnect && input.size() < ring::kCommandHeaderBytes) std::abort();
    if (error->result == CUDA_SUCCESS) std::abort();
    return;
  }
  if (input.size() > ring::kMaxCommandRecordBytes || input.size() % ring::kRecordAlignment != 0) {
    std::abort();
  }
  std::visit(
      [&](const auto& command) {
        using T = std::decay_t<decltype(command)>;
        if constexpr (!std::is_same_v<T, ring::DecodeError>) requireReencodes(input, command);
      },
      decoded);
}

void checkCompletion(std::span<const std::byte> input) {
  const ring::DecodedCompletion decoded = ring::decodeCompletion(input, kLimits);
  std::visit(
      [&](const auto& completion) {
        using T = std::decay_t<decltype(completion)>;
        if constexpr (!std::is_same_v<T, ring::DecodeError>) requireReencodes(input, completion);
      },
      decoded);
}

void checkSegmentHeader(std::span<const std::byte> input) {
  const auto read = ring::readSegmentHeader(input);
  const auto* header = std::get_if<ring::wire::SegmentHeader>(&read);
  if (header == nullptr) return;
  // An accepted header describes regions the client can map and index without overflow.
  auto requireInside = [&](const ring::wire::Region& region) {
    if (region.offset > input.size() || region.bytes > input.size() - region.offset) std::abort();
  };
  for (const ring::wire::Region& region : {header->commandRings, header->completionRings,
                                           header->control, header->staging, header->pinnedHeap}) {
    requireInside(region);
  }
  // And every ring pair in them, each big enough to hold a ring.
  for (std::uint32_t i = 0; i < header->commandRingCount; ++i) {
    for (const ring::wire::Region& pair :
         {ring::commandRing(*header, i), ring::completionRing(*header, i)}) {
      requireInside(pair);
      if (pair.bytes == 0) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  checkCommand(input);
  checkCompletion(input);
  checkSegmentHeader(input);
  return 0;
}
