#include "server/dispatch/stream_priority.hpp"

#include <algorithm>

namespace gpuproxy::server::dispatch {

namespace {

// A range as the driver reports it, with greatest <= least even if a backend said it backwards.
backend::StreamPriorityRange ordered(const backend::StreamPriorityRange& range) {
  return {std::max(range.least, range.greatest), std::min(range.least, range.greatest)};
}

}  // namespace

int clampToRange(const backend::StreamPriorityRange& range, int priority) {
  const backend::StreamPriorityRange r = ordered(range);
  return std::clamp(priority, r.greatest, r.least);
}

backend::StreamPriorityRange priorityBand(const backend::StreamPriorityRange& range,
                                          backend::TenantClass workClass) {
  const backend::StreamPriorityRange r = ordered(range);
  if (r.least == r.greatest) return r;
  if (workClass == backend::TenantClass::kLatencyCritical) return {r.greatest, r.greatest};
  return {r.least, r.greatest + 1};
}

int devicePriority(const backend::StreamPriorityRange& range, backend::TenantClass workClass,
                   int requested) {
  return clampToRange(priorityBand(range, workClass), requested);
}

}  // namespace gpuproxy::server::dispatch
