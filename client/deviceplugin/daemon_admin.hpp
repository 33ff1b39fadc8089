#pragma once
// The device plugin's side of gpuproxyd's admin socket: what it reads from the daemon's status
// and the tenants it creates and removes for allocations. One connection per call, made on the
// calling thread, so that any gRPC thread may call; calls are not concurrent (the plugin
// serialises them), so one allocation's status check and creation see the same daemon.

#include "client/deviceplugin/slots.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpuproxy::deviceplugin {

// The daemon could not be reached or did not answer; `what()` says which socket and why.
class DaemonUnavailable : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct PodName {
  std::string podNamespace;
  std::string podName;
  std::vector<std::string> containers;
  bool operator==(const PodName&) const = default;
};

// A tenant of the daemon that a device plugin made (its `allocation` is set).
struct AllocationTenant {
  std::string name;
  std::string resource;
  std::vector<std::string> deviceIds;
  std::string socket;
  std::string boundPodUid;  // empty until a client of a pod connected
  std::uint32_t clients = 0;
  PodName pod;
};

struct DaemonSnapshot {
  std::string backend;
  std::vector<Gpu> gpus;
  std::vector<AllocationTenant> allocations;
};

struct NewTenant {
  std::string name;
  std::string socketDirectory;
  AllocationLimits limits;
  std::uint32_t device = 0;
  std::string resource;
  std::vector<std::string> deviceIds;
};

class DaemonAdmin {
public:
  explicit DaemonAdmin(std::string adminSocket) : adminSocket_(std::move(adminSocket)) {}

  const std::string& adminSocket() const { return adminSocket_; }

  // Each throws DaemonUnavailable when the daemon cannot be reached; a refusal by the daemon is
  // returned as its one-line reason (empty: done).
  DaemonSnapshot status() const;
  // On success `socket` is the path of the tenant's socket.
  std::string createTenant(const NewTenant& tenant, std::string& socket) const;
  std::string removeTenant(const std::string& name) const;
  std::string setTenantPod(const std::string& name, const PodName& pod) const;

private:
  std::string adminSocket_;
};

}  // namespace gpuproxy::deviceplugin
