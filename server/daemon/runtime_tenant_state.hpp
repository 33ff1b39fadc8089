#pragma once
// What outlives gpuproxyd (--state-dir): its run-time tenants, those made through the admin
// interface (gpuproxyctl create-tenant, the Kubernetes device plugin's allocations). A restarted
// daemon serves them again at the same sockets, with the same limits and the same pod binding, so
// that pods, which hold those socket directories as mounts, reach it again. One JSON file,
// replaced whole (write, fsync, rename) at every change, so a crash leaves the old or the new.

#include "server/tenant/tenant.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuproxy::server {

// The file in the state directory.
inline constexpr std::string_view kRuntimeTenantsFile = "runtime-tenants.json";

struct SavedTenant {
  // As TenantControl::createTenant takes it: socketPath is the socket's directory.
  TenantDefinition definition;
  std::optional<std::string> boundPodUid;
  PodReference pod;
};

std::string encodeRuntimeTenants(const std::vector<SavedTenant>& tenants);
// Throws std::runtime_error saying what is wrong with `text`; an entry is all there or refused.
std::vector<SavedTenant> decodeRuntimeTenants(std::string_view text);

// Replaces `path` with `text` (a temporary file beside it, fsync, rename). Throws
// std::runtime_error with the reason.
void replaceFile(const std::string& path, std::string_view text);

}  // namespace gpuproxy::server
