// The cuda backend without a GPU: gpuproxyd --backend cuda loads gpuproxy's own stub as its
// driver (--cuda-driver) and so forwards everything to a second gpuproxyd on the sim backend.
// Whatever of the driver the stub serves, the cuda backend's code runs here on every commit.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>

namespace gpuproxy::testing {
namespace {

Daemon::Options chained() {
  Daemon::Options options;
  options.cudaOnStub = true;
  return options;
}

TEST(CudaBackendOnTheStub, TheDaemonServesTheUpstreamDevicesThroughItsCudaBackend) {
  Daemon daemon(chained());
  nlohmann::json status = daemon.status();
  EXPECT_EQ(status["backend"], "cuda") << status.dump(2);
  ASSERT_EQ(status["devices"].size(), 1u) << status.dump(2);
  // The device is the upstream daemon's, as the stub reports it.
  EXPECT_EQ(status["devices"][0]["name"], "gpuproxy sim device 0");
  EXPECT_NE(daemon.log().find("libcuda.so.1"), std::string::npos) << daemon.log();
}

TEST(CudaBackendOnTheStub, AProgramRunsWithCorrectResults) {
  Daemon daemon(chained());
  // Module load (the PTX goes to the driver as it came: the stub has no linker), allocations,
  // copies both ways, launches and their completions through cuLaunchHostFunc.
  RunResult result = daemon.runClient("vector_add", {"--elements", "100000", "--iterations", "3"});
  EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.log();
  EXPECT_NE(result.output.find("vector_add: OK"), std::string::npos) << result.output;
}

TEST(CudaBackendOnTheStub, AKilledClientsMemoryComesBack) {
  Daemon daemon(chained());
  auto client = daemon.startClient("vector_add", {"--elements", "1048576", "--hold-ms", "60000"});
  ASSERT_TRUE(eventually([&] {
    nlohmann::json status = daemon.status();
    return status["devices"][0]["memory_used"].get<std::uint64_t>() > 0;
  })) << daemon.log();
  client->signal(SIGKILL);
  client->wait();
  EXPECT_TRUE(eventually([&] {
    return daemon.status()["devices"][0]["memory_used"].get<std::uint64_t>() == 0;
  })) << daemon.status().dump(2)
      << daemon.log();
}

}  // namespace
}  // namespace gpuproxy::testing
