// Tenants that try to hurt each other: each test replays one attack (tests/programs/
// hostile_client.cpp) from tenant `mallory` against a real daemon and checks that tenant `alice`,
// with the same limits, is served as before and that nothing the attacker held outlives it.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

namespace gpuproxy::testing {
namespace {

// Two tenants of 64 MiB each, as a node would give two pods.
class HostileTenants : public ::testing::Test {
protected:
  HostileTenants() {
    std::ofstream(config_) << "tenants:\n"
                           << "  - name: alice\n    socket: " << alice_
                           << "\n    memory_limit: 64MiB\n"
                           << "  - name: mallory\n    socket: " << mallory_
                           << "\n    memory_limit: 64MiB\n";
    Daemon::Options options;
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
      return status["clients"].empty() && status["devices"][0]["memory_used"] == 0;
    })) << daemon_->status().dump(2);
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

}  // namespace
}  // namespace gpuproxy::testing
