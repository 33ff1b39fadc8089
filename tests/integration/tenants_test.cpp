// Tenants: limits a client cannot fake or raise, per-tenant sockets, live limit changes,
// eviction, reload, and the operator's view.
#include <cuda.h>
#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "tests/support/process.hpp"

#include <arpa/inet.h>
#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

namespace gpuproxy::testing {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// A daemon with two tenants, `alpha` limited to 4 MiB per device and `beta` unlimited.
class Tenants : public ::testing::Test {
protected:
  Tenants() {
    writeConfig("4MiB");
    Daemon::Options options;
    options.extraArguments = {"--config", config_};
    daemon_ = std::make_unique<Daemon>(options);
  }

  void writeConfig(const std::string& alphaLimit) {
    std::ofstream out(config_);
    out << "tenants:\n"
        << "  - name: alpha\n"
        << "    socket: " << alpha_ << "\n"
        << "    memory_limit: " << alphaLimit << "\n"
        << "    weight: 2\n"
        << "    class: latency-critical\n"
        << "  - name: beta\n"
        << "    socket: " << beta_ << "\n";
  }

  std::map<std::string, std::string> alloc(const std::string& socket, std::uint64_t bytes,
                                           std::map<std::string, std::string> env = {}) {
    RunResult result =
        daemon_->runClientOn(socket, "error_probe", {"alloc", std::to_string(bytes)}, env);
    EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors;
    return answers(result.output);
  }

  TempDir directory_;
  std::string config_ = directory_.file("tenants.yaml");
  std::string alpha_ = directory_.file("alpha/gpuproxy.sock");
  std::string beta_ = directory_.file("beta/gpuproxy.sock");
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(Tenants, ALimitIsSharedByATenantsClientsAndOthersAreUnaffected) {
  auto holder = daemon_->startClientOn(alpha_, "error_probe", {"alloc-and-hold", "3145728"});
  ASSERT_TRUE(eventually([&] {
    return daemon_->status()["devices"][0]["memory_used"] == 3 * kMiB;
  })) << daemon_->log();

  // A second client of the same tenant cannot take the rest of the card.
  auto refused = alloc(alpha_, 2 * kMiB);
  EXPECT_EQ(refused["cuMemAlloc"], "CUDA_ERROR_OUT_OF_MEMORY");
  // cuMemGetInfo tells it what its tenant has left.
  EXPECT_EQ(refused["cuMemGetInfo"], "CUDA_SUCCESS");
  EXPECT_EQ(refused["free"], std::to_string(1 * kMiB));
  EXPECT_EQ(refused["total"], std::to_string(4 * kMiB));
  EXPECT_EQ(alloc(alpha_, 512 << 10)["cuMemAlloc"], "CUDA_SUCCESS");

  // Another tenant is not limited by alpha's use.
  auto other = alloc(beta_, 64 * kMiB);
  EXPECT_EQ(other["cuMemAlloc"], "CUDA_SUCCESS");
  EXPECT_EQ(other["total"], std::to_string(16ull << 30));

  auto status = daemon_->status();
  auto alpha = tenantNamed(status, "alpha");
  EXPECT_EQ(alpha["memory_limit"], 4 * kMiB);
  EXPECT_EQ(alpha["memory_used"], 3 * kMiB);
  EXPECT_EQ(alpha["oom_count"], 1);
  EXPECT_EQ(alpha["clients"], 1);
  EXPECT_EQ(alpha["weight"], 2);
  EXPECT_EQ(alpha["class"], "latency-critical");
  ASSERT_EQ(status["clients"].size(), 1u);
  EXPECT_EQ(status["clients"][0]["tenant"], "alpha");
  EXPECT_FALSE(status["clients"][0]["cgroup"].get<std::string>().empty());
  EXPECT_EQ(tenantNamed(status, "beta")["memory_limit"], nullptr);
}

TEST_F(Tenants, NothingInTheClientsEnvironmentChangesItsTenantOrLimit) {
  std::map<std::string, std::string> hostile{
      {"GPUPROXY_TENANT", "beta"},
      {"GPUPROXY_MEMORY_LIMIT", "64GiB"},
      {"GPUPROXY_LOG_LEVEL", "debug"},
      {"GPUPROXY_INSIDE_DAEMON", "0"},
      {"CUDA_DEVICE_MEMORY_LIMIT", "64g"},
      {"CUDA_DEVICE_MEMORY_LIMIT_0", "64g"},
      {"CUDA_DEVICE_SM_LIMIT", "100"},
      {"CUDA_VISIBLE_DEVICES", "0,1,2,3"},
      {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=64G"},
      {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"},
      {"LD_PRELOAD", ""},
  };
  auto result = alloc(alpha_, 5 * kMiB, hostile);
  EXPECT_EQ(result["cuMemAlloc"], "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(result["total"], std::to_string(4 * kMiB));
  EXPECT_EQ(tenantNamed(daemon_->status(), "alpha")["oom_count"], 1);
}

TEST_F(Tenants, HandCraftedControlMessagesGetTheTenantsLimitToo) {
  // A client that skips the stub and speaks the protocol itself.
  capnp::EzRpcClient client("unix:" + alpha_);
  auto& waitScope = client.getWaitScope();
  auto gateway = client.getMain<protocol::Gateway>();
  {
    auto wrongVersion = gateway.attachRequest();
    wrongVersion.setProtocolVersion(0xffffffff);
    EXPECT_EQ(wrongVersion.send().wait(waitScope).getResult(), CUDA_ERROR_SYSTEM_DRIVER_MISMATCH);
  }
  auto attach = gateway.attachRequest();
  attach.setProtocolVersion(protocol::PROTOCOL_VERSION);
  auto attached = attach.send().wait(waitScope);
  ASSERT_EQ(attached.getResult(), CUDA_SUCCESS);
  auto session = attached.getSession();
  auto context = session.retainPrimaryContextRequest();
  context.setDevice(0);
  auto contextResult = context.send().wait(waitScope);
  ASSERT_EQ(contextResult.getResult(), CUDA_SUCCESS);
  for (std::uint64_t bytes : std::vector<std::uint64_t>{5 * kMiB, ~0ull, (~0ull / 2) + 7}) {
    auto request = session.memAllocRequest();
    request.setContext(contextResult.getContext());
    request.setBytes(bytes);
    EXPECT_EQ(request.send().wait(waitScope).getResult(), CUDA_ERROR_OUT_OF_MEMORY) << bytes;
  }
  // A device the daemon does not have is not reachable either.
  auto elsewhere = session.createContextRequest();
  elsewhere.setDevice(7);
  EXPECT_EQ(elsewhere.send().wait(waitScope).getResult(), CUDA_ERROR_INVALID_DEVICE);
  auto info = session.memGetInfoRequest();
  info.setContext(contextResult.getContext());
  EXPECT_EQ(info.send().wait(waitScope).getTotal(), 4 * kMiB);
}

// Physical memory exported to a shareable handle: the token opens only in the exporter's tenant,
// whatever a hand-crafted client sends, and the memory is charged once, to its maker.
TEST_F(Tenants, ExportedPhysicalMemoryImportsIntoItsOwnTenantOnly) {
  auto attach = [](capnp::EzRpcClient& client) {
    auto request = client.getMain<protocol::Gateway>().attachRequest();
    request.setProtocolVersion(protocol::PROTOCOL_VERSION);
    auto attached = request.send().wait(client.getWaitScope());
    EXPECT_EQ(attached.getResult(), CUDA_SUCCESS);
    return attached.getSession();
  };
  capnp::EzRpcClient maker("unix:" + alpha_);
  capnp::EzRpcClient colleague("unix:" + alpha_);
  capnp::EzRpcClient stranger("unix:" + beta_);
  auto& waitScope = maker.getWaitScope();
  auto makerSession = attach(maker);
  auto colleagueSession = attach(colleague);
  auto strangerSession = attach(stranger);

  auto create = makerSession.memCreateRequest();
  create.setDevice(0);
  create.setBytes(2 * kMiB);
  auto created = create.send().wait(waitScope);
  ASSERT_EQ(created.getResult(), CUDA_SUCCESS);
  auto beyond = makerSession.memCreateRequest();
  beyond.setDevice(0);
  beyond.setBytes(4 * kMiB);  // alpha's limit is 4 MiB
  EXPECT_EQ(beyond.send().wait(waitScope).getResult(), CUDA_ERROR_OUT_OF_MEMORY);
  auto exportRequest = makerSession.memExportRequest();
  exportRequest.setHandle(created.getHandle());
  auto exported = exportRequest.send().wait(waitScope);
  ASSERT_EQ(exported.getResult(), CUDA_SUCCESS);

  auto import = [&](protocol::Session::Client& session, std::uint32_t device,
                    capnp::Data::Reader token) {
    auto request = session.memImportRequest();
    request.setDevice(device);
    request.setToken(token);
    return request.send().wait(waitScope);
  };
  EXPECT_EQ(import(strangerSession, exported.getDevice(), exported.getToken()).getResult(),
            CUDA_ERROR_INVALID_VALUE);
  const capnp::byte shortToken[3] = {1, 2, 3};
  EXPECT_EQ(import(colleagueSession, 0, capnp::Data::Reader(shortToken, 3)).getResult(),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(import(colleagueSession, 7, exported.getToken()).getResult(),
            CUDA_ERROR_INVALID_DEVICE);
  auto theirs = strangerSession.memExportRequest();
  theirs.setHandle(created.getHandle());
  EXPECT_EQ(theirs.send().wait(waitScope).getResult(), CUDA_ERROR_INVALID_VALUE);

  auto imported = import(colleagueSession, exported.getDevice(), exported.getToken());
  ASSERT_EQ(imported.getResult(), CUDA_SUCCESS);
  EXPECT_EQ(imported.getBytes(), 2 * kMiB);
  EXPECT_EQ(imported.getOrdinal(), 0u);
  EXPECT_EQ(tenantNamed(daemon_->status(), "alpha")["memory_used"], 2 * kMiB);
}

TEST_F(Tenants, SetLimitChangesALiveTenantWithoutFreeingAnything) {
  auto holder = daemon_->startClientOn(alpha_, "error_probe", {"alloc-and-hold", "3145728"});
  ASSERT_TRUE(
      eventually([&] { return daemon_->status()["devices"][0]["memory_used"] == 3 * kMiB; }));

  RunResult lowered = daemon_->ctl({"set-limit", "alpha", "--memory", "1MiB", "--json"});
  ASSERT_TRUE(lowered.status.exitedWith(0)) << lowered.output << lowered.errors;
  EXPECT_EQ(nlohmann::json::parse(lowered.output)["ok"], true);
  // Below current use: nothing is freed, and new allocations are refused.
  EXPECT_EQ(daemon_->status()["devices"][0]["memory_used"], 3 * kMiB);
  EXPECT_EQ(alloc(alpha_, 4096)["cuMemAlloc"], "CUDA_ERROR_OUT_OF_MEMORY");

  ASSERT_TRUE(daemon_->ctl({"set-limit", "alpha", "--memory", "none", "--weight", "5"})
                  .status.exitedWith(0));
  EXPECT_EQ(alloc(alpha_, 64 * kMiB)["cuMemAlloc"], "CUDA_SUCCESS");
  auto alpha = tenantNamed(daemon_->status(), "alpha");
  EXPECT_EQ(alpha["memory_limit"], nullptr);
  EXPECT_EQ(alpha["weight"], 5);

  RunResult unknown = daemon_->ctl({"set-limit", "gamma", "--memory", "1GiB"});
  EXPECT_EQ(unknown.status.code, 1);
  EXPECT_NE(unknown.errors.find("no tenant named 'gamma'"), std::string::npos) << unknown.errors;
}

TEST_F(Tenants, SighupReloadsTheConfigAndKeepsTheOldOneWhenTheNewIsInvalid) {
  writeConfig("8MiB");
  daemon_->signal(SIGHUP);
  ASSERT_TRUE(eventually([&] {
    return tenantNamed(daemon_->status(), "alpha")["memory_limit"] == 8 * kMiB;
  })) << daemon_->log();

  {
    std::ofstream broken(config_);
    broken << "tenants:\n  - name: alpha\n    socket: " << alpha_ << "\n    memory_limt: 1GiB\n";
  }
  daemon_->signal(SIGHUP);
  ASSERT_TRUE(eventually([&] {
    return daemon_->log().find("keeping the running configuration") != std::string::npos;
  })) << daemon_->log();
  EXPECT_NE(daemon_->log().find("unknown key `memory_limt`"), std::string::npos);
  EXPECT_EQ(tenantNamed(daemon_->status(), "alpha")["memory_limit"], 8 * kMiB);
  EXPECT_NE(tenantNamed(daemon_->status(), "beta"), nullptr);
}

TEST_F(Tenants, EvictReclaimsEverythingTheClientHeld) {
  auto holder = daemon_->startClientOn(beta_, "error_probe", {"alloc-and-hold", "8388608"});
  ASSERT_TRUE(
      eventually([&] { return daemon_->status()["devices"][0]["memory_used"] == 8 * kMiB; }));
  RunResult evicted = daemon_->ctl({"evict", std::to_string(holder->pid()), "--json"});
  ASSERT_TRUE(evicted.status.exitedWith(0)) << evicted.output << evicted.errors;
  EXPECT_EQ(nlohmann::json::parse(evicted.output)["evicted_connections"], 1);
  EXPECT_TRUE(eventually([&] {
    auto status = daemon_->status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon_->status().dump(2);
  RunResult nobody = daemon_->ctl({"evict", "4194303"});
  EXPECT_EQ(nobody.status.code, 1);
  EXPECT_NE(nobody.errors.find("no client with pid 4194303"), std::string::npos) << nobody.errors;
}

TEST_F(Tenants, AChildThatInheritedTheSocketDoesNotKeepADeadParentsSessionAlive) {
  RunResult parent =
      daemon_->runClientOn(beta_, "error_probe", {"fork-hold", std::to_string(8 * kMiB)});
  ASSERT_TRUE(parent.status.exitedWith(0)) << parent.errors;
  pid_t child = std::stoi(answers(parent.output)["child"]);
  ASSERT_GT(child, 0);
  EXPECT_EQ(::kill(child, 0), 0);  // still alive, still holding the socket
  EXPECT_TRUE(eventually([&] { return daemon_->status()["devices"][0]["memory_used"] == 0; }))
      << daemon_->status().dump(2);
  ::kill(child, SIGKILL);  // a process this test started, through error_probe
}

TEST(TenantsConfig, AnInvalidConfigStopsTheDaemonWithAClearReason) {
  TempDir directory;
  std::string config = directory.file("bad.yaml");
  std::ofstream(config) << "tenants:\n  - name: alpha\n    memory_limit: lots\n    socket: /x\n";
  RunResult result = run({daemonBinary(), "--backend", "sim", "--config", config, "--socket",
                          directory.file("g.sock"), "--admin-socket", directory.file("a.sock")});
  EXPECT_EQ(result.status.code, 1);
  EXPECT_NE(result.errors.find("`memory_limit` 'lots' is not a size"), std::string::npos)
      << result.errors;
}

TEST(TenantsDevices, ATenantSeesOnlyItsDevices) {
  TempDir directory;
  std::string config = directory.file("tenants.yaml");
  std::string socket = directory.file("one/gpuproxy.sock");
  std::ofstream(config) << "tenants:\n  - name: second-gpu\n    socket: " << socket
                        << "\n    devices: [1]\n";
  Daemon::Options options;
  options.simDevices = 2;
  options.extraArguments = {"--config", config};
  Daemon daemon(options);
  auto count = answers(daemon.runClientOn(socket, "error_probe", {"device-count"}, {}).output);
  EXPECT_EQ(count["count"], "1");
  // Its device 0 is the daemon's device 1.
  RunResult add = daemon.runClientOn(socket, "vector_add", {"--elements", "4096", "--no-free"});
  ASSERT_TRUE(add.status.exitedWith(0)) << add.errors;
  auto tenant = tenantNamed(daemon.status(), "second-gpu");
  EXPECT_EQ(tenant["devices"], nlohmann::json::array({1}));
}

TEST(TenantsMetrics, PrometheusCanScrapeTenantsAndDevices) {
  TempDir directory;
  std::string config = directory.file("tenants.yaml");
  std::string socket = directory.file("limited/gpuproxy.sock");
  std::ofstream(config) << "tenants:\n  - name: limited\n    socket: " << socket
                        << "\n    memory_limit: 1MiB\n";
  Daemon::Options options;
  options.extraArguments = {"--config", config, "--metrics-address", "127.0.0.1:0"};
  Daemon daemon(options);
  daemon.runClientOn(socket, "error_probe", {"alloc", "2097152"}, {});

  std::smatch port;
  std::string log;
  ASSERT_TRUE(eventually([&] {
    log = daemon.log();
    return std::regex_search(log, port, std::regex("metrics on http://127\\.0\\.0\\.1:(\\d+)/"));
  })) << log;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port[1].str())));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  std::string request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  ssize_t got;
  while ((got = ::read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, got);
  ::close(fd);
  EXPECT_NE(response.find("200 OK"), std::string::npos) << response;
  EXPECT_NE(response.find("gpuproxy_tenant_memory_limit_bytes{tenant=\"limited\"} 1048576"),
            std::string::npos)
      << response;
  EXPECT_NE(response.find("gpuproxy_tenant_allocation_failures_total{tenant=\"limited\","
                          "reason=\"limit\"} 1"),
            std::string::npos)
      << response;
  EXPECT_NE(response.find("gpuproxy_device_memory_total_bytes{device=\"0\""), std::string::npos)
      << response;
}

}  // namespace
}  // namespace gpuproxy::testing
