// gpuproxy-device-plugin against a fake kubelet and a real gpuproxyd (sim): the fake kubelet
// speaks real gRPC over Unix sockets in a temp directory, as the kubelet does (version check,
// dial-back inside Register, GetDevicePluginOptions first, ListAndWatch kept open, Allocate per
// container, a restart that deletes every socket in its directory), and a fake PodResources
// server names pods. A client then runs with exactly the mounts and environment Allocate
// returned: bind mounts in a private mount namespace where the test may make one (root), else
// the same paths given directly.
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"
#include "tests/support/process.hpp"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace gpuproxy::testing {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;
constexpr const char* kResource = "gpuproxy.io/gpu";

// The kubelet's side of the device plugin API, over real sockets in `directory`.
class FakeKubelet final : public v1beta1::Registration::Service {
public:
  explicit FakeKubelet(std::string directory) : directory_(std::move(directory)) {}
  ~FakeKubelet() override { stop(); }

  // The kubelet answers Register (true), or takes it and never answers (false).
  void setAnswering(bool answering) {
    std::lock_guard lock(mutex_);
    answering_ = answering;
    changed_.notify_all();
  }

  void start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + directory_ + "/kubelet.sock",
                             grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_) << "fake kubelet could not serve in " << directory_;
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (auto& [resource, plugin] : plugins_) plugin.watch->TryCancel();
      changed_.notify_all();
    }
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_->Wait();
      server_.reset();
    }
    for (auto& thread : watchers_) thread.join();
    watchers_.clear();
    std::lock_guard lock(mutex_);
    plugins_.clear();
    devices_.clear();
    stopping_ = false;
  }

  // What a kubelet restart does: it goes away, deletes every socket in its directory, and comes
  // back with no plugin known.
  void restart() {
    stop();
    for (const auto& entry : std::filesystem::directory_iterator(directory_)) {
      if (entry.is_socket()) std::filesystem::remove(entry.path());
    }
    start();
  }

  grpc::Status Register(grpc::ServerContext* context, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    {
      std::unique_lock lock(mutex_);
      ++registerCalls_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return answering_ || stopping_ || context->IsCancelled(); });
      if (!answering_) return {grpc::StatusCode::UNAVAILABLE, "fake kubelet is going away"};
    }
    if (request->version() != "v1beta1") {
      return {grpc::StatusCode::INVALID_ARGUMENT, "unsupported version " + request->version()};
    }
    const std::string& resource = request->resource_name();
    if (resource.find('/') == std::string::npos || resource.rfind("kubernetes.io/", 0) == 0) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "not an extended resource: " + resource};
    }
    // As the kubelet: dial the plugin back before answering, and ask for its options first.
    Plugin plugin;
    plugin.resource = resource;
    plugin.stub = v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(
        "unix:" + directory_ + "/" + request->endpoint(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext optionsContext;
    optionsContext.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto status = plugin.stub->GetDevicePluginOptions(&optionsContext, {}, &plugin.options);
    if (!status.ok()) return {grpc::StatusCode::UNKNOWN, "dial-back: " + status.error_message()};
    plugin.watch = std::make_unique<grpc::ClientContext>();
    auto* stub = plugin.stub.get();
    auto* watch = plugin.watch.get();
    std::lock_guard lock(mutex_);
    plugins_[resource] = std::move(plugin);
    ++registrations_;
    watchers_.emplace_back([this, stub, watch, resource] {
      auto reader = stub->ListAndWatch(watch, {});
      v1beta1::ListAndWatchResponse update;
      while (reader->Read(&update)) {
        std::lock_guard lock(mutex_);
        auto& devices = devices_[resource];
        devices.clear();
        for (const auto& device : update.devices()) devices[device.id()] = device.health();
        ++updates_;
        changed_.notify_all();
      }
      reader->Finish();
    });
    changed_.notify_all();
    return grpc::Status::OK;
  }

  // Successful registrations, counted over restarts.
  int registrations() {
    std::lock_guard lock(mutex_);
    return registrations_;
  }
  int registerCalls() {
    std::lock_guard lock(mutex_);
    return registerCalls_;
  }
  // The slots last listed for `resource`, id -> health.
  std::map<std::string, std::string> devices(const std::string& resource = kResource) {
    std::lock_guard lock(mutex_);
    return devices_[resource];
  }
  v1beta1::DevicePluginOptions options(const std::string& resource = kResource) {
    std::lock_guard lock(mutex_);
    return plugins_.at(resource).options;
  }

  grpc::Status allocate(const std::vector<std::vector<std::string>>& containers,
                        v1beta1::AllocateResponse& response,
                        const std::string& resource = kResource) {
    v1beta1::AllocateRequest request;
    for (const auto& ids : containers) {
      auto* container = request.add_container_requests();
      for (const auto& id : ids) container->add_devices_ids(id);
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub(resource)->Allocate(&context, request, &response);
  }

  std::vector<std::string> preferred(const std::vector<std::string>& available,
                                     const std::vector<std::string>& mustInclude, int size) {
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    for (const auto& id : available) container->add_available_deviceids(id);
    for (const auto& id : mustInclude) container->add_must_include_deviceids(id);
    container->set_allocation_size(size);
    v1beta1::PreferredAllocationResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub(kResource)->GetPreferredAllocation(&context, request, &response).ok());
    if (response.container_responses_size() != 1) return {};
    const auto& ids = response.container_responses(0).deviceids();
    return {ids.begin(), ids.end()};
  }

private:
  struct Plugin {
    std::string resource;
    std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
    std::unique_ptr<grpc::ClientContext> watch;
    v1beta1::DevicePluginOptions options;
  };

  v1beta1::DevicePlugin::Stub* stub(const std::string& resource) {
    std::lock_guard lock(mutex_);
    return plugins_.at(resource).stub.get();
  }

  std::string directory_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool answering_ = true;
  bool stopping_ = false;
  int registrations_ = 0;
  int registerCalls_ = 0;
  int updates_ = 0;
  std::map<std::string, Plugin> plugins_;
  std::map<std::string, std::map<std::string, std::string>> devices_;
  std::vector<std::thread> watchers_;
};

// The kubelet's PodResources API, listing what the test says.
class FakePodResources final : public v1::PodResourcesLister::Service {
public:
  explicit FakePodResources(const std::string& socket) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakePodResources() override {
    server_->Shutdown();
    server_->Wait();
  }

  void set(v1::ListPodResourcesResponse listing) {
    std::lock_guard lock(mutex_);
    listing_ = std::move(listing);
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    std::lock_guard lock(mutex_);
    *response = listing_;
    return grpc::Status::OK;
  }

private:
  std::mutex mutex_;
  v1::ListPodResourcesResponse listing_;
  std::unique_ptr<grpc::Server> server_;
};

std::string pluginBinary() {
  return buildDir() + "/bin/gpuproxy-device-plugin";
}

std::vector<std::string> slotsOf(const std::map<std::string, std::string>& devices) {
  std::vector<std::string> ids;
  for (const auto& [id, health] : devices) ids.push_back(id);
  return ids;
}

// Whether this test may make a private mount namespace (root, and unshare works here).
bool mountNamespaceAvailable() {
  static const bool available =
      ::geteuid() == 0 &&
      run({"unshare", "--mount", "--propagation", "private", "true"}).status.exitedWith(0);
  return available;
}

// Runs `program` as a container given `allocation` would: its mounts at their container paths
// (read-only binds in a private mount namespace, on fresh tmpfs for /run and /usr/local so the
// host is not touched) and its environment, with the LD_LIBRARY_PATH CUDA images set. Without a
// mount namespace, the host paths are given directly.
struct ContainerRun {
  std::vector<std::string> argv;
  std::map<std::string, std::string> environment;
};
ContainerRun asContainer(const v1beta1::ContainerAllocateResponse& allocation,
                         const std::string& program, const std::vector<std::string>& arguments) {
  ContainerRun container;
  for (const auto& [name, value] : allocation.envs()) container.environment[name] = value;
  // What nvidia/cuda images set (deploy/README.md, "Device-plugin mode").
  container.environment["LD_LIBRARY_PATH"] = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64";
  if (mountNamespaceAvailable()) {
    std::string script =
        "set -e; mount -t tmpfs gpuproxy-test /run; "
        "mount -t tmpfs gpuproxy-test /usr/local; ";
    for (const auto& mount : allocation.mounts()) {
      script += "mkdir -p '" + mount.container_path() + "'; mount --bind '" + mount.host_path() +
                "' '" + mount.container_path() + "'; ";
      if (mount.read_only()) {
        script += "mount -o remount,bind,ro '" + mount.container_path() + "'; ";
      }
    }
    script += "exec \"$@\"";
    container.argv = {"unshare", "--mount", "--propagation",       "private", "/bin/sh", "-c",
                      script,    "sh",      programBinary(program)};
  } else {
    for (const auto& mount : allocation.mounts()) {
      if (mount.container_path() == "/run/gpuproxy") {
        container.environment["GPUPROXY_SOCKET"] = mount.host_path() + "/gpuproxy.sock";
      } else if (mount.container_path() == "/usr/local/nvidia/lib64") {
        container.environment["LD_LIBRARY_PATH"] = mount.host_path();
      }
    }
    container.argv = {programBinary(program)};
  }
  container.argv.insert(container.argv.end(), arguments.begin(), arguments.end());
  return container;
}

RunResult runAsContainer(const v1beta1::ContainerAllocateResponse& allocation,
                         const std::string& program, const std::vector<std::string>& arguments) {
  auto container = asContainer(allocation, program, arguments);
  return run(container.argv, container.environment);
}

nlohmann::json allocationTenants(const nlohmann::json& status) {
  nlohmann::json tenants = nlohmann::json::array();
  for (const auto& tenant : status["tenants"]) {
    if (!tenant["allocation"].is_null()) tenants.push_back(tenant);
  }
  return tenants;
}

class DevicePlugin : public ::testing::Test {
protected:
  // Two GPUs of 256 MiB, four slots each: a slot is 64 MiB.
  DevicePlugin() : daemon_(Daemon::Options{2, "256MiB", {}, std::nullopt, false}) {}

  void SetUp() override {
    std::filesystem::create_directory(kubeletDirectory());
    kubelet_.start();
  }

  void TearDown() override {
    if (plugin_ && plugin_->running()) {
      plugin_->signal(SIGTERM);
      EXPECT_TRUE(plugin_->wait(std::chrono::seconds(20)).exitedWith(0)) << plugin_->errors();
    }
  }

  std::string kubeletDirectory() const { return directory_.file("device-plugins"); }
  std::string allocationRoot() const { return directory_.file("alloc"); }

  void startPlugin(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{pluginBinary(),
                                  "--admin-socket",
                                  daemon_.adminSocketPath(),
                                  "--kubelet-directory",
                                  kubeletDirectory(),
                                  "--allocation-root",
                                  allocationRoot(),
                                  "--stub-directory",
                                  stubDirectory(),
                                  "--slots-per-gpu",
                                  "4",
                                  "--daemon-poll-ms",
                                  "200",
                                  "--log-level",
                                  "debug"};
    // No PodResources unless the test serves one.
    if (std::find(extra.begin(), extra.end(), "--pod-resources-socket") == extra.end()) {
      argv.insert(argv.end(), {"--pod-resources-socket", ""});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    plugin_ = std::make_unique<Child>(argv);
  }

  // Waits until the kubelet has been sent `count` slots with `health`.
  bool slotsListed(std::size_t count, const std::string& health = "Healthy",
                   const std::string& resource = kResource) {
    return eventually(
        [&] {
          auto devices = kubelet_.devices(resource);
          return devices.size() == count &&
                 std::all_of(devices.begin(), devices.end(),
                             [&](const auto& device) { return device.second == health; });
        },
        std::chrono::seconds(20));
  }

  TempDir directory_;
  Daemon daemon_;
  FakeKubelet kubelet_{directory_.file("device-plugins")};
  std::unique_ptr<Child> plugin_;
};

TEST_F(DevicePlugin, AdvertisesSlotsAndGivesAContainerATenantWithTheSlotsLimit) {
  startPlugin();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  EXPECT_EQ(kubelet_.registrations(), 1);
  EXPECT_TRUE(kubelet_.options().get_preferred_allocation_available());
  EXPECT_FALSE(kubelet_.options().pre_start_required());

  // Two slots: the plugin prefers two of one GPU.
  auto preferred = kubelet_.preferred(slotsOf(kubelet_.devices()), {}, 2);
  ASSERT_EQ(preferred.size(), 2u);
  EXPECT_EQ(preferred[0].substr(0, 5), preferred[1].substr(0, 5))
      << preferred[0] << " " << preferred[1];

  v1beta1::AllocateResponse response;
  auto status = kubelet_.allocate({preferred}, response);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << plugin_->errors();
  ASSERT_EQ(response.container_responses_size(), 1);
  const auto& container = response.container_responses(0);
  EXPECT_EQ(container.envs().at("GPUPROXY_SOCKET"), "/run/gpuproxy/gpuproxy.sock");
  EXPECT_EQ(container.envs().at("NVIDIA_VISIBLE_DEVICES"), "void");
  std::map<std::string, v1beta1::Mount> mounts;
  for (const auto& mount : container.mounts()) mounts[mount.container_path()] = mount;
  ASSERT_EQ(mounts.count("/run/gpuproxy"), 1u);
  ASSERT_EQ(mounts.count("/usr/local/nvidia/lib64"), 1u);
  EXPECT_TRUE(mounts["/run/gpuproxy"].read_only());
  EXPECT_TRUE(mounts["/usr/local/nvidia/lib64"].read_only());
  EXPECT_EQ(mounts["/usr/local/nvidia/lib64"].host_path(), stubDirectory());
  EXPECT_EQ(mounts["/run/gpuproxy"].host_path().rfind(allocationRoot() + "/", 0), 0u);
  EXPECT_TRUE(std::filesystem::is_socket(mounts["/run/gpuproxy"].host_path() + "/gpuproxy.sock"));

  // The daemon has a tenant for the allocation, limited to two slots' memory on that GPU.
  auto tenants = allocationTenants(daemon_.status());
  ASSERT_EQ(tenants.size(), 1u) << tenants.dump(2);
  EXPECT_EQ(tenants[0]["allocation"]["resource"], kResource);
  std::vector<std::string> sorted = preferred;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(tenants[0]["allocation"]["device_ids"], nlohmann::json(sorted));
  EXPECT_EQ(tenants[0]["memory_limit"], 128 * kMiB);

  // A CUDA program in the "container" runs through the stub under that limit: 48 MiB fits...
  RunResult small = runAsContainer(container, "vector_add", {"--elements", "4194304"});
  EXPECT_TRUE(small.status.exitedWith(0)) << small.output << small.errors;
  EXPECT_NE(small.output.find("vector_add: OK"), std::string::npos) << small.output;
  // ... 192 MiB does not.
  RunResult large = runAsContainer(container, "vector_add", {"--elements", "16777216"});
  EXPECT_FALSE(large.status.exitedWith(0)) << large.output;
  EXPECT_NE(large.errors.find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << large.errors;

  // Two processes of the container share the limit: with 96 MiB held by one, 48 more do not fit.
  auto holder = asContainer(container, "vector_add",
                            {"--elements", "8388608", "--hold-ms", "60000", "--no-free"});
  Child holding(holder.argv, holder.environment);
  ASSERT_TRUE(eventually([&] {
    auto tenant = allocationTenants(daemon_.status());
    return tenant.size() == 1 && tenant[0]["memory_used"].get<std::uint64_t>() >= 96 * kMiB;
  })) << holding.errors();
  RunResult second = runAsContainer(container, "vector_add", {"--elements", "4194304"});
  EXPECT_FALSE(second.status.exitedWith(0)) << second.output;
  EXPECT_NE(second.errors.find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << second.errors;
  holding.signal(SIGKILL);
  holding.wait();
}

// The same slots asked for again before any pod used them (another container of the pod, as when
// the kubelet reuses an init container's slots) share one tenant.
TEST_F(DevicePlugin, ContainersGivenTheSameUnusedSlotsShareOneTenant) {
  startPlugin();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  v1beta1::AllocateResponse first;
  v1beta1::AllocateResponse second;
  ASSERT_TRUE(kubelet_.allocate({{"gpu1-slot0"}}, first).ok());
  ASSERT_TRUE(kubelet_.allocate({{"gpu1-slot0"}}, second).ok());
  EXPECT_EQ(first.container_responses(0).mounts(0).host_path(),
            second.container_responses(0).mounts(0).host_path());
  EXPECT_EQ(allocationTenants(daemon_.status()).size(), 1u);
}

TEST_F(DevicePlugin, RefusesARequestSpanningGpusAndLeavesNothingBehind) {
  startPlugin();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  v1beta1::AllocateResponse response;
  auto status = kubelet_.allocate({{"gpu0-slot0", "gpu1-slot0"}}, response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("spans GPUs"), std::string::npos) << status.error_message();
  EXPECT_NE(plugin_->errors().find("spans GPUs"), std::string::npos) << plugin_->errors();
  EXPECT_TRUE(allocationTenants(daemon_.status()).empty());
  EXPECT_FALSE(std::filesystem::exists(allocationRoot()) &&
               !std::filesystem::is_empty(allocationRoot()));
}

TEST_F(DevicePlugin, RefusesMalformedUnknownAndTooManySlotsWithAReason) {
  startPlugin();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  struct Case {
    std::vector<std::vector<std::string>> containers;
    std::string says;
  };
  const std::vector<Case> cases{
      {{{"not-a-slot"}}, "is not a device id"},
      {{{"gpu7-slot0"}}, "is not a slot"},
      {{{"gpu0-slot9"}}, "is not a slot"},
      {{{"gpu0-slot0", "gpu0-slot0"}}, "twice"},
      {{{}}, "names no device"},
      {{{"gpu0-slot0", "gpu0-slot1", "gpu0-slot2", "gpu0-slot3", "gpu0-slot4"}}, "a GPU has 4"},
      // The first container's tenant is made, the second is refused: the first is removed again.
      {{{"gpu0-slot0"}, {"gpu1-slot0", "gpu0-slot1"}}, "spans GPUs"},
  };
  for (const auto& test : cases) {
    v1beta1::AllocateResponse response;
    auto status = kubelet_.allocate(test.containers, response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << test.says;
    EXPECT_NE(status.error_message().find(test.says), std::string::npos) << status.error_message();
    EXPECT_NE(plugin_->errors().find(test.says), std::string::npos) << plugin_->errors();
  }
  EXPECT_TRUE(allocationTenants(daemon_.status()).empty());
  EXPECT_TRUE(!std::filesystem::exists(allocationRoot()) ||
              std::filesystem::is_empty(allocationRoot()));
}

TEST_F(DevicePlugin, AnAllocateWhileTheDaemonIsDownIsRefusedAsUnavailable) {
  startPlugin();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  ASSERT_TRUE(daemon_.stop().exitedWith(0));
  v1beta1::AllocateResponse response;
  auto status = kubelet_.allocate({{"gpu0-slot0"}}, response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("gpuproxyd is not reachable"), std::string::npos)
      << status.error_message();
  EXPECT_NE(plugin_->errors().find("Allocate refused: gpuproxyd is not reachable"),
            std::string::npos)
      << plugin_->errors();
  // The kubelet is told the slots are unhealthy, so it admits no new pod to them.
  EXPECT_TRUE(slotsListed(8, "Unhealthy")) << plugin_->errors();
  EXPECT_TRUE(!std::filesystem::exists(allocationRoot()) ||
              std::filesystem::is_empty(allocationRoot()));
}

// A daemon that takes the connection and never answers (stopped) does not hold the kubelet's
// Allocate, nor the plugin, for ever.
TEST_F(DevicePlugin, AnAllocateWhileTheDaemonDoesNotAnswerIsRefusedInTime) {
  startPlugin();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  daemon_.signal(SIGSTOP);
  v1beta1::AllocateResponse response;
  auto status = kubelet_.allocate({{"gpu0-slot0"}}, response);
  daemon_.signal(SIGCONT);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // Once it answers again, so does the plugin.
  status = kubelet_.allocate({{"gpu0-slot0"}}, response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(DevicePlugin, RegistersAgainWhenTheKubeletRestarts) {
  startPlugin();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  kubelet_.restart();
  ASSERT_TRUE(eventually([&] { return kubelet_.registrations() == 2; }, std::chrono::seconds(20)))
      << plugin_->errors();
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();
  EXPECT_NE(plugin_->errors().find("the kubelet restarted"), std::string::npos)
      << plugin_->errors();
  v1beta1::AllocateResponse response;
  auto status = kubelet_.allocate({{"gpu1-slot2"}}, response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(DevicePlugin, AKubeletThatNeverAnswersRegisterIsLoggedAndTriedAgain) {
  kubelet_.setAnswering(false);
  startPlugin({"--register-timeout-ms", "300"});
  ASSERT_TRUE(eventually(
      [&] { return plugin_->errors().find("did not answer Register") != std::string::npos; },
      std::chrono::seconds(20)))
      << plugin_->errors();
  EXPECT_TRUE(plugin_->running());
  kubelet_.setAnswering(true);
  EXPECT_TRUE(slotsListed(8)) << plugin_->errors();
}

// Profiles from the daemon's tenants file: each its own resource, registered on its own socket,
// whose slots carry the profile's memory limit, weight and class.
TEST_F(DevicePlugin, ProfilesFromTheConfigFileAreResourcesOfTheirOwn) {
  const std::string config = directory_.file("tenants.yaml");
  {
    std::ofstream file(config);
    file << "tenants: []\n"
            "device_plugin:\n"
            "  slots_per_gpu: 2\n"
            "  profiles:\n"
            "    - resource: gpuproxy.io/gpu-32mb\n"
            "      slots_per_gpu: 3\n"
            "      memory_limit: 32MiB\n"
            "      weight: 5\n"
            "      class: latency-critical\n";
  }
  startPlugin({"--config", config});
  ASSERT_TRUE(slotsListed(4)) << plugin_->errors();
  ASSERT_TRUE(slotsListed(6, "Healthy", "gpuproxy.io/gpu-32mb")) << plugin_->errors();
  EXPECT_EQ(kubelet_.registrations(), 2);

  v1beta1::AllocateResponse response;
  auto status = kubelet_.allocate({{"gpu1-slot1", "gpu1-slot2"}}, response, "gpuproxy.io/gpu-32mb");
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto tenants = allocationTenants(daemon_.status());
  ASSERT_EQ(tenants.size(), 1u);
  EXPECT_EQ(tenants[0]["allocation"]["resource"], "gpuproxy.io/gpu-32mb");
  EXPECT_EQ(tenants[0]["memory_limit"], 64 * kMiB);
  EXPECT_EQ(tenants[0]["weight"], 10);
  EXPECT_EQ(tenants[0]["class"], "latency-critical");
  EXPECT_EQ(tenants[0]["devices"], nlohmann::json::array({1}));
}

TEST_F(DevicePlugin, PodResourcesNamesTheAllocationsPodAndItsTenantGoesWithThePod) {
  const std::string podResourcesSocket = directory_.file("pod-resources.sock");
  FakePodResources podResources(podResourcesSocket);
  startPlugin({"--pod-resources-socket", podResourcesSocket, "--pod-resources-interval-ms", "100",
               "--pod-resources-grace-ms", "0"});
  ASSERT_TRUE(slotsListed(8)) << plugin_->errors();

  v1::ListPodResourcesResponse listing;
  auto* pod = listing.add_pod_resources();
  pod->set_name("trainer-0");
  pod->set_namespace_("ml");
  auto* container = pod->add_containers();
  container->set_name("main");
  auto* devices = container->add_devices();
  devices->set_resource_name(kResource);
  devices->add_device_ids("gpu0-slot1");
  podResources.set(listing);

  v1beta1::AllocateResponse response;
  ASSERT_TRUE(kubelet_.allocate({{"gpu0-slot1"}}, response).ok());
  const std::string socketDirectory = response.container_responses(0).mounts(0).host_path();
  ASSERT_TRUE(eventually([&] {
    auto tenants = allocationTenants(daemon_.status());
    return tenants.size() == 1 && tenants[0]["pod"].is_object() &&
           tenants[0]["pod"]["name"] == "trainer-0";
  })) << plugin_->errors();
  RunResult table = daemon_.ctl({"status"});
  EXPECT_NE(table.output.find("ml/trainer-0/main"), std::string::npos) << table.output;

  // A client of the pod is attached when the pod goes: the tenant and its socket are removed
  // and the client's session is reclaimed.
  auto holder = asContainer(response.container_responses(0), "vector_add",
                            {"--elements", "1048576", "--hold-ms", "60000"});
  Child holding(holder.argv, holder.environment);
  ASSERT_TRUE(eventually([&] {
    auto tenants = allocationTenants(daemon_.status());
    return tenants.size() == 1 && tenants[0]["clients"] == 1;
  })) << holding.errors();
  // Its client is named after the pod as well.
  const auto status = daemon_.status();
  ASSERT_EQ(status["clients"].size(), 1u) << status.dump(2);
  EXPECT_EQ(status["clients"][0]["pod"]["namespace"], "ml");
  EXPECT_EQ(status["clients"][0]["pod"]["name"], "trainer-0");
  EXPECT_EQ(status["clients"][0]["pod"]["containers"], nlohmann::json::array({"main"}));

  podResources.set({});
  EXPECT_TRUE(eventually([&] { return allocationTenants(daemon_.status()).empty(); }))
      << plugin_->errors();
  EXPECT_FALSE(std::filesystem::exists(socketDirectory));
  EXPECT_TRUE(eventually([&] {
    const nlohmann::json status = daemon_.status();  // kept: the loop reads into it
    for (const auto& client : status["clients"]) {
      if (client["pid"] == holding.pid()) return false;
    }
    return true;
  })) << daemon_.log();
  holding.signal(SIGKILL);
  holding.wait();
  EXPECT_NE(plugin_->errors().find("no pod holds its slots"), std::string::npos)
      << plugin_->errors();
}

}  // namespace
}  // namespace gpuproxy::testing
