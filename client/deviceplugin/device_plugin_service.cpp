#include "client/deviceplugin/device_plugin_service.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

namespace gpuproxy::deviceplugin {

namespace {

// How often an open ListAndWatch looks whether the kubelet went away or the plugin stops.
constexpr std::chrono::milliseconds kWatchPoll{200};

std::string joined(const std::vector<std::string>& ids) {
  std::string text;
  for (const auto& id : ids) text += (text.empty() ? "" : ",") + id;
  return text;
}

std::string parentDirectory(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? path : path.substr(0, slash);
}

}  // namespace

bool Inventory::update(std::vector<Gpu> gpus, bool healthy) {
  std::lock_guard lock(mutex_);
  auto same = [](const Gpu& a, const Gpu& b) {
    return a.index == b.index && a.memoryTotal == b.memoryTotal;
  };
  if (healthy == view_.healthy && gpus.size() == view_.gpus.size() &&
      std::equal(gpus.begin(), gpus.end(), view_.gpus.begin(), same)) {
    return false;
  }
  view_.gpus = std::move(gpus);
  view_.healthy = healthy;
  ++view_.generation;
  changed_.notify_all();
  return true;
}

Inventory::View Inventory::view() const {
  std::lock_guard lock(mutex_);
  return view_;
}

Inventory::View Inventory::waitForChange(std::uint64_t seen,
                                         std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return view_.generation != seen; });
  return view_;
}

void AllocationLedger::made(const std::string& tenant) {
  std::lock_guard lock(mutex_);
  seen_[tenant] = std::chrono::steady_clock::now();
}

void AllocationLedger::forget(const std::string& tenant) {
  std::lock_guard lock(mutex_);
  seen_.erase(tenant);
}

std::chrono::steady_clock::time_point AllocationLedger::firstSeen(const std::string& tenant) {
  std::lock_guard lock(mutex_);
  return seen_.try_emplace(tenant, std::chrono::steady_clock::now()).first->second;
}

DevicePluginService::DevicePluginService(SlotProfile profile, AllocationSettings settings,
                                         const DaemonAdmin& admin, std::mutex& adminMutex,
                                         Inventory& inventory, AllocationLedger& ledger)
    : profile_(std::move(profile)),
      settings_(std::move(settings)),
      admin_(admin),
      adminMutex_(adminMutex),
      inventory_(inventory),
      ledger_(ledger) {}

grpc::Status DevicePluginService::GetDevicePluginOptions(grpc::ServerContext*,
                                                         const v1beta1::Empty*,
                                                         v1beta1::DevicePluginOptions* response) {
  response->set_pre_start_required(false);
  response->set_get_preferred_allocation_available(true);
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::ListAndWatch(
    grpc::ServerContext* context, const v1beta1::Empty*,
    grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  spdlog::info("{}: the kubelet watches the slots", profile_.resourceName);
  std::uint64_t sent = 0;
  bool first = true;
  while (!stopping_ && !context->IsCancelled()) {
    auto view = first ? inventory_.view() : inventory_.waitForChange(sent, kWatchPoll);
    if (!first && view.generation == sent) continue;
    first = false;
    sent = view.generation;
    v1beta1::ListAndWatchResponse update;
    // While the daemon does not answer, its slots are unhealthy: the kubelet admits no new pod
    // to them, and pods already running keep theirs.
    const char* health = view.healthy ? "Healthy" : "Unhealthy";
    for (const auto& id : advertisedSlots(profile_, view.gpus)) {
      auto* device = update.add_devices();
      device->set_id(id);
      device->set_health(health);
    }
    if (!writer->Write(update)) break;
    spdlog::debug("{}: sent {} slots ({})", profile_.resourceName, update.devices_size(), health);
  }
  spdlog::info("{}: the kubelet's watch ended", profile_.resourceName);
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::GetPreferredAllocation(
    grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  for (const auto& container : request->container_requests()) {
    std::vector<std::string> available(container.available_deviceids().begin(),
                                       container.available_deviceids().end());
    std::vector<std::string> mustInclude(container.must_include_deviceids().begin(),
                                         container.must_include_deviceids().end());
    if (container.allocation_size() < 0) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "gpuproxy: a negative allocation size"};
    }
    auto chosen = preferredAllocation(available, mustInclude,
                                      static_cast<std::size_t>(container.allocation_size()));
    auto* answer = response->add_container_responses();
    for (const auto& id : chosen) answer->add_deviceids(id);
  }
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::Allocate(grpc::ServerContext*,
                                           const v1beta1::AllocateRequest* request,
                                           v1beta1::AllocateResponse* response) {
  const auto& resource = profile_.resourceName;
  std::lock_guard lock(adminMutex_);
  DaemonSnapshot snapshot;
  try {
    snapshot = admin_.status();
  } catch (const DaemonUnavailable& error) {
    spdlog::error("{}: Allocate refused: {}", resource, error.what());
    return {grpc::StatusCode::UNAVAILABLE,
            std::string("gpuproxy: cannot allocate ") + resource + ": " + error.what()};
  }

  // A later container's failure removes what earlier ones of the same request made: the kubelet
  // treats the whole request as failed.
  std::vector<std::string> created;
  auto undo = [&] {
    for (const auto& name : created) {
      try {
        if (auto error = admin_.removeTenant(name); !error.empty()) {
          spdlog::error("{}: could not remove tenant {} after a failed Allocate: {}", resource,
                        name, error);
        }
        ledger_.forget(name);
      } catch (const DaemonUnavailable& error) {
        spdlog::error("{}: could not remove tenant {} after a failed Allocate: {}", resource, name,
                      error.what());
      }
    }
  };

  for (const auto& container : request->container_requests()) {
    std::vector<std::string> ids(container.devices_ids().begin(), container.devices_ids().end());
    auto checked = validateAllocation(profile_, snapshot.gpus, ids);
    if (auto* error = std::get_if<std::string>(&checked)) {
      spdlog::error("{}: Allocate of [{}] refused: {}", resource, joined(ids), *error);
      undo();
      return {grpc::StatusCode::INVALID_ARGUMENT, "gpuproxy: " + *error};
    }
    const auto& allocation = std::get<Allocation>(checked);
    auto gpu = std::find_if(snapshot.gpus.begin(), snapshot.gpus.end(),
                            [&](const Gpu& g) { return g.index == allocation.gpu; });
    std::string made;
    grpc::Status status;
    try {
      status = allocateOne(allocation, *gpu, response->add_container_responses(), made);
    } catch (const DaemonUnavailable& error) {
      spdlog::error("{}: Allocate of [{}] failed: {}", resource, joined(ids), error.what());
      status = {grpc::StatusCode::UNAVAILABLE,
                std::string("gpuproxy: cannot allocate ") + resource + ": " + error.what()};
    }
    if (!made.empty()) created.push_back(made);
    if (!status.ok()) {
      undo();
      return status;
    }
  }
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::allocateOne(const Allocation& allocation, const Gpu& gpu,
                                              v1beta1::ContainerAllocateResponse* response,
                                              std::string& created) {
  const auto& resource = profile_.resourceName;
  const auto name = tenantName(resource, allocation.deviceIds);
  const std::set<std::string> ids(allocation.deviceIds.begin(), allocation.deviceIds.end());
  const auto snapshot = admin_.status();

  std::string socket;
  for (const auto& tenant : snapshot.allocations) {
    if (tenant.resource != resource) continue;
    bool overlaps = std::any_of(tenant.deviceIds.begin(), tenant.deviceIds.end(),
                                [&](const std::string& id) { return ids.count(id) > 0; });
    if (!overlaps) continue;
    bool unused = tenant.boundPodUid.empty() && tenant.clients == 0;
    if (tenant.name == name && unused) {
      // The same slots asked for again before any pod used them: another container of the same
      // pod (the kubelet reuses an init container's devices), so it shares the tenant.
      socket = tenant.socket;
      spdlog::info("{}: [{}] shares tenant {} (allocated before, not yet used)", resource,
                   joined(allocation.deviceIds), name);
      continue;
    }
    if (!tenant.boundPodUid.empty() || tenant.clients > 0) {
      // The kubelet hands out only slots no live pod holds: a tenant a pod already used that
      // holds them belongs to a pod that is gone.
      spdlog::info(
          "{}: removing tenant {} of a pod that is gone (pod uid {}), its slots [{}] "
          "are allocated again",
          resource, tenant.name, tenant.boundPodUid, joined(tenant.deviceIds));
      auto error = admin_.removeTenant(tenant.name);
      if (!error.empty()) {
        spdlog::error("{}: could not remove tenant {}: {}", resource, tenant.name, error);
        return {grpc::StatusCode::INTERNAL, "gpuproxy: slots [" + joined(allocation.deviceIds) +
                                                "] are still held by tenant " + tenant.name + ": " +
                                                error};
      }
      ledger_.forget(tenant.name);
    }
  }

  if (socket.empty()) {
    NewTenant tenant;
    tenant.name = name;
    tenant.socketDirectory = settings_.allocationRoot + "/" + name;
    tenant.limits = limitsOf(profile_, gpu, allocation.deviceIds.size());
    tenant.device = allocation.gpu;
    tenant.resource = resource;
    tenant.deviceIds = allocation.deviceIds;
    auto error = admin_.createTenant(tenant, socket);
    if (!error.empty()) {
      spdlog::error("{}: gpuproxyd refused the tenant for [{}]: {}", resource,
                    joined(allocation.deviceIds), error);
      return {grpc::StatusCode::INTERNAL, "gpuproxy: gpuproxyd refused the tenant for [" +
                                              joined(allocation.deviceIds) + "]: " + error};
    }
    created = name;
    ledger_.made(name);
    spdlog::info("{}: [{}] -> tenant {} on GPU {} ({} bytes, weight {}), socket {}", resource,
                 joined(allocation.deviceIds), name, allocation.gpu, tenant.limits.memoryLimit,
                 tenant.limits.weight, socket);
  }

  (*response->mutable_envs())["GPUPROXY_SOCKET"] = std::string(kContainerSocket);
  // The NVIDIA container toolkit gives a container the driver and /dev/nvidia* for the value its
  // image sets (CUDA images: "all"); "void" gives none, so the pod reaches the GPU only through
  // gpuproxyd.
  (*response->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = "void";
  auto* socketMount = response->add_mounts();
  socketMount->set_container_path(std::string(kContainerSocketDirectory));
  socketMount->set_host_path(parentDirectory(socket));
  socketMount->set_read_only(true);
  auto* stubMount = response->add_mounts();
  stubMount->set_container_path(std::string(kContainerStubDirectory));
  stubMount->set_host_path(settings_.stubDirectory);
  stubMount->set_read_only(true);
  (*response->mutable_annotations())["gpuproxy.io/tenant"] = name;
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::PreStartContainer(grpc::ServerContext*,
                                                    const v1beta1::PreStartContainerRequest*,
                                                    v1beta1::PreStartContainerResponse*) {
  return grpc::Status::OK;
}

}  // namespace gpuproxy::deviceplugin
