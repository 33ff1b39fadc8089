#pragma once
// A deterministic tick harness for the scheduler: simulated time, simulated workloads and a
// simulated single, non-preemptive GPU that runs each submitted item to completion with its *true*
// duration (which the scheduler never sees until completion, and which differs from its
// estimates). Every event happens at an exact simulated nanosecond; no real time is involved.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "scheduler/scheduler.hpp"

namespace gpuproxy::scheduler::sim {

constexpr Nanos kUs = 1'000;
constexpr Nanos kMs = 1'000'000;
constexpr Nanos kSec = 1'000'000'000;
constexpr Nanos kNever = std::numeric_limits<Nanos>::max();

struct SimRun {
  ItemId id = 0;
  TenantId tenant = 0;
  ClientId client = 0;
  StreamId stream = 0;
  TenantClass tenantClass = TenantClass::kBestEffort;
  Nanos arrived = 0;
  Nanos submitted = 0;
  Nanos start = 0;
  Nanos end = 0;
  Nanos estimate = 0;
};

class TickHarness {
public:
  explicit TickHarness(Scheduler& scheduler) : scheduler_(scheduler) {}

  // Keeps `depth` items queued on one stream from `from` until `until`, as a tenant that always
  // has work does. Item i runs for durations[i % size] (each length its own kernel), stretched by
  // a deterministic +-`jitter` fraction so true durations never quite match the estimates.
  void addSaturating(TenantId tenant, ClientId client, StreamId stream,
                     std::vector<Nanos> durations, std::size_t depth = 4, Nanos from = 0,
                     Nanos until = kNever) {
    sources_.push_back(
        Source{tenant, client, stream, std::move(durations), depth, from, until, 0, 0, 0});
  }

  // One item of `duration` every `period` from `phase` on (a latency-critical request stream).
  void addPeriodic(TenantId tenant, ClientId client, StreamId stream, Nanos duration, Nanos period,
                   Nanos phase = 0) {
    Source source{tenant, client, stream, {duration}, 0, phase, kNever, 0, 0, 0};
    source.period = period;
    source.nextArrival = phase;
    sources_.push_back(source);
  }

  // Called on every submission, before the GPU sees it: tests check invariants here.
  std::function<void(const Submission&, Nanos)> onSubmit;

  double jitter = 0.1;

  void runUntil(Nanos end) {
    while (true) {
      arrive();
      pump();
      startGpu();
      if (now_ >= end) break;
      Nanos t = end;
      if (running_) t = std::min(t, running_->end);
      for (const Source& source : sources_) {
        if (source.period > 0) t = std::min(t, source.nextArrival);
        if (source.period == 0 && source.from > now_) t = std::min(t, source.from);
        if (source.period == 0 && source.until > now_) t = std::min(t, source.until);
      }
      if (auto wake = scheduler_.wakeAt(now_)) t = std::min(t, *wake);
      now_ = std::max(t, now_ + 1);
      while (running_ && running_->end <= now_) finishRunning();
    }
  }

  Nanos now() const { return now_; }
  const std::vector<SimRun>& runs() const { return done_; }
  std::size_t streamOrderViolations() const { return violations_; }

  // GPU time the tenant's items ran within [from, to).
  Nanos busy(TenantId tenant, Nanos from = 0, Nanos to = kNever) const {
    Nanos total = 0;
    for (const SimRun& run : done_) {
      if (run.tenant != tenant) continue;
      const Nanos a = std::max(run.start, from);
      const Nanos b = std::min(run.end, to);
      if (b > a) total += b - a;
    }
    return total;
  }

  std::map<ClientId, std::size_t> inFlightPerClient() const {
    std::map<ClientId, std::size_t> counts;
    for (const auto& [id, run] : pending_) ++counts[run.client];
    return counts;
  }

private:
  struct Source {
    TenantId tenant;
    ClientId client;
    StreamId stream;
    std::vector<Nanos> durations;
    std::size_t depth;
    Nanos from;
    Nanos until;
    std::size_t queued;
    std::uint64_t issued;
    Nanos period;
    Nanos nextArrival = 0;
  };

  // A small LCG so jitter is the same on every run and every platform.
  double nextJitter() {
    lcg_ = lcg_ * 6364136223846793005ull + 1442695040888963407ull;
    const double unit = static_cast<double>(lcg_ >> 11) / static_cast<double>(1ull << 53);
    return 1.0 + jitter * (2.0 * unit - 1.0);
  }

  void enqueueFrom(std::size_t index) {
    Source& source = sources_[index];
    const std::size_t which = source.issued % source.durations.size();
    const ItemId id = nextId_++;
    const Nanos trueDuration = std::max<Nanos>(
        1, static_cast<Nanos>(static_cast<double>(source.durations[which]) * nextJitter()));
    WorkItem item{id, source.tenant, source.client, source.stream,
                  DurationKey{WorkKind::kKernel, index * 16 + which + 1, 0}};
    scheduler_.enqueue(item, now_);
    truth_[id] = Truth{trueDuration, now_, index};
    order_[{source.client, source.stream}].push_back(id);
    ++source.queued;
    ++source.issued;
  }

  void arrive() {
    for (std::size_t i = 0; i < sources_.size(); ++i) {
      Source& source = sources_[i];
      if (source.period > 0) {
        while (source.nextArrival <= now_) {
          enqueueFrom(i);
          source.nextArrival += source.period;
        }
      } else if (now_ >= source.from && now_ < source.until) {
        while (source.queued < source.depth) enqueueFrom(i);
      }
    }
  }

  void pump() {
    while (auto submission = scheduler_.next(now_)) {
      if (onSubmit) onSubmit(*submission, now_);
      auto& order = order_[{submission->client, submission->stream}];
      if (order.empty() || order.front() != submission->id) ++violations_;
      std::erase(order, submission->id);
      const Truth& truth = truth_.at(submission->id);
      --sources_[truth.source].queued;
      SimRun run{submission->id,
                 submission->tenant,
                 submission->client,
                 submission->stream,
                 submission->tenantClass,
                 truth.arrived,
                 now_,
                 0,
                 0,
                 submission->estimate};
      pending_[run.id] = run;
      (run.tenantClass == TenantClass::kLatencyCritical ? lcQueue_ : beQueue_).push_back(run.id);
      // Arrivals the submission made room for (saturating sources top up as they drain).
      arrive();
    }
  }

  // Latency-critical items start before queued best-effort ones, as on a highest-priority
  // stream; nothing already running is interrupted.
  void startGpu() {
    if (running_) return;
    auto& queue = lcQueue_.empty() ? beQueue_ : lcQueue_;
    if (queue.empty()) return;
    SimRun run = pending_.at(queue.front());
    queue.pop_front();
    run.start = now_;
    run.end = now_ + truth_.at(run.id).duration;
    running_ = run;
  }

  void finishRunning() {
    SimRun run = *running_;
    running_.reset();
    const Nanos finishedAt = run.end;
    pending_.erase(run.id);
    done_.push_back(run);
    // The device starts its next queued item the moment this one ends; the daemon only learns of
    // the completion afterwards.
    const Nanos saved = now_;
    now_ = finishedAt;
    startGpu();
    now_ = saved;
    scheduler_.complete(run.id, truth_.at(run.id).duration, now_);
    truth_.erase(run.id);
    pump();
    startGpu();
  }

  struct Truth {
    Nanos duration;
    Nanos arrived;
    std::size_t source;
  };

  Scheduler& scheduler_;
  std::vector<Source> sources_;
  std::map<ItemId, Truth> truth_;
  std::map<std::pair<ClientId, StreamId>, std::deque<ItemId>> order_;
  std::map<ItemId, SimRun> pending_;  // submitted, not finished
  std::deque<ItemId> lcQueue_;
  std::deque<ItemId> beQueue_;
  std::optional<SimRun> running_;
  std::vector<SimRun> done_;
  std::uint64_t lcg_ = 42;
  ItemId nextId_ = 1;
  Nanos now_ = 0;
  std::size_t violations_ = 0;
};

struct ShareReport {
  std::vector<double> shares;
  std::vector<double> errors;  // |share - w/sum| / (w/sum)
  double jain = 0;
  double worstError = 0;
};

inline ShareReport shareReport(const TickHarness& harness, const std::vector<TenantId>& tenants,
                               const std::vector<double>& weights, Nanos from = 0,
                               Nanos to = kNever) {
  ShareReport report;
  double total = 0;
  double weightSum = 0;
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    report.shares.push_back(static_cast<double>(harness.busy(tenants[i], from, to)));
    total += report.shares.back();
    weightSum += weights[i];
  }
  double sum = 0;
  double sumSquares = 0;
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    report.shares[i] /= total;
    const double fair = weights[i] / weightSum;
    const double x = report.shares[i] / fair;
    sum += x;
    sumSquares += x * x;
    report.errors.push_back(std::abs(report.shares[i] - fair) / fair);
    report.worstError = std::max(report.worstError, report.errors.back());
  }
  report.jain = sum * sum / (static_cast<double>(tenants.size()) * sumSquares);
  return report;
}

}  // namespace gpuproxy::scheduler::sim
