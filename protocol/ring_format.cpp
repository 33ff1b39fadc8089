#include "protocol/ring_format.hpp"

#include "protocol/cuda_result.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <type_traits>

namespace gpuproxy::protocol::ring {
namespace {

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

// Records come at any alignment (a fuzzer's buffer, an offset in a copy), so every field is read
// and written with memcpy, never through a cast pointer.
template <typename T>
T load(std::span<const std::byte> bytes, std::size_t offset) {
  static_assert(std::is_trivially_copyable_v<T>);
  T value{};
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

template <typename T>
void store(std::span<std::byte> out, std::size_t offset, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

bool allZero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

template <typename T, std::size_t N>
bool allZero(const T (&values)[N]) {
  return std::all_of(std::begin(values), std::end(values), [](T v) { return v == T{0}; });
}

constexpr std::uint64_t roundUp(std::uint64_t value, std::uint64_t granule) {
  return (value + granule - 1) / granule * granule;
}

// [offset, offset + bytes) inside a region of regionBytes, without computing offset + bytes.
bool insideRegion(std::uint64_t offset, std::uint64_t bytes, std::uint64_t regionBytes) {
  return offset <= regionBytes && bytes <= regionBytes - offset;
}

bool wraps(std::uint64_t pointer, std::uint64_t bytes) {
  return bytes > kU64Max - pointer;
}

std::optional<std::uint64_t> regionBytes(std::uint8_t region, const SegmentLimits& limits) {
  switch (static_cast<HostRegion>(region)) {
    case HostRegion::kStaging:
      return limits.stagingBytes;
    case HostRegion::kPinnedHeap:
      return limits.pinnedHeapBytes;
    case HostRegion::kMessage:
      return limits.messageBytes;
  }
  return std::nullopt;
}

bool isKnownOpcode(std::uint16_t opcode) {
  return Commands::knows(opcode);
}

DecodeError framingError(DecodeFailure failure, std::uint16_t opcode = 0,
                         std::uint64_t sequence = 0) {
  DecodeError error;
  error.failure = failure;
  error.result = failure == DecodeFailure::kUnknownOpcode || failure == DecodeFailure::kUnknownFlags
                     ? CUDA_ERROR_NOT_SUPPORTED
                     : CUDA_ERROR_INVALID_VALUE;
  error.disconnect = true;
  error.opcode = opcode;
  error.sequence = sequence;
  return error;
}

// Checks shared by every command: the header's promises about the record as a whole, and the
// body's shape (exact length, flags, reserved bytes). Value checks come after, per opcode, so
// that a record that is wrong in both ways disconnects.
class CommandReader {
public:
  CommandReader(std::span<const std::byte> record, const wire::CommandHeader& header)
      : record_(record), header_(header) {}

  std::span<const std::byte> body() const { return record_.subspan(kCommandHeaderBytes); }

  template <typename Body>
  std::optional<DecodeError> checkShape(std::uint16_t allowedFlags) const {
    if (record_.size() != kCommandHeaderBytes + sizeof(Body))
      return shapeError(DecodeFailure::kWrongLength);
    return checkFlags(allowedFlags);
  }

  std::optional<DecodeError> checkFlags(std::uint16_t allowedFlags) const {
    if ((header_.flags & ~allowedFlags) != 0) return shapeError(DecodeFailure::kUnknownFlags);
    return std::nullopt;
  }

  DecodeError shapeError(DecodeFailure failure) const {
    return framingError(failure, header_.opcode, header_.sequence);
  }

  // A well-formed command with a bad argument: only this command fails.
  DecodeError valueError(DecodeFailure failure, Handle context, Handle stream,
                         std::uint64_t completionToken = 0) const {
    DecodeError error;
    error.failure = failure;
    error.result = CUDA_ERROR_INVALID_VALUE;
    error.disconnect = false;
    error.opcode = header_.opcode;
    error.sequence = header_.sequence;
    error.context = context;
    error.stream = stream;
    error.completionToken = completionToken;
    return error;
  }

  std::uint64_t sequence() const { return header_.sequence; }
  bool flag(std::uint16_t bit) const { return (header_.flags & bit) != 0; }

private:
  std::span<const std::byte> record_;
  wire::CommandHeader header_;
};

DecodedCommand decodeLaunchKernel(const CommandReader& reader, std::span<const std::byte> record,
                                  const SegmentLimits& limits) {
  if (record.size() < kLaunchKernelFixedBytes) {
    return reader.shapeError(DecodeFailure::kWrongLength);
  }
  if (auto error = reader.checkFlags(kLaunchParametersByReference | kLaunchCooperative)) {
    return *error;
  }
  const auto body = load<wire::LaunchKernelBody>(reader.body(), 0);
  const bool byReference = reader.flag(kLaunchParametersByReference);
  const std::uint64_t expectedLength =
      byReference ? kLaunchKernelFixedBytes
                  : kLaunchKernelFixedBytes + roundUp(body.parameterBytes, kRecordAlignment);
  if (record.size() != expectedLength) return reader.shapeError(DecodeFailure::kWrongLength);
  if (!allZero(body.reserved)) return reader.shapeError(DecodeFailure::kReservedNotZero);
  const auto parameterArea = record.subspan(kLaunchKernelFixedBytes);
  if (!byReference) {
    if (body.parameterOffset != 0 || body.parameterRegion != 0 ||
        !allZero(parameterArea.subspan(body.parameterBytes))) {
      return reader.shapeError(DecodeFailure::kReservedNotZero);
    }
  }

  auto fail = [&](DecodeFailure failure) {
    return reader.valueError(failure, body.context, body.stream);
  };
  if (body.parameterBytes > kMaxParameterBytes) return fail(DecodeFailure::kParameterBytesTooLarge);
  LaunchKernel launch;
  if (byReference) {
    const auto bytes = regionBytes(body.parameterRegion, limits);
    if (!bytes) return fail(DecodeFailure::kBadRegion);
    if (!insideRegion(body.parameterOffset, body.parameterBytes, *bytes)) {
      return fail(DecodeFailure::kRangeOutsideRegion);
    }
    launch.parameterReference =
        HostLocation{static_cast<HostRegion>(body.parameterRegion), body.parameterOffset};
  } else {
    launch.inlineParameters = parameterArea.first(body.parameterBytes);
  }
  const bool zeroDimension =
      std::find(std::begin(body.grid), std::end(body.grid), 0u) != std::end(body.grid) ||
      std::find(std::begin(body.block), std::end(body.block), 0u) != std::end(body.block);
  if (zeroDimension) return fail(DecodeFailure::kZeroDimension);

  launch.sequence = reader.sequence();
  launch.context = body.context;
  launch.function = body.function;
  launch.stream = body.stream;
  launch.grid = Dim3{body.grid[0], body.grid[1], body.grid[2]};
  launch.block = Dim3{body.block[0], body.block[1], body.block[2]};
  launch.sharedMemBytes = body.sharedMemBytes;
  launch.parameterBytes = body.parameterBytes;
  launch.cooperative = reader.flag(kLaunchCooperative);
  return launch;
}

// The parts of CopyHostToDevice and CopyDeviceToHost that are the same.
struct HostCopy {
  wire::HostCopyBody body;
  HostLocation host;
  bool lastChunk;
};

std::variant<HostCopy, DecodeError> decodeHostCopy(const CommandReader& reader,
                                                   const SegmentLimits& limits,
                                                   bool completionRequiredForStaging) {
  if (auto error = reader.checkShape<wire::HostCopyBody>(kCopyLastChunk)) return *error;
  const auto body = load<wire::HostCopyBody>(reader.body(), 0);
  if (!allZero(body.reserved)) return reader.shapeError(DecodeFailure::kReservedNotZero);

  auto fail = [&](DecodeFailure failure) {
    return reader.valueError(failure, body.context, body.stream, body.completionToken);
  };
  const auto bytes = regionBytes(body.hostRegion, limits);
  if (!bytes) return fail(DecodeFailure::kBadRegion);
  if (!insideRegion(body.hostOffset, body.bytes, *bytes)) {
    return fail(DecodeFailure::kRangeOutsideRegion);
  }
  if (wraps(body.devicePointer, body.bytes)) return fail(DecodeFailure::kRangeOverflow);
  const auto region = static_cast<HostRegion>(body.hostRegion);
  const bool lastChunk = reader.flag(kCopyLastChunk);
  // Chunks exist for the staging pipeline only; a pinned copy is DMA straight from the app's
  // buffer and travels as one record.
  if (region == HostRegion::kPinnedHeap && (body.chunkIndex != 0 || !lastChunk)) {
    return fail(DecodeFailure::kBadChunk);
  }
  // Without a completion the client could never tell when staged D2H bytes are there to read (nor
  // the daemon when to answer the call whose payload they fill).
  if (completionRequiredForStaging && region != HostRegion::kPinnedHeap &&
      body.completionToken == 0) {
    return fail(DecodeFailure::kMissingCompletionToken);
  }
  return HostCopy{body, HostLocation{region, body.hostOffset}, lastChunk};
}

DecodedCommand decodeCopyHostToDevice(const CommandReader& reader, const SegmentLimits& limits) {
  auto decoded = decodeHostCopy(reader, limits, false);
  if (auto* error = std::get_if<DecodeError>(&decoded)) return *error;
  const auto& copy = std::get<HostCopy>(decoded);
  CopyHostToDevice command;
  command.sequence = reader.sequence();
  command.context = copy.body.context;
  command.stream = copy.body.stream;
  command.destination = copy.body.devicePointer;
  command.source = copy.host;
  command.bytes = copy.body.bytes;
  command.completionToken = copy.body.completionToken;
  command.chunkIndex = copy.body.chunkIndex;
  command.lastChunk = copy.lastChunk;
  return command;
}

DecodedCommand decodeCopyDeviceToHost(const CommandReader& reader, const SegmentLimits& limits) {
  auto decoded = decodeHostCopy(reader, limits, true);
  if (auto* error = std::get_if<DecodeError>(&decoded)) return *error;
  const auto& copy = std::get<HostCopy>(decoded);
  CopyDeviceToHost command;
  command.sequence = reader.sequence();
  command.context = copy.body.context;
  command.stream = copy.body.stream;
  command.source = copy.body.devicePointer;
  command.destination = copy.host;
  command.bytes = copy.body.bytes;
  command.completionToken = copy.body.completionToken;
  command.chunkIndex = copy.body.chunkIndex;
  command.lastChunk = copy.lastChunk;
  return command;
}

DecodedCommand decodeCopyDeviceToDevice(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::CopyDeviceToDeviceBody>(0)) return *error;
  const auto body = load<wire::CopyDeviceToDeviceBody>(reader.body(), 0);
  if (wraps(body.destination, body.bytes) || wraps(body.source, body.bytes)) {
    return reader.valueError(DecodeFailure::kRangeOverflow, body.context, body.stream);
  }
  return CopyDeviceToDevice{reader.sequence(), body.context, body.stream,
                            body.destination,  body.source,  body.bytes};
}

DecodedCommand decodeMemset(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::MemsetBody>(0)) return *error;
  const auto body = load<wire::MemsetBody>(reader.body(), 0);
  if (!allZero(body.reserved)) return reader.shapeError(DecodeFailure::kReservedNotZero);
  auto fail = [&](DecodeFailure failure) {
    return reader.valueError(failure, body.context, body.stream);
  };
  const std::uint8_t size = body.elementSize;
  if (size != 1 && size != 2 && size != 4) return fail(DecodeFailure::kBadElementSize);
  if (size < 4 && (body.value >> (8 * size)) != 0) return fail(DecodeFailure::kValueTooWide);
  if (body.count > kU64Max / size || wraps(body.destination, body.count * size)) {
    return fail(DecodeFailure::kRangeOverflow);
  }
  return Memset{reader.sequence(), body.context, body.stream, body.destination,
                body.count,        body.value,   size};
}

DecodedCommand decodeMemset2D(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::Memset2DBody>(0)) return *error;
  const auto body = load<wire::Memset2DBody>(reader.body(), 0);
  if (!allZero(body.reserved)) return reader.shapeError(DecodeFailure::kReservedNotZero);
  auto fail = [&](DecodeFailure failure) {
    return reader.valueError(failure, body.context, body.stream);
  };
  const std::uint8_t size = body.elementSize;
  if (size != 1 && size != 2 && size != 4) return fail(DecodeFailure::kBadElementSize);
  if (size < 4 && (body.value >> (8 * size)) != 0) return fail(DecodeFailure::kValueTooWide);
  // The bytes from the first row's start to the last row's end must be a range that exists.
  if (body.width > kU64Max / size) return fail(DecodeFailure::kRangeOverflow);
  const std::uint64_t rowBytes = body.width * size;
  if (body.height > 1) {
    if (body.pitch > (kU64Max - rowBytes) / (body.height - 1)) {
      return fail(DecodeFailure::kRangeOverflow);
    }
    if (wraps(body.destination, body.pitch * (body.height - 1) + rowBytes)) {
      return fail(DecodeFailure::kRangeOverflow);
    }
  } else if (wraps(body.destination, rowBytes)) {
    return fail(DecodeFailure::kRangeOverflow);
  }
  Memset2D command;
  command.sequence = reader.sequence();
  command.context = body.context;
  command.stream = body.stream;
  command.destination = body.destination;
  command.pitch = body.pitch;
  command.width = body.width;
  command.height = body.height;
  command.value = body.value;
  command.elementSize = size;
  return command;
}

DecodedCommand decodeEventRecord(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::EventRecordBody>(0)) return *error;
  const auto body = load<wire::EventRecordBody>(reader.body(), 0);
  if (body.reserved != 0) return reader.shapeError(DecodeFailure::kReservedNotZero);
  if ((body.recordFlags & ~static_cast<std::uint32_t>(CU_EVENT_RECORD_EXTERNAL)) != 0) {
    return reader.valueError(DecodeFailure::kBadFlags, body.context, body.stream);
  }
  return EventRecord{reader.sequence(), body.context, body.event, body.stream, body.recordFlags};
}

DecodedCommand decodeStreamWaitEvent(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::StreamWaitEventBody>(0)) return *error;
  const auto body = load<wire::StreamWaitEventBody>(reader.body(), 0);
  if (body.reserved != 0) return reader.shapeError(DecodeFailure::kReservedNotZero);
  if ((body.waitFlags & ~static_cast<std::uint32_t>(CU_EVENT_WAIT_EXTERNAL)) != 0) {
    return reader.valueError(DecodeFailure::kBadFlags, body.context, body.stream);
  }
  return StreamWaitEvent{reader.sequence(), body.context, body.stream, body.event, body.waitFlags};
}

DecodedCommand decodeSynchronize(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::SynchronizeBody>(kSynchronizeQuery)) return *error;
  const auto body = load<wire::SynchronizeBody>(reader.body(), 0);
  if (!allZero(body.reserved)) return reader.shapeError(DecodeFailure::kReservedNotZero);
  const auto kind = static_cast<SynchronizeKind>(body.kind);
  const Handle stream = kind == SynchronizeKind::kStream ? body.handle : 0;
  auto fail = [&](DecodeFailure failure) {
    return reader.valueError(failure, body.context, stream, body.completionToken);
  };
  if (kind != SynchronizeKind::kStream && kind != SynchronizeKind::kEvent &&
      kind != SynchronizeKind::kContext) {
    return fail(DecodeFailure::kBadSynchronizeKind);
  }
  if (kind == SynchronizeKind::kContext && body.handle != 0) return fail(DecodeFailure::kBadHandle);
  if (body.completionToken == 0) return fail(DecodeFailure::kMissingCompletionToken);
  return Synchronize{reader.sequence(), body.context,         kind,
                     body.handle,       body.completionToken, reader.flag(kSynchronizeQuery)};
}

// HostFunction, HostFunctionReturned and HoldForEvent share their body.
template <typename Record>
DecodedCommand decodeHostFunction(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::HostFunctionBody>(0)) return *error;
  const auto body = load<wire::HostFunctionBody>(reader.body(), 0);
  if (body.completionToken == 0) {
    return reader.valueError(DecodeFailure::kMissingCompletionToken, body.context, body.stream);
  }
  return Record{reader.sequence(), body.context, body.stream, body.completionToken};
}

DecodedCommand decodeLetGoAfterEvent(const CommandReader& reader) {
  if (auto error = reader.checkShape<wire::LetGoAfterEventBody>(0)) return *error;
  const auto body = load<wire::LetGoAfterEventBody>(reader.body(), 0);
  // Told to the waiting stream, whose hold nothing can name then.
  if (body.token == 0) {
    return reader.valueError(DecodeFailure::kMissingCompletionToken, body.waiterContext,
                             body.waiterStream);
  }
  return LetGoAfterEvent{reader.sequence(), body.context,       body.event,
                         body.token,        body.waiterContext, body.waiterStream};
}

// Common framing of both record kinds: the header's length is the record's size, aligned and
// within the format's maximum.
std::optional<DecodeFailure> checkFraming(std::size_t recordBytes, std::uint32_t length,
                                          std::uint32_t maxBytes) {
  if (length > maxBytes) return DecodeFailure::kTooLong;
  if (length != recordBytes) return DecodeFailure::kLengthMismatch;
  if (length % kRecordAlignment != 0) return DecodeFailure::kMisalignedLength;
  return std::nullopt;
}

std::uint32_t commandBytes(std::size_t bodyBytes) {
  return static_cast<std::uint32_t>(kCommandHeaderBytes + bodyBytes);
}

// Writes the header and body of a fixed-size command, zeroing everything else.
template <typename Body>
std::size_t writeCommand(Opcode opcode, std::uint16_t flags, std::uint64_t sequence,
                         const Body& body, std::span<std::byte> out) {
  const std::uint32_t length = commandBytes(sizeof(Body));
  if (out.size() < length) return 0;
  store(out, 0, wire::CommandHeader{static_cast<std::uint16_t>(opcode), flags, length, sequence});
  store(out, kCommandHeaderBytes, body);
  return length;
}

template <typename Body>
std::size_t writeCompletion(CompletionKind kind, const Body& body, std::span<std::byte> out) {
  constexpr std::uint32_t length = sizeof(wire::CompletionHeader) + sizeof(Body);
  if (out.size() < length) return 0;
  store(out, 0, wire::CompletionHeader{static_cast<std::uint16_t>(kind), 0, length});
  store(out, sizeof(wire::CompletionHeader), body);
  return length;
}

wire::HostCopyBody hostCopyBody(Handle context, Handle stream, std::uint64_t devicePointer,
                                const HostLocation& host, std::uint64_t bytes,
                                std::uint64_t completionToken, std::uint32_t chunkIndex) {
  wire::HostCopyBody body{};
  body.context = context;
  body.stream = stream;
  body.devicePointer = devicePointer;
  body.hostOffset = host.offset;
  body.bytes = bytes;
  body.completionToken = completionToken;
  body.chunkIndex = chunkIndex;
  body.hostRegion = static_cast<std::uint8_t>(host.region);
  return body;
}

struct Range {
  std::uint64_t offset;
  std::uint64_t bytes;
};

bool overlap(const Range& a, const Range& b) {
  if (a.bytes == 0 || b.bytes == 0) return false;
  // Both ranges are known to lie inside the segment, so these sums do not wrap.
  return a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

}  // namespace

std::string_view describe(DecodeFailure failure) {
  switch (failure) {
    case DecodeFailure::kTruncated:
      return "record shorter than its header";
    case DecodeFailure::kLengthMismatch:
      return "header length differs from the record's size";
    case DecodeFailure::kMisalignedLength:
      return "record length is not a multiple of 8";
    case DecodeFailure::kTooLong:
      return "record longer than the format allows";
    case DecodeFailure::kUnknownOpcode:
      return "unknown opcode or record kind";
    case DecodeFailure::kUnknownFlags:
      return "flag bits this format version does not define";
    case DecodeFailure::kWrongLength:
      return "record length does not match its opcode";
    case DecodeFailure::kReservedNotZero:
      return "reserved field or padding is not zero";
    case DecodeFailure::kParameterBytesTooLarge:
      return "kernel parameters exceed 32764 bytes";
    case DecodeFailure::kBadRegion:
      return "host region unknown, or not available where the record came from";
    case DecodeFailure::kRangeOutsideRegion:
      return "host range lies outside its region";
    case DecodeFailure::kRangeOverflow:
      return "device range wraps around the address space";
    case DecodeFailure::kZeroDimension:
      return "grid or block dimension is zero";
    case DecodeFailure::kBadElementSize:
      return "memset element size is not 1, 2 or 4";
    case DecodeFailure::kValueTooWide:
      return "memset value does not fit the element size";
    case DecodeFailure::kBadChunk:
      return "chunked copy to or from the pinned heap";
    case DecodeFailure::kMissingCompletionToken:
      return "completion token missing";
    case DecodeFailure::kBadSynchronizeKind:
      return "unknown synchronize kind";
    case DecodeFailure::kBadHandle:
      return "handle must be zero for this kind";
    case DecodeFailure::kBadFlags:
      return "CUDA flags the API does not accept";
    case DecodeFailure::kUnknownResult:
      return "result is not a CUresult";
  }
  return "unknown decode failure";
}

std::optional<wire::CommandHeader> peekCommandHeader(std::span<const std::byte> record) {
  if (record.size() < kCommandHeaderBytes) return std::nullopt;
  return load<wire::CommandHeader>(record, 0);
}

DecodedCommand decodeCommand(std::span<const std::byte> record, const SegmentLimits& limits) {
  const auto header = peekCommandHeader(record);
  if (!header) return framingError(DecodeFailure::kTruncated);
  if (auto failure = checkFraming(record.size(), header->length, kMaxCommandRecordBytes)) {
    return framingError(*failure, header->opcode, header->sequence);
  }
  const CommandReader reader(record, *header);
  if (!isKnownOpcode(header->opcode)) return reader.shapeError(DecodeFailure::kUnknownOpcode);
  switch (static_cast<Opcode>(header->opcode)) {
    case Opcode::kLaunchKernel:
      return decodeLaunchKernel(reader, record, limits);
    case Opcode::kCopyHostToDevice:
      return decodeCopyHostToDevice(reader, limits);
    case Opcode::kCopyDeviceToHost:
      return decodeCopyDeviceToHost(reader, limits);
    case Opcode::kCopyDeviceToDevice:
      return decodeCopyDeviceToDevice(reader);
    case Opcode::kMemset:
      return decodeMemset(reader);
    case Opcode::kEventRecord:
      return decodeEventRecord(reader);
    case Opcode::kStreamWaitEvent:
      return decodeStreamWaitEvent(reader);
    case Opcode::kSynchronize:
      return decodeSynchronize(reader);
    case Opcode::kMemset2D:
      return decodeMemset2D(reader);
    case Opcode::kHostFunction:
      return decodeHostFunction<HostFunction>(reader);
    case Opcode::kHostFunctionReturned:
      return decodeHostFunction<HostFunctionReturned>(reader);
    case Opcode::kHoldForEvent:
      return decodeHostFunction<HoldForEvent>(reader);
    case Opcode::kLetGoAfterEvent:
      return decodeLetGoAfterEvent(reader);
  }
  return reader.shapeError(DecodeFailure::kUnknownOpcode);
}

namespace {

// Only a value cuda.h defines may become a CUresult: any other in an enum object is undefined
// behaviour, and no daemon sends one.
bool isKnownResult(std::int32_t result) {
  return cudaResultName(result).has_value();
}

}  // namespace

DecodedCompletion decodeCompletion(std::span<const std::byte> record, const SegmentLimits& limits) {
  constexpr std::size_t kHeaderBytes = sizeof(wire::CompletionHeader);
  if (record.size() < kHeaderBytes) return framingError(DecodeFailure::kTruncated);
  const auto header = load<wire::CompletionHeader>(record, 0);
  if (auto failure = checkFraming(record.size(), header.length, kMaxCompletionRecordBytes)) {
    return framingError(*failure, header.kind);
  }
  if (header.flags != 0) return framingError(DecodeFailure::kUnknownFlags, header.kind);
  const auto body = record.subspan(kHeaderBytes);
  auto expect = [&](std::size_t bodyBytes) { return body.size() == bodyBytes; };
  switch (static_cast<CompletionKind>(header.kind)) {
    case CompletionKind::kCompletion: {
      if (!expect(sizeof(wire::CompletionBody))) {
        return framingError(DecodeFailure::kWrongLength, header.kind);
      }
      const auto wire = load<wire::CompletionBody>(body, 0);
      if (wire.reserved != 0) return framingError(DecodeFailure::kReservedNotZero, header.kind);
      if (!isKnownResult(wire.result)) {
        return framingError(DecodeFailure::kUnknownResult, header.kind);
      }
      return Completion{wire.token, static_cast<CUresult>(wire.result)};
    }
    case CompletionKind::kAsyncError: {
      if (!expect(sizeof(wire::AsyncErrorBody))) {
        return framingError(DecodeFailure::kWrongLength, header.kind);
      }
      const auto wire = load<wire::AsyncErrorBody>(body, 0);
      if (wire.reserved != 0) return framingError(DecodeFailure::kReservedNotZero, header.kind);
      // The daemon only reports commands it could frame, so the opcode is one it knows.
      if (!isKnownOpcode(wire.opcode)) {
        return framingError(DecodeFailure::kUnknownOpcode, header.kind);
      }
      if (!isKnownResult(wire.result)) {
        return framingError(DecodeFailure::kUnknownResult, header.kind);
      }
      return AsyncError{wire.sequence, wire.context, wire.stream,
                        static_cast<CUresult>(wire.result), wire.opcode};
    }
    case CompletionKind::kStagingRelease: {
      if (!expect(sizeof(wire::StagingReleaseBody))) {
        return framingError(DecodeFailure::kWrongLength, header.kind);
      }
      const auto wire = load<wire::StagingReleaseBody>(body, 0);
      if (!insideRegion(wire.offset, wire.bytes, limits.stagingBytes)) {
        DecodeError error = framingError(DecodeFailure::kRangeOutsideRegion, header.kind);
        error.disconnect = false;
        return error;
      }
      return StagingRelease{wire.offset, wire.bytes};
    }
    case CompletionKind::kDeviceOutput: {
      if (!expect(sizeof(wire::DeviceOutputBody))) {
        return framingError(DecodeFailure::kWrongLength, header.kind);
      }
      return DeviceOutput{load<wire::DeviceOutputBody>(body, 0).bytes};
    }
  }
  return framingError(DecodeFailure::kUnknownOpcode, header.kind);
}

// ---------------------------------------------------------------------------------------------
// Encoders.

std::uint32_t encodedSize(const LaunchKernel& command) {
  if (command.parameterReference) return kLaunchKernelFixedBytes;
  return static_cast<std::uint32_t>(kLaunchKernelFixedBytes +
                                    roundUp(command.inlineParameters.size(), kRecordAlignment));
}
std::uint32_t encodedSize(const CopyHostToDevice&) {
  return commandBytes(sizeof(wire::HostCopyBody));
}
std::uint32_t encodedSize(const CopyDeviceToHost&) {
  return commandBytes(sizeof(wire::HostCopyBody));
}
std::uint32_t encodedSize(const CopyDeviceToDevice&) {
  return commandBytes(sizeof(wire::CopyDeviceToDeviceBody));
}
std::uint32_t encodedSize(const Memset&) {
  return commandBytes(sizeof(wire::MemsetBody));
}
std::uint32_t encodedSize(const EventRecord&) {
  return commandBytes(sizeof(wire::EventRecordBody));
}
std::uint32_t encodedSize(const StreamWaitEvent&) {
  return commandBytes(sizeof(wire::StreamWaitEventBody));
}
std::uint32_t encodedSize(const Synchronize&) {
  return commandBytes(sizeof(wire::SynchronizeBody));
}
std::uint32_t encodedSize(const Memset2D&) {
  return commandBytes(sizeof(wire::Memset2DBody));
}
std::uint32_t encodedSize(const HostFunction&) {
  return commandBytes(sizeof(wire::HostFunctionBody));
}
std::uint32_t encodedSize(const HostFunctionReturned&) {
  return commandBytes(sizeof(wire::HostFunctionBody));
}
std::uint32_t encodedSize(const HoldForEvent&) {
  return commandBytes(sizeof(wire::HostFunctionBody));
}
std::uint32_t encodedSize(const LetGoAfterEvent&) {
  return commandBytes(sizeof(wire::LetGoAfterEventBody));
}
std::uint32_t encodedSize(const Completion&) {
  return sizeof(wire::CompletionHeader) + sizeof(wire::CompletionBody);
}
std::uint32_t encodedSize(const AsyncError&) {
  return sizeof(wire::CompletionHeader) + sizeof(wire::AsyncErrorBody);
}
std::uint32_t encodedSize(const StagingRelease&) {
  return sizeof(wire::CompletionHeader) + sizeof(wire::StagingReleaseBody);
}

std::uint32_t encodedSize(const DeviceOutput&) {
  return sizeof(wire::CompletionHeader) + sizeof(wire::DeviceOutputBody);
}

std::size_t encodeLaunchKernel(const LaunchKernel& command, std::span<std::byte> out) {
  const bool byReference = command.parameterReference.has_value();
  if (!byReference && (command.inlineParameters.size() != command.parameterBytes ||
                       command.parameterBytes > kMaxParameterBytes + kRecordAlignment - 1)) {
    return 0;
  }
  const std::uint32_t length = encodedSize(command);
  if (length > kMaxCommandRecordBytes || out.size() < length) return 0;

  wire::LaunchKernelBody body{};
  body.context = command.context;
  body.function = command.function;
  body.stream = command.stream;
  body.grid[0] = command.grid.x;
  body.grid[1] = command.grid.y;
  body.grid[2] = command.grid.z;
  body.block[0] = command.block.x;
  body.block[1] = command.block.y;
  body.block[2] = command.block.z;
  body.sharedMemBytes = command.sharedMemBytes;
  body.parameterBytes = command.parameterBytes;
  if (byReference) {
    body.parameterOffset = command.parameterReference->offset;
    body.parameterRegion = static_cast<std::uint8_t>(command.parameterReference->region);
  }
  const std::uint16_t flags =
      static_cast<std::uint16_t>((byReference ? kLaunchParametersByReference : 0) |
                                 (command.cooperative ? kLaunchCooperative : 0));
  store(out, 0,
        wire::CommandHeader{static_cast<std::uint16_t>(Opcode::kLaunchKernel), flags, length,
                            command.sequence});
  store(out, kCommandHeaderBytes, body);
  if (!byReference) {
    auto area = out.subspan(kLaunchKernelFixedBytes, length - kLaunchKernelFixedBytes);
    std::fill(area.begin(), area.end(), std::byte{0});
    if (!command.inlineParameters.empty()) {
      std::memcpy(area.data(), command.inlineParameters.data(), command.inlineParameters.size());
    }
  }
  return length;
}

std::size_t encodeCopyHostToDevice(const CopyHostToDevice& command, std::span<std::byte> out) {
  return writeCommand(
      Opcode::kCopyHostToDevice, command.lastChunk ? kCopyLastChunk : 0, command.sequence,
      hostCopyBody(command.context, command.stream, command.destination, command.source,
                   command.bytes, command.completionToken, command.chunkIndex),
      out);
}

std::size_t encodeCopyDeviceToHost(const CopyDeviceToHost& command, std::span<std::byte> out) {
  return writeCommand(
      Opcode::kCopyDeviceToHost, command.lastChunk ? kCopyLastChunk : 0, command.sequence,
      hostCopyBody(command.context, command.stream, command.source, command.destination,
                   command.bytes, command.completionToken, command.chunkIndex),
      out);
}

std::size_t encodeCopyDeviceToDevice(const CopyDeviceToDevice& command, std::span<std::byte> out) {
  const wire::CopyDeviceToDeviceBody body{command.context, command.stream, command.destination,
                                          command.source, command.bytes};
  return writeCommand(Opcode::kCopyDeviceToDevice, 0, command.sequence, body, out);
}

std::size_t encodeMemset(const Memset& command, std::span<std::byte> out) {
  wire::MemsetBody body{};
  body.context = command.context;
  body.stream = command.stream;
  body.destination = command.destination;
  body.count = command.count;
  body.value = command.value;
  body.elementSize = command.elementSize;
  return writeCommand(Opcode::kMemset, 0, command.sequence, body, out);
}

std::size_t encodeEventRecord(const EventRecord& command, std::span<std::byte> out) {
  const wire::EventRecordBody body{command.context, command.event, command.stream, command.flags,
                                   0};
  return writeCommand(Opcode::kEventRecord, 0, command.sequence, body, out);
}

std::size_t encodeStreamWaitEvent(const StreamWaitEvent& command, std::span<std::byte> out) {
  const wire::StreamWaitEventBody body{command.context, command.stream, command.event,
                                       command.flags, 0};
  return writeCommand(Opcode::kStreamWaitEvent, 0, command.sequence, body, out);
}

std::size_t encodeSynchronize(const Synchronize& command, std::span<std::byte> out) {
  wire::SynchronizeBody body{};
  body.context = command.context;
  body.handle = command.handle;
  body.completionToken = command.completionToken;
  body.kind = static_cast<std::uint8_t>(command.kind);
  return writeCommand(Opcode::kSynchronize, command.query ? kSynchronizeQuery : 0, command.sequence,
                      body, out);
}

std::size_t encodeMemset2D(const Memset2D& command, std::span<std::byte> out) {
  wire::Memset2DBody body{};
  body.context = command.context;
  body.stream = command.stream;
  body.destination = command.destination;
  body.pitch = command.pitch;
  body.width = command.width;
  body.height = command.height;
  body.value = command.value;
  body.elementSize = command.elementSize;
  return writeCommand(Opcode::kMemset2D, 0, command.sequence, body, out);
}

std::size_t encodeHostFunction(const HostFunction& command, std::span<std::byte> out) {
  const wire::HostFunctionBody body{command.context, command.stream, command.completionToken};
  return writeCommand(Opcode::kHostFunction, 0, command.sequence, body, out);
}

std::size_t encodeHostFunctionReturned(const HostFunctionReturned& command,
                                       std::span<std::byte> out) {
  const wire::HostFunctionBody body{command.context, command.stream, command.token};
  return writeCommand(Opcode::kHostFunctionReturned, 0, command.sequence, body, out);
}

std::size_t encodeHoldForEvent(const HoldForEvent& command, std::span<std::byte> out) {
  const wire::HostFunctionBody body{command.context, command.stream, command.token};
  return writeCommand(Opcode::kHoldForEvent, 0, command.sequence, body, out);
}

std::size_t encodeLetGoAfterEvent(const LetGoAfterEvent& command, std::span<std::byte> out) {
  const wire::LetGoAfterEventBody body{command.context, command.event, command.token,
                                       command.waiterContext, command.waiterStream};
  return writeCommand(Opcode::kLetGoAfterEvent, 0, command.sequence, body, out);
}

std::size_t encodeCompletion(const Completion& completion, std::span<std::byte> out) {
  const wire::CompletionBody body{completion.token, static_cast<std::int32_t>(completion.result),
                                  0};
  return writeCompletion(CompletionKind::kCompletion, body, out);
}

std::size_t encodeAsyncError(const AsyncError& completion, std::span<std::byte> out) {
  const wire::AsyncErrorBody body{completion.sequence, completion.context,
                                  completion.stream,   static_cast<std::int32_t>(completion.result),
                                  completion.opcode,   0};
  return writeCompletion(CompletionKind::kAsyncError, body, out);
}

std::size_t encodeStagingRelease(const StagingRelease& completion, std::span<std::byte> out) {
  const wire::StagingReleaseBody body{completion.offset, completion.bytes};
  return writeCompletion(CompletionKind::kStagingRelease, body, out);
}

std::size_t encodeDeviceOutput(const DeviceOutput& completion, std::span<std::byte> out) {
  const wire::DeviceOutputBody body{completion.bytes};
  return writeCompletion(CompletionKind::kDeviceOutput, body, out);
}

// ---------------------------------------------------------------------------------------------
// Segment header.

std::string_view describe(SegmentHeaderError error) {
  switch (error) {
    case SegmentHeaderError::kTooSmall:
      return "segment smaller than its header";
    case SegmentHeaderError::kBadMagic:
      return "not a gpuproxy ring segment (bad magic)";
    case SegmentHeaderError::kUnsupportedVersion:
      return "ring format version not supported";
    case SegmentHeaderError::kBadHeaderBytes:
      return "header size does not match the format version";
    case SegmentHeaderError::kReservedNotZero:
      return "reserved header field is not zero";
    case SegmentHeaderError::kSegmentSizeMismatch:
      return "header segment size differs from the mapped size";
    case SegmentHeaderError::kBadRingCount:
      return "command ring count out of range";
    case SegmentHeaderError::kMisaligned:
      return "region offset or size misaligned";
    case SegmentHeaderError::kRegionOutOfBounds:
      return "region extends past the segment";
    case SegmentHeaderError::kRegionsOverlap:
      return "regions overlap";
    case SegmentHeaderError::kEmptyRing:
      return "a ring has no bytes";
  }
  return "unknown segment header error";
}

std::optional<SegmentHeaderError> validateSegmentHeader(const wire::SegmentHeader& header,
                                                        std::uint64_t mappedBytes) {
  if (header.magic != kSegmentMagic) return SegmentHeaderError::kBadMagic;
  if (header.formatVersion != kFormatVersion) return SegmentHeaderError::kUnsupportedVersion;
  if (header.headerBytes != sizeof(wire::SegmentHeader)) return SegmentHeaderError::kBadHeaderBytes;
  if (header.reserved0 != 0 || !allZero(header.reserved1)) {
    return SegmentHeaderError::kReservedNotZero;
  }
  if (header.segmentBytes != mappedBytes) return SegmentHeaderError::kSegmentSizeMismatch;
  if (header.commandRingCount == 0 || header.commandRingCount > kMaxCommandRings) {
    return SegmentHeaderError::kBadRingCount;
  }
  if (header.commandRings.bytes % header.commandRingCount != 0) {
    return SegmentHeaderError::kMisaligned;
  }
  if (header.completionRings.bytes % header.commandRingCount != 0) {
    return SegmentHeaderError::kMisaligned;
  }
  const std::uint64_t ringBytes = header.commandRings.bytes / header.commandRingCount;
  const std::uint64_t completionRingBytes = header.completionRings.bytes / header.commandRingCount;
  if (ringBytes == 0 || completionRingBytes == 0) return SegmentHeaderError::kEmptyRing;

  struct Check {
    const wire::Region& region;
    std::uint64_t sizeGranule;
  };
  const std::array<Check, 5> regions{{
      {header.commandRings, kRegionSizeGranule},
      {header.completionRings, kRegionSizeGranule},
      {header.control, kRegionSizeGranule},
      {header.staging, kRegionAlignment},
      {header.pinnedHeap, kRegionAlignment},
  }};
  if (ringBytes % kRegionSizeGranule != 0 || completionRingBytes % kRegionSizeGranule != 0) {
    return SegmentHeaderError::kMisaligned;
  }
  for (const Check& check : regions) {
    if (check.region.offset % kRegionAlignment != 0 ||
        check.region.bytes % check.sizeGranule != 0) {
      return SegmentHeaderError::kMisaligned;
    }
    if (!insideRegion(check.region.offset, check.region.bytes, header.segmentBytes)) {
      return SegmentHeaderError::kRegionOutOfBounds;
    }
  }
  std::array<Range, 6> ranges{};
  ranges[0] = Range{0, sizeof(wire::SegmentHeader)};
  for (std::size_t i = 0; i < regions.size(); ++i) {
    ranges[i + 1] = Range{regions[i].region.offset, regions[i].region.bytes};
  }
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      if (overlap(ranges[i], ranges[j])) return SegmentHeaderError::kRegionsOverlap;
    }
  }
  return std::nullopt;
}

std::variant<wire::SegmentHeader, SegmentHeaderError> readSegmentHeader(
    std::span<const std::byte> mapped) {
  if (mapped.size() < sizeof(wire::SegmentHeader)) return SegmentHeaderError::kTooSmall;
  const auto header = load<wire::SegmentHeader>(mapped, 0);
  if (auto error = validateSegmentHeader(header, mapped.size())) return *error;
  return header;
}

std::optional<wire::SegmentHeader> planSegment(const SegmentPlan& plan) {
  if (plan.commandRingCount == 0 || plan.commandRingCount > kMaxCommandRings) return std::nullopt;
  // Keeps every sum below comfortably inside 64 bits; no real segment is a petabyte.
  constexpr std::uint64_t kMaxRegionBytes = std::uint64_t{1} << 50;
  const std::uint64_t sizes[] = {plan.commandRingBytes, plan.completionRingBytes, plan.controlBytes,
                                 plan.stagingBytes, plan.pinnedHeapBytes};
  for (std::uint64_t size : sizes) {
    if (size > kMaxRegionBytes) return std::nullopt;
  }
  wire::SegmentHeader header{};
  header.magic = kSegmentMagic;
  header.formatVersion = kFormatVersion;
  header.headerBytes = sizeof(wire::SegmentHeader);
  header.commandRingCount = plan.commandRingCount;

  std::uint64_t next = kRegionAlignment;  // the header has the first page to itself
  auto place = [&next](wire::Region& region, std::uint64_t bytes) {
    region.offset = next;
    region.bytes = bytes;
    next = roundUp(next + bytes, kRegionAlignment);
  };
  place(header.commandRings,
        roundUp(plan.commandRingBytes, kRegionSizeGranule) * plan.commandRingCount);
  place(header.completionRings,
        roundUp(plan.completionRingBytes, kRegionSizeGranule) * plan.commandRingCount);
  place(header.control, roundUp(plan.controlBytes, kRegionSizeGranule));
  place(header.staging, roundUp(plan.stagingBytes, kRegionAlignment));
  place(header.pinnedHeap, roundUp(plan.pinnedHeapBytes, kRegionAlignment));
  header.segmentBytes = next;
  if (validateSegmentHeader(header, header.segmentBytes)) return std::nullopt;
  return header;
}

SegmentLimits limitsOf(const wire::SegmentHeader& header) {
  return SegmentLimits{header.staging.bytes, header.pinnedHeap.bytes, std::nullopt};
}

namespace {

wire::Region nthOf(const wire::Region& rings, std::uint32_t count, std::uint32_t index) {
  const std::uint64_t each = rings.bytes / count;
  return wire::Region{rings.offset + each * index, each};
}

}  // namespace

wire::Region commandRing(const wire::SegmentHeader& header, std::uint32_t index) {
  return nthOf(header.commandRings, header.commandRingCount, index);
}

wire::Region completionRing(const wire::SegmentHeader& header, std::uint32_t index) {
  return nthOf(header.completionRings, header.commandRingCount, index);
}

}  // namespace gpuproxy::protocol::ring
