#include "protocol/ring_format.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace gpuproxy::protocol::ring {
namespace {

using Bytes = std::vector<std::byte>;
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();
constexpr SegmentLimits kLimits{1u << 20, 16u << 20, std::nullopt};

// Body field offsets in a record: the header comes first.
constexpr std::size_t kBody = kCommandHeaderBytes;

template <typename Command>
Bytes encoded(const Command& command) {
  Bytes out(encodedSize(command));
  EXPECT_EQ(encode(command, out), out.size());
  return out;
}

template <typename T>
void poke(Bytes& record, std::size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), record.size());
  std::memcpy(record.data() + offset, &value, sizeof(T));
}

template <typename T>
T peek(const Bytes& record, std::size_t offset) {
  T value{};
  std::memcpy(&value, record.data() + offset, sizeof(T));
  return value;
}

template <typename T>
T decodedAs(const Bytes& record) {
  const DecodedCommand decoded = decodeCommand(record, kLimits);
  if (const auto* error = std::get_if<DecodeError>(&decoded)) {
    ADD_FAILURE() << "decode failed: " << describe(error->failure);
    return T{};
  }
  EXPECT_TRUE(std::holds_alternative<T>(decoded));
  return std::holds_alternative<T>(decoded) ? std::get<T>(decoded) : T{};
}

DecodeError errorOf(const Bytes& record) {
  const DecodedCommand decoded = decodeCommand(record, kLimits);
  if (!std::holds_alternative<DecodeError>(decoded)) {
    ADD_FAILURE() << "decode accepted an invalid record";
    return DecodeError{};
  }
  return std::get<DecodeError>(decoded);
}

// --- One valid sample per opcode ---------------------------------------------------------------

const std::vector<std::byte>& sampleParameters() {
  static const std::vector<std::byte> parameters = [] {
    std::vector<std::byte> bytes(12);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(0xA0 + i);
    return bytes;
  }();
  return parameters;
}

LaunchKernel launchInline() {
  LaunchKernel launch;
  launch.sequence = 42;
  launch.context = 0x1000;
  launch.function = 0x2000;
  launch.stream = 0x3000;
  launch.grid = {4, 2, 1};
  launch.block = {128, 1, 1};
  launch.sharedMemBytes = 256;
  launch.parameterBytes = static_cast<std::uint32_t>(sampleParameters().size());
  launch.inlineParameters = sampleParameters();
  return launch;
}

LaunchKernel launchByReference() {
  LaunchKernel launch = launchInline();
  launch.inlineParameters = {};
  launch.parameterBytes = 4096;
  launch.parameterReference = HostLocation{HostRegion::kPinnedHeap, 8192};
  return launch;
}

CopyHostToDevice copyToDevice() {
  return CopyHostToDevice{.sequence = 43,
                          .context = 0x1000,
                          .stream = 0x3000,
                          .destination = 0x7f0000000000,
                          .source = {HostRegion::kStaging, 4096},
                          .bytes = 65536,
                          .completionToken = 0,
                          .chunkIndex = 3,
                          .lastChunk = false};
}

CopyHostToDevice copyToDeviceFromPinned() {
  CopyHostToDevice copy = copyToDevice();
  copy.source = {HostRegion::kPinnedHeap, 1u << 20};
  copy.chunkIndex = 0;
  copy.lastChunk = true;
  copy.completionToken = 9;
  return copy;
}

CopyDeviceToHost copyToHost() {
  return CopyDeviceToHost{.sequence = 44,
                          .context = 0x1000,
                          .stream = 0,
                          .source = 0x7f0000010000,
                          .destination = {HostRegion::kStaging, 0},
                          .bytes = 4096,
                          .completionToken = 77,
                          .chunkIndex = 0,
                          .lastChunk = true};
}

CopyDeviceToDevice copyOnDevice() {
  return CopyDeviceToDevice{45, 0x1000, 0x3000, 0x7f0000020000, 0x7f0000030000, 1024};
}

Memset memsetD16() {
  return Memset{46, 0x1000, 0x3000, 0x7f0000040000, 1000, 0xBEEF, 2};
}

Memset2D memset2D() {
  return Memset2D{.sequence = 50,
                  .context = 0x1000,
                  .stream = 0x3000,
                  .destination = 0x7f0000050000,
                  .pitch = 512,
                  .width = 100,
                  .height = 16,
                  .value = 0xCAFEF00D,
                  .elementSize = 4};
}

EventRecord eventRecord() {
  return EventRecord{47, 0x1000, 0x4000, 0x3000, 0};
}

StreamWaitEvent streamWaitEvent() {
  return StreamWaitEvent{48, 0x1000, 0x3001, 0x4000, 0};
}

Synchronize synchronizeStream() {
  return Synchronize{49, 0x1000, SynchronizeKind::kStream, 0x3000, 1234, false};
}

void expectSameLaunch(const LaunchKernel& a, const LaunchKernel& b) {
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.context, b.context);
  EXPECT_EQ(a.function, b.function);
  EXPECT_EQ(a.stream, b.stream);
  EXPECT_EQ(a.grid, b.grid);
  EXPECT_EQ(a.block, b.block);
  EXPECT_EQ(a.sharedMemBytes, b.sharedMemBytes);
  EXPECT_EQ(a.parameterBytes, b.parameterBytes);
  EXPECT_EQ(a.parameterReference, b.parameterReference);
  EXPECT_EQ(a.cooperative, b.cooperative);
  ASSERT_EQ(a.inlineParameters.size(), b.inlineParameters.size());
  EXPECT_TRUE(
      std::equal(a.inlineParameters.begin(), a.inlineParameters.end(), b.inlineParameters.begin()));
}

// Every valid sample as bytes, for the properties that hold for all of them.
std::vector<std::pair<std::string, Bytes>> allSamples() {
  return {
      {"launch_inline", encoded(launchInline())},
      {"launch_by_reference", encoded(launchByReference())},
      {"copy_h2d_staged", encoded(copyToDevice())},
      {"copy_h2d_pinned", encoded(copyToDeviceFromPinned())},
      {"copy_d2h_staged", encoded(copyToHost())},
      {"copy_d2d", encoded(copyOnDevice())},
      {"memset", encoded(memsetD16())},
      {"memset_2d", encoded(memset2D())},
      {"event_record", encoded(eventRecord())},
      {"stream_wait_event", encoded(streamWaitEvent())},
      {"synchronize", encoded(synchronizeStream())},
  };
}

// --- Round trips ----------------------------------------------------------------------------

TEST(RingRoundTrip, LaunchWithInlineParameters) {
  const LaunchKernel launch = launchInline();
  const Bytes record = encoded(launch);
  EXPECT_EQ(record.size(), kLaunchKernelFixedBytes + 16u);  // 12 bytes of parameters, padded
  const auto decoded = decodedAs<LaunchKernel>(record);
  expectSameLaunch(decoded, launch);
  // The parameters are read from the record, not from wherever the encoder took them.
  EXPECT_EQ(decoded.inlineParameters.data(), record.data() + kLaunchKernelFixedBytes);
}

TEST(RingRoundTrip, LaunchWithParametersByReference) {
  const LaunchKernel launch = launchByReference();
  const Bytes record = encoded(launch);
  EXPECT_EQ(record.size(), kLaunchKernelFixedBytes);
  expectSameLaunch(decodedAs<LaunchKernel>(record), launch);
}

TEST(RingRoundTrip, CooperativeLaunch) {
  LaunchKernel launch = launchByReference();
  launch.cooperative = true;
  const Bytes record = encoded(launch);
  expectSameLaunch(decodedAs<LaunchKernel>(record), launch);
  launch = launchInline();
  launch.cooperative = true;
  expectSameLaunch(decodedAs<LaunchKernel>(encoded(launch)), launch);
}

TEST(RingRoundTrip, LaunchWithTheLargestInlineParameterBuffer) {
  const std::vector<std::byte> parameters(kMaxParameterBytes, std::byte{0x5A});
  LaunchKernel launch = launchInline();
  launch.parameterBytes = kMaxParameterBytes;
  launch.inlineParameters = parameters;
  const Bytes record = encoded(launch);
  EXPECT_EQ(record.size(), kMaxCommandRecordBytes);
  expectSameLaunch(decodedAs<LaunchKernel>(record), launch);
}

TEST(RingRoundTrip, LaunchWithNoParameters) {
  LaunchKernel launch = launchInline();
  launch.parameterBytes = 0;
  launch.inlineParameters = {};
  const Bytes record = encoded(launch);
  EXPECT_EQ(record.size(), kLaunchKernelFixedBytes);
  expectSameLaunch(decodedAs<LaunchKernel>(record), launch);
}

TEST(RingRoundTrip, Copies) {
  EXPECT_EQ(decodedAs<CopyHostToDevice>(encoded(copyToDevice())), copyToDevice());
  EXPECT_EQ(decodedAs<CopyHostToDevice>(encoded(copyToDeviceFromPinned())),
            copyToDeviceFromPinned());
  EXPECT_EQ(decodedAs<CopyDeviceToHost>(encoded(copyToHost())), copyToHost());
  EXPECT_EQ(decodedAs<CopyDeviceToDevice>(encoded(copyOnDevice())), copyOnDevice());
}

TEST(RingRoundTrip, MemsetEveryElementSize) {
  for (const auto& [size, value] :
       {std::pair<std::uint8_t, std::uint32_t>{1, 0xFF}, {2, 0xFFFF}, {4, 0xFFFFFFFF}}) {
    Memset memset = memsetD16();
    memset.elementSize = size;
    memset.value = value;
    EXPECT_EQ(decodedAs<Memset>(encoded(memset)), memset);
  }
}

TEST(RingRoundTrip, Memset2D) {
  EXPECT_EQ(encoded(memset2D()).size(), 72u);
  EXPECT_EQ(decodedAs<Memset2D>(encoded(memset2D())), memset2D());
  Memset2D oneRow = memset2D();
  oneRow.height = 1;
  oneRow.pitch = 0;  // unused with one row
  oneRow.elementSize = 1;
  oneRow.value = 0x7F;
  EXPECT_EQ(decodedAs<Memset2D>(encoded(oneRow)), oneRow);
}

TEST(RingRoundTrip, AWaitForAnotherDevicesEventIsTwoRecords) {
  const HoldForEvent hold{65, 0x1000, 0x3000, 9};
  EXPECT_EQ(encoded(hold).size(), 40u);
  EXPECT_EQ(decodedAs<HoldForEvent>(encoded(hold)), hold);
  const LetGoAfterEvent letGo{66, 0x2000, 0x4000, 9, 0x1000, 0x3000};
  EXPECT_EQ(encoded(letGo).size(), 56u);
  EXPECT_EQ(decodedAs<LetGoAfterEvent>(encoded(letGo)), letGo);
  // Without a token neither half could find the other: the command fails, told to the waiting
  // stream.
  for (const auto& record : {encoded(HoldForEvent{67, 0x1000, 0x3000, 0}),
                             encoded(LetGoAfterEvent{68, 0x2000, 0x4000, 0, 0x1000, 0x3000})}) {
    const DecodedCommand decoded = decodeCommand(record, kLimits);
    ASSERT_TRUE(std::holds_alternative<DecodeError>(decoded));
    const DecodeError& error = std::get<DecodeError>(decoded);
    EXPECT_EQ(error.failure, DecodeFailure::kMissingCompletionToken);
    EXPECT_FALSE(error.disconnect);
    EXPECT_EQ(error.context, 0x1000u);
    EXPECT_EQ(error.stream, 0x3000u);
  }
}

TEST(RingRoundTrip, HostFunctions) {
  const HostFunction call{60, 0x1000, 0x3000, 77};
  EXPECT_EQ(encoded(call).size(), 40u);
  EXPECT_EQ(decodedAs<HostFunction>(encoded(call)), call);
  const HostFunction onNullStream{61, 0x1000, 0, 78};
  EXPECT_EQ(decodedAs<HostFunction>(encoded(onNullStream)), onNullStream);
  const HostFunctionReturned returned{62, 0x1000, 0x3000, 77};
  EXPECT_EQ(decodedAs<HostFunctionReturned>(encoded(returned)), returned);
  // Without a token nobody could be told the function is due, nor the stream released: the
  // command fails (it is no framing error).
  for (const auto& record : {encoded(HostFunction{63, 0x1000, 0x3000, 0}),
                             encoded(HostFunctionReturned{64, 0x1000, 0x3000, 0})}) {
    const DecodedCommand decoded = decodeCommand(record, kLimits);
    ASSERT_TRUE(std::holds_alternative<DecodeError>(decoded));
    EXPECT_EQ(std::get<DecodeError>(decoded).failure, DecodeFailure::kMissingCompletionToken);
    EXPECT_FALSE(std::get<DecodeError>(decoded).disconnect);
  }
}

TEST(RingRoundTrip, EventsAndWaits) {
  EXPECT_EQ(decodedAs<EventRecord>(encoded(eventRecord())), eventRecord());
  EventRecord external = eventRecord();
  external.flags = CU_EVENT_RECORD_EXTERNAL;
  EXPECT_EQ(decodedAs<EventRecord>(encoded(external)), external);
  EXPECT_EQ(decodedAs<StreamWaitEvent>(encoded(streamWaitEvent())), streamWaitEvent());
}

TEST(RingRoundTrip, SynchronizeEveryKind) {
  const Synchronize samples[] = {
      synchronizeStream(),
      Synchronize{50, 0x1000, SynchronizeKind::kStream, 0, 1, true},  // cuStreamQuery(NULL)
      Synchronize{51, 0x1000, SynchronizeKind::kEvent, 0x4000, 2, false},
      Synchronize{52, 0x1000, SynchronizeKind::kEvent, 0x4000, 3, true},
      Synchronize{53, 0x1000, SynchronizeKind::kContext, 0, kU64Max, false},
  };
  for (const Synchronize& sync : samples) EXPECT_EQ(decodedAs<Synchronize>(encoded(sync)), sync);
}

TEST(RingRoundTrip, SequenceSurvivesTheFullRange) {
  CopyDeviceToDevice copy = copyOnDevice();
  copy.sequence = kU64Max;
  EXPECT_EQ(decodedAs<CopyDeviceToDevice>(encoded(copy)).sequence, kU64Max);
}

TEST(RingRoundTrip, Completions) {
  const Completion completion{77, CUDA_ERROR_ILLEGAL_ADDRESS};
  const AsyncError asyncError{42, 0x1000, 0x3000, CUDA_ERROR_INVALID_HANDLE,
                              static_cast<std::uint16_t>(Opcode::kLaunchKernel)};
  const StagingRelease release{4096, 65536};
  const DeviceOutput output{1234};
  auto decode = [](const auto& value) { return decodeCompletion(encoded(value), kLimits); };
  EXPECT_EQ(std::get<Completion>(decode(completion)), completion);
  EXPECT_EQ(std::get<AsyncError>(decode(asyncError)), asyncError);
  EXPECT_EQ(std::get<StagingRelease>(decode(release)), release);
  EXPECT_EQ(std::get<DeviceOutput>(decode(output)), output);
  // 16 bytes, as RING_FORMAT.md's table says: kind 4, no flags, then the byte count.
  const std::vector<std::byte> bytes = encoded(output);
  ASSERT_EQ(bytes.size(), 16u);
  EXPECT_EQ(static_cast<int>(bytes[0]), 4);
  EXPECT_EQ(static_cast<int>(bytes[4]), 16);
  EXPECT_EQ(static_cast<int>(bytes[8]), 1234 & 0xff);
}

TEST(RingRoundTrip, WireLayoutIsWhatTheSpecSays) {
  // RING_FORMAT.md's header table, checked against bytes rather than against the structs.
  const Bytes record = encoded(copyOnDevice());
  EXPECT_EQ(peek<std::uint16_t>(record, 0), 4u);  // opcode
  EXPECT_EQ(peek<std::uint16_t>(record, 2), 0u);  // flags
  EXPECT_EQ(peek<std::uint32_t>(record, 4), 56u);
  EXPECT_EQ(peek<std::uint64_t>(record, 8), 45u);
  EXPECT_EQ(peek<std::uint64_t>(record, 16 + 16), 0x7f0000020000u);  // destination
  EXPECT_EQ(record[0], std::byte{4});                                // little-endian
}

TEST(RingEncode, RefusesABufferTooSmall) {
  for (const auto& sample : allSamples()) {
    SCOPED_TRACE(sample.first);
    const std::size_t size = sample.second.size();
    const DecodedCommand decoded = decodeCommand(sample.second, kLimits);
    std::visit(
        [size](const auto& command) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(command)>, DecodeError>) {
            Bytes small(size - 1);
            EXPECT_EQ(encode(command, small), 0u);
          } else {
            ADD_FAILURE();
          }
        },
        decoded);
  }
}

TEST(RingEncode, RefusesInlineParametersItCannotRepresent) {
  LaunchKernel launch = launchInline();
  launch.parameterBytes = 16;  // but 12 bytes given
  Bytes out(kMaxCommandRecordBytes);
  EXPECT_EQ(encodeLaunchKernel(launch, out), 0u);
  const std::vector<std::byte> tooMany(kMaxParameterBytes + 8);
  launch.inlineParameters = tooMany;
  launch.parameterBytes = static_cast<std::uint32_t>(tooMany.size());
  EXPECT_EQ(encodeLaunchKernel(launch, out), 0u);
}

// --- Framing -------------------------------------------------------------------------------

TEST(RingDecode, EveryTruncationOfEveryRecordDisconnects) {
  for (const auto& [name, record] : allSamples()) {
    for (std::size_t length = 0; length < record.size(); ++length) {
      SCOPED_TRACE(name + " truncated to " + std::to_string(length));
      const Bytes prefix(record.begin(), record.begin() + static_cast<std::ptrdiff_t>(length));
      const DecodeError error = errorOf(prefix);
      EXPECT_TRUE(error.disconnect);
      EXPECT_EQ(error.failure, length < kCommandHeaderBytes ? DecodeFailure::kTruncated
                                                            : DecodeFailure::kLengthMismatch);
    }
  }
}

TEST(RingDecode, TruncationWithAMatchingLengthStillDisconnects) {
  // A client that shortens the record and its length field together.
  for (const auto& [name, record] : allSamples()) {
    for (std::size_t length = kCommandHeaderBytes; length < record.size();
         length += kRecordAlignment) {
      SCOPED_TRACE(name + " cut to " + std::to_string(length));
      Bytes prefix(record.begin(), record.begin() + static_cast<std::ptrdiff_t>(length));
      poke(prefix, 4, static_cast<std::uint32_t>(length));
      const DecodeError error = errorOf(prefix);
      EXPECT_TRUE(error.disconnect);
      EXPECT_EQ(error.failure, DecodeFailure::kWrongLength);
    }
  }
}

TEST(RingDecode, AHugeClaimedLengthDisconnects) {
  for (std::uint32_t claimed :
       {kMaxCommandRecordBytes + 8, 0x7FFFFFF8u, 0xFFFFFFF8u, 0xFFFFFFFFu}) {
    Bytes record = encoded(launchInline());
    poke(record, 4, claimed);
    const DecodeError error = errorOf(record);
    EXPECT_TRUE(error.disconnect);
    EXPECT_EQ(error.failure, DecodeFailure::kTooLong);
  }
  // And a record that really is that long, with a matching length.
  Bytes record(kMaxCommandRecordBytes + 8);
  poke(record, 0, static_cast<std::uint16_t>(Opcode::kLaunchKernel));
  poke(record, 4, static_cast<std::uint32_t>(record.size()));
  EXPECT_EQ(errorOf(record).failure, DecodeFailure::kTooLong);
}

TEST(RingDecode, ZeroedMemoryIsNotACommand) {
  const Bytes zeros(64);
  EXPECT_TRUE(errorOf(zeros).disconnect);
  Bytes zeroOpcode(64);
  poke(zeroOpcode, 4, std::uint32_t{64});
  EXPECT_EQ(errorOf(zeroOpcode).failure, DecodeFailure::kUnknownOpcode);
}

TEST(RingDecode, PeekReadsTheHeaderOnly) {
  const Bytes record = encoded(synchronizeStream());
  const auto header = peekCommandHeader(record);
  ASSERT_TRUE(header);
  EXPECT_EQ(header->opcode, static_cast<std::uint16_t>(Opcode::kSynchronize));
  EXPECT_EQ(header->length, record.size());
  EXPECT_EQ(header->sequence, 49u);
  EXPECT_FALSE(peekCommandHeader(std::span(record).first(15)));
}

// --- Every rule, one at a time ------------------------------------------------------------------

struct Rejection {
  std::string name;
  std::function<Bytes()> record;       // a valid sample...
  std::function<void(Bytes&)> mutate;  // ...made invalid in exactly one way
  DecodeFailure failure;
  bool disconnect;
  CUresult result = CUDA_ERROR_INVALID_VALUE;
};

template <typename Body, typename Field>
std::size_t at(Field Body::*field) {
  // offsetof on a member pointer, for the table below.
  static const Body probe{};
  return kBody + static_cast<std::size_t>(reinterpret_cast<const char*>(&(probe.*field)) -
                                          reinterpret_cast<const char*>(&probe));
}

template <typename T>
std::function<void(Bytes&)> set(std::size_t offset, T value) {
  return [offset, value](Bytes& record) { poke(record, offset, value); };
}

std::function<void(Bytes&)> both(std::function<void(Bytes&)> a, std::function<void(Bytes&)> b) {
  return [a, b](Bytes& record) {
    a(record);
    b(record);
  };
}

// Appends bytes and fixes the length field, so that only the per-opcode length rule fails.
std::function<void(Bytes&)> grow(std::size_t bytes) {
  return [bytes](Bytes& record) {
    record.resize(record.size() + bytes);
    poke(record, 4, static_cast<std::uint32_t>(record.size()));
  };
}

Bytes launchWithInlineBytes(std::uint32_t parameterBytes) {
  static std::vector<std::byte> parameters;
  parameters.assign(parameterBytes, std::byte{1});
  LaunchKernel launch = launchInline();
  launch.parameterBytes = parameterBytes;
  launch.inlineParameters = parameters;
  return encoded(launch);
}

std::vector<Rejection> rejections() {
  using LB = wire::LaunchKernelBody;
  using HB = wire::HostCopyBody;
  using DB = wire::CopyDeviceToDeviceBody;
  using MB = wire::MemsetBody;
  using M2 = wire::Memset2DBody;
  using EB = wire::EventRecordBody;
  using WB = wire::StreamWaitEventBody;
  using SB = wire::SynchronizeBody;
  auto launch = [] { return encoded(launchInline()); };
  auto launchRef = [] { return encoded(launchByReference()); };
  auto h2d = [] { return encoded(copyToDevice()); };
  auto h2dPinned = [] { return encoded(copyToDeviceFromPinned()); };
  auto d2h = [] { return encoded(copyToHost()); };
  auto d2d = [] { return encoded(copyOnDevice()); };
  auto memset2d = [] { return encoded(memset2D()); };
  auto memset = [] { return encoded(memsetD16()); };
  auto event = [] { return encoded(eventRecord()); };
  auto wait = [] { return encoded(streamWaitEvent()); };
  auto sync = [] { return encoded(synchronizeStream()); };
  const std::size_t gridY = at(&LB::grid) + 4;
  const std::size_t blockZ = at(&LB::block) + 8;
  const std::size_t launchReserved = at(&LB::reserved);
  const std::size_t hostReserved = at(&HB::reserved);
  const std::size_t syncReserved = at(&SB::reserved);
  constexpr auto kDisconnect = true;
  constexpr auto kFail = false;
  const std::uint8_t kStaging = 1;
  const std::uint8_t kPinned = 2;
  return {
      // Framing and shape: disconnect.
      {"opcode 0", d2d, set<std::uint16_t>(0, 0), DecodeFailure::kUnknownOpcode, kDisconnect,
       CUDA_ERROR_NOT_SUPPORTED},
      {"opcode 14", d2d, set<std::uint16_t>(0, 14), DecodeFailure::kUnknownOpcode, kDisconnect,
       CUDA_ERROR_NOT_SUPPORTED},
      {"opcode 0xFFFF", d2d, set<std::uint16_t>(0, 0xFFFF), DecodeFailure::kUnknownOpcode,
       kDisconnect, CUDA_ERROR_NOT_SUPPORTED},
      {"flag on d2d", d2d, set<std::uint16_t>(2, 1), DecodeFailure::kUnknownFlags, kDisconnect,
       CUDA_ERROR_NOT_SUPPORTED},
      {"unknown launch flag", launch, set<std::uint16_t>(2, 4), DecodeFailure::kUnknownFlags,
       kDisconnect, CUDA_ERROR_NOT_SUPPORTED},
      {"unknown copy flag", h2d, set<std::uint16_t>(2, 0x8000), DecodeFailure::kUnknownFlags,
       kDisconnect, CUDA_ERROR_NOT_SUPPORTED},
      {"unknown sync flag", sync, set<std::uint16_t>(2, 2), DecodeFailure::kUnknownFlags,
       kDisconnect, CUDA_ERROR_NOT_SUPPORTED},
      {"length larger than record", d2d, set<std::uint32_t>(4, 64), DecodeFailure::kLengthMismatch,
       kDisconnect},
      {"length smaller than record", d2d, set<std::uint32_t>(4, 48), DecodeFailure::kLengthMismatch,
       kDisconnect},
      {"length not a multiple of 8", d2d, grow(4), DecodeFailure::kMisalignedLength, kDisconnect},
      {"d2d with trailing bytes", d2d, grow(8), DecodeFailure::kWrongLength, kDisconnect},
      {"memset with trailing bytes", memset, grow(8), DecodeFailure::kWrongLength, kDisconnect},
      {"sync with trailing bytes", sync, grow(8), DecodeFailure::kWrongLength, kDisconnect},
      {"h2d with trailing bytes", h2d, grow(8), DecodeFailure::kWrongLength, kDisconnect},
      {"event with trailing bytes", event, grow(8), DecodeFailure::kWrongLength, kDisconnect},
      {"wait with trailing bytes", wait, grow(8), DecodeFailure::kWrongLength, kDisconnect},
      {"parameterBytes disagrees with length", launch,
       set<std::uint32_t>(at(&LB::parameterBytes), 20), DecodeFailure::kWrongLength, kDisconnect},
      {"parameterBytes huge, inline", launch,
       set<std::uint32_t>(at(&LB::parameterBytes), 0xFFFFFFFF), DecodeFailure::kWrongLength,
       kDisconnect},
      {"by reference with inline bytes", launchRef, grow(8), DecodeFailure::kWrongLength,
       kDisconnect},
      {"inline flag cleared on a by-reference launch", launchRef, set<std::uint16_t>(2, 0),
       DecodeFailure::kWrongLength, kDisconnect},
      {"launch reserved byte", launch, set<std::uint8_t>(launchReserved + 6, 1),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"inline padding", launch, set<std::uint8_t>(kLaunchKernelFixedBytes + 13, 1),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"inline with a parameter offset", launch, set<std::uint64_t>(at(&LB::parameterOffset), 8),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"inline with a parameter region", launch,
       set<std::uint8_t>(at(&LB::parameterRegion), kPinned), DecodeFailure::kReservedNotZero,
       kDisconnect},
      {"copy reserved byte", h2d, set<std::uint8_t>(hostReserved + 2, 1),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"memset reserved byte", memset, set<std::uint8_t>(at(&MB::reserved), 1),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"event record reserved", event, set<std::uint32_t>(at(&EB::reserved), 1),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"stream wait reserved", wait, set<std::uint32_t>(at(&WB::reserved), 1),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"sync reserved byte", sync, set<std::uint8_t>(syncReserved + 6, 0x80),
       DecodeFailure::kReservedNotZero, kDisconnect},
      // Values: this command fails, the client stays.
      {"grid.y zero", launch, set<std::uint32_t>(gridY, 0), DecodeFailure::kZeroDimension, kFail},
      {"block.z zero", launch, set<std::uint32_t>(blockZ, 0), DecodeFailure::kZeroDimension, kFail},
      {"inline parameters 32765 bytes", [] { return launchWithInlineBytes(32765); }, [](Bytes&) {},
       DecodeFailure::kParameterBytesTooLarge, kFail},
      {"inline parameters 32768 bytes", [] { return launchWithInlineBytes(32768); }, [](Bytes&) {},
       DecodeFailure::kParameterBytesTooLarge, kFail},
      {"by-reference parameters 32765 bytes", launchRef,
       set<std::uint32_t>(at(&LB::parameterBytes), 32765), DecodeFailure::kParameterBytesTooLarge,
       kFail},
      {"by-reference parameters 4 GiB", launchRef,
       set<std::uint32_t>(at(&LB::parameterBytes), 0xFFFFFFFF),
       DecodeFailure::kParameterBytesTooLarge, kFail},
      {"by-reference region 0", launchRef, set<std::uint8_t>(at(&LB::parameterRegion), 0),
       DecodeFailure::kBadRegion, kFail},
      {"by-reference region 3", launchRef, set<std::uint8_t>(at(&LB::parameterRegion), 3),
       DecodeFailure::kBadRegion, kFail},
      {"by-reference past the heap", launchRef,
       set<std::uint64_t>(at(&LB::parameterOffset), kLimits.pinnedHeapBytes - 4095),
       DecodeFailure::kRangeOutsideRegion, kFail},
      {"by-reference offset near 2^64", launchRef,
       set<std::uint64_t>(at(&LB::parameterOffset), kU64Max - 100),
       DecodeFailure::kRangeOutsideRegion, kFail},
      {"by-reference in staging past its end", launchRef,
       both(set<std::uint8_t>(at(&LB::parameterRegion), kStaging),
            set<std::uint64_t>(at(&LB::parameterOffset), kLimits.stagingBytes)),
       DecodeFailure::kRangeOutsideRegion, kFail},
      {"copy region 0", h2d, set<std::uint8_t>(at(&HB::hostRegion), 0), DecodeFailure::kBadRegion,
       kFail},
      {"copy region 255", d2h, set<std::uint8_t>(at(&HB::hostRegion), 255),
       DecodeFailure::kBadRegion, kFail},
      {"staged range past the end", h2d,
       set<std::uint64_t>(at(&HB::hostOffset), kLimits.stagingBytes - 65535),
       DecodeFailure::kRangeOutsideRegion, kFail},
      {"staged offset past the end", d2h,
       set<std::uint64_t>(at(&HB::hostOffset), kLimits.stagingBytes + 1),
       DecodeFailure::kRangeOutsideRegion, kFail},
      {"staged offset near 2^64 (offset + bytes wraps)", h2d,
       set<std::uint64_t>(at(&HB::hostOffset), kU64Max - 10), DecodeFailure::kRangeOutsideRegion,
       kFail},
      {"staged bytes 2^64-1", h2d, set<std::uint64_t>(at(&HB::bytes), kU64Max),
       DecodeFailure::kRangeOutsideRegion, kFail},
      {"pinned range past the heap", h2dPinned,
       set<std::uint64_t>(at(&HB::bytes), kLimits.pinnedHeapBytes),
       DecodeFailure::kRangeOutsideRegion, kFail},
      {"h2d device range wraps", h2d, set<std::uint64_t>(at(&HB::devicePointer), kU64Max - 100),
       DecodeFailure::kRangeOverflow, kFail},
      {"d2h device range wraps", d2h, set<std::uint64_t>(at(&HB::devicePointer), kU64Max),
       DecodeFailure::kRangeOverflow, kFail},
      {"pinned copy with a chunk index", h2dPinned, set<std::uint32_t>(at(&HB::chunkIndex), 1),
       DecodeFailure::kBadChunk, kFail},
      {"pinned copy not the last chunk", h2dPinned, set<std::uint16_t>(2, 0),
       DecodeFailure::kBadChunk, kFail},
      {"staged d2h without a token", d2h, set<std::uint64_t>(at(&HB::completionToken), 0),
       DecodeFailure::kMissingCompletionToken, kFail},
      {"d2d destination wraps", d2d, set<std::uint64_t>(at(&DB::destination), kU64Max - 1000),
       DecodeFailure::kRangeOverflow, kFail},
      {"d2d source wraps", d2d, set<std::uint64_t>(at(&DB::source), kU64Max - 1000),
       DecodeFailure::kRangeOverflow, kFail},
      {"memset element size 0", memset, set<std::uint8_t>(at(&MB::elementSize), 0),
       DecodeFailure::kBadElementSize, kFail},
      {"memset element size 3", memset, set<std::uint8_t>(at(&MB::elementSize), 3),
       DecodeFailure::kBadElementSize, kFail},
      {"memset element size 8", memset, set<std::uint8_t>(at(&MB::elementSize), 8),
       DecodeFailure::kBadElementSize, kFail},
      {"memset D8 value 0x1FF", memset,
       both(set<std::uint8_t>(at(&MB::elementSize), 1), set<std::uint32_t>(at(&MB::value), 0x1FF)),
       DecodeFailure::kValueTooWide, kFail},
      {"memset D16 value 0x10000", memset, set<std::uint32_t>(at(&MB::value), 0x10000),
       DecodeFailure::kValueTooWide, kFail},
      {"memset count * size overflows", memset,
       set<std::uint64_t>(at(&MB::count), std::uint64_t{1} << 63), DecodeFailure::kRangeOverflow,
       kFail},
      {"memset destination + bytes wraps", memset,
       set<std::uint64_t>(at(&MB::destination), kU64Max - 1000), DecodeFailure::kRangeOverflow,
       kFail},
      {"2D memset reserved byte", memset2d, set<std::uint8_t>(at(&M2::reserved), 1),
       DecodeFailure::kReservedNotZero, kDisconnect},
      {"2D memset element size 3", memset2d, set<std::uint8_t>(at(&M2::elementSize), 3),
       DecodeFailure::kBadElementSize, kFail},
      {"2D memset D16 value 0x10000", memset2d,
       both(set<std::uint8_t>(at(&M2::elementSize), 2),
            set<std::uint32_t>(at(&M2::value), 0x10000)),
       DecodeFailure::kValueTooWide, kFail},
      {"2D memset width * size overflows", memset2d,
       set<std::uint64_t>(at(&M2::width), std::uint64_t{1} << 63), DecodeFailure::kRangeOverflow,
       kFail},
      {"2D memset pitch * rows overflows", memset2d,
       set<std::uint64_t>(at(&M2::pitch), std::uint64_t{1} << 61), DecodeFailure::kRangeOverflow,
       kFail},
      {"2D memset extent wraps", memset2d, set<std::uint64_t>(at(&M2::destination), kU64Max - 4096),
       DecodeFailure::kRangeOverflow, kFail},
      {"event record flags 2", event, set<std::uint32_t>(at(&EB::recordFlags), 2),
       DecodeFailure::kBadFlags, kFail},
      {"stream wait flags 0x80000000", wait, set<std::uint32_t>(at(&WB::waitFlags), 0x80000000),
       DecodeFailure::kBadFlags, kFail},
      {"sync kind 0", sync, set<std::uint8_t>(at(&SB::kind), 0), DecodeFailure::kBadSynchronizeKind,
       kFail},
      {"sync kind 4", sync, set<std::uint8_t>(at(&SB::kind), 4), DecodeFailure::kBadSynchronizeKind,
       kFail},
      {"context sync naming a handle", sync, set<std::uint8_t>(at(&SB::kind), 3),
       DecodeFailure::kBadHandle, kFail},
      {"sync without a token", sync, set<std::uint64_t>(at(&SB::completionToken), 0),
       DecodeFailure::kMissingCompletionToken, kFail},
  };
}

TEST(RingDecode, EveryRuleRejectsItsViolation) {
  for (const Rejection& rejection : rejections()) {
    SCOPED_TRACE(rejection.name);
    Bytes record = rejection.record();
    rejection.mutate(record);
    const DecodeError error = errorOf(record);
    EXPECT_EQ(error.failure, rejection.failure) << describe(error.failure);
    EXPECT_EQ(error.disconnect, rejection.disconnect);
    EXPECT_EQ(error.result, rejection.result);
  }
}

TEST(RingDecode, AFailedCommandSaysWhomToTell) {
  // The daemon turns these into an AsyncError on the right stream, or answers the waiter.
  Bytes launch = encoded(launchInline());
  poke(launch, at(&wire::LaunchKernelBody::grid), std::uint32_t{0});
  const DecodeError launchError = errorOf(launch);
  EXPECT_FALSE(launchError.disconnect);
  EXPECT_EQ(launchError.opcode, static_cast<std::uint16_t>(Opcode::kLaunchKernel));
  EXPECT_EQ(launchError.sequence, 42u);
  EXPECT_EQ(launchError.context, 0x1000u);
  EXPECT_EQ(launchError.stream, 0x3000u);
  EXPECT_EQ(launchError.completionToken, 0u);

  Bytes sync = encoded(synchronizeStream());
  poke(sync, at(&wire::SynchronizeBody::kind), std::uint8_t{9});
  const DecodeError syncError = errorOf(sync);
  EXPECT_EQ(syncError.sequence, 49u);
  EXPECT_EQ(syncError.completionToken, 1234u);

  // Even a disconnecting record gives its sequence when the header is readable, for logs.
  Bytes framing = encoded(copyOnDevice());
  poke(framing, 2, std::uint16_t{1});
  EXPECT_EQ(errorOf(framing).sequence, 45u);
}

TEST(RingDecode, TheCallsPayloadIsARegionOnlyForRecordsCarriedByACall) {
  CopyHostToDevice toDevice = copyToDevice();
  toDevice.source = {HostRegion::kMessage, 0};
  toDevice.bytes = 4096;
  CopyDeviceToHost toHost = copyToHost();
  toHost.destination = {HostRegion::kMessage, 4096};
  // From a ring there is no call, so no payload: the region is unknown there.
  EXPECT_EQ(errorOf(encoded(toDevice)).failure, DecodeFailure::kBadRegion);
  EXPECT_EQ(errorOf(encoded(toHost)).failure, DecodeFailure::kBadRegion);
  // Carried by Session.submit with 8 KiB of payload: inside it, fine; past it, a range error.
  SegmentLimits call = kLimits;
  call.messageBytes = 8192;
  EXPECT_EQ(std::get<CopyHostToDevice>(decodeCommand(encoded(toDevice), call)), toDevice);
  EXPECT_EQ(std::get<CopyDeviceToHost>(decodeCommand(encoded(toHost), call)), toHost);
  toHost.bytes = 4097;
  const auto past = decodeCommand(encoded(toHost), call);
  ASSERT_TRUE(std::holds_alternative<DecodeError>(past));
  EXPECT_EQ(std::get<DecodeError>(past).failure, DecodeFailure::kRangeOutsideRegion);
  EXPECT_FALSE(std::get<DecodeError>(past).disconnect);
  // Bytes coming back in the answer need a token to say when the answer may go.
  toHost.bytes = 4096;
  toHost.completionToken = 0;
  const auto untokened = decodeCommand(encoded(toHost), call);
  ASSERT_TRUE(std::holds_alternative<DecodeError>(untokened));
  EXPECT_EQ(std::get<DecodeError>(untokened).failure, DecodeFailure::kMissingCompletionToken);
}

TEST(RingRecordTable, KnowsEveryOpcodeAndNothingElse) {
  for (std::uint16_t opcode = 0; opcode < 64; ++opcode) {
    const bool listed = opcode >= static_cast<std::uint16_t>(Opcode::kLaunchKernel) &&
                        opcode <= static_cast<std::uint16_t>(Opcode::kLetGoAfterEvent);
    EXPECT_EQ(Commands::knows(opcode), listed) << opcode;
  }
  // The table's order is the variant's, so every alternative carries its own opcode.
  std::visit([](const auto& command) { EXPECT_NE(static_cast<int>(command.kOpcode), 0); },
             Command{Synchronize{}});
}

TEST(RingDecode, EveryFailureHasADescription) {
  for (int i = 0; i <= static_cast<int>(DecodeFailure::kBadFlags); ++i) {
    EXPECT_FALSE(describe(static_cast<DecodeFailure>(i)).empty());
    EXPECT_NE(describe(static_cast<DecodeFailure>(i)), "unknown decode failure");
  }
}

// --- Completions ---------------------------------------------------------------------------

TEST(RingCompletion, RejectsMalformedRecords) {
  auto errorOfCompletion = [](const Bytes& record) {
    const DecodedCompletion decoded = decodeCompletion(record, kLimits);
    EXPECT_TRUE(std::holds_alternative<DecodeError>(decoded));
    return std::holds_alternative<DecodeError>(decoded) ? std::get<DecodeError>(decoded)
                                                        : DecodeError{};
  };
  const Bytes completion = encoded(Completion{5, CUDA_SUCCESS});
  for (std::size_t length = 0; length < completion.size(); ++length) {
    EXPECT_TRUE(errorOfCompletion(Bytes(completion.begin(),
                                        completion.begin() + static_cast<std::ptrdiff_t>(length)))
                    .disconnect);
  }
  Bytes flagged = completion;
  poke(flagged, 2, std::uint16_t{1});
  EXPECT_EQ(errorOfCompletion(flagged).failure, DecodeFailure::kUnknownFlags);
  Bytes reserved = completion;
  poke(reserved, 8 + 12, std::uint32_t{1});
  EXPECT_EQ(errorOfCompletion(reserved).failure, DecodeFailure::kReservedNotZero);
  Bytes unknown = completion;
  poke(unknown, 0, std::uint16_t{5});
  EXPECT_EQ(errorOfCompletion(unknown).failure, DecodeFailure::kUnknownOpcode);
  // A result cuda.h does not define cannot become a CUresult.
  Bytes notAResult = completion;
  poke(notAResult, 8 + 8, std::int32_t{33554433});
  EXPECT_EQ(errorOfCompletion(notAResult).failure, DecodeFailure::kUnknownResult);
  Bytes asyncNotAResult = encoded(AsyncError{1, 2, 3, CUDA_ERROR_INVALID_VALUE,
                                             static_cast<std::uint16_t>(Opcode::kLaunchKernel)});
  poke(asyncNotAResult, 8 + 24, std::int32_t{-7});
  EXPECT_EQ(errorOfCompletion(asyncNotAResult).failure, DecodeFailure::kUnknownResult);
  Bytes wrongKind = completion;  // a Completion's length under the AsyncError kind
  poke(wrongKind, 0, static_cast<std::uint16_t>(CompletionKind::kAsyncError));
  EXPECT_EQ(errorOfCompletion(wrongKind).failure, DecodeFailure::kWrongLength);
  Bytes huge = completion;
  poke(huge, 4, std::uint32_t{0xFFFFFFF8});
  EXPECT_EQ(errorOfCompletion(huge).failure, DecodeFailure::kTooLong);

  Bytes asyncError = encoded(AsyncError{1, 2, 3, CUDA_ERROR_INVALID_VALUE, 0});
  EXPECT_EQ(errorOfCompletion(asyncError).failure, DecodeFailure::kUnknownOpcode);

  const DecodeError outside =
      errorOfCompletion(encoded(StagingRelease{kLimits.stagingBytes - 8, 16}));
  EXPECT_EQ(outside.failure, DecodeFailure::kRangeOutsideRegion);
  EXPECT_FALSE(outside.disconnect);
  EXPECT_EQ(errorOfCompletion(encoded(StagingRelease{kU64Max, 1})).failure,
            DecodeFailure::kRangeOutsideRegion);
}

// --- Segment header ------------------------------------------------------------------------

SegmentPlan samplePlan() {
  return SegmentPlan{.commandRingCount = 4,
                     .commandRingBytes = 64 * 1024,
                     .completionRingBytes = 16 * 1024,
                     .controlBytes = 256,
                     .stagingBytes = 4u << 20,
                     .pinnedHeapBytes = 8u << 20};
}

Bytes mappedSegment(const wire::SegmentHeader& header) {
  Bytes segment(header.segmentBytes);
  std::memcpy(segment.data(), &header, sizeof header);
  return segment;
}

TEST(RingSegment, PlannedLayoutIsValidAndAligned) {
  const auto header = planSegment(samplePlan());
  ASSERT_TRUE(header);
  EXPECT_EQ(header->commandRings.offset, kRegionAlignment);
  EXPECT_EQ(header->commandRings.bytes, 4u * 64 * 1024);
  for (const wire::Region* region : {&header->commandRings, &header->completionRings,
                                     &header->control, &header->staging, &header->pinnedHeap}) {
    EXPECT_EQ(region->offset % kRegionAlignment, 0u);
  }
  EXPECT_EQ(header->completionRings.bytes, 4u * 16 * 1024);
  EXPECT_EQ(header->control.bytes, 256u);
  EXPECT_EQ(header->pinnedHeap.offset + header->pinnedHeap.bytes, header->segmentBytes);
  // Ring pair i: the i-th command ring and the i-th completion ring, back to back in their
  // regions.
  for (std::uint32_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(commandRing(*header, i).offset, header->commandRings.offset + i * 64 * 1024);
    EXPECT_EQ(commandRing(*header, i).bytes, 64u * 1024);
    EXPECT_EQ(completionRing(*header, i).offset, header->completionRings.offset + i * 16 * 1024);
    EXPECT_EQ(completionRing(*header, i).bytes, 16u * 1024);
  }

  const Bytes segment = mappedSegment(*header);
  const auto read = readSegmentHeader(segment);
  ASSERT_TRUE(std::holds_alternative<wire::SegmentHeader>(read))
      << describe(std::get<SegmentHeaderError>(read));
  const SegmentLimits limits = limitsOf(std::get<wire::SegmentHeader>(read));
  EXPECT_EQ(limits.stagingBytes, 4u << 20);
  EXPECT_EQ(limits.pinnedHeapBytes, 8u << 20);
  // Magic bytes spell the name in memory, so a hexdump of a segment says what it is.
  EXPECT_EQ(std::memcmp(segment.data(), "GPXYRING", 8), 0);
}

TEST(RingSegment, PlanRoundsSizesUpAndRefusesImpossibleOnes) {
  SegmentPlan plan = samplePlan();
  plan.commandRingBytes = 1000;
  plan.stagingBytes = 1;
  const auto header = planSegment(plan);
  ASSERT_TRUE(header);
  EXPECT_EQ(header->commandRings.bytes, 4u * 1024);
  EXPECT_EQ(header->staging.bytes, kRegionAlignment);
  plan.commandRingBytes = 0;
  EXPECT_FALSE(planSegment(plan));
  plan = samplePlan();
  plan.commandRingCount = 0;
  EXPECT_FALSE(planSegment(plan));
  plan = samplePlan();
  plan.pinnedHeapBytes = kU64Max;
  EXPECT_FALSE(planSegment(plan));
}

TEST(RingSegment, EveryHeaderRuleRejectsItsViolation) {
  const wire::SegmentHeader good = *planSegment(samplePlan());
  struct Case {
    std::string name;
    std::function<void(wire::SegmentHeader&)> mutate;
    SegmentHeaderError error;
  };
  const std::vector<Case> cases = {
      {"magic", [](auto& h) { h.magic ^= 1; }, SegmentHeaderError::kBadMagic},
      {"version", [](auto& h) { h.formatVersion = kFormatVersion + 1; },
       SegmentHeaderError::kUnsupportedVersion},
      {"header bytes", [](auto& h) { h.headerBytes = 256; }, SegmentHeaderError::kBadHeaderBytes},
      {"reserved0", [](auto& h) { h.reserved0 = 1; }, SegmentHeaderError::kReservedNotZero},
      {"reserved1", [](auto& h) { h.reserved1[1] = 1; }, SegmentHeaderError::kReservedNotZero},
      {"size", [](auto& h) { h.segmentBytes += 4096; }, SegmentHeaderError::kSegmentSizeMismatch},
      {"no rings", [](auto& h) { h.commandRingCount = 0; }, SegmentHeaderError::kBadRingCount},
      {"too many rings", [](auto& h) { h.commandRingCount = kMaxCommandRings + 1; },
       SegmentHeaderError::kBadRingCount},
      {"rings not divisible", [](auto& h) { h.commandRingCount = 3; },
       SegmentHeaderError::kMisaligned},
      {"ring not whole cache lines",
       [](auto& h) {
         h.commandRingCount = 1024;
         h.commandRings.bytes = 1024 * 32;  // whole cache lines in all, 32 B per ring
       },
       SegmentHeaderError::kMisaligned},
      {"empty completion rings", [](auto& h) { h.completionRings.bytes = 0; },
       SegmentHeaderError::kEmptyRing},
      {"completion rings not divisible", [](auto& h) { h.completionRings.bytes -= 64; },
       SegmentHeaderError::kMisaligned},
      {"completion ring not whole cache lines", [](auto& h) { h.completionRings.bytes -= 128; },
       SegmentHeaderError::kMisaligned},
      {"misaligned staging", [](auto& h) { h.staging.offset += 64; },
       SegmentHeaderError::kMisaligned},
      {"staging not whole pages", [](auto& h) { h.staging.bytes -= 64; },
       SegmentHeaderError::kMisaligned},
      {"heap past the end", [](auto& h) { h.pinnedHeap.bytes += 4096; },
       SegmentHeaderError::kRegionOutOfBounds},
      {"heap offset near 2^64", [](auto& h) { h.pinnedHeap.offset = kU64Max - 4095; },
       SegmentHeaderError::kRegionOutOfBounds},
      {"heap bytes near 2^64", [](auto& h) { h.pinnedHeap.bytes = kU64Max - 4095; },
       SegmentHeaderError::kRegionOutOfBounds},
      {"staging over the completion rings",
       [](auto& h) { h.staging.offset = h.completionRings.offset; },
       SegmentHeaderError::kRegionsOverlap},
      {"rings over the header", [](auto& h) { h.commandRings.offset = 0; },
       SegmentHeaderError::kRegionsOverlap},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    wire::SegmentHeader header = good;
    c.mutate(header);
    EXPECT_EQ(validateSegmentHeader(header, good.segmentBytes), c.error);
  }
  EXPECT_EQ(std::get<SegmentHeaderError>(readSegmentHeader(Bytes(100))),
            SegmentHeaderError::kTooSmall);
  EXPECT_FALSE(validateSegmentHeader(good, good.segmentBytes));
}

// --- Seed corpus ---------------------------------------------------------------------------

// The fuzz target's seeds are these records. They are checked here so that a format change that
// breaks them fails a unit test; with GPUPROXY_WRITE_RING_CORPUS=<dir> the test writes them out
// (to regenerate tests/fuzz/corpus/ring_record/ after such a change).
TEST(RingSeedCorpus, EverySeedDecodes) {
  auto seeds = allSamples();
  seeds.emplace_back("completion", encoded(Completion{77, CUDA_SUCCESS}));
  seeds.emplace_back("async_error",
                     encoded(AsyncError{42, 0x1000, 0x3000, CUDA_ERROR_INVALID_VALUE,
                                        static_cast<std::uint16_t>(Opcode::kLaunchKernel)}));
  seeds.emplace_back("staging_release", encoded(StagingRelease{4096, 65536}));
  seeds.emplace_back("device_output", encoded(DeviceOutput{42}));
  const char* dir = std::getenv("GPUPROXY_WRITE_RING_CORPUS");
  for (const auto& [name, record] : seeds) {
    SCOPED_TRACE(name);
    const bool command = !std::holds_alternative<DecodeError>(decodeCommand(record, kLimits));
    const bool completion = !std::holds_alternative<DecodeError>(decodeCompletion(record, kLimits));
    EXPECT_TRUE(command != completion);
    if (dir != nullptr) {
      std::ofstream out(std::filesystem::path(dir) / (name + ".bin"), std::ios::binary);
      out.write(reinterpret_cast<const char*>(record.data()),
                static_cast<std::streamsize>(record.size()));
      EXPECT_TRUE(out.good());
    }
  }
}

}  // namespace
}  // namespace gpuproxy::protocol::ring
