#include "server/admin/admin_service.hpp"

#include "server/dispatch/stream_priority.hpp"
#include "server/session/client_session.hpp"

#include <spdlog/spdlog.h>
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
  status.setScheduler(state.schedulerName);

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
    const dispatch::DispatchStats dispatched = gpu.dispatcher().stats();
    device.setKernelsQueued(dispatched.kernelsQueued);
    device.setKernelsInFlight(dispatched.kernelsInFlight);
    const backend::StreamPriorityRange range = gpu.dispatcher().streamPriorityRange();
    const auto setBand = [](protocol::PriorityBand::Builder out,
                            const backend::StreamPriorityRange& band) {
      out.setLeast(band.least);
      out.setGreatest(band.greatest);
    };
    setBand(device.initStreamPriorities(), range);
    setBand(device.initLatencyCriticalPriorities(),
            dispatch::priorityBand(range, backend::TenantClass::kLatencyCritical));
    setBand(device.initBestEffortPriorities(),
            dispatch::priorityBand(range, backend::TenantClass::kBestEffort));
    const backend::SmPartition partition = gpu.dispatcher().smPartition();
    device.setHasSmPartition(partition.enabled);
    if (partition.enabled) {
      auto out = device.initSmPartition();
      out.setTotalSms(partition.totalSms);
      out.setBestEffortSms(partition.bestEffortSms);
      out.setLatencyCriticalSms(partition.latencyCriticalSms);
    }
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
    client.setTenant(stats.tenant->name());
    client.setCgroup(stats.identity.cgroup);
    client.setModuleBytes(stats.moduleBytes.load());
    client.setPinnedMemoryUsed(stats.pinnedMemoryUsed.load());
  }

  // GPU-time shares over the window, of the time all listed tenants received in it.
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  std::uint64_t windowTotal = 0;
  for (const auto& [name, tenant] : state.tenants) windowTotal += tenant->gpuTimeWindow.total(now);

  auto tenants = status.initTenants(static_cast<unsigned>(state.tenants.size()));
  unsigned t = 0;
  for (const auto& [name, tenant] : state.tenants) {
    auto out = tenants[t++];
    const TenantLimits& limits = tenant->limits();
    out.setName(name);
    out.setSocket(tenant->socketPath());
    out.setHasMemoryLimit(limits.memoryLimit.has_value());
    out.setMemoryLimit(limits.memoryLimit.value_or(0));
    out.setMemoryUsed(tenant->memoryUsed());
    auto perDevice = out.initMemoryUsedPerDevice(static_cast<unsigned>(state.gpus.size()));
    for (unsigned d = 0; d < state.gpus.size(); ++d) perDevice.set(d, tenant->memoryUsed(d));
    out.setWeight(limits.weight);
    out.setClass(limits.tenantClass == TenantClass::kLatencyCritical
                     ? protocol::TenantClass::LATENCY_CRITICAL
                     : protocol::TenantClass::BEST_EFFORT);
    std::vector<std::uint32_t> devices;
    for (std::uint32_t d = 0; d < state.gpus.size(); ++d) {
      if (tenant->mayUseDevice(d)) devices.push_back(d);
    }
    auto deviceList = out.initDevices(static_cast<unsigned>(devices.size()));
    for (unsigned d = 0; d < devices.size(); ++d) deviceList.set(d, devices[d]);
    out.setClients(tenant->clients);
    out.setKernelsLaunched(tenant->kernelsLaunched.load());
    out.setGpuTimeNs(tenant->gpuTimeNs.load());
    out.setOomCount(tenant->oomCount.load());
    const std::uint64_t recent = tenant->gpuTimeWindow.total(now);
    out.setGpuTimeNs10s(recent);
    out.setGpuShare10s(
        windowTotal == 0 ? 0.0 : static_cast<double>(recent) / static_cast<double>(windowTotal));
    out.setPinnedMemoryUsed(tenant->pinnedMemoryUsed());
    out.setHasPinnedMemoryLimit(limits.pinnedMemoryLimit.has_value());
    out.setPinnedMemoryLimit(limits.pinnedMemoryLimit.value_or(0));
  }
}

kj::Promise<void> AdminService::status(StatusContext context) {
  fillDaemonStatus(state_, context.getResults().initStatus());
  return kj::READY_NOW;
}

kj::Promise<void> AdminService::setTenantLimits(SetTenantLimitsContext context) {
  auto params = context.getParams();
  std::string name = params.getTenant();
  auto found = state_.tenants.find(name);
  if (found == state_.tenants.end()) {
    context.getResults().setError("no tenant named '" + name + "'");
    return kj::READY_NOW;
  }
  auto update = params.getUpdate();
  TenantLimits limits = found->second->limits();
  if (update.getClearMemoryLimit()) {
    limits.memoryLimit.reset();
  } else if (update.getHasMemoryLimit()) {
    limits.memoryLimit = update.getMemoryLimit();
  }
  if (update.getClearPinnedMemoryLimit()) {
    limits.pinnedMemoryLimit.reset();
  } else if (update.getHasPinnedMemoryLimit()) {
    limits.pinnedMemoryLimit = update.getPinnedMemoryLimit();
  }
  if (update.getHasWeight()) {
    if (update.getWeight() < 1 || update.getWeight() > 10000) {
      context.getResults().setError("weight must be between 1 and 10000");
      return kj::READY_NOW;
    }
    limits.weight = update.getWeight();
  }
  if (update.getHasClass()) {
    limits.tenantClass = update.getClass() == protocol::TenantClass::LATENCY_CRITICAL
                             ? TenantClass::kLatencyCritical
                             : TenantClass::kBestEffort;
  }
  found->second->setLimits(limits);
  for (auto& gpu : state_.gpus) gpu->dispatcher().refreshTenants();
  spdlog::info(
      "tenant '{}': memory limit {}, pinned memory limit {}, weight {}, class {} (set by an "
      "operator)",
      name, limits.memoryLimit ? std::to_string(*limits.memoryLimit) + " bytes" : "none",
      limits.pinnedMemoryLimit ? std::to_string(*limits.pinnedMemoryLimit) + " bytes" : "none",
      limits.weight, tenantClassName(limits.tenantClass));
  return kj::READY_NOW;
}

kj::Promise<void> AdminService::evict(EvictContext context) {
  auto pid = static_cast<pid_t>(context.getParams().getPid());
  std::uint32_t ended = state_.connections.end(pid);
  context.getResults().setEvicted(ended);
  if (ended == 0) {
    context.getResults().setError("no client with pid " + std::to_string(pid));
  } else {
    spdlog::info("evicting pid {} on an operator's request", pid);
  }
  return kj::READY_NOW;
}

}  // namespace gpuproxy::server
