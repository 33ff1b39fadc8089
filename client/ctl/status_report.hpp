#pragma once
// Turns the daemon's status into what gpuproxyctl prints: JSON for programs, a table for people.

#include "gpuproxy/protocol/gpuproxy.capnp.h"

#include <nlohmann/json.hpp>

#include <string>

namespace gpuproxy::client {

// Keys: backend, version, pid, uptime_seconds, driver_version,
// devices[{index, name, memory_total, memory_used, clients, sticky_error, faulting_client_pid,
// kernels_queued, kernels_in_flight, stream_priorities{range, latency_critical, best_effort}
// (each [greatest, least]), sm_partition (null = none, else {total_sms, best_effort_sms,
// latency_critical_sms})}],
// clients[{pid, uid, gid, command, device, devices, memory_used, kernels_launched, gpu_time_ns,
// connected_seconds, tenant, tenant_id, cgroup, pod_uid, container_id, pod (the tenant's pod:
// null, or {namespace, name, containers}), module_bytes, pinned_memory_used, queued_operations,
// queued_bytes (work queued on the GPUs and not finished, and the daemon memory it holds)}].
nlohmann::json statusToJson(protocol::DaemonStatus::Reader status);

std::string statusToTable(protocol::DaemonStatus::Reader status);

// tenants[{id, name, origin (config|runtime), socket, memory_limit (null = none), memory_used,
// memory_used_per_device, weight, class, devices, clients, connections, max_connections,
// kernels_launched, gpu_time_ns, oom_count, allocation (null, or {resource, device_ids}), pod
// (null, or {namespace, name, containers}), bound_pod_uid (null until bound), objects ({contexts,
// streams, events, modules}, each {held, limit}), ...}]
nlohmann::json tenantsToJson(capnp::List<protocol::TenantStatus>::Reader tenants);
std::string tenantsToTable(capnp::List<protocol::TenantStatus>::Reader tenants);

}  // namespace gpuproxy::client
