#include "client/ctl/status_report.hpp"

#include "protocol/byte_size.hpp"
#include "protocol/cuda_result.hpp"

#include <cstdio>
#include <optional>
#include <string_view>
#include <vector>

namespace gpuproxy::client {

namespace {

// [greatest, least]: CUDA's numbers, highest priority first.
nlohmann::json bandToJson(protocol::PriorityBand::Reader band) {
  return nlohmann::json::array({band.getGreatest(), band.getLeast()});
}

std::string bandToText(protocol::PriorityBand::Reader band) {
  if (band.getGreatest() == band.getLeast()) return std::to_string(band.getGreatest());
  return std::to_string(band.getGreatest()) + ".." + std::to_string(band.getLeast());
}

std::vector<std::string> textList(capnp::List<capnp::Text>::Reader list) {
  std::vector<std::string> out;
  for (auto entry : list) out.emplace_back(entry.cStr());
  return out;
}

// {namespace, name, containers}, or null when no pod is known.
nlohmann::json podToJson(protocol::PodReference::Reader pod) {
  if (pod.getPodName().size() == 0) return nullptr;
  return {{"namespace", pod.getPodNamespace().cStr()},
          {"name", pod.getPodName().cStr()},
          {"containers", textList(pod.getContainers())}};
}

// "namespace/pod/container" (containers joined with ','), or "-".
std::string podToText(protocol::PodReference::Reader pod) {
  if (pod.getPodName().size() == 0) return "-";
  std::string text = std::string(pod.getPodNamespace().cStr()) + "/" + pod.getPodName().cStr();
  std::string containers;
  for (auto container : pod.getContainers()) {
    containers += (containers.empty() ? "" : ",") + std::string(container.cStr());
  }
  return containers.empty() ? text : text + "/" + containers;
}

nlohmann::json textOrNull(capnp::Text::Reader text) {
  return text.size() == 0 ? nlohmann::json(nullptr) : nlohmann::json(text.cStr());
}

// The tenant a client came through, by id; null when the tenant is gone.
std::optional<protocol::TenantStatus::Reader> tenantOf(protocol::DaemonStatus::Reader status,
                                                       protocol::ClientStatus::Reader client) {
  for (auto tenant : status.getTenants()) {
    if (tenant.getId() == client.getTenantId()) return tenant;
  }
  return std::nullopt;
}

}  // namespace

nlohmann::json statusToJson(protocol::DaemonStatus::Reader status) {
  nlohmann::json out;
  out["backend"] = status.getBackend().cStr();
  out["version"] = status.getVersion().cStr();
  out["pid"] = status.getPid();
  out["uptime_seconds"] = status.getUptimeSeconds();
  out["driver_version"] = status.getDriverVersion();
  out["scheduler"] = status.getScheduler().cStr();
  out["devices"] = nlohmann::json::array();
  for (auto device : status.getDevices()) {
    CUresult sticky = static_cast<CUresult>(device.getStickyError());
    out["devices"].push_back({
        {"index", device.getIndex()},
        {"name", device.getName().cStr()},
        {"memory_total", device.getMemoryTotal()},
        {"compute_capability", std::to_string(device.getComputeCapability() / 10) + "." +
                                   std::to_string(device.getComputeCapability() % 10)},
        {"memory_used", device.getMemoryUsed()},
        {"memory_kept_for_importers", device.getMemoryKeptForImporters()},
        {"clients", device.getClients()},
        {"sticky_error",
         sticky == CUDA_SUCCESS
             ? nlohmann::json(nullptr)
             : nlohmann::json(std::string(protocol::cudaResultNameOr(sticky, "unknown error")))},
        {"faulting_client_pid", device.getFaultingClientPid()},
        {"kernels_queued", device.getKernelsQueued()},
        {"kernels_in_flight", device.getKernelsInFlight()},
        {"blocking_calls",
         {{"ended", device.getBlockingCalls()},
          {"seconds", static_cast<double>(device.getBlockingCallNanoseconds()) / 1e9},
          {"pending", device.getBlockingCallsPending()}}},
        {"stream_priorities",
         {{"range", bandToJson(device.getStreamPriorities())},
          {"latency_critical", bandToJson(device.getLatencyCriticalPriorities())},
          {"best_effort", bandToJson(device.getBestEffortPriorities())}}},
        {"sm_partition",
         device.getHasSmPartition()
             ? nlohmann::json{{"total_sms", device.getSmPartition().getTotalSms()},
                              {"best_effort_sms", device.getSmPartition().getBestEffortSms()},
                              {"latency_critical_sms",
                               device.getSmPartition().getLatencyCriticalSms()}}
             : nlohmann::json(nullptr)},
    });
  }
  out["tenants"] = tenantsToJson(status.getTenants());
  out["clients"] = nlohmann::json::array();
  for (auto client : status.getClients()) {
    std::vector<std::uint32_t> devices;
    for (auto device : client.getDevices()) devices.push_back(device);
    const auto tenant = tenantOf(status, client);
    out["clients"].push_back({
        {"pid", client.getPid()},
        {"uid", client.getUid()},
        {"gid", client.getGid()},
        {"command", client.getCommand().cStr()},
        {"device",
         client.getDevice() < 0 ? nlohmann::json(nullptr) : nlohmann::json(client.getDevice())},
        {"devices", devices},
        {"memory_used", client.getMemoryUsed()},
        {"kernels_launched", client.getKernelsLaunched()},
        {"gpu_time_ns", client.getGpuTimeNs()},
        {"connected_seconds", client.getConnectedSeconds()},
        {"tenant", client.getTenant().cStr()},
        {"cgroup", client.getCgroup().cStr()},
        {"module_bytes", client.getModuleBytes()},
        {"pinned_memory_used", client.getPinnedMemoryUsed()},
        {"queued_operations", client.getQueuedOperations()},
        {"queued_bytes", client.getQueuedBytes()},
        {"tenant_id", client.getTenantId()},
        {"pod_uid", textOrNull(client.getPodUid())},
        {"container_id", textOrNull(client.getContainerId())},
        {"pod", tenant ? podToJson(tenant->getPod()) : nlohmann::json(nullptr)},
    });
  }
  return out;
}

nlohmann::json tenantsToJson(capnp::List<protocol::TenantStatus>::Reader tenants) {
  nlohmann::json out = nlohmann::json::array();
  for (auto tenant : tenants) {
    std::vector<std::uint64_t> perDevice;
    for (auto used : tenant.getMemoryUsedPerDevice()) perDevice.push_back(used);
    std::vector<std::uint32_t> devices;
    for (auto device : tenant.getDevices()) devices.push_back(device);
    nlohmann::json objects = nlohmann::json::object();
    for (auto object : tenant.getObjects()) {
      objects[object.getKind().cStr()] = {{"held", object.getHeld()}, {"limit", object.getLimit()}};
    }
    out.push_back({
        {"name", tenant.getName().cStr()},
        {"socket", tenant.getSocket().cStr()},
        {"memory_limit", tenant.getHasMemoryLimit() ? nlohmann::json(tenant.getMemoryLimit())
                                                    : nlohmann::json(nullptr)},
        {"memory_used", tenant.getMemoryUsed()},
        {"memory_used_per_device", perDevice},
        {"weight", tenant.getWeight()},
        {"class", tenant.getClass() == protocol::TenantClass::LATENCY_CRITICAL ? "latency-critical"
                                                                               : "best-effort"},
        {"devices", devices},
        {"clients", tenant.getClients()},
        {"kernels_launched", tenant.getKernelsLaunched()},
        {"gpu_time_ns", tenant.getGpuTimeNs()},
        {"oom_count", tenant.getOomCount()},
        {"gpu_time_ns_10s", tenant.getGpuTimeNs10s()},
        {"gpu_share_10s", tenant.getGpuShare10s()},
        {"pinned_memory_used", tenant.getPinnedMemoryUsed()},
        {"pinned_memory_limit", tenant.getHasPinnedMemoryLimit()
                                    ? nlohmann::json(tenant.getPinnedMemoryLimit())
                                    : nlohmann::json(nullptr)},
        {"id", tenant.getId()},
        {"origin", tenant.getOrigin() == protocol::TenantOrigin::RUNTIME ? "runtime" : "config"},
        {"allocation",
         tenant.getAllocation().getResource().size() == 0
             ? nlohmann::json(nullptr)
             : nlohmann::json{{"resource", tenant.getAllocation().getResource().cStr()},
                              {"device_ids", textList(tenant.getAllocation().getDeviceIds())}}},
        {"pod", podToJson(tenant.getPod())},
        {"bound_pod_uid", textOrNull(tenant.getBoundPodUid())},
        {"connections", tenant.getConnections()},
        {"max_connections", tenant.getMaxConnections()},
        {"objects", objects},
    });
  }
  return out;
}

namespace {

std::string format(const char* pattern, auto... values) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), pattern, values...);
  return buffer;
}

std::string formatDuration(double seconds) {
  if (seconds < 1e-3) return format("%.0f us", seconds * 1e6);
  if (seconds < 1.0) return format("%.1f ms", seconds * 1e3);
  if (seconds < 120.0) return format("%.1f s", seconds);
  return format("%.0f min", seconds / 60.0);
}

}  // namespace

std::string tenantsToTable(capnp::List<protocol::TenantStatus>::Reader tenants) {
  // A best-effort tenant's fair share of the GPU is its weight over the weights of the best-effort
  // tenants that used the GPU in the window; shown beside the share it got.
  std::uint64_t activeWeights = 0;
  for (auto tenant : tenants) {
    if (tenant.getClass() != protocol::TenantClass::LATENCY_CRITICAL &&
        tenant.getGpuTimeNs10s() > 0) {
      activeWeights += tenant.getWeight();
    }
  }
  std::string out =
      format("%-4s %-16s %-24s %-20s %-8s %-17s %-16s %-8s %-8s %-9s %-40s %s\n", "ID", "TENANT",
             "MEMORY USED / LIMIT", "PINNED USED / LIMIT", "WEIGHT", "CLASS", "GPU 10S (FAIR)",
             "CLIENTS", "OOMS", "KERNELS", "SOCKET", "POD");
  for (auto tenant : tenants) {
    std::string share = "-";
    if (tenant.getGpuTimeNs10s() > 0) {
      share = format("%.1f%%", tenant.getGpuShare10s() * 100.0);
      if (tenant.getClass() != protocol::TenantClass::LATENCY_CRITICAL && activeWeights > 0) {
        share +=
            format(" (%.1f%%)", 100.0 * tenant.getWeight() / static_cast<double>(activeWeights));
      }
    }
    std::string memory =
        protocol::formatByteSize(tenant.getMemoryUsed()) + " / " +
        (tenant.getHasMemoryLimit() ? protocol::formatByteSize(tenant.getMemoryLimit()) + "/dev"
                                    : std::string("none"));
    std::string pinned =
        protocol::formatByteSize(tenant.getPinnedMemoryUsed()) + " / " +
        (tenant.getHasPinnedMemoryLimit() ? protocol::formatByteSize(tenant.getPinnedMemoryLimit())
                                          : std::string("none"));
    out += format(
        "%-4u %-16s %-24s %-20s %-8u %-17s %-16s %-8u %-8llu %-9llu %-40s %s\n", tenant.getId(),
        tenant.getName().cStr(), memory.c_str(), pinned.c_str(), tenant.getWeight(),
        tenant.getClass() == protocol::TenantClass::LATENCY_CRITICAL ? "latency-critical"
                                                                     : "best-effort",
        share.c_str(), tenant.getClients(), static_cast<unsigned long long>(tenant.getOomCount()),
        static_cast<unsigned long long>(tenant.getKernelsLaunched()), tenant.getSocket().cStr(),
        podToText(tenant.getPod()).c_str());
  }
  return out;
}

std::string statusToTable(protocol::DaemonStatus::Reader status) {
  std::string out;
  out += format("gpuproxyd %s  backend: %s  scheduler: %s  driver: %d  pid: %u  up: %s\n",
                status.getVersion().cStr(), status.getBackend().cStr(),
                status.getScheduler().cStr(), status.getDriverVersion(), status.getPid(),
                formatDuration(status.getUptimeSeconds()).c_str());
  out += "\n";
  out += format("%-6s %-28s %-24s %-8s %s\n", "DEVICE", "NAME", "MEMORY USED / TOTAL", "CLIENTS",
                "STATE");
  for (auto device : status.getDevices()) {
    std::string memory = protocol::formatByteSize(device.getMemoryUsed()) + " / " +
                         protocol::formatByteSize(device.getMemoryTotal());
    CUresult sticky = static_cast<CUresult>(device.getStickyError());
    std::string state =
        sticky == CUDA_SUCCESS
            ? "ok"
            : format("poisoned: %s by pid %u",
                     std::string(protocol::cudaResultNameOr(sticky, "sticky error")).c_str(),
                     device.getFaultingClientPid());
    out += format("%-6u %-28s %-24s %-8u %s\n", device.getIndex(), device.getName().cStr(),
                  memory.c_str(), device.getClients(), state.c_str());
    out += format(
        "       compute capability %u.%u; stream priorities: latency-critical %s, best-effort %s "
        "(device %s)\n",
        device.getComputeCapability() / 10, device.getComputeCapability() % 10,
        bandToText(device.getLatencyCriticalPriorities()).c_str(),
        bandToText(device.getBestEffortPriorities()).c_str(),
        bandToText(device.getStreamPriorities()).c_str());
    if (device.getMemoryKeptForImporters() != 0) {
      out += format(
          "       %s of it kept for processes that opened it by interprocess handle "
          "after its exporter let go\n",
          protocol::formatByteSize(device.getMemoryKeptForImporters()).c_str());
    }
    if (device.getHasSmPartition()) {
      auto partition = device.getSmPartition();
      out += format("       SM partition: best-effort %u SMs, latency-critical %u SMs (of %u)\n",
                    partition.getBestEffortSms(), partition.getLatencyCriticalSms(),
                    partition.getTotalSms());
    }
  }
  out += "\n";
  out += tenantsToTable(status.getTenants());
  out += "\n";
  if (status.getClients().size() == 0) {
    out += "no clients attached\n";
    return out;
  }
  out += format("%-8s %-16s %-12s %-7s %-12s %-12s %-9s %-7s %-10s %-10s %-40s %s\n", "PID",
                "COMMAND", "TENANT", "DEVICE", "MEMORY", "PINNED", "KERNELS", "QUEUED", "GPU TIME",
                "CONNECTED", "POD", "CGROUP");
  for (auto client : status.getClients()) {
    std::string device = client.getDevice() < 0 ? "-" : std::to_string(client.getDevice());
    const auto tenant = tenantOf(status, client);
    std::string pod = tenant ? podToText(tenant->getPod()) : "-";
    if (pod == "-" && client.getPodUid().size() > 0) {
      pod = std::string("uid ") + client.getPodUid().cStr();
    }
    out += format("%-8u %-16s %-12s %-7s %-12s %-12s %-9llu %-7llu %-10s %-10s %-40s %s\n",
                  client.getPid(), client.getCommand().cStr(), client.getTenant().cStr(),
                  device.c_str(), protocol::formatByteSize(client.getMemoryUsed()).c_str(),
                  protocol::formatByteSize(client.getPinnedMemoryUsed()).c_str(),
                  static_cast<unsigned long long>(client.getKernelsLaunched()),
                  static_cast<unsigned long long>(client.getQueuedOperations()),
                  formatDuration(static_cast<double>(client.getGpuTimeNs()) / 1e9).c_str(),
                  formatDuration(client.getConnectedSeconds()).c_str(), pod.c_str(),
                  client.getCgroup().cStr());
  }
  return out;
}

}  // namespace gpuproxy::client
