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

// The GPUs, by daemon device index, borrowed: each shard is owned by the thread that serves it
// (GpuThread, in the daemon), and reached only by messages (server/gpu/gpu_messages.hpp). Each
// session opens its per-GPU state on them.
using Gpus = std::vector<GpuShard*>;

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
  // The loop of the sessions' own thread: watches client processes (DataPlane::whenReadable),
  // times the rechecks of a client at its bound on queued work, and serves the ring of a client
  // that sees no GPU. Null where sessions run without rings (tests).
  DataPlane* dataPlane = nullptr;
  // By daemon device index, the data-plane loop on each GPU's thread (GpuThread), which serves
  // that GPU's ring of every client; each is touched only by a message to its GPU. Empty where
  // sessions run without rings.
  std::vector<DataPlane*> gpuDataPlanes = {};
};

}  // namespace gpuproxy::server
