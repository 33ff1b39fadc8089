// Pageable copies pass through the staging area in chunks; a range handed out twice would let one
// copy's bytes overwrite another's before the daemon read them, and a range never handed back
// would stall every later copy.

#include "client/stub/staging_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

using gpuproxy::stub::StagingAllocator;

TEST(StagingAllocator, HandsOutConsecutiveRangesUntilFull) {
  StagingAllocator staging(4096);
  auto a = staging.allocate(1024);
  auto b = staging.allocate(1024);
  auto c = staging.allocate(2048);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(b->offset, 1024u);
  EXPECT_EQ(c->offset, 2048u);
  EXPECT_FALSE(staging.allocate(1));
  EXPECT_EQ(staging.used(), 4096u);
}

TEST(StagingAllocator, SpaceComesBackAtTheHeadOnly) {
  StagingAllocator staging(4096);
  auto a = staging.allocate(2048);
  auto b = staging.allocate(2048);
  ASSERT_TRUE(a && b);
  // The newer range comes back first: the oldest still holds the head.
  EXPECT_TRUE(staging.release(*b));
  EXPECT_TRUE(staging.released(b->ticket));
  EXPECT_FALSE(staging.released(a->ticket));
  EXPECT_FALSE(staging.allocate(64));
  EXPECT_TRUE(staging.release(*a));
  EXPECT_TRUE(staging.released(a->ticket));
  EXPECT_EQ(staging.used(), 0u);
  // Idle again: a range as large as the area fits.
  auto whole = staging.allocate(4096);
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->offset, 0u);
}

TEST(StagingAllocator, ARangeThatWouldWrapStartsOverAtZero) {
  StagingAllocator staging(4096);
  auto a = staging.allocate(3072);
  ASSERT_TRUE(a);
  auto b = staging.allocate(512);  // 3072..3584
  ASSERT_TRUE(b);
  EXPECT_TRUE(staging.release(*a));
  // 512 left before the end; 1024 does not fit there, so it goes to 0 and skips the tail.
  auto c = staging.allocate(1024);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->offset, 0u);
  EXPECT_EQ(staging.used(), 512u + 512u + 1024u);
  EXPECT_TRUE(staging.release(*b));
  EXPECT_TRUE(staging.release(*c));
  EXPECT_EQ(staging.used(), 0u);
}

TEST(StagingAllocator, RefusesWhatCanNeverFitAndUnknownReleases) {
  StagingAllocator staging(4096);
  EXPECT_FALSE(staging.allocate(0));
  EXPECT_FALSE(staging.allocate(4097));
  EXPECT_FALSE(staging.release(0, 64));
  auto a = staging.allocate(100);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->bytes, 100u);
  EXPECT_FALSE(staging.release(a->offset, 64));  // not the size it was given
  EXPECT_TRUE(staging.release(a->offset, 100));
  EXPECT_FALSE(staging.release(a->offset, 100));  // twice
}

TEST(StagingAllocator, EmptyAreaGivesNothing) {
  StagingAllocator staging(0);
  EXPECT_FALSE(staging.allocate(1));
  EXPECT_EQ(staging.largest(), 0u);
}

// Many interleaved users with out-of-order releases: live ranges never overlap, never leave the
// area, and everything comes back.
TEST(StagingAllocator, RandomTrafficNeverOverlapsAndDrainsCompletely) {
  constexpr std::uint64_t kCapacity = 1 << 16;
  StagingAllocator staging(kCapacity);
  std::mt19937_64 random(7);
  std::vector<StagingAllocator::Range> live;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || random() % 3 != 0) {
      const std::uint64_t bytes = 1 + random() % (kCapacity / 4);
      if (auto range = staging.allocate(bytes)) {
        ASSERT_LE(range->offset + range->bytes, kCapacity);
        for (const auto& other : live) {
          const bool disjoint = range->offset + range->bytes <= other.offset ||
                                other.offset + other.bytes <= range->offset;
          ASSERT_TRUE(disjoint) << "step " << step;
        }
        live.push_back(*range);
      }
    } else {
      const std::size_t pick = random() % live.size();
      ASSERT_TRUE(staging.release(live[pick]));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  for (const auto& range : live) ASSERT_TRUE(staging.release(range));
  EXPECT_EQ(staging.used(), 0u);
  EXPECT_TRUE(staging.allocate(kCapacity));
}

}  // namespace
