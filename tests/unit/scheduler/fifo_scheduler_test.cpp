// The fifo baseline does what time-slicing and MPS do: arrival order, whatever the weights, which
// is exactly why it is unfair when kernel lengths differ.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/unit/scheduler/tick_harness.hpp"

namespace gpuproxy::scheduler::sim {
namespace {

TEST(FifoScheduler, SubmitsInArrivalOrderAcrossTenantsAndClasses) {
  auto scheduler = newFifoScheduler({});
  EXPECT_EQ(scheduler->name(), "fifo");
  scheduler->setTenant(1, TenantSpec{1, TenantClass::kBestEffort});
  scheduler->setTenant(2, TenantSpec{8, TenantClass::kBestEffort});
  scheduler->setTenant(9, TenantSpec{1, TenantClass::kLatencyCritical});
  for (ItemId id = 1; id <= 6; ++id) {
    scheduler->complete(0, 0, 0);  // unknown ids are ignored
    const TenantId tenant = id % 3 == 0 ? 9 : static_cast<TenantId>(id % 3);
    scheduler->enqueue(WorkItem{id, tenant, tenant * 10ull, 0, {WorkKind::kKernel, id, 0}}, 0);
  }
  // Unmeasured items count as 2 ms against a 2 ms budget: one at a time, in arrival order.
  for (ItemId id = 1; id <= 6; ++id) {
    auto submission = scheduler->next(0);
    ASSERT_TRUE(submission);
    EXPECT_EQ(submission->id, id);
    EXPECT_FALSE(scheduler->next(0));  // head-of-line: nothing passes it
    scheduler->complete(id, 10 * kUs, 10 * kUs);
  }
  EXPECT_FALSE(scheduler->next(0));
}

TEST(FifoScheduler, RemovingAClientDropsOnlyItsQueuedItems) {
  auto scheduler = newFifoScheduler({});
  scheduler->setTenant(1, TenantSpec{1, TenantClass::kBestEffort});
  for (ItemId id = 1; id <= 4; ++id) {
    scheduler->enqueue(WorkItem{id, 1, id % 2 == 0 ? 20ull : 10ull, 0, {}}, 0);
  }
  auto first = scheduler->next(0);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->id, 1u);
  EXPECT_EQ(scheduler->removeClient(10), (std::vector<ItemId>{3}));
  scheduler->complete(1, 10 * kUs, 10 * kUs);
  for (ItemId id : {2, 4}) {
    auto submission = scheduler->next(10 * kUs);
    ASSERT_TRUE(submission);
    EXPECT_EQ(submission->id, id);
    scheduler->complete(id, 10 * kUs, 10 * kUs);
  }
  EXPECT_FALSE(scheduler->next(10 * kUs));
}

TEST(FifoScheduler, IsVisiblyUnfairUnderWeightsOneOneTwo) {
  const std::vector<double> weights{1, 1, 2};
  ShareReport reports[2];
  int i = 0;
  for (auto factory : {&newFifoScheduler, &newFairScheduler}) {
    auto scheduler = factory({});
    TickHarness harness(*scheduler);
    for (TenantId id = 1; id <= 3; ++id) {
      scheduler->setTenant(
          id, TenantSpec{static_cast<std::uint32_t>(weights[id - 1]), TenantClass::kBestEffort});
    }
    harness.addSaturating(1, 10, 0, {100 * kUs});
    harness.addSaturating(2, 20, 0, {1 * kMs});
    harness.addSaturating(3, 30, 0, {5 * kMs});
    harness.runUntil(10 * kSec);
    EXPECT_EQ(harness.streamOrderViolations(), 0u);
    reports[i] = shareReport(harness, {1, 2, 3}, weights);
    std::printf("[%s 1:1:2] shares %.4f %.4f %.4f  jain %.4f  worst error %.1f%%\n",
                std::string(scheduler->name()).c_str(), reports[i].shares[0], reports[i].shares[1],
                reports[i].shares[2], reports[i].jain, 100 * reports[i].worstError);
    ++i;
  }
  // fifo hands out launches in turn, so GPU time follows kernel length, not weight: the 5 ms
  // tenant takes most of the device and the 0.1 ms tenant almost none.
  EXPECT_LT(reports[0].jain, 0.8);
  EXPECT_GT(reports[0].shares[2], 0.7);
  EXPECT_LT(reports[0].shares[0], 0.05);
  EXPECT_GE(reports[1].jain, 0.99);
}

}  // namespace
}  // namespace gpuproxy::scheduler::sim
