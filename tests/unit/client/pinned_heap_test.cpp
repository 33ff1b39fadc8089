// The stub's pinned heap allocator: page-aligned, page-sized allocations inside the region that
// never overlap, lookups of host ranges inside one allocation, and space that comes back.
#include "client/stub/pinned_heap.hpp"

#include <sys/mman.h>

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace gpuproxy::stub {
namespace {

class PinnedHeapTest : public ::testing::Test {
protected:
  static constexpr std::size_t kRegion = 4 << 20;
  PinnedHeapTest()
      : memory_(static_cast<std::byte*>(::mmap(nullptr, kRegion, PROT_READ | PROT_WRITE,
                                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {}
  ~PinnedHeapTest() override { ::munmap(memory_, kRegion); }
  std::byte* memory_;
};

TEST_F(PinnedHeapTest, AllocationsArePagesInsideTheRegionAndNeverOverlap) {
  PinnedHeap heap({memory_, kRegion});
  ASSERT_TRUE(heap.usable());
  std::vector<PinnedHeap::Allocation> taken;
  for (std::uint64_t bytes : {1ull, 4096ull, 4097ull, 100000ull, 4ull << 20}) {
    auto allocation = heap.allocate(bytes);
    if (bytes == (4ull << 20)) {
      EXPECT_FALSE(allocation) << "the whole region cannot fit next to the others";
      continue;
    }
    ASSERT_TRUE(allocation) << bytes;
    EXPECT_EQ(allocation->offset % PinnedHeap::kPage, 0u);
    EXPECT_EQ(allocation->bytes, (bytes + 4095) / 4096 * 4096);
    EXPECT_LE(allocation->offset + allocation->bytes, kRegion);
    for (const auto& other : taken) {
      EXPECT_TRUE(allocation->offset + allocation->bytes <= other.offset ||
                  other.offset + other.bytes <= allocation->offset);
    }
    taken.push_back(*allocation);
  }
  EXPECT_EQ(heap.bytesInUse(), 4096u + 4096u + 8192u + 102400u);
}

TEST_F(PinnedHeapTest, FindsTheAllocationHoldingARange) {
  PinnedHeap heap({memory_, kRegion});
  auto allocation = heap.allocate(3 * 4096);
  ASSERT_TRUE(allocation);
  std::byte* start = memory_ + allocation->offset;
  EXPECT_EQ(heap.offsetInAllocation(start, 3 * 4096), allocation->offset);
  EXPECT_EQ(heap.offsetInAllocation(start + 100, 3 * 4096 - 100), allocation->offset + 100);
  EXPECT_FALSE(heap.offsetInAllocation(start + 100, 3 * 4096));  // runs past its end
  EXPECT_FALSE(heap.offsetInAllocation(start - 1, 1));
  EXPECT_FALSE(heap.offsetInAllocation(memory_ + kRegion, 1));
  int local = 0;
  EXPECT_FALSE(heap.offsetInAllocation(&local, sizeof(local)));
  ASSERT_TRUE(heap.lookup(start));
  EXPECT_FALSE(heap.lookup(start + 4096));  // inside, but not a start
}

TEST_F(PinnedHeapTest, FreedSpaceIsReused) {
  PinnedHeap heap({memory_, kRegion});
  std::set<std::uint64_t> offsets;
  for (int round = 0; round < 50; ++round) {
    auto allocation = heap.allocate(1 << 20);
    ASSERT_TRUE(allocation) << "round " << round;
    offsets.insert(allocation->offset);
    EXPECT_TRUE(heap.free(allocation->offset));
    EXPECT_FALSE(heap.free(allocation->offset));
  }
  EXPECT_EQ(heap.bytesInUse(), 0u);
  EXPECT_LE(offsets.size(), 2u);
}

TEST_F(PinnedHeapTest, AnEmptyRegionAllocatesNothing) {
  PinnedHeap heap({});
  EXPECT_FALSE(heap.usable());
  EXPECT_FALSE(heap.allocate(4096));
  EXPECT_FALSE(heap.offsetInAllocation(memory_, 1));
}

}  // namespace
}  // namespace gpuproxy::stub
