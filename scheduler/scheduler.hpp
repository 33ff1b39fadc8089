#pragma once
// The scheduler core: decides, before submission, which queued work item goes to the
// GPU next and whether anything should go now. GPU work cannot be preempted, so this is the only
// place fairness and latency-critical priority can be enforced.
//
// Pure and deterministic: no threads, no clocks, no I/O, no CUDA. Time comes in as `now`
// arguments (nanoseconds on any monotonic clock the caller picks), so the same inputs always give
// the same decisions and tests run on simulated time. Not thread-safe: the daemon calls it from
// its event-loop thread. Policy and fairness bound: scheduler/README.md.

#include "scheduler/tenant_class.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "scheduler/duration_estimator.hpp"

namespace gpuproxy::scheduler {

using ItemId = std::uint64_t;
using ClientId = std::uint64_t;
// A client's stream; only unique together with its ClientId.
using StreamId = std::uint64_t;

struct TenantSpec {
  std::uint32_t weight = 1;  // must be >= 1
  TenantClass tenantClass = TenantClass::kBestEffort;
};

struct WorkItem {
  ItemId id = 0;  // chosen by the caller; unique among items queued or in flight
  TenantId tenant = 0;
  ClientId client = 0;
  StreamId stream = 0;
  DurationKey key;  // kind, function and launch shape: what the duration estimate is kept for
  // The stream's CUDA priority as its client asked for it (lower is more urgent, 0 the default):
  // it orders a tenant's stream heads, and lets a client's urgent work reach the GPU beside its
  // own less urgent work in flight, where the GPU runs the urgent blocks first.
  int priority = 0;
};

// What the caller must submit to the GPU now.
struct Submission {
  ItemId id = 0;
  TenantId tenant = 0;
  ClientId client = 0;
  StreamId stream = 0;
  TenantClass tenantClass = TenantClass::kBestEffort;
  Nanos estimate = 0;  // what this item counts for against the in-flight budget
};

struct SchedulerConfig {
  // Estimated best-effort GPU time allowed on the device at once. Small while a latency-critical
  // tenant is active, so its work waits behind little; larger when none is, so the GPU stays fed.
  // One best-effort item is always allowed when none is in flight, even if it is larger.
  Nanos budgetLcActive = 150'000;
  Nanos budgetLcIdle = 2'000'000;
  std::uint32_t maxBestEffortItems = 16;
  // Best-effort items one client may have in flight, so no client fills the hardware queues.
  std::uint32_t perClientLcActive = 2;
  std::uint32_t perClientLcIdle = 4;
  // Best-effort items estimated longer than this (and unmeasured ones) wait while a
  // latency-critical tenant is active.
  Nanos longItem = 1'000'000;
  // A latency-critical tenant is active while it has work queued or in flight, and for this long
  // after its last item arrived or completed.
  Nanos lcIdleWindow = 100'000;
  // What an unmeasured item is assumed to take; pessimistic, so unknown work is treated as long.
  Nanos unmeasuredEstimate = 2'000'000;
  // Weight of the newest sample in the duration EWMA.
  double ewmaWeight = 0.25;
};

struct SchedulerStats {
  std::size_t queued = 0;
  std::size_t inFlight = 0;
  std::size_t bestEffortInFlight = 0;
  Nanos bestEffortOutstanding = 0;  // sum of the estimates of best-effort items in flight
  bool lcActive = false;
};

class Scheduler {
public:
  virtual ~Scheduler() = default;

  // "fair" or "fifo", for the daemon's status output.
  virtual std::string_view name() const = 0;

  // Adds a tenant, or changes its weight and class live; applies from the next decision.
  virtual void setTenant(TenantId tenant, TenantSpec spec) = 0;
  // Forgets a tenant. Its queued items will never be submitted and are returned so the caller can
  // fail them; its items in flight may still be completed.
  virtual std::vector<ItemId> removeTenant(TenantId tenant) = 0;
  // Forgets the queued items of one client (it is gone): they will never be submitted and are
  // returned, so the caller can fail them. Nothing is charged or measured for them; its items in
  // flight may still be completed.
  virtual std::vector<ItemId> removeClient(ClientId client) = 0;

  // Queues an item behind earlier items of the same (client, stream). Throws
  // std::invalid_argument for an unknown tenant or an id already queued or in flight.
  virtual void enqueue(const WorkItem& item, Nanos now) = 0;

  // The item to submit now, already counted as in flight; std::nullopt when nothing should be
  // submitted until the next enqueue, completion or wakeAt(). Call until it returns nullopt.
  virtual std::optional<Submission> next(Nanos now) = 0;

  // An item submitted by next() finished after `measured` of GPU time. Charges its tenant,
  // updates the duration estimate and frees its in-flight budget. Unknown ids are ignored.
  virtual void complete(ItemId item, Nanos measured, Nanos now) = 0;

  // When a decision may change with no input (a latency-critical idle window ending); the caller
  // should call next() again then. std::nullopt: only enqueue or complete can change it.
  virtual std::optional<Nanos> wakeAt(Nanos now) const = 0;

  virtual SchedulerStats stats(Nanos now) const = 0;
  // Measured GPU time charged to a tenant so far (0 for unknown tenants).
  virtual Nanos charged(TenantId tenant) const = 0;
  virtual const DurationEstimator& estimator() const = 0;
};

// Throws std::invalid_argument, with the reason, for a config that cannot work (a zero budget or
// cap, a negative duration, an EWMA weight outside (0, 1]). The factories call it; the daemon can
// call it to refuse bad flags at start-up.
void validateConfig(const SchedulerConfig& config);

std::unique_ptr<Scheduler> newFairScheduler(const SchedulerConfig& config);
// Arrival order across all tenants, ignoring weights and classes, like time-slicing or MPS; the
// baseline the fair scheduler is measured against. Uses budgetLcIdle and maxBestEffortItems as
// its only in-flight bound.
std::unique_ptr<Scheduler> newFifoScheduler(const SchedulerConfig& config);

}  // namespace gpuproxy::scheduler
