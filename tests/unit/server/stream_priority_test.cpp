// Which CUDA priority a client's stream runs at: latency-critical streams at the device's
// greatest priority, best-effort streams below it, and a client's own priority only ever
// ordering streams within its class.
#include "server/dispatch/stream_priority.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::server::dispatch {
namespace {

using backend::StreamPriorityRange;
using backend::TenantClass;

// cuCtxGetStreamPriorityRange on Volta and later: 0 (default, least) to -5 (greatest).
constexpr StreamPriorityRange kSixLevels{0, -5};

TEST(StreamPriority, LatencyCriticalStreamsRunAtTheGreatestPriorityWhateverTheyAskFor) {
  for (int asked : {0, -1, -3, -5, -100, 100}) {
    EXPECT_EQ(devicePriority(kSixLevels, TenantClass::kLatencyCritical, asked), -5) << asked;
  }
}

TEST(StreamPriority, BestEffortStreamsStayBelowLatencyCriticalOnes) {
  EXPECT_EQ(devicePriority(kSixLevels, TenantClass::kBestEffort, 0), 0);
  EXPECT_EQ(devicePriority(kSixLevels, TenantClass::kBestEffort, -2), -2);
  EXPECT_EQ(devicePriority(kSixLevels, TenantClass::kBestEffort, -4), -4);
  // Asking for the top is clamped into the band, never raised to the latency-critical level.
  EXPECT_EQ(devicePriority(kSixLevels, TenantClass::kBestEffort, -5), -4);
  EXPECT_EQ(devicePriority(kSixLevels, TenantClass::kBestEffort, -1000), -4);
  EXPECT_EQ(devicePriority(kSixLevels, TenantClass::kBestEffort, 7), 0);
}

TEST(StreamPriority, BandsSplitTheRangeWithoutOverlap) {
  const StreamPriorityRange critical = priorityBand(kSixLevels, TenantClass::kLatencyCritical);
  const StreamPriorityRange bestEffort = priorityBand(kSixLevels, TenantClass::kBestEffort);
  EXPECT_EQ(critical.greatest, -5);
  EXPECT_EQ(critical.least, -5);
  EXPECT_EQ(bestEffort.greatest, -4);
  EXPECT_EQ(bestEffort.least, 0);
}

TEST(StreamPriority, OneLevelIsSharedByEveryone) {
  constexpr StreamPriorityRange kFlat{0, 0};
  EXPECT_EQ(devicePriority(kFlat, TenantClass::kLatencyCritical, -5), 0);
  EXPECT_EQ(devicePriority(kFlat, TenantClass::kBestEffort, -5), 0);
}

TEST(StreamPriority, TwoLevelsGiveEachClassOne) {
  constexpr StreamPriorityRange kTwo{0, -1};
  EXPECT_EQ(devicePriority(kTwo, TenantClass::kLatencyCritical, 0), -1);
  EXPECT_EQ(devicePriority(kTwo, TenantClass::kBestEffort, -1), 0);
}

TEST(StreamPriority, WhatTheClientSeesIsItsOwnRequestClampedLikeCuda) {
  EXPECT_EQ(clampToRange(kSixLevels, -3), -3);
  EXPECT_EQ(clampToRange(kSixLevels, -9), -5);
  EXPECT_EQ(clampToRange(kSixLevels, 4), 0);
  // A range given the wrong way round is read the right way round.
  EXPECT_EQ(clampToRange({-5, 0}, -9), -5);
}

}  // namespace
}  // namespace gpuproxy::server::dispatch
