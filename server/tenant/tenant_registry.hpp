#pragma once
// The daemon's tenants, by name and by id. The registry gives each tenant its id when it is added
// (1, 2, ...; 0 is never a tenant's) and never gives that id to another tenant while the daemon
// runs, so a tenant removed and created again under the same name is told apart everywhere that
// keeps tenants apart (the dispatchers, status, metrics).
//
// It only keeps the tenants: opening and closing their sockets is the daemon's (TenantControl).
// Used on the daemon's main thread only.

#include "server/tenant/tenant.hpp"

#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace gpuproxy::server {

class TenantRegistry {
public:
  // Adds a tenant under a name no tenant has; throws std::invalid_argument otherwise.
  std::shared_ptr<Tenant> add(TenantDefinition definition);
  // Removes the tenant and returns it (null when there is none). Its clients keep it alive
  // through their own references until they are gone.
  std::shared_ptr<Tenant> remove(std::string_view name);

  std::shared_ptr<Tenant> find(std::string_view name) const;
  std::shared_ptr<Tenant> find(TenantId id) const;

  std::size_t size() const { return byName_.size(); }
  // In name order.
  const std::map<std::string, std::shared_ptr<Tenant>, std::less<>>& byName() const {
    return byName_;
  }

private:
  TenantId nextId_ = 1;
  std::map<std::string, std::shared_ptr<Tenant>, std::less<>> byName_;
};

}  // namespace gpuproxy::server
