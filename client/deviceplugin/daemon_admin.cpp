#include "client/deviceplugin/daemon_admin.hpp"

#include "gpuproxy/protocol/gpuproxy.capnp.h"

#include <capnp/ez-rpc.h>
#include <kj/async-io.h>
#include <kj/timer.h>

#include <functional>

namespace gpuproxy::deviceplugin {

namespace {

using protocol::Admin;

// A daemon that accepts the connection but does not answer must not hold the kubelet's Allocate
// (and every call after it, which wait for the same mutex) for ever.
constexpr auto kAdminTimeout = 10 * kj::SECONDS;

// What a call needs: the admin capability, and a way to wait for an answer within the timeout.
struct AdminCall {
  Admin::Client& admin;
  capnp::EzRpcClient& client;

  template <typename T>
  T wait(kj::Promise<T>&& promise) {
    return client.getIoProvider()
        .getTimer()
        .timeoutAfter(kAdminTimeout, kj::mv(promise))
        .wait(client.getWaitScope());
  }
};

template <typename Result>
Result withAdmin(const std::string& adminSocket, const std::function<Result(AdminCall&)>& body) {
  try {
    capnp::EzRpcClient client("unix:" + adminSocket);
    auto admin = client.getMain<Admin>();
    AdminCall call{admin, client};
    return body(call);
  } catch (const kj::Exception& error) {
    throw DaemonUnavailable("gpuproxyd is not reachable at " + adminSocket + ": " +
                            error.getDescription().cStr());
  }
}

std::vector<std::string> texts(capnp::List<capnp::Text>::Reader list) {
  std::vector<std::string> result;
  for (auto text : list) result.emplace_back(text.cStr());
  return result;
}

}  // namespace

DaemonSnapshot DaemonAdmin::status() const {
  return withAdmin<DaemonSnapshot>(adminSocket_, [](AdminCall& call) {
    auto response = call.wait(call.admin.statusRequest().send());
    auto status = response.getStatus();
    DaemonSnapshot snapshot;
    snapshot.backend = status.getBackend().cStr();
    for (auto device : status.getDevices()) {
      snapshot.gpus.push_back({device.getIndex(), device.getMemoryTotal()});
    }
    for (auto tenant : status.getTenants()) {
      auto allocation = tenant.getAllocation();
      if (allocation.getResource().size() == 0) continue;
      AllocationTenant entry;
      entry.name = tenant.getName().cStr();
      entry.resource = allocation.getResource().cStr();
      entry.deviceIds = texts(allocation.getDeviceIds());
      entry.socket = tenant.getSocket().cStr();
      entry.boundPodUid = tenant.getBoundPodUid().cStr();
      entry.clients = tenant.getClients();
      entry.pod = {tenant.getPod().getPodNamespace().cStr(), tenant.getPod().getPodName().cStr(),
                   texts(tenant.getPod().getContainers())};
      snapshot.allocations.push_back(std::move(entry));
    }
    return snapshot;
  });
}

std::string DaemonAdmin::createTenant(const NewTenant& tenant, std::string& socket) const {
  return withAdmin<std::string>(adminSocket_, [&](AdminCall& call) {
    auto request = call.admin.createTenantRequest();
    auto spec = request.initSpec();
    spec.setName(tenant.name);
    spec.setSocketDirectory(tenant.socketDirectory);
    spec.setHasMemoryLimit(true);
    spec.setMemoryLimit(tenant.limits.memoryLimit);
    spec.setWeight(tenant.limits.weight);
    spec.setClass(tenant.limits.latencyCritical ? protocol::TenantClass::LATENCY_CRITICAL
                                                : protocol::TenantClass::BEST_EFFORT);
    spec.setHasDevices(true);
    spec.initDevices(1).set(0, tenant.device);
    auto allocation = spec.initAllocation();
    allocation.setResource(tenant.resource);
    auto ids = allocation.initDeviceIds(static_cast<unsigned>(tenant.deviceIds.size()));
    for (unsigned i = 0; i < tenant.deviceIds.size(); ++i) ids.set(i, tenant.deviceIds[i]);
    auto response = call.wait(request.send());
    socket = response.getSocket().cStr();
    return std::string(response.getError().cStr());
  });
}

std::string DaemonAdmin::removeTenant(const std::string& name) const {
  return withAdmin<std::string>(adminSocket_, [&](AdminCall& call) {
    auto request = call.admin.removeTenantRequest();
    request.setName(name);
    return std::string(call.wait(request.send()).getError().cStr());
  });
}

std::string DaemonAdmin::setTenantPod(const std::string& name, const PodName& pod) const {
  return withAdmin<std::string>(adminSocket_, [&](AdminCall& call) {
    auto request = call.admin.setTenantPodRequest();
    request.setName(name);
    auto reference = request.initPod();
    reference.setPodNamespace(pod.podNamespace);
    reference.setPodName(pod.podName);
    auto containers = reference.initContainers(static_cast<unsigned>(pod.containers.size()));
    for (unsigned i = 0; i < pod.containers.size(); ++i) containers.set(i, pod.containers[i]);
    return std::string(call.wait(request.send()).getError().cStr());
  });
}

}  // namespace gpuproxy::deviceplugin
