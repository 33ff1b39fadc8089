#pragma once
// The control-plane face of one attached client: the Cap'n Proto Gateway (bootstrap of the client
// socket) and Session. A Session routes each call to the GpuClient of the device its handle names.
// When the client goes away (exit, crash, SIGKILL: the socket closes either way) Cap'n Proto drops
// the Session, and its GpuClients are handed to the reaper, which waits for their queued work and
// then frees everything they held.

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "ipc/unix_socket.hpp"
#include "server/gpu/client_stats.hpp"
#include "server/gpu/gpu_client.hpp"
#include "server/session/server_state.hpp"

#include <map>
#include <memory>
#include <vector>

namespace gpuproxy::server {

class ClientSession final : public protocol::Session::Server {
public:
  // `visibleDevices` maps the client's device ordinals to the daemon's devices: a tenant limited
  // to some devices sees only those, numbered from 0, as with CUDA_VISIBLE_DEVICES.
  ClientSession(ServerState& state, std::shared_ptr<ClientStats> stats,
                std::vector<std::uint32_t> visibleDevices);
  ~ClientSession();

  const ClientStats& stats() const { return *stats_; }
  // Devices this client has made a context on, in the order it first did.
  const std::vector<std::uint32_t>& devices() const { return devicesUsed_; }

protected:
  // gpuproxy::protocol::Session
  kj::Promise<void> createContext(CreateContextContext context) override;
  kj::Promise<void> destroyContext(DestroyContextContext context) override;
  kj::Promise<void> retainPrimaryContext(RetainPrimaryContextContext context) override;
  kj::Promise<void> releasePrimaryContext(ReleasePrimaryContextContext context) override;
  kj::Promise<void> resetPrimaryContext(ResetPrimaryContextContext context) override;
  kj::Promise<void> setPrimaryContextFlags(SetPrimaryContextFlagsContext context) override;
  kj::Promise<void> getPrimaryContextState(GetPrimaryContextStateContext context) override;
  kj::Promise<void> synchronizeContext(SynchronizeContextContext context) override;
  kj::Promise<void> memAlloc(MemAllocContext context) override;
  kj::Promise<void> memFree(MemFreeContext context) override;
  kj::Promise<void> memGetInfo(MemGetInfoContext context) override;
  kj::Promise<void> memcpyHtoD(MemcpyHtoDContext context) override;
  kj::Promise<void> memcpyDtoH(MemcpyDtoHContext context) override;
  kj::Promise<void> memcpyDtoD(MemcpyDtoDContext context) override;
  kj::Promise<void> memset(MemsetContext context) override;
  kj::Promise<void> loadModule(LoadModuleContext context) override;
  kj::Promise<void> unloadModule(UnloadModuleContext context) override;
  kj::Promise<void> getFunction(GetFunctionContext context) override;
  kj::Promise<void> launchKernel(LaunchKernelContext context) override;
  kj::Promise<void> createStream(CreateStreamContext context) override;
  kj::Promise<void> destroyStream(DestroyStreamContext context) override;
  kj::Promise<void> synchronizeStream(SynchronizeStreamContext context) override;
  kj::Promise<void> queryStream(QueryStreamContext context) override;
  kj::Promise<void> streamWaitEvent(StreamWaitEventContext context) override;
  kj::Promise<void> createEvent(CreateEventContext context) override;
  kj::Promise<void> destroyEvent(DestroyEventContext context) override;
  kj::Promise<void> recordEvent(RecordEventContext context) override;
  kj::Promise<void> synchronizeEvent(SynchronizeEventContext context) override;
  kj::Promise<void> queryEvent(QueryEventContext context) override;
  kj::Promise<void> eventElapsedTime(EventElapsedTimeContext context) override;

private:
  // The client's state on its device ordinal `device`, created on first use; null for a device
  // it cannot see.
  GpuClient* clientForDevice(std::uint32_t device);
  void noteDeviceUsed(std::uint32_t device);
  // The client's state on the device a handle of `kind` names; null when no such state exists.
  GpuClient* clientFor(std::uint64_t handle, HandleKind kind);
  // The GpuClient owning device pointer `pointer`, or null.
  GpuClient* clientOwning(CUdeviceptr pointer);

  ServerState& state_;
  std::shared_ptr<ClientStats> stats_;
  std::vector<std::uint32_t> visibleDevices_;
  std::map<std::uint32_t, std::unique_ptr<GpuClient>> clients_;  // by daemon device index
  std::vector<std::uint32_t> devicesUsed_;
};

// Bootstrap capability of one client connection: knows who is on the other end from the socket.
class ClientGateway final : public protocol::Gateway::Server {
public:
  ClientGateway(ServerState& state, ipc::PeerCredentials peer, std::shared_ptr<Tenant> tenant);

protected:
  // gpuproxy::protocol::Gateway
  kj::Promise<void> attach(AttachContext context) override;

private:
  ServerState& state_;
  ipc::PeerCredentials peer_;
  std::shared_ptr<Tenant> tenant_;
};

// The cgroup a process runs in, from /proc/PID/cgroup: the unified (v2) path when it says more
// than "/", else the most specific v1 path. "" if the process is gone.
std::string cgroupOf(pid_t pid);

}  // namespace gpuproxy::server
