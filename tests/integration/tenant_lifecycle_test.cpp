// Tenants created and removed while the daemon runs (gpuproxyctl create-tenant/remove-tenant, the
// Admin interface the device plugin uses): each its own socket and limits and an id no other
// tenant gets; removing one closes its socket and reclaims its clients; a refused request leaves
// nothing behind; with --state-dir they outlive the daemon.
#include <cuda.h>
#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "tests/support/process.hpp"

#include <capnp/ez-rpc.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpuproxy::testing {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

bool exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

class TenantLifecycle : public ::testing::Test {
protected:
  RunResult ctl(std::vector<std::string> arguments) { return daemon_.ctl(std::move(arguments)); }

  nlohmann::json ctlJson(std::vector<std::string> arguments) {
    arguments.push_back("--json");
    RunResult result = ctl(arguments);
    return nlohmann::json::parse(result.output);
  }

  TempDir directory_;
  Daemon daemon_;
};

TEST_F(TenantLifecycle, ATenantCreatedAtRunTimeServesItsSocketWithItsLimits) {
  const std::string socketDirectory = directory_.file("alloc/team");
  RunResult created = ctl({"create-tenant", "team", "--socket-dir", socketDirectory, "--memory",
                           "4MiB", "--weight", "3", "--class", "latency-critical", "--json"});
  ASSERT_TRUE(created.status.exitedWith(0)) << created.output << created.errors;
  const nlohmann::json answer = nlohmann::json::parse(created.output);
  const std::string socket = socketDirectory + "/gpuproxy.sock";
  EXPECT_EQ(answer["socket"], socket);
  EXPECT_TRUE(exists(socket));

  RunResult result =
      daemon_.runClientOn(socket, "error_probe", {"alloc", std::to_string(5 * kMiB)});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.errors;
  EXPECT_EQ(answers(result.output)["cuMemAlloc"], "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(answers(result.output)["total"], std::to_string(4 * kMiB));

  const nlohmann::json tenant = tenantNamed(daemon_.status(), "team");
  ASSERT_FALSE(tenant.is_null());
  EXPECT_EQ(tenant["id"], answer["id"]);
  EXPECT_EQ(tenant["origin"], "runtime");
  EXPECT_EQ(tenant["weight"], 3);
  EXPECT_EQ(tenant["class"], "latency-critical");
  EXPECT_EQ(tenant["oom_count"], 1);
  EXPECT_EQ(tenant["socket"], socket);
  EXPECT_NE(tenant["id"], tenantNamed(daemon_.status(), "default")["id"]);
}

TEST_F(TenantLifecycle, RemovingATenantClosesItsSocketAndReclaimsItsClients) {
  const std::string socketDirectory = directory_.file("alloc/gone");
  ASSERT_TRUE(ctl({"create-tenant", "gone", "--socket-dir", socketDirectory}).status.exitedWith(0));
  const std::string socket = socketDirectory + "/gpuproxy.sock";
  auto holder = daemon_.startClientOn(socket, "error_probe", {"alloc-and-hold", "8388608"});
  ASSERT_TRUE(eventually([&] { return daemon_.status()["devices"][0]["memory_used"] == 8 * kMiB; }))
      << daemon_.log();

  const nlohmann::json removed = ctlJson({"remove-tenant", "gone"});
  EXPECT_EQ(removed["ok"], true) << removed.dump();
  EXPECT_EQ(removed["connections_ended"], 1);
  // Its client's session ended and everything it held came back; its socket and the directories
  // the daemon made for it are gone.
  EXPECT_TRUE(eventually([&] {
    auto status = daemon_.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon_.status().dump(2);
  EXPECT_TRUE(tenantNamed(daemon_.status(), "gone").is_null());
  EXPECT_FALSE(exists(socket));
  EXPECT_FALSE(exists(socketDirectory));
  EXPECT_FALSE(exists(directory_.file("alloc")));
  // A new client cannot reach it any more.
  RunResult late = daemon_.runClientOn(socket, "error_probe", {"init"});
  EXPECT_EQ(answers(late.output)["cuInit"], "CUDA_ERROR_NO_DEVICE") << late.output << late.errors;

  RunResult again = ctl({"remove-tenant", "gone"});
  EXPECT_EQ(again.status.code, 1);
  EXPECT_NE(again.errors.find("no tenant named 'gone'"), std::string::npos) << again.errors;
}

TEST_F(TenantLifecycle, TenantIdsAreNeverGivenToAnotherTenant) {
  const std::string socketDirectory = directory_.file("again");
  const nlohmann::json first = ctlJson({"create-tenant", "again", "--socket-dir", socketDirectory});
  ASSERT_EQ(first["ok"], true) << first.dump();
  ASSERT_EQ(ctlJson({"remove-tenant", "again"})["ok"], true);
  const nlohmann::json second =
      ctlJson({"create-tenant", "again", "--socket-dir", socketDirectory});
  ASSERT_EQ(second["ok"], true) << second.dump();
  EXPECT_NE(first["id"], second["id"]);
  // Its clients and its metrics are the new tenant's.
  RunResult run =
      daemon_.runClientOn(socketDirectory + "/gpuproxy.sock", "vector_add", {"--elements", "1024"});
  EXPECT_TRUE(run.status.exitedWith(0)) << run.errors;
  EXPECT_EQ(tenantNamed(daemon_.status(), "again")["kernels_launched"], 1);
}

TEST_F(TenantLifecycle, ARefusedCreateLeavesNothingBehind) {
  struct Refusal {
    std::vector<std::string> arguments;
    std::string reason;
  };
  const std::string fresh = directory_.file("fresh/deeper");
  std::ofstream(directory_.file("plain-file")) << "not a directory\n";
  const std::vector<Refusal> refusals{
      {{"create-tenant", "bad name!", "--socket-dir", fresh}, "is not valid"},
      {{"create-tenant", "default", "--socket-dir", fresh}, "a tenant named 'default' exists"},
      {{"create-tenant", "rel", "--socket-dir", "relative/dir"}, "is not an absolute path"},
      {{"create-tenant", "dots", "--socket-dir", directory_.file("a/../b")}, "'.' or '..'"},
      {{"create-tenant", "gpu9", "--socket-dir", fresh, "--devices", "9"},
       "device 9 does not exist"},
      {{"create-tenant", "heavy", "--socket-dir", fresh, "--weight", "20000"},
       "weight 20000 is not between 1 and 10000"},
      {{"create-tenant", "taken", "--socket-dir",
        std::filesystem::path(daemon_.socketPath()).parent_path().string()},
       "is tenant 'default''s"},
      {{"create-tenant", "under-file", "--socket-dir", directory_.file("plain-file/sub")},
       "cannot create directory"},
      {{"create-tenant", "long", "--socket-dir", "/" + std::string(120, 'x')}, "longer than"},
  };
  for (const Refusal& refusal : refusals) {
    RunResult result = ctl(refusal.arguments);
    EXPECT_EQ(result.status.code, 1) << refusal.arguments[1];
    EXPECT_NE(result.errors.find(refusal.reason), std::string::npos)
        << refusal.arguments[1] << ": " << result.errors;
  }
  EXPECT_FALSE(exists(directory_.file("fresh")));
  EXPECT_FALSE(exists(directory_.file("b")));
  EXPECT_FALSE(exists("/" + std::string(120, 'x')));
  // Only the default tenant is there, and it still serves.
  EXPECT_EQ(daemon_.status()["tenants"].size(), 1u);
  EXPECT_TRUE(daemon_.runClient("vector_add", {"--elements", "1024"}).status.exitedWith(0));
}

TEST(TenantLifecycleConfig, TenantsFromTheFileAreRemovedOnlyThroughTheFile) {
  TempDir directory;
  const std::string config = directory.file("tenants.yaml");
  std::ofstream(config) << "tenants:\n  - name: filed\n    socket: "
                        << directory.file("filed/gpuproxy.sock") << "\n";
  Daemon::Options options;
  options.extraArguments = {"--config", config};
  Daemon daemon(options);
  RunResult refused = daemon.ctl({"remove-tenant", "filed"});
  EXPECT_EQ(refused.status.code, 1);
  EXPECT_NE(refused.errors.find("comes from the tenants file"), std::string::npos)
      << refused.errors;
  EXPECT_EQ(tenantNamed(daemon.status(), "filed")["origin"], "config");

  // A run-time tenant survives a reload, and the file cannot take its name.
  ASSERT_TRUE(daemon.ctl({"create-tenant", "live", "--socket-dir", directory.file("live")})
                  .status.exitedWith(0));
  std::ofstream(config) << "tenants:\n  - name: live\n    socket: "
                        << directory.file("other/gpuproxy.sock") << "\n";
  daemon.signal(SIGHUP);
  ASSERT_TRUE(eventually([&] {
    return daemon.log().find("keeping the running configuration") != std::string::npos;
  })) << daemon.log();
  EXPECT_NE(daemon.log().find("tenant 'live' was created at run time"), std::string::npos);
  EXPECT_FALSE(exists(directory.file("other")));
  std::ofstream(config) << "tenants: []\n";
  daemon.signal(SIGHUP);
  ASSERT_TRUE(eventually([&] { return tenantNamed(daemon.status(), "filed").is_null(); }))
      << daemon.log();
  EXPECT_FALSE(tenantNamed(daemon.status(), "live").is_null());
  EXPECT_TRUE(
      daemon.runClientOn(directory.file("live/gpuproxy.sock"), "vector_add", {"--elements", "1024"})
          .status.exitedWith(0));
}

// With --state-dir, run-time tenants outlive the daemon: a restarted gpuproxyd serves them again in
// the very directories that pods hold mounted, with their limits.
TEST(TenantLifecycleRestart, RunTimeTenantsOutliveARestartWithAStateDirectory) {
  TempDir directory;
  Daemon::Options options;
  options.extraArguments = {"--state-dir", directory.file("state")};
  const std::string socketDirectory = directory.file("alloc/team");
  int mount = -1;  // the socket directory, held as a pod's bind mount holds it
  {
    Daemon first(options);
    RunResult created = first.ctl({"create-tenant", "team", "--socket-dir", socketDirectory,
                                   "--memory", "4MiB", "--weight", "3"});
    ASSERT_TRUE(created.status.exitedWith(0)) << created.errors;
    mount = ::open(socketDirectory.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(mount, 0);
    ASSERT_TRUE(first.stop().exitedWith(0)) << first.log();
  }
  // The socket went with the daemon; its directory stays for the next one.
  EXPECT_TRUE(exists(socketDirectory));
  EXPECT_FALSE(exists(socketDirectory + "/gpuproxy.sock"));

  Daemon second(options);
  const nlohmann::json tenant = tenantNamed(second.status(), "team");
  ASSERT_FALSE(tenant.is_null()) << second.log();
  EXPECT_EQ(tenant["origin"], "runtime");
  EXPECT_EQ(tenant["weight"], 3);
  EXPECT_EQ(tenant["memory_limit"], 4 * kMiB);
  // A client reaches it through the directory held before the restart, and gets its limit.
  const std::string throughMount =
      "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(mount) + "/gpuproxy.sock";
  RunResult result =
      second.runClientOn(throughMount, "error_probe", {"alloc", std::to_string(5 * kMiB)});
  ::close(mount);
  ASSERT_TRUE(result.status.exitedWith(0)) << result.errors << second.log();
  EXPECT_EQ(answers(result.output)["cuMemAlloc"], "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(answers(result.output)["total"], std::to_string(4 * kMiB));

  // Removed, it is gone for good: the next daemon does not serve it.
  ASSERT_TRUE(second.ctl({"remove-tenant", "team"}).status.exitedWith(0));
  ASSERT_TRUE(second.stop().exitedWith(0));
  Daemon third(options);
  EXPECT_TRUE(tenantNamed(third.status(), "team").is_null()) << third.log();
}

// What the device plugin sends: a tenant for an allocation, then the pod that holds it.
TEST_F(TenantLifecycle, AnAllocationsTenantCarriesItsResourceAndPod) {
  capnp::EzRpcClient client("unix:" + daemon_.adminSocketPath());
  auto& waitScope = client.getWaitScope();
  auto admin = client.getMain<protocol::Admin>();
  auto create = admin.createTenantRequest();
  auto spec = create.initSpec();
  spec.setName("alloc-0123");
  spec.setSocketDirectory(directory_.file("alloc/0123"));
  spec.setHasMemoryLimit(true);
  spec.setMemoryLimit(64 * kMiB);
  auto allocation = spec.initAllocation();
  allocation.setResource("gpuproxy.io/gpu");
  auto ids = allocation.initDeviceIds(2);
  ids.set(0, "GPU-0::0");
  ids.set(1, "GPU-0::1");
  auto created = create.send().wait(waitScope);
  ASSERT_EQ(std::string(created.getError().cStr()), "");

  auto label = admin.setTenantPodRequest();
  label.setName("alloc-0123");
  auto pod = label.initPod();
  pod.setPodNamespace("ml");
  pod.setPodName("trainer-7f9c");
  pod.initContainers(1).set(0, "main");
  EXPECT_EQ(std::string(label.send().wait(waitScope).getError().cStr()), "");

  const nlohmann::json tenant = tenantNamed(daemon_.status(), "alloc-0123");
  EXPECT_EQ(tenant["allocation"]["resource"], "gpuproxy.io/gpu");
  EXPECT_EQ(tenant["allocation"]["device_ids"], nlohmann::json::array({"GPU-0::0", "GPU-0::1"}));
  EXPECT_EQ(tenant["pod"]["namespace"], "ml");
  EXPECT_EQ(tenant["pod"]["name"], "trainer-7f9c");
  EXPECT_EQ(tenant["pod"]["containers"], nlohmann::json::array({"main"}));
  RunResult table = ctl({"status"});
  EXPECT_NE(table.output.find("ml/trainer-7f9c/main"), std::string::npos) << table.output;

  auto unknown = admin.setTenantPodRequest();
  unknown.setName("nobody");
  EXPECT_NE(std::string(unknown.send().wait(waitScope).getError().cStr()), "");
}

}  // namespace
}  // namespace gpuproxy::testing
