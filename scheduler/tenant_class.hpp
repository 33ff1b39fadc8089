#pragma once
// A tenant's class: how its kernels share a GPU with other tenants' (scheduler.hpp), which stream
// priorities its streams get, and, with an SM partition, which SMs they may use. The one
// definition of the class and of its spelling in configuration files, logs and gpuproxyctl.

#include <cstdint>
#include <optional>
#include <string_view>

namespace gpuproxy::scheduler {

enum class TenantClass : std::uint8_t {
  kBestEffort,       // shares the GPU with other best-effort tenants by weight
  kLatencyCritical,  // strict priority over best-effort work
};

// "best-effort" or "latency-critical".
inline const char* tenantClassName(TenantClass tenantClass) {
  return tenantClass == TenantClass::kLatencyCritical ? "latency-critical" : "best-effort";
}

inline std::optional<TenantClass> parseTenantClass(std::string_view text) {
  if (text == "best-effort") return TenantClass::kBestEffort;
  if (text == "latency-critical") return TenantClass::kLatencyCritical;
  return std::nullopt;
}

}  // namespace gpuproxy::scheduler
