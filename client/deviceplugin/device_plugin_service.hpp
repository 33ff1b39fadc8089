#pragma once
// The kubelet-facing DevicePlugin service of one slot profile: it advertises the profile's slots
// (ListAndWatch), suggests slots of one GPU (GetPreferredAllocation) and turns an allocation into
// a tenant of gpuproxyd with its own socket directory (Allocate). gRPC runs each call on a thread
// of its own; what they share is the Inventory and the daemon, reached one call at a time.

#include "client/deviceplugin/daemon_admin.hpp"
#include "client/deviceplugin/slots.hpp"
#include "deviceplugin/v1beta1/api.grpc.pb.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace gpuproxy::deviceplugin {

// The daemon's GPUs as last seen, and whether the daemon answers. ListAndWatch streams send the
// slot list again whenever it changes (generation).
class Inventory {
public:
  struct View {
    std::vector<Gpu> gpus;
    bool healthy = false;
    std::uint64_t generation = 0;
  };

  // Returns whether anything changed.
  bool update(std::vector<Gpu> gpus, bool healthy);
  View view() const;
  // Waits until the generation differs from `seen` or `timeout` passes.
  View waitForChange(std::uint64_t seen, std::chrono::milliseconds timeout) const;

private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  View view_;
};

// Where allocations live on the node and what a container gets besides its socket.
struct AllocationSettings {
  // Host directory under which each allocation's socket directory is made (the daemon and the
  // plugin see it at the same path as the host).
  std::string allocationRoot;
  // Host directory holding the stub (libcuda.so.1), mounted read-only into every container.
  std::string stubDirectory;
};

// Tenants made for allocations, by name: when each was made (the PodResources sweep leaves young
// ones alone, their pod may not be listed yet).
class AllocationLedger {
public:
  void made(const std::string& tenant);
  void forget(const std::string& tenant);
  // When the plugin made or first saw `tenant` (now, the first time it is asked).
  std::chrono::steady_clock::time_point firstSeen(const std::string& tenant);

private:
  std::mutex mutex_;
  std::map<std::string, std::chrono::steady_clock::time_point> seen_;
};

class DevicePluginService final : public v1beta1::DevicePlugin::Service {
public:
  DevicePluginService(SlotProfile profile, AllocationSettings settings, const DaemonAdmin& admin,
                      std::mutex& adminMutex, Inventory& inventory, AllocationLedger& ledger);

  const SlotProfile& profile() const { return profile_; }
  // Ends the open ListAndWatch streams (before the server shuts down).
  void stop() { stopping_ = true; }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext* context, const v1beta1::Empty* request,
                                      v1beta1::DevicePluginOptions* response) override;
  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty* request,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override;
  grpc::Status GetPreferredAllocation(grpc::ServerContext* context,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override;
  grpc::Status Allocate(grpc::ServerContext* context, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override;
  grpc::Status PreStartContainer(grpc::ServerContext* context,
                                 const v1beta1::PreStartContainerRequest* request,
                                 v1beta1::PreStartContainerResponse* response) override;

private:
  // Makes (or finds) the tenant of one container's allocation and fills its response. Sets
  // `created` when it made a new tenant.
  grpc::Status allocateOne(const Allocation& allocation, const Gpu& gpu,
                           v1beta1::ContainerAllocateResponse* response, std::string& created);

  SlotProfile profile_;
  AllocationSettings settings_;
  const DaemonAdmin& admin_;
  std::mutex& adminMutex_;
  Inventory& inventory_;
  AllocationLedger& ledger_;
  std::atomic<bool> stopping_{false};
};

}  // namespace gpuproxy::deviceplugin
