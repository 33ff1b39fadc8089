#pragma once
// The tenants file (gpuproxyd --config FILE), YAML:
//
//   tenants:
//     - name: team-a
//       socket: /run/gpuproxy/tenants/team-a/gpuproxy.sock
//       memory_limit: 4GiB        # per device; omitted = no limit
//       weight: 2                 # best-effort share, default 1
//       class: best-effort        # or latency-critical
//       devices: [0]              # default: all
//       pinned_memory_limit: 1GiB # pinned host memory; omitted = no limit
//       max_connections: 64       # default: gpuproxyd --max-connections-per-tenant
//       max_streams: 8192         # also max_contexts, max_events, max_modules
//                                 # (defaults: kDefaultMaxObjects in tenant.hpp)
//
// A tenant named `default` may omit `socket`: it then serves the daemon's main --socket. Without
// one, the main socket serves an implicit `default` tenant with no limit, unless a named tenant
// listens on the main socket.

#include "server/tenant/tenant.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace gpuproxy::server {

inline constexpr const char* kDefaultTenantName = "default";
// A tenant's best-effort weight lies in [1, kMaxTenantWeight].
inline constexpr std::uint32_t kMaxTenantWeight = 10000;
// The most connections a tenant's own limit may allow.
inline constexpr std::uint32_t kMaxTenantConnections = 65536;

// Letters, digits, '-', '_' and '.', at most 64 characters.
bool isValidTenantName(const std::string& name);

// Why a tenants file was refused, in one line an operator can act on.
class TenantConfigError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct TenantConfig {
  // Includes the default tenant, unless a named tenant has the main socket.
  std::vector<TenantDefinition> tenants;
};

// `mainSocket` is the daemon's --socket; `deviceCount` bounds `devices`. Throws TenantConfigError.
TenantConfig parseTenantConfig(const std::string& yaml, const std::string& mainSocket,
                               std::uint32_t deviceCount);
TenantConfig loadTenantConfig(const std::string& path, const std::string& mainSocket,
                              std::uint32_t deviceCount);
// The configuration without a file: only the unlimited default tenant on the main socket.
TenantConfig defaultTenantConfig(const std::string& mainSocket);

}  // namespace gpuproxy::server
