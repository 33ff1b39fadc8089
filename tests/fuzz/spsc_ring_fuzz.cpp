// Fuzz target: the SPSC ring's reader (and writer) against a peer that rewrites shared memory.
// The input is a script of operations on one ring: legitimate writes and reads interleaved with
// hostile stores to the producer index, the consumer index and the data area. Checked: no access
// outside the ring (ASan; the region is an exact-size heap block), corruption is sticky, records
// never exceed the maximum, and while nobody tampers, the reader returns exactly what was written.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <span>
#include <vector>

#include "ipc/spsc_ring.hpp"

namespace ipc = gpuproxy::ipc;

namespace {

class Script {
public:
  Script(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return offset_ >= size_; }
  std::uint8_t byte() { return offset_ < size_ ? data_[offset_++] : 0; }
  std::uint64_t u64() {
    std::uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value |= std::uint64_t{byte()} << (8 * i);
    return value;
  }

private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t offset_ = 0;
};

void check(bool condition) {
  if (!condition) std::abort();
}

std::vector<std::byte> payload(std::size_t bytes, std::uint32_t seed) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = std::byte(static_cast<unsigned char>(seed + i));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Script script(data, size);
  const std::size_t capacity = ipc::kRingMinCapacity << (script.byte() % 4);  // 64 .. 512
  const std::size_t regionBytes = ipc::ringRegionBytes(capacity);
  auto* memory = static_cast<std::byte*>(std::aligned_alloc(64, regionBytes));
  const std::span<std::byte> region(memory, regionBytes);
  ipc::initializeRing(region, capacity);
  auto* header = reinterpret_cast<ipc::RingHeader*>(memory);
  std::byte* ring = memory + sizeof(ipc::RingHeader);

  {
    ipc::RingWriter writer(region, capacity);
    ipc::RingReader reader(region, capacity);
    std::deque<std::vector<std::byte>> expected;
    std::vector<std::byte> out;
    bool tampered = false;
    bool readerCorrupt = false;
    std::uint32_t sequence = 0;

    while (!script.done()) {
      switch (script.byte() % 6) {
        case 0: {  // the legitimate producer
          const std::size_t bytes = script.byte() % (writer.maxRecordBytes() + 2);
          std::vector<std::byte> record = payload(bytes, sequence++);
          const ipc::RingStatus status = writer.tryWrite(record);
          if (bytes > writer.maxRecordBytes()) {
            check(status == ipc::RingStatus::kTooLarge || status == ipc::RingStatus::kCorrupt);
          }
          if (!tampered) check(status != ipc::RingStatus::kCorrupt);
          if (status == ipc::RingStatus::kOk) expected.push_back(std::move(record));
          break;
        }
        case 1: {  // the consumer under test
          const ipc::RingStatus status = reader.read(out);
          if (readerCorrupt) check(status == ipc::RingStatus::kCorrupt);
          readerCorrupt = status == ipc::RingStatus::kCorrupt;
          if (status == ipc::RingStatus::kOk)
            check(out.size() <= ipc::ringMaxRecordBytes(capacity));
          if (!tampered) {
            check(status == (expected.empty() ? ipc::RingStatus::kEmpty : ipc::RingStatus::kOk));
            if (status == ipc::RingStatus::kOk) {
              check(out == expected.front());
              expected.pop_front();
            }
          }
          break;
        }
        case 2:  // hostile producer index
          header->producerIndex = script.u64();
          tampered = true;
          break;
        case 3: {  // hostile bytes in the data area
          const std::size_t offset = (std::size_t{script.byte()} << 8 | script.byte()) % capacity;
          const std::size_t count = script.byte() % (capacity - offset + 1);
          for (std::size_t i = 0; i < count; ++i) ring[offset + i] = std::byte(script.byte());
          tampered = true;
          break;
        }
        case 4:  // hostile consumer index (the writer's side of the same problem)
          header->consumerIndex = script.u64();
          tampered = true;
          break;
        case 5:
          if (!tampered)
            check(reader.pending() == !expected.empty());
          else
            (void)reader.pending();
          break;
      }
    }
  }
  std::free(memory);
  return 0;
}
