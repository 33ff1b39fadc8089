// Tenants that try to hurt each other: each test replays one attack (tests/programs/
// hostile_client.cpp) from tenant `mallory` against a real daemon and checks that tenant `alice`,
// with the same limits, is served as before and that nothing the attacker held outlives it.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

namespace gpuproxy::testing {
namespace {

// Two tenants of 64 MiB each, as a node would give two pods, each on a GPU of its own (a kernel
// that never ends holds its GPU: kernels are not preemptible, on the sim as on hardware).
class HostileTenants : public ::testing::Test {
protected:
  struct Layout {
    std::string aliceLimit = "64MiB";
    std::string malloryLimit = "64MiB";
    bool sharedDevice = false;        // both on device 0 (else alice on 0, mallory on 1)
    std::string simMemory = "16GiB";  // per device
    std::string malloryExtra = "";    // more YAML for mallory's entry, each line ending in \n
  };

  HostileTenants() : HostileTenants(Layout{}) {}
  explicit HostileTenants(const Layout& layout) {
    std::ofstream(config_) << "tenants:\n"
                           << "  - name: alice\n    socket: " << alice_
                           << "\n    memory_limit: " << layout.aliceLimit << "\n    devices: [0]\n"
                           << "  - name: mallory\n    socket: " << mallory_
                           << "\n    memory_limit: " << layout.malloryLimit << "\n    devices: ["
                           << (layout.sharedDevice ? 0 : 1) << "]\n"
                           << layout.malloryExtra;
    Daemon::Options options;
    options.simDevices = layout.sharedDevice ? 1 : 2;
    options.simMemory = layout.simMemory;
    options.extraArguments = {"--config", config_};
    daemon_ = std::make_unique<Daemon>(options);
  }

  RunResult attack(std::vector<std::string> arguments) {
    return daemon_->runClientOn(mallory_, "hostile_client", std::move(arguments));
  }

  // Alice's ordinary program works and sees the whole of her limit.
  void expectAliceIsServed() {
    RunResult result = daemon_->runClientOn(alice_, "vector_add", {"--elements", "1000000"});
    EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon_->log();
  }

  // Once the attacker is gone, it holds nothing: no client, no device memory.
  void expectNothingLeft() {
    EXPECT_TRUE(eventually([&] {
      auto status = daemon_->status();
      if (!status["clients"].empty()) return false;
      for (const auto& device : status["devices"]) {
        if (device["memory_used"] != 0) return false;
      }
      return true;
    })) << daemon_->status().dump(2);
  }

  // The status entry of the client with `pid`, or null.
  nlohmann::json clientWithPid(pid_t pid) {
    const nlohmann::json status = daemon_->status();
    for (const auto& client : status["clients"]) {
      if (client["pid"] == pid) return client;
    }
    return nullptr;
  }

  TempDir directory_;
  std::string config_ = directory_.file("tenants.yaml");
  std::string alice_ = directory_.file("alice/gpuproxy.sock");
  std::string mallory_ = directory_.file("mallory/gpuproxy.sock");
  std::unique_ptr<Daemon> daemon_;
};

// A client that scribbles over its own command ring's index is cut off: the daemon says why, frees
// what it held and keeps serving others, and the client's next calls fail instead of hanging.
TEST_F(HostileTenants, ACorruptRingIndexCutsTheClientOffAndItsCallsFail) {
  if (rpcTransport()) GTEST_SKIP() << "no command ring over the RPC transport";
  RunResult result = attack({"corrupt-ring"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon_->log();
  auto got = answers(result.output);
  EXPECT_EQ(got["cuCtxSynchronize"], "CUDA_ERROR_MPS_CONNECTION_FAILED") << result.output;
  EXPECT_EQ(got["cuMemAlloc"], "CUDA_ERROR_MPS_CONNECTION_FAILED") << result.output;
  EXPECT_NE(daemon_->log().find("broke the data-plane format (command ring: corrupt"),
            std::string::npos)
      << daemon_->log();
  expectNothingLeft();
  expectAliceIsServed();
}

// Tenants on one small GPU. A tenant of one-byte allocations pays for what each really takes on
// the device (a 256-byte granule on the sim), so it cannot fill the device past its limit and
// starve the other tenant while its own usage looks tiny.
class SharedDevice : public HostileTenants {
protected:
  SharedDevice() : HostileTenants(Layout{"16MiB", "8MiB", true, "32MiB"}) {}
};

TEST_F(SharedDevice, TinyAllocationsAreChargedWhatTheyOccupy) {
  constexpr std::uint64_t kGranule = 256;
  constexpr std::uint64_t kMalloryLimit = std::uint64_t{8} << 20;
  std::unique_ptr<Child> attacker =
      daemon_->startClientOn(mallory_, "hostile_client", {"tiny-allocs", "100000"});
  ASSERT_TRUE(eventually([&] { return attacker->output().find("free ") != std::string::npos; },
                         std::chrono::seconds(60)))
      << attacker->output() << attacker->errors() << daemon_->log();
  auto got = answers(attacker->output());
  EXPECT_EQ(got["last"], "CUDA_ERROR_OUT_OF_MEMORY") << attacker->output();
  const std::uint64_t made = std::stoull(got["allocations"]);
  EXPECT_LE(made * kGranule, kMalloryLimit);
  EXPECT_GT(made * kGranule, kMalloryLimit - (std::uint64_t{1} << 20));  // modules take a little
  EXPECT_EQ(got["free"], "0") << "its limit is used up";
  const nlohmann::json mallory = tenantNamed(daemon_->status(), "mallory");
  EXPECT_GE(mallory["memory_used"], made * kGranule) << mallory.dump(2);

  expectAliceIsServed();  // 12 MB of the 24 MiB the device has left
  attacker->signal(SIGKILL);
  attacker->wait();
  expectNothingLeft();
}

// Module images load in pieces (no control message is larger than a transfer chunk), so any size
// the tenant's limit allows loads; a larger one fails as out of memory before the daemon holds any
// of it.
TEST_F(HostileTenants, ModuleImagesOfAnySizeTheLimitAllowsLoadInPieces) {
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
  std::unique_ptr<Child> fits =
      daemon_->startClientOn(mallory_, "hostile_client", {"big-module", "40"});
  ASSERT_TRUE(eventually([&] { return fits->output().find("holding") != std::string::npos; },
                         std::chrono::seconds(60)))
      << fits->output() << fits->errors() << daemon_->log();
  auto got = answers(fits->output());
  EXPECT_EQ(got["cuModuleLoadData"], "CUDA_SUCCESS") << fits->output() << fits->errors();
  EXPECT_EQ(got["cuModuleGetFunction"], "CUDA_SUCCESS") << fits->output();
  // Once loaded, the upload's charge is gone and only the module's memory counts (on the sim a
  // module takes its image's size; counted twice, it could not have fitted in 64 MiB).
  EXPECT_LE(tenantNamed(daemon_->status(), "mallory")["memory_used"], 41 * kMiB);

  const std::uint64_t before = usageOf(daemon_->pid()).residentBytes;
  std::unique_ptr<Child> tooBig =
      daemon_->startClientOn(mallory_, "hostile_client", {"big-module", "100"});
  ASSERT_TRUE(eventually([&] { return tooBig->output().find("holding") != std::string::npos; },
                         std::chrono::seconds(60)))
      << tooBig->output() << tooBig->errors() << daemon_->log();
  EXPECT_EQ(answers(tooBig->output())["cuModuleLoadData"], "CUDA_ERROR_OUT_OF_MEMORY")
      << tooBig->output() << tooBig->errors();
  // Nothing of the refused image is held (the margin is for AddressSanitizer's quarantine).
  EXPECT_LT(usageOf(daemon_->pid()).residentBytes, before + 64 * kMiB);

  expectAliceIsServed();
  fits->signal(SIGKILL);
  tooBig->signal(SIGKILL);
  fits->wait();
  tooBig->wait();
  expectNothingLeft();
}

// A tenant that creates driver objects without end stops at its cap for each kind, with the
// error a driver out of resources gives; others are served, and its objects go with it.
class ObjectCaps : public HostileTenants, public ::testing::WithParamInterface<const char*> {
protected:
  ObjectCaps()
      : HostileTenants(Layout{"64MiB", "64MiB", false, "16GiB",
                              "    max_contexts: 4\n    max_streams: 50\n"
                              "    max_events: 60\n    max_modules: 10\n"}) {}
};

TEST_P(ObjectCaps, CreatingPastTheCapFailsAndTheRestGoesWithTheClient) {
  const std::string kind = GetParam();
  const std::map<std::string, unsigned> caps = {
      {"context", 4}, {"stream", 50}, {"event", 60}, {"module", 10}};
  std::unique_ptr<Child> attacker =
      daemon_->startClientOn(mallory_, "hostile_client", {"create-flood", kind, "100000"});
  ASSERT_TRUE(eventually([&] { return attacker->output().find("last ") != std::string::npos; },
                         std::chrono::seconds(60)))
      << attacker->output() << attacker->errors() << daemon_->log();
  auto got = answers(attacker->output());
  EXPECT_EQ(got["last"], "CUDA_ERROR_OUT_OF_MEMORY") << attacker->output();
  EXPECT_LE(std::stoul(got["created"]), caps.at(kind));
  EXPECT_GE(std::stoul(got["created"]) + 1, caps.at(kind));  // its first context may count
  const nlohmann::json objects = tenantNamed(daemon_->status(), "mallory")["objects"];
  EXPECT_EQ(objects[kind + "s"]["held"], caps.at(kind)) << objects.dump(2);
  EXPECT_EQ(objects[kind + "s"]["limit"], caps.at(kind)) << objects.dump(2);
  EXPECT_NE(daemon_->log().find("is at its cap of " + std::to_string(caps.at(kind)) + " " + kind),
            std::string::npos)
      << daemon_->log();

  expectAliceIsServed();
  attacker->signal(SIGKILL);
  attacker->wait();
  expectNothingLeft();
  EXPECT_TRUE(eventually([&] {
    const nlohmann::json held = tenantNamed(daemon_->status(), "mallory")["objects"];
    for (const auto& [name, count] : held.items()) {
      if (count["held"] != 0) return false;
    }
    return true;
  })) << daemon_->status().dump(2);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ObjectCaps,
                         ::testing::Values("context", "stream", "event", "module"));

// SIGTERM stops the daemon (detaching and reclaiming every client) even while a client holds as
// many streams as its tenant may have; a daemon that did not stop would be killed after 30 s.
TEST_F(HostileTenants, ShutdownCompletesWhileAClientHoldsThousandsOfStreams) {
  std::unique_ptr<Child> attacker =
      daemon_->startClientOn(mallory_, "hostile_client", {"create-flood", "stream", "100000"});
  ASSERT_TRUE(eventually([&] { return attacker->output().find("holding") != std::string::npos; },
                         std::chrono::seconds(60)))
      << attacker->output() << attacker->errors() << daemon_->log();
  EXPECT_EQ(answers(attacker->output())["created"], "8192") << attacker->output();
  const ExitStatus stopped = daemon_->stop();
  EXPECT_TRUE(stopped.exitedWith(0)) << stopped.code << " " << stopped.signal << daemon_->log();
  attacker->signal(SIGKILL);
  attacker->wait();
}

// Work queued behind a kernel that never ends costs the daemon a bounded amount of memory: once
// the attacker has 4096 operations queued, the daemon stops reading its ring and its calls wait
// there, alice is served meanwhile, and killing the attacker frees all of it.
class QueueFlood : public HostileTenants, public ::testing::WithParamInterface<const char*> {};

TEST_P(QueueFlood, StopsAtTheBoundOnQueuedWorkWhileOthersAreServed) {
  constexpr std::uint64_t kMaxQueued = 4096;
  std::unique_ptr<Child> attacker =
      daemon_->startClientOn(mallory_, "hostile_client", {"queue-flood", GetParam(), "600"});
  ASSERT_TRUE(eventually([&] { return attacker->output().find("flooding") != std::string::npos; },
                         std::chrono::seconds(30)))
      << attacker->output() << attacker->errors() << daemon_->log();
  ASSERT_TRUE(eventually(
      [&] {
        const nlohmann::json client = clientWithPid(attacker->pid());
        return !client.is_null() && client["queued_operations"] >= kMaxQueued;
      },
      std::chrono::seconds(30)))
      << daemon_->status().dump(2);

  // It keeps calling as fast as it can; the daemon takes nothing more from it. (Unbounded, each
  // call cost the daemon about a hundred bytes: 300 MB a second. The margin is for the daemon's
  // own churn, which under AddressSanitizer grows the resident set by ~10 MB a second while
  // freed memory sits in its quarantine.)
  const std::uint64_t atBound = usageOf(daemon_->pid()).residentBytes;
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const std::uint64_t later = usageOf(daemon_->pid()).residentBytes;
  EXPECT_LT(later, atBound + (std::uint64_t{64} << 20)) << atBound << " -> " << later;
  const nlohmann::json client = clientWithPid(attacker->pid());
  ASSERT_FALSE(client.is_null());
  EXPECT_EQ(client["queued_operations"], kMaxQueued) << client.dump(2);
  EXPECT_TRUE(attacker->running()) << attacker->output() << attacker->errors();

  expectAliceIsServed();
  attacker->signal(SIGKILL);
  attacker->wait();
  expectNothingLeft();
  expectAliceIsServed();
}

INSTANTIATE_TEST_SUITE_P(Records, QueueFlood, ::testing::Values("memset", "event"));

}  // namespace
}  // namespace gpuproxy::testing
