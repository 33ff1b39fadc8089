#pragma once
// The ledger of device memory: one MemoryCharge per allocation or loaded module, recorded in every
// count that includes it for exactly as long as it exists. Those counts are the tenant's (against
// its limit, per device), the client's (status: memory_used, module_bytes), the client's on this
// GPU (what reclamation reports) and the GPU's own (status, per device). A charge is given back
// by destruction, so whichever way an allocation or module goes (cuMemFree, its context
// destroyed, its client gone, reclaimed early) no path can forget a credit or give one twice.
// Taken and given back on the GPU's owner thread, whose counts (the GPU's, the client's on it) it
// writes; the tenant's and the client's are safe from any thread (a lock, atomics).

#include "server/gpu/client_stats.hpp"

#include <cstdint>
#include <memory>
#include <optional>

namespace gpuproxy::server {

// Where one client's charges on one GPU are recorded. The client's count on the GPU is shared
// with its GpuClient (a charge held by work under way may outlive it); the GPU's belongs to the
// GpuShard, which outlives every charge recorded in it.
struct MemoryLedger {
  std::shared_ptr<ClientStats> client;  // and its tenant
  std::uint32_t device = 0;             // daemon device index: the tenant's limit is per device
  std::shared_ptr<std::uint64_t> clientOnDevice;
  std::uint64_t* deviceTotal = nullptr;
};

class MemoryCharge {
public:
  enum class Kind : std::uint8_t { kAllocation, kModule };

  // Records `bytes` everywhere, or nothing (nullopt) when the tenant's limit on the device would
  // be passed, which the tenant counts as an OOM.
  static std::optional<MemoryCharge> take(const MemoryLedger& ledger, std::uint64_t bytes,
                                          Kind kind) {
    if (!ledger.client->tenant->tryCharge(ledger.device, bytes)) return std::nullopt;
    return MemoryCharge(ledger, bytes, kind);
  }

  MemoryCharge(MemoryCharge&& other) noexcept
      : ledger_(other.ledger_), bytes_(other.bytes_), kind_(other.kind_) {
    other.ledger_.client.reset();
  }
  MemoryCharge& operator=(MemoryCharge&&) = delete;
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;
  ~MemoryCharge() {
    if (!ledger_.client) return;
    ledger_.client->tenant->credit(ledger_.device, bytes_);
    ledger_.client->memoryUsed -= bytes_;
    if (kind_ == Kind::kModule) ledger_.client->moduleBytes -= bytes_;
    *ledger_.clientOnDevice -= bytes_;
    *ledger_.deviceTotal -= bytes_;
  }

  std::uint64_t bytes() const { return bytes_; }

private:
  MemoryCharge(const MemoryLedger& ledger, std::uint64_t bytes, Kind kind)
      : ledger_(ledger), bytes_(bytes), kind_(kind) {
    ledger_.client->memoryUsed += bytes_;
    if (kind_ == Kind::kModule) ledger_.client->moduleBytes += bytes_;
    *ledger_.clientOnDevice += bytes_;
    *ledger_.deviceTotal += bytes_;
  }

  MemoryLedger ledger_;
  std::uint64_t bytes_;
  Kind kind_;
};

}  // namespace gpuproxy::server
