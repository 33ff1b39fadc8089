// Latency-critical first, then start-time fair queuing among best-effort tenants, charged with
// measured GPU time, behind an in-flight budget. Why each piece: scheduler/README.md.
//
// SFQ (Goyal, Vin, Cheng, "Start-time Fair Queueing", SIGCOMM 1996 / IEEE/ACM ToN 1997):
// serve the smallest start tag S = max(v, F_prev); F = S + L / w; v = start tag of the work in
// service. For any two tenants f, m continuously backlogged over an interval, the normalised
// service they receive differs by at most L_f^max / w_f + L_m^max / w_m (Theorem 1 there), and
// the bound holds whatever the server's rate does, which matters on a GPU whose speed depends on
// what runs beside each kernel. Because only start tags order the queue, L need not be known at
// dispatch: we advance F by the estimate and correct it by (measured - estimate) / w when the item
// completes, so over time each tenant is charged exactly its measured GPU time.

#include <algorithm>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "scheduler/scheduler.hpp"

namespace gpuproxy::scheduler {
namespace {

std::size_t classIndex(TenantClass tenantClass) {
  return tenantClass == TenantClass::kLatencyCritical ? 0 : 1;
}

struct Queued {
  WorkItem item;
  std::uint64_t seq = 0;  // arrival order, to pick between a tenant's equally urgent streams
};

// Whether `head` goes before `than` among one tenant's stream heads: the more urgent stream
// first, as a GPU dispatches a higher-priority stream's work first; then the older.
bool goesBefore(const Queued& head, const Queued& than) {
  if (head.item.priority != than.item.priority) return head.item.priority < than.item.priority;
  return head.seq < than.seq;
}

using StreamKey = std::pair<ClientId, StreamId>;

struct Tenant {
  TenantSpec spec;
  // SFQ finish tag of the last dispatched item, in virtual time (ns of GPU time / weight). While
  // the tenant stays backlogged it is also the start tag of its next item.
  double finish = 0;
  std::size_t queued = 0;
  Nanos charged = 0;
  // Only streams with queued items; ordered so scans are deterministic.
  std::map<StreamKey, std::deque<Queued>> streams;
};

struct InFlight {
  TenantId tenant = 0;
  ClientId client = 0;
  TenantClass tenantClass = TenantClass::kBestEffort;
  Nanos estimate = 0;
  DurationKey key;
  int priority = 0;
};

class FairScheduler final : public Scheduler {
public:
  explicit FairScheduler(const SchedulerConfig& config)
      : config_(config), estimator_(config.unmeasuredEstimate, config.ewmaWeight) {}

  std::string_view name() const override { return "fair"; }

  void setTenant(TenantId id, TenantSpec spec) override {
    if (spec.weight == 0) throw std::invalid_argument("scheduler: a tenant's weight must be >= 1");
    auto [it, inserted] = tenants_.try_emplace(id);
    Tenant& tenant = it->second;
    if (inserted || tenant.spec.tenantClass != spec.tenantClass) {
      // Tags are only comparable within one class's virtual time; entering a class at its
      // current virtual time gives neither credit nor debt.
      tenant.finish = virtual_[classIndex(spec.tenantClass)];
      if (!inserted && tenant.spec.tenantClass == TenantClass::kLatencyCritical) {
        lcQueued_ -= tenant.queued;
      } else if (!inserted) {
        lcQueued_ += tenant.queued;
      }
    }
    // A weight change only scales charges from now on; past service stays charged at the old
    // weight, which is what "live" means for a share.
    tenant.spec = spec;
  }

  std::vector<ItemId> removeTenant(TenantId id) override {
    std::vector<ItemId> dropped;
    auto it = tenants_.find(id);
    if (it == tenants_.end()) return dropped;
    for (auto& [key, stream] : it->second.streams) {
      for (const Queued& queued : stream) {
        dropped.push_back(queued.item.id);
        ids_.erase(queued.item.id);
      }
    }
    queued_ -= it->second.queued;
    if (it->second.spec.tenantClass == TenantClass::kLatencyCritical) {
      lcQueued_ -= it->second.queued;
    }
    tenants_.erase(it);
    estimator_.forgetTenant(id);
    return dropped;
  }

  std::vector<ItemId> removeClient(ClientId client) override {
    std::vector<ItemId> dropped;
    for (auto& [id, tenant] : tenants_) {
      // Queued items carry no tag yet (a tenant's tag moves when an item is dispatched), so
      // dropping them leaves every tenant's standing as it was.
      for (auto stream = tenant.streams.begin(); stream != tenant.streams.end();) {
        if (stream->first.first != client) {
          ++stream;
          continue;
        }
        for (const Queued& queued : stream->second) {
          dropped.push_back(queued.item.id);
          ids_.erase(queued.item.id);
        }
        const std::size_t count = stream->second.size();
        tenant.queued -= count;
        queued_ -= count;
        if (tenant.spec.tenantClass == TenantClass::kLatencyCritical) lcQueued_ -= count;
        stream = tenant.streams.erase(stream);
      }
    }
    return dropped;
  }

  void enqueue(const WorkItem& item, Nanos now) override {
    auto it = tenants_.find(item.tenant);
    if (it == tenants_.end()) {
      throw std::invalid_argument("scheduler: unknown tenant " + std::to_string(item.tenant));
    }
    if (!ids_.insert(item.id).second) {
      throw std::invalid_argument("scheduler: item " + std::to_string(item.id) +
                                  " is already queued or in flight");
    }
    Tenant& tenant = it->second;
    if (tenant.queued == 0) {
      // SFQ's S = max(v, F_prev): a tenant that was idle re-enters at the current virtual time,
      // so idleness never turns into banked credit.
      tenant.finish = std::max(tenant.finish, virtual_[classIndex(tenant.spec.tenantClass)]);
    }
    tenant.streams[{item.client, item.stream}].push_back(Queued{item, nextSeq_++});
    ++tenant.queued;
    ++queued_;
    if (tenant.spec.tenantClass == TenantClass::kLatencyCritical) {
      ++lcQueued_;
      noteLcActivity(now);
    }
  }

  std::optional<Submission> next(Nanos now) override {
    if (auto submission = pick(TenantClass::kLatencyCritical, now)) return submission;
    return pick(TenantClass::kBestEffort, now);
  }

  void complete(ItemId id, Nanos measured, Nanos now) override {
    auto it = inFlight_.find(id);
    if (it == inFlight_.end()) return;
    const InFlight done = it->second;
    inFlight_.erase(it);
    ids_.erase(id);
    if (done.tenantClass == TenantClass::kLatencyCritical) {
      --lcInFlight_;
      noteLcActivity(now);
    } else {
      --bestEffortItems_;
      bestEffortOutstanding_ -= done.estimate;
      auto client = clientInFlight_.find(done.client);
      if (--client->second == 0) clientInFlight_.erase(client);
    }
    auto tenant = tenants_.find(done.tenant);
    if (tenant == tenants_.end()) return;  // removed while this item ran
    estimator_.record(done.tenant, done.key, measured);
    tenant->second.charged += measured;
    if (tenant->second.spec.tenantClass == done.tenantClass) {
      tenant->second.finish +=
          static_cast<double>(measured - done.estimate) / tenant->second.spec.weight;
    }
  }

  std::optional<Nanos> wakeAt(Nanos now) const override {
    if (queued_ == 0 || lcQueued_ > 0 || lcInFlight_ > 0 || !sawLc_) return std::nullopt;
    const Nanos idleAt = lastLcActivity_ + config_.lcIdleWindow;
    if (idleAt <= now) return std::nullopt;
    return idleAt;
  }

  SchedulerStats stats(Nanos now) const override {
    return SchedulerStats{queued_, inFlight_.size(), bestEffortItems_, bestEffortOutstanding_,
                          lcActive(now)};
  }

  Nanos charged(TenantId id) const override {
    auto it = tenants_.find(id);
    return it == tenants_.end() ? 0 : it->second.charged;
  }

  const DurationEstimator& estimator() const override { return estimator_; }

private:
  bool lcActive(Nanos now) const {
    return lcQueued_ > 0 || lcInFlight_ > 0 ||
           (sawLc_ && now - lastLcActivity_ < config_.lcIdleWindow);
  }

  void noteLcActivity(Nanos now) {
    sawLc_ = true;
    lastLcActivity_ = std::max(lastLcActivity_, now);
  }

  // Whether a best-effort item of `client` at `priority` is more urgent than every best-effort
  // item that client has in flight (and it has some): on the GPU its blocks would go before
  // theirs, which they can only do if it is there.
  bool overtakesItsClient(ClientId client, int priority) const {
    if (!clientInFlight_.contains(client)) return false;
    return std::ranges::all_of(inFlight_, [&](const auto& entry) {
      const InFlight& flying = entry.second;
      return flying.client != client || flying.tenantClass != TenantClass::kBestEffort ||
             priority < flying.priority;
    });
  }

  // The smallest-tag tenant of the class that has an eligible stream head, and its most urgent
  // eligible head, the oldest of those. Only heads are considered, so a stream's order never
  // changes; a head that must wait (long item, client at its cap) blocks its stream but not the
  // tenant's others.
  std::optional<Submission> pick(TenantClass tenantClass, Nanos now) {
    const bool critical = tenantClass == TenantClass::kLatencyCritical;
    if (critical ? lcQueued_ == 0 : queued_ == lcQueued_) return std::nullopt;
    const bool lcBusy = !critical && lcActive(now);
    const std::uint32_t clientCap = lcBusy ? config_.perClientLcActive : config_.perClientLcIdle;

    Tenant* best = nullptr;
    TenantId bestId = 0;
    std::map<StreamKey, std::deque<Queued>>::iterator bestStream;
    Nanos bestEstimate = 0;
    bool bestAtCap = false;
    for (auto& [id, tenant] : tenants_) {
      if (tenant.spec.tenantClass != tenantClass || tenant.queued == 0) continue;
      // Ties go to the lower tenant id (map order), so decisions are reproducible.
      if (best != nullptr && !(tenant.finish < best->finish)) continue;
      const Queued* chosen = nullptr;
      bool found = false;
      bool atCap = false;
      for (auto stream = tenant.streams.begin(); stream != tenant.streams.end(); ++stream) {
        const Queued& head = stream->second.front();
        if (found && !goesBefore(head, *chosen)) continue;
        const DurationEstimate estimate = estimator_.estimate(id, head.item.key);
        if (!critical) {
          const bool isLong = !estimate.measured || estimate.value > config_.longItem;
          if (lcBusy && isLong) continue;
          auto client = clientInFlight_.find(head.item.client);
          if (client != clientInFlight_.end() && client->second >= clientCap) {
            atCap = true;
            continue;
          }
        }
        found = true;
        chosen = &head;
        bestStream = stream;
        bestEstimate = estimate.value;
      }
      if (found || atCap) {
        best = &tenant;
        bestId = id;
        bestAtCap = !found;
      }
    }
    if (best == nullptr) return std::nullopt;
    // The fairest tenant's clients are all at their cap. Filling the device with other tenants'
    // work now would queue it ahead of this tenant's next items and cut its share to what its
    // capped clients can keep in flight; waiting costs nothing, since the capped items keep the
    // GPU busy. (Heads held back as long while latency-critical work is active are different:
    // they have nothing in flight, so the others go.)
    if (bestAtCap) return std::nullopt;

    if (!critical && bestEffortItems_ > 0) {
      // The budget is shared, so when the fairest head does not fit we wait for completions
      // rather than let a smaller head of another tenant jump it: skipping would starve tenants
      // whose items are large. With nothing in flight any one item goes, whatever its size.
      // While no latency-critical work is about, a head more urgent than all its client has in
      // flight goes whatever the budget: held here, it would wait for that client's less urgent
      // kernels, which CUDA's stream priorities promise it need not.
      const Nanos budget = lcBusy ? config_.budgetLcActive : config_.budgetLcIdle;
      const Queued& head = bestStream->second.front();
      const bool overtakes = !lcBusy && overtakesItsClient(head.item.client, head.item.priority);
      if (bestEffortItems_ >= config_.maxBestEffortItems ||
          (bestEffortOutstanding_ + bestEstimate > budget && !overtakes)) {
        return std::nullopt;
      }
    }
    return dispatch(bestId, *best, bestStream, bestEstimate);
  }

  Submission dispatch(TenantId id, Tenant& tenant,
                      std::map<StreamKey, std::deque<Queued>>::iterator stream, Nanos estimate) {
    const WorkItem item = stream->second.front().item;
    stream->second.pop_front();
    if (stream->second.empty()) tenant.streams.erase(stream);
    --tenant.queued;
    --queued_;

    const TenantClass tenantClass = tenant.spec.tenantClass;
    double& virtualTime = virtual_[classIndex(tenantClass)];
    const double start = tenant.finish;
    virtualTime = std::max(virtualTime, start);
    // Charged provisionally with the estimate; complete() replaces it with the measured time.
    tenant.finish = start + static_cast<double>(estimate) / tenant.spec.weight;

    inFlight_.emplace(item.id,
                      InFlight{id, item.client, tenantClass, estimate, item.key, item.priority});
    if (tenantClass == TenantClass::kLatencyCritical) {
      --lcQueued_;
      ++lcInFlight_;
    } else {
      ++bestEffortItems_;
      bestEffortOutstanding_ += estimate;
      ++clientInFlight_[item.client];
    }
    return Submission{item.id, id, item.client, item.stream, tenantClass, estimate};
  }

  SchedulerConfig config_;
  DurationEstimator estimator_;
  std::map<TenantId, Tenant> tenants_;
  std::unordered_map<ItemId, InFlight> inFlight_;
  std::unordered_set<ItemId> ids_;  // queued or in flight, to refuse duplicates
  std::unordered_map<ClientId, std::uint32_t> clientInFlight_;  // best-effort items only
  double virtual_[2] = {0, 0};  // per class: [latency-critical, best-effort]
  std::uint64_t nextSeq_ = 0;
  std::size_t queued_ = 0;
  std::size_t lcQueued_ = 0;
  std::size_t lcInFlight_ = 0;
  std::size_t bestEffortItems_ = 0;
  Nanos bestEffortOutstanding_ = 0;
  Nanos lastLcActivity_ = 0;
  bool sawLc_ = false;
};

}  // namespace

std::unique_ptr<Scheduler> newFairScheduler(const SchedulerConfig& config) {
  validateConfig(config);
  return std::make_unique<FairScheduler>(config);
}

}  // namespace gpuproxy::scheduler
