// Duration estimates: pessimistic until measured, per (tenant, function, shape), converging on
// what kernels really take.
#include "scheduler/duration_estimator.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/unit/scheduler/tick_harness.hpp"

namespace gpuproxy::scheduler::sim {
namespace {

TEST(DurationEstimator, UnmeasuredKeysGetThePessimisticDefault) {
  DurationEstimator estimator(2 * kMs, 0.25);
  const DurationKey key{WorkKind::kKernel, 1, launchShape({64, 1, 1}, {256, 1, 1}, 0)};
  EXPECT_EQ(estimator.estimate(1, key).value, 2 * kMs);
  EXPECT_FALSE(estimator.estimate(1, key).measured);
  estimator.record(1, key, 30 * kUs);
  EXPECT_EQ(estimator.estimate(1, key).value, 30 * kUs);  // first sample replaces the default
  EXPECT_TRUE(estimator.estimate(1, key).measured);
  // Another tenant, another shape or another function is another estimate.
  EXPECT_FALSE(estimator.estimate(2, key).measured);
  EXPECT_FALSE(
      estimator.estimate(1, {WorkKind::kKernel, 1, launchShape({128, 1, 1}, {256, 1, 1}, 0)})
          .measured);
  EXPECT_FALSE(estimator.estimate(1, {WorkKind::kKernel, 2, key.shape}).measured);
  estimator.forgetTenant(1);
  EXPECT_FALSE(estimator.estimate(1, key).measured);
}

TEST(DurationEstimator, ConvergesOnTheTrueDurationAndFollowsAChange) {
  DurationEstimator estimator(2 * kMs, 0.25);
  const DurationKey key{WorkKind::kKernel, 1, 0};
  std::uint64_t lcg = 7;
  auto noisy = [&](Nanos mean) {  // +-10%, deterministic
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return mean + static_cast<Nanos>((static_cast<double>(lcg >> 11) / (1ull << 53) - 0.5) * 0.2 *
                                     static_cast<double>(mean));
  };
  for (int i = 0; i < 50; ++i) estimator.record(1, key, noisy(1 * kMs));
  EXPECT_LT(std::llabs(estimator.estimate(1, key).value - 1 * kMs), 1 * kMs / 20);
  // The kernel got slower (bigger batch under the same shape): within 20 samples it follows.
  for (int i = 0; i < 20; ++i) estimator.record(1, key, noisy(3 * kMs));
  EXPECT_LT(std::llabs(estimator.estimate(1, key).value - 3 * kMs), 3 * kMs / 20);
}

TEST(DurationEstimator, TheSchedulerLearnsFromCompletions) {
  auto scheduler = newFairScheduler({});
  TickHarness harness(*scheduler);
  scheduler->setTenant(1, TenantSpec{});
  harness.addSaturating(1, 10, 0, {100 * kUs, 5 * kMs});
  harness.runUntil(1 * kSec);
  // The harness gives source 0's lengths functions 1 and 2.
  const auto shortEstimate = scheduler->estimator().estimate(1, {WorkKind::kKernel, 1, 0});
  const auto longEstimate = scheduler->estimator().estimate(1, {WorkKind::kKernel, 2, 0});
  ASSERT_TRUE(shortEstimate.measured);
  ASSERT_TRUE(longEstimate.measured);
  EXPECT_NEAR(static_cast<double>(shortEstimate.value), 100e3, 10e3);
  EXPECT_NEAR(static_cast<double>(longEstimate.value), 5e6, 0.5e6);
  EXPECT_EQ(scheduler->charged(1), harness.busy(1));  // charged exactly the measured time
}

}  // namespace
}  // namespace gpuproxy::scheduler::sim
