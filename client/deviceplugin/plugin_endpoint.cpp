#include "client/deviceplugin/plugin_endpoint.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gpuproxy::deviceplugin {

namespace {

// How long stopping waits for open calls (a watch ends within its poll interval).
constexpr std::chrono::seconds kShutdownGrace{2};

}  // namespace

PluginEndpoint::PluginEndpoint(SlotProfile profile,
                               std::function<std::unique_ptr<DevicePluginService>()> makeService,
                               std::string kubeletDirectory)
    : profile_(std::move(profile)),
      makeService_(std::move(makeService)),
      kubeletDirectory_(std::move(kubeletDirectory)),
      endpoint_(endpointName(profile_)),
      socketPath_(kubeletDirectory_ + "/" + endpoint_) {}

PluginEndpoint::~PluginEndpoint() {
  stop();
}

std::string PluginEndpoint::start() {
  stop();
  if (::unlink(socketPath_.c_str()) != 0 && errno != ENOENT) {
    return "cannot remove the stale socket " + socketPath_ + ": " + std::strerror(errno);
  }
  service_ = makeService_();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socketPath_, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  struct stat file {};
  if (!server_ || ::stat(socketPath_.c_str(), &file) != 0) {
    server_.reset();
    return "cannot serve on " + socketPath_ + " (is the kubelet's directory there and writable?)";
  }
  socketInode_ = file.st_ino;
  spdlog::info("{}: serving the device plugin API on {}", resourceName(), socketPath_);
  return {};
}

void PluginEndpoint::stop() {
  if (!server_) return;
  service_->stop();
  server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  server_->Wait();
  server_.reset();
  service_.reset();
  // Only our own file: after a kubelet restart the path may be gone or someone else's.
  struct stat file {};
  if (::stat(socketPath_.c_str(), &file) == 0 && file.st_ino == socketInode_) {
    ::unlink(socketPath_.c_str());
  }
}

std::string PluginEndpoint::registerWithKubelet(std::chrono::milliseconds timeout) {
  auto channel = grpc::CreateChannel("unix:" + kubeletDirectory_ + "/kubelet.sock",
                                     grpc::InsecureChannelCredentials());
  auto registration = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version(std::string(kDevicePluginApiVersion));
  request.set_endpoint(endpoint_);
  request.set_resource_name(resourceName());
  request.mutable_options()->set_pre_start_required(false);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  v1beta1::Empty reply;
  auto status = registration->Register(&context, request, &reply);
  if (status.ok()) {
    spdlog::info("{}: registered with the kubelet (endpoint {})", resourceName(), endpoint_);
    return {};
  }
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return "the kubelet at " + kubeletDirectory_ + "/kubelet.sock did not answer Register within " +
           std::to_string(timeout.count()) + " ms";
  }
  return "the kubelet at " + kubeletDirectory_ + "/kubelet.sock refused or could not take " +
         "Register: " + status.error_message();
}

bool PluginEndpoint::lost() const {
  if (!server_) return true;
  struct stat file {};
  return ::stat(socketPath_.c_str(), &file) != 0 || file.st_ino != socketInode_;
}

}  // namespace gpuproxy::deviceplugin
