#include "server/admin/admin_service.hpp"

#include "server/session/client_session.hpp"

#include <unistd.h>

#include <chrono>
#include <vector>

namespace gpuproxy::server {

namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void fillDaemonStatus(ServerState& state, protocol::DaemonStatus::Builder status) {
  status.setBackend(state.backendName);
  status.setVersion(GPUPROXY_VERSION);
  status.setPid(static_cast<std::uint32_t>(::getpid()));
  status.setUptimeSeconds(secondsSince(state.startedAt));
  status.setDriverVersion(state.driverVersion);

  auto devices = status.initDevices(static_cast<unsigned>(state.gpus.size()));
  for (unsigned i = 0; i < state.gpus.size(); ++i) {
    GpuWorker& gpu = *state.gpus[i];
    auto device = devices[i];
    device.setIndex(gpu.index());
    device.setName(gpu.properties().name);
    device.setMemoryTotal(gpu.properties().totalMemory);
    device.setMemoryUsed(gpu.memoryUsed());
    device.setClients(static_cast<std::uint32_t>(gpu.clientCount()));
    device.setStickyError(gpu.stickyError());
    device.setFaultingClientPid(static_cast<std::uint32_t>(gpu.faultingPid()));
  }

  auto clients = status.initClients(static_cast<unsigned>(state.sessions.size()));
  unsigned i = 0;
  for (ClientSession* session : state.sessions) {
    const ClientStats& stats = session->stats();
    auto client = clients[i++];
    client.setPid(static_cast<std::uint32_t>(stats.identity.pid));
    client.setUid(stats.identity.uid);
    client.setGid(stats.identity.gid);
    client.setCommand(stats.identity.command);
    const std::vector<std::uint32_t>& used = session->devices();
    client.setDevice(used.empty() ? -1 : static_cast<std::int32_t>(used.front()));
    auto list = client.initDevices(static_cast<unsigned>(used.size()));
    for (unsigned d = 0; d < used.size(); ++d) list.set(d, used[d]);
    client.setMemoryUsed(stats.memoryUsed.load());
    client.setKernelsLaunched(stats.kernelsLaunched.load());
    client.setGpuTimeNs(stats.gpuTimeNs.load());
    client.setConnectedSeconds(secondsSince(stats.connectedAt));
  }
}

kj::Promise<void> AdminService::status(StatusContext context) {
  fillDaemonStatus(state_, context.getResults().initStatus());
  return kj::READY_NOW;
}

}  // namespace gpuproxy::server
