#include "server/admin/admin_service.hpp"

#include "server/dispatch/stream_priority.hpp"
#include "server/gpu/gpu_messages.hpp"
#include "server/session/client_session.hpp"
#include "server/tenant/tenant_config.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace gpuproxy::server {

namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Kubernetes names are at most 253 characters; anything longer is not one.
constexpr std::size_t kMaxNameLength = 253;
constexpr std::size_t kMaxListLength = 256;

// Why `text` is not acceptable as `what`, or "" when it is.
std::string checkText(const std::string& what, capnp::Text::Reader text) {
  if (text.size() > kMaxNameLength) {
    return what + " is longer than " + std::to_string(kMaxNameLength) + " characters";
  }
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return what + " contains control characters";
    }
  }
  return "";
}

std::string checkList(const std::string& what, capnp::List<capnp::Text>::Reader list) {
  if (list.size() > kMaxListLength) {
    return what + " has more than " + std::to_string(kMaxListLength) + " entries";
  }
  for (auto entry : list) {
    if (auto error = checkText(what, entry); !error.empty()) return error;
  }
  return "";
}

void setPodReference(protocol::PodReference::Builder out, const PodReference& pod) {
  out.setPodNamespace(pod.podNamespace);
  out.setPodName(pod.podName);
  auto containers = out.initContainers(static_cast<unsigned>(pod.containers.size()));
  for (unsigned i = 0; i < pod.containers.size(); ++i) containers.set(i, pod.containers[i]);
}

}  // namespace

std::optional<TenantClass> tenantClassFromWire(protocol::TenantClass wire) {
  switch (wire) {
    case protocol::TenantClass::BEST_EFFORT:
      return TenantClass::kBestEffort;
    case protocol::TenantClass::LATENCY_CRITICAL:
      return TenantClass::kLatencyCritical;
  }
  return std::nullopt;
}

kj::Promise<void> fillDaemonStatus(const AdminView& view, protocol::DaemonStatus::Builder status,
                                   const TenantControl* tenantControl) {
  // Each GPU's part is a value its own thread takes: a GPU busy elsewhere delays only this call.
  kj::Vector<kj::Promise<GpuStatus>> asked;
  for (const auto& gpu : view.gpus) {
    asked.add(onGpu(*gpu, [](GpuShard& gpu) { return gpu.status(); }));
  }
  return kj::joinPromises(asked.releaseAsArray())
      .then([&view, status, tenantControl](kj::Array<GpuStatus> gpus) mutable {
        fillDaemonStatus(view, gpus, status, tenantControl);
      });
}

void fillDaemonStatus(const AdminView& view, kj::ArrayPtr<const GpuStatus> gpus,
                      protocol::DaemonStatus::Builder status, const TenantControl* tenantControl) {
  status.setBackend(view.facts.backendName);
  status.setVersion(GPUPROXY_VERSION);
  status.setPid(static_cast<std::uint32_t>(::getpid()));
  status.setUptimeSeconds(secondsSince(view.facts.startedAt));
  status.setDriverVersion(view.facts.driverVersion);
  status.setScheduler(view.facts.schedulerName);

  auto devices = status.initDevices(static_cast<unsigned>(gpus.size()));
  for (unsigned i = 0; i < gpus.size(); ++i) {
    const GpuStatus& gpu = gpus[i];
    auto device = devices[i];
    device.setIndex(gpu.index);
    device.setName(gpu.name);
    device.setMemoryTotal(gpu.memoryTotal);
    device.setComputeCapability(gpu.computeCapability);
    device.setMemoryUsed(gpu.memoryUsed);
    device.setMemoryKeptForImporters(gpu.memoryKeptForImporters);
    device.setClients(gpu.clients);
    device.setStickyError(gpu.stickyError);
    device.setFaultingClientPid(static_cast<std::uint32_t>(gpu.faultingPid));
    device.setKernelsQueued(gpu.dispatched.kernelsQueued);
    device.setKernelsInFlight(gpu.dispatched.kernelsInFlight);
    device.setBlockingCalls(gpu.blockingCalls.completed);
    device.setBlockingCallNanoseconds(gpu.blockingCalls.nanoseconds);
    device.setBlockingCallsPending(gpu.blockingCalls.pending);
    const auto setBand = [](protocol::PriorityBand::Builder out,
                            const backend::StreamPriorityRange& band) {
      out.setLeast(band.least);
      out.setGreatest(band.greatest);
    };
    setBand(device.initStreamPriorities(), gpu.streamPriorities);
    setBand(device.initLatencyCriticalPriorities(),
            dispatch::priorityBand(gpu.streamPriorities, backend::TenantClass::kLatencyCritical));
    setBand(device.initBestEffortPriorities(),
            dispatch::priorityBand(gpu.streamPriorities, backend::TenantClass::kBestEffort));
    device.setHasSmPartition(gpu.smPartition.enabled);
    if (gpu.smPartition.enabled) {
      auto out = device.initSmPartition();
      out.setTotalSms(gpu.smPartition.totalSms);
      out.setBestEffortSms(gpu.smPartition.bestEffortSms);
      out.setLatencyCriticalSms(gpu.smPartition.latencyCriticalSms);
    }
  }

  auto clients = status.initClients(static_cast<unsigned>(view.sessions.size()));
  unsigned i = 0;
  for (ClientSession* session : view.sessions) {
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
    client.setTenantId(stats.tenant->id());
    client.setPodUid(stats.identity.podUid);
    client.setContainerId(stats.identity.containerId);
    client.setCgroup(stats.identity.cgroup);
    client.setModuleBytes(stats.moduleBytes.load());
    client.setPinnedMemoryUsed(stats.pinnedMemoryUsed.load());
    client.setQueuedOperations(
        static_cast<std::uint64_t>(std::max<std::int64_t>(stats.operationsInFlight.load(), 0)));
    client.setQueuedBytes(
        static_cast<std::uint64_t>(std::max<std::int64_t>(stats.bytesInFlight.load(), 0)));
  }

  // GPU-time shares over the window, of the time all listed tenants received in it.
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  std::uint64_t windowTotal = 0;
  for (const auto& [name, tenant] : view.tenants.byName()) {
    windowTotal += tenant->recentGpuTime(now);
  }

  auto tenants = status.initTenants(static_cast<unsigned>(view.tenants.size()));
  unsigned t = 0;
  for (const auto& [name, tenant] : view.tenants.byName()) {
    auto out = tenants[t++];
    const TenantLimits& limits = tenant->limits();
    out.setName(name);
    out.setId(tenant->id());
    out.setOrigin(tenant->origin() == TenantOrigin::kRuntime ? protocol::TenantOrigin::RUNTIME
                                                             : protocol::TenantOrigin::CONFIG);
    if (!tenant->allocation().empty()) {
      auto allocation = out.initAllocation();
      allocation.setResource(tenant->allocation().resource);
      const auto& ids = tenant->allocation().deviceIds;
      auto list = allocation.initDeviceIds(static_cast<unsigned>(ids.size()));
      for (unsigned i = 0; i < ids.size(); ++i) list.set(i, ids[i]);
    }
    if (!tenant->pod().empty()) setPodReference(out.initPod(), tenant->pod());
    out.setBoundPodUid(tenant->boundPodUid().value_or(""));
    out.setConnections(tenant->connections);
    auto objects = out.initObjects(static_cast<unsigned>(kTenantObjectKinds));
    for (std::size_t kind = 0; kind < kTenantObjectKinds; ++kind) {
      const auto object = static_cast<TenantObject>(kind);
      auto entry = objects[static_cast<unsigned>(kind)];
      const std::string_view name = tenantObjectName(object);
      entry.setKind(kj::StringPtr(name.data(), name.size()));
      entry.setHeld(tenant->objectsHeld(object));
      entry.setLimit(tenant->objectLimit(object));
    }
    out.setMaxConnections(tenantControl != nullptr ? tenantControl->maxConnections(*tenant) : 0);
    out.setSocket(tenant->socketPath());
    out.setHasMemoryLimit(limits.memoryLimit.has_value());
    out.setMemoryLimit(limits.memoryLimit.value_or(0));
    out.setMemoryUsed(tenant->memoryUsed());
    auto perDevice = out.initMemoryUsedPerDevice(static_cast<unsigned>(view.gpus.size()));
    for (unsigned d = 0; d < view.gpus.size(); ++d) perDevice.set(d, tenant->memoryUsed(d));
    out.setWeight(limits.weight);
    out.setClass(limits.tenantClass == TenantClass::kLatencyCritical
                     ? protocol::TenantClass::LATENCY_CRITICAL
                     : protocol::TenantClass::BEST_EFFORT);
    std::vector<std::uint32_t> devices;
    for (std::uint32_t d = 0; d < view.gpus.size(); ++d) {
      if (tenant->mayUseDevice(d)) devices.push_back(d);
    }
    auto deviceList = out.initDevices(static_cast<unsigned>(devices.size()));
    for (unsigned d = 0; d < devices.size(); ++d) deviceList.set(d, devices[d]);
    out.setClients(tenant->clients);
    out.setKernelsLaunched(tenant->kernelsLaunched.load());
    out.setGpuTimeNs(tenant->gpuTimeNs.load());
    out.setOomCount(tenant->oomCount.load());
    const std::uint64_t recent = tenant->recentGpuTime(now);
    out.setGpuTimeNs10s(recent);
    out.setGpuShare10s(
        windowTotal == 0 ? 0.0 : static_cast<double>(recent) / static_cast<double>(windowTotal));
    out.setPinnedMemoryUsed(tenant->pinnedMemoryUsed());
    out.setHasPinnedMemoryLimit(limits.pinnedMemoryLimit.has_value());
    out.setPinnedMemoryLimit(limits.pinnedMemoryLimit.value_or(0));
  }
}

kj::Promise<void> AdminService::status(StatusContext context) {
  return fillDaemonStatus(view_, context.getResults().initStatus(), &tenants_);
}

namespace {

// Why `update` cannot be applied to `limits`, or "" after applying it.
std::string applyUpdate(protocol::TenantLimitsUpdate::Reader update, TenantLimits& limits) {
  if (update.getHasMemoryLimit() && update.getClearMemoryLimit()) {
    return "the memory limit cannot be set and cleared in one request";
  }
  if (update.getHasPinnedMemoryLimit() && update.getClearPinnedMemoryLimit()) {
    return "the pinned memory limit cannot be set and cleared in one request";
  }
  if (!update.getHasMemoryLimit() && !update.getClearMemoryLimit() &&
      !update.getHasPinnedMemoryLimit() && !update.getClearPinnedMemoryLimit() &&
      !update.getHasWeight() && !update.getHasClass()) {
    return "the request changes nothing";
  }
  if (update.getHasWeight() && (update.getWeight() < 1 || update.getWeight() > kMaxTenantWeight)) {
    return "weight must be between 1 and " + std::to_string(kMaxTenantWeight);
  }
  std::optional<TenantClass> tenantClass;
  if (update.getHasClass()) {
    tenantClass = tenantClassFromWire(update.getClass());
    if (!tenantClass) {
      return "class " + std::to_string(static_cast<unsigned>(update.getClass())) +
             " is neither best-effort nor latency-critical";
    }
  }
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
  if (update.getHasWeight()) limits.weight = update.getWeight();
  if (tenantClass) limits.tenantClass = *tenantClass;
  return "";
}

// The tenant `spec` describes, or why it describes none.
std::variant<TenantDefinition, std::string> definitionOf(protocol::TenantSpec::Reader spec) {
  TenantDefinition definition;
  if (auto error = checkText("the tenant name", spec.getName()); !error.empty()) return error;
  definition.name = spec.getName();
  if (spec.getSocketDirectory().size() > 4096)
    return std::string("the socket directory is too long");
  definition.socketPath = spec.getSocketDirectory();
  TenantLimits& limits = definition.limits;
  if (spec.getHasMemoryLimit()) limits.memoryLimit = spec.getMemoryLimit();
  if (spec.getHasPinnedMemoryLimit()) limits.pinnedMemoryLimit = spec.getPinnedMemoryLimit();
  limits.weight = spec.getWeight() == 0 ? 1 : spec.getWeight();
  auto tenantClass = tenantClassFromWire(spec.getClass());
  if (!tenantClass) {
    return "class " + std::to_string(static_cast<unsigned>(spec.getClass())) +
           " is neither best-effort nor latency-critical";
  }
  limits.tenantClass = *tenantClass;
  if (spec.getHasDevices()) {
    if (spec.getDevices().size() > kMaxListLength) return std::string("too many devices");
    limits.devices.emplace();
    for (auto device : spec.getDevices()) limits.devices->push_back(device);
  }
  if (spec.getMaxConnections() != 0) limits.maxConnections = spec.getMaxConnections();
  if (spec.hasAllocation()) {
    auto allocation = spec.getAllocation();
    if (auto error = checkText("the allocation's resource", allocation.getResource());
        !error.empty()) {
      return error;
    }
    if (auto error = checkList("the allocation's device ids", allocation.getDeviceIds());
        !error.empty()) {
      return error;
    }
    definition.allocation.resource = allocation.getResource();
    for (auto id : allocation.getDeviceIds()) definition.allocation.deviceIds.emplace_back(id);
    if (definition.allocation.resource.empty() && !definition.allocation.deviceIds.empty()) {
      return std::string("an allocation needs its resource name");
    }
  }
  return definition;
}

}  // namespace

kj::Promise<void> AdminService::setTenantLimits(SetTenantLimitsContext context) {
  auto params = context.getParams();
  std::string name = params.getTenant();
  std::shared_ptr<Tenant> tenant = view_.tenants.find(name);
  if (!tenant) {
    context.getResults().setError("no tenant named '" + name + "'");
    return kj::READY_NOW;
  }
  TenantLimits limits = tenant->limits();
  if (std::string error = applyUpdate(params.getUpdate(), limits); !error.empty()) {
    context.getResults().setError(error);
    return kj::READY_NOW;
  }
  tenant->setLimits(limits);
  tenants_.tenantChanged(*tenant);
  refreshTenantsOnEveryGpu(view_.gpus);
  spdlog::info(
      "tenant '{}': memory limit {}, pinned memory limit {}, weight {}, class {} (set by an "
      "operator)",
      name, limits.memoryLimit ? std::to_string(*limits.memoryLimit) + " bytes" : "none",
      limits.pinnedMemoryLimit ? std::to_string(*limits.pinnedMemoryLimit) + " bytes" : "none",
      limits.weight, tenantClassName(limits.tenantClass));
  return kj::READY_NOW;
}

kj::Promise<void> AdminService::evict(EvictContext context) {
  const std::uint32_t requested = context.getParams().getPid();
  if (requested == 0 || requested > kMaxPid) {
    context.getResults().setError(std::to_string(requested) + " is not a process id (1 to " +
                                  std::to_string(kMaxPid) + ")");
    return kj::READY_NOW;
  }
  auto pid = static_cast<pid_t>(requested);
  std::uint32_t ended = view_.connections.end(pid);
  context.getResults().setEvicted(ended);
  if (ended == 0) {
    context.getResults().setError("no client with pid " + std::to_string(pid));
  } else {
    spdlog::info("evicting pid {} on an operator's request", pid);
  }
  return kj::READY_NOW;
}

kj::Promise<void> AdminService::createTenant(CreateTenantContext context) {
  auto results = context.getResults();
  auto parsed = definitionOf(context.getParams().getSpec());
  if (auto* error = std::get_if<std::string>(&parsed)) {
    results.setError(*error);
    return kj::READY_NOW;
  }
  try {
    std::shared_ptr<Tenant> tenant =
        tenants_.createTenant(std::move(std::get<TenantDefinition>(parsed)));
    results.setId(tenant->id());
    results.setSocket(tenant->socketPath());
    refreshTenantsOnEveryGpu(view_.gpus);
  } catch (const TenantError& error) {
    spdlog::warn("refused to create a tenant: {}", error.what());
    results.setError(error.what());
  }
  return kj::READY_NOW;
}

kj::Promise<void> AdminService::removeTenant(RemoveTenantContext context) {
  auto results = context.getResults();
  try {
    results.setConnectionsEnded(tenants_.removeTenant(context.getParams().getName().cStr()));
  } catch (const TenantError& error) {
    results.setError(error.what());
  }
  return kj::READY_NOW;
}

kj::Promise<void> AdminService::setTenantPod(SetTenantPodContext context) {
  auto params = context.getParams();
  auto results = context.getResults();
  std::shared_ptr<Tenant> tenant = view_.tenants.find(params.getName().cStr());
  if (!tenant) {
    results.setError("no tenant named '" + std::string(params.getName().cStr()) + "'");
    return kj::READY_NOW;
  }
  auto pod = params.getPod();
  for (const auto& error : {checkText("the namespace", pod.getPodNamespace()),
                            checkText("the pod name", pod.getPodName()),
                            checkList("the container names", pod.getContainers())}) {
    if (!error.empty()) {
      results.setError(error);
      return kj::READY_NOW;
    }
  }
  PodReference reference;
  if (pod.getPodName().size() > 0) {
    reference.podNamespace = pod.getPodNamespace();
    reference.podName = pod.getPodName();
    for (auto container : pod.getContainers()) reference.containers.emplace_back(container);
  }
  if (!(reference == tenant->pod())) {
    if (reference.empty()) {
      spdlog::info("tenant '{}' (id {}): no pod holds it any more", tenant->name(), tenant->id());
    } else {
      spdlog::info("tenant '{}' (id {}) is held by pod {}/{}", tenant->name(), tenant->id(),
                   reference.podNamespace, reference.podName);
    }
    tenant->setPod(std::move(reference));
    tenants_.tenantChanged(*tenant);
  }
  return kj::READY_NOW;
}

}  // namespace gpuproxy::server
