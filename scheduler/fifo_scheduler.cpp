// Arrival order across everyone, ignoring weights and classes: what a GPU does under
// time-slicing or MPS, where each client's launches reach the hardware queues as they are made.
// Kept behind the same interface as the baseline the fair scheduler is measured against, so the
// two differ only in policy. The in-flight budget still applies (otherwise the daemon would hand
// the device an unbounded queue), with head-of-line blocking as a real FIFO has.

#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "scheduler/scheduler.hpp"

namespace gpuproxy::scheduler {
namespace {

struct InFlight {
  TenantId tenant = 0;
  TenantClass tenantClass = TenantClass::kBestEffort;
  Nanos estimate = 0;
  DurationKey key;
};

class FifoScheduler final : public Scheduler {
public:
  explicit FifoScheduler(const SchedulerConfig& config)
      : config_(config), estimator_(config.unmeasuredEstimate, config.ewmaWeight) {}

  std::string_view name() const override { return "fifo"; }

  void setTenant(TenantId id, TenantSpec spec) override {
    if (spec.weight == 0) throw std::invalid_argument("scheduler: a tenant's weight must be >= 1");
    tenants_[id].spec = spec;
  }

  std::vector<ItemId> removeTenant(TenantId id) override {
    std::vector<ItemId> dropped;
    if (tenants_.erase(id) == 0) return dropped;
    std::erase_if(queue_, [&](const WorkItem& item) {
      if (item.tenant != id) return false;
      dropped.push_back(item.id);
      ids_.erase(item.id);
      return true;
    });
    estimator_.forgetTenant(id);
    return dropped;
  }

  std::vector<ItemId> removeClient(ClientId client) override {
    std::vector<ItemId> dropped;
    std::erase_if(queue_, [&](const WorkItem& item) {
      if (item.client != client) return false;
      dropped.push_back(item.id);
      ids_.erase(item.id);
      return true;
    });
    return dropped;
  }

  void enqueue(const WorkItem& item, Nanos) override {
    if (!tenants_.contains(item.tenant)) {
      throw std::invalid_argument("scheduler: unknown tenant " + std::to_string(item.tenant));
    }
    if (!ids_.insert(item.id).second) {
      throw std::invalid_argument("scheduler: item " + std::to_string(item.id) +
                                  " is already queued or in flight");
    }
    queue_.push_back(item);
  }

  std::optional<Submission> next(Nanos) override {
    if (queue_.empty()) return std::nullopt;
    const WorkItem item = queue_.front();
    const Nanos estimate = estimator_.estimate(item.tenant, item.key).value;
    if (!inFlight_.empty() && (inFlight_.size() >= config_.maxBestEffortItems ||
                               outstanding_ + estimate > config_.budgetLcIdle)) {
      return std::nullopt;
    }
    queue_.pop_front();
    const TenantClass tenantClass = tenants_.at(item.tenant).spec.tenantClass;
    inFlight_.emplace(item.id, InFlight{item.tenant, tenantClass, estimate, item.key});
    outstanding_ += estimate;
    return Submission{item.id, item.tenant, item.client, item.stream, tenantClass, estimate};
  }

  void complete(ItemId id, Nanos measured, Nanos) override {
    auto it = inFlight_.find(id);
    if (it == inFlight_.end()) return;
    const InFlight done = it->second;
    inFlight_.erase(it);
    ids_.erase(id);
    outstanding_ -= done.estimate;
    auto tenant = tenants_.find(done.tenant);
    if (tenant == tenants_.end()) return;
    tenant->second.charged += measured;
    estimator_.record(done.tenant, done.key, measured);
  }

  std::optional<Nanos> wakeAt(Nanos) const override { return std::nullopt; }

  SchedulerStats stats(Nanos) const override {
    return SchedulerStats{queue_.size(), inFlight_.size(), inFlight_.size(), outstanding_, false};
  }

  Nanos charged(TenantId id) const override {
    auto it = tenants_.find(id);
    return it == tenants_.end() ? 0 : it->second.charged;
  }

  const DurationEstimator& estimator() const override { return estimator_; }

private:
  struct Tenant {
    TenantSpec spec;
    Nanos charged = 0;
  };

  SchedulerConfig config_;
  DurationEstimator estimator_;
  std::map<TenantId, Tenant> tenants_;
  std::deque<WorkItem> queue_;
  std::unordered_map<ItemId, InFlight> inFlight_;
  std::unordered_set<ItemId> ids_;
  Nanos outstanding_ = 0;
};

}  // namespace

std::unique_ptr<Scheduler> newFifoScheduler(const SchedulerConfig& config) {
  validateConfig(config);
  return std::make_unique<FifoScheduler>(config);
}

}  // namespace gpuproxy::scheduler
