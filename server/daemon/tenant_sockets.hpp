#pragma once
// The tenants' listening sockets and what happens on each connection. The tenants file's tenants
// (applyConfig, at start and on SIGHUP) and tenants created at run time (TenantControl, through
// the admin interface) take the same path: a socket is opened before anything else changes, so a
// request that fails leaves the daemon, and the file system, as they were.
//
// On each connection: the peer's credentials (SO_PEERCRED), pinned with a pidfd; the tenant's
// connection limit; then the client's Gateway. A connection ends when its socket closes, its
// process exits, an operator evicts it, or its tenant is removed.

#include "server/daemon/rpc_connection.hpp"
#include "server/session/pod_identity.hpp"
#include "server/session/session_services.hpp"
#include "server/tenant/tenant_config.hpp"
#include "server/tenant/tenant_control.hpp"
#include "server/tenant/tenant_registry.hpp"

#include <kj/async-io.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace gpuproxy::server {

// Where run-time tenants are kept across restarts (runtime_tenant_state.hpp); empty: nowhere.
struct TenantPersistence {
  std::string stateFile;
};

struct ConnectionPolicy {
  // Connections a tenant may hold open at once unless its own limit says otherwise.
  std::uint32_t maxConnectionsPerTenant = 256;
  // Paths no tenant may listen on (the admin socket).
  std::vector<std::string> reservedPaths;
};

class TenantSockets final : public TenantControl {
public:
  // Clients' sessions are made with `sessions`; `tenants` is the daemon's registry, which this
  // changes as the tenants file and the admin interface say.
  TenantSockets(kj::AsyncIoContext& io, SessionServices sessions, TenantRegistry& tenants,
                kj::TaskSet& connections, ConnectionPolicy policy,
                TenantPersistence persistence = {});
  // With persistence, run-time tenants' socket directories stay (pods mount them), and only
  // their socket files go.
  ~TenantSockets() override;
  TenantSockets(const TenantSockets&) = delete;
  TenantSockets& operator=(const TenantSockets&) = delete;

  // Makes the tenants file's tenants and their sockets what `config` says: adds, changes (limits,
  // socket) and removes them; tenants created at run time are left alone. A tenant the file no
  // longer lists stops accepting; its connected clients go on until they exit. Throws
  // std::runtime_error with the reason, and then nothing has changed.
  void applyConfig(const TenantConfig& config);
  // Serves again the run-time tenants the state file holds (after applyConfig, at start). One
  // that cannot be (its name or socket now taken, a device gone) is logged and dropped.
  void restoreRuntimeTenants();

  // TenantControl
  std::shared_ptr<Tenant> createTenant(TenantDefinition definition) override;
  std::uint32_t removeTenant(std::string_view name) override;
  std::uint32_t maxConnections(const Tenant& tenant) const override;
  void tenantChanged(const Tenant& tenant) override;

private:
  struct Listener {
    UnixListener listening;
    kj::Promise<void> loop = nullptr;
  };

  // Throws std::runtime_error when `path` is another tenant's (not `owner`'s) or reserved.
  void checkPathIsFree(const std::string& path, TenantId owner) const;
  void start(const std::shared_ptr<Tenant>& tenant, UnixListener listening);
  void stop(TenantId tenant);
  kj::Promise<void> acceptLoop(Listener& listener, std::shared_ptr<Tenant> tenant);
  void serve(kj::Own<kj::AsyncIoStream> stream, const std::shared_ptr<Tenant>& tenant);
  // Whether a client of `pod` may use `tenant`: an allocation's socket serves the first pod that
  // came through it and no other. Binds the allocation on its first pod client.
  bool admitPod(Tenant& tenant, pid_t pid, const PodIdentity& pod);
  // Writes every run-time tenant to the state file (when there is one); a failure is logged.
  void saveRuntimeTenants();
  // createTenant without writing the state file: restoring writes it once, at the end.
  std::shared_ptr<Tenant> makeRuntimeTenant(TenantDefinition definition);
  // Logs a refused connection, at most once a second per reason, so a flood cannot fill the log.
  void logRefusal(const std::string& reason, const std::string& message);

  kj::AsyncIoContext& io_;
  SessionServices sessions_;
  TenantRegistry& tenants_;
  kj::TaskSet& connections_;
  ConnectionPolicy policy_;
  TenantPersistence persistence_;
  std::map<TenantId, Listener> listeners_;
  struct Refusals {
    std::chrono::steady_clock::time_point lastLogged;
    std::uint64_t sinceLogged = 0;
  };
  std::map<std::string, Refusals> refusals_;
};

}  // namespace gpuproxy::server
