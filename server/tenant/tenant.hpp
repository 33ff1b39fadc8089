#pragma once
// A tenant: the unit of limits (docs/architecture.md §5). Every client is the tenant of the socket
// it connected through; nothing the client sends or has in its environment changes that. A
// tenant's memory limit applies per device and is summed over all of its clients; the daemon
// charges every allocation and module before anything reaches the device.
//
// Threading: what the GPUs use (its limits, the memory and object ledger, the recent GPU time) is
// safe from any thread, so that each GPU's owner may charge and credit a tenant that has clients
// on other GPUs too: one lock, held only for the arithmetic. The kernel counters are atomics
// updated from backend threads. The rest (its pod, its socket, the counts of clients and
// connections) belongs to the daemon's main thread. Shared (std::shared_ptr) between the
// registry and every client session of the tenant, because a tenant removed by a config reload
// lives on until its last client has gone.
//
// Every tenant has an id the daemon gives it when it is created (TenantRegistry) and never gives
// another tenant while it runs: status and metrics name tenants by it, and a tenant removed and
// created again under the same name is a different tenant.

#include "scheduler/tenant_class.hpp"
#include "server/tenant/gpu_time_window.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuproxy::server {

using scheduler::TenantClass;

using TenantId = std::uint32_t;

// Where a tenant comes from: the tenants file (a reload adds, changes and removes these) or the
// admin interface at run time (gpuproxyctl, the device plugin; only the admin interface removes
// these).
enum class TenantOrigin { kConfig, kRuntime };

// The Kubernetes allocation a run-time tenant was made for by the device plugin: the extended
// resource and the device ids the kubelet allocated. Empty for every other tenant.
struct AllocationIdentity {
  std::string resource;
  std::vector<std::string> deviceIds;
  bool empty() const { return resource.empty(); }
};

// Which pod holds an allocation, in Kubernetes' names (the device plugin learns them from the
// kubelet's PodResources API after the kubelet allocated the devices).
struct PodReference {
  std::string podNamespace;
  std::string podName;
  std::vector<std::string> containers;
  bool empty() const { return podName.empty(); }
  bool operator==(const PodReference&) const = default;
};

// Driver objects a tenant's processes hold, each kind capped per tenant: every one costs the
// daemon memory and the device bookkeeping, and one tenant's hundred thousand idle streams must
// not slow the others down. Past its cap, creating one fails with CUDA_ERROR_OUT_OF_MEMORY, as
// the driver fails when it runs out of resources for one.
enum class TenantObject : std::uint8_t { kContext, kStream, kEvent, kModule };
inline constexpr std::size_t kTenantObjectKinds = 4;
// The caps when the tenants file sets none: far above what real programs make (a
// multi-threaded program keeps a few streams per thread), far below what hurts the node.
inline constexpr std::array<std::uint32_t, kTenantObjectKinds> kDefaultMaxObjects = {
    256,    // contexts
    8192,   // streams
    65536,  // events
    4096,   // modules
};
inline constexpr std::uint32_t kMaxObjectLimit = 1'000'000;
// "contexts", "streams", "events", "modules" (status keys; `max_<name>` in the tenants file).
std::string_view tenantObjectName(TenantObject kind);

struct TenantLimits {
  std::optional<std::uint64_t> memoryLimit;  // bytes per device; nullopt = no limit
  std::uint32_t weight = 1;                  // best-effort share
  TenantClass tenantClass = TenantClass::kBestEffort;
  std::optional<std::vector<std::uint32_t>> devices;  // nullopt = every device
  std::optional<std::uint64_t> pinnedMemoryLimit;     // pinned host bytes; nullopt = no limit
  // Connections the tenant may hold open at once (each carries at most one session); nullopt =
  // the daemon's default (--max-connections-per-tenant).
  std::optional<std::uint32_t> maxConnections{};
  // Per TenantObject; nullopt = kDefaultMaxObjects.
  std::array<std::optional<std::uint32_t>, kTenantObjectKinds> maxObjects{};
};

struct TenantDefinition {
  std::string name;
  std::string socketPath;
  TenantLimits limits;
  TenantOrigin origin = TenantOrigin::kConfig;
  AllocationIdentity allocation{};
};

class Tenant {
public:
  Tenant(TenantId id, TenantDefinition definition) : id_(id), definition_(std::move(definition)) {}

  TenantId id() const { return id_; }
  TenantOrigin origin() const { return definition_.origin; }
  const AllocationIdentity& allocation() const { return definition_.allocation; }
  const std::string& name() const { return definition_.name; }
  const std::string& socketPath() const { return definition_.socketPath; }
  // A copy: a reload may change the limits while another thread reads them.
  TenantLimits limits() const;
  void setLimits(TenantLimits limits);
  // What the schedulers read of the limits at every launch, without copying them all.
  struct SchedulingTerms {
    std::uint32_t weight = 1;
    TenantClass tenantClass = TenantClass::kBestEffort;
  };
  SchedulingTerms schedulingTerms() const;
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
  std::uint64_t pinnedMemoryUsed() const;

  // One more driver object of `kind` if that stays within the tenant's cap; otherwise false
  // (logged once per burst by the caller's refusal). Held through TenantObjectHold.
  bool tryTakeObject(TenantObject kind);
  void giveBackObject(TenantObject kind);
  std::uint32_t objectsHeld(TenantObject kind) const;
  std::uint32_t objectLimit(TenantObject kind) const;

  // Measured GPU time of its kernels, recent seconds only (GpuTimeWindow): the dispatchers add to
  // it when a kernel completes, status reads it.
  void addGpuTime(std::int64_t now, std::uint64_t nanoseconds);
  std::uint64_t recentGpuTime(std::int64_t now) const;

  // The pod holding the tenant's allocation, as the device plugin last reported it.
  const PodReference& pod() const { return pod_; }
  void setPod(PodReference pod) { pod_ = std::move(pod); }
  // The pod UID an allocation's socket is bound to: the first pod a client of it came from
  // (nullopt before). Clients from any other pod are refused.
  const std::optional<std::string>& boundPodUid() const { return boundPodUid_; }
  void bindPodUid(std::string podUid) { boundPodUid_ = std::move(podUid); }

  std::uint32_t clients = 0;      // live sessions
  std::uint32_t connections = 0;  // open connections on its socket, attached or not
  std::atomic<std::uint64_t> kernelsLaunched{0};
  std::atomic<std::uint64_t> gpuTimeNs{0};
  std::atomic<std::uint64_t> oomCount{0};

private:
  std::uint32_t objectLimitLocked(TenantObject kind) const;

  TenantId id_;
  // Guards the limits (definition_.limits), the ledger below and the GPU time window.
  mutable std::mutex mutex_;
  TenantDefinition definition_;
  PodReference pod_;
  std::optional<std::string> boundPodUid_;
  std::map<std::uint32_t, std::uint64_t> memoryUsed_;
  std::uint64_t pinnedMemoryUsed_ = 0;
  std::array<std::uint32_t, kTenantObjectKinds> objectsHeld_{};
  GpuTimeWindow gpuTimeWindow_;
};

// Bytes charged to a tenant's memory limit on one device for as long as this lives (what the
// daemon holds for it that is not an allocation yet: a module image being uploaded).
class TenantMemoryHold {
public:
  // nullopt when the charge would pass the tenant's limit (counted as an OOM).
  static std::optional<TenantMemoryHold> take(std::shared_ptr<Tenant> tenant, std::uint32_t device,
                                              std::uint64_t bytes) {
    if (!tenant->tryCharge(device, bytes)) return std::nullopt;
    return TenantMemoryHold(std::move(tenant), device, bytes);
  }
  TenantMemoryHold(TenantMemoryHold&& other) noexcept = default;
  TenantMemoryHold& operator=(TenantMemoryHold&&) = delete;
  ~TenantMemoryHold() {
    if (tenant_) tenant_->credit(device_, bytes_);
  }

private:
  TenantMemoryHold(std::shared_ptr<Tenant> tenant, std::uint32_t device, std::uint64_t bytes)
      : tenant_(std::move(tenant)), device_(device), bytes_(bytes) {}

  std::shared_ptr<Tenant> tenant_;
  std::uint32_t device_ = 0;
  std::uint64_t bytes_ = 0;
};

// One driver object of a tenant's, counted against its cap for as long as this lives: the client
// keeps it next to the object, so every way an object goes (destroyed, its context destroyed,
// its client gone) gives it back.
class TenantObjectHold {
public:
  // nullopt when the tenant is at its cap for `kind`.
  static std::optional<TenantObjectHold> take(std::shared_ptr<Tenant> tenant, TenantObject kind) {
    if (!tenant->tryTakeObject(kind)) return std::nullopt;
    return TenantObjectHold(std::move(tenant), kind);
  }
  TenantObjectHold() = default;
  TenantObjectHold(TenantObjectHold&& other) noexcept = default;
  TenantObjectHold& operator=(TenantObjectHold&& other) noexcept {
    release();
    tenant_ = std::move(other.tenant_);
    kind_ = other.kind_;
    return *this;
  }
  ~TenantObjectHold() { release(); }

private:
  TenantObjectHold(std::shared_ptr<Tenant> tenant, TenantObject kind)
      : tenant_(std::move(tenant)), kind_(kind) {}
  void release() {
    if (tenant_) tenant_->giveBackObject(kind_);
    tenant_.reset();
  }

  std::shared_ptr<Tenant> tenant_;
  TenantObject kind_ = TenantObject::kContext;
};

using scheduler::parseTenantClass;
using scheduler::tenantClassName;

}  // namespace gpuproxy::server
