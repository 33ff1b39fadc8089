#pragma once
// The admin plane: what gpuproxyctl and the device plugin ask on the admin socket. Every request
// is checked before anything changes; a refused one answers `error` and changes nothing.

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "server/session/session_services.hpp"
#include "server/tenant/tenant_control.hpp"
#include "server/tenant/tenant_registry.hpp"

namespace gpuproxy::server {

// What the admin plane reads and changes: everything an operator sees, the tenants, and the
// connections it may end. Each piece is the daemon's and outlives the admin service.
struct AdminView {
  const DaemonFacts& facts;
  const Gpus& gpus;
  const std::set<ClientSession*>& sessions;
  TenantRegistry& tenants;
  ConnectionRegistry& connections;
};

// The largest process id Linux hands out (PID_MAX_LIMIT on 64-bit systems).
inline constexpr std::uint32_t kMaxPid = 4194304;

class AdminService final : public protocol::Admin::Server {
public:
  AdminService(AdminView view, TenantControl& tenants) : view_(view), tenants_(tenants) {}

protected:
  // gpuproxy::protocol::Admin
  kj::Promise<void> status(StatusContext context) override;
  kj::Promise<void> setTenantLimits(SetTenantLimitsContext context) override;
  kj::Promise<void> evict(EvictContext context) override;
  kj::Promise<void> createTenant(CreateTenantContext context) override;
  kj::Promise<void> removeTenant(RemoveTenantContext context) override;
  kj::Promise<void> setTenantPod(SetTenantPodContext context) override;

private:
  AdminView view_;
  TenantControl& tenants_;
};

// Fills `status` from the daemon's live state (also used by the metrics endpoint): each GPU's
// part is a GpuStatus taken on the GPU's own thread (a message to each, joined), the rest here.
// Each tenant's connection limit comes from `tenants` (left 0 without it). `status` must live
// until the promise resolves.
kj::Promise<void> fillDaemonStatus(const AdminView& view, protocol::DaemonStatus::Builder status,
                                   const TenantControl* tenants = nullptr);
// The same, once every GPU's status has been taken (`gpus`, by daemon device index).
void fillDaemonStatus(const AdminView& view, kj::ArrayPtr<const GpuStatus> gpus,
                      protocol::DaemonStatus::Builder status,
                      const TenantControl* tenants = nullptr);

// A tenant class from the wire: nullopt for a value this daemon does not know.
std::optional<TenantClass> tenantClassFromWire(protocol::TenantClass wire);

}  // namespace gpuproxy::server
