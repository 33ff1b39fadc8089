// Which pod a client belongs to, as gpuproxyd reads it from the client's cgroup: status names its
// pod UID and container ID, and a device plugin allocation's socket serves the first pod that comes
// through it and refuses every other pod. Clients are put into kubepods-style cgroups made here, as
// the kubelet's container runtime would; that needs root and a cgroup hierarchy this test may make
// groups in (a cgroup v1 controller, or cgroup v2), and the test skips saying why otherwise.
#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "tests/support/process.hpp"

#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace gpuproxy::testing {
namespace {

constexpr unsigned long kCgroup2Magic = 0x63677270;

// A pod's container cgroup, made where the kubelet's cgroupfs driver would put it, and removed
// (with the groups above it this made) when the test ends.
class PodCgroup {
public:
  PodCgroup(const std::string& podUid, const std::string& containerId) {
    // cgroup v2 when /sys/fs/cgroup is one; else the v1 `pids` controller, whose path the daemon
    // reads from the same /proc/PID/cgroup file.
    struct statfs info {};
    const bool unified = ::statfs("/sys/fs/cgroup", &info) == 0 &&
                         static_cast<unsigned long>(info.f_type) == kCgroup2Magic;
    const std::string root = unified ? "/sys/fs/cgroup" : "/sys/fs/cgroup/pids";
    for (const std::string& part :
         {std::string("kubepods"), std::string("besteffort"), "pod" + podUid, containerId}) {
      const std::string next = (made_.empty() ? root : made_.back()) + "/" + part;
      if (::mkdir(next.c_str(), 0755) != 0 && errno != EEXIST) {
        error_ = next + ": " + std::strerror(errno);
        return;
      }
      made_.push_back(next);
    }
  }
  ~PodCgroup() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) ::rmdir(it->c_str());
  }
  PodCgroup(const PodCgroup&) = delete;
  PodCgroup& operator=(const PodCgroup&) = delete;

  // Why this cgroup could not be made; empty when it was.
  const std::string& error() const { return error_; }
  // `argv`, run from inside this cgroup: a shell moves itself in, then becomes the program.
  std::vector<std::string> inside(std::vector<std::string> argv) const {
    std::vector<std::string> wrapped = {
        "/bin/sh", "-c", "echo $$ > '" + made_.back() + "/cgroup.procs' && exec \"$@\"", "sh"};
    wrapped.insert(wrapped.end(), argv.begin(), argv.end());
    return wrapped;
  }

private:
  std::vector<std::string> made_;
  std::string error_;
};

const std::string kPodA = "7d3c2b1a-0f9e-4d8c-b7a6-958473625140";
const std::string kPodB = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
const std::string kContainerA(64, 'a');
const std::string kContainerB(64, 'b');

class PodIdentity : public ::testing::Test {
protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: it makes cgroups and moves clients in";
    podA_ = std::make_unique<PodCgroup>(kPodA, kContainerA);
    podB_ = std::make_unique<PodCgroup>(kPodB, kContainerB);
    for (const PodCgroup* pod : {podA_.get(), podB_.get()}) {
      if (!pod->error().empty()) GTEST_SKIP() << "cannot make a cgroup here: " << pod->error();
      RunResult moved = run(pod->inside({"/bin/true"}));
      if (!moved.status.exitedWith(0)) {
        GTEST_SKIP() << "cannot move a process into a cgroup made here: " << moved.errors;
      }
    }
  }
  void TearDown() override {
    clients_.clear();  // every client gone before its cgroup is removed
    podA_.reset();
    podB_.reset();
  }

  // `error_probe ARGS` through `socket`, from inside `pod` (or the test's own cgroup: null).
  Child& startProbe(const PodCgroup* pod, const std::string& socket,
                    std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), programBinary("error_probe"));
    std::map<std::string, std::string> environment = daemon_.clientEnvironment();
    environment["GPUPROXY_SOCKET"] = socket;
    clients_.push_back(
        std::make_unique<Child>(pod ? pod->inside(arguments) : arguments, std::move(environment)));
    return *clients_.back();
  }

  nlohmann::json clientWithPid(pid_t pid) {
    const nlohmann::json status = daemon_.status();
    for (const auto& client : status["clients"]) {
      if (client["pid"] == pid) return client;
    }
    return nullptr;
  }

  Daemon daemon_;
  TempDir directory_;
  std::unique_ptr<PodCgroup> podA_;
  std::unique_ptr<PodCgroup> podB_;
  std::vector<std::unique_ptr<Child>> clients_;
};

TEST_F(PodIdentity, StatusNamesTheClientsPodAndContainer) {
  Child& inPod = startProbe(podA_.get(), daemon_.socketPath(), {"alloc-and-hold", "4096"});
  ASSERT_TRUE(eventually([&] { return !clientWithPid(inPod.pid()).is_null(); }))
      << inPod.errors() << daemon_.log();
  const nlohmann::json client = clientWithPid(inPod.pid());
  EXPECT_EQ(client["pod_uid"], kPodA) << client.dump(2);
  EXPECT_EQ(client["container_id"], kContainerA) << client.dump(2);
  EXPECT_NE(client["cgroup"].get<std::string>().find("pod" + kPodA), std::string::npos);
}

TEST_F(PodIdentity, AnAllocationsSocketServesOnePodAndRefusesTheOthers) {
  // A tenant for an allocation, as the device plugin makes one.
  const std::string socketDirectory = directory_.file("alloc/pods");
  {
    capnp::EzRpcClient admin("unix:" + daemon_.adminSocketPath());
    auto request = admin.getMain<protocol::Admin>().createTenantRequest();
    auto spec = request.initSpec();
    spec.setName("alloc-pods");
    spec.setSocketDirectory(socketDirectory);
    auto allocation = spec.initAllocation();
    allocation.setResource("gpuproxy.io/gpu");
    allocation.initDeviceIds(1).set(0, "gpu0-slot0");
    auto answer = request.send().wait(admin.getWaitScope());
    ASSERT_EQ(std::string(answer.getError().cStr()), "");
  }
  const std::string socket = socketDirectory + "/gpuproxy.sock";

  // The first pod through it gets it.
  Child& first = startProbe(podA_.get(), socket, {"alloc-and-hold", "4096"});
  ASSERT_TRUE(eventually([&] { return !clientWithPid(first.pid()).is_null(); }))
      << first.errors() << daemon_.log();
  EXPECT_EQ(tenantNamed(daemon_.status(), "alloc-pods")["bound_pod_uid"], kPodA);

  // Another pod's process is refused, and never becomes a client.
  Child& intruder = startProbe(podB_.get(), socket, {"alloc", "4096"});
  ExitStatus refused = intruder.wait(std::chrono::seconds(30));
  EXPECT_FALSE(refused.exitedWith(0)) << intruder.output();
  EXPECT_EQ(answers(intruder.output()).count("cuMemAlloc"), 0u) << intruder.output();
  EXPECT_NE(daemon_.log().find("of pod " + kPodB + " on tenant 'alloc-pods'"), std::string::npos)
      << daemon_.log();

  // The same pod's other processes are served (all of its containers share the allocation), and
  // so is a process on the host, which reaches the path only through the host's file system.
  Child& sibling = startProbe(podA_.get(), socket, {"alloc", "4096"});
  EXPECT_TRUE(sibling.wait(std::chrono::seconds(30)).exitedWith(0)) << sibling.errors();
  EXPECT_EQ(answers(sibling.output())["cuMemAlloc"], "CUDA_SUCCESS") << sibling.output();
  Child& host = startProbe(nullptr, socket, {"alloc", "4096"});
  EXPECT_TRUE(host.wait(std::chrono::seconds(30)).exitedWith(0)) << host.errors();
  EXPECT_EQ(answers(host.output())["cuMemAlloc"], "CUDA_SUCCESS") << host.output();
}

}  // namespace
}  // namespace gpuproxy::testing
