#pragma once
// One profile's presence at the kubelet: the gRPC server on <kubelet dir>/<endpoint> and its
// registration with the kubelet's Registration service. The kubelet deletes every socket in its
// directory when it restarts; `lost()` sees that (the socket file gone or replaced), and the
// plugin serves and registers again.

#include "client/deviceplugin/device_plugin_service.hpp"

#include <grpcpp/grpcpp.h>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace gpuproxy::deviceplugin {

class PluginEndpoint {
public:
  // A fresh service is made each time it serves, from `makeService`.
  PluginEndpoint(SlotProfile profile,
                 std::function<std::unique_ptr<DevicePluginService>()> makeService,
                 std::string kubeletDirectory);
  ~PluginEndpoint();
  PluginEndpoint(const PluginEndpoint&) = delete;
  PluginEndpoint& operator=(const PluginEndpoint&) = delete;

  const std::string& resourceName() const { return profile_.resourceName; }
  const std::string& socketPath() const { return socketPath_; }

  // Serves on the endpoint socket, replacing a stale file. Returns why it could not (empty: ok).
  std::string start();
  // Stops serving (ending open watches) and removes the socket.
  void stop();
  // Registers with the kubelet at <kubelet dir>/kubelet.sock. The kubelet dials back inside the
  // call, so the server must already serve. Returns why it failed (empty: registered).
  std::string registerWithKubelet(std::chrono::milliseconds timeout);
  // Whether the socket this endpoint serves is gone or another file (a kubelet restart).
  bool lost() const;

private:
  SlotProfile profile_;
  std::function<std::unique_ptr<DevicePluginService>()> makeService_;
  std::unique_ptr<DevicePluginService> service_;
  std::string kubeletDirectory_;
  std::string endpoint_;
  std::string socketPath_;
  std::unique_ptr<grpc::Server> server_;
  ino_t socketInode_ = 0;
};

}  // namespace gpuproxy::deviceplugin
