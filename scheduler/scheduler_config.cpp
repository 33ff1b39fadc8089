#include "scheduler/scheduler.hpp"

#include <stdexcept>
#include <string>

namespace gpuproxy::scheduler {

void validateConfig(const SchedulerConfig& config) {
  auto refuse = [](const std::string& why) { throw std::invalid_argument("scheduler: " + why); };
  // A zero budget or cap would let nothing in; the "one item when the device is empty" rule
  // does not rescue a zero per-client cap.
  if (config.budgetLcActive <= 0 || config.budgetLcIdle <= 0) refuse("budgets must be positive");
  if (config.budgetLcActive > config.budgetLcIdle) {
    refuse("the latency-critical-active budget must not exceed the idle budget");
  }
  if (config.maxBestEffortItems == 0) refuse("maxBestEffortItems must be at least 1");
  if (config.perClientLcActive == 0 || config.perClientLcIdle == 0) {
    refuse("per-client caps must be at least 1");
  }
  if (config.longItem < 0 || config.lcIdleWindow < 0) refuse("durations must not be negative");
  if (config.unmeasuredEstimate <= 0) refuse("unmeasuredEstimate must be positive");
  if (!(config.ewmaWeight > 0 && config.ewmaWeight <= 1)) refuse("ewmaWeight must be in (0, 1]");
}

}  // namespace gpuproxy::scheduler
