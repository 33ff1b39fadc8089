#pragma once
// Which CUDA stream priority a client's stream runs at. The device's range is split into two
// bands: latency-critical streams get the greatest priority, best-effort streams the levels
// below it. A client's own priority (cuStreamCreateWithPriority) orders its streams within its
// class's band and can never lift a best-effort stream to the latency-critical level. With a
// range of one level there is nothing to split and every stream gets it.

#include "server/backend/backend.hpp"

namespace gpuproxy::server::dispatch {

// `priority` clamped to `range`, as the CUDA driver clamps a requested priority. This is what
// the client sees (cuStreamGetPriority), whatever band the stream runs in.
int clampToRange(const backend::StreamPriorityRange& range, int priority);

// The band of `workClass` in `range`, as [greatest, least] (greatest <= least numerically).
backend::StreamPriorityRange priorityBand(const backend::StreamPriorityRange& range,
                                          backend::TenantClass workClass);

// The priority a stream of `workClass` whose client asked for `requested` runs at.
int devicePriority(const backend::StreamPriorityRange& range, backend::TenantClass workClass,
                   int requested);

}  // namespace gpuproxy::server::dispatch
