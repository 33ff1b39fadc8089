#include "ipc/spsc_ring.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace gpuproxy::ipc {

namespace {

constexpr std::size_t kRecordAlignment = 8;

constexpr std::size_t recordSpan(std::size_t payload) {
  return sizeof(RecordHeader) +
         (payload + kRecordAlignment - 1) / kRecordAlignment * kRecordAlignment;
}

std::uint64_t loadAcquire(std::uint64_t& shared) {
  return std::atomic_ref<std::uint64_t>(shared).load(std::memory_order_acquire);
}

void storeRelease(std::uint64_t& shared, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(shared).store(value, std::memory_order_release);
}

void checkRegion(std::span<std::byte> region, std::size_t capacity) {
  if (!std::has_single_bit(capacity) || capacity < kRingMinCapacity ||
      capacity > kRingMaxCapacity) {
    throw std::invalid_argument("ring capacity " + std::to_string(capacity) +
                                " is not a power of two in [" + std::to_string(kRingMinCapacity) +
                                ", " + std::to_string(kRingMaxCapacity) + "]");
  }
  if (region.size() < ringRegionBytes(capacity)) {
    throw std::invalid_argument("ring region of " + std::to_string(region.size()) +
                                " bytes is smaller than the " +
                                std::to_string(ringRegionBytes(capacity)) + " a ring of " +
                                std::to_string(capacity) + " needs");
  }
  if (reinterpret_cast<std::uintptr_t>(region.data()) % alignof(RingHeader) != 0) {
    throw std::invalid_argument("ring region is not 64-byte aligned");
  }
}

// The shared header, checked once against what the control plane said. Shared bytes are copied
// before they are compared, so that what is checked is what is used.
RingHeader* attach(std::span<std::byte> region, std::size_t capacity) {
  checkRegion(region, capacity);
  auto* header = reinterpret_cast<RingHeader*>(region.data());
  std::uint32_t magic = 0;
  std::uint32_t version = 0;
  std::uint64_t sharedCapacity = 0;
  std::memcpy(&magic, &header->magic, sizeof(magic));
  std::memcpy(&version, &header->version, sizeof(version));
  std::memcpy(&sharedCapacity, &header->capacity, sizeof(sharedCapacity));
  if (magic != kRingMagic) throw std::invalid_argument("not a gpuproxy ring (bad magic)");
  if (version != kRingVersion) {
    throw std::invalid_argument("ring format version " + std::to_string(version) +
                                ", this build speaks " + std::to_string(kRingVersion));
  }
  if (sharedCapacity != capacity) {
    throw std::invalid_argument("ring header says capacity " + std::to_string(sharedCapacity) +
                                ", expected " + std::to_string(capacity));
  }
  return header;
}

}  // namespace

const char* toString(RingStatus status) {
  switch (status) {
    case RingStatus::kOk:
      return "ok";
    case RingStatus::kEmpty:
      return "empty";
    case RingStatus::kFull:
      return "full";
    case RingStatus::kTooLarge:
      return "record too large";
    case RingStatus::kCorrupt:
      return "corrupt";
  }
  return "unknown";
}

void initializeRing(std::span<std::byte> region, std::size_t capacity) {
  checkRegion(region, capacity);
  std::memset(region.data(), 0, sizeof(RingHeader));
  auto* header = reinterpret_cast<RingHeader*>(region.data());
  header->magic = kRingMagic;
  header->version = kRingVersion;
  header->capacity = capacity;
  // The other process first sees these bytes after receiving the segment's descriptor over a
  // socket, which orders them; the fence covers a second thread of this process attaching.
  std::atomic_thread_fence(std::memory_order_release);
}

// ---- RingWriter ----

RingWriter::RingWriter(std::span<std::byte> region, std::size_t capacity)
    : header_(attach(region, capacity)),
      data_(region.data() + sizeof(RingHeader)),
      capacity_(capacity) {}

bool RingWriter::refreshConsumerIndex() {
  const std::uint64_t head = loadAcquire(header_->consumerIndex);
  // The consumer may only move forward, and never past what we published. A consumer index
  // outside that range (a hostile or broken peer) would make us overwrite unread records or
  // compute free space from garbage.
  if (head < cachedHead_ || head > tail_ || head % kRecordAlignment != 0) {
    corrupt_ = true;
    return false;
  }
  cachedHead_ = head;
  return true;
}

RingWriter::Reservation RingWriter::reserve(std::size_t bytes) {
  reserved_ = false;
  if (corrupt_) return {RingStatus::kCorrupt, {}};
  if (bytes > maxRecordBytes()) return {RingStatus::kTooLarge, {}};
  const std::size_t span = recordSpan(bytes);
  const std::size_t offset = tail_ & (capacity_ - 1);
  const std::size_t untilEnd = capacity_ - offset;
  const std::size_t padding = untilEnd < span ? untilEnd : 0;
  const std::size_t needed = padding + span;
  // Only look at the consumer's line when our cached view says the ring is full: while there is
  // room, the producer does not touch it at all.
  if (capacity_ - (tail_ - cachedHead_) < needed) {
    if (!refreshConsumerIndex()) return {RingStatus::kCorrupt, {}};
    if (capacity_ - (tail_ - cachedHead_) < needed) return {RingStatus::kFull, {}};
  }
  reservedPadding_ = padding;
  reservedOffset_ = padding != 0 ? 0 : offset;
  reservedBytes_ = bytes;
  reserved_ = true;
  return {RingStatus::kOk, {data_ + reservedOffset_ + sizeof(RecordHeader), bytes}};
}

void RingWriter::commit(std::size_t used) {
  if (!reserved_ || used > reservedBytes_) {
    throw std::logic_error("RingWriter::commit without a matching reserve");
  }
  reserved_ = false;
  if (reservedPadding_ != 0) {
    const RecordHeader padding{static_cast<std::uint32_t>(reservedPadding_ - sizeof(RecordHeader)),
                               kRecordPadding};
    std::memcpy(data_ + (tail_ & (capacity_ - 1)), &padding, sizeof(padding));
  }
  const RecordHeader record{static_cast<std::uint32_t>(used), kRecordData};
  std::memcpy(data_ + reservedOffset_, &record, sizeof(record));
  tail_ += reservedPadding_ + recordSpan(used);
  // Release: the reader's acquire load of producerIndex makes the header and payload above (and
  // everything else this thread wrote before) visible before it reads them.
  storeRelease(header_->producerIndex, tail_);
}

RingStatus RingWriter::tryWrite(std::span<const std::byte> record) {
  const Reservation reservation = reserve(record.size());
  if (reservation.status != RingStatus::kOk) return reservation.status;
  if (!record.empty()) std::memcpy(reservation.bytes.data(), record.data(), record.size());
  commit(record.size());
  return RingStatus::kOk;
}

// ---- RingReader ----

RingReader::RingReader(std::span<std::byte> region, std::size_t capacity)
    : header_(attach(region, capacity)),
      data_(region.data() + sizeof(RingHeader)),
      capacity_(capacity) {}

RingStatus RingReader::fail() {
  corrupt_ = true;
  return RingStatus::kCorrupt;
}

bool RingReader::pending() {
  if (corrupt_) return true;
  return head_ != cachedTail_ || loadAcquire(header_->producerIndex) != head_;
}

std::uint64_t RingReader::publishedIndex() const {
  return loadAcquire(header_->producerIndex);
}

RingStatus RingReader::read(std::vector<std::byte>& out) {
  if (corrupt_) return RingStatus::kCorrupt;
  // At most two passes: a padding record moves us to offset 0, where padding is invalid.
  for (int pass = 0; pass < 2; ++pass) {
    if (head_ == cachedTail_) {
      // Only touch the producer's line when our cached view is drained.
      const std::uint64_t tail = loadAcquire(header_->producerIndex);
      if (tail < cachedTail_ || tail - head_ > capacity_ || tail % kRecordAlignment != 0) {
        return fail();
      }
      cachedTail_ = tail;
      if (head_ == cachedTail_) return RingStatus::kEmpty;
    }
    const std::size_t available = cachedTail_ - head_;
    const std::size_t offset = head_ & (capacity_ - 1);
    const std::size_t untilEnd = capacity_ - offset;
    // head_ is a multiple of 8 and available >= 8 (both indices are 8-aligned), so the header
    // lies inside the data area.
    RecordHeader header;
    std::memcpy(&header, data_ + offset, sizeof(header));
    if (header.kind == kRecordPadding) {
      if (offset == 0 || header.bytes != untilEnd - sizeof(RecordHeader) || untilEnd > available) {
        return fail();
      }
      head_ += untilEnd;
      storeRelease(header_->consumerIndex, head_);
      continue;
    }
    if (header.kind != kRecordData || header.bytes > ringMaxRecordBytes(capacity_)) return fail();
    const std::size_t span = recordSpan(header.bytes);
    if (span > available || span > untilEnd) return fail();
    out.assign(data_ + offset + sizeof(RecordHeader),
               data_ + offset + sizeof(RecordHeader) + header.bytes);
    head_ += span;
    // Release: our reads of the record above complete before the producer may reuse its space.
    storeRelease(header_->consumerIndex, head_);
    return RingStatus::kOk;
  }
  return fail();
}

}  // namespace gpuproxy::ipc
