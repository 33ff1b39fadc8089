#include "client/deviceplugin/pod_resources.hpp"

#include "podresources/v1/api.grpc.pb.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace gpuproxy::deviceplugin {

namespace {

constexpr std::chrono::seconds kListTimeout{5};

std::string joined(const std::vector<std::string>& ids) {
  std::string text;
  for (const auto& id : ids) text += (text.empty() ? "" : ",") + id;
  return text;
}

}  // namespace

std::optional<PodName> podHolding(const AllocationTenant& tenant,
                                  const std::vector<ContainerDevices>& listing) {
  std::optional<PodName> pod;
  for (const auto& entry : listing) {
    if (entry.resource != tenant.resource) continue;
    bool holds = std::any_of(entry.deviceIds.begin(), entry.deviceIds.end(), [&](const auto& id) {
      return std::find(tenant.deviceIds.begin(), tenant.deviceIds.end(), id) !=
             tenant.deviceIds.end();
    });
    if (!holds) continue;
    if (!pod) pod = PodName{entry.podNamespace, entry.podName, {}};
    // Slots are given to one pod at a time; the first pod listed is the one named.
    if (pod->podNamespace == entry.podNamespace && pod->podName == entry.podName &&
        std::find(pod->containers.begin(), pod->containers.end(), entry.container) ==
            pod->containers.end()) {
      pod->containers.push_back(entry.container);
    }
  }
  return pod;
}

PodResourcesSweep::PodResourcesSweep(std::string socket, std::set<std::string> resources,
                                     const DaemonAdmin& admin, std::mutex& adminMutex,
                                     AllocationLedger& ledger, std::chrono::milliseconds grace)
    : socket_(std::move(socket)),
      resources_(std::move(resources)),
      admin_(admin),
      adminMutex_(adminMutex),
      ledger_(ledger),
      grace_(grace) {}

std::string PodResourcesSweep::sweep() {
  auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  auto lister = v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kListTimeout);
  v1::ListPodResourcesRequest request;
  v1::ListPodResourcesResponse response;
  auto status = lister->List(&context, request, &response);
  if (!status.ok()) {
    return "cannot list pods from the kubelet's PodResources API at " + socket_ + ": " +
           status.error_message();
  }
  std::vector<ContainerDevices> listing;
  for (const auto& pod : response.pod_resources()) {
    for (const auto& container : pod.containers()) {
      for (const auto& devices : container.devices()) {
        if (resources_.count(devices.resource_name()) == 0) continue;
        listing.push_back({pod.namespace_(),
                           pod.name(),
                           container.name(),
                           devices.resource_name(),
                           {devices.device_ids().begin(), devices.device_ids().end()}});
      }
    }
  }

  std::lock_guard lock(adminMutex_);
  try {
    const auto now = std::chrono::steady_clock::now();
    for (const auto& tenant : admin_.status().allocations) {
      if (resources_.count(tenant.resource) == 0) continue;
      auto pod = podHolding(tenant, listing);
      if (pod) {
        if (*pod != tenant.pod) {
          auto error = admin_.setTenantPod(tenant.name, *pod);
          if (error.empty()) {
            spdlog::info("tenant {} belongs to pod {}/{}", tenant.name, pod->podNamespace,
                         pod->podName);
          } else {
            spdlog::error("cannot name tenant {} after its pod: {}", tenant.name, error);
          }
        }
        continue;
      }
      if (now - ledger_.firstSeen(tenant.name) < grace_) continue;
      auto error = admin_.removeTenant(tenant.name);
      if (error.empty()) {
        spdlog::info("removed tenant {} ({} [{}]): no pod holds its slots any more{}", tenant.name,
                     tenant.resource, joined(tenant.deviceIds),
                     tenant.pod.podName.empty()
                         ? ""
                         : " (was " + tenant.pod.podNamespace + "/" + tenant.pod.podName + ")");
        ledger_.forget(tenant.name);
      } else {
        spdlog::error("cannot remove tenant {} whose pod is gone: {}", tenant.name, error);
      }
    }
  } catch (const DaemonUnavailable& error) {
    return error.what();
  }
  return {};
}

}  // namespace gpuproxy::deviceplugin
