#pragma once
// Creating and removing tenants while the daemon runs (gpuproxyctl, the Kubernetes device
// plugin), behind the admin interface. The daemon implements it, because a tenant is also a
// listening socket and the connections that came through it.

#include "server/tenant/tenant.hpp"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gpuproxy::server {

// Why a tenant could not be created or removed, in one line for the operator; nothing changed.
class TenantError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The socket every run-time tenant serves, in the directory it was given.
inline constexpr std::string_view kTenantSocketName = "gpuproxy.sock";

class TenantControl {
public:
  virtual ~TenantControl() = default;

  // Creates a run-time tenant listening on `<socketDirectory>/gpuproxy.sock` (`definition`'s
  // socketPath is the directory here; missing directories are created). Throws TenantError when
  // the name is taken or invalid, the directory is not usable, or a limit is out of range; then
  // nothing was created.
  virtual std::shared_ptr<Tenant> createTenant(TenantDefinition definition) = 0;

  // Removes a run-time tenant: its socket is closed and removed (with the directories the daemon
  // created for it), and every connection that came through it ends, so its clients' sessions are
  // reclaimed as if they had crashed. Returns how many connections were ended. Throws TenantError
  // for an unknown tenant or one from the tenants file (removed by editing the file and
  // reloading).
  virtual std::uint32_t removeTenant(std::string_view name) = 0;

  // How many connections `tenant` may hold open at once (its own limit or the daemon's default).
  virtual std::uint32_t maxConnections(const Tenant& tenant) const = 0;

  // `tenant`'s limits or pod changed (the admin interface changed them): for a run-time tenant,
  // what outlives the daemon is written again (--state-dir).
  virtual void tenantChanged(const Tenant& tenant) = 0;
};

}  // namespace gpuproxy::server
