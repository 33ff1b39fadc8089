// Replays of what a hostile tenant or a careless operator did to the daemon, each against a real
// gpuproxyd: a SIGHUP reload that adds, moves and removes tenants (it used to fail inside the
// signal callback, and a refused reload left directories behind); one tenant flooding the daemon
// with connections under a small descriptor limit (it used to starve every other tenant); and
// admin requests that used to be accepted or misread.
#include <cuda.h>
#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "tests/support/process.hpp"

#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

namespace gpuproxy::testing {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

bool exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

std::string cuInitOn(const Daemon& daemon, const std::string& socket) {
  RunResult result = daemon.runClientOn(socket, "error_probe", {"init"});
  std::istringstream lines(result.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("cuInit ", 0) == 0) return line.substr(7);
  }
  return "no answer: " + result.output + result.errors;
}

// A raw connection to a Unix socket, closed on destruction.
class RawConnection {
public:
  explicit RawConnection(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.data(), path.size());
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

private:
  int fd_ = -1;
};

// ---------------------------------------------------------------------------------------------
// SIGHUP reload

class Reload : public ::testing::Test {
protected:
  Reload() {
    write("tenants:\n  - name: alpha\n    socket: " + alpha_ + "\n    memory_limit: 4MiB\n");
    Daemon::Options options;
    options.extraArguments = {"--config", config_};
    daemon_ = std::make_unique<Daemon>(options);
  }

  void write(const std::string& text) { std::ofstream(config_) << text; }

  // Sends SIGHUP and waits for the daemon to say how the reload went.
  bool reload(const std::string& expected) {
    const std::size_t before = daemon_->log().size();
    daemon_->signal(SIGHUP);
    return eventually([&] { return daemon_->log().find(expected, before) != std::string::npos; });
  }

  TempDir directory_;
  std::string config_ = directory_.file("tenants.yaml");
  std::string alpha_ = directory_.file("alpha/gpuproxy.sock");
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(Reload, SighupAddsMovesAndRemovesTenantsAndTheirSockets) {
  const std::string beta = directory_.file("beta/gpuproxy.sock");
  write("tenants:\n  - name: alpha\n    socket: " + alpha_ +
        "\n    memory_limit: 4MiB\n  - name: beta\n    socket: " + beta + "\n");
  ASSERT_TRUE(reload("SIGHUP: reloaded")) << daemon_->log();
  EXPECT_EQ(daemon_->log().find("wait() is not allowed"), std::string::npos) << daemon_->log();
  const nlohmann::json added = tenantNamed(daemon_->status(), "beta");
  ASSERT_FALSE(added.is_null()) << daemon_->status().dump(2);
  EXPECT_EQ(cuInitOn(*daemon_, beta), "CUDA_SUCCESS");

  // alpha moves to a new socket, keeping its id; beta goes.
  const nlohmann::json alphaBefore = tenantNamed(daemon_->status(), "alpha");
  const std::string moved = directory_.file("moved/alpha.sock");
  write("tenants:\n  - name: alpha\n    socket: " + moved + "\n    memory_limit: 8MiB\n");
  ASSERT_TRUE(reload("SIGHUP: reloaded")) << daemon_->log();
  const nlohmann::json alphaAfter = tenantNamed(daemon_->status(), "alpha");
  EXPECT_EQ(alphaAfter["id"], alphaBefore["id"]);
  EXPECT_EQ(alphaAfter["socket"], moved);
  EXPECT_EQ(alphaAfter["memory_limit"], 8 * kMiB);
  EXPECT_TRUE(tenantNamed(daemon_->status(), "beta").is_null());
  EXPECT_FALSE(exists(alpha_));
  EXPECT_FALSE(exists(beta));
  EXPECT_FALSE(exists(directory_.file("beta")));
  EXPECT_EQ(cuInitOn(*daemon_, moved), "CUDA_SUCCESS");
  EXPECT_EQ(cuInitOn(*daemon_, beta), "CUDA_ERROR_NO_DEVICE");
}

TEST_F(Reload, ARefusedReloadLeavesNothingBehind) {
  // The second tenant's socket cannot be opened (its parent is a file): the first tenant's new
  // directory must not survive the refusal, and the running tenants keep serving.
  std::ofstream(directory_.file("blocker")) << "a file\n";
  write("tenants:\n  - name: alpha\n    socket: " + alpha_ +
        "\n  - name: gamma\n    socket: " + directory_.file("gamma/deep/gpuproxy.sock") +
        "\n  - name: delta\n    socket: " + directory_.file("blocker/delta/gpuproxy.sock") + "\n");
  ASSERT_TRUE(reload("keeping the running configuration")) << daemon_->log();
  EXPECT_FALSE(exists(directory_.file("gamma")));
  EXPECT_TRUE(tenantNamed(daemon_->status(), "gamma").is_null());
  EXPECT_EQ(tenantNamed(daemon_->status(), "alpha")["memory_limit"], 4 * kMiB);
  EXPECT_EQ(cuInitOn(*daemon_, alpha_), "CUDA_SUCCESS");

  // A socket another tenant holds is refused the same way.
  write("tenants:\n  - name: alpha\n    socket: " + alpha_ +
        "\n  - name: thief\n    socket: " + daemon_->socketPath() + "\n");
  ASSERT_TRUE(reload("keeping the running configuration")) << daemon_->log();
  EXPECT_TRUE(tenantNamed(daemon_->status(), "thief").is_null());
  EXPECT_EQ(cuInitOn(*daemon_, daemon_->socketPath()), "CUDA_SUCCESS");
}

// ---------------------------------------------------------------------------------------------
// Descriptors

TEST(Descriptors, OneTenantsConnectionFloodLeavesTheOthersServed) {
  TempDir directory;
  const std::string config = directory.file("tenants.yaml");
  const std::string flooder = directory.file("a/gpuproxy.sock");
  const std::string victim = directory.file("b/gpuproxy.sock");
  std::ofstream(config) << "tenants:\n  - name: flooder\n    socket: " << flooder
                        << "\n  - name: victim\n    socket: " << victim << "\n";
  Daemon::Options options;
  options.extraArguments = {"--config", config};
  options.openFileLimit = 256;  // as in the finding: 200 connections used to exhaust it
  Daemon daemon(options);

  std::vector<std::unique_ptr<RawConnection>> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(std::make_unique<RawConnection>(flooder));
  const std::uint32_t limit = tenantNamed(daemon.status(), "flooder")["max_connections"];
  ASSERT_GT(limit, 0u);
  ASSERT_LT(limit, 200u);
  ASSERT_TRUE(eventually([&] {
    return tenantNamed(daemon.status(), "flooder")["connections"] == limit;
  })) << daemon.status().dump(2);

  // The other tenant is served, every time, while the flood holds.
  for (int i = 0; i < 3; ++i) {
    RunResult served = daemon.runClientOn(victim, "vector_add", {"--elements", "4096"});
    EXPECT_TRUE(served.status.exitedWith(0)) << served.errors << daemon.log();
  }
  // The flooder itself is turned away while at its limit, with a reason in the log.
  EXPECT_EQ(cuInitOn(daemon, flooder), "CUDA_ERROR_NO_DEVICE");
  EXPECT_NE(daemon.log().find("tenant 'flooder' has " + std::to_string(limit) +
                              " connections, its limit"),
            std::string::npos)
      << daemon.log();

  flood.clear();
  EXPECT_TRUE(
      eventually([&] { return tenantNamed(daemon.status(), "flooder")["connections"] == 0; }));
  EXPECT_EQ(cuInitOn(daemon, flooder), "CUDA_SUCCESS");
}

TEST(Descriptors, ATenantsOwnConnectionLimitHolds) {
  TempDir directory;
  const std::string config = directory.file("tenants.yaml");
  const std::string small = directory.file("small/gpuproxy.sock");
  std::ofstream(config) << "tenants:\n  - name: small\n    socket: " << small
                        << "\n    max_connections: 2\n";
  Daemon::Options options;
  options.extraArguments = {"--config", config};
  Daemon daemon(options);
  auto first = daemon.startClientOn(small, "error_probe", {"alloc-and-hold", "1048576"});
  auto second = daemon.startClientOn(small, "error_probe", {"alloc-and-hold", "1048576"});
  ASSERT_TRUE(eventually([&] { return tenantNamed(daemon.status(), "small")["clients"] == 2; }))
      << daemon.log();
  EXPECT_EQ(tenantNamed(daemon.status(), "small")["max_connections"], 2);
  EXPECT_EQ(cuInitOn(daemon, small), "CUDA_ERROR_NO_DEVICE");
  EXPECT_EQ(cuInitOn(daemon, daemon.socketPath()), "CUDA_SUCCESS");
}

TEST(Descriptors, AConnectionCarriesOneSession) {
  Daemon daemon;
  capnp::EzRpcClient client("unix:" + daemon.socketPath());
  auto& waitScope = client.getWaitScope();
  auto gateway = client.getMain<protocol::Gateway>();
  std::vector<protocol::Session::Client> sessions;  // held, as a client holds its session
  for (int i = 0; i < 3; ++i) {
    auto attach = gateway.attachRequest();
    attach.setProtocolVersion(protocol::PROTOCOL_VERSION);
    auto attached = attach.send().wait(waitScope);
    EXPECT_EQ(attached.getResult(), i == 0 ? CUDA_SUCCESS : CUDA_ERROR_ALREADY_ACQUIRED);
    if (attached.getResult() == CUDA_SUCCESS) sessions.push_back(attached.getSession());
  }
  EXPECT_EQ(daemon.status()["clients"].size(), 1u);
}

TEST(Descriptors, TheDaemonRaisesItsOwnDescriptorLimit) {
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max <= 512)
    GTEST_SKIP() << "the hard descriptor limit is only " << original.rlim_max;
  rlimit lowered = original;
  lowered.rlim_cur = 512;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::unique_ptr<Daemon> daemon;
  try {
    daemon = std::make_unique<Daemon>();
  } catch (...) {
    ::setrlimit(RLIMIT_NOFILE, &original);
    throw;
  }
  ::setrlimit(RLIMIT_NOFILE, &original);
  std::ifstream limits("/proc/" + std::to_string(daemon->pid()) + "/limits");
  std::string line;
  std::string openFiles;
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) == 0) openFiles = line;
  }
  std::istringstream fields(openFiles.substr(std::strlen("Max open files")));
  std::string soft;
  std::string hard;
  fields >> soft >> hard;
  EXPECT_EQ(soft, hard) << openFiles;
  EXPECT_NE(soft, "512") << openFiles;
}

// ---------------------------------------------------------------------------------------------
// Admin input

class AdminInput : public ::testing::Test {
protected:
  AdminInput() {
    std::ofstream(config_) << "tenants:\n  - name: alpha\n    socket: "
                           << directory_.file("alpha/gpuproxy.sock")
                           << "\n    memory_limit: 4MiB\n    weight: 2\n";
    Daemon::Options options;
    options.extraArguments = {"--config", config_};
    daemon_ = std::make_unique<Daemon>(options);
  }

  // Asserts that alpha is as the file made it.
  void expectAlphaUnchanged() {
    const nlohmann::json alpha = tenantNamed(daemon_->status(), "alpha");
    EXPECT_EQ(alpha["memory_limit"], 4 * kMiB);
    EXPECT_EQ(alpha["weight"], 2);
    EXPECT_EQ(alpha["class"], "best-effort");
    EXPECT_EQ(alpha["pinned_memory_limit"], nullptr);
  }

  TempDir directory_;
  std::string config_ = directory_.file("tenants.yaml");
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(AdminInput, GpuproxyctlRefusesWhatItCannotMeanWithAReason) {
  RunResult evict = daemon_->ctl({"evict", "4294967295"});
  EXPECT_EQ(evict.status.code, 2);
  EXPECT_NE(evict.errors.find("4294967295 is not a process id"), std::string::npos) << evict.errors;
  EXPECT_EQ(evict.output.find("pid -1"), std::string::npos) << evict.output;
  EXPECT_EQ(daemon_->ctl({"evict", "0"}).status.code, 2);

  RunResult urgent = daemon_->ctl({"set-limit", "alpha", "--class", "urgent"});
  EXPECT_NE(urgent.status.code, 0);
  EXPECT_NE(urgent.errors.find("urgent"), std::string::npos) << urgent.errors;

  RunResult empty = daemon_->ctl({"set-limit", "alpha", "--memory", ""});
  EXPECT_EQ(empty.status.code, 2);
  EXPECT_NE(empty.errors.find("is not a size"), std::string::npos) << empty.errors;

  RunResult notASize = daemon_->ctl({"set-limit", "alpha", "--pinned-memory", "lots"});
  EXPECT_EQ(notASize.status.code, 2);
  RunResult zeroWeight = daemon_->ctl({"set-limit", "alpha", "--weight", "0"});
  EXPECT_EQ(zeroWeight.status.code, 1);
  EXPECT_NE(zeroWeight.errors.find("weight must be between 1 and 10000"), std::string::npos)
      << zeroWeight.errors;
  expectAlphaUnchanged();
}

TEST_F(AdminInput, TheAdminInterfaceRefusesWhatGpuproxyctlNeverSends) {
  capnp::EzRpcClient client("unix:" + daemon_->adminSocketPath());
  auto& waitScope = client.getWaitScope();
  auto admin = client.getMain<protocol::Admin>();
  auto errorOf = [&](auto& request) {
    return std::string(request.send().wait(waitScope).getError().cStr());
  };

  {
    auto request = admin.setTenantLimitsRequest();
    request.setTenant("alpha");
    auto update = request.initUpdate();
    update.setHasClass(true);
    update.setClass(static_cast<protocol::TenantClass>(7));
    EXPECT_EQ(errorOf(request), "class 7 is neither best-effort nor latency-critical");
  }
  {
    auto request = admin.setTenantLimitsRequest();
    request.setTenant("alpha");
    auto update = request.initUpdate();
    update.setHasMemoryLimit(true);
    update.setMemoryLimit(kMiB);
    update.setClearMemoryLimit(true);
    update.setHasWeight(true);
    update.setWeight(9);
    EXPECT_EQ(errorOf(request), "the memory limit cannot be set and cleared in one request");
  }
  {
    auto request = admin.setTenantLimitsRequest();
    request.setTenant("alpha");
    auto update = request.initUpdate();
    update.setHasPinnedMemoryLimit(true);
    update.setClearPinnedMemoryLimit(true);
    EXPECT_EQ(errorOf(request), "the pinned memory limit cannot be set and cleared in one request");
  }
  {
    auto request = admin.setTenantLimitsRequest();
    request.setTenant("alpha");
    request.initUpdate();
    EXPECT_EQ(errorOf(request), "the request changes nothing");
  }
  {
    auto request = admin.evictRequest();
    request.setPid(4294967295u);
    EXPECT_EQ(errorOf(request), "4294967295 is not a process id (1 to 4194304)");
  }
  {
    auto request = admin.createTenantRequest();
    auto spec = request.initSpec();
    spec.setName("odd");
    spec.setSocketDirectory(directory_.file("odd"));
    spec.setClass(static_cast<protocol::TenantClass>(3));
    EXPECT_EQ(errorOf(request), "class 3 is neither best-effort nor latency-critical");
    EXPECT_FALSE(exists(directory_.file("odd")));
  }
  {
    auto request = admin.setTenantPodRequest();
    request.setName("alpha");
    request.initPod().setPodName(std::string(300, 'p'));
    EXPECT_EQ(errorOf(request), "the pod name is longer than 253 characters");
  }
  expectAlphaUnchanged();
  // And the daemon keeps serving.
  EXPECT_TRUE(daemon_->runClient("vector_add", {"--elements", "1024"}).status.exitedWith(0));
}

}  // namespace
}  // namespace gpuproxy::testing
