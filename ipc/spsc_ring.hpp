#pragma once
// A single-producer/single-consumer ring of variable-length records in shared memory, between two
// processes that do not trust each other: the client produces into the daemon's command ring and
// consumes from its completion ring. Each side keeps its own copy of everything it relies on and
// treats the shared bytes as hostile input; nothing in the ring can lock, so a peer that dies at
// any instruction leaves the other side able to go on (or to fail that peer) without waiting.
//
// Layout (offsets are part of the format; both processes are on one host, so native little-endian
// fixed-width fields):
//
//   offset   0  RingHeader line 0: magic, version, capacity (written once by the creator)
//   offset 128  producerIndex   u64, written only by the producer
//   offset 256  consumerIndex   u64, written only by the consumer
//   offset 384  consumerSleeping u32, set by the consumer before it sleeps, cleared by the
//               producer when it rings the doorbell (doorbell.hpp)
//   offset 512  data[capacity], capacity a power of two
//
// Indices count bytes ever written/consumed and never wrap in practice (2^64 bytes); a record
// starts at `index % capacity`. Each field sits on its own 128-byte pair of cache lines: one line
// is enough against plain false sharing (the alignas(64)), but adjacent-line prefetchers pull
// 128-byte pairs, and the producer reads consumerSleeping after every publish, which must stay a
// local cache hit while the consumer moves consumerIndex.
//
// A record is an 8-byte RecordHeader {bytes, kind} followed by `bytes` of payload, padded to a
// multiple of 8; records never wrap. When the next record does not fit before the end of the
// data area, the producer first writes a padding record that fills it exactly, then the record at
// offset 0. A record may take at most half the capacity, so an empty ring always accepts the
// largest record wherever its indices stand.

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gpuproxy::ipc {

static_assert(std::endian::native == std::endian::little,
              "the ring format is little-endian; both sides run on one host");

inline constexpr std::uint32_t kRingMagic = 0x52585047;  // "GPXR" in memory order
inline constexpr std::uint32_t kRingVersion = 1;
inline constexpr std::size_t kRingMinCapacity = 64;
inline constexpr std::size_t kRingMaxCapacity = std::size_t{1} << 30;  // lengths fit in u32

struct RingHeader {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint64_t capacity;
  std::byte reserved0[112];
  alignas(64) std::uint64_t producerIndex;
  std::byte reserved1[120];
  alignas(64) std::uint64_t consumerIndex;
  std::byte reserved2[120];
  alignas(64) std::uint32_t consumerSleeping;
  std::byte reserved3[124];
};
static_assert(offsetof(RingHeader, capacity) == 8);
static_assert(offsetof(RingHeader, producerIndex) == 128);
static_assert(offsetof(RingHeader, consumerIndex) == 256);
static_assert(offsetof(RingHeader, consumerSleeping) == 384);
static_assert(sizeof(RingHeader) == 512);

struct RecordHeader {
  std::uint32_t bytes;  // payload bytes that follow (excluding the header and the padding)
  std::uint32_t kind;   // kRecordData or kRecordPadding; anything else is corruption
};
static_assert(sizeof(RecordHeader) == 8);
inline constexpr std::uint32_t kRecordData = 0x44;     // 'D'
inline constexpr std::uint32_t kRecordPadding = 0x50;  // 'P'

// The indices are shared between processes; they must be plain lock-free atomics (an atomic that
// falls back to a lock would put a lock in shared memory, and a different one in each process).
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic_ref<std::uint64_t>::required_alignment <= alignof(std::uint64_t));

enum class RingStatus {
  kOk,
  kEmpty,     // reader: nothing published yet
  kFull,      // writer: not enough free space now; nothing was written
  kTooLarge,  // writer: the record exceeds maxRecordBytes() and never fits
  kCorrupt,   // the peer broke the format; sticky: every later call returns it too
};
const char* toString(RingStatus status);

// Bytes a ring of `capacity` takes in the segment (header + data).
constexpr std::size_t ringRegionBytes(std::size_t capacity) {
  return sizeof(RingHeader) + capacity;
}

// The capacity of the ring a region of `regionBytes` holds (the inverse of ringRegionBytes; the
// region must be larger than a ring header).
constexpr std::size_t ringCapacityOf(std::size_t regionBytes) {
  return regionBytes - sizeof(RingHeader);
}

// Largest payload one record may carry in a ring of `capacity`.
constexpr std::size_t ringMaxRecordBytes(std::size_t capacity) {
  return capacity / 2 - sizeof(RecordHeader);
}

// Writes an empty ring's header into `region` (the creator does this once, before the segment is
// shared). Throws std::invalid_argument when capacity is not a power of two in
// [kRingMinCapacity, kRingMaxCapacity] or the region is too small or not 64-byte aligned.
void initializeRing(std::span<std::byte> region, std::size_t capacity);

// The producer's end. Not thread-safe: one thread (or an external lock) per writer.
class RingWriter {
public:
  // Attaches to a ring made by initializeRing. `capacity` comes from the control plane, not from
  // the shared header, which is only checked against it (and never read again). Throws
  // std::invalid_argument when the header does not match.
  RingWriter(std::span<std::byte> region, std::size_t capacity);

  // Copies `record` into the ring and publishes it.
  RingStatus tryWrite(std::span<const std::byte> record);

  // Zero-copy: room for up to `bytes` of payload, written in place, then commit(used) publishes
  // the first `used` bytes as one record. Nothing is visible to the reader before commit; a
  // second reserve before commit replaces the first.
  struct Reservation {
    RingStatus status = RingStatus::kFull;
    std::span<std::byte> bytes;  // valid when status == kOk, until commit
  };
  Reservation reserve(std::size_t bytes);
  void commit(std::size_t used);
  void commit() { commit(reservedBytes_); }

  std::size_t capacity() const { return capacity_; }
  std::size_t maxRecordBytes() const { return ringMaxRecordBytes(capacity_); }
  // The consumer's sleep announcement, for DoorbellRinger.
  std::uint32_t& consumerSleeping() const { return header_->consumerSleeping; }

private:
  bool refreshConsumerIndex();

  RingHeader* header_;
  std::byte* data_;
  std::size_t capacity_;
  std::uint64_t tail_ = 0;        // our own producer index; the shared copy is never read back
  std::uint64_t cachedHead_ = 0;  // last consumer index seen (validated)
  std::size_t reservedOffset_ = 0;
  std::size_t reservedPadding_ = 0;
  std::size_t reservedBytes_ = 0;
  bool reserved_ = false;
  bool corrupt_ = false;
};

// The consumer's end. Not thread-safe.
class RingReader {
public:
  // As RingWriter's: validates the header against `capacity` and never reads it again.
  RingReader(std::span<std::byte> region, std::size_t capacity);

  // Copies the next record out of shared memory into `out` (so the caller examines a private copy
  // the producer can no longer change) and frees its space. Every index and length read from the
  // ring is checked first: a producer index that went backwards, ran more than a capacity ahead or
  // is misaligned, a length beyond what was published or beyond the end of the data area, a
  // padding record that does not end exactly at the end of the data area, an unknown kind, all
  // give kCorrupt. Reads stay within the data area whatever the shared bytes say, and each call
  // does a bounded amount of work.
  RingStatus read(std::vector<std::byte>& out);

  // Whether the producer has published something not read yet (or broken the format, which
  // read() will then report). For the doorbell's re-check before sleeping.
  bool pending();

  // Where this reader has read up to (the consumer's thread only), and what the producer has
  // published, read from the shared header (safe from any thread; a producer that breaks the
  // format may publish anything, so use it only to decide whether to look at the ring). Both count
  // bytes since the ring was made: equal when everything published has been read.
  std::uint64_t readIndex() const { return head_; }
  std::uint64_t publishedIndex() const;

  std::size_t capacity() const { return capacity_; }
  std::uint32_t& consumerSleeping() const { return header_->consumerSleeping; }

private:
  RingStatus fail();

  RingHeader* header_;
  std::byte* data_;
  std::size_t capacity_;
  std::uint64_t head_ = 0;        // our own consumer index
  std::uint64_t cachedTail_ = 0;  // last producer index seen (validated)
  bool corrupt_ = false;
};

}  // namespace gpuproxy::ipc
