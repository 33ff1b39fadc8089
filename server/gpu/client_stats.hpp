#pragma once
// What operators see about one client (gpuproxyctl status). Kernel completions update it from a
// backend thread, possibly after the session itself is gone, so it is shared (std::shared_ptr)
// between the session and the callbacks of its in-flight kernels, and its counters are atomic.

#include <sys/types.h>

#include "server/tenant/tenant.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace gpuproxy::server {

struct ClientIdentity {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string command;  // /proc/PID/comm when it attached
  std::string cgroup;   // /proc/PID/cgroup when it attached
  // The Kubernetes pod and container that cgroup belongs to; empty outside a pod.
  std::string podUid;
  std::string containerId;
};

struct ClientStats {
  ClientIdentity identity;
  // The tenant of the socket the client came through; set once at attach, never by the client.
  std::shared_ptr<Tenant> tenant;
  // The address space of everything the client makes on the GPUs (backend::AddressSpace):
  // unique among the daemon's clients, so that on the sim its kernels reach only its memory.
  std::uint64_t addressSpace = 0;
  std::chrono::steady_clock::time_point connectedAt = std::chrono::steady_clock::now();
  std::atomic<std::uint64_t> memoryUsed{0};        // allocations and modules
  std::atomic<std::uint64_t> moduleBytes{0};       // of which modules
  std::atomic<std::uint64_t> pinnedMemoryUsed{0};  // pinned host memory (cuMemHostAlloc)
  std::atomic<std::uint64_t> kernelsLaunched{0};
  std::atomic<std::uint64_t> gpuTimeNs{0};
  // Every operation the client has queued on the GPUs and that has not finished (kernels,
  // copies, memsets, event records and waits), and the bytes the daemon holds for them (kernel
  // parameters, host data it copied in). While either is at its bound (queueFull) the daemon stops
  // taking the client's commands: its ring fills and its writes wait, and a Session.submit call
  // waits, so what the daemon keeps for one client stays bounded whatever it sends. Counted by
  // QueuedWork (server/gpu/queued_work.hpp).
  std::atomic<std::int64_t> operationsInFlight{0};
  std::atomic<std::int64_t> bytesInFlight{0};

  // Enough to keep a GPU busy through any launch burst, small enough that a client queueing work
  // behind a kernel that never ends costs the daemon a few megabytes.
  static constexpr std::int64_t kMaxOperationsInFlight = 4096;
  static constexpr std::int64_t kMaxBytesInFlight = std::int64_t{64} << 20;
  bool queueFull() const {
    return operationsInFlight.load(std::memory_order_relaxed) >= kMaxOperationsInFlight ||
           bytesInFlight.load(std::memory_order_relaxed) >= kMaxBytesInFlight;
  }
};

}  // namespace gpuproxy::server
