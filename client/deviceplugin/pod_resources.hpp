#pragma once
// Names and garbage collection from the kubelet's PodResources API: the device plugin API tells
// the plugin neither which pod an allocation is for nor when that pod is gone, but PodResources
// `List` says which container holds which device ids. Each sweep names every allocation's tenant
// after the pod holding its slots (gpuproxyctl status shows it) and removes the tenants whose
// slots no pod holds any more: their socket goes, and clients still attached are reclaimed.

#include "client/deviceplugin/daemon_admin.hpp"
#include "client/deviceplugin/device_plugin_service.hpp"

#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gpuproxy::deviceplugin {

// One container's devices of one resource, as PodResources lists them.
struct ContainerDevices {
  std::string podNamespace;
  std::string podName;
  std::string container;
  std::string resource;
  std::vector<std::string> deviceIds;
};

// The pod whose containers hold any of `tenant`'s slots (every such container named), or nullopt
// when none does.
std::optional<PodName> podHolding(const AllocationTenant& tenant,
                                  const std::vector<ContainerDevices>& listing);

class PodResourcesSweep {
public:
  // `grace`: a tenant younger than this (made, or first seen, by this plugin) is not removed
  // even when no pod is listed for it yet: Allocate runs before the kubelet lists the pod.
  PodResourcesSweep(std::string socket, std::set<std::string> resources, const DaemonAdmin& admin,
                    std::mutex& adminMutex, AllocationLedger& ledger,
                    std::chrono::milliseconds grace);

  // One pass. Returns why it could not look (PodResources or the daemon unreachable), else empty.
  std::string sweep();

private:
  std::string socket_;
  std::set<std::string> resources_;
  const DaemonAdmin& admin_;
  std::mutex& adminMutex_;
  AllocationLedger& ledger_;
  std::chrono::milliseconds grace_;
};

}  // namespace gpuproxy::deviceplugin
