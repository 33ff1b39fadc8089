// The fair scheduler on a simulated non-preemptive GPU: weighted shares, no starvation,
// latency-critical priority, no banked credit, stream order, in-flight caps, live changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "tests/unit/scheduler/tick_harness.hpp"

namespace gpuproxy::scheduler::sim {
namespace {

constexpr TenantSpec bestEffort(std::uint32_t weight) {
  return TenantSpec{weight, TenantClass::kBestEffort};
}
constexpr TenantSpec latencyCritical() {
  return TenantSpec{1, TenantClass::kLatencyCritical};
}

void printShares(const char* name, const ShareReport& report) {
  std::printf("[%s] shares:", name);
  for (double share : report.shares) std::printf(" %.4f", share);
  std::printf("  jain %.5f  worst error %.2f%%\n", report.jain, 100 * report.worstError);
}

struct Scenario {
  const char* name;
  std::vector<double> weights;
  std::vector<std::vector<Nanos>> durations;  // per tenant: the kernel lengths it cycles through
};

ShareReport runScenario(Scheduler& scheduler, const Scenario& scenario, Nanos length) {
  TickHarness harness(scheduler);
  std::vector<TenantId> tenants;
  for (std::size_t i = 0; i < scenario.weights.size(); ++i) {
    const TenantId id = static_cast<TenantId>(i + 1);
    tenants.push_back(id);
    scheduler.setTenant(id, bestEffort(static_cast<std::uint32_t>(scenario.weights[i])));
    // Two clients with two streams each, so the tenant share is made of several queues.
    for (ClientId client = 0; client < 2; ++client) {
      for (StreamId stream = 0; stream < 2; ++stream) {
        harness.addSaturating(id, id * 10 + client, stream, scenario.durations[i]);
      }
    }
  }
  harness.runUntil(length);
  EXPECT_EQ(harness.streamOrderViolations(), 0u);
  return shareReport(harness, tenants, scenario.weights);
}

const Scenario kOneToOne{"1:1", {1, 1}, {{100 * kUs}, {5 * kMs}}};
const Scenario kOneToThree{"1:3", {1, 3}, {{5 * kMs, 1 * kMs}, {100 * kUs}}};
const Scenario kOneOneTwo{"1:1:2", {1, 1, 2}, {{100 * kUs}, {1 * kMs}, {5 * kMs}}};
const Scenario kMixedEach{
    "1:1:2 mixed", {1, 1, 2}, {{100 * kUs, 5 * kMs}, {1 * kMs, 100 * kUs}, {5 * kMs, 1 * kMs}}};

TEST(FairScheduler, SharesFollowWeightsWithMixedKernelLengths) {
  for (const Scenario& scenario : {kOneToOne, kOneToThree, kOneOneTwo, kMixedEach}) {
    SCOPED_TRACE(scenario.name);
    auto scheduler = newFairScheduler({});
    const ShareReport report = runScenario(*scheduler, scenario, 10 * kSec);
    printShares(scenario.name, report);
    EXPECT_GE(report.jain, 0.99);
    for (double error : report.errors) EXPECT_LT(error, 0.03);
  }
}

TEST(FairScheduler, SharesHoldOverShortWindowsToo) {
  // The SFQ bound is a constant (largest item / weight), so even 100 ms windows stay close.
  auto scheduler = newFairScheduler({});
  TickHarness harness(*scheduler);
  const std::vector<double> weights{1, 1, 2};
  for (TenantId id = 1; id <= 3; ++id) {
    scheduler->setTenant(id, bestEffort(static_cast<std::uint32_t>(weights[id - 1])));
  }
  harness.addSaturating(1, 10, 0, {100 * kUs});
  harness.addSaturating(2, 20, 0, {1 * kMs});
  harness.addSaturating(3, 30, 0, {5 * kMs});
  harness.runUntil(2 * kSec);
  double worst = 0;
  for (Nanos from = 100 * kMs; from + 100 * kMs <= 2 * kSec; from += 100 * kMs) {
    worst = std::max(worst,
                     shareReport(harness, {1, 2, 3}, weights, from, from + 100 * kMs).worstError);
  }
  std::printf("[1:1:2] worst share error over 100 ms windows: %.2f%%\n", 100 * worst);
  EXPECT_LT(worst, 0.15);
}

TEST(FairScheduler, LongKernelsDoNotStarveShortOnesNorTheReverse) {
  auto scheduler = newFairScheduler({});
  TickHarness harness(*scheduler);
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(2, bestEffort(1));
  harness.addSaturating(1, 10, 0, {100 * kUs});
  harness.addSaturating(2, 20, 0, {5 * kMs});
  harness.runUntil(5 * kSec);

  const ShareReport report = shareReport(harness, {1, 2}, {1, 1});
  EXPECT_NEAR(report.shares[0], 0.5, 0.015);
  EXPECT_NEAR(report.shares[1], 0.5, 0.015);

  // The light tenant never waits longer than one heavy item plus the in-flight budget between
  // two of its items (after the first measurements make estimates meaningful).
  Nanos lastStart = -1;
  Nanos worstGap = 0;
  Nanos largest = 0;
  for (const SimRun& run : harness.runs()) {
    if (run.tenant == 2) largest = std::max(largest, run.end - run.start);
    if (run.tenant != 1 || run.start < 100 * kMs) continue;
    if (lastStart >= 0) worstGap = std::max(worstGap, run.start - lastStart);
    lastStart = run.start;
  }
  std::printf("light tenant: worst gap between its items %.3f ms (largest heavy item %.3f ms)\n",
              worstGap / 1e6, largest / 1e6);
  EXPECT_LE(worstGap, largest + SchedulerConfig{}.budgetLcIdle);
}

TEST(FairScheduler, LatencyCriticalWorkIsSubmittedNextAndWaitsOnlyForOneAdmittedItem) {
  auto scheduler = newFairScheduler({});
  TickHarness harness(*scheduler);
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(2, bestEffort(1));
  scheduler->setTenant(3, bestEffort(2));
  scheduler->setTenant(9, latencyCritical());
  harness.addSaturating(1, 10, 0, {100 * kUs});
  harness.addSaturating(2, 20, 0, {1 * kMs});
  harness.addSaturating(3, 30, 0, {5 * kMs});
  harness.addPeriodic(9, 90, 0, 200 * kUs, 5 * kMs, 1 * kMs);
  std::size_t lcSubmitted = 0;
  harness.onSubmit = [&](const Submission& submission, Nanos) {
    if (submission.tenantClass == TenantClass::kLatencyCritical) ++lcSubmitted;
  };
  harness.runUntil(5 * kSec);

  Nanos largestBestEffort = 0;
  std::vector<Nanos> latencies;
  for (const SimRun& run : harness.runs()) {
    if (run.tenantClass == TenantClass::kBestEffort) {
      largestBestEffort = std::max(largestBestEffort, run.end - run.start);
    } else {
      // Submitted the moment it arrived, ahead of every queued best-effort item.
      EXPECT_EQ(run.submitted, run.arrived);
      latencies.push_back(run.end - run.arrived);
    }
  }
  ASSERT_GT(latencies.size(), 900u);
  EXPECT_EQ(lcSubmitted, latencies.size());
  std::sort(latencies.begin(), latencies.end());
  const Nanos p99 = latencies[latencies.size() * 99 / 100];
  const Nanos worst = latencies.back();
  const Nanos isolated = 200 * kUs + 200 * kUs / 10;  // its own duration, jitter included
  std::printf("LC latency p50 %.3f ms p99 %.3f ms max %.3f ms; bound %.3f ms\n",
              latencies[latencies.size() / 2] / 1e6, p99 / 1e6, worst / 1e6,
              (isolated + largestBestEffort) / 1e6);
  EXPECT_LE(worst, isolated + largestBestEffort);

  // Best-effort tenants keep their shares among themselves alongside it.
  const ShareReport report = shareReport(harness, {1, 2, 3}, {1, 1, 2});
  printShares("1:1:2 beside LC", report);
  EXPECT_GE(report.jain, 0.99);
}

TEST(FairScheduler, WhileLatencyCriticalIsActiveBestEffortWorkIsSmallAndShort) {
  SchedulerConfig config;
  config.lcIdleWindow = 2 * kMs;  // arrivals every 1 ms keep it active throughout
  auto scheduler = newFairScheduler(config);
  TickHarness harness(*scheduler);
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(2, bestEffort(1));
  scheduler->setTenant(9, latencyCritical());
  harness.addSaturating(1, 10, 0, {50 * kUs});
  harness.addSaturating(2, 20, 0, {5 * kMs});
  // 50 ms alone first, so the best-effort kernels are measured (unmeasured ones count as long).
  constexpr Nanos kLcFrom = 50 * kMs;
  harness.addPeriodic(9, 90, 0, 200 * kUs, 1 * kMs, kLcFrom);
  std::size_t violations = 0;
  std::size_t longSubmitted = 0;
  harness.onSubmit = [&](const Submission& submission, Nanos now) {
    if (submission.tenantClass != TenantClass::kBestEffort || now < kLcFrom) return;
    const SchedulerStats stats = scheduler->stats(now);
    EXPECT_TRUE(stats.lcActive);
    if (submission.estimate > config.longItem) ++longSubmitted;
    // Outstanding (this item included) within the small budget, unless it went alone.
    if (stats.bestEffortInFlight > 1 && stats.bestEffortOutstanding > config.budgetLcActive) {
      ++violations;
    }
  };
  harness.runUntil(1 * kSec);
  EXPECT_EQ(violations, 0u);
  EXPECT_EQ(longSubmitted, 0u);
  // Its 5 ms kernels wait throughout (after the one admitted before LC arrived drains).
  EXPECT_EQ(harness.busy(2, kLcFrom + 10 * kMs), 0);
  EXPECT_GT(harness.busy(1, kLcFrom + 10 * kMs), 100 * kMs);
  Nanos worst = 0;
  for (const SimRun& run : harness.runs()) {
    if (run.arrived < kLcFrom + 10 * kMs) continue;
    if (run.tenantClass == TenantClass::kLatencyCritical)
      worst = std::max(worst, run.end - run.arrived);
  }
  // One 50 us item (+10% jitter) ahead of it at most, plus its own 220 us.
  EXPECT_LE(worst, 220 * kUs + 55 * kUs);
}

TEST(FairScheduler, LongItemsResumeWhenLatencyCriticalGoesIdle) {
  SchedulerConfig config;
  auto scheduler = newFairScheduler(config);
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(9, latencyCritical());
  scheduler->enqueue(WorkItem{1, 9, 90, 0, {WorkKind::kKernel, 1, 0}}, 0);
  auto lc = scheduler->next(0);
  ASSERT_TRUE(lc);
  EXPECT_EQ(lc->id, 1u);
  scheduler->enqueue(WorkItem{2, 1, 10, 0, {WorkKind::kKernel, 2, 0}}, 0);  // unmeasured: long
  EXPECT_FALSE(scheduler->next(0));
  scheduler->complete(1, 200 * kUs, 200 * kUs);
  EXPECT_FALSE(scheduler->next(200 * kUs));  // still inside the idle window
  auto wake = scheduler->wakeAt(200 * kUs);
  ASSERT_TRUE(wake);
  EXPECT_EQ(*wake, 200 * kUs + config.lcIdleWindow);
  auto be = scheduler->next(*wake);
  ASSERT_TRUE(be);
  EXPECT_EQ(be->id, 2u);
}

TEST(FairScheduler, ATenantIdleForLongDoesNotBankCredit) {
  auto scheduler = newFairScheduler({});
  TickHarness harness(*scheduler);
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(2, bestEffort(1));
  harness.addSaturating(1, 10, 0, {1 * kMs});
  harness.addSaturating(2, 20, 0, {1 * kMs}, 4, 5 * kSec);  // idle for the first 5 s
  harness.runUntil(7 * kSec);

  // Work-conserving while alone: tenant 1 had the whole GPU.
  EXPECT_GT(harness.busy(1, 0, 5 * kSec), 5 * kSec * 99 / 100);
  // Back from idle it gets its half from the start, not the 5 s it "missed".
  const ShareReport first = shareReport(harness, {1, 2}, {1, 1}, 5 * kSec, 5 * kSec + 100 * kMs);
  const ShareReport after = shareReport(harness, {1, 2}, {1, 1}, 5 * kSec, 7 * kSec);
  std::printf("returning tenant: first 100 ms share %.4f, next 2 s share %.4f\n", first.shares[1],
              after.shares[1]);
  EXPECT_LT(first.shares[1], 0.6);
  EXPECT_NEAR(after.shares[1], 0.5, 0.02);
}

TEST(FairScheduler, StreamOrderHoldsEvenWhenAHeadMustWait) {
  auto scheduler = newFairScheduler({});
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(9, latencyCritical());
  // Stream 0: a long (unmeasured) head, then an item of a measured short kernel.
  const DurationKey shortKernel{WorkKind::kKernel, 7, 0};
  scheduler->enqueue(WorkItem{100, 1, 10, 5, shortKernel}, 0);
  ASSERT_TRUE(scheduler->next(0));
  scheduler->complete(100, 10 * kUs, 10 * kUs);
  scheduler->enqueue(WorkItem{1, 9, 90, 0, {}}, 10 * kUs);  // makes LC active
  scheduler->enqueue(WorkItem{2, 1, 10, 0, {WorkKind::kKernel, 8, 0}}, 10 * kUs);
  scheduler->enqueue(WorkItem{3, 1, 10, 0, shortKernel}, 10 * kUs);
  scheduler->enqueue(WorkItem{4, 1, 10, 1, shortKernel}, 10 * kUs);  // another stream
  EXPECT_EQ(scheduler->next(10 * kUs)->id, 1u);
  // Item 3 is short but behind the long head of its stream; stream 1's head may go.
  auto be = scheduler->next(10 * kUs);
  ASSERT_TRUE(be);
  EXPECT_EQ(be->id, 4u);
  EXPECT_FALSE(scheduler->next(10 * kUs));
}

// CUDA stream priorities (lower is more urgent) order a tenant's stream heads, as a GPU
// dispatches a higher-priority stream's work first; equally urgent heads go oldest first.
TEST(FairScheduler, ATenantsMoreUrgentStreamGoesFirst) {
  auto scheduler = newFairScheduler({});
  scheduler->setTenant(1, bestEffort(1));
  scheduler->enqueue(WorkItem{1, 1, 10, 0, {}}, 0);
  scheduler->enqueue(WorkItem{2, 1, 20, 0, {}}, 0);  // another client of the tenant
  scheduler->enqueue(WorkItem{3, 1, 10, 1, {}, -2}, 0);
  scheduler->enqueue(WorkItem{4, 1, 10, 1, {}, -2}, 0);  // behind 3 on its stream
  std::vector<ItemId> order;
  for (Nanos now = 0; order.size() < 4; now += kMs) {
    auto next = scheduler->next(now);
    ASSERT_TRUE(next);  // one at a time: each unmeasured item takes the whole budget
    EXPECT_FALSE(scheduler->next(now));
    order.push_back(next->id);
    scheduler->complete(next->id, 3 * kMs, now + kMs);  // measured: still past the budget
  }
  EXPECT_EQ(order, (std::vector<ItemId>{3, 4, 1, 2}));
}

// A client's item more urgent than all it has in flight reaches the GPU beside them, past the
// budget, where the GPU runs its blocks first; it does not let one client jump another's work, nor
// anything jump while latency-critical work is about.
TEST(FairScheduler, AClientsMoreUrgentItemGoesBesideItsLessUrgentWorkInFlight) {
  auto scheduler = newFairScheduler({});
  scheduler->setTenant(1, bestEffort(1));
  scheduler->enqueue(WorkItem{1, 1, 10, 0, {}}, 0);
  ASSERT_EQ(scheduler->next(0)->id, 1u);  // unmeasured: its 2 ms estimate fills the budget
  scheduler->enqueue(WorkItem{2, 1, 10, 1, {}, 0}, 0);
  EXPECT_FALSE(scheduler->next(0));  // as urgent as what is in flight: waits
  scheduler->enqueue(WorkItem{3, 1, 10, 2, {}, -1}, 0);
  auto urgent = scheduler->next(0);
  ASSERT_TRUE(urgent);
  EXPECT_EQ(urgent->id, 3u);
  scheduler->enqueue(WorkItem{4, 1, 10, 3, {}, -1}, 0);
  EXPECT_FALSE(scheduler->next(0));  // no more urgent than item 3, in flight
  // Another client's urgent work waits for the budget: urgency orders a client's own work.
  scheduler->enqueue(WorkItem{5, 1, 20, 0, {}, -5}, 0);
  EXPECT_FALSE(scheduler->next(0));
  EXPECT_EQ(scheduler->stats(0).bestEffortInFlight, 2u);
  scheduler->complete(3, kMs, kMs);
  scheduler->complete(1, 2 * kMs, 2 * kMs);
  std::vector<ItemId> order;
  for (Nanos now = 2 * kMs; order.size() < 3; now += kMs) {
    auto next = scheduler->next(now);
    ASSERT_TRUE(next);
    order.push_back(next->id);
    scheduler->complete(next->id, kMs, now + kMs);
  }
  EXPECT_EQ(order, (std::vector<ItemId>{5, 4, 2}));

  // While a latency-critical tenant is active, the small budget holds for urgent work too.
  scheduler->setTenant(9, latencyCritical());
  const DurationKey shortKernel{WorkKind::kKernel, 7, 0};
  scheduler->enqueue(WorkItem{10, 1, 10, 0, shortKernel}, 10 * kMs);
  ASSERT_EQ(scheduler->next(10 * kMs)->id, 10u);
  scheduler->complete(10, 100 * kUs, 10 * kMs + 100 * kUs);  // now measured as short
  const Nanos now = 20 * kMs;
  scheduler->enqueue(WorkItem{11, 9, 90, 0, shortKernel}, now);
  ASSERT_EQ(scheduler->next(now)->id, 11u);
  scheduler->enqueue(WorkItem{12, 1, 10, 0, shortKernel}, now);
  ASSERT_EQ(scheduler->next(now)->id, 12u);
  scheduler->enqueue(WorkItem{13, 1, 10, 1, shortKernel, -3}, now);
  EXPECT_FALSE(scheduler->next(now));  // 100 + 100 µs would pass the 150 µs budget
}

TEST(FairScheduler, InFlightCapsHoldPerClientAndOverall) {
  SchedulerConfig config;
  auto scheduler = newFairScheduler(config);
  TickHarness harness(*scheduler);
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(2, bestEffort(1));
  scheduler->setTenant(9, latencyCritical());
  for (StreamId stream = 0; stream < 8; ++stream) {
    harness.addSaturating(1, 10, stream, {20 * kUs});  // one client, many deep streams
  }
  harness.addSaturating(2, 20, 0, {300 * kUs, 2 * kMs});
  harness.addPeriodic(9, 90, 0, 100 * kUs, 10 * kMs, 3 * kMs);
  std::size_t maxClient = 0;
  std::size_t capViolations = 0;
  std::size_t budgetViolations = 0;
  harness.onSubmit = [&](const Submission& submission, Nanos now) {
    if (submission.tenantClass != TenantClass::kBestEffort) return;
    const SchedulerStats stats = scheduler->stats(now);
    // The harness has not seen this submission yet, so add it.
    const std::size_t mine = harness.inFlightPerClient()[submission.client] + 1;
    maxClient = std::max(maxClient, mine);
    if (mine > (stats.lcActive ? config.perClientLcActive : config.perClientLcIdle)) {
      ++capViolations;
    }
    const Nanos budget = stats.lcActive ? config.budgetLcActive : config.budgetLcIdle;
    if (stats.bestEffortInFlight > 1 && (stats.bestEffortOutstanding > budget ||
                                         stats.bestEffortInFlight > config.maxBestEffortItems)) {
      ++budgetViolations;
    }
  };
  harness.runUntil(2 * kSec);
  EXPECT_EQ(capViolations, 0u);
  EXPECT_EQ(budgetViolations, 0u);
  EXPECT_EQ(maxClient, config.perClientLcIdle);  // the cap is reached, so the check bites
  EXPECT_EQ(harness.streamOrderViolations(), 0u);
}

TEST(FairScheduler, WeightAndClassChangesApplyLive) {
  auto scheduler = newFairScheduler({});
  TickHarness harness(*scheduler);
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(2, bestEffort(1));
  harness.addSaturating(1, 10, 0, {1 * kMs});
  harness.addSaturating(2, 20, 0, {100 * kUs});
  harness.runUntil(2 * kSec);
  scheduler->setTenant(2, bestEffort(3));
  harness.runUntil(4 * kSec);
  const ShareReport before = shareReport(harness, {1, 2}, {1, 1}, 0, 2 * kSec);
  const ShareReport after = shareReport(harness, {1, 2}, {1, 3}, 2 * kSec + 100 * kMs, 4 * kSec);
  EXPECT_LT(before.worstError, 0.03);
  EXPECT_LT(after.worstError, 0.03);

  // Promoted to latency-critical: its next item goes ahead of tenant 1's queued work.
  scheduler->setTenant(1, latencyCritical());
  auto next = scheduler->next(harness.now());
  ASSERT_TRUE(next);  // its saturating stream always has items queued
  EXPECT_EQ(next->tenant, 1u);
  EXPECT_EQ(next->tenantClass, TenantClass::kLatencyCritical);
}

TEST(FairScheduler, RemovingATenantReturnsItsQueuedItems) {
  auto scheduler = newFairScheduler({});
  scheduler->setTenant(1, bestEffort(1));
  scheduler->setTenant(2, bestEffort(1));
  scheduler->enqueue(WorkItem{1, 1, 10, 0, {}}, 0);
  scheduler->enqueue(WorkItem{2, 1, 10, 0, {}}, 0);
  scheduler->enqueue(WorkItem{3, 2, 20, 0, {}}, 0);
  auto first = scheduler->next(0);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->id, 1u);
  EXPECT_EQ(scheduler->removeTenant(1), (std::vector<ItemId>{2}));
  scheduler->complete(1, kMs, kMs);  // a removed tenant's item may still complete
  auto second = scheduler->next(kMs);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->id, 3u);
  EXPECT_THROW(scheduler->enqueue(WorkItem{4, 1, 10, 0, {}}, kMs), std::invalid_argument);
  EXPECT_THROW(scheduler->enqueue(WorkItem{3, 2, 20, 0, {}}, kMs), std::invalid_argument);
  EXPECT_EQ(scheduler->stats(kMs).queued, 0u);
}

TEST(FairScheduler, RemovingAClientDropsOnlyItsQueuedItemsAndChargesNothing) {
  auto scheduler = newFairScheduler({});
  scheduler->setTenant(1, bestEffort(1));
  // Client 10 (tenant 1) has one item in flight and three queued on two streams; client 11 of
  // the same tenant has one queued.
  scheduler->enqueue(WorkItem{1, 1, 10, 0, {WorkKind::kKernel, 7, 0}}, 0);
  scheduler->enqueue(WorkItem{2, 1, 10, 0, {WorkKind::kKernel, 7, 0}}, 0);
  scheduler->enqueue(WorkItem{3, 1, 10, 1, {WorkKind::kKernel, 7, 0}}, 0);
  scheduler->enqueue(WorkItem{4, 1, 11, 0, {WorkKind::kKernel, 7, 0}}, 0);
  scheduler->enqueue(WorkItem{5, 1, 10, 0, {WorkKind::kKernel, 7, 0}}, 0);
  auto first = scheduler->next(0);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->id, 1u);
  std::vector<ItemId> dropped = scheduler->removeClient(10);
  std::sort(dropped.begin(), dropped.end());
  EXPECT_EQ(dropped, (std::vector<ItemId>{2, 3, 5}));
  EXPECT_EQ(scheduler->stats(0).queued, 1u);
  // Its item in flight still completes and is charged; the dropped ones never are.
  scheduler->complete(1, 40 * kUs, 40 * kUs);
  EXPECT_EQ(scheduler->charged(1), 40 * kUs);
  EXPECT_EQ(scheduler->estimator().estimate(1, {WorkKind::kKernel, 7, 0}).value, 40 * kUs);
  auto second = scheduler->next(40 * kUs);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->id, 4u);
  EXPECT_FALSE(scheduler->next(40 * kUs));
  // Their ids are free again.
  scheduler->enqueue(WorkItem{2, 1, 11, 0, {}}, 40 * kUs);
  EXPECT_EQ(scheduler->removeClient(99), (std::vector<ItemId>{}));
}

TEST(FairScheduler, RefusesConfigsThatCannotWork) {
  SchedulerConfig config;
  config.perClientLcIdle = 0;
  EXPECT_THROW(newFairScheduler(config), std::invalid_argument);
  config = {};
  config.ewmaWeight = 0;
  EXPECT_THROW(newFifoScheduler(config), std::invalid_argument);
  auto scheduler = newFairScheduler({});
  EXPECT_THROW(scheduler->setTenant(1, bestEffort(0)), std::invalid_argument);
}

}  // namespace
}  // namespace gpuproxy::scheduler::sim
