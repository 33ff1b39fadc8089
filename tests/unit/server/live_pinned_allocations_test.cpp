// The table a client's command records are checked against: a host range of the pinned heap is
// usable only inside one live allocation, and the table stays whole while another thread reads it.
#include "server/gpu/live_pinned_allocations.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>

namespace gpuproxy::server {
namespace {

constexpr std::uint64_t kPage = 4096;

TEST(LivePinnedAllocations, HoldsARangeOnlyInsideOneLiveAllocation) {
  LivePinnedAllocations live;
  live.add(0, 2 * kPage);
  live.add(2 * kPage, kPage);  // adjacent, another owner's perhaps

  EXPECT_TRUE(live.holds(0, 2 * kPage));
  EXPECT_TRUE(live.holds(kPage + 100, kPage - 100));
  EXPECT_TRUE(live.holds(2 * kPage, kPage));
  EXPECT_FALSE(live.holds(kPage, 2 * kPage)) << "two adjacent allocations are not one";
  EXPECT_FALSE(live.holds(kPage + 1, kPage));  // one byte past the first allocation
  EXPECT_FALSE(live.holds(3 * kPage, 1));      // past every allocation
  EXPECT_FALSE(live.holds(2 * kPage + 8, UINT64_MAX)) << "a length that wraps is refused";

  EXPECT_EQ(live.remove(0), 2 * kPage);
  EXPECT_FALSE(live.holds(0, 1)) << "an ended allocation holds nothing";
  EXPECT_FALSE(live.remove(0)) << "nothing starts there any more";
  EXPECT_FALSE(live.remove(2 * kPage + kPage / 2)) << "only an allocation's start ends it";
  EXPECT_TRUE(live.holds(2 * kPage, kPage));
}

TEST(LivePinnedAllocations, OverlapsAnyPartOfALiveAllocation) {
  LivePinnedAllocations live;
  live.add(4 * kPage, 2 * kPage);
  EXPECT_TRUE(live.overlaps(3 * kPage, kPage + 1));
  EXPECT_TRUE(live.overlaps(5 * kPage, 4 * kPage));
  EXPECT_TRUE(live.overlaps(0, 10 * kPage));
  EXPECT_FALSE(live.overlaps(3 * kPage, kPage));
  EXPECT_FALSE(live.overlaps(6 * kPage, kPage));
}

TEST(LivePinnedAllocations, RemoveAllEndsEveryAllocationAndSaysWhichWereLive) {
  LivePinnedAllocations live;
  live.add(0, kPage);
  live.add(8 * kPage, 3 * kPage);
  const LivePinnedAllocations::Ranges ended = live.removeAll();
  EXPECT_EQ(ended, (LivePinnedAllocations::Ranges{{0, kPage}, {8 * kPage, 3 * kPage}}));
  EXPECT_FALSE(live.holds(0, 1));
  EXPECT_FALSE(live.holds(8 * kPage, 1));
  EXPECT_TRUE(live.removeAll().empty());
}

// A GPU's thread checks records while the session registers and unregisters other allocations:
// an allocation live throughout is found live at every check, one never made is never found.
TEST(LivePinnedAllocations, ReadersOnAnotherThreadSeeAWholeTable) {
  LivePinnedAllocations live;
  live.add(0, kPage);
  std::atomic<bool> done = false;
  std::atomic<std::uint64_t> checks = 0;
  bool alwaysHeld = true;
  bool neverInvented = true;
  std::thread reader([&] {
    while (!done.load()) {
      alwaysHeld = alwaysHeld && live.holds(0, kPage);
      neverInvented = neverInvented && !live.holds(kPage, 2);
      ++checks;
    }
  });
  // As many changes as it takes for the reader to have checked often meanwhile.
  for (std::uint64_t round = 0; round < 20000 || checks.load() < 10000; ++round) {
    const std::uint64_t offset = (2 + round % 64) * kPage;
    live.add(offset, kPage);
    ASSERT_EQ(live.remove(offset), kPage);
  }
  done = true;
  reader.join();
  EXPECT_TRUE(alwaysHeld);
  EXPECT_TRUE(neverInvented);
}

}  // namespace
}  // namespace gpuproxy::server
