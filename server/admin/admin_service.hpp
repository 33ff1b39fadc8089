#pragma once
// The admin plane: what gpuproxyctl asks on the admin socket.

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "server/session/server_state.hpp"

namespace gpuproxy::server {

class AdminService final : public protocol::Admin::Server {
public:
  explicit AdminService(ServerState& state) : state_(state) {}

protected:
  // gpuproxy::protocol::Admin
  kj::Promise<void> status(StatusContext context) override;
  kj::Promise<void> setTenantLimits(SetTenantLimitsContext context) override;
  kj::Promise<void> evict(EvictContext context) override;

private:
  ServerState& state_;
};

// Fills `status` from the daemon's live state (also used by tests and the demo's logs).
void fillDaemonStatus(ServerState& state, protocol::DaemonStatus::Builder status);

}  // namespace gpuproxy::server
