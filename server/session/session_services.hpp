#pragma once
// What a client's session may use of the daemon, and all it may. The daemon owns each piece
// (server/daemon/daemon.cpp) and hands every session the same references; each outlives every
// session. Other parts get narrow views of their own (AdminView for the admin service).

#include "server/gpu/gpu_shard.hpp"
#include "server/session/connection_registry.hpp"

#include <kj/async.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace gpuproxy::server {

class ClientSession;
class DataPlane;

// What the daemon is, fixed at start-up: told to clients at attach and shown by status.
struct DaemonFacts {
  std::string backendName;
  std::string schedulerName;  // "fair" or "fifo": what every GPU's dispatcher runs
  int driverVersion = 0;
  std::chrono::steady_clock::time_point startedAt = std::chrono::steady_clock::now();
};

// The GPUs, by daemon device index. Each session opens its per-GPU state on them.
using Gpus = std::vector<std::unique_ptr<GpuShard>>;

struct SessionServices {
  const DaemonFacts& facts;
  const Gpus& gpus;
  // Every live session, for status: each enters itself while it lives.
  std::set<ClientSession*>& sessions;
  // Where the connection a session arrived on is recorded, and ended when the client breaks
  // the protocol.
  ConnectionRegistry& connections;
  // Finishes what must outlive a session or a request: a session's drain-then-free, pinned
  // ranges released after their client went away.
  kj::TaskSet& reaper;
  // Serves every session's command ring; null where sessions run without rings (tests).
  DataPlane* dataPlane = nullptr;
};

}  // namespace gpuproxy::server
