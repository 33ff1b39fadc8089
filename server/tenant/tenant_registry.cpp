#include "server/tenant/tenant_registry.hpp"

#include <stdexcept>

namespace gpuproxy::server {

std::shared_ptr<Tenant> TenantRegistry::add(TenantDefinition definition) {
  if (byName_.count(definition.name) != 0) {
    throw std::invalid_argument("a tenant named '" + definition.name + "' exists");
  }
  auto tenant = std::make_shared<Tenant>(nextId_++, std::move(definition));
  byName_.emplace(tenant->name(), tenant);
  return tenant;
}

std::shared_ptr<Tenant> TenantRegistry::remove(std::string_view name) {
  auto found = byName_.find(name);
  if (found == byName_.end()) return nullptr;
  std::shared_ptr<Tenant> tenant = std::move(found->second);
  byName_.erase(found);
  return tenant;
}

std::shared_ptr<Tenant> TenantRegistry::find(std::string_view name) const {
  auto found = byName_.find(name);
  return found == byName_.end() ? nullptr : found->second;
}

std::shared_ptr<Tenant> TenantRegistry::find(TenantId id) const {
  for (const auto& [name, tenant] : byName_) {
    if (tenant->id() == id) return tenant;
  }
  return nullptr;
}

}  // namespace gpuproxy::server
