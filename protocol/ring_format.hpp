#pragma once
// The records that travel in a client's shared-memory segment (the data plane,
// docs/architecture.md §3), and the segment header that says where everything lives. The prose
// spec, with every field and the versioning rules, is protocol/RING_FORMAT.md; the
// static_asserts below pin the same offsets.
//
// The client can rewrite any byte of the segment at any time, so nothing here reads shared memory
// in place: the ring copies each record out first (ipc/spsc_ring), and the decoders below take
// that private copy and validate all of it before anyone acts on it. A decoded command is safe to
// act on except for its handles and device pointers, which the daemon checks against the
// session's tables.

#include "protocol/limits.hpp"

#include <cuda.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <variant>

namespace gpuproxy::protocol::ring {

static_assert(std::endian::native == std::endian::little,
              "ring records are little-endian and copied with memcpy");

// Bumped on every change that makes one side read a record or the header differently from the
// other (RING_FORMAT.md, "Versioning").
inline constexpr std::uint32_t kFormatVersion = 6;
// "GPXYRING" as bytes in memory.
inline constexpr std::uint64_t kSegmentMagic = 0x474E495259585047ull;

// Every record starts and ends on this boundary; lengths are multiples of it.
inline constexpr std::uint32_t kRecordAlignment = 8;
// Region offsets in the segment are page-aligned so that the daemon can register the staging
// area and pinned heap with cuMemHostRegister, and so that no two regions share a cache line.
inline constexpr std::uint64_t kRegionAlignment = 4096;
// Region sizes are whole cache lines, so that consecutive command rings never share one.
inline constexpr std::uint64_t kRegionSizeGranule = 64;
inline constexpr std::uint32_t kMaxCommandRings = 1024;

// CUDA's limit on a kernel's parameter buffer.
inline constexpr std::uint32_t kMaxParameterBytes = kMaxKernelParameterBytes;

// ---------------------------------------------------------------------------------------------
// Wire layouts. All fields are fixed-width little-endian; all reserved fields must be zero.

namespace wire {

struct Region {
  std::uint64_t offset;  // from the start of the segment
  std::uint64_t bytes;
};
static_assert(sizeof(Region) == 16);

// At offset 0 of the segment. Written once by the daemon before it passes the memfd; the daemon
// keeps its own copy and never reads this one back (the client can scribble on it).
struct SegmentHeader {
  std::uint64_t magic;          // kSegmentMagic
  std::uint32_t formatVersion;  // kFormatVersion
  std::uint32_t headerBytes;    // sizeof(SegmentHeader)
  std::uint64_t segmentBytes;   // the whole segment, header included
  std::uint32_t commandRingCount;
  std::uint32_t reserved0;
  Region commandRings;     // commandRingCount rings of commandRings.bytes / commandRingCount bytes
  Region completionRings;  // as many, cut the same way: ring i answers command ring i
  Region control;          // doorbell and sleep words; their layout belongs to ipc/
  Region staging;
  Region pinnedHeap;
  std::uint64_t reserved1[2];
};
static_assert(sizeof(SegmentHeader) == 128);
static_assert(offsetof(SegmentHeader, formatVersion) == 8);
static_assert(offsetof(SegmentHeader, segmentBytes) == 16);
static_assert(offsetof(SegmentHeader, commandRingCount) == 24);
static_assert(offsetof(SegmentHeader, commandRings) == 32);
static_assert(offsetof(SegmentHeader, completionRings) == 48);
static_assert(offsetof(SegmentHeader, control) == 64);
static_assert(offsetof(SegmentHeader, staging) == 80);
static_assert(offsetof(SegmentHeader, pinnedHeap) == 96);
static_assert(offsetof(SegmentHeader, reserved1) == 112);

struct CommandHeader {
  std::uint16_t opcode;
  std::uint16_t flags;   // meaning depends on the opcode; unknown bits are an error
  std::uint32_t length;  // bytes, header and padding included; a multiple of 8
  std::uint64_t sequence;
};
static_assert(sizeof(CommandHeader) == 16);

struct LaunchKernelBody {
  std::uint64_t context;
  std::uint64_t function;
  std::uint64_t stream;
  std::uint32_t grid[3];
  std::uint32_t block[3];
  std::uint32_t sharedMemBytes;
  std::uint32_t parameterBytes;
  std::uint64_t parameterOffset;  // region offset when kLaunchParametersByReference, else 0
  std::uint8_t parameterRegion;   // a HostRegion when by reference, else 0
  std::uint8_t reserved[7];
  // Inline parameters follow (parameterBytes, zero-padded to 8) unless by reference.
};
static_assert(sizeof(LaunchKernelBody) == 72);
static_assert(offsetof(LaunchKernelBody, grid) == 24);
static_assert(offsetof(LaunchKernelBody, block) == 36);
static_assert(offsetof(LaunchKernelBody, sharedMemBytes) == 48);
static_assert(offsetof(LaunchKernelBody, parameterBytes) == 52);
static_assert(offsetof(LaunchKernelBody, parameterOffset) == 56);
static_assert(offsetof(LaunchKernelBody, parameterRegion) == 64);

// CopyHostToDevice and CopyDeviceToHost.
struct HostCopyBody {
  std::uint64_t context;
  std::uint64_t stream;
  std::uint64_t devicePointer;  // destination of H2D, source of D2H
  std::uint64_t hostOffset;     // in hostRegion
  std::uint64_t bytes;
  std::uint64_t completionToken;  // 0: no completion record wanted
  std::uint32_t chunkIndex;
  std::uint8_t hostRegion;
  std::uint8_t reserved[3];
};
static_assert(sizeof(HostCopyBody) == 56);
static_assert(offsetof(HostCopyBody, hostOffset) == 24);
static_assert(offsetof(HostCopyBody, completionToken) == 40);
static_assert(offsetof(HostCopyBody, chunkIndex) == 48);
static_assert(offsetof(HostCopyBody, hostRegion) == 52);

struct CopyDeviceToDeviceBody {
  std::uint64_t context;
  std::uint64_t stream;
  std::uint64_t destination;
  std::uint64_t source;
  std::uint64_t bytes;
};
static_assert(sizeof(CopyDeviceToDeviceBody) == 40);

struct MemsetBody {
  std::uint64_t context;
  std::uint64_t stream;
  std::uint64_t destination;
  std::uint64_t count;  // elements
  std::uint32_t value;  // only the low elementSize bytes may be set
  std::uint8_t elementSize;
  std::uint8_t reserved[3];
};
static_assert(sizeof(MemsetBody) == 40);
static_assert(offsetof(MemsetBody, value) == 32);
static_assert(offsetof(MemsetBody, elementSize) == 36);

// cuMemsetD2D8/16/32: `height` rows of `width` elements, `pitch` bytes apart.
struct Memset2DBody {
  std::uint64_t context;
  std::uint64_t stream;
  std::uint64_t destination;
  std::uint64_t pitch;   // bytes from one row's start to the next's
  std::uint64_t width;   // elements per row
  std::uint64_t height;  // rows
  std::uint32_t value;   // only the low elementSize bytes may be set
  std::uint8_t elementSize;
  std::uint8_t reserved[3];
};
static_assert(sizeof(Memset2DBody) == 56);
static_assert(offsetof(Memset2DBody, pitch) == 24);
static_assert(offsetof(Memset2DBody, value) == 48);
static_assert(offsetof(Memset2DBody, elementSize) == 52);

struct EventRecordBody {
  std::uint64_t context;
  std::uint64_t event;
  std::uint64_t stream;
  std::uint32_t recordFlags;  // cuEventRecordWithFlags flags
  std::uint32_t reserved;
};
static_assert(sizeof(EventRecordBody) == 32);

struct StreamWaitEventBody {
  std::uint64_t context;
  std::uint64_t stream;
  std::uint64_t event;
  std::uint32_t waitFlags;  // cuStreamWaitEvent flags
  std::uint32_t reserved;
};
static_assert(sizeof(StreamWaitEventBody) == 32);

struct SynchronizeBody {
  std::uint64_t context;
  std::uint64_t handle;  // stream or event; 0 for kind context
  std::uint64_t completionToken;
  std::uint8_t kind;  // a SynchronizeKind
  std::uint8_t reserved[7];
};
static_assert(sizeof(SynchronizeBody) == 32);
static_assert(offsetof(SynchronizeBody, kind) == 24);

// HostFunction, HostFunctionReturned and HoldForEvent (whose token is in `completionToken`).
struct HostFunctionBody {
  std::uint64_t context;
  std::uint64_t stream;
  std::uint64_t completionToken;
};
static_assert(sizeof(HostFunctionBody) == 24);

struct LetGoAfterEventBody {
  std::uint64_t context;  // the event's
  std::uint64_t event;
  std::uint64_t token;  // the HoldForEvent's
  std::uint64_t waiterContext;
  std::uint64_t waiterStream;
};
static_assert(sizeof(LetGoAfterEventBody) == 40);
static_assert(offsetof(LetGoAfterEventBody, waiterContext) == 24);

// At the start of the control region. The daemon increments `completionsPublished` after every
// completion record it writes and wakes the client with FUTEX_WAKE when `completionWaiters` is
// nonzero (the pair is ipc::CompletionWord).
struct ControlBlock {
  std::uint32_t completionsPublished;
  std::uint32_t completionWaiters;
  std::uint8_t reserved[56];
};
static_assert(sizeof(ControlBlock) == 64);

struct CompletionHeader {
  std::uint16_t kind;
  std::uint16_t flags;  // none defined; must be zero
  std::uint32_t length;
};
static_assert(sizeof(CompletionHeader) == 8);

struct CompletionBody {
  std::uint64_t token;
  std::int32_t result;
  std::uint32_t reserved;
};
static_assert(sizeof(CompletionBody) == 16);

struct AsyncErrorBody {
  std::uint64_t sequence;
  std::uint64_t context;
  std::uint64_t stream;
  std::int32_t result;
  std::uint16_t opcode;
  std::uint16_t reserved;
};
static_assert(sizeof(AsyncErrorBody) == 32);

struct StagingReleaseBody {
  std::uint64_t offset;  // in the staging area
  std::uint64_t bytes;
};
static_assert(sizeof(StagingReleaseBody) == 16);

struct DeviceOutputBody {
  std::uint64_t bytes;  // device printf output waiting in the daemon
};
static_assert(sizeof(DeviceOutputBody) == 8);

}  // namespace wire

// ---------------------------------------------------------------------------------------------
// Opcodes, flags and enumerations. Values are part of the format: never renumber.

enum class Opcode : std::uint16_t {
  // 0 is never valid, so that zeroed memory never decodes as a command.
  kLaunchKernel = 1,
  kCopyHostToDevice = 2,
  kCopyDeviceToHost = 3,
  kCopyDeviceToDevice = 4,
  kMemset = 5,
  kEventRecord = 6,
  kStreamWaitEvent = 7,
  kSynchronize = 8,
  kMemset2D = 9,
  kHostFunction = 10,
  kHostFunctionReturned = 11,
  kHoldForEvent = 12,
  kLetGoAfterEvent = 13,
};

enum class CompletionKind : std::uint16_t {
  kCompletion = 1,
  kAsyncError = 2,
  kStagingRelease = 3,
  kDeviceOutput = 4,
};

// LaunchKernel: the parameters are in a host region instead of inline.
inline constexpr std::uint16_t kLaunchParametersByReference = 1u << 0;
// LaunchKernel: a cooperative launch (cuLaunchCooperativeKernel): every block resident at once,
// so that the grid may synchronise (cooperative_groups::grid_group::sync).
inline constexpr std::uint16_t kLaunchCooperative = 1u << 1;
// Host copies: this record is the last chunk of its copy.
inline constexpr std::uint16_t kCopyLastChunk = 1u << 0;
// Synchronize: answer at once (CUDA_SUCCESS or CUDA_ERROR_NOT_READY) instead of waiting, as
// cuStreamQuery / cuEventQuery do.
inline constexpr std::uint16_t kSynchronizeQuery = 1u << 0;

// Where the host side of a copy (or by-reference kernel parameters) lies: the segment's staging
// area or pinned heap, or (records carried by Session.submit only) the call's own payload.
enum class HostRegion : std::uint8_t { kStaging = 1, kPinnedHeap = 2, kMessage = 3 };
enum class SynchronizeKind : std::uint8_t { kStream = 1, kEvent = 2, kContext = 3 };

inline constexpr std::uint32_t kCommandHeaderBytes = sizeof(wire::CommandHeader);
inline constexpr std::uint32_t kLaunchKernelFixedBytes =
    kCommandHeaderBytes + sizeof(wire::LaunchKernelBody);
// The longest command: a launch with the largest inline parameter buffer.
inline constexpr std::uint32_t kMaxCommandRecordBytes =
    kLaunchKernelFixedBytes +
    (kMaxParameterBytes + kRecordAlignment - 1) / kRecordAlignment * kRecordAlignment;
static_assert(kMaxCommandRecordBytes == 32856);
inline constexpr std::uint32_t kMaxCompletionRecordBytes =
    sizeof(wire::CompletionHeader) + sizeof(wire::AsyncErrorBody);

// ---------------------------------------------------------------------------------------------
// Decoded forms: plain values, what the daemon acts on and what the stub encodes from.

using Handle = std::uint64_t;

struct Dim3 {
  std::uint32_t x = 1;
  std::uint32_t y = 1;
  std::uint32_t z = 1;
  friend bool operator==(const Dim3&, const Dim3&) = default;
};

struct HostLocation {
  HostRegion region = HostRegion::kStaging;
  std::uint64_t offset = 0;  // from the start of the region
  friend bool operator==(const HostLocation&, const HostLocation&) = default;
};

struct LaunchKernel {
  static constexpr Opcode kOpcode = Opcode::kLaunchKernel;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle function = 0;
  Handle stream = 0;
  Dim3 grid;
  Dim3 block;
  std::uint32_t sharedMemBytes = 0;
  std::uint32_t parameterBytes = 0;
  // Where the parameter buffer is: inline (a view into the decoded record, or the encoder's
  // source bytes; size == parameterBytes) or, when set, parameterBytes at this host location.
  std::span<const std::byte> inlineParameters;
  std::optional<HostLocation> parameterReference;
  bool cooperative = false;  // kLaunchCooperative
};

struct CopyHostToDevice {
  static constexpr Opcode kOpcode = Opcode::kCopyHostToDevice;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t destination = 0;  // device pointer
  HostLocation source;
  std::uint64_t bytes = 0;
  std::uint64_t completionToken = 0;  // 0: none
  std::uint32_t chunkIndex = 0;
  bool lastChunk = true;
  friend bool operator==(const CopyHostToDevice&, const CopyHostToDevice&) = default;
};

struct CopyDeviceToHost {
  static constexpr Opcode kOpcode = Opcode::kCopyDeviceToHost;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t source = 0;  // device pointer
  HostLocation destination;
  std::uint64_t bytes = 0;
  std::uint64_t completionToken = 0;  // required when the destination is the staging area
  std::uint32_t chunkIndex = 0;
  bool lastChunk = true;
  friend bool operator==(const CopyDeviceToHost&, const CopyDeviceToHost&) = default;
};

struct CopyDeviceToDevice {
  static constexpr Opcode kOpcode = Opcode::kCopyDeviceToDevice;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t destination = 0;
  std::uint64_t source = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const CopyDeviceToDevice&, const CopyDeviceToDevice&) = default;
};

struct Memset {
  static constexpr Opcode kOpcode = Opcode::kMemset;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t destination = 0;
  std::uint64_t count = 0;  // elements
  std::uint32_t value = 0;
  std::uint8_t elementSize = 1;  // 1, 2 or 4 (cuMemsetD8/D16/D32)
  friend bool operator==(const Memset&, const Memset&) = default;
};

struct Memset2D {
  static constexpr Opcode kOpcode = Opcode::kMemset2D;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t destination = 0;
  std::uint64_t pitch = 0;   // bytes between row starts (unused with one row)
  std::uint64_t width = 0;   // elements per row
  std::uint64_t height = 0;  // rows
  std::uint32_t value = 0;
  std::uint8_t elementSize = 1;  // 1, 2 or 4 (cuMemsetD2D8/D2D16/D2D32)
  friend bool operator==(const Memset2D&, const Memset2D&) = default;
};

struct EventRecord {
  static constexpr Opcode kOpcode = Opcode::kEventRecord;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle event = 0;
  Handle stream = 0;
  std::uint32_t flags = 0;
  friend bool operator==(const EventRecord&, const EventRecord&) = default;
};

struct StreamWaitEvent {
  static constexpr Opcode kOpcode = Opcode::kStreamWaitEvent;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  Handle event = 0;
  std::uint32_t flags = 0;
  friend bool operator==(const StreamWaitEvent&, const StreamWaitEvent&) = default;
};

struct Synchronize {
  static constexpr Opcode kOpcode = Opcode::kSynchronize;
  std::uint64_t sequence = 0;
  Handle context = 0;
  SynchronizeKind kind = SynchronizeKind::kStream;
  Handle handle = 0;  // stream (0: the context's NULL stream) or event; 0 for kContext
  std::uint64_t completionToken = 0;  // never 0: someone is waiting for it
  bool query = false;                 // cuStreamQuery / cuEventQuery: answer without waiting
  friend bool operator==(const Synchronize&, const Synchronize&) = default;
};

// Host work on a stream (cuLaunchHostFunc, cuStreamAddCallback), which the stub runs itself: the
// daemon answers `completionToken` with a Completion once the stream's earlier work is done (its
// result: the stream's status), and holds the stream's later work until the stub sends
// HostFunctionReturned with the same token.
struct HostFunction {
  static constexpr Opcode kOpcode = Opcode::kHostFunction;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t completionToken = 0;
  friend bool operator==(const HostFunction&, const HostFunction&) = default;
};

// The host function of that token has returned: the stream goes on.
struct HostFunctionReturned {
  static constexpr Opcode kOpcode = Opcode::kHostFunctionReturned;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t token = 0;  // the HostFunction's completionToken (nobody waits for an answer)
  friend bool operator==(const HostFunctionReturned&, const HostFunctionReturned&) = default;
};

// A stream's wait for an event of another device (cuStreamWaitEvent across devices), as two
// records, each acting on one device, joined by a token the client chose: HoldForEvent, for the
// stream's device, holds the stream's later work until the LetGoAfterEvent of the same token,
// for the event's device, finds the event's latest record done. Either may be executed first.
// Nobody waits for an answer; a failure is an AsyncError of the waiting stream.
struct HoldForEvent {
  static constexpr Opcode kOpcode = Opcode::kHoldForEvent;
  std::uint64_t sequence = 0;
  Handle context = 0;
  Handle stream = 0;
  std::uint64_t token = 0;
  friend bool operator==(const HoldForEvent&, const HoldForEvent&) = default;
};

struct LetGoAfterEvent {
  static constexpr Opcode kOpcode = Opcode::kLetGoAfterEvent;
  std::uint64_t sequence = 0;
  Handle context = 0;  // the event's
  Handle event = 0;
  std::uint64_t token = 0;
  Handle waiterContext = 0;  // the held stream's, whose device lets it go
  Handle waiterStream = 0;
  friend bool operator==(const LetGoAfterEvent&, const LetGoAfterEvent&) = default;
};

struct Completion {
  std::uint64_t token = 0;
  CUresult result = CUDA_SUCCESS;
  friend bool operator==(const Completion&, const Completion&) = default;
};

// A command that failed after the client moved on; the stub latches it and reports it at the
// next synchronising call on that stream or context, as CUDA reports asynchronous errors.
struct AsyncError {
  std::uint64_t sequence = 0;  // of the failing command
  Handle context = 0;
  Handle stream = 0;
  CUresult result = CUDA_SUCCESS;
  std::uint16_t opcode = 0;  // of the failing command, for the stub's log
  friend bool operator==(const AsyncError&, const AsyncError&) = default;
};

// The daemon no longer needs this range of the staging area (the H2D chunk or by-reference
// parameters in it were consumed); the client may reuse it.
struct StagingRelease {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const StagingRelease&, const StagingRelease&) = default;
};

// The client's kernels printed (device printf): the daemon holds `bytes` of output for it, which
// the stub fetches with Session.takeDeviceOutput and writes to the application's stdout before
// the synchronising call this record precedes returns, as a GPU's driver does.
struct DeviceOutput {
  std::uint64_t bytes = 0;
  friend bool operator==(const DeviceOutput&, const DeviceOutput&) = default;
};

// ---------------------------------------------------------------------------------------------
// Decoding.

enum class DecodeFailure : std::uint8_t {
  // Framing: the record cannot be trusted to mean what the client thinks; disconnect.
  kTruncated,         // shorter than the header
  kLengthMismatch,    // header length differs from the record's size
  kMisalignedLength,  // length not a multiple of 8
  kTooLong,           // longer than any record of this format
  kUnknownOpcode,     // or unknown completion kind
  kUnknownFlags,      // a flag bit this version does not define
  kWrongLength,       // length does not match what the opcode and its fields imply
  kReservedNotZero,   // reserved field or padding set (a newer or broken peer)
  kUnknownResult,     // a completion's result is not a CUresult cuda.h defines
  // Values: the record is well-formed, its arguments are not; fail this command only.
  kParameterBytesTooLarge,
  kBadRegion,           // host region not staging or pinned heap
  kRangeOutsideRegion,  // host offset + bytes past the end of the region, or wrapping
  kRangeOverflow,       // device pointer + bytes wraps, or count * elementSize overflows
  kZeroDimension,       // a grid or block dimension is 0
  kBadElementSize,      // memset element size not 1, 2 or 4
  kValueTooWide,        // memset value has bits above the element size
  kBadChunk,            // pinned-heap copies are one chunk; by-reference parameters are not empty
  kMissingCompletionToken,
  kBadSynchronizeKind,
  kBadHandle,  // a handle that must be 0 for this kind is not
  kBadFlags,   // CUDA flags argument the API would refuse
};

std::string_view describe(DecodeFailure failure);

struct DecodeError {
  DecodeFailure failure = DecodeFailure::kTruncated;
  // What the daemon reports: as an AsyncError for the command's stream, or as the Completion of
  // a Synchronize (completionToken below). The real driver gives CUDA_ERROR_INVALID_VALUE for
  // these arguments; an unknown opcode or flag is CUDA_ERROR_NOT_SUPPORTED.
  CUresult result = CUDA_ERROR_INVALID_VALUE;
  // Framing is broken or the peer speaks another version: the daemon drops the client. Otherwise
  // only this command fails and the fields below say whom to tell.
  bool disconnect = true;
  std::uint16_t opcode = 0;
  std::uint64_t sequence = 0;  // so the daemon's ticket merge does not wait for it forever
  Handle context = 0;
  Handle stream = 0;                  // for kSynchronize of kind stream, the stream; else 0
  std::uint64_t completionToken = 0;  // nonzero when someone waits for this command's answer
};

// The record table: every command, in opcode order. A command is its wire body and decoded
// struct above (with its kOpcode), its line here, and its decoder and encoder in
// ring_format.cpp; the variants, the opcode check and the generic encode() follow from this list.
template <typename... Commands>
struct CommandTable {
  using Command = std::variant<Commands...>;
  using Decoded = std::variant<Commands..., DecodeError>;
  static constexpr bool knows(std::uint16_t opcode) {
    return ((opcode == static_cast<std::uint16_t>(Commands::kOpcode)) || ...);
  }
};
using Commands = CommandTable<LaunchKernel, CopyHostToDevice, CopyDeviceToHost, CopyDeviceToDevice,
                              Memset, EventRecord, StreamWaitEvent, Synchronize, Memset2D,
                              HostFunction, HostFunctionReturned, HoldForEvent, LetGoAfterEvent>;

// Any one command, as the stub hands it to its command sink.
using Command = Commands::Command;
using DecodedCommand = Commands::Decoded;
using DecodedCompletion =
    std::variant<Completion, AsyncError, StagingRelease, DeviceOutput, DecodeError>;

// The sizes of the host regions, in bytes, as the daemon laid them out (never re-read from the
// segment: see wire::SegmentHeader).
struct SegmentLimits {
  std::uint64_t stagingBytes = 0;
  std::uint64_t pinnedHeapBytes = 0;
  // The payload of the Session.submit call that carries the records; nullopt for records read
  // from a ring, which cannot name one (HostRegion::kMessage is then a bad region).
  std::optional<std::uint64_t> messageBytes;
};

// The fixed header fields, for a ring that needs a record's length or sequence before decoding
// it. nullopt when fewer than 16 bytes are given; no other checks.
std::optional<wire::CommandHeader> peekCommandHeader(std::span<const std::byte> record);

// Validates every field of one command record (exactly the record's bytes, as copied out of the
// ring). LaunchKernel::inlineParameters points into `record`.
DecodedCommand decodeCommand(std::span<const std::byte> record, const SegmentLimits& limits);

// Whether `command` is a DecodeError that breaks the framing: nothing after it can be trusted, and
// whoever framed the records (a ring's channel, the session for a Session.submit batch) ends the
// client's connection instead of executing anything.
inline bool breaksFraming(const DecodedCommand& command) {
  const auto* error = std::get_if<DecodeError>(&command);
  return error != nullptr && error->disconnect;
}

// The stub's side of the completion ring. The daemon is trusted, but a mismatched daemon is not
// something to act on silently.
DecodedCompletion decodeCompletion(std::span<const std::byte> record, const SegmentLimits& limits);

// ---------------------------------------------------------------------------------------------
// Encoding. Each encoder writes one record at the start of `out` and returns its length, or 0
// when `out` is too small or the value cannot be represented (inline parameters whose size is
// not parameterBytes or exceeds the limit). Encoders do not check argument values: the decoder
// is the only judge, and tests build invalid records with them.

std::uint32_t encodedSize(const LaunchKernel& command);
std::uint32_t encodedSize(const CopyHostToDevice& command);
std::uint32_t encodedSize(const CopyDeviceToHost& command);
std::uint32_t encodedSize(const CopyDeviceToDevice& command);
std::uint32_t encodedSize(const Memset& command);
std::uint32_t encodedSize(const EventRecord& command);
std::uint32_t encodedSize(const StreamWaitEvent& command);
std::uint32_t encodedSize(const Synchronize& command);
std::uint32_t encodedSize(const Memset2D& command);
std::uint32_t encodedSize(const HostFunction& command);
std::uint32_t encodedSize(const HostFunctionReturned& command);
std::uint32_t encodedSize(const HoldForEvent& command);
std::uint32_t encodedSize(const LetGoAfterEvent& command);
std::uint32_t encodedSize(const Completion& completion);
std::uint32_t encodedSize(const AsyncError& completion);
std::uint32_t encodedSize(const StagingRelease& completion);
std::uint32_t encodedSize(const DeviceOutput& completion);

std::size_t encodeLaunchKernel(const LaunchKernel& command, std::span<std::byte> out);
std::size_t encodeCopyHostToDevice(const CopyHostToDevice& command, std::span<std::byte> out);
std::size_t encodeCopyDeviceToHost(const CopyDeviceToHost& command, std::span<std::byte> out);
std::size_t encodeCopyDeviceToDevice(const CopyDeviceToDevice& command, std::span<std::byte> out);
std::size_t encodeMemset(const Memset& command, std::span<std::byte> out);
std::size_t encodeEventRecord(const EventRecord& command, std::span<std::byte> out);
std::size_t encodeStreamWaitEvent(const StreamWaitEvent& command, std::span<std::byte> out);
std::size_t encodeSynchronize(const Synchronize& command, std::span<std::byte> out);
std::size_t encodeMemset2D(const Memset2D& command, std::span<std::byte> out);
std::size_t encodeHostFunction(const HostFunction& command, std::span<std::byte> out);
std::size_t encodeHostFunctionReturned(const HostFunctionReturned& command,
                                       std::span<std::byte> out);
std::size_t encodeHoldForEvent(const HoldForEvent& command, std::span<std::byte> out);
std::size_t encodeLetGoAfterEvent(const LetGoAfterEvent& command, std::span<std::byte> out);
std::size_t encodeCompletion(const Completion& completion, std::span<std::byte> out);
std::size_t encodeAsyncError(const AsyncError& completion, std::span<std::byte> out);
std::size_t encodeStagingRelease(const StagingRelease& completion, std::span<std::byte> out);
std::size_t encodeDeviceOutput(const DeviceOutput& completion, std::span<std::byte> out);

// One name for all of the above, for generic code (std::visit over a decoded variant).
inline std::size_t encode(const LaunchKernel& c, std::span<std::byte> out) {
  return encodeLaunchKernel(c, out);
}
inline std::size_t encode(const CopyHostToDevice& c, std::span<std::byte> out) {
  return encodeCopyHostToDevice(c, out);
}
inline std::size_t encode(const CopyDeviceToHost& c, std::span<std::byte> out) {
  return encodeCopyDeviceToHost(c, out);
}
inline std::size_t encode(const CopyDeviceToDevice& c, std::span<std::byte> out) {
  return encodeCopyDeviceToDevice(c, out);
}
inline std::size_t encode(const Memset& c, std::span<std::byte> out) {
  return encodeMemset(c, out);
}
inline std::size_t encode(const EventRecord& c, std::span<std::byte> out) {
  return encodeEventRecord(c, out);
}
inline std::size_t encode(const StreamWaitEvent& c, std::span<std::byte> out) {
  return encodeStreamWaitEvent(c, out);
}
inline std::size_t encode(const Synchronize& c, std::span<std::byte> out) {
  return encodeSynchronize(c, out);
}
inline std::size_t encode(const Memset2D& c, std::span<std::byte> out) {
  return encodeMemset2D(c, out);
}
inline std::size_t encode(const HostFunction& c, std::span<std::byte> out) {
  return encodeHostFunction(c, out);
}
inline std::size_t encode(const HostFunctionReturned& c, std::span<std::byte> out) {
  return encodeHostFunctionReturned(c, out);
}
inline std::size_t encode(const HoldForEvent& c, std::span<std::byte> out) {
  return encodeHoldForEvent(c, out);
}
inline std::size_t encode(const LetGoAfterEvent& c, std::span<std::byte> out) {
  return encodeLetGoAfterEvent(c, out);
}
inline std::size_t encode(const Completion& c, std::span<std::byte> out) {
  return encodeCompletion(c, out);
}
inline std::size_t encode(const AsyncError& c, std::span<std::byte> out) {
  return encodeAsyncError(c, out);
}
inline std::size_t encode(const StagingRelease& c, std::span<std::byte> out) {
  return encodeStagingRelease(c, out);
}
inline std::size_t encode(const DeviceOutput& c, std::span<std::byte> out) {
  return encodeDeviceOutput(c, out);
}

// ---------------------------------------------------------------------------------------------
// The segment header.

struct SegmentPlan {
  std::uint32_t commandRingCount = 1;     // and as many completion rings
  std::uint64_t commandRingBytes = 0;     // each ring, its control words included
  std::uint64_t completionRingBytes = 0;  // each ring
  std::uint64_t controlBytes = 0;
  std::uint64_t stagingBytes = 0;
  std::uint64_t pinnedHeapBytes = 0;
};

// The daemon's layout: header, then each region in the order above at the next page boundary,
// sizes rounded up to kRegionSizeGranule (rings, control) or a page (staging, heap). nullopt
// when the sizes overflow or break the rules validateSegmentHeader checks.
std::optional<wire::SegmentHeader> planSegment(const SegmentPlan& plan);

enum class SegmentHeaderError : std::uint8_t {
  kTooSmall,  // fewer bytes mapped than a header
  kBadMagic,
  kUnsupportedVersion,
  kBadHeaderBytes,
  kReservedNotZero,
  kSegmentSizeMismatch,  // segmentBytes differs from what is mapped
  kBadRingCount,
  kMisaligned,
  kRegionOutOfBounds,
  kRegionsOverlap,
  kEmptyRing,
};

std::string_view describe(SegmentHeaderError error);

// Copies the header out of the first bytes of a mapped segment (whose total size is
// mapped.size()) and checks it. The client calls this on the segment it receives.
std::variant<wire::SegmentHeader, SegmentHeaderError> readSegmentHeader(
    std::span<const std::byte> mapped);
std::optional<SegmentHeaderError> validateSegmentHeader(const wire::SegmentHeader& header,
                                                        std::uint64_t mappedBytes);

SegmentLimits limitsOf(const wire::SegmentHeader& header);

// Command ring `index` (< commandRingCount) of a validated header, and the completion ring that
// answers it.
wire::Region commandRing(const wire::SegmentHeader& header, std::uint32_t index);
wire::Region completionRing(const wire::SegmentHeader& header, std::uint32_t index);

}  // namespace gpuproxy::protocol::ring
