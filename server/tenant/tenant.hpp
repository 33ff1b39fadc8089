#pragma once
// A tenant: the unit of limits (DESIGN §5). Every client is the tenant of the socket it connected
// through; nothing the client sends or has in its environment changes that. A tenant's memory
// limit applies per device and is summed over all of its clients; the daemon charges every
// allocation and module before anything reaches the device.
//
// Threading: limits and memory accounting are used on the control-plane thread only; the kernel
// counters are updated from backend threads (atomics). Shared (std::shared_ptr) between the
// registry and every client session of the tenant, because a tenant removed by a config reload
// lives on until its last client has gone.

#include "scheduler/tenant_class.hpp"
#include "server/tenant/gpu_time_window.hpp"

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gpuproxy::server {

using scheduler::TenantClass;

struct TenantLimits {
  std::optional<std::uint64_t> memoryLimit;  // bytes per device; nullopt = no limit
  std::uint32_t weight = 1;                  // best-effort share
  TenantClass tenantClass = TenantClass::kBestEffort;
  std::optional<std::vector<std::uint32_t>> devices;  // nullopt = every device
  std::optional<std::uint64_t> pinnedMemoryLimit;     // pinned host bytes; nullopt = no limit
};

struct TenantDefinition {
  std::string name;
  std::string socketPath;
  TenantLimits limits;
};

class Tenant {
public:
  explicit Tenant(TenantDefinition definition) : definition_(std::move(definition)) {}

  const std::string& name() const { return definition_.name; }
  const std::string& socketPath() const { return definition_.socketPath; }
  const TenantLimits& limits() const { return definition_.limits; }
  void setLimits(TenantLimits limits) { definition_.limits = std::move(limits); }
  void setSocketPath(std::string path) { definition_.socketPath = std::move(path); }

  bool mayUseDevice(std::uint32_t device) const;

  // Charges `bytes` on `device` if that stays within the limit; otherwise counts an OOM and
  // charges nothing.
  bool tryCharge(std::uint32_t device, std::uint64_t bytes);
  void credit(std::uint32_t device, std::uint64_t bytes);
  std::uint64_t memoryUsed(std::uint32_t device) const;
  std::uint64_t memoryUsed() const;  // summed over devices
  // What cuMemGetInfo reports for a limited tenant: (limit - used, limit), capped by what the
  // device really has free. nullopt for an unlimited tenant (the device's own figures apply).
  std::optional<std::pair<std::uint64_t, std::uint64_t>> memoryInfo(std::uint32_t device,
                                                                    std::uint64_t deviceFree) const;

  // Pinned host memory (cuMemHostAlloc), summed over all clients: charged if that stays within
  // the pinned limit, otherwise counts an OOM and charges nothing.
  bool tryChargePinned(std::uint64_t bytes);
  void creditPinned(std::uint64_t bytes);
  std::uint64_t pinnedMemoryUsed() const { return pinnedMemoryUsed_; }

  std::uint32_t clients = 0;  // live sessions
  std::atomic<std::uint64_t> kernelsLaunched{0};
  std::atomic<std::uint64_t> gpuTimeNs{0};
  std::atomic<std::uint64_t> oomCount{0};
  // Measured GPU time of its kernels, recent seconds only; the dispatchers add to it on the
  // event-loop thread when a kernel completes.
  GpuTimeWindow gpuTimeWindow;

private:
  TenantDefinition definition_;
  std::map<std::uint32_t, std::uint64_t> memoryUsed_;
  std::uint64_t pinnedMemoryUsed_ = 0;
};

using scheduler::parseTenantClass;
using scheduler::tenantClassName;

}  // namespace gpuproxy::server
