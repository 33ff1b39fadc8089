#include "ipc/spsc_ring.hpp"

#include <sched.h>
#include <signal.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/shared_segment.hpp"
#include "tests/unit/ipc/forked_child.hpp"

namespace gpuproxy::ipc {
namespace {

using test::ForkedChild;

// A ring in a fresh shared segment; fork()ed children share it.
struct SharedRing {
  explicit SharedRing(std::size_t capacity)
      : capacity(capacity), segment(SharedSegment::create("ring-test", ringRegionBytes(capacity))) {
    initializeRing(region(), capacity);
  }
  std::span<std::byte> region() const { return segment.bytes(); }
  RingHeader& header() const { return *reinterpret_cast<RingHeader*>(segment.data()); }
  std::byte* data() const { return segment.data() + sizeof(RingHeader); }

  // What a hostile producer can do: any bytes anywhere, any index.
  void putHeader(std::size_t offset, std::uint32_t bytes, std::uint32_t kind) const {
    const RecordHeader record{bytes, kind};
    std::memcpy(data() + offset, &record, sizeof(record));
  }
  void publish(std::uint64_t producerIndex) const { header().producerIndex = producerIndex; }

  std::size_t capacity;
  SharedSegment segment;
};

std::vector<std::byte> pattern(std::size_t bytes, std::uint32_t seed) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    out[i] = std::byte(static_cast<unsigned char>(seed * 31 + i));
  return out;
}

// Lengths of the variable-length records in the cross-process tests: a deterministic mix of
// tiny, odd and near-maximal sizes.
std::size_t lengthOf(std::uint32_t sequence, std::size_t maxBytes) {
  const std::uint32_t mixed = sequence * 2654435761u;
  switch (mixed >> 30) {
    case 0:
      return mixed % 9;
    case 1:
      return mixed % 100;
    case 2:
      return mixed % 1000 % (maxBytes + 1);
    default:
      return maxBytes - mixed % 16;
  }
}

// Record `sequence`: its number followed by a pattern derived from it.
std::vector<std::byte> recordFor(std::uint32_t sequence, std::size_t maxBytes) {
  std::vector<std::byte> record =
      pattern(std::max(lengthOf(sequence, maxBytes), sizeof(sequence)), sequence);
  std::memcpy(record.data(), &sequence, sizeof(sequence));
  return record;
}

TEST(SpscRing, RoundTripsRecordsOfEveryLength) {
  SharedRing ring(4096);
  RingWriter writer(ring.region(), ring.capacity);
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
  EXPECT_FALSE(reader.pending());
  for (std::size_t bytes = 0; bytes <= writer.maxRecordBytes(); bytes += 1 + bytes / 3) {
    const std::vector<std::byte> record = pattern(bytes, static_cast<std::uint32_t>(bytes));
    ASSERT_EQ(writer.tryWrite(record), RingStatus::kOk) << bytes;
    EXPECT_TRUE(reader.pending());
    ASSERT_EQ(reader.read(out), RingStatus::kOk) << bytes;
    EXPECT_EQ(out, record);
  }
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
}

TEST(SpscRing, WrapsAroundWithPaddingRecords) {
  SharedRing ring(256);
  RingWriter writer(ring.region(), ring.capacity);
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  std::uint64_t wraps = 0;
  for (std::uint32_t i = 0; i < 2000; ++i) {
    // Sizes that do not divide the capacity, so records regularly meet the end of the data area.
    // (Both together, plus padding, always fit the empty ring.)
    const std::vector<std::byte> a = pattern(8 + i % 33, i);
    const std::vector<std::byte> b = pattern(i % 49, ~i);
    const std::uint64_t before = ring.header().producerIndex;
    ASSERT_EQ(writer.tryWrite(a), RingStatus::kOk);
    ASSERT_EQ(writer.tryWrite(b), RingStatus::kOk);
    wraps += ring.header().producerIndex / 256 - before / 256;
    ASSERT_EQ(reader.read(out), RingStatus::kOk);
    ASSERT_EQ(out, a);
    ASSERT_EQ(reader.read(out), RingStatus::kOk);
    ASSERT_EQ(out, b);
  }
  EXPECT_GT(wraps, 100u);
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
}

TEST(SpscRing, FullRingRefusesWithoutOverwriting) {
  SharedRing ring(512);
  RingWriter writer(ring.region(), ring.capacity);
  RingReader reader(ring.region(), ring.capacity);
  std::uint32_t written = 0;
  // 56-byte payloads take 64 bytes each: eight fill the ring exactly.
  while (writer.tryWrite(pattern(56, written)) == RingStatus::kOk) ++written;
  EXPECT_EQ(written, 8u);
  EXPECT_EQ(writer.tryWrite(pattern(56, 999)), RingStatus::kFull);
  EXPECT_EQ(writer.tryWrite(pattern(0, 999)), RingStatus::kFull);

  std::vector<std::byte> out;
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  EXPECT_EQ(out, pattern(56, 0));
  // One record's space is free again: exactly one more fits.
  EXPECT_EQ(writer.tryWrite(pattern(56, written)), RingStatus::kOk);
  EXPECT_EQ(writer.tryWrite(pattern(0, 999)), RingStatus::kFull);
  for (std::uint32_t i = 1; i <= written; ++i) {
    ASSERT_EQ(reader.read(out), RingStatus::kOk);
    EXPECT_EQ(out, pattern(56, i)) << i;
  }
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
}

TEST(SpscRing, LargestRecordFitsAnEmptyRingAtEveryPosition) {
  SharedRing ring(256);
  RingWriter writer(ring.region(), ring.capacity);
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  EXPECT_EQ(writer.tryWrite(pattern(writer.maxRecordBytes() + 1, 1)), RingStatus::kTooLarge);
  for (int position = 0; position < 64; ++position) {
    const std::vector<std::byte> big = pattern(writer.maxRecordBytes(), position);
    ASSERT_EQ(writer.tryWrite(big), RingStatus::kOk) << position;
    ASSERT_EQ(reader.read(out), RingStatus::kOk);
    ASSERT_EQ(out, big);
    ASSERT_EQ(writer.tryWrite(pattern(position % 3 * 8, 0)), RingStatus::kOk);  // move along
    ASSERT_EQ(reader.read(out), RingStatus::kOk);
  }
}

TEST(SpscRing, ReserveAndCommitInPlace) {
  SharedRing ring(256);
  RingWriter writer(ring.region(), ring.capacity);
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  RingWriter::Reservation reservation = writer.reserve(100);
  ASSERT_EQ(reservation.status, RingStatus::kOk);
  ASSERT_EQ(reservation.bytes.size(), 100u);
  std::memcpy(reservation.bytes.data(), "in place", 8);
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);  // invisible until committed
  writer.commit(8);
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.data()), out.size()), "in place");
  EXPECT_THROW(writer.commit(1), std::logic_error);
  EXPECT_EQ(writer.reserve(writer.maxRecordBytes() + 1).status, RingStatus::kTooLarge);
}

TEST(SpscRing, AttachChecksTheHeader) {
  SharedRing ring(1024);
  EXPECT_THROW(RingReader(ring.region(), 2048), std::invalid_argument);  // capacity differs
  EXPECT_THROW(RingReader(ring.region().first(600), 1024), std::invalid_argument);  // too small
  EXPECT_THROW(initializeRing(ring.region(), 1000), std::invalid_argument);  // not a power of 2
  ring.header().version = kRingVersion + 1;
  EXPECT_THROW(RingWriter(ring.region(), 1024), std::invalid_argument);
  ring.header().version = kRingVersion;
  ring.header().magic = 0;
  EXPECT_THROW(RingReader(ring.region(), 1024), std::invalid_argument);
}

// ---- A hostile producer: everything the reader sees is checked ----

class HostileProducer : public ::testing::Test {
protected:
  SharedRing ring{256};
  RingReader reader{ring.region(), ring.capacity};
  std::vector<std::byte> out;

  void expectCorrupt() {
    EXPECT_EQ(reader.read(out), RingStatus::kCorrupt);
    EXPECT_EQ(reader.read(out), RingStatus::kCorrupt) << "corruption must be sticky";
    EXPECT_TRUE(reader.pending());
  }
};

TEST_F(HostileProducer, IndexMoreThanACapacityAhead) {
  ring.publish(264);
  expectCorrupt();
}

TEST_F(HostileProducer, IndexWayBeyondCapacity) {
  ring.publish(~std::uint64_t{0} - 7);
  expectCorrupt();
}

TEST_F(HostileProducer, MisalignedIndex) {
  ring.putHeader(0, 0, kRecordData);
  ring.publish(12);
  expectCorrupt();
}

TEST_F(HostileProducer, IndexGoesBackwards) {
  ring.putHeader(0, 0, kRecordData);
  ring.putHeader(8, 0, kRecordData);
  ring.publish(16);
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  ring.publish(8);
  expectCorrupt();
}

TEST_F(HostileProducer, LengthBeyondWhatWasPublished) {
  ring.putHeader(0, 64, kRecordData);
  ring.publish(32);
  expectCorrupt();
}

TEST_F(HostileProducer, LengthBeyondTheMaximum) {
  ring.putHeader(0, 0xfffffff0u, kRecordData);
  ring.publish(256);
  expectCorrupt();
}

TEST_F(HostileProducer, RecordCrossingTheEndOfTheDataArea) {
  for (std::size_t offset = 0; offset < 240; offset += 80) {
    ring.putHeader(offset, 72, kRecordData);
  }
  ring.publish(240);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(reader.read(out), RingStatus::kOk);
  // 80 bytes at offset 240 would run 64 bytes past the end (its length is under the maximum).
  ring.putHeader(240, 72, kRecordData);
  ring.publish(320);
  expectCorrupt();
}

TEST_F(HostileProducer, UnknownKind) {
  ring.putHeader(0, 8, 0x1234);
  ring.publish(16);
  expectCorrupt();
}

TEST_F(HostileProducer, PaddingThatDoesNotReachTheEnd) {
  ring.putHeader(0, 56, kRecordData);
  ring.publish(64);
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  ring.putHeader(64, 16, kRecordPadding);  // claims 24 bytes; 192 remain to the end
  ring.publish(64 + 24);
  expectCorrupt();
}

TEST_F(HostileProducer, PaddingAtOffsetZero) {
  ring.putHeader(0, 248, kRecordPadding);
  ring.publish(256);
  expectCorrupt();
}

TEST_F(HostileProducer, PaddingBeyondWhatWasPublished) {
  ring.putHeader(0, 56, kRecordData);
  ring.publish(64);
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  ring.putHeader(64, 184, kRecordPadding);  // right length, but only 8 bytes published
  ring.publish(72);
  expectCorrupt();
}

TEST_F(HostileProducer, ValidPaddingIsSkipped) {
  ring.putHeader(0, 56, kRecordData);
  ring.publish(64);
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  ring.putHeader(64, 184, kRecordPadding);
  ring.putHeader(0, 3, kRecordData);
  std::memcpy(ring.data() + 8, "abc", 3);
  ring.publish(256 + 16);
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
}

// ---- A hostile consumer (the daemon produces completions into a client-read ring) ----

TEST(SpscRing, WriterRejectsConsumerIndexAheadOfProducer) {
  SharedRing ring(256);
  RingWriter writer(ring.region(), ring.capacity);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(writer.tryWrite(pattern(56, i)), RingStatus::kOk);
  ring.header().consumerIndex = 1024;  // "consumed" what was never written
  EXPECT_EQ(writer.tryWrite(pattern(56, 9)), RingStatus::kCorrupt);
  EXPECT_EQ(writer.tryWrite(pattern(0, 9)), RingStatus::kCorrupt);
}

TEST(SpscRing, WriterRejectsConsumerIndexGoingBackwards) {
  SharedRing ring(256);
  RingWriter writer(ring.region(), ring.capacity);
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(writer.tryWrite(pattern(56, i)), RingStatus::kOk);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(reader.read(out), RingStatus::kOk);
  ASSERT_EQ(writer.tryWrite(pattern(56, 5)), RingStatus::kOk);  // sees head = 128
  ring.header().consumerIndex = 0;
  // The writer only looks at the consumer's index when its cached one says the ring is full.
  ASSERT_EQ(writer.tryWrite(pattern(56, 6)), RingStatus::kOk);
  EXPECT_EQ(writer.tryWrite(pattern(56, 7)), RingStatus::kCorrupt);
  EXPECT_EQ(writer.tryWrite(pattern(0, 7)), RingStatus::kCorrupt);
}

// ---- Across processes ----

TEST(SpscRing, ManyVariableLengthRecordsAcrossProcesses) {
  constexpr std::uint32_t kRecords = 100000;
  SharedRing ring(4096);
  ForkedChild producer([&] {
    RingWriter writer(ring.region(), ring.capacity);
    for (std::uint32_t i = 0; i < kRecords; ++i) {
      const std::vector<std::byte> record = recordFor(i, writer.maxRecordBytes());
      for (;;) {
        const RingStatus status = writer.tryWrite(record);
        if (status == RingStatus::kOk) break;
        if (status != RingStatus::kFull) return 1;
        ::sched_yield();  // two processes may share one core
      }
    }
    return 0;
  });
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  for (std::uint32_t i = 0; i < kRecords;) {
    const RingStatus status = reader.read(out);
    if (status == RingStatus::kEmpty) {
      ::sched_yield();
      continue;
    }
    ASSERT_EQ(status, RingStatus::kOk) << "record " << i;
    ASSERT_EQ(out, recordFor(i, ringMaxRecordBytes(4096))) << "record " << i;
    ++i;
  }
  EXPECT_EQ(producer.wait(), 0);
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
  EXPECT_GT(ring.header().producerIndex / 4096, 500u);  // wrapped many times
}

TEST(SpscRing, ProducerKilledMidStreamLeavesOnlyWholeRecords) {
  SharedRing ring(1 << 16);
  ForkedChild producer([&] {
    RingWriter writer(ring.region(), ring.capacity);
    for (std::uint32_t i = 0;; ++i) {
      // Filled in place, byte by byte, so that the kill lands inside a record's payload most of
      // the time.
      RingWriter::Reservation reservation = writer.reserve(lengthOf(i, 4000) + 4);
      if (reservation.status == RingStatus::kFull) {
        ::sched_yield();
        --i;
        continue;
      }
      if (reservation.status != RingStatus::kOk) return 1;
      const std::vector<std::byte> record = recordFor(i, 4000);
      for (std::size_t b = 0; b < record.size() && b < reservation.bytes.size(); ++b) {
        reinterpret_cast<volatile std::byte*>(reservation.bytes.data())[b] = record[b];
      }
      writer.commit(std::min(record.size(), reservation.bytes.size()));
    }
  });
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  std::uint32_t next = 0;
  auto check = [&] {
    const std::vector<std::byte> expected = recordFor(next, 4000);
    ASSERT_EQ(out.size(), std::min(expected.size(), lengthOf(next, 4000) + 4));
    ASSERT_TRUE(std::equal(out.begin(), out.end(), expected.begin())) << "record " << next;
    ++next;
  };
  while (next < 20000) {
    const RingStatus status = reader.read(out);
    ASSERT_NE(status, RingStatus::kCorrupt);
    if (status == RingStatus::kOk) check();
  }
  producer.kill(SIGKILL);
  EXPECT_EQ(producer.wait(), -SIGKILL);
  // Whatever was published before the kill is intact; then the ring is simply empty.
  for (;;) {
    const RingStatus status = reader.read(out);
    ASSERT_NE(status, RingStatus::kCorrupt);
    if (status == RingStatus::kEmpty) break;
    check();
  }
  EXPECT_FALSE(reader.pending());
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
}

TEST(SpscRing, ReservedButUncommittedRecordIsNeverSeen) {
  SharedRing ring(256);
  ForkedChild producer([&] {
    RingWriter writer(ring.region(), ring.capacity);
    if (writer.tryWrite(pattern(16, 1)) != RingStatus::kOk) return 1;
    RingWriter::Reservation reservation = writer.reserve(64);
    std::memset(reservation.bytes.data(), 0xff, 32);  // half written, then the process dies
    ::raise(SIGKILL);
    return 2;
  });
  EXPECT_EQ(producer.wait(), -SIGKILL);
  RingReader reader(ring.region(), ring.capacity);
  std::vector<std::byte> out;
  ASSERT_EQ(reader.read(out), RingStatus::kOk);
  EXPECT_EQ(out, pattern(16, 1));
  EXPECT_EQ(reader.read(out), RingStatus::kEmpty);
}

}  // namespace
}  // namespace gpuproxy::ipc
