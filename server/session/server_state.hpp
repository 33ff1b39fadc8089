#pragma once
// What the control plane shares between connections: the GPUs, the live sessions (for status),
// and the reaper that finishes off sessions whose clients are gone. Owned by the Daemon; used only
// on the control-plane event loop thread.

#include "server/gpu/client_stats.hpp"
#include "server/gpu/gpu_shard.hpp"
#include "server/session/connection_registry.hpp"
#include "server/tenant/tenant_registry.hpp"

#include <kj/async.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace gpuproxy::server {

class ClientSession;
class DataPlane;

struct ServerState {
  std::string backendName;
  std::string schedulerName;  // "fair" or "fifo": what every GPU's dispatcher runs
  int driverVersion = 0;
  std::chrono::steady_clock::time_point startedAt = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<GpuShard>> gpus;
  std::set<ClientSession*> sessions;  // borrowed: each session removes itself when destroyed
  // Runs each ended session's drain-then-free; outlives every session.
  kj::TaskSet* reaper = nullptr;
  // Serves every session's command ring; null in tests that run sessions without one.
  DataPlane* dataPlane = nullptr;
  // Every tenant, from the tenants file or created at run time. A tenant that is removed stays
  // alive through the sessions that still hold it.
  TenantRegistry tenants;
  ConnectionRegistry connections;
};

}  // namespace gpuproxy::server
